"""The sampler side of :class:`~prorsa_forecaster.state.LiveState`: the run, cohorts (a
sync batch, GRPO groups), which completion caused which launch, the weight updates and
what announces the next sync batch.

A mixin, so that the fold stays one object (one set of slot arrays) while its modules
stay short.
"""

from __future__ import annotations

import numpy as np

from .snapshot import RunInfo
from .trajstate import DECODE, PREFILL, QUEUED, REWARD

MAX_PENDING = 100_000
"""Completions (or finished cohorts) kept waiting for the launch they caused."""


class SamplerFold:
    """Run, cohort, launch and update handlers of the fold (see LiveState)."""

    def _on_run_started(self, ev) -> None:
        self.run = RunInfo(
            mode=ev.mode, batch_size=ev.batch_size, group_size=ev.group_size or 1,
            injection=ev.injection or "replace", max_staleness=ev.max_staleness,
            prompt_tokens_mean=ev.prompt_tokens_mean,
        )
        if ev.prompt_tokens_mean is not None and self.history.first_prompt.n == 0:
            self.history.first_prompt.value = float(ev.prompt_tokens_mean)
        if ev.mode == "sync" and not self._cohort_live:
            self.sync_wait = ev.ts  # the first batch is announced: it is due at once
            self._sync_after_update = False

    def _cohort_key(self, ev) -> str | None:
        if self.run.mode == "sync":
            return f"batch:{self._batch}"
        if self.run.injection == "group" and ev.group is not None:
            return f"group:{ev.group}"
        return None

    def _next_batch(self, ts: float) -> None:
        """A dispatch: after the batch drained it starts the next one, and it ends the
        wait that announced it (update -> dispatch is learnt)."""
        h = self.history
        if self.run.mode == "sync" and not self._cohort_live:
            self._batch += 1  # a dispatch after the batch drained starts the next batch
        if self.sync_wait is not None:
            if self._sync_after_update:  # update -> dispatch (the weight sync)
                h.sync_start.observe(ts - self.sync_wait)
            self.sync_wait = None

    def _launched(self, i: int, ev) -> None:
        """Slot ``i`` was just dispatched: its cohort, and the completion that caused it."""
        h = self.history
        key = self._cohort_key(ev)
        if key is not None:
            c = self._cohort_of.get(key)
            if c is None or c not in self._cohort_live:
                c = self._cohort_free.pop() if self._cohort_free else self._cohort_next
                self._cohort_next = max(self._cohort_next, c + 1)
                self._cohort_of[key] = c
                self._cohort_live[c] = 0
                # Cohort sizes are learnt from cohorts launched for a finished one.
                if self._launch_caused and self._launch_count:
                    h.cohort_size.observe(self._launch_count)
                self._launch_count = 0
                self._launch_caused = bool(self._cohort_pending)
                if self._cohort_pending:  # this cohort was launched for one that finished
                    self._cause_now = self._cohort_pending.popleft()
                else:
                    self._cause_now = np.nan
            self.cohort_cause[i] = self._cause_now if self._launch_count == 0 else np.nan
            self._launch_count += 1
            self.cohort[i] = c
            self._cohort_live[c] += 1
        elif self._seen_completion:
            # f's slope: dispatches after the first completion per admitted completion.
            h.launched += 1
            if self._pending:
                self.cause[i] = self._pending.popleft()

    def _left_cohort(self, i: int, ts: float) -> None:
        """Slot ``i`` is released: a cohort whose last member left has finished."""
        c = int(self.cohort[i])
        if c >= 0 and c in self._cohort_live:
            self._cohort_live[c] -= 1
            if self._cohort_live[c] <= 0:
                del self._cohort_live[c]
                if self.run.mode == "sync" and not self._cohort_live and self.update_trigger is None:
                    # The sync batch drained: training starts, then policy.updated, then
                    # the next batch (the trigger -> update delay is learnt as ``train``).
                    self.update_trigger = ts
                self._cohort_free.append(c)
                self._cohort_pending.append(ts)
                if len(self._cohort_pending) > MAX_PENDING:
                    self._cohort_pending.popleft()

    def _on_reward_finished(self, ev) -> None:
        h = self.history
        i = self._slot.get((ev.run, ev.traj))
        if i is None:
            self.ignored += 1
            return
        if self.state[i] == REWARD:
            h.reward.observe(ev.ts - self.entered[i])
        h.completed += 1
        h.completions += 1
        if ev.admitted:
            h.admitted += 1
            self.admitted_total += 1
            B = self.run.batch_size
            if self.run.mode == "async" and B and self.update_trigger is None and self.admitted_total >= (self.updates + 1) * B:
                self.update_trigger = ev.ts
        if self.cohort[i] < 0:
            self._seen_completion = True
            h.admitted_for_launch += ev.admitted
            # Every completion may cause a launch (the launch delay is measured from it).
            self._pending.append(ev.ts)
            if len(self._pending) > MAX_PENDING:
                self._pending.popleft()
        self._release(i, (ev.run, ev.traj), ev.ts)

    def _on_policy_updated(self, ev) -> None:
        # New weights: prefix caches are flushed (unless the framework keeps the requests
        # in flight: History.update_flushes), and prefills in progress start over once the
        # engines resume (the weight-sync pause, learnt below from the first prefill after
        # it: of a request waiting now, or of a decode it aborts, re-queued).
        n = self._n
        busy = self.state[:n] == PREFILL
        self.state[:n][busy] = QUEUED
        self.started_at[:n][busy] = np.nan
        self._pause_pending = bool(busy.any() or np.isin(self.state[:n], (QUEUED, DECODE)).any())
        self.last_update_ts = ev.ts
        if self.history.update_flushes:
            self.last_flush_ts = ev.ts
        if self.run.mode == "sync" and not self._cohort_live:
            self.sync_wait = ev.ts
            self._sync_after_update = True
        if self.update_trigger is not None:
            self.history.train.observe(ev.ts - self.update_trigger)
        self.update_trigger = None
        self.updates += 1
        B = self.run.batch_size
        if self.run.mode == "async" and B and self.admitted_total >= (self.updates + 1) * B:
            self.update_trigger = ev.ts
