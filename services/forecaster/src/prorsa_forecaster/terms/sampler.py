"""Sampler with reward (Appendix B.2): the first requests of trajectories launched in the
window.

Trajectories in Reward complete with q_i = Pr(T_rew < e_i + S | T_rew > e_i); the admitted
completions N_pass = p-hat x sum q_i launch f(N_pass) new trajectories (under ``replace``:
a learnt number per admitted completion), whose first requests come after the learnt
launch delay, each with the mean first prompt. A cohort (a sync batch, a GRPO group
under ``injection="group"``) launches its successor only once every member has finished.
A sync batch is announced (:func:`sync_batch`): its size from ``run.started``, its timing
from ``policy.updated`` or, once one has been seen, the training pause after the last
reward.
"""

from __future__ import annotations

import numpy as np

from ..config import ForecastConfig
from ..guards import clean
from ..history import History
from ..snapshot import START_DISPATCHED, Snapshot
from .common import class_sums, delay_pmf, kernel, rows, service_class
from .update import ends_normally


def term(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray) -> np.ndarray:
    """Expected first-request arrivals from new launches: loads (4, N_CLASSES, steps)."""
    steps, S = cfg.steps, cfg.horizon
    elapsed = clean(snap.reward_elapsed)
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
        rew_k = kernel(hist.reward, S, steps)
        stops = (1.0 - snap.tool_share("decode_turn", "decode_elapsed", hist.tool_fraction)) * ends_normally(snap, hist)
        finishing = hist.decode.weighted_steps(clean(snap.decode_elapsed), stops, S, steps) @ rew_k
    if solo.any() or finishing.any():
        # N_pass per sub-step, through f (replace: linear), then the launch delay.
        done = hist.reward.weighted_steps(elapsed[solo], np.ones(int(solo.sum())), S, steps)
        admitted = hist.admit_rate * (done + finishing)
        launches = hist.launches_per_admitted * admitted
        counts += np.convolve(launches, delay_pmf(hist.launch, S, steps))[:steps]

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
            counts += np.convolve(launches, delay_pmf(hist.cohort_launch, S, steps))[:steps]
    size, due = sync_batch(snap, hist, S, steps)
    counts += size * due
    counts = clean(counts)
    one = rows(snap, np.array([prompt]))
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
        due = due @ kernel(hist.sync_start, S, steps)
    else:
        return none
    return size, clean(due @ kernel(hist.start[START_DISPATCHED], S, steps))
