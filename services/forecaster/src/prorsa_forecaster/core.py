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

Decode admissions (B.7, :mod:`prorsa_forecaster.decode_admit`): every in-flight and
queued request, and the predicted arrivals (aggregated per sub-step), go through the
instances' FIFO prefill queues; the prompt tokens of those whose predicted completion b_j
falls before t+S are A^D; kappa^D of them is K^D. Each source therefore predicts a
request's load, not only its prompt: [count, prompt, computed tokens, attention pairs].
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from .config import ForecastConfig
from .history import History
from .decode_admit import (
    N_CLASSES,
    AdmitDetail,
    KnownQueue,
    PendingUpdate,
    class_sums,
    decode_admissions_split,
    known_queue,
    pooled_cost,
    request_rows,
    service_class,
)
from .guards import BIG, clean, finite_sum
from .snapshot import START_DISPATCHED, START_MODES, Snapshot

COMPONENTS = ("sampler", "sandbox", "ready", "tool", "inflight", "reprefill")


@dataclass(frozen=True)
class Forecast:
    """One window's forecast.

    ``prefill_tokens`` = W-hat^P (bias-corrected), ``decode_admit_tokens`` = A-hat^D,
    ``decode_kv_tokens`` = K-hat^D, ``decode_kv_now`` = K^D. ``components`` holds the
    uncorrected per-source prefill terms; ``bias`` the token amount the correction added
    (may be negative). ``predicted_prefill`` is the part that is a prediction (sampler +
    sandbox + tool), which is what the bias correction scales; ``raw_decode`` the
    uncorrected A-hat^D, ``raw_decode_known`` its part from requests queued or in
    prefill at t. ``share_factor`` is the correction of the predicted arrivals' admitted
    share (already in ``raw_decode``), ``raw_alpha`` that share per sub-step before it.
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
    raw_decode_known: float = 0.0
    share_factor: float = 1.0
    raw_alpha: tuple[float, ...] = ()
    admit_detail: AdmitDetail = field(default_factory=AdmitDetail)
    model_prefill: float = 0.0
    """The lifecycle forecast of prefill demand (corrected), before the blend with the
    naive predictors; ``model_decode`` likewise."""
    model_decode: float = 0.0
    new_model: float = 0.0
    """New trajectories' arrivals: the sampler term (corrected), which the lifecycle
    forecast counts with its weight ``weights["new"]["lifecycle"]``, plus ``new_series``
    tokens from the naive predictors of that series (weighted)."""
    new_series: float = 0.0
    weights: dict[str, dict[str, float]] = field(default_factory=dict)
    """The blend's weights per series (``prefill``, ``decode``: the lifecycle forecast, the
    same scaled, and each naive predictor; ``new``: the sampler term and the naive
    predictors of new trajectories' arrivals)."""


_finite_sum, _clean, _BIG = finite_sum, clean, BIG


def _delay_pmf(model, horizon: float, steps: int) -> np.ndarray:
    """Pr(delay in sub-step l) for an event placed mid-sub-step, l = 0..steps-1."""
    h = horizon / steps
    edges = np.concatenate(([0.0], (np.arange(steps) + 0.5) * h))
    return np.clip(np.diff(model.cdf(edges)), 0.0, 1.0)


def _rows(snap: Snapshot, x: np.ndarray, prefix=0.0, weight=None) -> np.ndarray:
    """Load rows of requests (both cache outcomes stacked: ``(2n, 4)``), each counting
    with its ``weight`` (the probability that it comes at all; 1 when None)."""
    hit = snap.unrouted_hit(np.broadcast_to(np.asarray(prefix, dtype=float), np.shape(x)))
    h, m = request_rows(x, prefix, hit, snap.cache_cold)
    rows = np.concatenate((h, m))
    return rows if weight is None else rows * np.tile(np.asarray(weight, dtype=float), 2)[:, None]


