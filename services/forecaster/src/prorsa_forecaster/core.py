"""The pure Appendix-B predictor: ``forecast(snapshot, history, config) -> Forecast``.

No I/O, no clock: the same snapshot and history always give the same forecast. Every
component works on whole arrays (no Python loop over trajectories).

Sources of prefill demand over [t, t+S) (B.2-B.6):

* sampler: trajectories in Reward complete with q_i = Pr(T_rew < e_i + S | T_rew > e_i);
  admitted completions N_pass = p-hat * sum q_i launch f(N_pass) new trajectories, whose
  first requests arrive after the learnt launch delay, each with the estimated initial
  prompt length. Cohort injection (a sync batch, GRPO groups) launches only when every
  member of the cohort has finished.
* sandbox: launched trajectories whose first request is not queued yet arrive with
  Pr(T_start < e + S | T_start > e, mode) and their dispatched prompt (+ learnt overhead).
* ready queue and in-flight prefill: their full prompt lengths.
* tool: Pr(T_tool < e + S | T_tool > e) times the prompt after the result is appended
  (context + the trajectory's EMA of prompt growth, alpha 0.1).

Decode admissions (B.7): every in-flight and queued request, and the predicted arrivals
(aggregated per sub-step), go through per-instance FIFO prefill queues; the prompt tokens
of those whose predicted completion b_j falls before t+S are A^D; kappa^D of them is K^D.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ForecastConfig
from .history import History
from .prefill_queue import simulate_queues
from .snapshot import START_MODES, Snapshot

COMPONENTS = ("sampler", "sandbox", "ready", "tool", "inflight", "reprefill")


@dataclass(frozen=True)
class Forecast:
    """One window's forecast.

    ``prefill_tokens`` = W-hat^P (bias-corrected), ``decode_admit_tokens`` = A-hat^D,
    ``decode_kv_tokens`` = K-hat^D, ``decode_kv_now`` = K^D. ``components`` holds the
    uncorrected per-source prefill terms; ``bias`` the token amount the correction added
    (may be negative). ``predicted_prefill`` is the part that is a prediction (sampler +
    sandbox + tool), which is what the bias correction scales; ``raw_decode`` the
    uncorrected A-hat^D.
    """

    t: float
    horizon: float
    prefill_tokens: float
    decode_admit_tokens: float
    decode_kv_tokens: float
    decode_kv_now: float
    components: dict[str, float] = field(default_factory=dict)
    bias: float = 0.0
    decode_bias: float = 0.0
    predicted_prefill: float = 0.0
    raw_decode: float = 0.0


def _finite_sum(x: np.ndarray) -> float:
    v = float(np.sum(x))
    return v if np.isfinite(v) and v > 0 else 0.0


_BIG = 1e12  # far beyond any token count or duration; keeps products finite


def _clean(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    """Non-finite -> ``fill``, then clipped to [0, 1e12]: guards every input array."""
    return np.clip(np.nan_to_num(np.asarray(x, dtype=float), nan=fill, posinf=fill, neginf=fill), 0.0, _BIG)


def _delay_pmf(model, horizon: float, steps: int) -> np.ndarray:
    """Pr(delay in sub-step l) for an event placed mid-sub-step, l = 0..steps-1."""
    h = horizon / steps
    edges = np.concatenate(([0.0], (np.arange(steps) + 0.5) * h))
    return np.clip(np.diff(model.cdf(edges)), 0.0, 1.0)


def _sampler(snap: Snapshot, hist: History, cfg: ForecastConfig) -> tuple[np.ndarray, np.ndarray]:
    """Expected first-request arrivals from new launches: (count, tokens) per sub-step."""
    steps, S = cfg.steps, cfg.horizon
    elapsed = _clean(snap.reward_elapsed)
    cohort = np.asarray(snap.reward_cohort)
    counts = np.zeros(steps)
    prompt = max(hist.first_prompt.value, 0.0)

    solo = cohort < 0
    # Beyond B.2: decoding trajectories that stop now and finish their reward within S
    # (only under "replace"; a cohort's completion needs every member in Reward).
    finishing = np.zeros(steps)
    if len(snap.decode_elapsed) and snap.run.mode != "sync" and snap.run.injection == "replace":
        rew_k = _kernel(hist.reward, S, steps) * (1.0 - hist.tool_fraction)
        n_dec = len(snap.decode_elapsed)
        finishing = hist.decode.weighted_steps(_clean(snap.decode_elapsed), np.ones(n_dec), S, steps) @ rew_k
    if solo.any() or finishing.any():
        # N_pass per sub-step, through f (replace: linear), then the launch delay.
        done = hist.reward.weighted_steps(elapsed[solo], np.ones(int(solo.sum())), S, steps)
        admitted = hist.admit_rate * (done + finishing)
        launches = hist.launches_per_admitted * admitted
        counts += np.convolve(launches, _delay_pmf(hist.launch, S, steps))[:steps]

    grouped = ~solo
    if grouped.any() and len(snap.cohort_pending):
        ids = cohort[grouped]
        ncoh = len(snap.cohort_pending)
        valid = (ids >= 0) & (ids < ncoh)
        ids = ids[valid]
        # Pr(all reward-phase members done by the end of sub-step k) = prod of CDFs.
        cum = np.cumsum(hist.reward.bucket_table(elapsed[grouped][valid], S, steps), axis=1)
        logc = np.log(np.clip(cum, 1e-300, 1.0))
        per = np.zeros((ncoh, steps))
        np.add.at(per, ids, logc)
        done = np.exp(per)
        # A cohort with members outside Reward cannot complete within one window
        # (B.1: no trajectory passes through the stages twice in a horizon).
        ready = (np.asarray(snap.cohort_pending) <= 0) & (np.bincount(ids, minlength=ncoh) > 0)
        done = done[ready]
        if len(done):
            pmf = np.diff(np.concatenate((np.zeros((len(done), 1)), done), axis=1), axis=1)
            size = hist.cohort_size.value if hist.cohort_size.n else float(snap.run.group_size if snap.run.injection == "group" else (snap.run.batch_size or 1))
            launches = size * pmf.sum(axis=0)
            counts += np.convolve(launches, _delay_pmf(hist.cohort_launch, S, steps))[:steps]
    counts = _clean(counts)
    return counts, counts * prompt


def _startup(snap: Snapshot, hist: History, cfg: ForecastConfig) -> tuple[np.ndarray, np.ndarray]:
    """Expected first requests of launched trajectories: (count, tokens) per sub-step."""
    steps = cfg.steps
    counts = np.zeros(steps)
    tokens = np.zeros(steps)
    if len(snap.start_elapsed) == 0:
        return counts, tokens
    elapsed = _clean(snap.start_elapsed)
    prompt = _clean(snap.start_prompt) + max(hist.first_overhead.value, -1e12)
    prompt = np.clip(prompt, 0.0, None)
    mode = np.asarray(snap.start_mode)
    for m in range(START_MODES):
        sel = mode == m
        if not sel.any():
            continue
        w = np.stack((np.ones(int(sel.sum())), prompt[sel]), axis=1)
        c, x = hist.start[m].weighted_steps(elapsed[sel], w, cfg.horizon, steps)
        counts += c
        tokens += x
    return counts, tokens


def _tool(snap: Snapshot, hist: History, cfg: ForecastConfig) -> tuple[np.ndarray, np.ndarray]:
    """Expected next requests of trajectories in Tool: (count, tokens) per sub-step."""
    steps = cfg.steps
    if len(snap.tool_elapsed) == 0:
        return np.zeros(steps), np.zeros(steps)
    result = np.nan_to_num(np.asarray(snap.tool_result, dtype=float), nan=-1.0)
    growth = np.where(result >= 0, result + hist.tool_overhead.value, _clean(snap.tool_growth))
    x = np.clip(_clean(snap.tool_context) + np.clip(growth, 0.0, None), 0.0, _BIG)
    c, w = hist.tool.weighted_steps(_clean(snap.tool_elapsed), np.stack((np.ones(len(x)), x), axis=1), cfg.horizon, steps)
    return c, w


def _kernel(model, horizon: float, steps: int) -> np.ndarray:
    """(steps, steps) matrix: mass placed in sub-step k lands in sub-step j after a fresh
    delay drawn from ``model`` (upper triangular; what falls past the window is lost)."""
    pmf = _delay_pmf(model, horizon, steps)
    k = np.arange(steps)
    lag = k[None, :] - k[:, None]
    return np.where(lag >= 0, pmf[np.clip(lag, 0, steps - 1)], 0.0)


def _next_turn(snap: Snapshot, hist: History, cfg: ForecastConfig) -> tuple[np.ndarray, np.ndarray]:
    """Requests after a tool call from trajectories now queued, in prefill or decoding.

    Beyond the paper's simplification (B.1: no second pass within a horizon), which
    misses whole turns when decode + tool take less than S: a decoding trajectory finishes
    with Pr(T_dec < e + S | T_dec > e), calls a tool with the learnt tool fraction, and
    returns after a fresh tool duration; a queued one goes through prefill wait first.
    """
    steps, S = cfg.steps, cfg.horizon
    counts = np.zeros(steps)
    tokens = np.zeros(steps)
    extra = max(hist.output.value, 0.0)
    tool_k = _kernel(hist.tool, S, steps) * hist.tool_fraction
    if len(snap.decode_elapsed):
        x = _clean(snap.decode_prompt) + extra + _clean(snap.decode_growth)
        agg = hist.decode.weighted_steps(_clean(snap.decode_elapsed), np.stack((np.ones(len(x)), x), axis=1), S, steps)
        c, w = agg @ tool_k
        counts += c
        tokens += w
    since = np.concatenate((np.asarray(snap.ready_since, float), np.asarray(snap.inflight_since, float)))
    if len(since):
        chain = _kernel(hist.decode, S, steps) @ tool_k
        x = (
            np.concatenate((_clean(snap.ready_prompt), _clean(snap.inflight_prompt)))
            + extra
            + np.concatenate((_clean(snap.ready_growth), _clean(snap.inflight_growth)))
        )
        agg = hist.prefill_wait.weighted_steps(_clean(snap.t - since), np.stack((np.ones(len(x)), x), axis=1), S, steps)
        c, w = agg @ chain
        counts += c
        tokens += w
    return _clean(counts), _clean(tokens)


def _reprefill(snap: Snapshot, hist: History, cfg: ForecastConfig) -> tuple[np.ndarray, np.ndarray]:
    """Beyond the paper's components: a weight update aborts every decoding request and
    re-queues it with its context (prompt + partial output). Forecast only once the
    update is triggered (a batch of admitted samples is in), with Pr(update in window)
    from the learnt trigger -> policy.updated delay; the decoding set at t stands in for
    the set at the update."""
    steps = cfg.steps
    e = snap.update_elapsed
    # With fewer than two observed trigger -> update delays the prior spreads the update
    # over many windows and the term does more harm than good: leave it out until then.
    if not np.isfinite(e) or len(snap.decode_prompt) == 0 or hist.train.count < 2:
        return np.zeros(steps), np.zeros(steps)
    p = hist.train.conditional_steps(np.array([max(e, 0.0)]), cfg.horizon, steps)[0]
    x = _clean(snap.decode_prompt) + 0.5 * max(hist.output.value, 0.0)
    return p * len(x), p * _finite_sum(x)


def _decode_admissions(
    snap: Snapshot, cfg: ForecastConfig, fut_count: np.ndarray, fut_tokens: np.ndarray
) -> tuple[float, float]:
    """A-hat^D and K-hat^D by per-instance prefill queue simulation (relative times)."""
    S, steps = cfg.horizon, cfg.steps
    # Per-instance g(x) = a + b x, bounded so that no product overflows.
    a = np.clip(_clean(snap.instance_overhead), 0.0, 1e4)
    b = np.clip(_clean(snap.instance_per_token), 0.0, 1.0)
    M = len(a)

    def inst_of(idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        # Unknown assignment: spread round-robin (the router balances).
        fallback = np.arange(len(idx)) % M
        return np.where((idx >= 0) & (idx < M), idx, fallback)

    x_in = _clean(snap.inflight_prompt)
    i_in = inst_of(snap.inflight_instance)
    # In flight: its own start time plus g(x) (the runtime progress before t), never
    # earlier than t; it holds its instance until then.
    started = np.clip(np.nan_to_num(np.asarray(snap.inflight_started, dtype=float) - snap.t, nan=0.0), -_BIG, 0.0)
    b_in = np.maximum(np.minimum(started, 0.0) + a[i_in] + b[i_in] * x_in, 0.0)
    free = np.zeros(M)
    if len(b_in):
        np.maximum.at(free, i_in, b_in)

    x_rd = _clean(snap.ready_prompt)
    i_rd = inst_of(snap.ready_instance)
    u_rd = np.clip(np.nan_to_num(np.asarray(snap.ready_since, dtype=float) - snap.t, nan=0.0), -_BIG, 0.0)

    # Predicted arrivals: per sub-step, split evenly over the instances, arriving mid-step.
    h = S / steps
    k = np.repeat(np.arange(steps), M)
    i_f = np.tile(np.arange(M), steps)
    n_f = np.repeat(fut_count, M) / M
    x_f = np.repeat(fut_tokens, M) / M
    u_f = (k + 0.5) * h

    inst = np.concatenate((i_rd, i_f))
    arrival = np.concatenate((u_rd, u_f))
    service = np.concatenate((a[i_rd] + b[i_rd] * x_rd, a[i_f] * n_f + b[i_f] * x_f))
    done = simulate_queues(inst, arrival, service, free)
    b_rd, b_f = done[: len(x_rd)], done[len(x_rd) :]

    admit = _finite_sum(x_in[b_in < S]) + _finite_sum(x_rd[b_rd < S])
    # An aggregated pseudo-request straddling t+S completes in proportion.
    svc_f = service[len(x_rd) :]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(svc_f > 0, (S - (b_f - svc_f)) / svc_f, (b_f < S).astype(float))
    frac = np.clip(np.nan_to_num(frac, nan=0.0), 0.0, 1.0)
    admit_f = _finite_sum(x_f * frac)
    admit += admit_f
    page = cfg.kv_page_tokens
    kv = _finite_sum(np.ceil(x_in[b_in < S] / page) * page) + _finite_sum(np.ceil(x_rd[b_rd < S] / page) * page)
    kv += admit_f  # aggregated tokens: page rounding averages out
    return admit, kv


def forecast(snap: Snapshot, hist: History, cfg: ForecastConfig | None = None) -> Forecast:
    """The forecast for [snap.t, snap.t + S) (Appendix B, all components)."""
    with np.errstate(all="ignore"):  # inputs are guarded; results are checked below
        return _forecast(snap, hist, cfg or hist.config)


def _forecast(snap: Snapshot, hist: History, cfg: ForecastConfig) -> Forecast:
    n_samp, w_samp = _sampler(snap, hist, cfg)
    n_start, w_start = _startup(snap, hist, cfg)
    n_tool, w_tool = _tool(snap, hist, cfg)
    n_next, w_next = _next_turn(snap, hist, cfg)
    n_re, w_re = _reprefill(snap, hist, cfg)
    n_tool, w_tool = n_tool + n_next, w_tool + w_next
    comps = {
        "sampler": _finite_sum(w_samp),
        "sandbox": _finite_sum(w_start),
        "ready": _finite_sum(_clean(snap.ready_prompt)),
        "tool": _finite_sum(w_tool),
        "inflight": _finite_sum(_clean(snap.inflight_prompt)),
        "reprefill": _finite_sum(w_re),
    }
    predicted = comps["sampler"] + comps["sandbox"] + comps["tool"] + comps["reprefill"]
    known = comps["ready"] + comps["inflight"]
    factor = hist.bias_prefill.factor
    prefill = known + factor * predicted
    bias = prefill - known - predicted

    fut_count = _clean(n_samp + n_start + n_tool + n_re)
    fut_tokens = _clean(w_samp + w_start + w_tool + w_re) * factor
    admit, kv = _decode_admissions(snap, cfg, fut_count * factor, fut_tokens)
    dfactor = hist.bias_decode.factor
    decode = admit * dfactor
    kv_hat = kv * dfactor

    def ok(v: float) -> float:
        return float(v) if np.isfinite(v) and v > 0 else 0.0

    return Forecast(
        t=snap.t,
        horizon=cfg.horizon,
        prefill_tokens=ok(prefill),
        decode_admit_tokens=ok(decode),
        decode_kv_tokens=ok(kv_hat),
        decode_kv_now=ok(snap.decode_kv_now),
        components={k: ok(v) for k, v in comps.items()},
        bias=float(bias) if np.isfinite(bias) else 0.0,
        decode_bias=float(decode - admit) if np.isfinite(decode - admit) else 0.0,
        predicted_prefill=ok(predicted),
        raw_decode=ok(admit),
    )
