"""The rollout half of the simulator: trajectories, the RL sampler (sync / async with a
staleness bound), the trainer's policy updates, windows, policies and the event stream.

``Simulator(config, policy).run()`` returns a :class:`~prorsa_sim.summary.Result`; the
events (EVENTS.md v1, ``ts`` in simulated seconds from 0) go to ``config``'s sink.
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field

from prorsa_emulated.costmodel import CLUSTER_GPUS, ModelProfile, get_profile
from prorsa_schemas import events as E

from .cluster import ClusterSim
from .engines import Engine, Req
from .policy import EngineView, FutureDemand, Observation, Policy
from .workloads import TrajectoryPlan, WorkloadSpec, get_workload, plan_trajectory

_FORK_RECURSION_LIMIT = 100_000


@dataclass(frozen=True)
class SimConfig:
    """One simulation. Every field is a CLI option of ``prorsa sim run``."""

    workload: str = "coding"
    model: str = "deepseek-v3.2"
    staleness: int = 0
    """0: synchronous (on-policy); >0: asynchronous with this maximum staleness."""
    steps: int = 6
    """Rollout steps (sync) / policy updates (async). The first is the warm-up step (it
    starts from an empty cluster) and is reported apart; the rollout time is the mean of
    the others. CHOICE: 6 = one warm-up + 5 measured steps."""
    seed: int = 0
    batch_size: int = 512
    """Trajectories per training step ([P] paper scale: 512)."""
    total_gpus: int = CLUSTER_GPUS
    window_s: float = E.DEFAULT_WINDOW_S
    """Policy window S ([P] Appendix B default 10 s)."""
    train_s: float = 30.0
    """CHOICE: training time of one step on the trainer GPUs (not rollout GPUs)."""
    weight_sync_s: float = 5.0
    """CHOICE: rollout engines paused while new weights load."""
    over_dispatch: float | None = None
    """CHOICE: async keeps up to over_dispatch x batch_size trajectories live; default
    1 + staleness / 4 (1.5x at staleness 2, 3x at 8): a looser bound lets the sampler run
    further ahead, within the AReaL-style launch budget below."""
    dp_routing: str = "load"
    """How the attention-DP rank of a request is chosen (``engines.DP_ROUTING``): ``load``
    (default: SGLang's data-parallel controller balances ranks by load, so a prefix is reused
    only when the chosen rank holds it) or ``prefix`` (a DP-aware, cache-aware router)."""
    run: str = "sim"
    max_sim_s: float = 200_000.0
    """Safety stop (simulated seconds)."""

    @property
    def mode(self) -> str:
        return "sync" if self.staleness == 0 else "async"


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
    alive: bool = True
    length_capped: bool = False
    shared_key: str | None = None
    """Prefix-cache key of the GRPO group's shared first prompt (None once irrelevant)."""
    shared_tokens: int = 0


@dataclass
class WindowSample:
    t: float
    prefill_demand: int = 0
    decode_admit: int = 0
    decode_tokens: int = 0
    n_prefill: int = 0
    n_decode: int = 0
    n_mixed: int = 0
    n_switching: int = 0
    busy_gpu_s: float = 0.0
    wait_gpu_s: float = 0.0
    step: int = 0
    """Rollout steps completed when the window closed (0: the warm-up step)."""
    prefills_done: int = 0
    prefill_prompt_done: int = 0
    prefill_cached_done: int = 0
    """Prefills finished in the window: how many, their full prompt tokens, their
    prefix-cache hits."""
    decode_kv_tokens: int = 0
    """KV tokens of the sequences decoding (or transferred and waiting for KV space on a
    decode engine) when the window closed."""
    decode_seqs: int = 0
    """How many such sequences."""