def _spread(model, elapsed: np.ndarray, x: np.ndarray, prefix, snap: Snapshot, cost: np.ndarray, cfg: ForecastConfig, weight=None) -> np.ndarray:
    """Expected arrivals per service class and sub-step, ``(4, N_CLASSES, steps)``, of
    requests of ``x`` prompt tokens (``prefix`` of them cached on a hit) whose waiting
    time follows ``model`` (conditioned on the elapsed time); each request counts with
    its ``weight`` (see :func:`_rows`)."""
    load = _rows(snap, x, prefix, weight)
    e = np.concatenate((elapsed, elapsed))
    return model.weighted_steps(e, load, cfg.horizon, cfg.steps, service_class(load, cost), N_CLASSES)


def _sampler(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray) -> np.ndarray:
    """Expected first-request arrivals from new launches: loads (4, N_CLASSES, steps)."""
    steps, S = cfg.steps, cfg.horizon
    elapsed = _clean(snap.reward_elapsed)
    cohort = np.asarray(snap.reward_cohort)
    counts = np.zeros(steps)
    prompt = max(hist.first_prompt.value, 0.0)

    # Launches follow completed rewards only in a log that has shown some: a serving
    # trace's requests end in Reward and stay there, and launch nothing.
    solo = (cohort < 0) & (hist.completions > 0)
    # Beyond B.2: decoding trajectories that stop now and finish their reward within S
    # (only under "replace"; a cohort's completion needs every member in Reward).
    finishing = np.zeros(steps)
    if len(snap.decode_elapsed) and snap.run.mode != "sync" and snap.run.injection == "replace" and hist.completions > 0:
        rew_k = _kernel(hist.reward, S, steps)
        stops = 1.0 - snap.tool_share("decode_turn", "decode_elapsed", hist.tool_fraction)
        finishing = hist.decode.weighted_steps(_clean(snap.decode_elapsed), stops, S, steps) @ rew_k
    if solo.any() or finishing.any():
        # N_pass per sub-step, through f (replace: linear), then the launch delay.
        done = hist.reward.weighted_steps(elapsed[solo], np.ones(int(solo.sum())), S, steps)
        admitted = hist.admit_rate * (done + finishing)
        launches = hist.launches_per_admitted * admitted
        counts += np.convolve(launches, _delay_pmf(hist.launch, S, steps))[:steps]

    grouped = cohort >= 0
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
    size, due = sync_batch(snap, hist, S, steps)
    counts += size * due
    counts = _clean(counts)
    one = _rows(snap, np.array([prompt]))
    return class_sums(one, service_class(one, cost))[:, :, None] * counts[None, None, :]


def sync_batch(snap: Snapshot, hist: History, S: float, steps: int) -> tuple[float, np.ndarray]:
    """The next sync batch, announced: its size (``run.started.batch_size``) and Pr(its
    first requests arrive in sub-step k).

    Once announced (``run.started`` before the first batch, ``policy.updated`` after the
    last one drained) it is dispatched after the learnt announcement -> dispatch delay
    (prior: at once, ``prior_sync_start_s``), its first requests after the start-up
    delay. Before the update (the batch drained, training runs) the learnt training pause
    (drain -> update) comes first, once one has been seen. One event for the whole batch
    (it comes in the window or it does not): ``uncertainty`` flips it as one coin."""
    none = (0.0, np.zeros(steps))
    if snap.run.mode != "sync":
        return none
    e = snap.next_batch_elapsed
    size = float(snap.run.batch_size or (hist.cohort_size.value if hist.cohort_size.n else 0.0))
    if np.isfinite(e):
        due = hist.sync_start.conditional_steps(np.array([max(e, 0.0)]), S, steps)[0]
    elif np.isfinite(snap.update_elapsed) and hist.train.count >= 1:
        due = hist.train.conditional_steps(np.array([max(snap.update_elapsed, 0.0)]), S, steps)[0]
        due = due @ _kernel(hist.sync_start, S, steps)
    else:
        return none
    return size, _clean(due @ _kernel(hist.start[START_DISPATCHED], S, steps))


def _startup(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray) -> np.ndarray:
    """Expected first requests of launched trajectories: loads (4, N_CLASSES, steps)."""
    steps = cfg.steps
    out = np.zeros((4, N_CLASSES, steps))
    if len(snap.start_elapsed) == 0:
        return out
    elapsed = _clean(snap.start_elapsed)
    prompt = _clean(snap.start_prompt) + max(hist.first_overhead.value, -1e12)
    prompt = np.clip(prompt, 0.0, None)
    mode = np.asarray(snap.start_mode)
    for m in range(START_MODES):
        sel = mode == m
        if not sel.any():
            continue
        out += _spread(hist.start[m], elapsed[sel], prompt[sel], 0.0, snap, cost, cfg)
    return out


