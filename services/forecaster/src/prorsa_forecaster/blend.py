"""Never worse than a naive predictor: the lifecycle forecast blended online with them.

The lifecycle forecast (Appendix B) knows what each live trajectory will do next, but not
what its view of the rollout leaves out: trajectories nobody announced (a serving trace's
requests, an open-loop generator), a workload whose durations it has not learnt yet, a
window much longer than a turn. Beside it the forecaster runs the naive predictors on the
same windows (the ones `prorsa forecast-eval` scores it against: last value, EMA, a
local-level Kalman filter), and every forecast it publishes is a weighted average of them
all, the weights following each one's running WAPE (:class:`Blend`), plus the lifecycle
forecast shrunk by the factor that minimises its past WAPE (:class:`WapeScale`). The
arrivals of new trajectories, which only the sampler term and an announced batch explain,
get the same treatment on their own series (:class:`NewArrivals`): the sampler term beside
the naive predictors of those arrivals, so that what the lifecycle view does not explain
(a serving trace's requests, an open-loop generator) is forecast as a time series.

Why a weighted average is safe: WAPE is a sum of absolute errors, which is convex, so the
average's error in a window is at most the same average of the predictors' errors; with
weights that concentrate on the one whose running WAPE is lowest, the blend's running
WAPE stays within a small margin of the best predictor's (exponential weights, Hedge).
"""

from __future__ import annotations

import math

import numpy as np

from .baselines import make_baselines
from .guards import BIG, clean

LIFECYCLE = "lifecycle"
SCALED = "lifecycle_scaled"
NAIVE = tuple(b.name for b in make_baselines())  # last_value, ema, kalman

ETA = 1.0
"""CHOICE: sharpness of the weights. A predictor whose score (:meth:`Blend.scores`) is
higher by 1 than the best one's, one average window's worth of absolute error more (1
point of running WAPE over 100 windows), weighs exp(-1) = 37% of it; by 5, 0.7%. Chosen
on the Azure code trace, a 2-step sync simulator log at S = 50 s and the simulator logs
(docs/forecaster.md): sharper weights follow the predictor that led so far, and pay
when the lead changes hands."""

HEAD_START = 1.0
"""CHOICE: the other predictors start one window's worth of error behind the lifecycle
forecast. Until a window has closed they know nothing (the naive ones predict 0) and the
forecast is the lifecycle one alone."""


class Blend:
    """Exponential weights over predictors on one series, from their running WAPE.

    Each predictor's score is its cumulative absolute error divided by the mean actual
    per window so far, i.e. n x (its running WAPE) after n windows: the error in units of
    an average window. The weights are ``exp(-ETA x (score - best score))``, normalised.
    """

    __slots__ = ("names", "err", "actual", "windows", "head")

    def __init__(self, names: tuple[str, ...], head_start: float = HEAD_START) -> None:
        self.names = names
        self.err = np.zeros(len(names))
        self.actual = 0.0
        self.windows = 0
        self.head = np.array([0.0 if i == 0 else head_start for i in range(len(names))])

    def scores(self) -> np.ndarray:
        if self.actual <= 0 or self.windows == 0:
            return self.head.copy()
        return self.err / (self.actual / self.windows) + self.head

    def weights(self) -> np.ndarray:
        if self.windows == 0:
            return np.eye(len(self.names))[0]  # the others know nothing yet
        s = self.scores()
        w = np.exp(-ETA * (s - s.min()))
        return w / w.sum()

    def update(self, forecasts, actual: float) -> None:
        """One closed window: each predictor's forecast for it and what happened."""
        actual = _actual(actual)
        if actual is None:
            return
        self.err += np.abs(_clean(forecasts) - actual)
        self.actual += actual
        self.windows += 1

    def named(self) -> dict[str, float]:
        return {n: min(max(float(w), 0.0), 1.0) for n, w in zip(self.names, self.weights())}


