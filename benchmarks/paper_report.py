"""The paper-comparison report at full scale: every setting of the paper's §5 (3 models x
math / coding / general x staleness 0, 2, 8; 128 GPUs, 512 trajectories a step), colocation
and the static sweep (plus ``--pd-policy`` if given), 6 steps (1 warm-up), seeds 0, 1, 2,
in parallel processes. Writes OUT/report.json and OUT/report.md; every simulation is cached
in OUT/runs, so an interrupted run resumes where it stopped (a code change re-runs).

    .venv/bin/python benchmarks/paper_report.py [--out sim-paper] [--jobs N] [--quick]
        [--models ...] [--workloads ...] [--staleness 0,2,8] [--seeds 0,1,2] [--pd-policy prorsa]

It is the same as ``prorsa sim paper`` with its defaults; it prints the wall time and the
markdown report.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from prorsa_sim.paper import options, report
from prorsa_sim.paper_text import to_markdown


def _list(text: str | None, cast=str):
    return [cast(x) for x in text.split(",") if x] if text else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="sim-paper")
    ap.add_argument("--jobs", type=int, default=None, help="parallel processes (default: CPU count)")
    ap.add_argument("--quick", action="store_true", help="preview preset: 3 steps, seed 0, 4-point static grid")
    ap.add_argument("--models")
    ap.add_argument("--workloads")
    ap.add_argument("--staleness")
    ap.add_argument("--seeds")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--grid", type=int)
    ap.add_argument("--pd-policy")
    args = ap.parse_args()
    o = options(models=_list(args.models), workloads=_list(args.workloads), staleness=_list(args.staleness, int),
                seeds=_list(args.seeds, int), steps=args.steps, grid=args.grid, jobs=args.jobs,
                pd_policy=args.pd_policy, quick=args.quick)
    out = Path(args.out)
    done = [0]

    def tick(_job) -> None:
        done[0] += 1
        if done[0] % 10 == 0:
            print(f"  {done[0]} simulations done, {time.perf_counter() - t0:.0f} s", flush=True)

    t0 = time.perf_counter()
    rep = report(o, out, progress=tick, on_total=lambda n: print(f"{n} simulations (cached ones included)", flush=True))
    wall = time.perf_counter() - t0
    rep["meta"]["wall_s"] = round(wall, 1)
    (out / "report.json").write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n")
    md = to_markdown(rep)
    (out / "report.md").write_text(md)
    print(md)
    print(f"wall {wall:.0f} s, {o.jobs} processes -> {out / 'report.json'}, {out / 'report.md'}")


if __name__ == "__main__":
    main()
