"""`prorsa forecast-eval`: replay a contract log, score the forecaster against baselines.

Every window's forecast is made from the events before its start (see
:mod:`prorsa_forecaster.windows`); the baselines predict each window from the actuals of
the windows before it. WAPE = sum |forecast - actual| / sum actual over all windows.

The window that holds the log's last event is not scored: the log ends inside it, so its
"actual" is cut short (a run that ends at a step boundary shows a window of almost no
demand right after the forecast of a full one). Every predictor, baselines included, is
scored on the same complete windows; the report says how many were left out
(``partial_windows``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from prorsa_schemas import read_log
from prorsa_schemas.codec import TRUNCATED

from .baselines import make_baselines, wape
from .config import ForecastConfig
from .uncertainty import ABS_NORMAL
from .windows import WindowLoop, WindowResult


@dataclass
class Series:
    """Forecasts and actuals of one series, with the baselines' predictions beside them."""

    forecast: list[float] = field(default_factory=list)
    actual: list[float] = field(default_factory=list)
    baselines: list = field(default_factory=make_baselines)
    predicted: dict[str, list[float]] = field(default_factory=dict)

    def add(self, forecast: float, actual: float) -> None:
        self.forecast.append(forecast)
        self.actual.append(actual)
        for b in self.baselines:
            self.predicted.setdefault(b.name, []).append(b.predict())
            b.observe(actual)

    def report(self) -> dict:
        scores = {name: wape(p, self.actual) for name, p in self.predicted.items()}
        out = {
            "wape": _r(wape(self.forecast, self.actual)),
            "baselines": {name: _r(w) for name, w in scores.items()},
            "actual_tokens": round(sum(self.actual)),
            "forecast_tokens": round(sum(self.forecast)),
        }
        known = {name: w for name, w in scores.items() if w is not None}
        if known:
            best = min(known, key=known.get)
            gap = wape_excess(self.forecast, self.predicted[best], self.actual)
            if gap is not None:
                out["vs_best_naive"] = {"predictor": best, "excess": _r(gap[0]), "se": _r(gap[1])}
        return out


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


@dataclass
class Evaluation:
    """The accumulated scores of one replay."""

    horizon: float
    prefill: Series = field(default_factory=Series)
    decode: Series = field(default_factory=Series)
    arrivals: Series = field(default_factory=Series)
    """Prefill demand without the backlog at t (known exactly at t by every predictor that
    reads the events): what is left to forecast, scored the same way."""
    components: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    decode_components: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    lifecycle: dict[str, list[float]] = field(default_factory=lambda: {"prefill": [], "decode": []})
    """The lifecycle forecast alone (before the blend with the naive predictors)."""
    windows: list[WindowResult] = field(default_factory=list)
    events: int = 0
    invalid: int = 0
    out_of_order: int = 0
    ignored: int = 0
    partial: int = 0
    noise: float = 0.0
    decode_noise: float = 0.0
    keep_windows: bool = False
    truncated: str | None = None
    """Why the log ended early (a truncated or corrupt gzip stream; None: it did not): the
    figures then cover only what came before that line."""

    def add(self, w: WindowResult) -> None:
        f = w.forecast
        self.prefill.add(f.prefill_tokens, w.prefill_actual)
        known = f.components.get("ready", 0.0) + f.components.get("inflight", 0.0)
        self.arrivals.add(max(f.prefill_tokens - known, 0.0), max(w.prefill_actual - w.backlog, 0.0))
        if w.prefill_sd is not None:
            self.noise += ABS_NORMAL * w.prefill_sd
        if w.decode_sd is not None:
            self.decode_noise += ABS_NORMAL * w.decode_sd
        self.decode.add(f.decode_admit_tokens, w.decode_actual)
        self.lifecycle["prefill"].append(f.model_prefill)
        self.lifecycle["decode"].append(f.model_decode)
        w_new = f.weights.get("new", {}).get("lifecycle", 1.0)
        pairs = {
            "sampler": (f.components["sampler"], w.sources["sampler"]),
            "sandbox": (f.components["sandbox"], w.sources["sandbox"]),
            "tool": (f.components["tool"], w.sources["tool"]),
            "reprefill": (f.components["reprefill"], w.sources["reprefill"]),
            "backlog": (f.components["ready"] + f.components["inflight"], w.backlog),
            # Trajectories not live at t: launched in the window, or never announced.
            "new": (w_new * f.new_model + f.new_series, w.sources["sampler"] + w.sources["other"]),
        }
        for name, pair in pairs.items():
            self.components.setdefault(name, []).append(pair)
        # Decode admissions (before the correction) of requests queued or in prefill at t
        # (the queue model's error) and of requests arriving in the window (the arrival
        # forecast's).
        known = (f.raw_decode_known, w.decode_known)
        arriving = (f.raw_decode - f.raw_decode_known, w.decode_actual - w.decode_known)
        self.decode_components.setdefault("known", []).append(known)
        self.decode_components.setdefault("arrivals", []).append(arriving)
        if self.keep_windows:
            self.windows.append(w)

    def report(self) -> dict:
        """The JSON report (the fixed shape of docs/forecaster.md, "How to run", extra keys beside it)."""
        prefill = self.prefill.report()
        prefill["lifecycle_wape"] = _r(wape(self.lifecycle["prefill"], self.prefill.actual))
        prefill["components"] = _component_report(self.components)
        total = sum(self.prefill.actual)
        # The WAPE a forecast with exact arrival probabilities would still have (uncertainty.py).
        prefill["noise_floor"] = _r(self.noise / total) if total > 0 else None
        arrivals = self.arrivals.report()
        total = sum(self.arrivals.actual)
        arrivals["noise_floor"] = _r(self.noise / total) if total > 0 else None
        prefill["arrivals"] = arrivals
        dtotal = sum(self.decode.actual)
        return {
            "windows": len(self.prefill.actual),
            "horizon": self.horizon,
            "prefill": prefill,
            "decode": {
                **self.decode.report(),
                "lifecycle_wape": _r(wape(self.lifecycle["decode"], self.decode.actual)),
                "components": _component_report(self.decode_components),
                "noise_floor": _r(self.decode_noise / dtotal) if dtotal > 0 else None,
            },
            "events": self.events,
            "invalid_lines": self.invalid,
            "truncated": self.truncated,
            "out_of_order": self.out_of_order,
            "ignored_events": self.ignored,
            "partial_windows": self.partial,
        }


