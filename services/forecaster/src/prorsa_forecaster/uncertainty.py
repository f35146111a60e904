"""How much of a window's demand no forecast can know: the spread of the arrivals.

Every predicted arrival is a coin flip: trajectory i's tool returns (or its sandbox starts,
or its decode ends and the tool after it returns) within the window with probability q_i,
and then brings a prompt of x_i tokens. Even with every q_i exact, the window's arrivals
vary around their mean sum(q_i x_i) with variance sum(q_i (1 - q_i) x_i^2); launches of
new trajectories, a count, add their Poisson variance sum(lambda x^2). The expected
absolute error of the best possible forecast is then about sqrt(2/pi) times the standard
deviation (normal approximation of a sum of many small terms).

``prefill_sd`` returns that standard deviation for one window, from the same snapshot and
learned distributions as the forecast. `prorsa forecast-eval` sums sqrt(2/pi) x sd over
the windows, divided by the total actual demand, as ``noise_floor``: the WAPE a forecast
with exact probabilities would still have. It is a LOWER bound in one sense (prompt sizes
are taken as known; the size of a tool result that has not come back is itself random)
and an estimate in another (the q_i are the forecaster's own). Only the service's
evaluation computes it; the live forecast does not pay for it. ``decode_sd`` does the same
for decode admissions (``decode.noise_floor``).
"""

from __future__ import annotations

import math

import numpy as np

from .config import ForecastConfig
from .guards import clean
from .history import History
from .snapshot import START_MODES, Snapshot
from .terms.common import kernel
from .terms.decode_admit import AdmitDetail
from .terms.known_queue import known_queue
from .terms.sampler import sync_batch
from .terms.tool import effects, open_weight, turn_kernels
from .terms.update import ends_normally, not_interrupted, requeue_rows, update_steps

ABS_NORMAL = math.sqrt(2.0 / math.pi)
"""E|Z| for a standard normal Z: expected absolute error per unit of standard deviation."""


def _var(q: np.ndarray, x: np.ndarray) -> float:
    q = np.clip(np.nan_to_num(q, nan=0.0), 0.0, 1.0)
    return float(np.sum(q * (1.0 - q) * np.square(clean(x))))


