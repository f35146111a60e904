"""The simulator: a rollout (:mod:`.trajectories`: the sampler, trajectories, policy
updates) on a cluster (:mod:`.cluster`, :mod:`.switching`), observed and steered window by
window by a policy, and the event stream.

``Simulator(config, policy).run()`` returns a :class:`~prorsa_sim.summary.Result`; the
events (EVENTS.md v1, ``ts`` in simulated seconds from 0) go to ``config``'s sink.
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass

from prorsa_emulated.costmodel import ModelProfile, get_profile
from prorsa_schemas import events as E

from .policy import EngineView, FutureDemand, Observation, Policy
from .simconfig import SimConfig
from .trajectories import Traj, Trajectories
from .workloads import WorkloadSpec, get_workload

_FORK_RECURSION_LIMIT = 100_000


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


class Simulator(Trajectories):
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
        super().__init__(prof, policy.initial_roles(prof, n), dp_routing=config.dp_routing,
                         router_policy=config.router_policy)
        self.pause_keeps = config.pause_mode in ("in_place", "retract")
        self.pause_retracts = config.pause_mode == "retract"
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
        self.traj_phases: list[tuple] = []
        """Per finished trajectory, beside ``traj_times``: seconds in each of
        :data:`~prorsa_sim.trajectories.PHASES`."""
        self.step_tails: list[tuple] = []
        """Sync, per step: (the phases of the trajectory that ended it, the largest floor
        of its trajectories, ``Trajectories._floor``)."""
        self._step_fixed_max = 0.0
        self.min_decode_step_s = self.profile.decode_step_time(1, 0)
        """The fastest decode step of this model's engines (one sequence, no KV: the
        weights read and the EP all-to-all)."""
        self.dropped = 0
        self.prefill_tokens = 0
        self.decode_tokens = 0
        self.cached_tokens = 0
        self.windows: list[WindowSample] = []
        self.cur = WindowSample(0.0)
        self._cmd = 0
        self.requests: list[list] = []
        """Every switch the policy asked for, ``[t, engine, to_role, mode]`` in the order
        asked: what :class:`~prorsa_sim.policies.schedule.RecordedPolicy` replays."""
        self.forking = False
        # False in the oracle's look-ahead copy (peek_future): it runs with no policy calls.
        self.asks_policy = True
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
                # As the engine agent does: the summed gen_throughput gauge of a non-prefill engine.
                decode_tokens_per_s=round(eng.gen_throughput, 3) if eng.role != "prefill" else None,
            )
        self.windows.append(s)
        self.cur = WindowSample(self.now)
        obs = Observation(
            t=self.now, window_s=cfg.window_s, events=self.window_events, engines=self.engine_table(),
            profile=self.profile, total_gpus=cfg.total_gpus,
            future=self.peek_future if getattr(self.policy, "wants_future", False) else None,
        )
        self.window_events = []
        self._asked(self.policy.on_window(obs))
        self.at(self.now + cfg.window_s, self._window)

    def _asked(self, switches) -> None:
        """Record and apply the switches a policy asked for now."""
        for sw in switches:
            self.requests.append([self.now, sw.engine, sw.to_role, sw.mode])
            self._apply_switch(sw)

    def _paused_for_update(self) -> None:
        """A policy with ``on_update`` is asked at a weight update too, once every engine
        is paused (and empty, unless the pause keeps what they hold), as the allocator
        service decides at ``policy.updated``: the events so far in this window (the same
        list its next window hands on) and the engine table of this moment."""
        hook = getattr(self.policy, "on_update", None)
        if hook is None or self.done or not self.asks_policy:
            return
        obs = Observation(
            t=self.now, window_s=self.cfg.window_s, events=self.window_events, engines=self.engine_table(),
            profile=self.profile, total_gpus=self.cfg.total_gpus,
        )
        self._asked(hook(obs))

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
        twin.asks_policy = False
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
