"""The allocator's pure core: events in, plans and commands out. No I/O, no wall clock.

``Allocator.handle(event)`` folds an engine event, a command echo or a forecast into the
state and returns the events to publish (an ``allocation.plan`` and ``engine.command``s for
a fresh forecast; retried commands when a deadline passes). Event time is the largest
``ts`` seen. The service, the simulator and the tests all drive this one class.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from pydantic import TypeAdapter

from prorsa_schemas import (
    AllocationPlan,
    EngineCommand,
    EngineStats,
    EngineSwitched,
    Event,
    ForecastWindow,
)
from prorsa_schemas.fold import Mutators

from .config import AllocatorConfig
from .decode import DecodeStep, DecodeStepFit, decode_load, decode_room, decode_step_demand, spread_capped
from .engines import EngineTable
from .estimate import PrefillThroughput, SwitchCost, cluster_shape
from .optimize import Allocation, Capacity, Demand, solve
from .records import Counters, Decision, SwitchDurations
from .served import CacheRegime, after_pause, measure_served, pool_hit
from .pricing import QUEUE_OBJECTIVES, PricedContext, select_priced
from .switching import DemandView, Selection, prefill_band, select_switches

log = logging.getLogger("prorsa.allocator")


def _base_id(event_id: str) -> str:
    """A short, deterministic id stem derived from the forecast's id (for de-duplication)."""
    return event_id if len(event_id) <= 96 else hashlib.sha1(event_id.encode()).hexdigest()


_COMMANDS = TypeAdapter(list[EngineCommand])


def prefill_fed_share(fc: ForecastWindow) -> float:
    """The share of the window's prefill forecast that arrivals bring: its ``components``'
    sampler + sandbox + tool terms over those plus the ready-queue and in-flight backlog
    (queued at the window's start). 1 when the forecast has no components (the coupling
    then treats all of it as fed by the loop, as before any backlog is known)."""
    c = fc.components
    if c is None or c.ready is None or c.inflight is None:
        return 1.0
    fed = (c.sampler or 0.0) + (c.sandbox or 0.0) + (c.tool or 0.0)
    total = fed + c.ready + c.inflight
    return fed / total if total > 0 else 1.0


def resolve_objective(config: AllocatorConfig, run_modes: dict[str, str]) -> AllocatorConfig:
    """The configuration in force: an 'auto' objective is 'saturation' while every run seen
    is synchronous, 'capacity' otherwise (no run seen, or any asynchronous one).

    A synchronous step ends with its slowest trajectory, whose model time is mostly decode:
    once both roles keep up, a move that shortens the mean turn does not reach the step's
    end, and the capacity ratio (capped at ``ratio_cap``) sees no gain there either, so a
    split that keeps up is held ('saturation'). An asynchronous run's over-dispatch keeps
    the roles loaded, and there the capacity each role serves sets the pace
    (docs/allocator.md, "Which objective")."""
    if config.objective != "auto":
        return config
    sync = bool(run_modes) and all(mode == "sync" for mode in run_modes.values())
    return config.model_copy(update={"objective": "saturation" if sync else "capacity"})


