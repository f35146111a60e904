"""Online correction (Appendix B.8) and the robust blend: everything the forecast learns
from the windows that have closed.

* **Per-source bias** (:class:`BiasCorrector`): each predicted source (sampler, sandbox,
  tool, re-prefill) is scaled by the ratio of realised to predicted over closed windows
  (half-life ``bias_half_life``), learnt from the arrivals of the trajectories that were
  in that source's state at t, each window's ratio clipped to [1/clip, clip] and a window
  beyond 4x either way left out (a miss, not a bias), shrunk towards 1 by
  ``bias_prior_windows`` windows of average volume at ratio 1.
* **The admitted share** of the predicted arrivals and **the decode forecast** each have
  a factor of the same kind that keeps only the part of its ratio standing out of its
  own noise. Both are learnt against what the queue model makes of the arrivals that
  actually came, not of the forecast ones: the arrival forecast's error is corrected
  where it is made (the source factors, the blend of new arrivals), and counting it in
  the decode factor too would correct it twice (on a ramp the factor would keep the
  ramp's miss for windows after the arrivals' level has caught up).
* **Never worse than a naive predictor** (:class:`SeriesBlend`, :class:`NewArrivals`):
  the lifecycle forecast (Appendix B) knows what each live trajectory will do next, but
  not what its view of the rollout leaves out: trajectories nobody announced (a serving
  trace's requests, an open-loop generator), a workload whose durations it has not learnt
  yet, a window much longer than a turn. Beside it the forecaster runs the naive
  predictors on the same windows (the ones ``prorsa forecast-eval`` scores it against:
  last value, EMA, a local-level Kalman filter), and what it publishes is a weighted
  average of them all, exponential weights on each one's cumulative error (:class:`Blend`),
  plus the lifecycle forecast shrunk by the factor that minimises its past WAPE
  (:class:`WapeScale`). The arrivals of new trajectories, which only the sampler term and
  an announced batch explain, get the same treatment on their own series: the sampler
  term beside the naive predictors of those arrivals, so that what the lifecycle view
  does not explain is forecast as a time series.

Why a weighted average is safe: WAPE is a sum of absolute errors, which is convex, so the
average's error in a window is at most the same average of the predictors' errors. The
weights are exponential weights (Hedge) whose rate is tuned by the evidence, so that the
published forecast's cumulative error exceeds the best predictor's by O(sqrt(n)) windows'
worth at most: its running WAPE converges to the best predictor's on any long log
(:class:`Blend`). Only windows that have closed are ever used.
"""

from __future__ import annotations

import math

import numpy as np

from ..baselines import make_baselines
from ..config import ForecastConfig
from ..guards import BIG, clean, finite_sum

SOURCES = ("sampler", "sandbox", "tool", "reprefill")
"""The predicted prefill sources, each with its own bias factor."""


