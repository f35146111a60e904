"""LiveState: contract events folded into columnar per-trajectory arrays, plus learning.

Each live trajectory owns a slot (a row) in a set of numpy arrays, so taking a snapshot
over 100k trajectories is a few boolean masks rather than a Python loop. Applying an
event is O(1). The same fold feeds the :class:`~prorsa_forecaster.history.History`:
observed reward, start-up and tool durations, admissions, prompt sizes and prefill
service times.

The fold is tolerant, as the contract asks: optional events may be missing
(``run.started``, sandbox, ``prefill.started``, tool events), a trajectory first seen
mid-life is created on the spot, and an event that makes no sense for the trajectory's
state is counted in ``ignored`` and changes nothing. The tracker's core is the authority
on anomalies; this fold only needs to stay usable.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from prorsa_schemas import Event
from prorsa_schemas.fold import Mutators

from .config import ForecastConfig
from .history import History
from .snapshot import START_COLD, START_DISPATCHED, START_PREWARM, START_READY, RunInfo, Snapshot
from .snapshot_build import build_snapshot
from .state_engines import EngineFold, RankDepartures
from .state_sampler import SamplerFold
from .trajstate import ABORTED, DECODE, FREE, PREFILL, QUEUED, REWARD, START, TOOL

__all__ = ["ABORTED", "DECODE", "FREE", "PREFILL", "QUEUED", "REWARD", "START", "TOOL", "LiveState"]


class LiveState(SamplerFold, EngineFold):
    """Incremental state of one run (all runs in a log are folded together)."""

    def __init__(self, config: ForecastConfig | None = None, history: History | None = None) -> None:
        self.config = config or ForecastConfig()
        self.history = history or History(self.config)
        self.run = RunInfo()
        self.ignored = 0
        self._slot: dict[tuple[str, str], int] = {}  # (run, traj) -> slot
        self._free: list[int] = []
        self._n = 0
        cap = 1024
        self.state = np.zeros(cap, np.int8)
        self.entered = np.zeros(cap)
        self.dispatched_at = np.zeros(cap)
        self.mode_at = np.zeros(cap)  # when the current start-up mode began
        self.mode = np.zeros(cap, np.int64)
        # The sandbox's own start-up (prewarm / cold) and when it began: kept past
        # sandbox.ready, so that its duration to the first request is learnt per mode.
        self.sandbox_mode = np.full(cap, START_DISPATCHED, np.int64)
        self.sandbox_at = np.zeros(cap)
        self.dprompt = np.zeros(cap)  # dispatched prompt
        self.prompt = np.zeros(cap)  # current / last request prompt
        self.context = np.zeros(cap)  # last prompt + its output
        self.queued_at = np.zeros(cap)
        self.started_at = np.full(cap, np.nan)
        self.engine = np.full(cap, -1, np.int64)
        self.growth = np.full(cap, np.nan)
        self.result = np.full(cap, -1.0)
        self.requests = np.zeros(cap, np.int64)
        self.turn = np.zeros(cap, np.int64)  # request.queued.turn of the current request
        self.rank = np.full(cap, -1, np.int64)  # request.queued.dp_rank (-1: not said)
        self.cohort = np.full(cap, -1, np.int64)
        self.cause = np.full(cap, np.nan)  # launch cause time (replace) for the launch delay
        self.cohort_cause = np.full(cap, np.nan)
        # The prompt whose KV a prefill instance caches for this trajectory, and when its
        # prefill finished (a later weight update that flushed the caches lost it).
        self.cache_prompt = np.zeros(cap)
        self.cache_ts = np.full(cap, np.nan)
        # The engine whose prefix cache holds it (-1: unknown).
        self.cache_engine = np.full(cap, -1, np.int64)
        self._req: list[str | None] = [None] * cap
        # frailty.py: each trajectory's ended tool calls (count, sum of log durations) and
        # its group's code (-1: none) and name.
        self.tool_calls = np.zeros(cap, np.int64)
        self.tool_logsum = np.zeros(cap)
        self.group = np.full(cap, -1, np.int64)
        self._group_key: list[object] = [None] * cap
        # Engines: code per name; roles from engine events; last prefill departure.
        self._engine_code: dict[str, int] = {}
        self._engine_names: list[str] = []
        self._role: dict[str, str] = {}
        self._departures: dict[str | None, deque[float]] = {}
        self._rank_departures = RankDepartures()
        self._servers: dict[str, int] = {}  # data-parallel prefill queues per engine
        self._decode_kv: dict[str, int] = {}
        self.kv_now = 0.0
        # Launch attribution (FIFO of causes not yet matched to a dispatch).
        self._pending: deque[float] = deque()
        self._seen_completion = False
        self._cohort_pending: deque[float] = deque()
        self._cohort_of: dict[str, int] = {}
        self._cohort_live: dict[int, int] = {}
        self._cohort_free: list[int] = []
        self._cohort_next = 0
        self._batch = -1
        self._launch_count = 0
        self.updates = 0
        self.admitted_total = 0
        self.update_trigger: float | None = None
        self._launch_caused = False
        self._cause_now = np.nan
        self.last_update_ts = -np.inf
        # The last weight update that flushed the prefix caches (History.update_flushes).
        self.last_flush_ts = -np.inf
        self._pause_pending = False
        # When the engines resumed after the last update (its pause's end, once learnt): a
        # prefill timed from before it would hold the pause (_learn_prefill).
        self.resumed_ts = -np.inf
        # Sync: when the last update came with the batch drained (next batch not yet out).
        self.sync_wait: float | None = None
        self._sync_after_update = False  # sync_wait is a policy.updated (not run.started)

    # -- slots -------------------------------------------------------------------------
    def _grow(self) -> None:
        cap = len(self.state) * 2
        for name, value in list(vars(self).items()):
            if isinstance(value, np.ndarray) and len(value) == cap // 2:
                fill = {"started_at": np.nan, "engine": -1, "growth": np.nan, "result": -1.0,
                        "cohort": -1, "rank": -1, "group": -1, "cause": np.nan, "cohort_cause": np.nan, "cache_ts": np.nan}.get(name, 0)
                new = np.full(cap, fill, dtype=value.dtype)
                new[: len(value)] = value
                setattr(self, name, new)
        self._req.extend([None] * (cap - len(self._req)))
        self._group_key.extend([None] * (cap - len(self._group_key)))

    def _new(self, traj: tuple[str, str], ts: float) -> int:
        if self._free:
            i = self._free.pop()
        else:
            if self._n == len(self.state):
                self._grow()
            i = self._n
            self._n += 1
        self._slot[traj] = i
        self.state[i] = START
        self.entered[i] = self.dispatched_at[i] = self.mode_at[i] = ts
        self.mode[i] = self.sandbox_mode[i] = START_DISPATCHED
        self.dprompt[i] = self.prompt[i] = self.context[i] = self.cache_prompt[i] = self.tool_logsum[i] = 0.0
        self.started_at[i] = self.growth[i] = self.cause[i] = self.cohort_cause[i] = self.cache_ts[i] = np.nan
        self.engine[i] = self.cohort[i] = self.cache_engine[i] = self.group[i] = -1
        self.requests[i] = self.turn[i] = self.tool_calls[i] = 0
        self.result[i] = -1.0
        self._req[i] = self._group_key[i] = None
        return i

    def _release(self, i: int, traj: tuple[str, str], ts: float) -> None:
        if self.state[i] == DECODE:
            self.kv_now -= self.prompt[i]
        self._left_cohort(i, ts)
        self.history.frailty.leave(traj[0], self._group_key[i], int(self.group[i]))
        self.group[i] = -1
        self.state[i] = FREE
        del self._slot[traj]
        self._free.append(i)

    def _code(self, engine: str | None) -> int:
        if engine is None:
            return -1
        c = self._engine_code.get(engine)
        if c is None:
            c = self._engine_code[engine] = len(self._engine_names)
            self._engine_names.append(engine)
        return c

    # -- the fold -----------------------------------------------------------------------
    def apply(self, ev: Event) -> None:
        """Fold one valid contract event (in ``ts`` order) into the state and history."""
        MUTATE(self, ev)

    @property
    def live(self) -> int:
        return len(self._slot)

    def _get(self, ev) -> int:
        i = self._slot.get((ev.run, ev.traj))
        return self._new((ev.run, ev.traj), ev.ts) if i is None else i

    def slot(self, run: str, traj: str) -> int | None:
        """The slot of a live trajectory (None: not live)."""
        return self._slot.get((run, traj))

    def slot_of(self, ev) -> int | None:
        """The slot of an event's trajectory (None: not live)."""
        return self._slot.get((ev.run, ev.traj))

    def _on_trajectory_dispatched(self, ev) -> None:
        if (ev.run, ev.traj) in self._slot:
            self.ignored += 1
            return
        self._next_batch(ev.ts)
        i = self._new((ev.run, ev.traj), ev.ts)
        self.dprompt[i] = float(ev.prompt_tokens)
        if ev.group is not None:
            self.group[i] = self.history.frailty.group_code(ev.run, ev.group)
            self._group_key[i] = ev.group
        self._launched(i, ev)

    def _on_sandbox_started(self, ev) -> None:
        i = self._get(ev)
        if self.state[i] != START:
            self.ignored += 1
            return
        self.mode[i] = self.sandbox_mode[i] = START_PREWARM if ev.mode == "prewarm" else START_COLD
        self.mode_at[i] = self.sandbox_at[i] = ev.ts

    def _on_sandbox_ready(self, ev) -> None:
        i = self._get(ev)
        if self.state[i] != START:
            self.ignored += 1
            return
        self.mode[i] = START_READY
        self.mode_at[i] = ev.ts

    def _on_request_queued(self, ev) -> None:
        h = self.history
        i = self._get(ev)
        st = self.state[i]
        x = float(ev.prompt_tokens)
        if st == START:
            # Start-up durations: from dispatch, and from the mode's own start.
            h.start[START_DISPATCHED].observe(ev.ts - self.dispatched_at[i])
            if self.mode[i] != START_DISPATCHED:
                h.start[int(self.mode[i])].observe(ev.ts - self.mode_at[i])
            if self.mode[i] == START_READY and self.sandbox_mode[i] != START_DISPATCHED:
                # The sandbox's start-up to the first request, sandbox.ready included: what
                # the forecast asks of a trajectory still starting in that mode.
                h.start[int(self.sandbox_mode[i])].observe(ev.ts - self.sandbox_at[i])
            if self.requests[i] == 0:
                h.first_prompt.observe(x)
                if self.dprompt[i] > 0:
                    h.first_overhead.observe(x - self.dprompt[i])
                if not np.isnan(self.cause[i]):
                    h.launch.observe(ev.ts - self.cause[i])
                if not np.isnan(self.cohort_cause[i]):
                    h.cohort_launch.observe(ev.ts - self.cohort_cause[i])
        elif st == TOOL:
            self.tool_calls[i], self.tool_logsum[i] = h.learn_tool(
                ev.ts - self.entered[i], ev.ts, int(self.tool_calls[i]), float(self.tool_logsum[i]), int(self.group[i]))
            growth = x - self.context[i]
            h.tool_growth.observe(growth)
            if self.result[i] >= 0:
                h.tool_overhead.observe(growth - self.result[i])
            g = self.growth[i]
            a = self.config.tool_ema_alpha
            self.growth[i] = growth if np.isnan(g) else (1 - a) * g + a * growth
        elif st == DECODE:
            self.kv_now -= self.prompt[i]  # re-prefill: the old request left decode
        elif st == ABORTED:
            h.learn_requeue(ev.ts - self.entered[i])
        elif st not in (QUEUED, PREFILL):
            self.ignored += 1
            return
        self.state[i] = QUEUED
        self.entered[i] = self.queued_at[i] = ev.ts
        self.prompt[i] = x
        self.started_at[i] = np.nan
        self.engine[i] = self._code(ev.engine)
        self.requests[i] += 1
        self.turn[i] = ev.turn
        self.rank[i] = -1 if ev.dp_rank is None else ev.dp_rank
        self.result[i] = -1.0
        self._req[i] = ev.req

    def _on_prefill_started(self, ev) -> None:
        i = self._slot.get((ev.run, ev.traj))
        if i is None or self.state[i] != QUEUED or self._req[i] != ev.req:
            self.ignored += 1
            return
        self._prefill_progress(ev.ts)
        self.state[i] = PREFILL
        self.started_at[i] = ev.ts
        if ev.engine is not None:
            self.engine[i] = self._code(ev.engine)

    def _on_prefill_finished(self, ev) -> None:
        i = self._slot.get((ev.run, ev.traj))
        if i is None or self.state[i] not in (QUEUED, PREFILL) or self._req[i] != ev.req:
            self.ignored += 1
            return
        if ev.engine is not None:
            self.engine[i] = self._code(ev.engine)
        self._prefill_progress(ev.ts, self.queued_at[i], self._finish_service(i, ev.cached_tokens))
        self._learn_prefill(i, ev.ts, ev.cached_tokens)
        self.state[i] = DECODE
        self.entered[i] = ev.ts
        self.kv_now += self.prompt[i]

    def _on_decode_finished(self, ev) -> None:
        i = self._slot.get((ev.run, ev.traj))
        if i is None or self.state[i] != DECODE or self._req[i] != ev.req:
            self.ignored += 1
            return
        self.kv_now -= self.prompt[i]
        h = self.history
        if self.entered[i] < self.last_update_ts:  # under way when the last update landed
            h.cut_ends += 1.0
            h.cut += ev.finish == "abort"
        if ev.finish != "abort":
            h.decode.observe(ev.ts - self.entered[i])
            h.decode_done += 1
            h.decode_tool += ev.finish == "tool"
            h.tool_by_turn.observe(float(self.turn[i]), float(ev.finish == "tool"), 1.0)
            h.output.observe(ev.output_tokens)
        self.context[i] = self.prompt[i] + ev.output_tokens
        self.entered[i] = ev.ts
        self.state[i] = {"tool": TOOL, "abort": ABORTED}.get(ev.finish, REWARD)

    def _on_tool_finished(self, ev) -> None:
        i = self._slot.get((ev.run, ev.traj))
        if i is not None and self.state[i] == TOOL:
            self.result[i] = float(ev.result_tokens)

    def _on_reward_started(self, ev) -> None:
        i = self._slot.get((ev.run, ev.traj))
        if i is not None and self.state[i] != REWARD:
            self.state[i] = REWARD
            self.entered[i] = ev.ts

    def _on_trajectory_dropped(self, ev) -> None:
        i = self._slot.get((ev.run, ev.traj))
        if i is None:
            self.ignored += 1
            return
        if self.state[i] == ABORTED:
            self.history.learn_requeue(None)
        self._release(i, (ev.run, ev.traj), ev.ts)

    # -- snapshot ------------------------------------------------------------------------
    def snapshot(self, t: float) -> Snapshot:
        """The columnar snapshot at ``t`` (call it after folding every event with ts < t)."""
        return build_snapshot(self, t)

    # -- what the snapshot builder reads ------------------------------------------------
    @property
    def n(self) -> int:
        """Slots in use so far (the live ones and the freed ones): the arrays' length."""
        return self._n

    @property
    def cohorts(self) -> int:
        """Cohort ids handed out so far (``cohort`` < this)."""
        return self._cohort_next

    def request_of(self, i: int) -> str | None:
        """The ``req`` of slot ``i``'s current request."""
        return self._req[i]


