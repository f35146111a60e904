"""The rollout side of the simulator: the RL sampler (sync, or async with a staleness
bound), each trajectory's requests, tool calls and reward, the trainer's policy updates
and the weight-update pause, and the events they emit. Mixed into
:class:`~prorsa_sim.simulator.Simulator`, which supplies the clock and the cluster."""

from __future__ import annotations

from dataclasses import dataclass, field

from prorsa_schemas import events as E

from . import sampler
from .cluster import ClusterSim
from .engines import Engine, Req
from .workloads import TrajectoryPlan, plan_trajectory, sandbox_start

PHASES = ("sandbox", "prefill", "decode", "tool", "reward")
"""Where a trajectory's time goes, dispatch to reward: its sandbox start, its requests
waiting for and in prefill (``request.queued`` to ``prefill.finished``, re-queues after an
abort included), from there to the answer (KV transfer, waiting for decode KV, decoding),
its tool calls and its reward. The prefill and decode phases are the cluster's, which the
P:D split changes; the other three are the workload's (``FIXED_PHASES``)."""
SANDBOX, PREFILL, DECODE, TOOL, REWARD = range(len(PHASES))
FIXED_PHASES = (SANDBOX, TOOL, REWARD)


@dataclass(eq=False, slots=True)
class Traj:
    idx: int
    tid: str
    group: str
    plan: TrajectoryPlan
    version: int
    t_dispatch: float
    context: int = 0
    turn: int = 0
    nreq: int = 0
    req: Req | None = None
    last_rank: object = None
    router_prefix: int = 0
    """Tokens of the last request the router sent (what its prefix tree matches)."""
    router_gen: int = 0
    """The generation of the engine that request went to (``Cluster.router_forget``)."""
    alive: bool = True
    length_capped: bool = False
    shared_key: str | None = None
    """Prefix-cache key of the GRPO group's shared first prompt (None once irrelevant)."""
    shared_tokens: int = 0
    phase: int = SANDBOX
    """Index into :data:`PHASES` of what the trajectory is doing since ``t_phase``."""
    t_phase: float = 0.0
    phase_s: list = field(default_factory=lambda: [0.0] * len(PHASES))
    """Seconds spent in each of :data:`PHASES` so far."""
    decode_steps: int = 0
    """Decode steps its answers took (output tokens after each request's first)."""


