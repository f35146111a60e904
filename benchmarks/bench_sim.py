"""Simulator speed: one synchronous coding rollout step at paper scale (128 GPUs, 512
trajectories), per model, colocation and static PD. Prints simulated seconds per wall
second. Baseline (same run): the same step without writing the event log, so the cost
of the log is visible.

    .venv/bin/python benchmarks/bench_sim.py [--models deepseek-v3.2,qwen3-235b,mimo-v2.5-pro]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from prorsa_schemas import LogWriter
from prorsa_emulated.costmodel import get_profile
from prorsa_sim.catalog import make_policy
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator


def one(model: str, policy: str, log: bool) -> tuple[float, dict]:
    cfg = SimConfig(workload="coding", model=model, staleness=0, steps=1, batch_size=512, total_gpus=128)
    with tempfile.TemporaryDirectory() as d:
        t = time.perf_counter()
        if log:
            with LogWriter(Path(d) / "events.jsonl.gz") as sink:
                res = Simulator(cfg, make_policy(policy), sink=sink).run()
        else:
            res = Simulator(cfg, make_policy(policy)).run()
        return time.perf_counter() - t, res.summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="deepseek-v3.2,qwen3-235b,mimo-v2.5-pro")
    args = ap.parse_args()
    print(f"{'model':15} {'policy':14} {'log':4} {'wall s':>7} {'sim s':>8} {'sim s/wall s':>12} {'events':>8}")
    for model in args.models.split(","):
        n = get_profile(model).engines_in(128)
        for policy in ("colocation", f"static:{n // 2}:{n - n // 2}"):
            for log in (False, True):
                wall, s = one(model, policy, log)
                print(f"{model:15} {policy:14} {'yes' if log else 'no':4} {wall:7.2f} {s['sim_time_s']:8.1f} "
                      f"{s['sim_time_s'] / wall:12.1f} {s['events']:8d}")


if __name__ == "__main__":
    main()
