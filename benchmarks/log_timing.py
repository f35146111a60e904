"""Where a run's time goes, from its event log, and how jittery its forecast windows are.

    .venv/bin/python benchmarks/log_timing.py LOG.jsonl.gz [--scale 10]
    .venv/bin/python benchmarks/log_timing.py --windows WINDOWS.csv

With a log (a simulator's ``events.jsonl.gz`` or ``prorsa export`` of a live run): the
mean and median per request of the time to the first token (``request.queued`` ->
``prefill.finished``), decode (``prefill.finished`` -> ``decode.finished``), a tool call
and a trajectory (dispatch -> reward); then the time to the first token by how many
requests were in prefill when it was queued. ``--scale`` multiplies every duration (the
live demo's log is in wall seconds at ``--speed 10``: 10 gives emulated seconds).

With ``--windows`` (``prorsa forecast-eval LOG --windows CSV``): per series (prefill,
decode) the swing of the actuals between adjacent windows (sum of |change| over the sum of
the series), the forecast's WAPE, and the correlation of successive windows' errors.

Used for docs/demo.md ("The simulator, run on the demo's own scenario") and
docs/forecaster.md ("The demo under 30%").
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import sys

import numpy as np

LOAD_BUCKETS = ((0, 3), (3, 10), (10, 30), (30, 100), (100, 10**9))


def _events(path: str):
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            for n, line in enumerate(f, 1):
                try:
                    yield json.loads(line)
                except ValueError:
                    sys.exit(f"{path}:{n}: not a JSON line")
    except (OSError, EOFError) as exc:  # EOFError: a gzip log cut short
        sys.exit(f"{path}: cannot read: {exc}")


def timing(path: str, scale: float) -> None:
    queued: dict[str, tuple[float, int]] = {}
    first: dict[str, float] = {}
    tool: dict[str, float] = {}
    dispatched: dict[str, float] = {}
    spans: dict[str, list[float]] = {"first token": [], "decode": [], "tool call": [], "trajectory": []}
    by_load: list[tuple[float, int]] = []
    in_prefill = 0
    for e in _events(path):
        t, ts = e.get("type"), e.get("ts")
        if not isinstance(ts, (int, float)):
            continue
        if t == "request.queued":
            queued[e["req"]] = (ts, in_prefill)
            in_prefill += 1
        elif t == "prefill.finished" and e.get("req") in queued:
            q, load = queued.pop(e["req"])
            in_prefill -= 1
            spans["first token"].append((ts - q) * scale)
            by_load.append(((ts - q) * scale, load))
            first[e["req"]] = ts
        elif t == "decode.finished" and e.get("req") in first:
            spans["decode"].append((ts - first.pop(e["req"])) * scale)
        elif t == "tool.started":
            tool[e["traj"]] = ts
        elif t == "tool.finished" and e.get("traj") in tool:
            spans["tool call"].append((ts - tool.pop(e["traj"])) * scale)
        elif t == "trajectory.dispatched":
            dispatched[e["traj"]] = ts
        elif t == "reward.finished" and e.get("traj") in dispatched:
            spans["trajectory"].append((ts - dispatched.pop(e["traj"])) * scale)
    if not spans["first token"]:
        sys.exit(f"{path}: no request.queued -> prefill.finished pair")
    print(f"{'span':<12} {'n':>6} {'mean s':>8} {'median s':>9}")
    for name, v in spans.items():
        if v:
            print(f"{name:<12} {len(v):>6} {np.mean(v):>8.2f} {np.median(v):>9.2f}")
    arr = np.array(by_load)
    print("\nfirst token by requests in prefill when queued")
    print(f"{'in prefill':<12} {'n':>6} {'mean s':>8} {'median s':>9}")
    for lo, hi in LOAD_BUCKETS:
        m = (arr[:, 1] >= lo) & (arr[:, 1] < hi)
        if m.any():
            label = f"{lo}-{hi - 1}" if hi < 10**9 else f">={lo}"
            print(f"{label:<12} {int(m.sum()):>6} {arr[m, 0].mean():>8.2f} {np.median(arr[m, 0]):>9.2f}")


def jitter(path: str) -> None:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        series = {k: (np.array([float(r[f"{k}_actual"]) for r in rows]),
                      np.array([float(r[f"{k}_forecast"]) for r in rows])) for k in ("prefill", "decode")}
    except (OSError, KeyError, ValueError) as exc:
        sys.exit(f"{path}: not a forecast-eval --windows CSV ({exc})")
    print(f"{'series':<8} {'windows':>7} {'swing':>6} {'WAPE':>7} {'lag-1 error corr':>17}")
    for k, (a, fc) in series.items():
        total = a.sum()
        if total <= 0 or len(a) < 3:
            print(f"{k:<8} {len(a):>7} {'n/a':>6}")
            continue
        err = fc - a
        corr = np.corrcoef(err[1:], err[:-1])[0, 1]
        print(f"{k:<8} {len(a):>7} {np.abs(np.diff(a)).sum() / total:>6.2f} "
              f"{np.abs(err).sum() / total:>7.1%} {corr:>17.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("log", nargs="?", help="event log (.jsonl or .jsonl.gz)")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every duration (live demo: its --speed)")
    ap.add_argument("--windows", help="a forecast-eval --windows CSV instead of a log")
    args = ap.parse_args()
    if args.windows:
        jitter(args.windows)
    elif args.log:
        if args.scale <= 0:
            ap.error("--scale must be > 0")
        timing(args.log, args.scale)
    else:
        ap.error("give a LOG or --windows CSV")


if __name__ == "__main__":
    main()
