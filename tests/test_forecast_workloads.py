"""The forecaster against the naive predictors on each of the simulator's workloads.

The forecaster's promise is that its published forecast is never worse than the best naive
predictor (last value, EMA, Kalman) on any log (docs/forecaster.md, "Against the
targets"). docs/forecaster.md measures it on paper-scale logs of 10 steps; this replays
small runs of two of the simulator's three workloads, synchronous and asynchronous,
through ``prorsa forecast-eval``'s evaluation, so that a change that breaks the promise on
one kind of demand fails here: math (one burst of short prompts a step, then long
decodes; asynchronous, the re-prefill bursts after each weight update) and the general
agent (tool calls and growing contexts). The coding agent's logs are the slowest to
replay (about 20 s each at this size) and are scored in docs/forecaster.md only. The simulator is deterministic, so each log is the
same every run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from prorsa_forecaster.evaluate import evaluate_log
from prorsa_sim.runner import run_to_dir
from prorsa_sim.simconfig import SimConfig


@pytest.mark.parametrize("workload, staleness", [("math", 0), ("math", 2), ("general", 0), ("general", 2)])
def test_the_forecast_is_no_worse_than_the_best_naive_predictor(tmp_path: Path, workload: str, staleness: int) -> None:
    # 4 deepseek-v3.2 engines (2:2), 64 trajectories a step, 4 steps, seed 0.
    cfg = SimConfig(workload=workload, model="deepseek-v3.2", staleness=staleness, steps=4, batch_size=64,
                    total_gpus=64)
    run_to_dir(cfg, "static:2:2", tmp_path, plot=False)
    report = evaluate_log(tmp_path / "events.jsonl.gz").report()
    assert report["invalid_lines"] == 0 and report["ignored_events"] == 0
    assert report["windows"] >= 90
    for series in ("prefill", "decode"):
        baselines = {name: w for name, w in report[series]["baselines"].items() if w is not None}
        assert set(baselines) == {"last_value", "ema", "kalman"}
        best = min(baselines.values())
        assert report[series]["wape"] <= best, (series, report[series]["wape"], baselines)