def _tool(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray) -> np.ndarray:
    """Expected next requests of trajectories in Tool: loads (4, N_CLASSES, steps)."""
    steps = cfg.steps
    if len(snap.tool_elapsed) == 0:
        return np.zeros((4, N_CLASSES, steps))
    result = np.nan_to_num(np.asarray(snap.tool_result, dtype=float), nan=-1.0)
    growth = np.where(result >= 0, result + hist.tool_overhead.value, _clean(snap.tool_growth))
    x = np.clip(_clean(snap.tool_context) + np.clip(growth, 0.0, None), 0.0, _BIG)
    cached = snap.column("tool_cached", "tool_elapsed")
    elapsed = _clean(snap.tool_elapsed)
    return _spread(hist.tool, elapsed, x, cached, snap, cost, cfg)


def _kernel(model, horizon: float, steps: int) -> np.ndarray:
    """(steps, steps) matrix: mass placed in sub-step k lands in sub-step j after a fresh
    delay drawn from ``model`` (upper triangular; what falls past the window is lost)."""
    pmf = _delay_pmf(model, horizon, steps)
    k = np.arange(steps)
    lag = k[None, :] - k[:, None]
    return np.where(lag >= 0, pmf[np.clip(lag, 0, steps - 1)], 0.0)


def _turn_kernels(hist: History, horizon: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernels of the rest of a turn: a response ending in sub-step k that calls a tool
    is back in sub-step j; and the same from a decode start (decode, then tool). Whether
    it calls one at all is the caller's weight on each request (its turn's tool share,
    :meth:`Snapshot.tool_share`)."""
    back = _kernel(hist.tool, horizon, steps)
    return back, _kernel(hist.decode, horizon, steps) @ back


def _by_step(load: np.ndarray, cls: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(4, N_CLASSES, steps)``: load rows summed per service class, each row spread
    over the sub-steps by its ``(rows, steps)`` weights."""
    out = np.zeros((4, N_CLASSES, weights.shape[1]))
    for c in np.unique(cls):
        sel = cls == c
        out[:, c, :] = load[sel].T @ weights[sel]
    return out


def _next_turn(
    snap: Snapshot,
    hist: History,
    cfg: ForecastConfig,
    cost: np.ndarray,
    kq: KnownQueue | None = None,
    update: np.ndarray | None = None,
) -> np.ndarray:
    """Requests after a tool call from trajectories now queued, in prefill or decoding.

    Beyond the paper's simplification (B.1: no second pass within a horizon), which
    misses whole turns when decode + tool take less than S: a decoding trajectory finishes
    with Pr(T_dec < e + S | T_dec > e), calls a tool with the learnt tool fraction, and
    returns after a fresh tool duration. A queued one is prefilled first: when, the
    queue model says (``kq``: its place in its server's queue, the pause after a weight
    update, the caches it flushed; ``chain_from_queue``), or else the learnt prefill
    wait given how long it has waited. ``update``: :func:`_update_steps`, if the caller
    has it already.
    """
    steps, S = cfg.steps, cfg.horizon
    out = np.zeros((4, N_CLASSES, steps))
    extra = max(hist.output.value, 0.0)
    # The current prompt will be cached by then: it is the next request's prefix.
    tool_k, _ = _turn_kernels(hist, S, steps)
    # A decode that a weight update cuts short does not end in a tool call (see
    # _not_interrupted): the decode ends are weighted before the tool kernel.
    if update is None:
        update = _update_steps(snap, hist, cfg)
    tool_k = _not_interrupted(update, cfg)[:, None] * tool_k
    pooled = hist.tool_fraction
    if len(snap.decode_elapsed):
        p = _clean(snap.decode_prompt)
        x = p + extra + _clean(snap.decode_growth)
        calls = snap.tool_share("decode_turn", "decode_elapsed", pooled)
        out += _spread(hist.decode, _clean(snap.decode_elapsed), x, p, snap, cost, cfg, calls) @ tool_k
    since = np.concatenate((np.asarray(snap.ready_since, float), np.asarray(snap.inflight_since, float)))
    if len(since):
        p = np.concatenate((_clean(snap.ready_prompt), _clean(snap.inflight_prompt)))
        x = p + extra + np.concatenate((_clean(snap.ready_growth), _clean(snap.inflight_growth)))
        calls = np.concatenate((snap.tool_share("ready_turn", "ready_prompt", pooled), snap.tool_share("inflight_turn", "inflight_prompt", pooled)))
        chain = _kernel(hist.decode, S, steps) @ tool_k
        if kq is not None and cfg.chain_from_queue:
            pmf_in, pmf_rd = kq.finish_steps(S, steps)
            pmf = np.concatenate((pmf_rd, pmf_in))  # the order of ``since``: ready, then in flight
            some = pmf.sum(axis=1) > 0  # deep in a queue: not prefilled in the window
            if some.any():
                load = _rows(snap, x[some], p[some], calls[some])
                out += _by_step(load, service_class(load, cost), np.concatenate((pmf[some], pmf[some]))) @ chain
        else:
            out += _spread(hist.prefill_wait, _clean(snap.t - since), x, p, snap, cost, cfg, calls) @ chain
    return _clean(out)


