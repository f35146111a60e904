"""Which engines switch, and whether switching pays (what §4.2 leaves to its appendix).

The optimiser gives the smallest counts (nᴾ, nᴰ) that reach the best headroom. With N PD
engines, any prefill count p in the band [nᴾ, N − nᴰ] meets that target, so engines are
moved only when p leaves the band, and only as many as the gain test accepts:

* candidates: engines of the donor role with no switch in flight, past their minimum dwell
  and failure cooldown, least loaded first (fewest requests, then least KV in use);
* at least one serving engine stays in each role; at most ``max_switch_fraction`` of the
  engines are in flight at once;
* no reversal of the last switch's direction within ``min_dwell_s`` (a forecast oscillating
  around a threshold cannot bounce engines back and forth);
* the gain test: over the lookahead H (the current window at the forecast, the windows after
  it at a smoothed forecast; at least ``restart_lookahead_s`` when a move is a restart), moving k engines changes the bottleneck capacity-to-demand
  ratio f = min(nᴾ/aᴾ, nᴰ/aᴰ) (each capped). During the switch cost c (drain + switch) the
  moving engines serve nobody. net(k) = c·(f(mid) − f(old)) + (H − c)·(f(new) − f(old));
  the best k is taken only if net(k)/(H·f(old)), the relative gain, exceeds the hysteresis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from prorsa_schemas.events import DEFAULT_WINDOW_S

from .config import AllocatorConfig
from .engines import EngineView
from .estimate import SwitchCost
from .optimize import Allocation


@dataclass(frozen=True, slots=True)
class DemandView:
    """Demand in instances for the gain test: now (this window) and later (smoothed)."""

    prefill_now: float
    decode_now: float
    prefill_later: float
    decode_later: float
    horizon_s: float


@dataclass(frozen=True, slots=True)
class Move:
    engine: EngineView
    to_role: str
    drain_s: float
    switch_s: float


@dataclass
class Selection:
    """The switches chosen (possibly none) and why."""

    moves: list[Move] = field(default_factory=list)
    reason: str = ""
    net_gain: float = 0.0


def _ratio(n: np.ndarray, a: float, cap: float) -> np.ndarray:
    return np.full(n.shape, cap) if a <= 0 else np.minimum(n / a, cap)


def _bottleneck(p: np.ndarray, d: np.ndarray, dv: DemandView, cfg: AllocatorConfig, horizon: float) -> np.ndarray:
    """Time-weighted bottleneck ratio over the lookahead ``horizon``, for arrays of counts."""
    cap = cfg.ratio_cap
    now = np.minimum(_ratio(p, dv.prefill_now, cap), _ratio(d, dv.decode_now, cap))
    later = np.minimum(_ratio(p, dv.prefill_later, cap), _ratio(d, dv.decode_later, cap))
    return (dv.horizon_s * now + (horizon - dv.horizon_s) * later) / horizon


def drain_estimate(view: EngineView, cfg: AllocatorConfig, decode_drain_s: float | None = None) -> float:
    """Seconds until an engine is idle: zero when idle, else its role's drain estimate.

    ``decode_drain_s``: the measured time one decode turn takes (the planner's Little's-law
    estimate). A decode engine drains when the sequences it holds finish, which takes
    seconds in an agentic turn and minutes in a long reasoning generation; the last of
    them finishes well after the mean, so the configured ``drain_decode_s`` stays the
    floor."""
    if not view.busy:
        return 0.0
    if view.role == "decode":
        return cfg.drain_decode_s if decode_drain_s is None else max(cfg.drain_decode_s, decode_drain_s)
    return cfg.drain_prefill_s


def movable(view: EngineView, now: float, cfg: AllocatorConfig) -> bool:
    """No switch in flight, past its minimum dwell in this role if it switched into it (the
    role it registered with was nobody's decision, so leaving it at once is no flap), not
    cooling down."""
    return (
        view.command is None
        and view.switching_to is None
        and (not view.switched or now - view.since_ts >= cfg.min_dwell_s)
        and now >= view.cooldown_until
    )


def prefill_band(alloc: Allocation, n_engines: int) -> tuple[int, int]:
    """[lo, hi]: the prefill engine counts that meet the target (spare engines stay put)."""
    lo, hi = alloc.n_prefill, n_engines - alloc.n_decode
    if lo > hi:  # instance sizes differ from engine sizes: split the engines by the ratio
        lo = hi = round(n_engines * alloc.n_prefill / (alloc.n_prefill + alloc.n_decode))
    return max(1, lo), min(n_engines - 1, hi)


def _band_move(engines, alloc, cfg, now, last_direction, last_switch_ts, initial):
    """What both rules share: the prefill count against the target band, the direction and
    size of the move, the dwell guard, the movable donors and the per-plan cap fraction.
    Returns a :class:`Selection` when nothing is to move, else the move's parts."""
    n = len(engines)
    if n < 2:
        return Selection(reason="fewer than two PD engines")
    p = in_flight = 0
    for v in engines:
        p += v.committed_role == "prefill"
        in_flight += v.switching_to is not None
    d = n - p
    lo, hi = prefill_band(alloc, n)
    if lo <= p <= hi:
        return Selection(reason=f"prefill count {p} within target band [{lo}, {hi}]")
    to_role, donor, wanted = ("prefill", "decode", lo - p) if p < lo else ("decode", "prefill", p - hi)
    if last_direction is not None and last_direction != to_role and now - last_switch_ts < cfg.min_dwell_s:
        return Selection(reason=f"would reverse the last switch (to {last_direction}) within the dwell time")
    donors = [v for v in engines if v.role == donor and v.switching_to is None]
    fraction = max(cfg.max_switch_fraction, cfg.initial_switch_fraction) if initial else cfg.max_switch_fraction
    return n, p, d, in_flight, to_role, donor, wanted, donors, fraction


def _candidates(donors, n, in_flight, wanted, fraction, to_role, now, cfg):
    """The donors to move, least loaded first (an idle engine costs only its switch; fewer
    requests and less KV mean less drain, fewer aborts and less cache to lose), at most
    ``wanted``, one engine left in the role, within the per-plan cap ``fraction`` of the
    engines in flight at once. Returns them, or a :class:`Selection` when none can move.
    Sorting all movable donors beats a heap selection once k is a sizeable share of them
    (the first plan may move hundreds), and is never slower than ~0.2 ms at 1,024."""
    limit = max(1, math.ceil(fraction * n)) - in_flight
    k_max = min(wanted, len(donors) - 1, limit)  # len(donors) - 1: one engine stays in the role
    candidates = sorted((v for v in donors if movable(v, now, cfg)), key=EngineView.load_key)[: max(k_max, 0)]
    if not candidates:
        return Selection(reason=f"{wanted} engine(s) should become {to_role} but none can move now")
    return candidates


def select_switches(
    alloc: Allocation,
    engines: list[EngineView],
    demand: DemandView,
    now: float,
    cfg: AllocatorConfig,
    cost: SwitchCost,
    last_direction: str | None = None,
    last_switch_ts: float = -math.inf,
    imbalance_s: float = math.inf,
    initial: bool = False,
    decode_drain_s: float | None = None,
) -> Selection:
    """Choose the engines to switch toward ``alloc`` (see the module docstring).

    ``initial``: no switch has been commanded yet, so the engines sit in the roles they
    registered with; the per-plan cap is then ``initial_switch_fraction`` (see the config).
    """
    move = _band_move(engines, alloc, cfg, now, last_direction, last_switch_ts, initial)
    if isinstance(move, Selection):
        return move
    n, p, d, in_flight, to_role, donor, wanted, donors, fraction = move
    candidates = _candidates(donors, n, in_flight, wanted, fraction, to_role, now, cfg)
    if isinstance(candidates, Selection):
        return candidates
    k_max = len(candidates)
    horizon = cfg.lookahead_windows * demand.horizon_s
    moves = [Move(v, to_role, drain_estimate(v, cfg, decode_drain_s), cost.for_engine(v)) for v in candidates]
    restart_s = max((m.switch_s for m in moves if "in_place" not in m.engine.switch_modes), default=None)
    if restart_s is not None:
        # Ski rental: a restart (minutes) is bought only once the imbalance has already
        # lasted as long as the restart takes, so a transient one (a short step's phase)
        # never pays minutes of lost engines; a persistent one costs at most twice the
        # ideal. Then it is judged over a longer horizon (see the config).
        if imbalance_s < restart_s:
            return Selection(reason=f"imbalance toward {to_role} has lasted {imbalance_s:.0f}s < restart {restart_s:.0f}s")
        horizon = max(horizon, cfg.restart_lookahead_s)
    # The moves run in parallel: the slowest of the first k sets the cost of moving k.
    c = np.minimum(
        np.maximum.accumulate(np.array([cfg.drain_weight * m.drain_s + m.switch_s for m in moves])), horizon
    )
    k = np.arange(1, k_max + 1, dtype=float)
    step = 1.0 if to_role == "prefill" else -1.0
    f_old = float(_bottleneck(np.array([p], float), np.array([d], float), demand, cfg, horizon)[0])
    f_new = _bottleneck(p + step * k, d - step * k, demand, cfg, horizon)
    # While switching, the moving engines serve in neither role.
    f_mid = _bottleneck(p - (step < 0) * k, d - (step > 0) * k, demand, cfg, horizon)
    net = c * (f_mid - f_old) + (horizon - c) * (f_new - f_old)
    best = int(np.argmax(net))
    # Relative gain: +5% of bottleneck throughput matters as much at 40% of demand as at 90%.
    gain = float(net[best]) / (horizon * max(f_old, 1e-9))
    if net[best] > 0 and gain > cfg.hysteresis:
        return Selection(
            moves[: best + 1],
            f"{best + 1} engine(s) to {to_role}: bottleneck gain {gain:+.1%} over {horizon:.0f}s net of cost",
            float(net[best]),
        )
    return Selection(reason=f"gain {gain:.3f} of switching to {to_role} is below the hysteresis {cfg.hysteresis}")


# -- the 'priced' rule ---------------------------------------------------------------------------


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
        if theta <= 0:
            return 0.0
        return self.reprefill_tokens / theta + self.cache_lost_tokens / (theta * max(1.0 - hit, 1e-6))


def price_switch(
    view: EngineView,
    to_role: str,
    switch_s: float,
    cfg: AllocatorConfig,
    decode_turn_s: float | None = None,
    pause_left_s: float = 0.0,
    window_s: float = DEFAULT_WINDOW_S,
) -> SwitchPrice:
    """The price of switching ``view`` to ``to_role`` (hand-checked in test_pricing.py).

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
    if pause_left_s > 0:
        return SwitchPrice(0.0, max(0.0, switch_s - pause_left_s))
    if not view.busy:
        return SwitchPrice(0.0, switch_s)
    if view.role == "decode":
        deadline = cfg.drain_deadline_s
        if decode_turn_s is None or decode_turn_s <= 0:
            return SwitchPrice(deadline, switch_s, float(view.kv_used_tokens))
        drain = min(deadline, decode_turn_s)
        aborted = max(0.0, 1.0 - deadline / decode_turn_s)
        return SwitchPrice(drain, switch_s, aborted * view.kv_used_tokens)
    drain = min(cfg.drain_prefill_s, cfg.drain_deadline_s)
    hit = min(view.cache_hit_rate or 0.0, cfg.max_cache_hit_rate)
    rate = view.prefill_tokens_per_s or 0.0
    cycle = (decode_turn_s or 0.0) + window_s
    cached = hit / (1.0 - hit) * rate * cycle
    if view.kv_capacity_tokens > 0:
        cached = min(cached, float(view.kv_capacity_tokens))
    return SwitchPrice(drain, switch_s, 0.0, cached)


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


def priced_net(
    p: int, d: int, to_role: str, prices: list[SwitchPrice], demand: DemandView, cfg: AllocatorConfig,
    horizon: float, ctx: PricedContext,
) -> tuple[np.ndarray, float]:
    """(f(k) for k = 1..len(prices), f(0)): the bottleneck ratio over ``horizon`` after
    moving the first k engines, priced.

    Over the horizon H, prefill needs W_P = S·aᴾ_now + (H − S)·aᴾ_later engine-seconds and
    decode W_D likewise; the roles offer p·H and d·H. Moving k engines toward a role takes
    them from their old role at once and adds Σ (H − dead_i) to the new one; the work
    their drains abort and the cache their flips lose adds Σ x_i engine-seconds to W_P.
    f = min(capᴾ/W_P, capᴰ/W_D), each capped at ``ratio_cap`` (a role with no demand is at
    the cap)."""
    cap = cfg.ratio_cap
    s = min(demand.horizon_s, horizon)
    w_p = s * demand.prefill_now + (horizon - s) * demand.prefill_later
    w_d = s * demand.decode_now + (horizon - s) * demand.decode_later

    def f(cap_p: np.ndarray, cap_d: np.ndarray, work_p: np.ndarray) -> np.ndarray:
        rp = np.where(work_p > 0, np.minimum(cap_p / np.maximum(work_p, 1e-12), cap), cap)
        rd = np.full(cap_d.shape, cap) if w_d <= 0 else np.minimum(cap_d / w_d, cap)
        return np.minimum(rp, rd)

    k = np.arange(1, len(prices) + 1, dtype=float)
    live = np.cumsum([max(0.0, horizon - min(x.dead_s, horizon)) for x in prices])
    extra = np.cumsum([x.prefill_engine_s(ctx.theta, ctx.hit) for x in prices])
    if to_role == "prefill":
        cap_p, cap_d = p * horizon + live, (d - k) * horizon
    else:
        cap_p, cap_d = (p - k) * horizon, d * horizon + live
    f_old = float(f(np.array([p * horizon], float), np.array([d * horizon], float), np.array([w_p]))[0])
    return f(cap_p, cap_d, w_p + extra), f_old


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
) -> Selection:
    """The 'priced' rule: the same band, candidates, caps and dwell as
    :func:`select_switches`; the gain test prices each move (:func:`price_switch`) and
    judges it over the horizon (``horizon_s``, at least ``horizon_switch_multiple`` x the
    slowest move's dead time). Candidates are taken least loaded first; the test takes the
    best prefix of them (the moves are priced one by one and summed)."""
    move = _band_move(engines, alloc, cfg, now, last_direction, last_switch_ts, initial)
    if isinstance(move, Selection):
        return move
    n, p, d, in_flight, to_role, donor, wanted, donors, fraction = move
    if ctx.pause_left_s > 0:
        # In the pause a switch costs no drain, no aborts and no cache: the per-plan cap
        # (a guard against one wrong forecast's drains) does not apply; the gain test does.
        fraction = 1.0
    # Only the candidates taken are priced (a plan of 1,024 engines stays within its budget).
    candidates = _candidates(donors, n, in_flight, wanted, fraction, to_role, now, cfg)
    if isinstance(candidates, Selection):
        return candidates
    prices = [price_switch(v, to_role, cost.for_engine(v), cfg, ctx.decode_turn_s, ctx.pause_left_s, demand.horizon_s)
              for v in candidates]
    moves = [Move(v, to_role, pr.drain_s, pr.switch_s) for v, pr in zip(candidates, prices)]
    horizon = max(cfg.horizon_s, cfg.horizon_switch_multiple * max(x.dead_s for x in prices))
    restart_s = max((m.switch_s for m in moves if "in_place" not in m.engine.switch_modes), default=None)
    if restart_s is not None:
        if imbalance_s < restart_s:
            return Selection(reason=f"imbalance toward {to_role} has lasted {imbalance_s:.0f}s < restart {restart_s:.0f}s")
        horizon = max(horizon, cfg.restart_lookahead_s)
    elif ctx.pause_left_s <= 0 and cfg.persist_dead_multiple > 0:
        wait = cfg.persist_dead_multiple * prices[0].dead_s  # the first (cheapest) move's dead time
        if imbalance_s < wait:
            return Selection(reason=f"imbalance toward {to_role} has lasted {imbalance_s:.0f}s < "
                                    f"{wait:.0f}s ({cfg.persist_dead_multiple:g} x a switch's dead time)")
    f_new, f_old = priced_net(p, d, to_role, prices, demand, cfg, horizon, ctx)
    # Measured evidence beats the forecast: in a closed loop the demand a window shows
    # depends on the split that served it (a choked decode side lowers the prefill
    # demand, a backlogged prefill side raises it), so a count that was held and served
    # fewer prompts per second than the current one is not gone back to.
    # The veto stands down when the engines show the move's need now: the role it feeds
    # saturated while the donor role idles (``role_pressed``). A rate measured at the other
    # count is an average over phases; in a step that alternates a prefill-bound and a
    # decode-bound phase (MiMo coding/8) it vetoes the move each phase needs.
    here = None if cfg.served_veto_yields_to_state and role_pressed(engines, to_role) else ctx.served.get(p)
    vetoed = 0
    if here is not None:
        sign = 1 if to_role == "prefill" else -1
        blocked = False
        for i in range(len(f_new)):
            there = ctx.served.get(p + sign * (i + 1))
            # The served rate is unimodal in the prefill count (prefill-bound below its
            # peak, decode-bound above it): past a count that served less, none serves more.
            blocked = blocked or (there is not None and there < here * (1.0 + cfg.hysteresis))
            if blocked:
                f_new[i] = -np.inf
                vetoed += 1
    if vetoed == len(f_new):
        return Selection(reason=f"every move to {to_role} goes to a prefill count that served less than {p} "
                                f"({here:.0f} tokens/s)")
    best = int(np.argmax(f_new))
    gain = float(f_new[best]) / max(f_old, 1e-9) - 1.0
    where = " in the pause" if ctx.pause_left_s > 0 else ""
    if gain > cfg.hysteresis:
        return Selection(
            moves[: best + 1],
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


def role_pressed(engines: list[EngineView], to_role: str) -> bool:
    """Whether ``to_role`` is saturated now and the other role idle, from the engines'
    last stats: prefill queue per engine > PRESSED_QUEUE with decode KV < IDLE_KV and no
    decode queue (to prefill); decode KV > PRESSED_KV or decode queue > PRESSED_QUEUE with
    no prefill queue (to decode). Engines mid-switch are left out."""
    pre = [v for v in engines if v.role == "prefill" and v.switching_to is None]
    dec = [v for v in engines if v.role == "decode" and v.switching_to is None]
    if not pre or not dec:
        return False
    p_queue = sum(v.queued_reqs for v in pre) / len(pre)
    d_queue = sum(v.queued_reqs for v in dec) / len(dec)
    d_kv = sum(v.kv_used_tokens for v in dec) / max(1, sum(v.kv_capacity_tokens for v in dec))
    if to_role == "prefill":
        return p_queue > PRESSED_QUEUE and d_kv < IDLE_KV and d_queue < IDLE_QUEUE
    return (d_kv > PRESSED_KV or d_queue > PRESSED_QUEUE) and p_queue < IDLE_QUEUE
