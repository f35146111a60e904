"""Decode bias correctors compared on one contract log (the figures behind the choice of
the decode correction in docs/forecaster.md).

    .venv/bin/python benchmarks/decode_correctors.py LOG [LOG ...]

The log is replayed once through the forecaster (default configuration); the raw decode
forecast of every window (before the decode correction; after the admitted-share one,
which is part of the queue model's output) and the actual admissions are then run
through each corrector offline, as the window loop would (a window's factor only from
windows closed before it). Prints the decode WAPE of each:

* off: no correction;
* priorC: the windows' volume-weighted mean ratio (half-life 6 windows), shrunk towards
  1 by C pseudo-windows of average volume (what the prefill corrections use, C = 2);
* shrink: the mean ratio, keeping only the part of it above its own noise (the default
  decode correction); shrink_hl3 and shrink_hl12: the same with a half-life of 3 and 12
  windows instead of ``bias_half_life`` (6).
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.evaluate import evaluate_log
from prorsa_forecaster.terms.correction import BiasCorrector


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("logs", nargs="+")
    args = ap.parse_args()
    for log in args.logs:
        if not os.path.isfile(log):
            ap.error(f"no such log file: {log}")
    cfg = ForecastConfig()
    makers = {
        "off": None,
        "prior0": lambda: BiasCorrector(cfg.bias_half_life, cfg.bias_clip, 0.0),
        "prior2": lambda: BiasCorrector(cfg.bias_half_life, cfg.bias_clip, 2.0),
        "prior5": lambda: BiasCorrector(cfg.bias_half_life, cfg.bias_clip, 5.0),
        "shrink": lambda: BiasCorrector(cfg.bias_half_life, cfg.bias_clip, 0.0, shrink=True),
        "shrink_hl3": lambda: BiasCorrector(3.0, cfg.bias_clip, 0.0, shrink=True),
        "shrink_hl12": lambda: BiasCorrector(12.0, cfg.bias_clip, 0.0, shrink=True),
    }
    for log in args.logs:
        windows = evaluate_log(log, cfg, keep_windows=True).windows
        raw = np.array([w.forecast.raw_decode for w in windows])
        act = np.array([w.decode_actual for w in windows])
        scores = {}
        for name, make in makers.items():
            corrector = make() if make else None
            fc = np.empty_like(raw)
            for i, (r, a) in enumerate(zip(raw, act)):
                fc[i] = r * (corrector.factor if corrector else 1.0)
                if corrector:
                    corrector.update(r, a)
            scores[name] = np.abs(fc - act).sum() / act.sum() if act.sum() > 0 else float("nan")
        print(f"{log}: {len(windows)} windows; decode WAPE " + ", ".join(f"{k} {v:.2%}" for k, v in scores.items()), flush=True)


if __name__ == "__main__":
    main()