def _update_steps(snap: Snapshot, hist: History, cfg: ForecastConfig) -> np.ndarray:
    """Pr(the pending weight update lands in sub-step k), k = 0..steps-1: from the learnt
    trigger -> policy.updated delay, once the update is triggered (zeros otherwise).

    Before any trigger -> update delay is observed the prior alone spreads the update
    over many windows and does more harm than good: zeros until then. (From the first
    observation on it pays: on 10-step general-agent logs, requiring two left the second
    update's re-prefill unforecast, 0.1-0.3 points of prefill WAPE.)"""
    e = snap.update_elapsed
    if not np.isfinite(e) or hist.train.count < 1:
        return np.zeros(cfg.steps)
    return _clean(hist.train.conditional_steps(np.array([max(e, 0.0)]), cfg.horizon, cfg.steps)[0])


def _not_interrupted(update: np.ndarray, cfg: ForecastConfig) -> np.ndarray:
    """Per sub-step: Pr(no weight update before a decode that ends mid-sub-step).

    A weight update aborts every decoding request (it re-prefills after the pause and
    decodes the rest of its answer), so a turn that would have ended after the update
    does not end, and its tool call and return do not happen, in the window."""
    if not cfg.update_interrupts or not update.any():
        return np.ones(cfg.steps)
    before = np.cumsum(update) - 0.5 * update
    return np.clip(1.0 - before, 0.0, 1.0)


def _reprefill(snap: Snapshot, hist: History, cost: np.ndarray, update: np.ndarray) -> np.ndarray:
    """Beyond the paper's components: a weight update aborts every decoding request and
    re-queues it with its context (prompt + partial output). Forecast only once the
    update is triggered (a batch of admitted samples is in), with ``update`` =
    Pr(update in sub-step k) from the learnt trigger -> policy.updated delay
    (:func:`_update_steps`); the decoding set at t stands in for the set at the update.
    Returns the re-prefills' loads per service class if the update lands, ``(4,
    N_CLASSES)``: times ``update`` per sub-step, the forecast term."""
    if not update.any() or len(snap.decode_prompt) == 0:
        return np.zeros((4, N_CLASSES))
    x = _clean(snap.decode_prompt) + 0.5 * max(hist.output.value, 0.0)
    load = _rows(snap, x)  # the update flushed every cache: no prefix
    return _clean(class_sums(load, service_class(load, cost)))


def forecast(snap: Snapshot, hist: History, cfg: ForecastConfig | None = None) -> Forecast:
    """The forecast for [snap.t, snap.t + S) (Appendix B, all components)."""
    with np.errstate(all="ignore"):  # inputs are guarded; results are checked below
        return _forecast(snap, hist, cfg or hist.config)