def _component_report(components: dict[str, list[tuple[float, float]]]) -> dict:
    out = {}
    for name, pairs in components.items():
        fc = [p[0] for p in pairs]
        ac = [p[1] for p in pairs]
        out[name] = {"wape": _r(wape(fc, ac)), "forecast_tokens": round(sum(fc)), "actual_tokens": round(sum(ac))}
    return out


def evaluate_log(
    path: str | os.PathLike, config: ForecastConfig | None = None, keep_windows: bool = False
) -> Evaluation:
    """Replay a .jsonl / .jsonl.gz log and score every window.

    Invalid lines are counted and skipped (``prorsa validate`` lists them); a log with no
    request events still yields windows, with WAPE ``None`` where there is no actual.

    Raises:
        FileNotFoundError / IsADirectoryError / OSError: the log cannot be read.
    """
    cfg = config or ForecastConfig()
    loop = WindowLoop(cfg, spread=True)
    ev_out = Evaluation(cfg.horizon, keep_windows=keep_windows)
    for line in read_log(path):
        if line.event is None:
            ev_out.invalid += 1
            if line.error is not None and line.error.reason.startswith(TRUNCATED):
                ev_out.truncated = f"line {line.lineno}: {line.error.reason}"
            continue
        ev_out.events += 1
        for w in loop.feed(line.event):
            ev_out.add(w)
    # The last window ends after the log does: its actuals are incomplete (see above).
    ev_out.partial = len(loop.finish())
    ev_out.out_of_order = loop.out_of_order
    ev_out.ignored = loop.state.ignored + (loop.gate.rejected if loop.gate else 0)
    return ev_out


def wape_excess(forecasts: list[float], others: list[float], actuals: list[float]) -> tuple[float, float] | None:
    """How much higher the WAPE of ``forecasts`` is than that of ``others`` on the same
    windows, and the standard error of that difference: ``(excess, se)``, both in WAPE
    units; None without actual volume or with fewer than 4 windows.

    The difference is a sum over windows of d_t = |f_t - a_t| - |o_t - a_t|, and the
    windows' errors are correlated (a forecast that is high stays high for a while), so
    the standard error is by batch means: the windows in about sqrt(n) consecutive
    blocks, whose sums of d are taken for independent, Var(sum d) ~ B Var(block sum)
    (B blocks). An excess within two standard errors is what the windows' noise alone
    gives."""
    n = min(len(forecasts), len(others), len(actuals))
    total = sum(actuals[:n])
    if total <= 0 or n < 4:
        return None
    d = [abs(f - a) - abs(o - a) for f, o, a in zip(forecasts[:n], others[:n], actuals[:n])]
    blocks = max(2, math.isqrt(n))
    size = n / blocks
    sums = [sum(d[round(b * size):round((b + 1) * size)]) for b in range(blocks)]
    mean = sum(sums) / blocks
    var = sum((s - mean) ** 2 for s in sums) / (blocks - 1)
    return sum(d) / total, math.sqrt(blocks * var) / total
