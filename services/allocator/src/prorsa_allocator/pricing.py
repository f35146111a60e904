"""The 'priced' gain test (the default rule): what one switch costs (its dead time, the
prompts its drain aborts, the prefix cache its flip flushes) and whether moving k engines
pays over the lookahead, measured against the prefill rates each count served
(:mod:`prorsa_allocator.switching` has the candidates, the band and the paper's rule)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from prorsa_schemas.events import DEFAULT_WINDOW_S

from .config import AllocatorConfig
from .engines import EngineView
from .estimate import SwitchCost
from .optimize import Allocation
from .switching import DemandView, Move, Selection, band_move, donor_candidates


@dataclass(frozen=True, slots=True)
class SwitchPrice:
    """What one switch costs (the 'priced' rule).

    ``drain_s`` + ``switch_s`` is the engine's dead time: from the command on, the router
    sends it nothing, so its old role loses it at once and its new role gains it only when
    it is back. ``reprefill_tokens``: full-prompt tokens its drain aborts at the deadline
    (running decode sequences, context plus output so far), re-prefilled at θᴾ.
    ``cache_lost_tokens``: prefix-cache tokens its flip flushes that its trajectories would
    have hit, recomputed (computed tokens, at θᴾ·(1 − hit))."""

    drain_s: float
    switch_s: float
    reprefill_tokens: float = 0.0
    cache_lost_tokens: float = 0.0

    @property
    def dead_s(self) -> float:
        return self.drain_s + self.switch_s

    def prefill_engine_s(self, theta: float, hit: float) -> float:
        """Seconds of one prefill engine the extra work takes (θᴾ full-prompt tokens/s)."""
        return float(_prefill_engine_s(self.reprefill_tokens, self.cache_lost_tokens, theta, hit))


def _prefill_engine_s(reprefill, cache_lost, theta: float, hit: float):
    """Re-prefilled tokens run at θᴾ, lost cache hits recomputed at θᴾ·(1 − hit); scalars or
    arrays."""
    if theta <= 0:
        return reprefill * 0.0
    return reprefill / theta + cache_lost / (theta * max(1.0 - hit, 1e-6))


@dataclass(frozen=True, slots=True)
class SwitchPrices:
    """The prices of switching several engines, one array entry per engine, in order: what
    :class:`SwitchPrice` is for one (a first plan prices hundreds at once)."""

    drain_s: np.ndarray
    switch_s: np.ndarray
    reprefill_tokens: np.ndarray
    cache_lost_tokens: np.ndarray

    @classmethod
    def of(cls, prices: Sequence[SwitchPrice]) -> "SwitchPrices":
        cols = np.array([(x.drain_s, x.switch_s, x.reprefill_tokens, x.cache_lost_tokens) for x in prices],
                        dtype=float).reshape(-1, 4)
        return cls(*(np.ascontiguousarray(c) for c in cols.T))

    def __len__(self) -> int:
        return len(self.drain_s)

    def __getitem__(self, i: int) -> SwitchPrice:
        return SwitchPrice(float(self.drain_s[i]), float(self.switch_s[i]), float(self.reprefill_tokens[i]),
                           float(self.cache_lost_tokens[i]))

    @property
    def dead_s(self) -> np.ndarray:
        return self.drain_s + self.switch_s

    def prefill_engine_s(self, theta: float, hit: float) -> np.ndarray:
        return _prefill_engine_s(self.reprefill_tokens, self.cache_lost_tokens, theta, hit)


def price_switch(
    view: EngineView,
    to_role: str,
    switch_s: float,
    cfg: AllocatorConfig,
    decode_turn_s: float | None = None,
    pause_left_s: float = 0.0,
    window_s: float = DEFAULT_WINDOW_S,
) -> SwitchPrice:
    """The price of switching ``view`` to ``to_role``: :func:`price_switches` of one engine."""
    return price_switches([view], to_role, [switch_s], cfg, decode_turn_s, pause_left_s, window_s)[0]


def price_switches(
    views: Sequence[EngineView],
    to_role: str,
    switch_s: Sequence[float] | np.ndarray,
    cfg: AllocatorConfig,
    decode_turn_s: float | None = None,
    pause_left_s: float = 0.0,
    window_s: float = DEFAULT_WINDOW_S,
) -> SwitchPrices:
    """The price of switching each of ``views`` to ``to_role`` (``switch_s``: each one's
    switch time), computed over arrays (hand-checked in test_pricing.py).

    * In the weight-update pause (``pause_left_s`` > 0: seconds of it left) every engine
      is empty and its cache already flushed: no drain, nothing aborted, no cache lost;
      the switch overlaps the pause, so only what outlasts it is dead time.
    * A busy decode engine drains until its sequences finish or the deadline
      (``drain_deadline_s``), whichever first. With a decode turn of L seconds
      (``decode_turn_s``, Little's law on the forecasts) and sequences at uniformly
      spread ages, the share still running at the deadline D is max(0, 1 − D/L); their KV
      (context and output so far) is re-prefilled. Without L: the drain estimate of the
      paper rule is the turn, so D is the drain and everything running is aborted
      (the KV-full decode engine of docs/simulator.md's drain table reaches the deadline).
    * A busy prefill engine drains its chunked prefills (``drain_prefill_s``) and aborts
      nothing; its flip flushes its prefix cache. The tokens its trajectories would have
      hit on their next turn: its cached-token rate h/(1−h)·r (r: computed tokens/s of
      its last engine.stats, h its hit ratio) over one turn cycle, L + one window (the
      decode turn, then the window's prefill wait and tool call; a proxy: the cycle is not
      measured), at most its KV capacity (a cache cannot hold more).
    """
    n = len(views)
    switch = np.asarray(switch_s, dtype=float).reshape(n)
    zeros = np.zeros(n)
    if pause_left_s > 0:
        return SwitchPrices(zeros, np.maximum(0.0, switch - pause_left_s), zeros, zeros.copy())
    busy = np.fromiter((v.busy for v in views), bool, n)
    decode = busy & np.fromiter((v.role == "decode" for v in views), bool, n)
    other = busy & ~decode  # a busy prefill (or mixed) engine
    drain, reprefill, cached = zeros, zeros.copy(), zeros.copy()
    if decode.any():
        deadline = cfg.drain_deadline_s
        kv_used = np.fromiter((v.kv_used_tokens for v in views), float, n)
        if decode_turn_s is None or decode_turn_s <= 0:
            drain = np.where(decode, deadline, drain)
            reprefill = np.where(decode, kv_used, 0.0)
        else:
            drain = np.where(decode, min(deadline, decode_turn_s), drain)
            reprefill = np.where(decode, max(0.0, 1.0 - deadline / decode_turn_s) * kv_used, 0.0)
    if other.any():
        drain = np.where(other, min(cfg.drain_prefill_s, cfg.drain_deadline_s), drain)
        hit = np.minimum(np.fromiter((v.cache_hit_rate or 0.0 for v in views), float, n), cfg.max_cache_hit_rate)
        rate = np.fromiter((v.prefill_tokens_per_s or 0.0 for v in views), float, n)
        cap = np.fromiter((v.kv_capacity_tokens for v in views), float, n)
        cycle = (decode_turn_s or 0.0) + window_s
        lost = hit / (1.0 - hit) * rate * cycle
        lost = np.where(cap > 0, np.minimum(lost, cap), lost)
        cached = np.where(other, lost, 0.0)
    return SwitchPrices(drain, switch, reprefill, cached)


# The objectives that read the splits through the turn-latency queue model: 'turn_latency'
# prices an unsaturated split by it, 'saturation' holds one (pricing.priced_net).
QUEUE_OBJECTIVES = ("turn_latency", "saturation")


@dataclass(frozen=True, slots=True)
class PricedContext:
    """What the priced gain test needs beyond the demand view."""

    theta: float
    """θᴾ, full-prompt tokens/s of one prefill engine."""
    hit: float = 0.0
    """The prefill pool's prefix-cache hit ratio (recomputed tokens run at θᴾ·(1 − hit))."""
    decode_turn_s: float | None = None
    pause_left_s: float = 0.0
    """Seconds left of the weight-update pause at the decision (0: not in the pause)."""
    served: dict[int, float] = field(default_factory=dict)
    """The full-prompt prefill rate measured at each prefill count (the planner's
    ``served``, counts with enough windows only): a move to a count that served less than
    the current one, by the hysteresis, is vetoed."""
    prefill_backlog: dict[int, float] = field(default_factory=dict)
    """Queued requests per prefill engine at each measured count, over the same windows
    (the planner's ``prefill_backlog``): at IDLE_QUEUE or more the role has no room to
    give, and a count below it is judged by count x θᴾ (``served_capacity_ceiling``)."""
    miss: dict[int, float] = field(default_factory=dict)
    """The prefill pool's prefix-cache miss ratio at each measured count (the planner's
    ``prefill_miss``, over the same windows): the share of each prompt a count's engines
    compute. θᴾ is measured at the count held; another count's engines serve
    θᴾ x miss(held)/miss(count) full-prompt tokens/s each where both are measured (a
    pool whose cache holds the live trajectories' prefixes at one count and not at the
    next computes several times the tokens there)."""
    theta_hit: float = 0.0
    """The hit ratio θᴾ is taken at (``PrefillThroughput.hit``): a count below the one
    held whose miss ratio was never measured is taken to lose it, its engines computing
    every prompt token (θᴾ x (1 − theta_hit) each)."""


def arrivals_later(demand: DemandView, to_role: str) -> float | None:
    """The prefill demand arrivals bring after the current window, in instances (None: not
    known): ``prefill_arrivals_later``, and for a move to decode at least the provisioning
    quantile scaled to the arrivals' share (``prefill_upper`` is a quantile of the whole
    forecasts)."""
    a = demand.prefill_arrivals_later
    if a is not None and to_role == "decode" and demand.prefill_upper is not None:
        a = max(a, demand.prefill_upper * a / max(demand.prefill_later, 1e-12))
    return a


def priced_net(
    p: int, d: int, to_role: str, prices: SwitchPrices | Sequence[SwitchPrice], demand: DemandView,
    cfg: AllocatorConfig, horizon: float, ctx: PricedContext,
) -> tuple[np.ndarray, float]:
    """(f(k) for k = 1..len(prices), f(0)): the bottleneck ratio over ``horizon`` after
    moving the first k engines, priced.

    Over the horizon H, prefill needs W_P = S·aᴾ_now + (H − S)·aᴾ_later engine-seconds and
    decode W_D likewise; the roles offer p·H and d·H. Moving k engines toward a role takes
    them from their old role at once and adds Σ (H − dead_i) to the new one; the work
    their drains abort and the cache their flips lose adds Σ x_i engine-seconds to W_P.
    f = min(capᴾ/W_P, capᴰ/W_D), each capped at ``ratio_cap`` (a role with no demand is at
    the cap). Under the 'saturation' objective a split that keeps up with its work
    (``TurnLatency.saturated`` false) gives f(k) = NaN for every k of a move to prefill: it
    is held; a move to decode from it is judged by turn latency."""
    cap = cfg.ratio_cap
    s = min(demand.horizon_s, horizon)
    later_p = demand.prefill_later
    arrivals = arrivals_later(demand, to_role)
    if cfg.prefill_backlog_once and arrivals is not None:
        # What queues at the window's start is in its forecast (prefill_now) and is served
        # once; after the window only the arrivals go on.
        later_p = arrivals
    elif to_role == "decode" and demand.prefill_upper is not None:
        # The donor role provisioned to a quantile of the demand it has shown (provision_quantile).
        later_p = max(later_p, demand.prefill_upper)
    w_p = s * demand.prefill_now + (horizon - s) * later_p
    w_d = s * demand.decode_now + (horizon - s) * demand.decode_later

    # The latency-balance share of the decode work (decode.py) is priced by the step
    # speed-up it buys: a pool of n engines (cap_d / H on average) against the n* the
    # term asks for (W_D / H) serves its turns at t(n*)/t(n) of their balanced pace, with
    # t(n) = t₀ + c/n (c/min(n, spread) with ``decode_spread``); the KV share stays a
    # capacity ratio.
    # Where the decode sequences are fewer than the pool's ranks can take one each
    # (``decode_spread``), engines past the spread hold KV but shorten no step: the work
    # beyond the KV share is served by at most spread x H engine-seconds.
    step = demand.decode_step
    w_kv = None
    if demand.decode_kv_now is not None and demand.decode_kv_later is not None:
        w_kv = s * demand.decode_kv_now + (horizon - s) * demand.decode_kv_later
    t0, load = step if step is not None else (0.0, 0.0)
    spread = None if demand.decode_spread is None else max(demand.decode_spread, 1e-9)
    # (whether the decode demand has a share beyond KV, before the closed-loop coupling
    # scales the work)
    beyond_kv = w_kv is not None and w_d > w_kv * (1.0 + 1e-9)

    def ratios(cap_p: np.ndarray, cap_d: np.ndarray, work_p: np.ndarray, work_d: np.ndarray):
        rp = np.where(work_p > 0, np.minimum(cap_p / np.maximum(work_p, 1e-12), cap), cap)
        rd = np.where(work_d > 0, np.minimum(cap_d / np.maximum(work_d, 1e-12), cap), cap)
        if beyond_kv and spread is not None:
            r_kv = cap if w_kv <= 0 else np.minimum(cap_d / w_kv, cap)
            r_step = np.where(work_d > 0, np.minimum(np.minimum(cap_d, spread * horizon) / np.maximum(work_d, 1e-12),
                                                     cap), cap)
            rd = np.minimum(r_kv, r_step)
        if w_kv is not None and step is not None and load > 0 and t0 > 0:
            latency = work_d > w_kv * (1.0 + 1e-9)
            if latency.any():
                n = np.maximum(cap_d / horizon, 1e-9)
                n_star = np.maximum(work_d / horizon, 1e-9)
                if spread is not None:
                    # past one sequence a rank, another engine shortens no step
                    n, n_star = np.minimum(n, spread), np.minimum(n_star, spread)
                pace = (t0 + load / n_star) / (t0 + load / n)
                r_kv = cap if w_kv <= 0 else np.minimum(cap_d / w_kv, cap)
                rd = np.where(latency, np.minimum(r_kv, np.minimum(pace, cap)), rd)
        return rp, rd

    phi = cfg.closed_loop_coupling
    # The shares each role serves of its work at the current split (the coupling's base).
    rp0, rd0 = (min(float(r[0]), 1.0) for r in ratios(np.array([p * horizon], float), np.array([d * horizon], float),
                                                     np.array([w_p]), np.array([w_d], float)))

    def f(cap_p: np.ndarray, cap_d: np.ndarray, work_p: np.ndarray) -> np.ndarray:
        work_d = np.full(cap_d.shape, w_d, dtype=float)
        rp, rd = ratios(cap_p, cap_d, work_p, work_d)
        if phi > 0:
            # The closed loop: each role's work is fed by what the other role finishes. A
            # role short of capacity (ratio < 1) passes on only that share of its work, so
            # a move that lets it serve more raises the other role's work by as much: the
            # share of it the loop feeds (a backlog queued now, or KV resident, is not fed).
            g_p = np.minimum(rp, 1.0) / max(rp0, 1e-9)
            g_d = np.minimum(rd, 1.0) / max(rd0, 1e-9)
            fed = demand.decode_fed_share
            fed_p = demand.prefill_fed_share
            rp, rd = ratios(cap_p, cap_d, work_p * (1.0 + phi * fed_p * (g_d - 1.0)),
                            work_d * (1.0 + phi * fed * (g_p - 1.0)))
        return np.minimum(rp, rd)

    if not isinstance(prices, SwitchPrices):
        prices = SwitchPrices.of(prices)
    k = np.arange(1, len(prices) + 1, dtype=float)
    live = np.cumsum(np.maximum(0.0, horizon - np.minimum(prices.dead_s, horizon)))
    extra = np.cumsum(prices.prefill_engine_s(ctx.theta, ctx.hit))
    if to_role == "prefill":
        cap_p, cap_d = p * horizon + live, (d - k) * horizon
    else:
        cap_p, cap_d = (p - k) * horizon, d * horizon + live
    # A smaller count never measured is taken to lose the cache (cache_scale), except in the
    # weight-update pause under the turn-latency objective: there every cache is flushed, the
    # move is free and the next pause can take it back for free once the count is measured.
    explore = cfg.objective in QUEUE_OBJECTIVES and ctx.pause_left_s > 0
    scale = cache_scale(p, p + (1 if to_role == "prefill" else -1) * k.astype(int), ctx.miss,
                        1.0 if explore else 1.0 - ctx.theta_hit)
    cap_p = cap_p * scale
    if cfg.objective in QUEUE_OBJECTIVES and step is not None and t0 > 0 and (ctx.decode_turn_s or 0.0) > 0:
        # The backlog queued at the window's start is cleared once; the rest of the work
        # arrives over the horizon (``prefill_fed_share``).
        backlog = (1.0 - demand.prefill_fed_share) * s * demand.prefill_now
        arriving = w_p - backlog
        if arrivals is not None:
            arriving = s * demand.prefill_now + (horizon - s) * arrivals - backlog
        lat = TurnLatency(demand.horizon_s, horizon, t0, load, spread, d, float(ctx.decode_turn_s),
                          w_d if w_kv is None else w_kv, demand.decode_fed_share)
        here = (np.array([p * horizon], float), np.array([d * horizon], float), np.array([arriving]), backlog)
        # A saturated split (a role short of its work) is judged by the capacity ratio: in a
        # closed loop whose queues grow, what the roles serve sets the pace, not a sum of waits.
        keeps_up = not lat.saturated(*here)[0]
        if keeps_up and cfg.objective == "saturation" and to_role == "prefill":
            # The split keeps up with its work: a move to prefill only shortens waits in a
            # queue that clears anyway, which the step's slowest trajectory, mostly decode,
            # does not feel. Held (NaN, select_priced says why). A move to decode speeds up
            # every decode step, the slowest trajectory's too: judged by turn latency below,
            # where a move that leaves prefill short of its work scores 0.
            return np.full(len(k), np.nan), 1.0 / float(lat(*here)[0])
        if keeps_up:
            # Two phases: the moved engines' dead time (the donor role has lost them, the
            # other has not gained them yet), then the new split.
            dead = np.maximum.accumulate(np.minimum(prices.dead_s, horizon))
            if to_role == "prefill":
                n_p1, n_d1, n_p2, n_d2 = np.full(len(k), float(p)), d - k, (p + k) * scale, d - k
            else:
                n_p1 = n_p2 = (p - k) * scale
                n_d1, n_d2 = np.full(len(k), float(d)), d + k
            work = np.full(len(k), arriving)
            f_new = np.where(lat.saturated(n_p2 * horizon, n_d2 * horizon, work, backlog + extra), 0.0,
                             1.0 / lat.phased(n_p1, n_d1, n_p2, n_d2, dead, work, backlog + extra))
            return f_new, 1.0 / float(lat(*here)[0])
    f_old = float(f(np.array([p * horizon], float), np.array([d * horizon], float), np.array([w_p]))[0])
    return f(cap_p, cap_d, w_p + extra), f_old


def _queue_area(b: np.ndarray, r: np.ndarray, t: np.ndarray) -> np.ndarray:
    """The integral over [0, t] of max(0, b − r·τ): a fluid queue of ``b`` drained at ``r``
    (negative: growing)."""
    t = np.broadcast_to(np.asarray(t, dtype=float), b.shape)
    cleared = (r > 0) & (b < r * t)
    return np.where(cleared, b * b / (2.0 * np.maximum(r, 1e-12)), b * t - r * t * t / 2.0)


@dataclass(frozen=True, slots=True)
class TurnLatency:
    """The seconds a turn spends in the model at a split (the 'turn_latency' objective):
    its prefill wait plus its decode, averaged over a horizon of H seconds. Called with a
    split's capacities in engine-seconds over H (n = capacity / H engines), it prices the
    split held; :meth:`phased` prices a move, its dead time (the donor role has lost the
    engines, the other has not gained them) then the new split. :meth:`saturated` says
    where :func:`priced_net` judges by the capacity ratio instead.

    * Prefill, a fluid queue: the backlog B (engine-seconds of work queued at the window's
      start, with what a switch's drain aborts and its flip's lost cache) and arrivals of
      aᴾ engines of work (the rest of the forecast over H). The queue q(t) = max(0, B +
      (aᴾ − nᴾ)·t) is cleared at T = B/(nᴾ − aᴾ) when the pool outruns the arrivals; a
      request waits q(t)/nᴾ, averaged over H, plus half a window's arrivals, aᴾ·S/(2·nᴾ)
      (the latency-balance term's L_P, decode.py).
    * Decode: a turn's o output tokens at the decode step t(n) = t₀ + c/min(n, spread)
      (``decode_step``, ``decode_spread``); o is what the turn measured now takes, L_D at
      the current n_now: L_D(n) = L_D · t(n)/t(n_now). Where the KV demand exceeds the
      pool (aᴷⱽ > nᴰ) admissions wait for KV in proportion: x aᴷⱽ/nᴰ. The KV the
      forecast's admissions bring (``decode_fed_share`` of it) comes only as fast as the
      prefill pool serves its work, min(1, nᴾ/(its work per second)): the closed loop of
      the capacity objective's coupling; the KV resident is there either way.

    What a turn does outside the model (tools, sandbox, reward) is the same at every split
    and is left out, so a gain over the hysteresis is a gain in model time."""

    window_s: float
    horizon_s: float
    t0: float
    load: float
    spread: float | None
    d_now: float
    turn_s: float
    kv_work: float
    """Decode KV demand in engine-seconds over the horizon."""
    kv_fed_share: float = 1.0
    """The share of ``kv_work`` the forecast's admissions bring (the rest is resident)."""

    def step(self, n: np.ndarray) -> np.ndarray:
        n = np.maximum(n, 1e-9)
        if self.spread is not None:
            n = np.minimum(n, self.spread)
        return self.t0 + self.load / n

    def prefill_wait(self, n_p: np.ndarray, arriving: np.ndarray, backlog) -> np.ndarray:
        """Mean wait over the horizon: ``arriving`` and ``backlog`` in engine-seconds."""
        n_p = np.maximum(n_p, 1e-9)
        return self.phased_wait(n_p, n_p, np.zeros(n_p.shape), arriving, backlog)

    def phased_wait(self, n_p1: np.ndarray, n_p2: np.ndarray, dead: np.ndarray, arriving: np.ndarray,
                    backlog) -> np.ndarray:
        """Mean wait over the horizon with ``n_p1`` prefill engines for ``dead`` seconds, then
        ``n_p2``: the fluid queue's area in each phase over its engines, plus half a window's
        arrivals."""
        h = self.horizon_s
        n1, n2 = np.maximum(n_p1, 1e-9), np.maximum(n_p2, 1e-9)
        a = np.maximum(arriving, 0.0) / h
        b0 = np.maximum(np.broadcast_to(np.asarray(backlog, dtype=float), n1.shape), 0.0)
        t1, t2 = dead, h - dead
        b1 = np.maximum(0.0, b0 - (n1 - a) * t1)
        area = _queue_area(b0, n1 - a, t1) / n1 + _queue_area(b1, n2 - a, t2) / n2
        base = a * self.window_s / 2.0 * (t1 / n1 + t2 / n2)
        return (base + area) / h

    def decode_kv(self, cap_p: np.ndarray, arriving: np.ndarray, backlog) -> np.ndarray:
        """The decode KV demand in engines, its admitted share scaled by what prefill serves."""
        h = self.horizon_s
        n_p = np.maximum(cap_p / h, 1e-9)
        work = (np.maximum(arriving, 0.0) + np.maximum(backlog, 0.0)) / h
        served = np.minimum(1.0, n_p / np.maximum(work, 1e-12))
        return self.kv_work / h * (1.0 - self.kv_fed_share + self.kv_fed_share * served)

    def saturated(self, cap_p: np.ndarray, cap_d: np.ndarray, arriving: np.ndarray, backlog) -> np.ndarray:
        """Whether a role is short of its work over the horizon: the backlog and the arrivals at
        least what the prefill pool serves in it (the queue is not cleared), or the decode KV
        demand, admissions as forecast, at least the decode pool."""
        h = self.horizon_s
        b = np.broadcast_to(np.maximum(np.asarray(backlog, dtype=float), 0.0), np.shape(cap_p))
        return (np.maximum(arriving, 0.0) + b >= cap_p) | (self.kv_work >= cap_d)

    def decode_s(self, n_d: np.ndarray, kv: np.ndarray) -> np.ndarray:
        """A turn's decode on ``n_d`` engines with a KV demand of ``kv`` engines."""
        n_d = np.maximum(n_d, 1e-9)
        decode = self.turn_s * self.step(n_d) / self.step(np.array([float(self.d_now)]))[0]
        return decode * np.maximum(1.0, kv / n_d)

    def __call__(self, cap_p: np.ndarray, cap_d: np.ndarray, arriving: np.ndarray, backlog) -> np.ndarray:
        h = self.horizon_s
        kv = self.decode_kv(cap_p, arriving, backlog)
        return self.prefill_wait(cap_p / h, arriving, backlog) + self.decode_s(cap_d / h, kv)

    def phased(self, n_p1: np.ndarray, n_d1: np.ndarray, n_p2: np.ndarray, n_d2: np.ndarray, dead: np.ndarray,
               arriving: np.ndarray, backlog) -> np.ndarray:
        """The turn latency averaged over the horizon of a move: ``n_p1``, ``n_d1`` engines for
        its ``dead`` seconds, then ``n_p2``, ``n_d2`` (engines, not engine-seconds)."""
        h = self.horizon_s
        kv = self.decode_kv(n_p2 * h, arriving, backlog)
        decode = (dead * self.decode_s(n_d1, kv) + (h - dead) * self.decode_s(n_d2, kv)) / h
        return self.phased_wait(n_p1, n_p2, dead, arriving, backlog) + decode


def cache_scale(p: int, counts: np.ndarray, miss: dict[int, float], below: float = 1.0) -> np.ndarray:
    """The full-prompt capacity of a prefill engine at each of ``counts`` over one at the
    held count ``p``: miss(p)/miss(count) where both are measured; ``below`` at a count
    under ``p`` whose miss was never measured (1 − the hit θᴾ is taken at: every prompt
    token computed); else 1 (θᴾ taken as given).

    Why a smaller count is taken to lose the cache until measured: the hit the pool shows
    at the count held need not carry to a smaller one. Under a cache-aware gateway the
    pool's cache falls off a cliff once its engines' KV no longer holds the live
    trajectories' prefixes (MiMo-V2.5-Pro coding/2: 42% of each prompt computed at 5:3,
    95% at 4:4); read at 5:3's hit, 4:4 and 3:5 looked ample and the allocator moved two
    engines to decode in the warm-up step, then back as the queues grew, 13 moves in three
    steps (1,907.4 s; with this rule 2 moves, 1,528.7 s; 5:3 held 1,569.2 s). Where the
    cache does carry, a move down is made on a need that holds with every prompt token
    computed (a decode shortage); the count is then measured and priced by its own miss
    ratio."""
    here = miss.get(p)
    out = np.ones(len(counts))
    for i, c in enumerate(counts):
        m = miss.get(int(c))
        if here and here > 0 and m and m > 0:
            out[i] = here / m
        elif c < p and not m:
            out[i] = below
    return out


def select_priced(
    alloc: Allocation,
    engines: list[EngineView],
    demand: DemandView,
    now: float,
    cfg: AllocatorConfig,
    cost: SwitchCost,
    ctx: PricedContext,
    last_direction: str | None = None,
    last_switch_ts: float = -math.inf,
    imbalance_s: float = math.inf,
    initial: bool = False,
    settle_since: float = -math.inf,
) -> Selection:
    """The 'priced' rule: the same band, candidates, caps and dwell as
    :func:`select_switches`; the gain test prices each move (:func:`price_switches`) and
    judges it over the horizon (``horizon_s``, at least ``horizon_switch_multiple`` x the
    slowest move's dead time). Candidates are taken least loaded first; the test takes the
    best prefix of them (the moves are priced one by one and summed).

    ``settle_since``: when the last plan's moves toward ``last_direction`` were commanded
    (-inf once one of them failed): a further move that way waits ``settle_s`` after it,
    except in the weight-update pause."""
    move = band_move(engines, alloc, cfg, now, last_direction, last_switch_ts, initial)
    if isinstance(move, Selection):
        return move
    n, p, d, in_flight, to_role, donor, wanted, donors, fraction = move
    if last_direction == to_role and now - settle_since < cfg.settle_s and ctx.pause_left_s <= 0:
        return Selection(reason=f"the last move to {to_role} has not settled "
                                f"({now - settle_since:.0f}s < {cfg.settle_s:.0f}s)")
    # A full decode pool is decode's shortage shown, whatever prefill does (``decode_full``).
    full = to_role == "decode" and decode_full(engines)
    pressed = role_pressed(engines, to_role)
    room = None
    if cfg.served_evidence_first and not ctx.served and not (full or role_pressed(engines, to_role, short=True)):
        # No count's served rate yet (the run's first windows): the forecast's gain rests on
        # priors whose error nothing has measured; the split held is what they are measured at.
        # Only a shortage the move relieves stands in for that evidence (``short``), or, for a
        # move to decode judged by a queue objective (a synchronous run's), a prefill pool with
        # room to spare (``prefill_room``). Not under the capacity ratio (an asynchronous
        # run's): there every weight update brings back a re-prefill burst that the windows
        # between bursts do not show, so an idle pool between them is no evidence of room.
        room = 0
        if to_role == "decode" and cfg.objective in QUEUE_OBJECTIVES:
            room = prefill_room(engines, demand, p, cfg.served_evidence_idle_share)
        if room < 1:
            return Selection(reason=f"no prefill count has a served rate yet: no move to {to_role} "
                                    f"on the forecast alone")
    if ctx.pause_left_s > 0:
        # In the pause a switch costs no drain, no aborts and no cache: the per-plan cap
        # (a guard against one wrong forecast's drains) does not apply; the gain test does.
        fraction = 1.0
    # Only the candidates taken are priced (a plan of 1,024 engines stays within its budget).
    candidates = donor_candidates(donors, n, in_flight, wanted if room is None else min(wanted, room), fraction,
                                  to_role, now, cfg)
    if isinstance(candidates, Selection):
        return candidates
    prices = price_switches(candidates, to_role, cost.for_engines(candidates), cfg, ctx.decode_turn_s,
                            ctx.pause_left_s, demand.horizon_s)
    dead = prices.dead_s
    horizon = max(cfg.horizon_s, cfg.horizon_switch_multiple * float(dead.max()))
    # The Moves are built for the chosen prefix only (a first plan may price hundreds).
    restarts = prices.switch_s[~np.fromiter(("in_place" in v.switch_modes for v in candidates), bool,
                                            len(candidates))]
    restart_s = float(restarts.max()) if restarts.size else None
    if restart_s is not None:
        if imbalance_s < restart_s:
            return Selection(reason=f"imbalance toward {to_role} has lasted {imbalance_s:.0f}s < restart {restart_s:.0f}s")
        horizon = max(horizon, cfg.restart_lookahead_s)
    elif ctx.pause_left_s <= 0 and cfg.persist_dead_multiple > 0:
        wait = cfg.persist_dead_multiple * float(dead[0])  # the first (cheapest) move's dead time
        if imbalance_s < wait:
            return Selection(reason=f"imbalance toward {to_role} has lasted {imbalance_s:.0f}s < "
                                    f"{wait:.0f}s ({cfg.persist_dead_multiple:g} x a switch's dead time)")
    f_new, f_old = priced_net(p, d, to_role, prices, demand, cfg, horizon, ctx)
    if np.isnan(f_new).all():
        return Selection(reason=f"no role is saturated over {horizon:.0f}s (the prefill queue clears, the decode "
                                f"KV fits): no move to prefill (objective 'saturation')")
    # Measured evidence beats the forecast: in a closed loop the demand a window shows
    # depends on the split that served it (a choked decode side lowers the prefill
    # demand, a backlogged prefill side raises it), so a count that was held and served
    # fewer prompts per second than the current one is not gone back to.
    # The veto stands down when the engines show the move's need now: the role it feeds
    # saturated while the donor role idles (``role_pressed``). A rate measured at the other
    # count is an average over phases; in a step that alternates a prefill-bound and a
    # decode-bound phase (MiMo coding/8) it vetoes the move each phase needs.
    # A count never held below the current one can serve at most count x θᴾ, its prefill
    # engines' capacity, when the current count's prefill engines queue (θᴾ is measured on
    # backlogged engines; a role that idles may run faster than the samples it gave). That
    # ceiling is prefill's capacity alone: with the decode pool full the rollout goes at
    # the rate decode frees KV, not at the prefill rate served, so it does not hold then.
    # A rate measured at the other count does: the closed loop's answer there, decode's
    # side included.
    here = None if cfg.served_veto_yields_to_state and pressed else ctx.served.get(p)
    vetoed = 0
    if here is not None:
        sign = 1 if to_role == "prefill" else -1
        ceiling = (to_role == "decode" and cfg.served_capacity_ceiling and not full
                   and ctx.prefill_backlog.get(p, 0.0) >= IDLE_QUEUE)
        blocked = False
        for i in range(len(f_new)):
            count = p + sign * (i + 1)
            there = ctx.served.get(count)
            if there is None and ceiling:
                there = count * ctx.theta
            # The served rate is unimodal in the prefill count (prefill-bound below its
            # peak, decode-bound above it): past a count that served less, none serves more.
            blocked = blocked or (there is not None and there < here * (1.0 + cfg.hysteresis))
            if blocked:
                f_new[i] = -np.inf
                vetoed += 1
    if vetoed == len(f_new):
        return Selection(reason=f"every move to {to_role} goes to a prefill count that served less than {p} "
                                f"({here:.0f} tokens/s)" + (", or can serve less (count x θᴾ)" if ceiling else ""))
    best = int(np.argmax(f_new))
    gain = float(f_new[best]) / max(f_old, 1e-9) - 1.0
    where = " in the pause" if ctx.pause_left_s > 0 else ""
    if gain > cfg.hysteresis:
        drains, switches = prices.drain_s.tolist(), prices.switch_s.tolist()
        moves = [Move(v, to_role, drains[i], switches[i]) for i, v in enumerate(candidates[: best + 1])]
        return Selection(
            moves,
            f"{best + 1} engine(s) to {to_role}{where}: priced bottleneck gain {gain:+.1%} over {horizon:.0f}s",
            float(f_new[best] - f_old) * horizon,
        )
    return Selection(reason=f"priced gain {gain:+.3f} of switching to {to_role}{where} is below the hysteresis {cfg.hysteresis}")


# Saturated and idle, as a load-based autoscaler reads them (the simulator's ``reactive``
# policy uses the same thresholds). CHOICES: more than 4 queued requests per engine is a
# backlog of several prefill passes; a decode pool over 85% KV is where SGLang starts to
# retract; under 0.5 queued per engine and under 50% KV a role has room to give.
PRESSED_QUEUE = 4.0
IDLE_QUEUE = 0.5
PRESSED_KV = 0.85
IDLE_KV = 0.5


def decode_full(engines: list[EngineView]) -> bool:
    """Whether the decode pool's KV is full (more than PRESSED_KV of it used; engines
    mid-switch left out). Prefilled requests then wait for decode KV: the rollout goes at
    the rate decode frees KV, whatever the prefill engines could serve, so prefill's
    capacity alone (the ceiling ``count x θᴾ`` of a count never held) is no reason to keep
    prefill engines, and the full pool is evidence of decode's shortage
    (``served_evidence_first``)."""
    dec = [v for v in engines if v.role == "decode" and v.switching_to is None]
    cap = sum(v.kv_capacity_tokens for v in dec)
    return cap > 0 and sum(v.kv_used_tokens for v in dec) > PRESSED_KV * cap


def prefill_room(engines: list[EngineView], demand: DemandView, p: int, share: float) -> int:
    """How many prefill engines may move to decode before any count has a served rate: the
    most k such that the forecast's prefill demand (the larger of now, later and the
    provisioning quantile, in engines at θᴾ) is at most ``share`` of the p - k engines left,
    while no prefill engine queues (``IDLE_QUEUE``). 0: none. Before a served rate θᴾ is
    the prior and the cache hit 0 (every prompt token computed), so the demand is an upper
    reading; ``share`` leaves the forecast room to be off by 1/share."""
    if share <= 0:
        return 0
    pre = [v for v in engines if v.role == "prefill" and v.switching_to is None]
    if not pre or sum(v.queued_reqs for v in pre) / len(pre) >= IDLE_QUEUE:
        return 0
    need = max(demand.prefill_now, demand.prefill_later, demand.prefill_upper or 0.0)
    return max(0, p - max(1, math.ceil(need / share - 1e-9)))


def role_pressed(engines: list[EngineView], to_role: str, short: bool = False) -> bool:
    """Whether ``to_role`` is saturated now and the other role idle, from the engines'
    last stats: prefill queue per engine > PRESSED_QUEUE with decode KV < IDLE_KV and no
    decode queue (to prefill); decode KV > PRESSED_KV or decode queue > PRESSED_QUEUE with
    no prefill queue (to decode). Engines mid-switch are left out.

    ``short``: a decode queue counts only with the decode pool's KV at least IDLE_KV used.
    With most of its KV free, a decode engine admits what waits for it at its next
    iteration: the queue is a burst of transfers landing at once, which another decode
    engine does not relieve (DeepSeek-V3.2 general/8, seed 2: 5 requests queued on the one
    decode engine at 41% KV, 80 s into the run)."""
    pre = [v for v in engines if v.role == "prefill" and v.switching_to is None]
    dec = [v for v in engines if v.role == "decode" and v.switching_to is None]
    if not pre or not dec:
        return False
    p_queue = sum(v.queued_reqs for v in pre) / len(pre)
    d_queue = sum(v.queued_reqs for v in dec) / len(dec)
    d_kv = sum(v.kv_used_tokens for v in dec) / max(1, sum(v.kv_capacity_tokens for v in dec))
    if to_role == "prefill":
        return p_queue > PRESSED_QUEUE and d_kv < IDLE_KV and d_queue < IDLE_QUEUE
    queue = d_queue > PRESSED_QUEUE and (not short or d_kv >= IDLE_KV)
    return (d_kv > PRESSED_KV or queue) and p_queue < IDLE_QUEUE