class BiasCorrector:
    """Online multiplicative correction of the predicted (not observed) part of a forecast.

    After each window, ``update(predicted, realised)`` folds the window's residual into
    exponentially weighted sums; ``factor`` = realised / predicted over recent windows,
    clipped to [1/clip, clip]. It only ever uses windows that have closed, so a forecast
    for [t, t+S) is corrected by residuals of windows ending at or before t.
    """

    __slots__ = ("_num", "_den", "_sq", "_den2", "_eff", "_keep", "clip", "prior", "shrink", "windows")

    def __init__(self, half_life: float, clip: float, prior: float = 0.0, shrink: bool = False) -> None:
        self._keep = 0.5 ** (1.0 / half_life) if half_life > 0 else 0.0
        self._num = 0.0  # sum of w r
        self._den = 0.0  # sum of w
        self._sq = 0.0  # sum of w r^2
        self._den2 = 0.0  # sum of w^2 (weights decayed as they are: keep^2 per window)
        self._eff = 0.0  # the windows in the sums, weighted as they are
        self.clip = clip
        self.prior = prior
        self.shrink = shrink
        self.windows = 0

    @property
    def enabled(self) -> bool:
        return self._keep > 0

    # A window whose realised/predicted ratio is beyond this is a miss, not a bias (e.g.
    # the first wave of a sync step nothing announced): it is left out, so that one such
    # window cannot drive the factor to its clip for the windows after it.
    OUTLIER = 4.0

    def update(self, predicted: float, realised: float) -> None:
        if not self.enabled or not (math.isfinite(predicted) and math.isfinite(realised)):
            return
        if predicted <= 0 or realised <= 0:
            return
        r = realised / predicted
        if not (1.0 / self.OUTLIER <= r <= self.OUTLIER):
            return
        # Each window's ratio counts within the clip, weighted by its predicted volume.
        r = min(max(r, 1.0 / self.clip), self.clip)
        k = self._keep
        self._num = self._num * k + r * predicted
        self._den = self._den * k + predicted
        self._sq = self._sq * k + r * r * predicted
        self._den2 = self._den2 * k * k + predicted * predicted
        self._eff = self._eff * k + 1.0
        self.windows += 1

    @property
    def factor(self) -> float:
        if not self.enabled or self.windows < 2 or self._den <= 0:
            return 1.0
        w = self.prior * self._den / self._eff
        r = (self._num + w) / (self._den + w)
        if self.shrink:
            # The ratio is an average of noisy windows: its variance is the windows'
            # spread over their effective number (Kish). Only the part of r - 1 that
            # stands out of that noise is applied (gain b^2 / (b^2 + var), b^2 the squared
            # excess over the noise): a bias of 30% seen window after window is kept
            # whole, a 3% wobble of two noisy windows mostly is not.
            mean = self._num / self._den
            spread = max(self._sq / self._den - mean * mean, 0.0)
            var = spread * self._den2 / (self._den * self._den)
            b2 = max((r - 1.0) ** 2 - var, 0.0)
            r = 1.0 + (r - 1.0) * (b2 / (b2 + var) if b2 + var > 0 else 1.0)
        return float(min(max(r, 1.0 / self.clip), self.clip))


LIFECYCLE = "lifecycle"
SCALED = "lifecycle_scaled"
NAIVE = tuple(b.name for b in make_baselines())  # last_value, ema, kalman

HEAD_START = 2.0
"""CHOICE: the prior, in nats, of the first predictor (the lifecycle forecast; for new
trajectories' arrivals, the sampler term) over each other one: until the windows tell
them apart, each other predictor weighs exp(-2) = 14% of it. Before any window has closed
the naive predictors know nothing and the first one is all there is; after, a sync run's
step starts with a burst that last value copies into the next window, and the lifecycle
forecast keeps the weight through it. Evidence outweighs the prior once a predictor
leads by 2 / sqrt(8 ln N) of sqrt(V) (:class:`Blend`). Chosen by replaying
general/0/deepseek-v3.2 (docs/forecaster.md, a sync run) at 0, 1, 2 and 3 nats: prefill
WAPE 8.9%, 8.6%, 8.3%, 8.2%, decode 11.1%, 10.6%, 10.4%, 10.2%; on the Azure conversation
trace, whose lifecycle forecast is no better than Kalman's, decode 16.83%, 16.82%, 16.89%,
16.98% (Kalman: 16.79%): a larger prior keeps the weight on the first predictor longer."""


