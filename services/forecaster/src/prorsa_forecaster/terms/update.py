"""A weight update that may land in the window, and the re-prefills of the requests an
abort cut short (beyond the paper's terms).

Once an async run's update is triggered (a batch of admitted samples is in) the learnt
trigger -> ``policy.updated`` delay gives Pr(it lands in sub-step k). When it lands
prefill pauses for the weight sync and every cache is flushed (the decode admissions'
mixture, :mod:`.decode_admit`), and each decoding request is aborted with the learnt share
of the decodes under way at an update that it aborts (``History.cut_share``): 1 for a
framework that aborts them and re-sends their context (slime's and AReaL's default,
SGLang's ``pause_generation`` in ``abort`` mode), near 0 for one that pauses in place or
retracts them inside the engine (``in_place``, ``retract``), where they go on after the
sync. An aborted request is re-queued with its context (the re-prefill term) and its turn
ends without a tool call.

Once it has landed, the aborted requests come back when the framework re-sends them
(:func:`requeues`): at once (the demo's driver: the paused engines hold them until they
resume) or once generation continues, so a window can open between an abort and its
re-send, or between ``policy.updated`` and the aborts it brings (a framework that
publishes the update, then pauses its engines). Each aborted trajectory re-queues with the
learnt share and the learnt abort -> re-queue delay; a decode under way when the update
landed and not yet ended is cut with the learnt share of such decodes that ended in an
abort (:func:`ends_normally`), and re-queued the same way.
"""

from __future__ import annotations

import numpy as np

from ..config import ForecastConfig
from ..guards import clean
from ..history import History
from ..snapshot import Snapshot
from .common import N_CLASSES, class_sums, rows, service_class, spread


def update_steps(snap: Snapshot, hist: History, cfg: ForecastConfig) -> np.ndarray:
    """Pr(the pending weight update lands in sub-step k), k = 0..steps-1: from the learnt
    trigger -> policy.updated delay, once the update is triggered (zeros otherwise).

    Before any trigger -> update delay is observed the prior alone spreads the update
    over many windows and does more harm than good: zeros until then. (From the first
    observation on it pays: on 10-step general-agent logs, requiring two left the second
    update's re-prefill unforecast, 0.1-0.3 points of prefill WAPE.)"""
    e = snap.update_elapsed
    if not np.isfinite(e) or hist.train.count < 1:
        return np.zeros(cfg.steps)
    return clean(hist.train.conditional_steps(np.array([max(e, 0.0)]), cfg.horizon, cfg.steps)[0])


def not_interrupted(update: np.ndarray, cfg: ForecastConfig, share: float) -> np.ndarray:
    """Per sub-step: Pr(no abort by a weight update before a decode that ends mid-sub-step).

    A weight update aborts a decoding request with the learnt share ``share``
    (``History.cut_share``; it re-prefills after the pause and decodes the rest of its
    answer), so a turn that would have ended after the update does not end, and its tool
    call and return do not happen, in the window."""
    if not update.any():
        return np.ones(cfg.steps)
    before = np.cumsum(update) - 0.5 * update
    return np.clip(1.0 - share * before, 0.0, 1.0)


def reprefill_loads(snap: Snapshot, hist: History, cost: np.ndarray, update: np.ndarray) -> np.ndarray:
    """Beyond the paper's components: a weight update aborts each decoding request with the
    learnt share (``History.cut_share``) and re-queues it with its context (prompt +
    partial output). Forecast only once the update is triggered (a batch of admitted
    samples is in), with ``update`` = Pr(update in sub-step k) from the learnt trigger ->
    policy.updated delay (:func:`update_steps`); the decoding set at t stands in for the
    set at the update. Returns the re-prefills' loads per service class if the update
    lands, ``(4, N_CLASSES)``: times ``update`` per sub-step, the forecast term."""
    if not update.any() or len(snap.decode_prompt) == 0:
        return np.zeros((4, N_CLASSES))
    load = rows(snap, reprefill_prompt(snap.decode_prompt, hist))  # the update flushed every cache: no prefix
    return clean(class_sums(load, service_class(load, cost)) * hist.cut_share)


def reprefill_prompt(prompt, hist: History) -> np.ndarray:
    """The prompt a decode cut short by an abort re-prefills: its prompt plus half the
    mean answer (what it had made by then, on average)."""
    return clean(prompt) + 0.5 * max(hist.output.value, 0.0)


def cut_by_update(snap: Snapshot) -> np.ndarray:
    """Per decoding request: whether it was under way when the last weight update
    landed (its decode began before ``policy.updated``)."""
    since = snap.since_update
    if not np.isfinite(since) or len(snap.decode_elapsed) == 0:
        return np.zeros(len(snap.decode_elapsed), dtype=bool)
    return clean(snap.decode_elapsed) > since


def ends_normally(snap: Snapshot, hist: History) -> np.ndarray:
    """Per decoding request: the probability that its decode ends as a turn (a tool call
    or a stop) rather than in an abort: 1, or for one under way when the last update
    landed and not aborted yet, 1 - the learnt share of such decodes aborted."""
    return np.where(cut_by_update(snap), 1.0 - hist.cut_share, 1.0)


def requeue_rows(snap: Snapshot, hist: History) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The requests an abort cut short and not re-queued yet, one row each: ``(elapsed,
    prompt, cached prefix, weight)``. An aborted trajectory re-queues its context (the
    seconds since its abort, the prefix a hit would find), with the learnt share that
    re-queue; a decode under way when the last update landed and still running is taken
    as aborted now (elapsed 0) with the learnt share of such decodes aborted, and
    re-queued the same way with :func:`reprefill_prompt` and no prefix (the update
    flushed the caches)."""
    share = hist.requeue_share
    cut = cut_by_update(snap)
    n_ab, n_cut = len(snap.aborted_elapsed), int(cut.sum())
    elapsed = np.concatenate((clean(snap.aborted_elapsed), np.zeros(n_cut)))
    prompt = np.concatenate((clean(snap.aborted_context), reprefill_prompt(np.asarray(snap.decode_prompt)[cut], hist)))
    prefix = np.concatenate((snap.column("aborted_cached", "aborted_elapsed"), np.zeros(n_cut)))
    weight = np.concatenate((np.full(n_ab, share), np.full(n_cut, share * hist.cut_share)))
    return elapsed, prompt, prefix, weight


def requeues(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray) -> np.ndarray:
    """The re-queued requests of trajectories whose decode an abort cut short
    (:func:`requeue_rows`), after the learnt abort -> re-queue delay conditioned on the
    time since the abort: loads ``(4, N_CLASSES, steps)``."""
    elapsed, prompt, prefix, weight = requeue_rows(snap, hist)
    if len(elapsed) == 0:
        return np.zeros((4, N_CLASSES, cfg.steps))
    return spread(hist.requeue, elapsed, prompt, prefix, snap, cost, cfg, weight)