def _forecast(snap: Snapshot, hist: History, cfg: ForecastConfig) -> Forecast:
    cost = pooled_cost(snap)
    kq = known_queue(snap, cfg.queue_spread)
    samp = _sampler(snap, hist, cfg, cost)
    start = _startup(snap, hist, cfg, cost)
    p_update = _update_steps(snap, hist, cfg)
    tool = _tool(snap, hist, cfg, cost) + _next_turn(snap, hist, cfg, cost, kq, p_update)
    re_if = _reprefill(snap, hist, cost, p_update)
    re = re_if[:, :, None] * p_update[None, None, :]
    comps = {
        "sampler": _finite_sum(samp[1]),
        "sandbox": _finite_sum(start[1]),
        "ready": _finite_sum(_clean(snap.ready_prompt)),
        "tool": _finite_sum(tool[1]),
        "inflight": _finite_sum(_clean(snap.inflight_prompt)),
        "reprefill": _finite_sum(re[1]),
    }
    predicted = comps["sampler"] + comps["sandbox"] + comps["tool"] + comps["reprefill"]
    known = comps["ready"] + comps["inflight"]
    fs = hist.prefill_factors(cfg.bias_per_source)
    # New trajectories (launched in the window, or never announced): the sampler term
    # beside a level of their arrivals, blended by how each has done (blend.NewArrivals).
    w_samp, level = hist.new_arrivals.split()
    new = w_samp * fs["sampler"] * comps["sampler"] + level
    model = known + new + sum(fs[k] * comps[k] for k in ("sandbox", "tool", "reprefill"))

    # Predicted arrivals (loads per sub-step), scaled like the prefill forecast; the
    # level's arrivals come evenly through the window as requests of the mean first prompt.
    future = _clean(samp * (fs["sampler"] * w_samp) + start * fs["sandbox"] + tool * fs["tool"])
    mean_prompt = hist.first_prompt.value
    if level > 0 and mean_prompt > 0:
        one = _rows(snap, np.array([mean_prompt]))
        per = class_sums(one, service_class(one, cost)) * (level / mean_prompt / cfg.steps)
        future = future + _clean(per[:, :, None] * np.ones(cfg.steps)[None, None, :])
    update = None
    if cfg.update_interrupts and p_update.sum() > 0:
        # The re-prefills come with a pause and flushed caches: the queue model takes
        # them as a mixture over when the update lands, not as ordinary arrivals.
        load = re_if.sum(axis=1) * fs["reprefill"]
        pause = hist.update_pause.value if hist.update_pause.n else 0.0
        update = PendingUpdate(p_update, pause, _clean(load))
    else:
        future = future + _clean(re * fs["reprefill"])
    known_admit, new_admit, kv, detail = decode_admissions_split(snap, cfg, future, update, kq)
    # The queue model's admitted share of the arrivals, corrected by what it made of the
    # arrivals that actually came in closed windows (History.bias_share); a sub-step's
    # share stays at most 1: no more can be admitted than arrives.
    share = hist.bias_share.factor
    raw_alpha = detail.alpha
    if share != 1.0 and new_admit > 0 and len(detail.arrival_tokens) == len(raw_alpha):
        alpha = np.minimum(np.asarray(raw_alpha) * share, 1.0)
        corrected = _finite_sum(alpha * np.asarray(detail.arrival_tokens))
        kv += corrected - new_admit  # K^D counts the arrivals' tokens as they are
        new_admit = corrected
        detail = replace(detail, alpha=tuple(float(a) for a in alpha))
    admit = known_admit + new_admit
    decode_model = admit * hist.bias_decode.factor
    # The published forecast: the lifecycle one blended with the naive predictors of
    # each series by their running WAPE (blend.SeriesBlend).
    prefill = hist.prefill_blend.combine(model)
    decode = hist.decode_blend.combine(decode_model)
    bias = prefill - known - predicted
    kv_hat = kv * (decode / admit) if admit > 0 else kv

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
        raw_decode_known=ok(known_admit),
        share_factor=float(share),
        raw_alpha=raw_alpha,
        admit_detail=detail,
        model_prefill=ok(model),
        model_decode=ok(decode_model),
        new_model=ok(fs["sampler"] * comps["sampler"]),
        new_series=ok(level),
        weights={
            "prefill": hist.prefill_blend.blend.named(),
            "decode": hist.decode_blend.blend.named(),
            "new": hist.new_arrivals.blend.named(),
        },
    )