class Trajectories(ClusterSim):
    """The sampler, the trajectories and the trainer (see the module doc); the hooks
    ``_on_*`` the cluster calls are implemented here."""

    # --- sampler ------------------------------------------------------------------------

    def _start_sync_step(self) -> None:
        self.step_start = self.now
        self._step_fixed_max = 0.0
        self.outstanding = self.cfg.batch_size
        for _ in range(self.cfg.batch_size):
            self._dispatch()

    def _fill_async(self) -> None:
        # The async sampler's rules (AReaL-style: :mod:`.sampler`).
        cfg = self.cfg
        cap = sampler.live_cap(cfg.batch_size, cfg.staleness, cfg.over_dispatch)
        budget = sampler.launch_budget(self.version, cfg.staleness, cfg.batch_size, self.spec.admission_rate)
        while sampler.may_dispatch(self.live, self.next_idx, cap, budget, self.spec.group_size):
            self._dispatch()

    def _dispatch(self) -> None:
        i = self.next_idx
        self.next_idx += 1
        g = self.spec.group_size
        plan = plan_trajectory(self.spec, self.cfg.seed, i).capped(self.cfg.max_turns, self.cfg.max_output)
        tr = Traj(i, f"t{i:06d}", f"g{i // g:05d}", plan, self.version, self.now, context=plan.prompt_tokens,
                  t_phase=self.now)
        if g > 1 and self.cfg.group_prefix:
            # Group members answer the same prompt: one shared prefix (versioned: caches
            # flush at every policy update).
            tr.shared_key, tr.shared_tokens = f"{tr.group}@{self.version}", plan.prompt_tokens
        self.trajs[tr.tid] = tr
        self.live += 1
        self.emit(E.TrajectoryDispatched, traj=tr.tid, prompt_tokens=plan.prompt_tokens, group=tr.group, policy_version=self.version)
        mode, delay, pooled = sandbox_start(plan, self.spec, self.pool_free)
        if mode is None:
            self._new_request(tr)
            return
        if pooled:
            self.pool_free -= 1
            self.at(self.now + self.spec.cold_median_s, self._refill_pool)
        self.emit(E.SandboxStarted, traj=tr.tid, mode=mode)
        self.at(self.now + delay, self._sandbox_ready, tr)

    def _refill_pool(self) -> None:
        self.pool_free += 1

    def _sandbox_ready(self, tr: Traj) -> None:
        if not tr.alive:
            return
        self.emit(E.SandboxReady, traj=tr.tid)
        self._new_request(tr)

    def _phase(self, tr: Traj, phase: int) -> None:
        tr.phase_s[tr.phase] += self.now - tr.t_phase
        tr.phase, tr.t_phase = phase, self.now

    def _new_request(self, tr: Traj, out_left: int | None = None) -> None:
        self._phase(tr, PREFILL)
        tr.nreq += 1
        if out_left is None:
            out_left = tr.plan.outputs[tr.turn]
            room = self.spec.max_context - tr.context
            if out_left >= room:
                out_left = max(1, room)
                tr.length_capped = True
        req = Req(tr, f"{tr.tid}-r{tr.nreq}", tr.context, out_left)
        tr.req = req
        self.prefill_tokens += tr.context
        self.cur.prefill_demand += tr.context
        # Route first so request.queued can name its engine, then announce it.
        eng = self._route_quiet(req)
        rank = req.rank.idx if eng is not None and getattr(req, "rank", None) is not None else None
        self.emit(E.RequestQueued, traj=tr.tid, req=req.rid, turn=tr.turn, prompt_tokens=tr.context,
                  engine=eng.name if eng else None, dp_rank=rank)
        if eng is not None:
            self.kick(eng)

    def _route_quiet(self, req: Req) -> Engine | None:
        # route_prefill kicks the engine, which may emit prefill.started before
        # request.queued; defer kicks by marking the engine busy-planning.
        self._defer_kick = True
        try:
            return self.route_prefill(req)
        finally:
            self._defer_kick = False

    def kick(self, eng: Engine) -> None:
        if getattr(self, "_defer_kick", False):
            return
        super().kick(eng)

    # --- engine hooks ---------------------------------------------------------------------

    def _on_prefill_started(self, eng: Engine, req: Req) -> None:
        self.cached_tokens += req.cached
        if not req.announced:
            req.announced = True
            self.emit(E.PrefillStarted, traj=req.traj.tid, req=req.rid, engine=eng.name)

    def _on_prefill_finished(self, req: Req, eng: Engine, decode_eng: Engine | None) -> None:
        if req.traj.alive and req.traj.req is req:
            self._phase(req.traj, DECODE)
        self.cur.decode_admit += req.traj.context
        self.cur.prefills_done += 1
        self.cur.prefill_prompt_done += req.prompt
        self.cur.prefill_cached_done += req.cached
        self._win_prompt[eng.index] += req.prompt
        self._win_cached[eng.index] += req.cached
        self.emit(
            E.PrefillFinished, traj=req.traj.tid, req=req.rid, engine=eng.name,
            cached_tokens=req.cached, decode_engine=decode_eng.name if decode_eng else None,
        )

    def _on_decode_finished(self, req: Req, output_tokens: int) -> None:
        tr: Traj = req.traj
        if not tr.alive or tr.req is not req:
            return
        req.alive = False
        tr.req = None
        self.decode_tokens += output_tokens
        self.cur.decode_tokens += output_tokens
        tr.decode_steps += max(0, output_tokens - 1)
        tr.context += output_tokens
        last = tr.turn >= len(tr.plan.outputs) - 1
        if tr.length_capped or last:
            finish = "length" if tr.length_capped else "stop"
            self.emit(E.DecodeFinished, traj=tr.tid, req=req.rid, output_tokens=output_tokens, finish=finish)
            self._phase(tr, REWARD)
            self.emit(E.RewardStarted, traj=tr.tid)
            self.at(self.now + tr.plan.reward_s, self._reward_finished, tr)
            return
        self.emit(E.DecodeFinished, traj=tr.tid, req=req.rid, output_tokens=output_tokens, finish="tool")
        self._phase(tr, TOOL)
        self.emit(E.ToolStarted, traj=tr.tid, tool="sandbox" if self.spec.sandbox else "tool", calls=1)
        self.at(self.now + tr.plan.tool_s[tr.turn], self._tool_finished, tr)

    def _on_aborted(self, req: Req, gen_total: int, requeue: bool) -> None:
        tr: Traj = req.traj
        if not tr.alive or tr.req is not req:
            return
        req.alive = False
        self.decode_tokens += gen_total
        tr.decode_steps += max(0, gen_total - 1)
        self.emit(E.DecodeFinished, traj=tr.tid, req=req.rid, output_tokens=gen_total, finish="abort")
        # The partial answer joins the context and the rest is generated after a re-prefill.
        tr.context += gen_total
        self._new_request(tr, out_left=max(1, req.out_done + req.out_target - gen_total))

    def _on_switching(self, eng: Engine) -> None:
        sw = eng.switch
        self.emit(E.EngineSwitching, engine=eng.name, cmd=sw["cmd"], from_role=sw["from"], to_role=sw["to"], mode=sw["mode"])

    def _on_switched(self, eng: Engine, sw: dict) -> None:
        self.emit(
            E.EngineSwitched, engine=eng.name, cmd=sw["cmd"], from_role=sw["from"], to_role=sw["to"],
            seconds=round(self.now - sw["t"], 6), mode=sw["mode"],
        )

    # --- trajectory lifecycle -----------------------------------------------------------

    def _tool_finished(self, tr: Traj) -> None:
        if not tr.alive:
            return
        result = tr.plan.results[tr.turn]
        self.emit(E.ToolFinished, traj=tr.tid, result_tokens=result, ok=True)
        tr.context += result
        tr.turn += 1
        self._new_request(tr)

    def _reward_finished(self, tr: Traj) -> None:
        if not tr.alive:
            return
        self.emit(E.RewardFinished, traj=tr.tid, admitted=tr.plan.admitted, reward=tr.plan.reward)
        self._end(tr)
        self._phase(tr, REWARD)
        self.traj_times.append(self.now - tr.t_dispatch)
        self.traj_phases.append(tuple(tr.phase_s))
        if self.cfg.mode == "sync":
            self.outstanding -= 1
            self._step_fixed_max = max(self._step_fixed_max, self._floor(tr))
            if self.outstanding == 0:
                # Every trajectory of a sync step is dispatched at its start, so the last
                # one's phases add up to the step time, and no split makes the step shorter
                # than its slowest trajectory's floor (:meth:`_floor`).
                self.step_tails.append((tuple(tr.phase_s), self._step_fixed_max))
                self.step_times.append(self.now - self.step_start)
                self.step += 1
                self._tick_progress()
                if self.step >= self.cfg.steps:
                    self.done = True
                    return
                self.at(self.now + self.cfg.train_s, self._policy_update)
            return
        if tr.plan.admitted:
            self.admitted_total += 1
            self._maybe_train()
        self._fill_async()

    def _floor(self, tr: Traj) -> float:
        """The least time ``tr`` could have taken on any split of the cluster: its sandbox,
        tools and reward (the workload's, the same plan under every policy) and its decode
        steps, each at least one step of a lone sequence (:attr:`min_decode_step_s`); its
        prefills and queues are counted as free."""
        return sum(tr.phase_s[i] for i in FIXED_PHASES) + tr.decode_steps * self.min_decode_step_s

    def _end(self, tr: Traj) -> None:
        tr.alive = False
        self.live -= 1
        del self.trajs[tr.tid]

    def _maybe_train(self) -> None:
        if not self.trainer_busy and sampler.trainer_ready(self.admitted_total, self.version, self.cfg.batch_size):
            self.trainer_busy = True
            self.at(self.now + self.cfg.train_s, self._policy_update)

    def _policy_update(self) -> None:
        self.trainer_busy = False
        self.version += 1
        self.epoch += 1
        self.emit(E.PolicyUpdated, version=self.version)
        if self.cfg.mode == "async":
            self.step_times.append(self.now - self.update_times[-1])
            self.update_times.append(self.now)
            self.step += 1
            self._tick_progress()
            if self.step >= self.cfg.steps:
                self.done = True
                return
            for tr in sorted(self.trajs.values(), key=lambda x: x.idx):
                if sampler.is_stale(tr.version, self.version, self.cfg.staleness):
                    self._drop(tr)
        # Weight sync (``pause_mode`` abort): pause every engine, abort in-flight requests
        # (they re-prefill on the new weights), flush prefix caches. Every engine stops
        # before any is aborted, so what an abort re-queues (and a draining engine's
        # waiting prompts) is parked until the resume and routed then, whatever order the
        # engines are listed in. (in_place and retract: below.)
        self.paused = True
        stopping = [eng for eng in self.engines if eng.available]
        for eng in stopping:
            eng.available = False
        if self.pause_keeps:
            # SGLang's in_place pause: nothing is aborted; what runs goes on after the sync
            # (retract: what prefill and mixed engines run re-prefills first).
            for eng in stopping:
                self.hold_engine(eng, retract=self.pause_retracts)
        else:
            for eng in stopping:
                self.abort_engine(eng, reroute_waiting=eng.draining)
            # Every engine is empty now: a switch that was draining needs no more drain, and
            # its switch time overlaps the pause.
            for eng in self.engines:
                if eng.switch is not None and eng.draining:
                    self._start_switch(eng)
        self.at(self.now + self.cfg.weight_sync_s, self._resume)
        self._paused_for_update()

    def _paused_for_update(self) -> None:
        """Every engine has just been paused for a weight update, and emptied unless the
        pause keeps what they hold (the simulator asks its policy here)."""

    def _resume(self) -> None:
        # An engine still switching resumes when its switch is done (``_switched``).
        self.paused = False
        for eng in self.engines:
            if eng.switch is None or eng.draining:
                eng.available = True
        for eng in self.engines:
            if eng.available:
                self.kick(eng)
        self.release_parked()
        if self.cfg.mode == "sync":
            self._start_sync_step()
        else:
            self._maybe_train()
            self._fill_async()

    def _drop(self, tr: Traj) -> None:
        req = tr.req
        if req is not None:
            self._remove_req(req)
        self.emit(E.TrajectoryDropped, traj=tr.tid, reason="stale")
        self.dropped += 1
        self._end(tr)

    def _remove_req(self, req: Req) -> None:
        req.alive = False
        rank = req.rank
        if rank is None:
            return
        if req in rank.running:
            rank.remove_running(req)
        elif req in rank.waiting:
            rank.waiting.remove(req)
            rank.waiting_tokens -= req.pf_left if req.started else req.prompt
            if req.started:
                rank.inuse_prefill -= req.prompt
        elif req in rank.pending:
            rank.pending.remove(req)
            rank.waiting_tokens -= req.prompt
