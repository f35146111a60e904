"""Issue #6's headline table: rollout time of colocation, the best static P:D ratio,
reactive, Prorsa and oracle for one model on every workload x staleness, and Prorsa's
speedups over each.

    .venv/bin/python benchmarks/headline_table.py --model deepseek-v3.2 --steps 2 --jobs 2
    .venv/bin/python benchmarks/headline_table.py --restart   # also the restart-mode rows

Each simulation is one task (the static sweep is one task per ratio), run ``--jobs`` at a
time and cached as JSON under ``--cache`` (default /tmp/prorsa_headline), keyed by the
setting and a hash of the code it depends on, so a re-run only simulates what changed.
Prints a Markdown table (and ``--json`` writes every row).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("math", "coding", "general")
STALENESS = (0, 2, 8)
SWITCHING = ("reactive", "prorsa", "oracle")


def _package_dir(name: str) -> Path:
    # The code that will actually be imported (PYTHONPATH may point at a snapshot).
    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin).parent


def _code_hash(policy: str) -> str:
    """Hash of the sources a result depends on (the simulator core; for switching policies
    also the policies and the allocator core)."""
    sim = _package_dir("prorsa_sim")
    files = sorted(p for p in sim.glob("*.py") if p.name not in ("cli.py", "plot.py"))
    if policy.split(":")[0] in SWITCHING:
        files += sorted((sim / "policies").glob("*.py"))
        files += sorted(_package_dir("prorsa_allocator").glob("*.py"))
        if policy.startswith("prorsa"):
            files += sorted(_package_dir("prorsa_forecaster").glob("*.py"))
    h = hashlib.sha1()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _run(task: dict) -> dict:
    from prorsa_sim.policy import make_policy
    from prorsa_sim.simulator import Simulator, build_config

    cfg = build_config(
        workload=task["workload"], model=task["model"], staleness=task["staleness"],
        steps=task["steps"], seed=task["seed"], batch_size=task["batch_size"],
    )
    t0 = time.perf_counter()
    res = Simulator(cfg, make_policy(task["policy"])).run()
    s = res.summary
    return {
        **task,
        "wall_s": round(time.perf_counter() - t0, 1),
        "rollout_time_s": s["rollout_time_s"],
        "step_times_s": s["step_times_s"],
        "switches": s["switches"],
        "final_roles": s["final_roles"],
        "gpu_idle_ratio": s["gpu_idle_ratio"],
        "mean_trajectory_s": s["mean_trajectory_s"],
    }


def _key(task: dict) -> str:
    name = "_".join(str(task[k]) for k in ("model", "workload", "staleness", "steps", "seed", "batch_size"))
    return f"{name}_{task['policy'].replace(':', '-')}_{_code_hash(task['policy'])}.json"


def tasks_for(args) -> list[dict]:
    from prorsa_sim.costmodel import get_profile
    from prorsa_sim.policy import static_sweep_ratios

    n = get_profile(args.model).engines_in(128)
    out = []
    for w in args.workloads:
        for st in args.staleness:
            pols = ["colocation", *(f"static:{p}:{d}" for p, d in static_sweep_ratios(n)), *args.policies]
            if args.restart and w != "math":
                pols += [f"{p}:restart" for p in args.restart_policies]
            for pol in pols:
                out.append(dict(model=args.model, workload=w, staleness=st, steps=args.steps, seed=args.seed,
                                batch_size=args.batch_size, policy=pol))
    return out


def run_all(tasks: list[dict], cache: Path, jobs: int) -> dict[str, dict]:
    cache.mkdir(parents=True, exist_ok=True)
    results, todo = {}, []
    for t in tasks:
        f = cache / _key(t)
        if f.exists():
            results[_key(t)] = json.loads(f.read_text())
        else:
            todo.append(t)
    print(f"{len(tasks) - len(todo)} cached, {len(todo)} to simulate ({jobs} at a time)", file=sys.stderr)
    # Setting by setting (agentic first), the expensive policies first within one, so a
    # partial run still gives whole rows and the pool is rarely left with one straggler.
    order = {w: i for i, w in enumerate(("coding", "general", "math"))}
    todo.sort(key=lambda t: (order[t["workload"]], t["staleness"], t["policy"].split(":")[0] not in ("oracle", "prorsa")))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futs = {pool.submit(_run, t): t for t in todo}
        for fut in as_completed(futs):
            t = futs[fut]
            try:
                r = fut.result()
            except Exception as exc:  # one broken setting must not lose the others
                print(f"FAILED {t}: {exc!r}", file=sys.stderr)
                continue
            (cache / _key(t)).write_text(json.dumps(r))
            results[_key(t)] = r
            print(f"{t['workload']}/{t['staleness']}/{t['policy']}: {r['rollout_time_s']} s "
                  f"({r['switches']} switches, {r['wall_s']} s wall)", file=sys.stderr)
    return results


def table(tasks: list[dict], results: dict[str, dict], args) -> tuple[str, list[dict]]:
    rows = []
    by = {}
    for t in tasks:
        r = results.get(_key(t))
        if r is not None:
            by.setdefault((t["workload"], t["staleness"]), {})[t["policy"]] = r
    for w in args.workloads:
        for st in args.staleness:
            got = by.get((w, st), {})
            statics = {p: r["rollout_time_s"] for p, r in got.items() if p.startswith("static:")}
            row = {"workload": w, "staleness": st}
            if statics:
                best = min(statics, key=statics.get)
                row["best_static"], row["static"] = best[len("static:"):], statics[best]
            for p in ("colocation", *args.policies, *(f"{q}:restart" for q in args.restart_policies)):
                if p in got:
                    row[p] = got[p]["rollout_time_s"]
                    if p.split(":")[0] in SWITCHING:
                        row[f"{p} switches"] = got[p]["switches"]
            rows.append(row)

    def f(x):
        return "-" if x is None else f"{x:.0f}"

    def sp(a, b):
        return "-" if a is None or b is None else f"{b / a:.2f}x"

    cols = ["workload", "stale", "colocation", "best static (P:D)", "reactive", "prorsa (switches)", "oracle",
            "prorsa vs coloc", "vs static", "vs reactive", "vs oracle"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        pr = r.get("prorsa")
        lines.append("| " + " | ".join([
            r["workload"], str(r["staleness"]), f(r.get("colocation")),
            f"{f(r.get('static'))} ({r.get('best_static', '-')})", f(r.get("reactive")),
            f"{f(pr)} ({r.get('prorsa switches', '-')})", f(r.get("oracle")),
            sp(pr, r.get("colocation")), sp(pr, r.get("static")), sp(pr, r.get("reactive")), sp(pr, r.get("oracle")),
        ]) + " |")
    if args.restart:
        lines += ["", "Restart mode (stock SGLang 0.5.23: no in-place switch with EP > 1):", ""]
        cols = ["workload", "stale", "best static", *(f"{p}:restart (switches)" for p in args.restart_policies),
                "prorsa:restart vs static", "vs prorsa in place"]
        lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for r in rows:
            if r["workload"] == "math":
                continue
            pr = r.get("prorsa:restart")
            lines.append("| " + " | ".join([
                r["workload"], str(r["staleness"]), f(r.get("static")),
                *(f"{f(r.get(p + ':restart'))} ({r.get(p + ':restart switches', '-')})" for p in args.restart_policies),
                sp(pr, r.get("static")), sp(pr, r.get("prorsa")),
            ]) + " |")
    return "\n".join(lines), rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="deepseek-v3.2")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    ap.add_argument("--staleness", nargs="+", type=int, default=list(STALENESS))
    ap.add_argument("--policies", nargs="+", default=list(SWITCHING))
    ap.add_argument("--restart", action="store_true", help="Also the agentic settings in restart mode.")
    ap.add_argument("--restart-policies", nargs="+", default=["prorsa"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=Path("/tmp/prorsa_headline"))
    ap.add_argument("--json", type=Path, help="Write the rows here.")
    ap.add_argument("--table-only", action="store_true", help="Print what is cached; simulate nothing.")
    args = ap.parse_args()
    if not args.restart:
        args.restart_policies = []
    tasks = tasks_for(args)
    if args.table_only:
        results = {_key(t): json.loads((args.cache / _key(t)).read_text()) for t in tasks if (args.cache / _key(t)).exists()}
    else:
        results = run_all(tasks, args.cache, args.jobs)
    text, rows = table(tasks, results, args)
    print(f"model {args.model}, {args.steps} steps, seed {args.seed}, batch {args.batch_size}; rollout time in "
          f"simulated seconds (mean step time); speedup = other / prorsa")
    print(text)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