class Allocator:
    """Forecast-driven PD allocation and role-switch commands (paper §4.2 and beyond)."""

    def __init__(self, config: AllocatorConfig | None = None):
        # ``requested``: the configuration as given; ``config``: the one in force, with an
        # 'auto' objective resolved by the runs' modes (``on_run_started``).
        self.requested = config or AllocatorConfig()
        # The mode (``sync`` / ``async``) of each run whose run.started has been folded in.
        self.run_modes: dict[str, str] = {}
        self.config = resolve_objective(self.requested, self.run_modes)
        self.table = EngineTable(failure_cooldown_s=self.config.failure_cooldown_s)
        self.theta = PrefillThroughput.from_config(self.config)
        self.switch_cost = SwitchCost.from_config(self.config)
        c = self.config
        priors = (c.decode_step_fixed_s, c.decode_step_per_seq_s, c.decode_step_per_kv_token_s)
        self.decode_step = DecodeStepFit(prior=DecodeStep(*priors) if None not in priors else None)
        self.now = 0.0
        self.last_forecast_t = -math.inf
        self.last_direction: str | None = None
        self.last_switch_ts = -math.inf
        # 'priced' rule: when the last plan's moves were commanded, until one of them fails
        # (settle_s: no second move the same way before the first has landed and the loop
        # has answered it).
        self.settle_since = -math.inf
        self.counters = Counters()
        self.switch_durations = SwitchDurations()
        self.last_decision: Decision | None = None
        # Smoothed demand rates for the windows after the current one.
        self._prefill_rate: float | None = None  # Ŵᴾ / S, tokens/s
        # The part of it arrivals bring (prefill_fed_share), smoothed alike: the turn-latency
        # objective's arrival rate after the current window (a backlog is cleared once).
        self._arrival_rate: float | None = None
        self._decode_kv: float | None = None  # Kᴰ + K̂ᴰ, tokens
        # The forecast prefill rates of the last provision_memory_s: (window start, Ŵᴾ / S).
        self._prefill_rates: deque[tuple[float, float]] = deque()
        # Seconds one decode turn takes (Little's law on the forecasts: S·Kᴰ/Âᴰ), smoothed:
        # how long a busy decode engine needs to drain.
        self.decode_turn_s: float | None = None
        # Since when (forecast time) the engines have been off target in one direction.
        self._imbalance_dir: str | None = None
        self._imbalance_since = 0.0
        # Weight updates ('priced' rule): the last policy.updated's event time.
        self.last_update_ts: float | None = None
        # The steady demand in instances (aᴾ, aᴰ, the KV share of aᴰ) and the decode pool's
        # step load c: an EMA (forecast_alpha) over the windows outside a step's opening,
        # planned for in the next pause.
        self._steady: tuple[float, float, float, float] | None = None
        # The largest aᴾ + aᴰ of a window that could enter it since the last update: a window
        # under steady_floor of it (a sync step's tail) does not.
        self._step_peak = 0.0
        # 'priced' rule: the full-prompt prefill rate the cluster served at each prefill
        # count, measured over whole windows with no switch under way: (EMA, windows).
        self.served: dict[int, tuple[float, int, float]] = {}  # count -> (EMA, windows, last t)
        self.prefill_backlog: dict[int, float] = {}  # count -> queued per prefill engine, same windows
        self.prefill_miss: dict[int, float] = {}  # count -> the pool's cache miss ratio, same windows
        self._first_t: float | None = None  # the first forecast's window start (the run's ramp)
        # 'priced' rule: the last forecast acted on, and the update whose pause has had its
        # own decision (``on_pause``: at most one per update).
        self._last_fc: ForecastWindow | None = None
        self._pause_decided: float | None = None
        # 'priced' rule: whether the prefill pool's cache is back since the last update.
        self.cache = CacheRegime(c.opening_cache_ratio, c.opening_cache_max_s, c.served_alpha, c.max_cache_hit_rate)

    # -- the one entry point -----------------------------------------------------------------
    def handle(self, event: Event, act: bool = True) -> list[Event]:
        """Fold one event in; return the events to publish.

        With ``act=False`` (replaying the stream after a restart) the state is rebuilt but
        nothing is decided: those forecasts were acted on, or are too old now.
        """
        self.now = max(self.now, event.ts)
        handler = _mutate.get(event.type)
        out: list[Event] = handler(self, event, act) if handler is not None else []
        if act:
            out.extend(self.expire(self.now))
        return out

    def advance(self, ts: float) -> list[Event]:
        """Event time reached ``ts`` with no event (the tracker's watermark): expire the
        deadlines that passed; return the retries to publish. Never moves time backwards."""
        if not math.isfinite(ts):
            raise ValueError(f"watermark time must be finite, got {ts!r}")
        self.now = max(self.now, ts)
        return self.expire(self.now)

    def on_update(self, ts: float) -> None:
        """A weight update at event time ``ts``: the pause starts, then the step's opening
        (``_opening``). With ``served_ramp_s`` None, the served rates measured so far are
        dropped at the first update; by default only the ramp's windows were left
        unmeasured (:func:`~prorsa_allocator.served.measure_served`): the first step
        starts from an empty cluster, its rates ramp up with the demand and compare with
        nothing later (DeepSeek coding/2: 7:1 measured at 138k tokens/s in the first 40 s
        vetoed 7:1, the best static ratio, for the whole run)."""
        if self.last_update_ts is None and self.config.served_ramp_s is None:
            self.served.clear()
            self.prefill_backlog.clear()
            self.prefill_miss.clear()
        self.last_update_ts = ts
        self._step_peak = 0.0
        self.cache.on_update(ts)

    def on_run_started(self, run: str, mode: str) -> None:
        """A run's ``run.started``: its mode decides an 'auto' objective (:func:`resolve_objective`)."""
        self.run_modes[run] = mode
        before = self.config.objective
        self.config = resolve_objective(self.requested, self.run_modes)
        if self.config.objective != before:
            log.info("run %r is %s: moves are judged by %s (objective 'auto')", run, mode,
                     "saturation (a split that keeps up is held)" if self.config.objective == "saturation"
                     else "the capacity ratio")

    def pause_left(self, engines: list | None = None) -> float:
        """Seconds left of the weight-update pause at event time (0: not in one). With the
        engines' views, a pause is one only while none of them runs a request: a framework
        that publishes policy.updated once its engines have resumed (the contract's "new
        weights reached the rollout engines") leaves no free switch to make, and a move
        priced as free there would drain the new batch's work, uncapped (the window is then
        in the step's opening). Requests waiting in a paused engine's queue do not end the
        pause: nothing runs them until it resumes, and a switch re-queues them elsewhere
        at once (the simulator's asynchronous pause keeps the waiting prompts of the
        engines it does not drain)."""
        if self.last_update_ts is None:
            return 0.0
        left = max(0.0, self.last_update_ts + self.config.weight_sync_s - self.now)
        if left > 0 and engines is not None and any(v.running_reqs > 0 for v in engines):
            return 0.0
        return left

    def _observe(self, event: Event) -> None:
        """An engine event or a command echo into the engine table."""
        note = self.table.apply(event)
        if note:
            self.counters.notes += 1
            log.info("ignored: %s", note)

    # -- forecasts -> plan + commands -------------------------------------------------------------
    def stale_reason(self, fc: ForecastWindow) -> str:
        """Why a forecast must not be acted on ('' when it is fresh)."""
        if self.config.run is not None and fc.run != self.config.run:
            return f"forecast of run {fc.run!r}, not {self.config.run!r}"
        if fc.t <= self.last_forecast_t:
            return f"window t={fc.t} is not newer than the last one acted on (t={self.last_forecast_t})"
        age = self.now - fc.t
        if age > self.config.stale_after_windows * fc.horizon:
            return f"window t={fc.t} is {age:.1f}s old at event time {self.now} (stale)"
        return ""

    def _smooth(self, fc: ForecastWindow) -> tuple[float, float]:
        a = self.config.forecast_alpha
        rate, kv = fc.prefill_tokens / fc.horizon, fc.decode_kv_now + fc.decode_kv_tokens
        self._prefill_rate = rate if self._prefill_rate is None else (1 - a) * self._prefill_rate + a * rate
        arrivals = rate * prefill_fed_share(fc)
        self._arrival_rate = (arrivals if self._arrival_rate is None
                              else (1 - a) * self._arrival_rate + a * arrivals)
        if self.config.provision_quantile is not None:
            self._prefill_rates.append((fc.t, rate))
            while self._prefill_rates and self._prefill_rates[0][0] <= fc.t - self.config.provision_memory_s:
                self._prefill_rates.popleft()
        self._decode_kv = kv if self._decode_kv is None else (1 - a) * self._decode_kv + a * kv
        if fc.decode_admit_tokens > 0 and fc.decode_kv_now > 0:
            turn = fc.horizon * fc.decode_kv_now / fc.decode_admit_tokens
            self.decode_turn_s = turn if self.decode_turn_s is None else (1 - a) * self.decode_turn_s + a * turn
        return self._prefill_rate, self._decode_kv

    def _prefill_upper(self, theta: float) -> float | None:
        """The ``provision_quantile`` quantile of the forecast prefill rates of the last
        ``provision_memory_s``, in prefill instances (None when not configured)."""
        q = self.config.provision_quantile
        if q is None or not self._prefill_rates or theta <= 0:
            return None
        rates = np.fromiter((r for _, r in self._prefill_rates), float, len(self._prefill_rates))
        return float(np.quantile(rates, q)) / theta

    def on_forecast(self, fc: ForecastWindow, act: bool = True) -> Decision | None:
        """Plan for one forecast window; None when it is stale or replayed."""
        self.counters.forecasts += 1
        reason = self.stale_reason(fc)
        if reason:
            self.counters.stale += 1
            log.info("forecast %s ignored: %s", fc.id, reason)
            return None
        self.last_forecast_t = fc.t
        if self._first_t is None:
            self._first_t = fc.t
        prefill_rate, decode_kv = self._smooth(fc)
        if not act:
            # Replaying after a restart: the served rates are measured as they were live
            # (the engine table is the one of that moment), so that the priced rule does not
            # wait for its evidence again.
            if self.config.rule == "priced":
                engines = cluster_shape(self.table.engines.values(), self.config.gpus_prefill,
                                        self.config.gpus_decode).engines
                if len(engines) >= 2:
                    hit = pool_hit(engines)
                    self._observe_cache(fc, hit, self.pause_left(engines))
                    self._measure_served(engines, fc, hit)
            return None
        self._last_fc = fc
        return self._decide(fc, _base_id(fc.id), max(self.now, fc.ts), prefill_rate, decode_kv)

    def on_pause(self) -> Decision | None:
        """'priced' rule: the decision of a weight-update pause, made as soon as the pause
        is seen with every engine empty (at the update, or at the first engine.stats in the
        pause that shows them empty), from the last forecast's window and the steady demand
        of the step before; at most one per update. A forecast window that starts in the
        pause decides as well (``on_forecast``). None when there is nothing to decide: not
        the priced rule, no update or no steady demand yet, the engines not empty, the
        pause over, or the last forecast stale."""
        cfg = self.config
        fc, update = self._last_fc, self.last_update_ts
        if cfg.rule != "priced" or fc is None or update is None or self._steady is None or self._pause_decided == update:
            return None
        if self.now - fc.t > cfg.stale_after_windows * fc.horizon:
            return None
        engines = cluster_shape(self.table.engines.values(), cfg.gpus_prefill, cfg.gpus_decode).engines
        if self.pause_left(engines) <= 0:
            return None
        self._pause_decided = update
        assert self._prefill_rate is not None and self._decode_kv is not None  # set with _last_fc
        return self._decide(fc, _base_id(f"pause-{fc.run}-{update:.6f}"), self.now, self._prefill_rate,
                            self._decode_kv, in_pause=True)

    def _decide(self, fc: ForecastWindow, base: str, ts: float, prefill_rate: float, decode_kv: float,
                in_pause: bool = False) -> Decision:
        """Plan for forecast ``fc`` at event time ``ts``: the plan and the commands, ids from
        ``base``. ``in_pause``: the pause's own decision (``on_pause``), which measures
        nothing and leaves the imbalance clock as the windows set it."""
        decision = Decision(t=fc.t, at_update=in_pause)
        self.last_decision = decision
        cfg = self.config
        shape = cluster_shape(self.table.engines.values(), cfg.gpus_prefill, cfg.gpus_decode)
        engines, kv_cap = shape.engines, shape.kv_capacity
        if len(engines) < 2 or kv_cap <= 0:
            decision.skipped = f"{len(engines)} PD engine(s) registered, KV capacity {kv_cap:.0f}: nothing to plan"
            return decision
        m_p, m_d = shape.gpus_prefill, shape.gpus_decode
        kv_total = fc.decode_kv_now + fc.decode_kv_tokens
        try:
            cap = Capacity(self.theta.value, kv_cap, m_p, m_d, max(shape.gpu_budget, m_p + m_d))
            a_p = fc.prefill_tokens / (fc.horizon * self.theta.value)
            room = decode_room(cfg, a_p, cap)
            load = decode_load(engines)
            # (before the spread cap: Decision.spread_binds compares the two)
            extra_raw = decode_step_demand(cfg, self.decode_step.value, load, kv_total, a_p, fc.decode_kv_now,
                                           fc.decode_admit_tokens, room, capped=False)
            extra = spread_capped(cfg, load, extra_raw)
            demand = Demand(fc.prefill_tokens, fc.horizon, kv_total, extra)
            pause_left = self.pause_left(engines) if cfg.rule == "priced" else 0.0
            hit = pool_hit(engines)
            if cfg.rule == "priced":
                self._observe_cache(fc, hit, pause_left)
            opening = self._opening(fc.t, pause_left)
            if pause_left > 0 and self._steady is not None:
                # The pause's own window sees only the requests the update aborted: the step
                # is planned for the steady demand of the last one.
                s_p, s_d = self._steady[:2]
                demand = Demand(s_p * fc.horizon * cap.prefill_tokens_per_s, fc.horizon, s_d * kv_cap)
        except ValueError as exc:  # e.g. a forecast of non-finite numbers that slipped through
            decision.skipped = f"cannot plan: {exc}"
            return decision
        alloc = solve(demand, cap, cfg.max_delta)
        decision.allocation = alloc
        step = self.decode_step.value
        step_load = 0.0 if step is None else step.load(load[0], load[1])
        if cfg.rule == "priced" and pause_left <= 0 and not opening:
            a = cfg.forecast_alpha
            # (aᴾ, aᴰ, its KV share, the decode pool's step load c)
            now_pd = (alloc.prefill_demand, alloc.decode_demand, kv_total / kv_cap, step_load)
            total = alloc.prefill_demand + alloc.decode_demand
            self._step_peak = max(self._step_peak, total)
            if total >= cfg.steady_floor * self._step_peak:
                self._steady = now_pd if self._steady is None else tuple(  # type: ignore[assignment]
                    (1 - a) * old + a * new for old, new in zip(self._steady, now_pd))
        a_p_later = prefill_rate / cap.prefill_tokens_per_s
        # The latency term is priced by the step it buys where a decode turn outlasts the
        # horizon (Little's law, S·Kᴰ/Âᴰ): no turn then cycles through prefill within it, so
        # the per-turn balance the term strikes is not traded there (pricing.priced_net).
        by_step = cfg.rule == "priced" and cfg.decode_latency_by_step and step is not None
        turn_now = fc.horizon * fc.decode_kv_now / fc.decode_admit_tokens if fc.decode_admit_tokens > 0 else math.inf
        if pause_left > 0 and self._steady is not None:
            dv = DemandView(alloc.prefill_demand, alloc.decode_demand, alloc.prefill_demand, alloc.decode_demand,
                            fc.horizon)
            if by_step and (self.decode_turn_s or 0.0) > cfg.horizon_s:
                # the steady step's KV share and load: the engines are empty now
                s_kv, s_load = self._steady[2], self._steady[3]
                dv = replace(dv, decode_kv_now=s_kv, decode_kv_later=s_kv, decode_step=(step.fixed_s, s_load))
            elif cfg.objective in QUEUE_OBJECTIVES and step is not None:
                # the steady step's KV share and load (the engines are empty now)
                dv = replace(dv, decode_kv_now=self._steady[2], decode_kv_later=self._steady[2],
                             decode_step=(step.fixed_s, self._steady[3]))
        else:
            later_raw = decode_step_demand(cfg, self.decode_step.value, load, decode_kv, a_p_later, fc.decode_kv_now,
                                           fc.decode_admit_tokens, decode_room(cfg, a_p_later, cap), capped=False)
            dv = DemandView(
                prefill_now=alloc.prefill_demand,
                decode_now=alloc.decode_demand,
                prefill_later=prefill_rate / cap.prefill_tokens_per_s,
                decode_later=max(decode_kv / kv_cap, spread_capped(cfg, load, later_raw)),
                horizon_s=fc.horizon,
                decode_fed_share=fc.decode_kv_tokens / kv_total if kv_total > 0 else 1.0,
                prefill_fed_share=prefill_fed_share(fc),
                prefill_upper=self._prefill_upper(cap.prefill_tokens_per_s),
                prefill_arrivals_later=(None if self._arrival_rate is None
                                        else self._arrival_rate / cap.prefill_tokens_per_s),
            )
            if by_step and turn_now > cfg.horizon_s:
                dv = replace(dv, decode_kv_now=kv_total / kv_cap, decode_kv_later=decode_kv / kv_cap,
                             decode_step=(step.fixed_s, step_load))
            if cfg.objective in QUEUE_OBJECTIVES and step is not None and cfg.rule == "priced":
                # the turn-latency objective prices every move by the decode step it buys
                dv = replace(dv, decode_kv_now=kv_total / kv_cap, decode_kv_later=decode_kv / kv_cap,
                             decode_step=(step.fixed_s, step_load))
            if cfg.decode_spread_cap:
                # (in the pause the engines are empty: the steady step is priced uncapped)
                beyond = extra_raw > kv_total / kv_cap * (1 + 1e-9) or later_raw > decode_kv / kv_cap * (1 + 1e-9)
                decision.spread_binds = beyond and load.spread() < max(len(engines), extra_raw, later_raw)
                dv = replace(dv, decode_kv_now=kv_total / kv_cap, decode_kv_later=decode_kv / kv_cap,
                             decode_spread=load.spread())
        imbalance = self._imbalance_age(alloc, len(engines), shape.n_prefill, fc.t, record=not in_pause)
        if cfg.rule == "priced":
            if not in_pause:
                self._measure_served(engines, fc, hit)
            served = {p: r for p, (r, n, t) in self.served.items()
                      if n >= cfg.served_min_samples and fc.t - t <= cfg.served_memory_s}
            backlog = {p: q for p, q in self.prefill_backlog.items() if p in served}
            miss = {p: m for p, m in self.prefill_miss.items() if p in served}
            ctx = PricedContext(self.theta.value, hit, self.decode_turn_s, pause_left, served, backlog, miss,
                                theta_hit=self.theta.hit)
            if opening:
                since = fc.t - self.last_update_ts
                sel = Selection(reason=f"holding through the step's opening ({since:.0f}s of {cfg.opening_hold_s:.0f}s "
                                       f"after the weight update)" if since <= cfg.opening_hold_s else
                                       f"holding through the step's opening ({since:.0f}s after the weight update): "
                                       f"the prefill pool's cache is not back (miss ratio {self.cache.miss(hit):.2f}, "
                                       f"{self.cache.miss_ref or 0.0:.2f} before)")
            else:
                sel = select_priced(alloc, engines, dv, self.now, cfg, self.switch_cost, ctx, self.last_direction,
                                    self.last_switch_ts, imbalance, initial=self.counters.commands == 0,
                                    settle_since=self.settle_since)
        else:
            sel = select_switches(
                alloc, engines, dv, self.now, cfg, self.switch_cost, self.last_direction, self.last_switch_ts,
                imbalance, initial=self.counters.commands == 0, decode_drain_s=self.decode_turn_s,
            )
        decision.selection = sel
        plan = AllocationPlan(
            id=f"{base}:plan",
            ts=ts,
            run=fc.run,
            t=fc.t,
            n_prefill=alloc.n_prefill,
            n_decode=alloc.n_decode,
            delta=round(min(alloc.delta, cfg.max_delta), 6),
            feasible=alloc.feasible,
            # As dicts: the plan validates them in its own (pydantic-core) call, not one model each.
            switches=[{"engine": m.engine.engine, "to_role": m.to_role} for m in sel.moves] or None,  # type: ignore[misc]
        )
        decision.events.append(plan)
        self.counters.plans += 1
        if not cfg.actuate:
            # Advisory: the plan says what would be commanded; nothing is, so the engine
            # table, the dwell and the settling clock stay as the engines are.
            self.counters.advised += len(sel.moves)
            return decision
        # Validated in one call (pydantic-core over the list): a first plan may hold hundreds.
        min_deadline, slack, run = cfg.min_deadline_s, cfg.deadline_slack, fc.run
        cmds = _COMMANDS.validate_python([
            {"id": f"{base}:cmd{i}", "ts": ts, "run": run, "cmd": f"{base}:sw{i}", "engine": move.engine.engine,
             "action": "switch_role", "to_role": move.to_role,
             "deadline": ts + max(min_deadline, slack * (move.drain_s + move.switch_s))}
            for i, move in enumerate(sel.moves)
        ]) if sel.moves else []
        in_flight = self.table.commands
        for move, cmd in zip(sel.moves, cmds):
            self.table.apply(cmd)
            tracked = in_flight.get(cmd.cmd)
            if tracked is not None:
                tracked.expected_drain_s = move.drain_s
        decision.events.extend(cmds)
        self.counters.commands += len(cmds)
        if sel.moves:
            self.last_direction, self.last_switch_ts = sel.moves[0].to_role, ts
            self.settle_since = ts
        return decision

    def _measure_served(self, engines: list, fc: ForecastWindow, hit: float) -> None:
        """Window ``fc``'s served rate (:func:`measure_served`), and its pool hit ``hit`` in
        the cache regime's reference when it was measured."""
        if measure_served(self.served, engines, fc, self.config, self.last_update_ts, self._first_t,
                          self.prefill_backlog, cache_cold=self.cache.cold, miss=self.prefill_miss):
            self.cache.measured(hit)

    def _observe_cache(self, fc: ForecastWindow, hit: float, pause_left: float) -> None:
        """The pool's hit ``hit`` at window ``fc`` into the cache regime, once the engines'
        reports cover a whole window past the update's pause (:func:`after_pause`): until
        then they still show the hit of the prefills before the update."""
        if pause_left <= 0 and after_pause(fc, self.config, self.last_update_ts):
            self.cache.observe(fc.t, hit)

    def _opening(self, t: float, pause_left: float) -> bool:
        """'priced' rule: whether window ``t`` is in a step's opening, after the weight-update
        pause and within ``opening_hold_s`` of the update, or until the prefill pool's cache
        is back (``opening_cache_ratio``, :class:`~prorsa_allocator.served.CacheRegime`),
        when no switch is made. The
        re-prefill burst after an update (the carried-over trajectories and the new batch's
        prompts) lasts less than a switch and the switch back: the forecast sees it as
        prefill demand of two to three times the steady one, and on every setting measured
        a split moved for it served the rest of the step worse than the one it left."""
        cfg = self.config
        if cfg.rule != "priced" or self.last_update_ts is None or pause_left > 0:
            return False
        return t - self.last_update_ts <= cfg.opening_hold_s or self.cache.cold

    def _imbalance_age(self, alloc: Allocation, n: int, p: int, t: float, record: bool = True) -> float:
        """How long the ``n`` engines, ``p`` of them counted as prefill, have been outside
        the target band in the same direction (0 when inside it or the direction just
        changed); restarts wait for it. ``record``: whether the clock takes this reading."""
        lo, hi = prefill_band(alloc, n)
        direction = "prefill" if p < lo else "decode" if p > hi else None
        if direction != self._imbalance_dir:
            if not record:
                return 0.0
            self._imbalance_dir, self._imbalance_since = direction, t
        return 0.0 if direction is None else t - self._imbalance_since

    # -- command deadlines ------------------------------------------------------------------------
    def expire(self, now: float) -> list[Event]:
        """Retry or abandon the commands whose deadline (plus grace) has passed."""
        out: list[Event] = []
        cfg = self.config
        for cmd in list(self.table.commands.values()):
            # The agent drains until the deadline, aborts what is left, then switches: its
            # engine.switched can come a switch time after the deadline. Waited for, so that
            # a slow drain is not re-sent (and, twice over, abandoned) while it completes.
            if now <= cmd.deadline + cfg.ack_grace_s:
                continue  # the common case, checked first: this runs on every event
            view = self.table.engines.get(cmd.engine)
            switch_s = self.switch_cost.for_engine(view) if view is not None else 0.0
            if now <= cmd.deadline + switch_s + cfg.ack_grace_s:
                continue
            if cmd.attempts >= cfg.max_attempts:
                self.table.abandon(cmd.cmd, now)
                self.counters.abandoned += 1
                log.warning("command %s to %s abandoned after %d attempts", cmd.cmd, cmd.engine, cmd.attempts)
                continue
            # Re-send the SAME cmd (the agent is idempotent by cmd: if it is still working on
            # it, nothing changes; if it never saw it, it starts now) with a fresh deadline.
            budget_s = max(cfg.min_deadline_s, cmd.deadline - cmd.issued_ts)
            retry = EngineCommand(
                id=f"{cmd.cmd}:r{cmd.attempts}",
                ts=now,
                run=cmd.run or "prorsa",
                cmd=cmd.cmd,
                engine=cmd.engine,
                action="switch_role",
                to_role=cmd.to_role,  # type: ignore[arg-type]
                deadline=now + budget_s,
            )
            self.table.apply(retry)
            self.counters.retries += 1
            out.append(retry)
        return out