class Simulator(ClusterSim):
    """A seeded rollout simulation under one policy."""

    def __init__(self, config: SimConfig, policy: Policy, sink=None):
        self.cfg = config
        self.spec: WorkloadSpec = get_workload(config.workload)
        prof: ModelProfile = get_profile(config.model)
        if config.steps < 1:
            raise ValueError("steps must be >= 1")
        if config.batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        if config.staleness < 0:
            raise ValueError("staleness must be >= 0")
        n = prof.engines_in(config.total_gpus)
        if n < 1:
            raise ValueError(f"{config.total_gpus} GPUs hold no {prof.gpus_per_engine}-GPU engine")
        self.policy = policy
        super().__init__(prof, policy.initial_roles(prof, n), dp_routing=config.dp_routing)
        self.sink = sink
        self.n_events = 0
        self.window_events: list = []
        self.trajs: dict[str, Traj] = {}
        self.live = 0
        self.next_idx = 0
        self.version = 0
        self.step = 0
        self.step_start = 0.0
        self.step_times: list[float] = []
        self.update_times: list[float] = [0.0]
        self.admitted_total = 0
        self.trainer_busy = False
        self.outstanding = 0
        self.done = False
        self.pool_free = self.spec.prewarm_pool
        self.traj_times: list[float] = []
        self.dropped = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.cached_tokens = 0
        self.windows: list[WindowSample] = []
        self.cur = WindowSample(0.0)
        self._cmd = 0
        self.forking = False
        self.step_pd_ratio: list = []
        self._step_pf = self._step_dc = 0
        # Per engine, for engine.stats rates (what an SGLang server's metrics give an agent):
        # computed prefill tokens at the last window, and this window's finished prefills'
        # prompt and cached tokens.
        self._pf_done_at_window = [0] * len(self.engines)
        self._win_prompt = [0] * len(self.engines)
        self._win_cached = [0] * len(self.engines)
        self._last_hit: list[float | None] = [None] * len(self.engines)

    # --- events -----------------------------------------------------------------------

    def emit(self, cls, **fields) -> None:
        if self.forking:
            return
        self.n_events += 1
        ev = cls(id=f"{self.cfg.run}-{self.n_events:09d}", ts=round(self.now, 6), run=self.cfg.run, **fields)
        if self.sink is not None:
            self.sink.write(ev)
        self.window_events.append(ev)

    # --- run --------------------------------------------------------------------------

    def run(self, progress=None):
        """Simulate until ``config.steps`` steps are done; return a Result."""
        from .summary import build_result

        self.begin(progress)
        self.run_until(lambda: self.done or self.now > self.cfg.max_sim_s)
        self._close_empty_time()
        return build_result(self)

    def begin(self, progress=None) -> None:
        """Set the run up at t = 0 (events, first window, first dispatch) without running
        it: :meth:`run` is ``begin`` then ``run_until`` the end. A search that steers the
        run segment by segment (``policies/bound.py``) calls ``begin`` and then
        ``run_until`` itself."""
        cfg = self.cfg
        self.emit(
            E.RunStarted, mode=cfg.mode, batch_size=cfg.batch_size,
            max_staleness=cfg.staleness if cfg.mode == "async" else None,
            group_size=self.spec.group_size, injection="replace",
            prompt_tokens_mean=int(self.spec.prompt_median),
        )
        p = self.profile
        for eng in self.engines:
            self.emit(
                E.EngineRegistered, engine=eng.name, server=eng.server, role=eng.role,
                gpus=p.gpus_per_engine, kv_capacity_tokens=eng.kv_capacity(),
                parallel=E.Parallel(tp=p.attn_tp, dp=p.attn_dp, ep=p.ep, attn_dp=p.attn_dp),
                switch_modes=list(p.switch_modes),
            )
        self.at(cfg.window_s, self._window)
        if cfg.mode == "sync":
            self.at(0.0, self._start_sync_step)
        else:
            self.at(0.0, self._fill_async)
        self.progress = progress
        self.warmup_mark: dict | None = None
        self.initial_role_counts = {r: sum(e.role == r for e in self.engines) for r in ("prefill", "decode", "mixed")}

    # --- sampler ------------------------------------------------------------------------

    def _start_sync_step(self) -> None:
        self.step_start = self.now
        self.outstanding = self.cfg.batch_size
        for _ in range(self.cfg.batch_size):
            self._dispatch()

    def _fill_async(self) -> None:
        cfg = self.cfg
        over = cfg.over_dispatch if cfg.over_dispatch is not None else 1 + cfg.staleness / 4
        cap = int(cfg.batch_size * over)
        # AReaL-style budget: never more than (version + staleness + 1) batches launched,
        # over-dispatched by 1/admission_rate so that enough samples are admitted.
        budget = math.ceil((self.version + cfg.staleness + 1) * cfg.batch_size / self.spec.admission_rate)
        g = self.spec.group_size
        # GRPO: a group is dispatched whole (a started group is completed past the bounds).
        while (self.live < cap and self.next_idx < budget) or self.next_idx % g:
            self._dispatch()

    def _dispatch(self) -> None:
        i = self.next_idx
        self.next_idx += 1
        g = self.spec.group_size
        plan = plan_trajectory(self.spec, self.cfg.seed, i)
        tr = Traj(i, f"t{i:06d}", f"g{i // g:05d}", plan, self.version, self.now, context=plan.prompt_tokens)
        if g > 1:
            # Group members answer the same prompt: one shared prefix (versioned: caches
            # flush at every policy update).
            tr.shared_key, tr.shared_tokens = f"{tr.group}@{self.version}", plan.prompt_tokens
        self.trajs[tr.tid] = tr
        self.live += 1
        self.emit(E.TrajectoryDispatched, traj=tr.tid, prompt_tokens=plan.prompt_tokens, group=tr.group, policy_version=self.version)
        if not self.spec.sandbox:
            self._new_request(tr)
            return
        if self.pool_free > 0:
            self.pool_free -= 1
            mode, delay = "prewarm", plan.prewarm_s
            self.at(self.now + self.spec.cold_median_s, self._refill_pool)
        else:
            mode, delay = "cold", plan.cold_start_s
        self.emit(E.SandboxStarted, traj=tr.tid, mode=mode)
        self.at(self.now + delay, self._sandbox_ready, tr)

    def _refill_pool(self) -> None:
        self.pool_free += 1

    def _sandbox_ready(self, tr: Traj) -> None:
        if not tr.alive:
            return
        self.emit(E.SandboxReady, traj=tr.tid)
        self._new_request(tr)

    def _new_request(self, tr: Traj, out_left: int | None = None) -> None:
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
        tr.context += output_tokens
        last = tr.turn >= len(tr.plan.outputs) - 1
        if tr.length_capped or last:
            finish = "length" if tr.length_capped else "stop"
            self.emit(E.DecodeFinished, traj=tr.tid, req=req.rid, output_tokens=output_tokens, finish=finish)
            self.emit(E.RewardStarted, traj=tr.tid)
            self.at(self.now + tr.plan.reward_s, self._reward_finished, tr)
            return
        self.emit(E.DecodeFinished, traj=tr.tid, req=req.rid, output_tokens=output_tokens, finish="tool")
        self.emit(E.ToolStarted, traj=tr.tid, tool="sandbox" if self.spec.sandbox else "tool", calls=1)
        self.at(self.now + tr.plan.tool_s[tr.turn], self._tool_finished, tr)

    def _on_aborted(self, req: Req, gen_total: int, requeue: bool) -> None:
        tr: Traj = req.traj
        if not tr.alive or tr.req is not req:
            return
        req.alive = False
        self.decode_tokens += gen_total
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
        self.traj_times.append(self.now - tr.t_dispatch)
        if self.cfg.mode == "sync":
            self.outstanding -= 1
            if self.outstanding == 0:
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

    def _end(self, tr: Traj) -> None:
        tr.alive = False
        self.live -= 1
        del self.trajs[tr.tid]

    def _maybe_train(self) -> None:
        if not self.trainer_busy and self.admitted_total >= (self.version + 1) * self.cfg.batch_size:
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
                if tr.version < self.version - self.cfg.staleness:
                    self._drop(tr)
        # Weight sync: pause every engine, abort in-flight requests (they re-prefill on
        # the new weights), flush prefix caches. A draining engine's waiting prompts go
        # to the other engines (parked until the resume).
        self.paused = True
        for eng in self.engines:
            if eng.available:
                self.abort_engine(eng, reroute_waiting=eng.draining)
                eng.available = False
        # Every engine is empty now: a switch that was draining needs no more drain, and
        # its switch time overlaps the pause.
        for eng in self.engines:
            if eng.switch is not None and eng.draining:
                self._start_switch(eng)
        self.at(self.now + self.cfg.weight_sync_s, self._resume)

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

    def _tick_progress(self) -> None:
        # Per-step prefill:decode token ratio (paper Fig. 3a).
        pf, dc = self.prefill_tokens - self._step_pf, self.decode_tokens - self._step_dc
        self._step_pf, self._step_dc = self.prefill_tokens, self.decode_tokens
        self.step_pd_ratio.append(round(pf / dc, 4) if dc else None)
        if self.step == 1:
            # The warm-up step ends here: the summary measures what follows it.
            self.warmup_mark = self.counters()
        if self.progress is not None:
            self.progress(self.step, self.now)

    def counters(self) -> dict:
        """Cumulative counters the summary measures over (time, GPU seconds, tokens)."""
        return {
            "t": self.now, "busy": sum(e.busy_s for e in self.engines),
            "wait": sum(e.wait_s for e in self.engines),
            "empty_rank": sum(e.empty_rank_s for e in self.engines),
            "trajs": len(self.traj_times), "dropped": self.dropped,
            "prefill_tokens": self.prefill_tokens, "decode_tokens": self.decode_tokens,
            "cached_tokens": self.cached_tokens, "switches": self.switches,
            "preemptions": self.preemptions,
        }

    def decode_load(self) -> tuple[int, int]:
        """(KV tokens, sequences) of decoding requests now: running on a mixed or decode
        rank, or transferred and waiting for KV space on a decode rank."""
        kv = n = 0
        for eng in self.engines:
            if eng.role == "prefill":
                continue
            for rank in eng.ranks:
                kv += rank.kv_used - rank.inuse_prefill
                n += len(rank.running)
                for req in rank.pending:
                    kv += req.prompt
                    n += 1
        return kv, n

    # --- windows ------------------------------------------------------------------------

    def _window(self) -> None:
        if self.done:
            return
        cfg = self.cfg
        s = self.cur
        s.busy_gpu_s = sum(e.busy_s for e in self.engines)
        s.wait_gpu_s = sum(e.wait_s for e in self.engines)
        s.step = self.step
        s.decode_kv_tokens, s.decode_seqs = self.decode_load()
        for eng in self.engines:
            s.n_switching += eng.switch is not None
            s.n_prefill += eng.role == "prefill"
            s.n_decode += eng.role == "decode"
            s.n_mixed += eng.role == "mixed"
            i = eng.index
            rate = hit = None
            if eng.role != "decode":
                # Computed (uncached) prefill tokens per second over the window, and the
                # prefix-cache hit ratio of the prompts finished in it (EVENTS.md fields).
                rate = round((eng.prefill_tokens_done - self._pf_done_at_window[i]) / cfg.window_s, 3)
                if self._win_prompt[i] > 0:
                    self._last_hit[i] = round(min(1.0, self._win_cached[i] / self._win_prompt[i]), 6)
                # No prefill finished in this window: the last ratio stands (a gauge).
                hit = self._last_hit[i]
            self._pf_done_at_window[i] = eng.prefill_tokens_done
            self._win_prompt[i] = self._win_cached[i] = 0
            self.emit(
                E.EngineStats, engine=eng.name, role=eng.role, running_reqs=eng.running_reqs(),
                queued_reqs=eng.queued_reqs(), kv_used_tokens=eng.kv_used(), kv_capacity_tokens=eng.kv_capacity(),
                prefill_tokens_per_s=rate, cache_hit_rate=hit,
            )
        self.windows.append(s)
        self.cur = WindowSample(self.now)
        obs = Observation(
            t=self.now, window_s=cfg.window_s, events=self.window_events, engines=self.engine_table(),
            profile=self.profile, total_gpus=cfg.total_gpus,
            future=self.peek_future if getattr(self.policy, "wants_future", False) else None,
        )
        self.window_events = []
        for sw in self.policy.on_window(obs):
            self._apply_switch(sw)
        self.at(self.now + cfg.window_s, self._window)

    def engine_table(self) -> list[EngineView]:
        return [
            EngineView(
                engine=e.name, role=e.role, switching=e.switch is not None,
                to_role=e.switch["to"] if e.switch else None, gpus=self.profile.gpus_per_engine,
                running_reqs=e.running_reqs(), queued_reqs=e.queued_reqs(),
                kv_used_tokens=e.kv_used(), kv_capacity_tokens=e.kv_capacity(),
            )
            for e in self.engines
        ]

    def _apply_switch(self, sw) -> None:
        by_name = {e.name: e for e in self.engines}
        eng = by_name.get(sw.engine)
        if eng is None:
            raise ValueError(f"policy {self.policy.name} asked to switch unknown engine {sw.engine!r}")
        if sw.to_role not in ("prefill", "decode"):
            raise ValueError(f"policy {self.policy.name}: to_role must be prefill or decode, not {sw.to_role!r}")
        if sw.mode not in self.profile.switch_modes:
            raise ValueError(f"policy {self.policy.name}: switch mode {sw.mode!r} not in {self.profile.switch_modes}")
        self._cmd += 1
        cmd = f"{self.cfg.run}-cmd{self._cmd:06d}"
        if self.switch_allowed(eng, sw.to_role):
            deadline = self.now + self.drain_deadline_s
            self.emit(E.EngineCommand, cmd=cmd, engine=eng.name, action="switch_role", to_role=sw.to_role, deadline=round(deadline, 6))
        self.request_switch(eng, sw.to_role, sw.mode, cmd)

    def peek_future(self, horizon_s: float) -> FutureDemand:
        """Oracle hook: run a copy of this simulation ``horizon_s`` ahead (no policy
        calls, no events) and measure the true demand of ``[now, now + horizon_s)``."""
        t0 = self.now
        backlog = sum(r.waiting_tokens for e in self.engines for r in e.ranks if e.role != "decode")
        sink, events, policy = self.sink, self.window_events, self.policy
        self.sink, self.window_events = None, []
        try:
            twin = _deep_copy(self)
        finally:
            self.sink, self.window_events, self.policy = sink, events, policy
        twin.forking = True
        twin.progress = None
        twin.cur = WindowSample(t0)
        twin._heap = [x for x in twin._heap if x[2].__name__ != "_window"]
        twin.run_until(lambda: twin._heap[0][0] >= t0 + horizon_s if twin._heap else True)
        return FutureDemand(
            t0, horizon_s, backlog + twin.cur.prefill_demand, twin.cur.decode_admit, twin.cur.prefill_demand
        )

    def fork(self) -> Simulator:
        """A deep copy of this simulation that goes on by itself: same state, same heap
        (windows included, so its policy -- copied with it -- is called as in the
        original), no events (``forking``), no sink, no progress callback. Running the
        fork under the same policy decisions gives what the original would."""
        sink, events, progress = self.sink, self.window_events, getattr(self, "progress", None)
        self.sink, self.window_events, self.progress = None, [], None
        try:
            twin = _deep_copy(self)
        finally:
            self.sink, self.window_events, self.progress = sink, events, progress
        twin.forking = True
        return twin

    def _close_empty_time(self) -> None:
        self.end_time = self.now


def _deep_copy(obj):
    """``copy.deepcopy`` with room to recurse: it recurses once per nesting level of the
    object graph (request -> rank -> engine -> ranks -> queues -> requests ...), and long
    queues (math, async) go past Python's default limit of 1000."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, _FORK_RECURSION_LIMIT))
    try:
        return copy.deepcopy(obj)
    finally:
        sys.setrecursionlimit(limit)


def build_config(**kw) -> SimConfig:
    """Validate and build a :class:`SimConfig` (raises ValueError with a clear reason)."""
    get_workload(kw.get("workload", "coding"))
    get_profile(kw.get("model", "deepseek-v3.2"))
    from .cluster import DP_ROUTING

    if kw.get("dp_routing", "load") not in DP_ROUTING:
        raise ValueError(f"unknown dp routing {kw['dp_routing']!r}; choose one of: {', '.join(DP_ROUTING)}")
    return SimConfig(**kw)
