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

That gain test is the paper's rule (``rule="paper"``, :func:`select_switches`); the default
``priced`` rule (:mod:`prorsa_allocator.pricing`) prices each switch's dead time and extra
work instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

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
    decode_fed_share: float = 1.0
    """The share of the decode demand that the prefills bring over the horizon (the KV the
    forecast's admissions add, K̂ᴰ/(Kᴰ + K̂ᴰ)); the rest is KV already resident. The
    closed-loop coupling scales only this share with what prefill serves."""
    prefill_fed_share: float = 1.0
    """The share of the prefill demand that arrivals bring over the horizon (the
    forecast's sampler, sandbox and tool terms against those plus its ready-queue and
    in-flight backlog, from ``forecast.window``'s ``components``; 1 without them). A
    backlog is an amount cleared once, not a rate the loop feeds: the closed-loop coupling
    scales only this share with what decode serves."""
    decode_kv_now: float | None = None
    decode_kv_later: float | None = None
    """The KV share of ``decode_now`` / ``decode_later`` in instances ((Kᴰ + K̂ᴰ)/C_KVᴰ);
    None: all of the decode demand is KV. Where the decode demand exceeds it, the excess
    is the latency-balance term (decode.py), priced by ``decode_step``."""
    decode_step: tuple[float, float] | None = None
    """(t₀, c): the decode step of an empty engine and the decode pool's load in
    engine-seconds per step (step time t(n) = t₀ + c/n on n engines): the step speed-up
    a move to decode buys is what the latency term's demand is worth."""
    decode_spread: float | None = None
    """The decode engines the decode sequences can spread over at one sequence a rank
    (``decode.DecodeLoad.spread``; None: unbounded): the step speed-up a move to decode buys
    stops there, t(n) = t₀ + c/min(n, spread)."""
    prefill_arrivals_later: float | None = None
    """The part of ``prefill_later`` arrivals bring, in instances (the smoothed arrival
    share of each forecast, ``prefill_fed_share``; None: not known, all of it): the
    prefill work after the current window, under the turn-latency objective and, with
    ``prefill_backlog_once``, the capacity ratio. A backlog counted in every window's
    forecast is not a rate."""
    prefill_upper: float | None = None
    """The ``provision_quantile`` quantile of the recent forecast prefill demand, in
    instances (None: not configured): a move that takes engines from prefill judges the
    prefill demand after the current window at no less than this."""


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
    cooling down, and able to switch at all (``EngineView.cannot_switch``)."""
    return (
        not view.cannot_switch
        and view.command is None
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


def band_move(engines, alloc, cfg, now, last_direction, last_switch_ts, initial):
    """What both rules share: the prefill count against the target band, the direction and
    size of the move, the dwell guard, the movable donors and the per-plan cap fraction.
    Returns a :class:`Selection` when nothing is to move, else the move's parts."""
    n = len(engines)
    if n < 2:
        return Selection(reason="fewer than two PD engines")
    p = in_flight = 0
    settled: dict[str, list[EngineView]] = {"prefill": [], "decode": []}
    for v in engines:
        going = v.switching_to
        if going is None:
            p += v.role == "prefill"
            if v.role in settled:
                settled[v.role].append(v)
        else:
            p += going == "prefill"
            in_flight += 1
    d = n - p
    lo, hi = prefill_band(alloc, n)
    if lo <= p <= hi:
        return Selection(reason=f"prefill count {p} within target band [{lo}, {hi}]")
    to_role, donor, wanted = ("prefill", "decode", lo - p) if p < lo else ("decode", "prefill", p - hi)
    if last_direction is not None and last_direction != to_role and now - last_switch_ts < cfg.min_dwell_s:
        return Selection(reason=f"would reverse the last switch (to {last_direction}) within the dwell time")
    donors = settled[donor]
    fraction = max(cfg.max_switch_fraction, cfg.initial_switch_fraction) if initial else cfg.max_switch_fraction
    return n, p, d, in_flight, to_role, donor, wanted, donors, fraction


def donor_candidates(donors, n, in_flight, wanted, fraction, to_role, now, cfg):
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
    move = band_move(engines, alloc, cfg, now, last_direction, last_switch_ts, initial)
    if isinstance(move, Selection):
        return move
    n, p, d, in_flight, to_role, donor, wanted, donors, fraction = move
    candidates = donor_candidates(donors, n, in_flight, wanted, fraction, to_role, now, cfg)
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
