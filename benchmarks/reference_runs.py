"""The allocator's reference runs: one simulated run per setting of the paper's evaluation,
rerun on the current code and compared with the figures recorded for earlier code.

    .venv/bin/python benchmarks/reference_runs.py [--jobs N] [--only SUBSTRING ...]
        [--out .prorsa/reference-runs] [--file PATH] [--record [--label TEXT]] [--alias SPEC=OTHER ...]
        [--seeds K ...] [--json]

A change to the allocator or the forecaster re-keys every figure docs/allocator.md and
docs/simulator.md quote (``prorsa_sim.runner.code_versions``), and rerunning the full
presets takes hours. These runs tie a table measured on one code to another: the 18
settings of the headline tables (math, coding and general agent x staleness 0, 2 and 8 on
DeepSeek-V3.2 and MiMo-V2.5-Pro), each from the start split its tables use (its best fixed
ratio on most seeds), seed 0 (``--seeds`` adds others), 6 steps (1 warm-up + 5 measured),
policy ``prorsa``; the six synchronous ones again under ``prorsa:capacity`` (the capacity
ratio, which the default policy uses on asynchronous runs only); the short runs the docs
quote as examples (3 steps): MiMo-V2.5-Pro general/0 from 2:6 under the capacity ratio,
coding/8 from 6:2 under turn latency, and coding/2 from 5:3 under the DP-aware gateway;
and, for the simulator alone, each of the 18 settings with its start ratio held
(``static:P:D``) and under colocation.

Each run is the simulation ``prorsa sim run --workload W --staleness S --model M --policy
SPEC --start P:D --seed K --steps N`` makes (through ``prorsa_sim.runner.run_jobs``). The
figures recorded for each code key (simulator + allocator and forecaster, with the router
rule's key under the gateway) are in ``benchmarks/reference_runs.json``. The table prints
each run's rollout time (simulated seconds, the mean of the measured steps) and switch
count on every recorded code and now, and names the recorded codes whose figures differ
from now's (by more than 0.05 s, or in the switch count). ``--record`` adds the current
figures under the current code key (``--label`` describes that code).

``--alias SPEC=OTHER`` runs OTHER in place of SPEC, for code that names a policy otherwise
(code whose ``prorsa`` is the capacity ratio on every run and that has no
``prorsa:capacity``: ``--alias prorsa:capacity=prorsa``); a run whose policy the code does
not have is reported as such and not recorded. Results are cached in ``--out`` by code key:
a rerun on the same code simulates nothing and an interrupted one resumes. It is a
benchmark: it asserts nothing, and its exit status is 0 whether or not runs differ.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from prorsa_sim.simulation import build_policy, is_pd_fixed

RECORD = Path(__file__).with_name("reference_runs.json")


@dataclass(frozen=True)
class Ref:
    model: str
    workload: str
    staleness: int
    start: str
    spec: str = "prorsa"
    steps: int = 6
    dp_routing: str = "load"
    router_policy: str = "queue"
    seed: int = 0

    @property
    def name(self) -> str:
        short = {"deepseek-v3.2": "ds", "mimo-v2.5-pro": "mimo"}[self.model]
        tail = "" if self.spec == "prorsa" else f" {self.spec}"
        gate = " gateway" if self.router_policy == "smg" else ""
        gate += f" seed {self.seed}" if self.seed else ""
        if self.fixed:
            return f"{short} {self.workload}/{self.staleness} {self.spec}{gate} x{self.steps}"
        return f"{short} {self.workload}/{self.staleness} from {self.start}{tail}{gate} x{self.steps}"

    @property
    def fixed(self) -> bool:
        """A run that never switches (colocation, static:P:D): no start split."""
        return is_pd_fixed(self.spec)

    def command(self) -> str:
        cmd = (f"prorsa sim run --workload {self.workload} --staleness {self.staleness} --model {self.model} "
               f"--policy {self.spec}{'' if self.fixed else f' --start {self.start}'} --seed {self.seed} "
               f"--steps {self.steps}")
        if self.router_policy != "queue":
            cmd += f" --dp-routing {self.dp_routing} --router-policy {self.router_policy}"
        return cmd


# The start of each setting: its best fixed ratio on most seeds in the full presets
# (docs/allocator.md, "The headline comparison").
_STARTS = {
    "deepseek-v3.2": {"general": ("6:2", "6:2", "7:1"), "math": ("1:7", "4:4", "4:4"), "coding": ("6:2", "7:1", "7:1")},
    "mimo-v2.5-pro": {"general": ("2:6", "4:4", "5:3"), "math": ("1:7", "2:6", "2:6"), "coding": ("5:3", "6:2", "6:2")},
}
_SETTINGS = [(m, w, s, start) for m, by in _STARTS.items() for w, starts in by.items()
             for s, start in zip((0, 2, 8), starts)]
REFS: list[Ref] = [Ref(*setting) for setting in _SETTINGS] + [
    Ref(m, w, s, start, spec="prorsa:capacity") for m, w, s, start in _SETTINGS if s == 0
] + [
    # the simulator alone: the start ratio held, and colocation
    Ref(m, w, s, start, spec=spec) for m, w, s, start in _SETTINGS for spec in (f"static:{start}", "colocation")
] + [
    Ref("mimo-v2.5-pro", "general", 0, "2:6", spec="prorsa:capacity", steps=3),
    Ref("mimo-v2.5-pro", "coding", 8, "6:2", spec="prorsa:latency", steps=3),
    Ref("mimo-v2.5-pro", "coding", 2, "5:3", steps=3, dp_routing="prefix", router_policy="smg"),
]


def _read_record(path: Path) -> dict:
    doc = json.loads(path.read_text()) if path.exists() else {}
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k, {}), dict) for k in ("codes", "runs")):
        raise ValueError("expected an object with 'codes' and 'runs'")
    doc.setdefault("codes", {})
    doc.setdefault("runs", {})
    return doc


def compare(refs: list[Ref], now: dict[str, dict], recorded: dict, missing: dict[str, str]) -> list[dict]:
    """One row per reference run: its figures now (None where this code lacks its policy),
    those recorded for each code, and the recorded codes whose figures differ from now's
    (rollout time by more than 0.05 s, or the switch count)."""
    rows = []
    for r in refs:
        figs = recorded["runs"].get(r.name, {}).get("by_code", {})
        cur = now.get(r.name)
        differ = [] if cur is None else [c for c, f in figs.items() if c != cur["code"] and (
            abs(f["rollout_s"] - cur["rollout_s"]) > 0.05 or f["switches"] != cur["switches"])]
        rows.append({"run": r.name, "command": r.command(), "now": cur, "unavailable": missing.get(r.name),
                     "recorded": figs, "differs_from": differ})
    return rows


def _print(args: argparse.Namespace, rows: list[dict], recorded: dict, code: str, missing: dict[str, str],
           wall: float | None, now_label: str = "now") -> None:
    """The comparison, as JSON (``--json``) or as a Markdown table with a line per recorded code."""
    codes = list(recorded["codes"])
    if args.json:
        print(json.dumps({"code": code, "wall_s": None if wall is None else round(wall, 1),
                          "codes": recorded["codes"], "runs": rows}, indent=2))
        return

    def cell(f):
        return "-" if f is None else f"{f['rollout_s']:.1f} / {f['switches']}"

    head = [f"recorded {c}" for c in codes] + [now_label]
    print("| run | " + " | ".join(head) + " | differs from |")
    print("|---|" + "---|" * (len(head) + 1))
    for row in rows:
        cur = f"not {now_label}" if row["now"] is None else cell(row["now"])
        cells = [cell(row["recorded"].get(c)) for c in codes] + [cur]
        print(f"| {row['run']} | " + " | ".join(cells) + " | " + (", ".join(row["differs_from"]) or "-") + " |")
    for c in codes:
        print(f"- {c}: {recorded['codes'][c].get('label') or ''}")
    for c in codes:
        on = [row for row in rows if row["now"] is not None and c != row["now"]["code"] and c in row["recorded"]]
        if on:
            print(f"against {c}: {sum(c not in row['differs_from'] for row in on)} of {len(on)} runs the same "
                  "(rollout time to 0.05 s and switch count)")
    for name, why in missing.items():
        print(f"not {now_label}: {name} ({why})")


def _print_recorded(args: argparse.Namespace, refs: list[Ref], recorded: dict, current: str) -> int:
    """``--recorded``: every recorded code against the figures recorded for one code, with
    no simulation (the comparison the tables' provenance needs)."""
    code = current if args.recorded == "current" else args.recorded
    if code not in recorded["codes"]:
        known = ", ".join(recorded["codes"]) or "none"
        what = "the current code" if args.recorded == "current" else "code"
        print(f"error: {what} {code} has no figures in {args.file} (recorded: {known}); run without "
              "--recorded to simulate it, or name a recorded code", file=sys.stderr)
        return 2
    now, missing = {}, {}
    for r in refs:
        f = recorded["runs"].get(r.name, {}).get("by_code", {}).get(code)
        if f is None:
            missing[r.name] = f"no figure recorded for {code}"
        else:
            now[r.name] = {**f, "code": code, "spec": f.get("policy"), "command": r.command()}
    _print(args, compare(refs, now, recorded, missing), recorded, code, missing, None, now_label=f"as {code}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=None, help="processes (default: the CPU count)")
    ap.add_argument("--only", nargs="+", default=None, metavar="SUBSTRING",
                    help="only the runs whose name contains one of these (e.g. 'mimo coding', 'x3')")
    ap.add_argument("--out", type=Path, default=Path(".prorsa/reference-runs"), help="cache directory")
    ap.add_argument("--file", type=Path, default=RECORD, help=f"the figures recorded (default: {RECORD.name} here)")
    ap.add_argument("--record", action="store_true", help="add the current figures to --file")
    ap.add_argument("--label", default=None, help="with --record: what the current code is (kept beside its key)")
    ap.add_argument("--alias", action="append", default=[], metavar="SPEC=OTHER",
                    help="run OTHER in place of SPEC (code that names the policy otherwise)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], metavar="K",
                    help="the seeds to run each reference run with (default: 0; others are named '... seed K')")
    ap.add_argument("--json", action="store_true", help="print the comparison as JSON")
    ap.add_argument("--recorded", nargs="?", const="current", default=None, metavar="CODE",
                    help="run nothing: compare every recorded code with the figures recorded for CODE "
                         "(a key of --file; default: the current code's key, which must be recorded)")
    args = ap.parse_args()
    if args.recorded is not None and args.record:
        ap.error("--recorded runs nothing, so there is nothing to --record")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from prorsa_sim.runner import Job, code_versions, default_jobs, run_jobs
    from prorsa_sim.simconfig import build_config

    if any(k < 0 for k in args.seeds):
        ap.error("--seeds must be >= 0")
    refs = [replace(r, seed=k) for r in REFS for k in dict.fromkeys(args.seeds)]
    refs = [r for r in refs if args.only is None or any(o in r.name for o in args.only)]
    if not refs:
        ap.error(f"--only {args.only}: no run matches; the runs are: " + "; ".join(r.name for r in REFS))
    if args.jobs is not None and args.jobs < 1:
        ap.error("--jobs must be >= 1")
    aliases = {}
    for item in args.alias:
        spec, sep, other = item.partition("=")
        if not sep or not spec or not other:
            ap.error(f"--alias {item!r}: expected SPEC=OTHER")
        aliases[spec] = other
    try:
        recorded = _read_record(args.file)
    except (OSError, ValueError) as e:
        print(f"error: cannot read {args.file}: {e}", file=sys.stderr)
        return 2
    versions = code_versions()
    print(f"code: simulator {versions.sim}, allocator and forecaster {versions.allocator}", file=sys.stderr)
    if args.recorded is not None:
        return _print_recorded(args, refs, recorded, f"{versions.sim}+{versions.allocator}")
    runnable, jobs, missing = [], [], {}
    for r in refs:
        spec = aliases.get(r.spec, r.spec)
        try:
            build_policy(spec)
        except ValueError as e:  # a policy this code does not have
            missing[r.name] = f"{spec}: {e}"
            continue
        p, d = (int(x) for x in r.start.split(":"))
        cfg = build_config(workload=r.workload, model=r.model, staleness=r.staleness, steps=r.steps, seed=r.seed,
                           dp_routing=r.dp_routing, router_policy=r.router_policy)
        runnable.append(r)
        jobs.append(Job(cfg, spec, start=None if r.fixed else (p, d)))
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as prog:
        task = prog.add_task("reference runs", total=len(jobs))
        results = run_jobs(jobs, n_jobs=args.jobs or default_jobs(), cache_dir=args.out,
                           progress=lambda _job: prog.advance(task), version=versions)
    wall = time.perf_counter() - t0
    code = f"{versions.sim}+{versions.allocator}"
    now = {r.name: {"rollout_s": round(float(s["rollout_time_s"]), 1), "switches": int(s["switches"]),
                    "code": code, "version": versions(job), "spec": job.spec, "command": r.command()}
           for r, job, s in zip(runnable, jobs, results)}

    _print(args, compare(refs, now, recorded, missing), recorded, code, missing, wall, now_label="on this code")
    print(f"{len(jobs)} runs, {wall:.1f} s of wall time", file=sys.stderr)
    if args.record:
        entry = recorded["codes"].setdefault(code, {})
        if args.label:
            entry["label"] = args.label
        for name, f in now.items():
            run = recorded["runs"].setdefault(name, {"by_code": {}})
            run["command"] = f["command"]
            run["by_code"][code] = {"rollout_s": f["rollout_s"], "switches": f["switches"], "policy": f["spec"],
                                    "version": f["version"]}
        args.file.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
        print(f"recorded {len(now)} runs under {code} in {args.file}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
