"""Interrupting engines: the weight-update abort and role switches (drain, drain deadline,
the switch itself), mixed into :class:`~prorsa_sim.cluster.ClusterSim`."""

from __future__ import annotations

from collections.abc import Callable

from prorsa_emulated.costmodel import ModelProfile

from .engines import Engine, Rank, Req

DRAIN_DEADLINE_S = 10.0
"""CHOICE: a draining engine finishes what it is running for at most this long, then
aborts the rest (re-queued with its partial output). SGLang's router does not drain
(``DELETE /workers`` only stops routing); the engine agent waits for idle and sends
``/abort_request {"abort_all": true}`` after the command's deadline (sglang-facts.md).
10 s is one policy window ([P] Appendix B, S = 10 s): a switch decided in one window has
drained by the next decision. What is aborted then costs little: the partial output is
kept, and the prompt is still in the prefill side's prefix cache (docs/simulator.md,
"Role switches", prices it)."""


class Interruptions:
    """What stops or moves an engine's work (uses the cluster's clock, engines and router)."""

    now: float
    profile: ModelProfile
    engines: list[Engine]
    unrouted: list[Req]
    orphans: list[Req]
    paused: bool
    switches: int
    switch_log: list[dict]
    drain_deadline_s: float
    _inflight: dict[Req, Rank]
    at: Callable[..., None]
    route_prefill: Callable[[Req], Engine | None]
    route_decode: Callable[[], Rank | None]

    # --- interruption (weight sync, drain deadline) -------------------------------------

    def settle(self, eng: Engine) -> None:
        """Stop ``eng`` now: complete the decode steps already done, drop a prefill step."""
        if not eng.stepping:
            return
        if eng.seg_kind == "decode":
            done = min(eng.seg_k, int((self.now - eng.seg_t0) / eng.seg_dt)) if eng.seg_dt > 0 else 0
            eng.seg_k = done
            eng.version += 1
            self._step_end(eng, eng.version)  # replans; caller stops it again below
        eng.version += 1
        eng.stepping = False

    def hold_engine(self, eng: Engine, retract: bool = False) -> None:
        """The weight-update pause in SGLang's ``in_place`` mode: ``eng`` stops (the decode
        steps already done count, a prefill step in flight is redone after the pause) and
        keeps every request and its KV; its prefix cache is flushed only if it holds
        nothing, as SGLang refuses ``/flush_cache`` on an engine that holds a request.
        ``retract`` (SGLang's ``retract`` mode): the requests it runs give their KV back
        first (:meth:`retract_engine`)."""
        self.settle(eng)
        if retract:
            self.retract_engine(eng)
        if eng.has_work() or any(r.engine is eng for r in self._inflight.values()):
            return
        for rank in eng.ranks:
            self.cache_flushed_at_update_tokens += rank.cache_tokens
            rank.flush_cache()

    def retract_engine(self, eng: Engine) -> None:
        """SGLang's ``pause_generation(mode="retract")`` on a settled engine: every request
        it runs gives its KV back (``ScheduleBatch.retract_all``). On a prefill or mixed
        rank, a prefill under way goes back to the head of the queue with the prefix it
        matched and the chunks it made kept in the radix cache (``cache_unfinished_req``),
        and a decoding request (mixed rank) re-prefills its prompt plus what it generated,
        first in line, its prompt a cache hit (SGLang inserts a prompt into the radix tree
        once prefilled; the output's KV is freed, ``cache_finished_req(is_insert=False)``):
        no event, the request goes on. On a PD decode rank the request's KV is offloaded
        to host memory and loaded back when generation continues (``offload_kv_cache``):
        it stays in the batch here (the reload's PCIe time is not modelled; the
        emulated engine does not charge it either)."""
        if eng.role == "decode":
            return
        for rank in eng.ranks:
            started = [q for q in rank.waiting if q.started]
            for req in started:
                rank.inuse_prefill -= req.prompt
                rank.waiting_tokens += req.prompt - req.pf_left
                req.started = False
                if req.pf_ctx > self._shared_hit(rank, req.traj):
                    rank.cache_put(req.traj.tid, req.pf_ctx)
            retracted = list(rank.running)
            for req in reversed(retracted):  # the oldest ends up first in line
                gen = rank.generated(req)
                rank.remove_running(req)
                self.update_retractions += 1
                rank.cache_put(req.traj.tid, req.prompt)
                req.alive = True
                req.out_done += gen
                req.out_target -= gen
                req.prompt += gen
                req.started = False
                req.resumed = True
                rank.waiting.appendleft(req)
                rank.waiting_tokens += req.prompt

    def abort_engine(self, eng: Engine, reroute_waiting: bool, reason: str = "update") -> None:
        """Abort every request on ``eng`` (decoding ones re-prefill elsewhere) and flush its
        prefix cache. ``reason``: ``"update"`` (weight sync) or ``"drain"`` (a switch's
        drain deadline: counted in the drain_* summary keys)."""
        # Requeued requests may be routed back here, and settling the step in flight
        # replans it: keep this engine from planning a step or starting a switch until
        # the abort is complete.
        was_available, eng.available = eng.available, False
        self.settle(eng)
        drain = reason == "drain"
        # Transfers still in flight to a rank keep their tokens booked there.
        booked: dict[Rank, int] = {}
        for req, r in self._inflight.items():
            if r.engine is eng:
                booked[r] = booked.get(r, 0) + req.prompt
        for rank in eng.ranks:
            for req in list(rank.running):
                gen = rank.generated(req)
                rank.remove_running(req)
                req.alive = True
                if drain:
                    self._count_drain_abort(eng, req, req.out_done + gen, deadline=True)
                    self.drain_aborted_decode_tokens += req.out_done + gen
                self._on_aborted(req, gen_total=req.out_done + gen, requeue=True)
            while rank.pending:
                req = rank.pending.popleft()
                if drain:
                    self._count_drain_abort(eng, req, req.out_done, deadline=True)
                self._on_aborted(req, gen_total=req.out_done, requeue=True)
            rank.waiting_tokens = booked.get(rank, 0)
            rank.inuse_prefill = 0
            waiting = list(rank.waiting)
            rank.waiting.clear()
            for req in waiting:
                if drain:
                    if req.started:  # a prefill in progress: its computed chunks are lost
                        self._count_drain_abort(eng, req, 0, deadline=True)
                    else:
                        self.drain_rerouted_reqs += 1
                req.started = False
                if reroute_waiting:
                    self.route_prefill(req)
                else:
                    rank.waiting.append(req)
                    rank.waiting_tokens += req.prompt
            flushed = rank.cache_tokens
            rank.flush_cache()
            if drain:
                self.cache_lost_tokens += flushed
                if eng.switch is not None:
                    eng.switch["cache_lost"] += flushed
            else:
                self.cache_flushed_at_update_tokens += flushed
        eng.available = was_available

    # --- role switches ------------------------------------------------------------------
    #
    # A switch (docs/simulator.md, "Role switches"): the router stops sending the engine
    # work at once (``routable`` is False while draining); its not-yet-started work is
    # re-queued at once on the other engines (``_shed_unstarted``); what it is running
    # finishes, up to ``drain_deadline_s``, after which the rest is aborted and re-queued
    # with its partial output; then the switch itself takes ``switch_time(mode)``, the
    # prefix cache is flushed and counted in ``cache_lost_tokens``. During the
    # weight-update pause every engine is empty, so a switch needs no drain: it starts at
    # once and the engine resumes when both the pause and its switch are over.

    def switch_allowed(self, eng: Engine, to_role: str) -> bool:
        """Whether :meth:`request_switch` accepts: not already switching, not in that role
        already, and serving or in the weight-update pause."""
        return eng.switch is None and eng.role != to_role and (eng.available or self.paused)

    def request_switch(self, eng: Engine, to_role: str, mode: str, cmd: str) -> bool:
        """Start a switch of ``eng`` (drain, or at once during the weight-update pause);
        False if it is refused (see :meth:`switch_allowed`)."""
        if not self.switch_allowed(eng, to_role):
            return False
        eng.switch = {
            "cmd": cmd, "to": to_role, "mode": mode, "t": self.now, "from": eng.role,
            "aborted": 0, "cache_lost": 0,
        }
        self._on_switching(eng)
        self.router_forget(eng)
        if self.paused and not self.pause_keeps:
            # The update aborted everything in flight; what still waits here (requests
            # parked for the pause) goes to the other engines. No drain. (Paused in
            # place, the engine still holds its requests: it drains once the pause ends.)
            self._shed_unstarted(eng)
            self._start_switch(eng)
            return True
        eng.draining = True
        self._shed_unstarted(eng)
        self.at(self.now + self.drain_deadline_s, self._drain_deadline, eng, cmd)
        self._maybe_switch(eng)
        return True

    def _shed_unstarted(self, eng: Engine) -> None:
        """Re-queue at once the work ``eng`` has not started: prompts waiting for their
        prefill to begin go to another prefill rank (no event: the request was never
        touched), and on the decode side the transferred requests waiting for KV space
        and the transfers still in flight to it are aborted and re-queued (they
        re-prefill; the prefill side still caches their prompt)."""
        for rank in eng.ranks:
            while rank.pending:
                req = rank.pending.popleft()
                rank.waiting_tokens -= req.prompt
                self._count_drain_abort(eng, req, req.out_done, deadline=False)
                self._on_aborted(req, gen_total=req.out_done, requeue=True)
            if any(not q.started for q in rank.waiting):
                moved = [q for q in rank.waiting if not q.started]
                kept = [q for q in rank.waiting if q.started]
                rank.waiting.clear()
                rank.waiting.extend(kept)
                for req in moved:
                    rank.waiting_tokens -= req.prompt
                    self.drain_rerouted_reqs += 1
                    self.route_prefill(req)
        for req, rank in [(q, r) for q, r in self._inflight.items() if r.engine is eng]:
            del self._inflight[req]
            rank.waiting_tokens -= req.prompt
            if req.alive:
                self._count_drain_abort(eng, req, req.out_done, deadline=False)
                self._on_aborted(req, gen_total=req.out_done, requeue=True)

    def _count_drain_abort(self, eng: Engine, req: Req, gen_total: int, deadline: bool) -> None:
        """A request a drain aborts: it re-prefills its prompt plus what it generated
        (exact on PD engines; on a mixed engine a retracted request's recomputed output
        is counted twice)."""
        self.drain_aborts += 1
        self.drain_deadline_aborts += deadline
        self.drain_requeued_tokens += req.prompt + gen_total
        if eng.switch is not None:
            eng.switch["aborted"] += 1

    def _drain_deadline(self, eng: Engine, cmd: str) -> None:
        if eng.switch is None or eng.switch["cmd"] != cmd or not eng.draining:
            return
        self.abort_engine(eng, reroute_waiting=True, reason="drain")
        self._maybe_switch(eng)

    def _maybe_switch(self, eng: Engine) -> None:
        """Start the switch of a draining engine once it holds nothing."""
        if eng.switch is None or not eng.draining or not eng.available or eng.stepping or eng.has_work():
            return
        self._start_switch(eng)

    def _start_switch(self, eng: Engine) -> None:
        sw = eng.switch
        eng.available = False
        eng.draining = False
        lost = sum(r.cache_tokens for r in eng.ranks)
        self.cache_lost_tokens += lost
        sw["cache_lost"] += lost
        for rank in eng.ranks:
            rank.flush_cache()
        sw["drain_end"] = self.now
        sw["in_pause"] = self.paused
        self.at(self.now + self.profile.switch_time(sw["mode"]), self._switched, eng)

    def _switched(self, eng: Engine) -> None:
        sw = eng.switch
        eng.role = sw["to"]
        eng.switch = None
        eng.gen_throughput = 0.0  # a rate from before the switch says nothing of the new role
        # During the weight-update pause the engine waits for the resume.
        eng.available = not self.paused
        self.switches += 1
        self.switch_log.append({
            "t": round(self.now, 3), "engine": eng.name, "from": sw["from"], "to": sw["to"],
            "mode": sw["mode"], "requested_t": round(sw["t"], 3),
            "drain_s": round(sw["drain_end"] - sw["t"], 3),
            "switch_s": round(self.now - sw["drain_end"], 3),
            "in_pause": sw["in_pause"], "drain_aborts": sw["aborted"],
            "cache_lost_tokens": sw["cache_lost"],
        })
        self._on_switched(eng, sw)
        if eng.available:
            self.release_parked()

    def release_parked(self) -> None:
        """Route requests that found no engine of the right role earlier."""
        if self.unrouted:
            reqs, self.unrouted = self.unrouted, []
            for req in reqs:
                if req.alive:
                    self.route_prefill(req)
        if self.orphans:
            reqs, self.orphans = self.orphans, []
            for req in reqs:
                if not req.alive:
                    continue
                target = self.route_decode()
                if target is None:
                    self.orphans.append(req)
                else:
                    self._ship(req, target)
