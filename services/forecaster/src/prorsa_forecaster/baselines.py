"""Aggregate-series predictors, the baselines a forecast is compared with.

They see only the past actuals of the series (what load-based autoscalers such as
Dynamo's planner use): ``predict()`` the next window, then ``observe(actual)``.
"""

from __future__ import annotations

import math


class LastValue:
    """Next window = this window."""

    name = "last_value"

    def __init__(self) -> None:
        self.value = 0.0

    def predict(self) -> float:
        return self.value

    def observe(self, y: float) -> None:
        self.value = y


class Ema:
    """Exponential moving average of the series (alpha 0.5 by default)."""

    name = "ema"

    def __init__(self, alpha: float = 0.5) -> None:
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.value: float | None = None

    def predict(self) -> float:
        return 0.0 if self.value is None else self.value

    def observe(self, y: float) -> None:
        self.value = y if self.value is None else self.value + self.alpha * (y - self.value)


class Kalman:
    """Local-level Kalman filter (random walk plus noise) with noise variances estimated
    online by the method of moments on first differences: var(dy) = Q + 2R and
    cov(dy_t, dy_{t-1}) = -R."""

    name = "kalman"

    def __init__(self, alpha: float = 0.05) -> None:
        self.alpha = alpha
        self.x: float | None = None
        self.p = 1.0
        self._prev: float | None = None
        self._prev_d: float | None = None
        self._var = 0.0
        self._cov = 0.0
        self._n = 0

    def predict(self) -> float:
        return 0.0 if self.x is None else max(self.x, 0.0)

    def observe(self, y: float) -> None:
        if not math.isfinite(y):
            return
        if self._prev is not None:
            d = y - self._prev
            a = max(self.alpha, 1.0 / (self._n + 1))
            self._var += a * (d * d - self._var)
            if self._prev_d is not None:
                self._cov += a * (d * self._prev_d - self._cov)
            self._prev_d = d
            self._n += 1
        self._prev = y
        r = max(-self._cov, 0.0)
        q = max(self._var - 2 * r, 1e-9 * (self._var + 1.0))
        if self.x is None:
            self.x, self.p = y, r + q
            return
        p = self.p + q
        k = p / (p + r) if p + r > 0 else 1.0
        self.x += k * (y - self.x)
        self.p = (1 - k) * p


def make_baselines() -> list:
    """Fresh instances of every baseline, in report order."""
    return [LastValue(), Ema(), Kalman()]


def wape(forecasts: list[float], actuals: list[float]) -> float | None:
    """Sum |forecast - actual| / sum actual; None when there is no actual volume."""
    total = sum(actuals)
    if total <= 0:
        return None
    return sum(abs(f - a) for f, a in zip(forecasts, actuals)) / total
