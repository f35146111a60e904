"""Empirical duration distributions, updated online, with a prior (Appendix B.2, B.3, B.5).

Every conditional probability the forecaster uses has the shape

    q = Pr(T < e + s | T > e)

for a duration ``T`` (reward computation, sandbox start-up, tool execution, ...) whose
elapsed part ``e`` is known. :class:`DurationModel` keeps the observed durations as a
histogram on a fixed logarithmic grid, so an observation is O(1), a query over 100k
trajectories is one vectorised interpolation, and memory does not grow with the run.

Before any history exists the model answers from a prior: ``prior_weight`` pseudo
observations of an exponential distribution with mean ``prior_mean`` (memoryless, so it
does not pretend to know the shape). Real observations outweigh it quickly. Older
observations can be forgotten geometrically (``half_life``, counted in observations) so
that the distribution follows a workload that drifts during the run.
"""

from __future__ import annotations

import math
from array import array

import numpy as np

from .frailty import THETA_MAX, THETA_STEP

# Grid: 0, then log-spaced from 1 ms to ~28 hours, 1% per bin. Durations beyond the last
# edge are clamped to it (they still count as "longer than everything else"). An
# observation is spread evenly over its bin, so the bin width is how sharp a duration
# can be: the training step and the weight sync of an RL run take nearly the same time
# every step, and an 8% bin would spread a 30 s step over +-1.2 s, which moves a sync
# batch's launch across a window edge.
_EDGES = np.concatenate(([0.0], np.geomspace(1e-3, 1e5, 1921)))
_EPS = 1e-12
# Elapsed-time buckets for the aggregated queries: 0..10 ms exact-ish, then ~2% wide.
_BUCKETS = np.concatenate(([0.0], np.geomspace(1e-2, 1e6, 800)))
_LOG_STEP = math.log(_BUCKETS[2] / _BUCKETS[1])
_EDGE_LOG_STEP = math.log(_EDGES[2] / _EDGES[1])
# Where interp_edges takes the closed form: between np.interp's 76 us and its 112 us at
# 4,000 values and 493 us against 194 us at 8,000 (one timing loop on 2 CPU cores,
# test_survival checks the two agree).
_CLOSED_FORM_SIZE = 6000