def _coin_flips(snap: Snapshot, hist: History, cfg: ForecastConfig):
    """The window's predicted arrivals as coin flips: yields ``(q, x, count)``, q the
    ``(n, steps)`` probabilities of trajectory i's request arriving in each sub-step and
    x its prompt; ``count`` marks launches of new trajectories (a count: Poisson
    variance, one row of expected launches per sub-step)."""
    S, steps = cfg.horizon, cfg.steps
    if len(snap.tool_elapsed):
        known = effects(snap, "tool_theta")
        if known is not None:
            # The mixture of the baseline at the call's effect and the pooled distribution.
            elapsed = clean(snap.tool_elapsed)
            w = open_weight(hist, elapsed, *known)[:, None]
            q = (w * hist.tool_base.bucket_table(elapsed, S, steps, theta=known[0])
                 + (1.0 - w) * hist.tool.bucket_table(elapsed, S, steps))
        else:
            q = hist.tool.bucket_table(clean(snap.tool_elapsed), S, steps)
        result = np.nan_to_num(np.asarray(snap.tool_result, dtype=float), nan=-1.0)
        growth = np.where(result >= 0, result + hist.tool_overhead.value, clean(snap.tool_growth))
        yield q, clean(snap.tool_context) + np.clip(growth, 0.0, None), False
    # The same turn kernels as the forecast (terms.tool.next_turn): cut by a pending update,
    # a queued request's turn from when the queue model finishes its prefill, each
    # request's tool call with its turn's tool share.
    back, _ = turn_kernels(hist, S, steps)
    pooled = hist.tool_fraction
    back = not_interrupted(update_steps(snap, hist, cfg), cfg, hist.cut_share)[:, None] * back
    chain = kernel(hist.decode, S, steps) @ back
    extra = max(hist.output.value, 0.0)
    if len(snap.decode_elapsed):
        q = hist.decode.bucket_table(clean(snap.decode_elapsed), S, steps) @ back
        q = q * (snap.tool_share("decode_turn", "decode_elapsed", pooled) * ends_normally(snap, hist))[:, None]
        yield q, clean(snap.decode_prompt) + extra + clean(snap.decode_growth), False
    elapsed, prompt, _, weight = requeue_rows(snap, hist)  # as terms.update.requeues
    if len(elapsed):
        yield hist.requeue.bucket_table(elapsed, S, steps) * weight[:, None], prompt, False
    since = np.concatenate((np.asarray(snap.ready_since, float), np.asarray(snap.inflight_since, float)))
    if len(since):
        pmf_in, pmf_rd = known_queue(snap).finish_steps(S, steps)
        q = np.concatenate((pmf_rd, pmf_in)) @ chain
        calls = np.concatenate((snap.tool_share("ready_turn", "ready_prompt", pooled), snap.tool_share("inflight_turn", "inflight_prompt", pooled)))
        q = q * calls[:, None]
        p = np.concatenate((clean(snap.ready_prompt), clean(snap.inflight_prompt)))
        g = np.concatenate((clean(snap.ready_growth), clean(snap.inflight_growth)))
        yield q, p + extra + g, False
    if len(snap.start_elapsed):
        elapsed = clean(snap.start_elapsed)
        prompt = np.clip(clean(snap.start_prompt) + hist.first_overhead.value, 0.0, None)
        mode = np.asarray(snap.start_mode)
        for m in range(START_MODES):
            sel = mode == m
            if sel.any():
                yield hist.start[m].bucket_table(elapsed[sel], S, steps), prompt[sel], False
    prompt = max(hist.first_prompt.value, 0.0)
    solo = np.asarray(snap.reward_cohort) < 0
    if len(snap.reward_elapsed) and solo.any():
        # Launches after completed rewards, placed by the learnt launch delay (members of
        # a cohort launch with it, not one by one).
        q = hist.reward.bucket_table(clean(snap.reward_elapsed)[solo], S, steps) @ kernel(hist.launch, S, steps)
        lam = np.clip(np.nan_to_num(q), 0.0, 1.0).sum(axis=0) * hist.admit_rate * hist.launches_per_admitted
        yield lam[None, :], np.array([prompt]), True
    size, due = sync_batch(snap, hist, S, steps)
    if size > 0 and due.any():
        # The next sync batch comes in the window or it does not: one coin for all of it.
        yield due[None, :], np.array([size * prompt]), False


def prefill_sd(snap: Snapshot, hist: History, cfg: ForecastConfig) -> float:
    """Standard deviation of the window's predicted prefill arrivals (tokens)."""
    var = 0.0
    with np.errstate(all="ignore"):
        for q, x, count in _coin_flips(snap, hist, cfg):
            if count:
                var += float(np.clip(np.nan_to_num(q), 0.0, None).sum()) * float(x[0]) ** 2
            else:
                var += _var(q.sum(axis=1), x)
    return math.sqrt(var) if math.isfinite(var) and var > 0 else 0.0


def decode_sd(snap: Snapshot, hist: History, cfg: ForecastConfig, detail: AdmitDetail) -> float:
    """Standard deviation of the window's decode admissions (tokens).

    Each known request (queued or in prefill at t) is admitted with its probability w;
    each predicted arrival with q_i x alpha_k, alpha_k the share of the arrivals of
    sub-step k that the queue model admits by t + S (``AdmitDetail``, from the forecast).
    The same coin-flip reasoning as for prefill, and the same caveats; it also takes
    alpha as the same for every request of a sub-step (a short prompt is more likely
    through than a long one), and it leaves out the queue's own randomness.
    """
    alpha = np.asarray(detail.alpha, dtype=float)
    var = max(detail.known_var, 0.0)
    if len(alpha) != cfg.steps:
        return math.sqrt(var)
    with np.errstate(all="ignore"):
        for q, x, count in _coin_flips(snap, hist, cfg):
            if count:
                var += float((np.clip(np.nan_to_num(q), 0.0, None) * alpha).sum()) * float(x[0]) ** 2
            else:
                var += _var(q @ alpha, x)
    return math.sqrt(var) if math.isfinite(var) and var > 0 else 0.0