class Blend:
    """Exponential weights (Hedge) over predictors on one series, tuned by the evidence.

    After n closed windows predictor i has made the cumulative absolute error L_i; the
    window t's errors span r_t = max_i - min_i of them, and V = sum_t r_t^2. The weights
    are

        w_i ~ exp(-h_i - eta (L_i - min_j L_j)),   eta = sqrt(8 ln N / V),

    h_i the prior (``HEAD_START`` nats for every predictor but the first), N the number of
    predictors. Hedge's loss (the weighted average of the errors, which by convexity of the
    absolute error bounds the weighted average forecast's error) is at most
    ``L_i + h'_i / eta + eta V / 8`` for every i (Hoeffding's lemma on each window's range;
    h'_i = h_i + ln sum_j exp(-h_j)), and this eta is the one that minimises that bound
    for equal priors (h'_i = ln N), recomputed from the windows so far (CHOICE: the
    standard anytime tuning; it costs at most a constant factor, plus a term of the
    largest window's range, over knowing V in advance). The excess over the best
    predictor is then O(sqrt(V ln N)): with errors of rms range r over n windows of mean
    demand a, O((r / a) sqrt(ln N / n)) of WAPE, which vanishes on a long log.

    In units of running WAPE: a predictor whose running WAPE is d above the best one's
    weighs exp(-sqrt(8 ln N n) d a / r) of it, sharper as windows close and measured
    against the window-to-window spread of the errors, not the demand: near-ties (errors
    that differ by noise) keep comparable weights, whose average smooths the noise; a lead
    that stands out of the noise takes the weight. Scale-free (tokens cancel) and
    bounded: L_i - min L <= sqrt(n V), so the exponent is at most sqrt(8 ln N n).
    """

    __slots__ = ("names", "err", "spread", "windows", "head", "_gain")

    def __init__(self, names: tuple[str, ...], head_start: float = HEAD_START) -> None:
        self.names = names
        self.err = np.zeros(len(names))  # L_i, tokens
        self.spread = 0.0  # V, tokens^2
        self.windows = 0
        self.head = np.array([0.0 if i == 0 else head_start for i in range(len(names))])
        self._gain = math.sqrt(8.0 * math.log(len(names))) if len(names) > 1 else 0.0

    def log_weights(self) -> np.ndarray:
        """``-h_i - eta (L_i - min L)``: the prior plus the evidence, in nats."""
        root = math.sqrt(self.spread)
        if root <= 0 or not math.isfinite(root):  # no window has told them apart
            return -self.head
        return -self.head - self._gain * (self.err - self.err.min()) / root

    def weights(self) -> np.ndarray:
        if self.windows == 0:
            return np.eye(len(self.names))[0]  # the others know nothing yet
        lw = self.log_weights()
        w = np.exp(lw - lw.max())
        return w / w.sum()

    def update(self, forecasts, actual: float) -> None:
        """One closed window: each predictor's forecast for it and what happened."""
        actual = _actual(actual)
        if actual is None:
            return
        loss = np.abs(clean(forecasts) - actual)
        self.spread += float(np.ptp(loss)) ** 2  # r_t: the window's range of errors
        self.err += loss
        self.windows += 1

    def named(self) -> dict[str, float]:
        return {n: min(max(float(w), 0.0), 1.0) for n, w in zip(self.names, self.weights())}


def _actual(a: float) -> float | None:
    """A window's actual as the blends take it (None: not a number of tokens)."""
    return min(float(a), BIG) if math.isfinite(a) and a >= 0 else None


class WapeScale:
    """The factor k <= 1 that minimises sum |k f - a| over the closed windows: the
    weighted median of a / f, each window weighted by its forecast f (f and a: what was
    not known at t, forecast and actual).

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
        forecast, actual = float(clean(forecast)), _actual(actual)
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


UPDATE_WINDOWS = 2
"""Windows after a weight update (besides the one a pending update may land in) whose
blend is learnt apart (:class:`SeriesBlend`). CHOICE: on the simulator's async general
logs the forecast's error by window after an update (benchmarks/forecast_diagnostics.py)
is largest in the window the update lands in and the two after it, and there the naive
predictors carry the level from before the pause."""


class SeriesBlend:
    """One series: the lifecycle forecast, the same with its predicted part (what is not
    known at t: the backlog is) times its :class:`WapeScale`, and the naive predictors of
    the series.

    Two blends of them: one for the windows a weight update may land in or has just
    landed in (``around``: the engines pause, caches flush, decodes are aborted and
    re-queued, a sync run's next batch comes; the lifecycle forecast knows, the naive
    predictors carry the level from before), one for the rest. Each learns its weights
    from its own windows; the naive predictors see every window."""

    def __init__(self) -> None:
        self.naive = make_baselines()
        self.scale = WapeScale()
        self.blend = Blend((LIFECYCLE, SCALED, *NAIVE))
        self.around_update = Blend((LIFECYCLE, SCALED, *NAIVE))

    def pick(self, around: bool) -> Blend:
        """The blend of a window near a weight update (``around``) or of the others."""
        return self.around_update if around else self.blend

    def forecasts(self, lifecycle: float, known: float = 0.0) -> list[float]:
        f = float(clean(lifecycle))
        k = min(float(clean(known)), f)
        return [f, k + (f - k) * self.scale.factor, *(b.predict() for b in self.naive)]

    def combine(self, lifecycle: float, known: float = 0.0, around: bool = False) -> float:
        """The published forecast: the weighted average of every predictor's."""
        return float(self.pick(around).weights() @ clean(self.forecasts(lifecycle, known)))

    def close(self, lifecycle: float, actual: float, known: float = 0.0, around: bool = False) -> None:
        """A window closed: score every predictor on it, then let each learn from it."""
        a = _actual(actual)
        if a is None:
            return
        self.pick(around).update(self.forecasts(lifecycle, known), a)
        k = min(float(clean(known)), float(clean(lifecycle)))
        self.scale.update(float(clean(lifecycle)) - k, max(a - k, 0.0))
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
        level = float(w[1:] @ clean([b.predict() for b in self.naive]))
        return float(w[0]), level

    def close(self, lifecycle: float, actual: float) -> None:
        a = _actual(actual)
        if a is None:
            return
        self.blend.update([lifecycle, *(b.predict() for b in self.naive)], a)
        for b in self.naive:
            b.observe(a)