def interp_edges(x: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``np.interp(x, _EDGES, values)``; on a large array the bin is found in closed form
    on the log grid rather than by a search (3x faster at 16k values; on small arrays
    the search wins: ``_CLOSED_FORM_SIZE``). NaN -> NaN."""
    x = np.asarray(x, dtype=float)
    if x.size < _CLOSED_FORM_SIZE:
        return np.interp(x, _EDGES, values)
    c = np.clip(x, 0.0, _EDGES[-1])
    with np.errstate(divide="ignore", invalid="ignore"):
        i = np.floor(np.log(np.maximum(c, 1e-300) / _EDGES[1]) / _EDGE_LOG_STEP).astype(np.int64) + 1
    i = np.clip(np.where(c < _EDGES[1], 0, i), 0, len(_EDGES) - 2)
    # The log may land a value next to its bin's edge in the neighbouring bin: step back or on.
    i = np.where((c < _EDGES[i]) & (i > 0), i - 1, i)
    i = np.where((c > _EDGES[i + 1]) & (i < len(_EDGES) - 2), i + 1, i)
    lo, hi = _EDGES[i], _EDGES[i + 1]
    frac = (c - lo) / (hi - lo)
    out = values[i] + frac * (values[i + 1] - values[i])
    return np.where(np.isnan(x), np.nan, out)


def bucket_of(elapsed: np.ndarray) -> np.ndarray:
    """Index of the nearest bucket (in log terms) for each elapsed time (non-finite -> 0)."""
    e = np.nan_to_num(np.asarray(elapsed, dtype=float), nan=0.0, posinf=1e6, neginf=0.0)
    e = np.clip(e, 0.0, 1e6)
    with np.errstate(divide="ignore"):
        k = np.rint(np.log(np.maximum(e, 1e-300) / 1e-2) / _LOG_STEP).astype(np.int64) + 1
    k = np.clip(k, 0, len(_BUCKETS) - 1)
    return np.where(e < 5e-3, 0, np.maximum(k, 1))


def _cells(elapsed: np.ndarray, theta: np.ndarray | None) -> tuple[np.ndarray, int]:
    """Cells of (elapsed bucket on the time scale exp(-theta), theta quantised to
    ``frailty.THETA_STEP``) for durations ``T0 exp(theta)``: ``(cell per row, levels of
    theta)``; a cell is ``bucket * levels + level``. Without ``theta``, the buckets
    (one level)."""
    if theta is None:
        return bucket_of(elapsed), 1
    half = int(round(THETA_MAX / THETA_STEP))
    q = np.clip(np.rint(np.nan_to_num(np.asarray(theta, dtype=float)) / THETA_STEP), -half, half).astype(np.int64)
    scaled = np.asarray(elapsed, dtype=float) * np.exp(-q * THETA_STEP)
    return bucket_of(scaled) * (2 * half + 1) + (q + half), 2 * half + 1


# Groups up to which weighted_steps sums densely over every (bucket, group) (CHOICE: the
# service classes alone; the effects' levels x classes are hundreds of groups).
_DENSE_GROUPS = 16


def compress(cells: np.ndarray, ncells: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(cells, return_inverse=True)`` for cells in ``0..ncells-1``, without a
    sort: O(n + ncells)."""
    present = np.zeros(ncells, dtype=bool)
    present[cells] = True
    used = np.flatnonzero(present)
    lookup = np.zeros(ncells, dtype=np.int64)
    lookup[used] = np.arange(len(used))
    return used, lookup[cells]


def _cell_scale(cells: np.ndarray, levels: int) -> np.ndarray:
    """exp(-theta) of each cell of :func:`_cells`."""
    return np.exp(-(cells % levels - levels // 2) * THETA_STEP)


# The recent cure rate is shrunk towards the whole run's by this many pseudo calls (CHOICE,
# the forecaster's other shares use 20 too: cache_same_pseudo, tool_turn_pseudo): a sync
# step's tail holds a few calls, open long past the learnt durations though they will
# return, and a handful of recent calls alone would take them for calls that never do.
CURE_PRIOR_CALLS = 20.0


def _cure_em(ended: float, n_at: np.ndarray, surv: np.ndarray, prior: tuple[float, float] = (0.0, 1.0)) -> float:
    """The cure rate's EM, the fixed point of p = (E + m p0 + sum_j n_j pi_j(p)) / (E +
    m + sum_j n_j): E ended durations, n_j open ones at survival s_j (if they will end)
    with pi_j(p) = p s_j / (p s_j + 1 - p), and m pseudo durations ending with
    probability p0 (``prior = (m, p0)``). It starts from p = 0.5: p = 1 is a fixed point
    too (nothing open is ever taken for a duration that never ends), the wrong one
    whenever some open durations are long past the learnt ones."""
    m, p0 = prior
    total = ended + m + float(n_at.sum())
    if total <= 0:
        return 1.0
    p = 0.5
    for _ in range(100):
        never = (1.0 - p) / (p * surv + 1.0 - p)
        p_new = (ended + m * p0 + float((n_at * (1.0 - never)).sum())) / total
        if abs(p_new - p) < 1e-7:
            return p_new
        p = p_new
    return p


class DurationModel:
    """Online empirical distribution of one kind of duration (seconds)."""

    __slots__ = ("name", "_counts", "_prior", "_prior_weight", "_cum", "_weight", "_decay", "_n", "_sum", "_max",
                 "_memory", "_starts")

    def __init__(
        self,
        name: str,
        prior_mean: float,
        prior_weight: float = 3.0,
        half_life: float | None = None,
        cure_memory: float = 0.0,
    ) -> None:
        if not (math.isfinite(prior_mean) and prior_mean > 0):
            raise ValueError(f"{name}: prior_mean must be a positive finite number, got {prior_mean!r}")
        if not (math.isfinite(prior_weight) and prior_weight >= 0):
            raise ValueError(f"{name}: prior_weight must be >= 0, got {prior_weight!r}")
        if half_life is not None and not half_life > 0:
            raise ValueError(f"{name}: half_life must be > 0 observations, got {half_life!r}")
        if not (math.isfinite(cure_memory) and cure_memory >= 0):
            raise ValueError(f"{name}: cure_memory must be >= 0 (multiples of the q90), got {cure_memory!r}")
        self.name = name
        # Prior mass per bin: exponential CDF differences over the grid.
        cdf = 1.0 - np.exp(-_EDGES / prior_mean)
        cdf[-1] = 1.0
        self._prior = np.diff(cdf)
        self._prior_weight = prior_weight
        self._counts = np.zeros_like(self._prior)
        self._weight = 1.0
        self._decay = 2.0 ** (1.0 / half_life) if half_life else 1.0
        self._n = 0
        self._sum = 0.0
        self._max = 0.0
        self._cum: np.ndarray | None = None
        # The cure rate's memory (``returning``): the start times of the ended durations,
        # kept only when the memory is on and the caller says when each one ended.
        self._memory = float(cure_memory)
        self._starts = array("d")

    # -- learning ---------------------------------------------------------------------
    def observe(self, duration: float, at: float | None = None) -> None:
        """Add one observed duration (negative or non-finite values are ignored); ``at``,
        when it ended (event time), dates it for the cure rate's memory."""
        if not (duration >= 0.0 and math.isfinite(duration)):
            return
        if self._memory and at is not None and math.isfinite(at):
            self._starts.append(at - duration)
            if len(self._starts) >= 4096 and len(self._starts) & (len(self._starts) - 1) == 0:
                # At each power of two, so that a run that never asks (no call ever open
                # at a window) keeps only the starts that still weigh.
                self._recent_ends(at, self._memory * max(self.quantile(0.9), 1e-3))
        i = int(np.searchsorted(_EDGES, duration, side="right")) - 1
        i = min(max(i, 0), len(self._counts) - 1)
        # Forgetting without touching every bin: newer observations weigh more; rescale
        # once the weights grow large.
        self._weight *= self._decay
        if self._weight > 1e100:
            self._counts /= self._weight
            self._weight = 1.0
        self._counts[i] += self._weight
        self._n += 1
        self._sum += duration
        self._max = max(self._max, duration)
        self._cum = None

    @property
    def count(self) -> int:
        """How many real observations were made (the prior not included)."""
        return self._n

    @property
    def observed_mean(self) -> float | None:
        return self._sum / self._n if self._n else None

    def _mass(self) -> np.ndarray:
        """Mass per bin: the observations plus the prior, which stands in for
        ``prior_weight / (1 + n)`` observations (at the current forgetting scale). A
        fixed pseudo-count would keep a broad prior's tail in every answer about a
        duration seen once per step (training, the weight sync): after 7 such
        observations a 3-observation exponential prior still took 10% of the mass past
        the elapsed time."""
        return self._counts + self._prior * (self._prior_weight * self._weight / (1.0 + self._n))

    def mean(self) -> float:
        """Mean of the current distribution (prior included), bin mid-points."""
        mids = np.concatenate(([_EDGES[1] / 2], np.sqrt(_EDGES[1:-1] * _EDGES[2:])))
        mass = self._mass()
        total = mass.sum()
        return float((mass * mids).sum() / total) if total > 0 else 0.0

    # -- queries ---------------------------------------------------------------------
    def _cumulative(self) -> np.ndarray:
        if self._cum is None:
            cum = np.concatenate(([0.0], np.cumsum(self._mass())))
            self._cum = cum / cum[-1] if cum[-1] > 0 else cum
        return self._cum

    def cdf(self, x: np.ndarray | float) -> np.ndarray:
        """Pr(T <= x), linear within a bin."""
        return interp_edges(x, self._cumulative())

    def conditional_steps(self, elapsed: np.ndarray, horizon: float, steps: int) -> np.ndarray:
        """Pr(T in [e + k h, e + (k+1) h) | T > e) for k < steps, h = horizon / steps.

        Returns an array of shape ``(len(elapsed), steps)``; each row sums to
        Pr(T < e + horizon | T > e). When the elapsed time is past (almost) all observed
        mass, the empirical conditional is undefined; we then assume the remaining time is
        as long again as the elapsed time (a Lindy-style tail: hazard 1/e), which keeps
        long-running outliers contributing a little rather than nothing or everything.
        """
        e = np.nan_to_num(np.asarray(elapsed, dtype=float), nan=0.0, posinf=_EDGES[-1])
        e = np.clip(e, 0.0, None)
        # ``horizon`` may be one per row (a time scale per row: frailty.py).
        h = np.broadcast_to(np.asarray(horizon, dtype=float), e.shape)[:, None]
        edges = h * np.linspace(0.0, 1.0, steps + 1)[None, :]
        grid = e[:, None] + edges
        cdf = interp_edges(grid, self._cumulative())
        surv0 = 1.0 - cdf[:, :1]
        with np.errstate(divide="ignore", invalid="ignore"):
            steps_p = np.diff(cdf, axis=1) / surv0
        tail = surv0[:, 0] < 1e-6
        if tail.any():
            # Exponential with mean max(e, horizon): hazard-based fallback.
            mean = np.maximum(e[tail][:, None], h[tail])
            steps_p[tail] = np.diff(1.0 - np.exp(-edges[tail] / mean), axis=1)
        return np.clip(np.nan_to_num(steps_p, nan=0.0, posinf=0.0, neginf=0.0), 0.0, 1.0)

    def weighted_steps(
        self,
        elapsed: np.ndarray,
        weights: np.ndarray,
        horizon: float,
        steps: int,
        groups: np.ndarray | None = None,
        ngroups: int = 1,
        theta: np.ndarray | None = None,
    ) -> np.ndarray:
        """sum_i w_i * conditional_steps(e_i) for one or more weight columns, in O(n).

        Elapsed times are bucketed on a fine logarithmic grid (about 2% wide; exact below
        10 ms), the weights summed per bucket, and the conditional evaluated once per
        bucket: this is what keeps a window over 100k trajectories in milliseconds.
        ``weights`` is ``(n,)`` or ``(n, k)``; the result is ``(steps,)`` or ``(k, steps)``.
        With ``groups`` (an int in 0..ngroups-1 per row) the sums are kept apart per
        group: the result is ``(k, ngroups, steps)`` (or ``(ngroups, steps)``).

        With ``theta``, row i's duration is ``T0 exp(theta_i)`` (an accelerated failure
        time per row, :mod:`~prorsa_forecaster.frailty`), this model being T0's: its
        conditional is taken at ``e_i exp(-theta_i)`` over ``horizon exp(-theta_i)``,
        with theta quantised to ``THETA_STEP`` (a cell per bucket and level).
        """
        cells, nq = _cells(elapsed, theta)
        g = 1 if groups is None else max(int(ngroups), 1)
        grp = 0 if groups is None else np.clip(np.asarray(groups, dtype=np.int64), 0, g - 1)
        w = np.asarray(weights, dtype=float)
        one = w.ndim == 1
        w2 = w[:, None] if one else w
        k = w2.shape[1]
        ncells = len(_BUCKETS) * nq
        if nq == 1 and g <= _DENSE_GROUPS:
            # Dense: a bincount over every (bucket, group) is cheaper than finding the used ones.
            sums = np.stack([np.bincount(cells * g + grp, weights=w2[:, j], minlength=ncells * g) for j in range(k)])
            sums = sums.reshape(k, ncells, g)
            used = np.flatnonzero(sums.any(axis=(0, 2)))
            if len(used) == 0:
                out = np.zeros((k, g, steps))
            else:  # (k, g, u) @ (u, steps)
                out = np.ascontiguousarray(sums[:, used, :].transpose(0, 2, 1)) @ self._cell_table(used, nq, horizon, steps)
        else:
            # Sparse: of the (bucket, theta level) cells x groups a window uses a few thousand
            # (801 x 81 cells with theta; hundreds of groups of effect levels x classes).
            keys, inv = compress(grp * ncells + cells, ncells * g)  # group-major: each group's keys in a run
            sums = np.stack([np.bincount(inv, weights=w2[:, j], minlength=len(keys)) for j in range(k)])
            used, at = compress(keys % ncells, ncells)
            part = sums[:, :, None] * self._cell_table(used, nq, horizon, steps)[at][None]  # (k, keys, steps)
            group = keys // ncells
            starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
            out = np.zeros((k, g, steps))
            if len(keys):
                out[:, group[starts], :] = np.add.reduceat(part, starts, axis=1)
        if groups is None:
            out = out[:, 0, :]
        return out[0] if one else out

    def bucket_table(self, elapsed: np.ndarray, horizon: float, steps: int,
                     theta: np.ndarray | None = None) -> np.ndarray:
        """conditional_steps for each element via the bucket grid: ``(n, steps)``; with
        ``theta``, for durations ``T0 exp(theta_i)`` as in :meth:`weighted_steps`."""
        cells, nq = _cells(elapsed, theta)
        used, inv = compress(cells, len(_BUCKETS) * nq)
        return self._cell_table(used, nq, horizon, steps)[inv]

    def _cell_table(self, cells: np.ndarray, levels: int, horizon: float, steps: int) -> np.ndarray:
        """conditional_steps at each cell of :func:`_cells`: ``(len(cells), steps)``."""
        return self.conditional_steps(_BUCKETS[cells // levels], horizon * _cell_scale(cells, levels), steps)

    def conditional(self, elapsed: np.ndarray, horizon: float) -> np.ndarray:
        """Pr(T < e + horizon | T > e), vectorised over ``elapsed``."""
        return np.clip(self.conditional_steps(elapsed, horizon, 1)[:, 0], 0.0, 1.0)

    def within(self, limits: np.ndarray) -> np.ndarray:
        """Pr(T < limit) for fresh durations (elapsed 0), vectorised."""
        return np.clip(self.cdf(np.clip(np.asarray(limits, dtype=float), 0.0, None)), 0.0, 1.0)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the current distribution (prior included)."""
        return float(np.interp(q, self._cumulative(), _EDGES))

    def returning(self, open_elapsed: np.ndarray, now: float | None = None) -> tuple[float, np.ndarray]:
        """For durations that may never end (a user who does not write again): ``(p,
        pi)``, the share of them that end at all and, per duration still open at
        ``open_elapsed``, the probability that it ends at all given that it has not yet.

        A cure-rate model: a duration ends with probability p, after the distribution
        learnt from those that did (this model); else never. p is its maximum-likelihood
        estimate given the ended ones (:attr:`count`, plus ``prior_weight`` pseudo ones)
        and the open ones, each of which is still running with probability S(e) = Pr(T >
        e) if it will end (EM over the open ages, bucketed). S has a Lindy floor past the
        learnt mass, 0.1 x q90 / e (hazard 1/e), so that a long call is not taken for one
        that never ends before many of its age have been seen not to. pi = p S / (p S +
        1 - p). With no open duration, or all of them young, p = 1 and pi = 1.

        With a memory (``cure_memory`` > 0, ``now`` given, ended durations observed with
        ``at``) each duration, ended or open, weighs exp(-(now - its start) / tau) in the
        estimate, tau = cure_memory x q90, and the whole run's p above stands for
        :data:`CURE_PRIOR_CALLS` more: p is the share of the recent starts that end, so it
        follows a share that drifts (a chat service whose users come back more often as
        the hour goes on), and a few recent calls do not outweigh the run. tau is a
        multiple of the q90 because whether a start ends is known only once most of
        those that do have: a shorter memory would weigh mostly starts whose outcome is
        still open."""
        e = np.nan_to_num(np.asarray(open_elapsed, dtype=float), nan=0.0, posinf=1e6)
        if len(e) == 0:
            return 1.0, np.ones(0)
        idx = bucket_of(e)
        counts = np.bincount(idx, minlength=len(_BUCKETS))
        used = np.flatnonzero(counts)
        ages, n_at = _BUCKETS[used], counts[used].astype(float)
        q90 = max(self.quantile(0.9), 1e-3)
        surv = np.maximum(1.0 - self.cdf(ages), np.minimum(1.0, 0.1 * q90 / np.maximum(ages, 1e-9)))
        p = _cure_em(self._n + self._prior_weight, n_at, surv)
        if self._memory > 0 and now is not None and math.isfinite(now):
            tau = self._memory * q90
            p = _cure_em(self._recent_ends(now, tau), n_at * np.exp(-ages / tau), surv, prior=(CURE_PRIOR_CALLS, p))
        table = np.ones(len(_BUCKETS))
        table[used] = np.clip(p * surv / np.maximum(p * surv + 1.0 - p, 1e-300), 0.0, 1.0)
        return float(p), table[idx]

    def _recent_ends(self, now: float, tau: float) -> float:
        """sum over the dated ended durations of exp(-(now - start) / tau). Starts whose
        weight is below 1e-12 are dropped once they are more than half of them, so the
        memory holds about the last 28 tau of starts, not the whole run."""
        if not len(self._starts):
            return 0.0
        w = np.exp(-np.clip(now - np.frombuffer(self._starts, dtype=float), 0.0, None) / tau)
        keep = w > 1e-12
        if len(self._starts) > 1024 and 2 * int(keep.sum()) < len(self._starts):
            self._starts = array("d", np.frombuffer(self._starts, dtype=float)[keep].tobytes())
        return float(w[keep].sum())

    def __repr__(self) -> str:
        return f"DurationModel({self.name!r}, n={self._n}, mean={self.mean():.3g}s)"