def _clean(x) -> np.ndarray:
    return clean(x)  # non-finite -> 0, within [0, 1e12]


def _actual(a: float) -> float | None:
    """A window's actual as the blends take it (None: not a number of tokens)."""
    return min(float(a), BIG) if math.isfinite(a) and a >= 0 else None


class WapeScale:
    """The factor k <= 1 that minimises sum |k f - a| over the closed windows: the
    weighted median of a / f, each window weighted by its forecast f.

    The lifecycle forecast is an expectation; under absolute error the best forecast is
    the median, which is lower where the windows' demand is skewed (bursts between idle
    windows: a serving trace). The bias correctors already take out a steady mean error,
    so this one only shrinks (CHOICE). The ratios are kept on a log grid of 1.7% bins
    from 1e-3 to 1 (0 and >= 1 in bins of their own), so an update is O(1).
    """

    EDGES = np.geomspace(1e-3, 1.0, 401)
    MIN_WINDOWS = 5  # CHOICE: a median of fewer windows is mostly noise

    __slots__ = ("mass", "windows")

    def __init__(self) -> None:
        self.mass = np.zeros(len(self.EDGES) + 1)  # [r < 1e-3, bins..., r >= 1]
        self.windows = 0

    def update(self, forecast: float, actual: float) -> None:
        forecast, actual = float(_clean(forecast)), _actual(actual)
        if actual is None or forecast <= 0:
            return
        self.mass[int(np.searchsorted(self.EDGES, actual / forecast, side="right"))] += forecast
        self.windows += 1

    @property
    def factor(self) -> float:
        if self.windows < self.MIN_WINDOWS:
            return 1.0
        cum = np.cumsum(self.mass)
        i = int(np.searchsorted(cum, 0.5 * cum[-1]))
        if i == 0:
            return 0.0
        if i >= len(self.EDGES):
            return 1.0
        return float(np.sqrt(self.EDGES[i - 1] * self.EDGES[i]))


class SeriesBlend:
    """One series: the lifecycle forecast, the same times its :class:`WapeScale`, and the
    naive predictors of the series."""

    def __init__(self) -> None:
        self.naive = make_baselines()
        self.scale = WapeScale()
        self.blend = Blend((LIFECYCLE, SCALED, *NAIVE))

    def forecasts(self, lifecycle: float) -> list[float]:
        f = float(_clean(lifecycle))
        return [f, f * self.scale.factor, *(b.predict() for b in self.naive)]

    def combine(self, lifecycle: float) -> float:
        """The published forecast: the weighted average of every predictor's."""
        return float(self.blend.weights() @ _clean(self.forecasts(lifecycle)))

    def close(self, lifecycle: float, actual: float) -> None:
        """A window closed: score every predictor on it, then let each learn from it."""
        a = _actual(actual)
        if a is None:
            return
        self.blend.update(self.forecasts(lifecycle), a)
        self.scale.update(lifecycle, a)
        for b in self.naive:
            b.observe(a)


class NewArrivals:
    """Arrivals of trajectories not live at t (launched in the window, or never announced):
    the sampler term (launches after rewards, an announced sync batch) beside the naive
    predictors of this series, blended like the totals."""

    def __init__(self) -> None:
        self.naive = make_baselines()
        self.blend = Blend((LIFECYCLE, *NAIVE))

    def split(self) -> tuple[float, float]:
        """``(w, level)``: the sampler term counts with weight w, and the naive
        predictors add ``level`` tokens (their weighted forecasts)."""
        w = self.blend.weights()
        level = float(w[1:] @ _clean([b.predict() for b in self.naive]))
        return float(w[0]), level

    def close(self, lifecycle: float, actual: float) -> None:
        a = _actual(actual)
        if a is None:
            return
        self.blend.update([lifecycle, *(b.predict() for b in self.naive)], a)
        for b in self.naive:
            b.observe(a)