class Correction:
    """Every correction the forecast applies, and :meth:`learn` at each window's close."""

    def __init__(self, cfg: ForecastConfig) -> None:
        self.source = {name: BiasCorrector(cfg.bias_half_life, cfg.bias_clip, cfg.bias_prior_windows) for name in SOURCES}
        # Decode: its raw error can carry a large persistent bias (the queue model on a
        # saturated system), which a fixed pull towards 1 would hold back; it keeps what
        # stands out of the noise.
        self.decode = BiasCorrector(cfg.bias_half_life, cfg.bias_clip, 0.0, shrink=True)
        # The queue model's admitted share of the predicted arrivals, against what it
        # makes of the arrivals that actually came (so the arrival forecast's own error is
        # not in it): the requests that arrive in a window and are prefilled before its
        # end, over sum_k alpha_k x (actual arrival tokens in sub-step k).
        self.share = BiasCorrector(cfg.share_half_life, cfg.bias_clip, 0.0, shrink=True)
        self.prefill_blend = SeriesBlend()
        self.decode_blend = SeriesBlend()
        self.new = NewArrivals()

    def factors(self) -> dict[str, float]:
        """The bias factor of each predicted prefill source."""
        return {name: b.factor for name, b in self.source.items()}

    def admitted_share(self, alpha, arrival_tokens, admitted: float) -> tuple[float, np.ndarray]:
        """The arrivals' admissions with the queue model's admitted share per sub-step
        (``alpha``) corrected by :attr:`share`, each sub-step's share at most 1 (no more
        can be admitted than arrives): ``(admitted tokens, corrected alpha)``."""
        alpha = np.asarray(alpha, dtype=float)
        factor = self.share.factor
        if factor == 1.0 or admitted <= 0 or len(arrival_tokens) != len(alpha):
            return admitted, alpha
        alpha = np.minimum(alpha * factor, 1.0)
        return finite_sum(alpha * np.asarray(arrival_tokens, dtype=float)), alpha

    def learn(self, f, prefill: float, decode: float, decode_known: float, sources: dict[str, float],
              arrivals_by_step: list[float]) -> None:
        """A window closed. ``f`` is the forecast made at its start (a ``core.Forecast``);
        the rest is what happened: prefill demand, decode admissions (``decode_known`` of
        them by requests queued before t), the arrivals per source (``sources``, by the
        trajectory's state at t; ``other``: trajectories never announced) and per sub-step."""
        for name, corrector in self.source.items():
            corrector.update(f.components.get(name, 0.0), sources.get(name, 0.0))
        # The decode factor's prediction: the known requests' admissions as forecast, plus
        # the (corrected) admitted share of the arrivals that came.
        ex_post = f.raw_decode
        if len(f.raw_alpha) == len(arrivals_by_step):
            # What the queue model's admitted share makes of the arrivals that came.
            expected = sum(a * x for a, x in zip(f.raw_alpha, arrivals_by_step, strict=True))
            self.share.update(expected, decode - decode_known)
            alpha = f.admit_detail.alpha
            if len(alpha) == len(arrivals_by_step):
                ex_post = f.raw_decode_known + sum(a * x for a, x in zip(alpha, arrivals_by_step, strict=True))
        self.decode.update(ex_post, decode)
        # Each predictor scored on the window, then the naive ones see it.
        known = f.components.get("ready", 0.0) + f.components.get("inflight", 0.0)
        self.prefill_blend.close(f.model_prefill, prefill, known, f.around_update)
        self.decode_blend.close(f.model_decode, decode, around=f.around_update)
        self.new.close(f.new_model, sources.get("sampler", 0.0) + sources.get("other", 0.0))