# The fold's handlers, one per event type (the project's one way to apply an event: see
# prorsa_schemas.fold). The methods live on LiveState and its two sides (SamplerFold,
# EngineFold); event types not listed change nothing here.
MUTATE: Mutators = Mutators()
MUTATE.on("run.started")(LiveState._on_run_started)
MUTATE.on("policy.updated")(LiveState._on_policy_updated)
MUTATE.on("trajectory.dispatched")(LiveState._on_trajectory_dispatched)
MUTATE.on("sandbox.started")(LiveState._on_sandbox_started)
MUTATE.on("sandbox.ready")(LiveState._on_sandbox_ready)
MUTATE.on("request.queued")(LiveState._on_request_queued)
MUTATE.on("prefill.started")(LiveState._on_prefill_started)
MUTATE.on("prefill.finished")(LiveState._on_prefill_finished)
MUTATE.on("decode.finished")(LiveState._on_decode_finished)
MUTATE.on("tool.finished")(LiveState._on_tool_finished)
MUTATE.on("reward.started")(LiveState._on_reward_started)
MUTATE.on("reward.finished")(LiveState._on_reward_finished)
MUTATE.on("trajectory.dropped")(LiveState._on_trajectory_dropped)
MUTATE.on("engine.registered", "engine.stats", "engine.switching", "engine.switched", "engine.switch_failed",
          "engine.deregistered")(LiveState._engine_event)