# How each event type is folded into the allocator: ``handler(allocator, event, act)``
# returns the events to publish.
_mutate: Mutators[Callable[[Allocator, Event, bool], list[Event]]] = Mutators()


def _published(decision: Decision | None) -> list[Event]:
    """The events a decision publishes (none without one)."""
    return list(decision.events) if decision is not None else []


@_mutate.on("forecast.window")
def _forecast(alloc: Allocator, ev: ForecastWindow, act: bool) -> list[Event]:
    return _published(alloc.on_forecast(ev, act))


@_mutate.on("policy.updated")
def _policy_updated(alloc: Allocator, ev: Event, act: bool) -> list[Event]:
    run = alloc.config.run
    if run is not None and ev.run != run:
        log.info("policy.updated of run %r ignored: the allocator acts for run %r", ev.run, run)
        return []
    alloc.on_update(ev.ts)
    return _published(alloc.on_pause() if act else None)


@_mutate.on("run.started")
def _run_started(alloc: Allocator, ev: Event, act: bool) -> list[Event]:
    run = alloc.config.run
    if run is not None and ev.run != run:
        return []
    alloc.on_run_started(ev.run, ev.mode)  # type: ignore[attr-defined]
    return []


@_mutate.on("engine.registered", "engine.switching", "engine.deregistered", "engine.command")
def _engine(alloc: Allocator, ev: Event, act: bool) -> list[Event]:
    alloc._observe(ev)
    return []


@_mutate.on("engine.stats")
def _stats(alloc: Allocator, ev: EngineStats, act: bool) -> list[Event]:
    alloc._observe(ev)
    alloc.theta.observe(ev)
    alloc.decode_step.observe(ev.role, ev.running_reqs, ev.kv_used_tokens, ev.decode_tokens_per_s)
    # A pause not decided at the update (its engines still showed requests) is decided
    # at the first stats that show them empty.
    return _published(alloc.on_pause() if act and alloc.pause_left() > 0 else None)


@_mutate.on("engine.switched")
def _switched(alloc: Allocator, ev: EngineSwitched, act: bool) -> list[Event]:
    alloc._observe(ev)
    alloc.counters.switched += 1
    alloc.switch_durations.observe(ev.mode, ev.seconds)
    for mode, seconds in alloc.table.take_switch_times():
        alloc.switch_cost.observe(mode, seconds)
    return []


@_mutate.on("engine.switch_failed")
def _switch_failed(alloc: Allocator, ev: Event, act: bool) -> list[Event]:
    alloc._observe(ev)
    alloc.counters.failed += 1
    alloc.settle_since = -math.inf  # the move did not land: nothing to wait for
    return []
