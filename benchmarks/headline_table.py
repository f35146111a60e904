# Over 400 lines on purpose: a standalone benchmark script (the sweep, its tables and the paper
# figures they are checked against, the markdown and JSON it writes) that runs by itself.
"""The headline comparison: rollout time of every policy on every setting of the paper
(math, coding, general x staleness 0 / 2 / 8) on DeepSeek-V3.2 (speedups over colocation)
and MiMo-V2.5-Pro (speedups over the paper's fixed ratio, the paper's Fig. 7 ablation).

    .venv/bin/python benchmarks/headline_table.py [--jobs N]            # the full sweep
    .venv/bin/python benchmarks/headline_table.py --quick --models mimo-v2.5-pro \\
        --workloads general --staleness 2 --jobs 1                      # a preview in minutes

Columns: colocation; the paper's fixed ratio (MiMo, Fig. 7: 4:4 math, 5:3 coding, 3:5
general; the paper gives none for DeepSeek-V3.2: '-'); the hindsight-best fixed ratio (the
static sweep, per seed); reactive; ``prorsa:paper`` (the paper's section 4.2 rule);
``prorsa`` (the default priced rule, its objective by the run's mode); ``bound`` (the hindsight-best dynamic schedule the
search finds, ``bound[:grid_s][:beam=B]``). Every switching policy starts from the best
static ratio of its seed (``runner.run_matrix``, the common start of ``prorsa sim
compare``), or with ``--start paper`` from MiMo-V2.5-Pro's fixed ratio of Fig. 7 (the
ratio a user without the hindsight sweep would configure: does switching find the best
one from there?), or from ``--start P:D``; colocation is its own baseline; the bound
chooses its own start (the best static ratio), runs last, and counts the switching
policies' runs of its seed among its candidates (replayed request for request), so it is
never slower than any of them.

The measurement rule is the simulator's: the first step is the warm-up, reported apart;
the rollout time is the mean of the steps after it. Each figure is the mean over seeds
with the min-max; the bound runs on fewer seeds (``--bound-seeds``), and every figure
that involves it is over those seeds only. Per policy: the speedup over the baseline and
over the best fixed ratio, the share of the gap between the best fixed ratio and the bound
that the policy recovers, (static - policy) / (static - bound), '-' where the bound is
less than 1% faster than the best fixed ratio, switches per measured step and flip-backs
(an engine switched back within its own previous switch time, ``summary.switch_stats``).

Every simulation is cached in OUT/runs (keyed by setting, policy, seed, start and a hash of
the code it depends on: the simulator's, plus the allocator's and forecaster's for the
``prorsa`` policies), so an interrupted sweep resumes and a re-run only simulates what
changed; they run in ``--jobs`` processes (default: the CPU count). Prints Markdown tables
and writes OUT/headline.json and OUT/headline.md. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from prorsa_emulated.costmodel import get_profile
from prorsa_sim.paper import FIG5_MATH_NORM, FIG5_SPEEDUP, FIG7_BEST, git_commit
from prorsa_sim.progress import sweep_bar
from prorsa_sim.compare import Matrix, Setting, run_matrix, spread
from prorsa_sim.runner import FULL_GRID, check_split, code_versions, default_jobs
from prorsa_sim.simconfig import SimConfig, build_config
from prorsa_sim.simulation import parse_start
from prorsa_sim.workloads import get_workload

MODELS = ("deepseek-v3.2", "mimo-v2.5-pro")
WORKLOADS = ("math", "coding", "general")
STALENESS = (0, 2, 8)
SWITCHING = ("reactive", "prorsa:paper", "prorsa")

BASELINE = {"deepseek-v3.2": "colocation", "mimo-v2.5-pro": "paper fixed"}
"""What the speedups are over: DeepSeek-V3.2 against colocation (the paper's Fig. 5),
MiMo-V2.5-Pro against its fixed ratio (the paper's Fig. 7 ablation)."""
PAPER_FIXED = {"mimo-v2.5-pro": FIG7_BEST}
"""The paper's fixed P:D ratios (Fig. 7); only MiMo-V2.5-Pro has them."""
FIG7_SPEEDUP = (1.0, 1.44)
"""[P] section 5.4 / Fig. 7: role switching over the fixed ratios, MiMo-V2.5-Pro."""

FULL = {"steps": 6, "seeds": [0, 1, 2], "grid": FULL_GRID, "bound_seeds": [0],
        "bound": {"math": "bound:120", "coding": "bound:300", "general": "bound:60"}}
"""6 steps (1 warm-up + 5 measured), 3 seeds, every ratio of 8 engines; the bound with the
default beam (2), on seed 0 only (its search costs hundreds of simulations of up to a step
each: docs/simulator.md, "The bound"). CHOICE: its grid follows the steps' length, about a
fifth of a step or less: 60 s on general and 120 s on math (steps of a few hundred seconds
to about 1,000 s), 300 s on coding (1,200-2,300 s), where a 60 s grid would be ~200
segments a search."""
QUICK = {"steps": 3, "seeds": [0], "grid": 4, "bound_seeds": [0],
         "bound": {"math": "bound:120:beam=1", "coding": "bound:300:beam=1", "general": "bound:120:beam=1"}}
"""A preview: 3 steps (1 warm-up + 2), one seed, the bound with beam 1 on a coarser grid. The
static grid is coarse (4 points: 1:7, 3:5, 5:3, 7:1, plus MiMo's paper ratio) only without
the bound: the bound's search runs every ratio itself, so a coarser grid saves a few
simulations at most, and it makes the switching policies start off the best ratio (on
MiMo general/2 and DeepSeek general/2 the 4-point grid misses the best, 4:4 and 6:2)."""

START_TEXT = {"best": "its seed's best static ratio of the grid",
              "paper": "the paper's fixed ratio (Fig. 7: 4:4 math, 5:3 coding, 3:5 general)"}
"""The header's words for ``--start``; a P:D start is named as it is."""

GAP_MIN = 0.01
"""A gap between the best fixed ratio and the bound under 1% of the best fixed ratio's
time: no share is reported (within the noise of one policy against another)."""


def paper_range(model: str, workload: str) -> tuple[float, float] | None:
    """The paper's speedup range for this column's baseline (None: the paper gives none)."""
    if workload not in WORKLOADS:
        return None  # a recorded workload: the paper has no figure for it
    if model == "mimo-v2.5-pro":
        return FIG7_SPEEDUP
    if workload == "math":
        lo, hi = FIG5_MATH_NORM  # normalised step time PD / colocation, all models
        return (round(1 / hi, 2), round(1 / lo, 2))
    return FIG5_SPEEDUP.get((model, workload))


# --- the sweep ---------------------------------------------------------------------------------


def _cfg(a, model: str, workload: str, staleness: int) -> SimConfig:
    return build_config(workload=workload, model=model, staleness=staleness, steps=a.steps, batch_size=a.batch_size,
                        total_gpus=a.gpus, dp_routing=a.dp_routing, router_policy=a.router_policy)


def settings_of(a) -> list[tuple[str, str, int]]:
    return [(m, w, s) for m in a.models for w in a.workloads for s in a.staleness]


def paper_spec(model: str, workload: str) -> str | None:
    r = PAPER_FIXED.get(model, {}).get(workload)
    return f"static:{r[0]}:{r[1]}" if r else None


POLICIES = ["colocation", "static", *SWITCHING]


def start_of(a, model: str, workload: str) -> tuple[int, int] | None:
    """The split the switching policies start from on this setting (``--start``): the
    paper's fixed ratio (``paper``), the one given (``P:D``), or None (``best``: each
    seed's best static ratio, chosen by :func:`runner.run_matrix`)."""
    if a.start == "paper":
        return PAPER_FIXED[model][workload]
    return a.start if isinstance(a.start, tuple) else None


def run(a, version) -> Matrix:
    """Every setting in one :func:`runner.run_matrix` (the bound is each setting's own
    policy: its grid depends on the workload)."""
    sets = []
    for m, w, s in settings_of(a):
        extra = paper_spec(m, w)
        sets.append(Setting(_cfg(a, m, w, s), statics=(extra,) if extra else (),
                            policies=(a.bound[w],) if w in a.bound else (), start=start_of(a, m, w)))
    seeds_for = {spec: a.bound_seeds for spec in a.bound.values()}
    with sweep_bar() as bar:
        return run_matrix(sets, POLICIES, a.seeds, a.jobs, "best", a.grid, a.out, bar.progress, bar.on_total,
                          version, seeds_for)


# --- what the table reports ----------------------------------------------------------------------


def _ratio_of(spec: str) -> str:
    return spec[len("static:"):]


def best_fixed(mat: Matrix, i: int, seed: int, bound: dict | None) -> tuple[str, float, str]:
    """The hindsight-best fixed ratio of a seed: the best of the static runs (the grid and
    the paper's ratio) and, on a seed the bound ran on, of the bound's own static sweep
    (the same simulations, every ratio: it matters only when the grid is coarser)."""
    spec, summ, _ = mat.best[(i, seed)]
    out = (_ratio_of(spec), summ["rollout_time_s"], "sweep")
    if bound is not None:
        for sp, rt in (bound.get("bound_search") or {}).get("static_sweep", {}).items():
            if rt is not None and rt < out[1]:
                out = (_ratio_of(sp), rt, "bound's sweep")
    return out


def _spread_of(per_seed: dict[int, float | None]) -> dict:
    return spread(list(per_seed.values()))


def setting_record(a, mat: Matrix, i: int, m: str, w: str, s: int) -> dict:
    seeds = a.seeds
    runs = mat.runs
    bspec = a.bound.get(w)
    bound_seeds = a.bound_seeds if bspec else []
    bounds = {sd: runs.get((i, sd, bspec)) for sd in bound_seeds}
    fixed = {sd: best_fixed(mat, i, sd, bounds.get(sd)) for sd in seeds}
    pspec = paper_spec(m, w)
    base_spec = pspec if BASELINE[m] == "paper fixed" and pspec else "colocation"

    def rt(spec: str, sd: int) -> float | None:
        if spec == "best fixed":
            return fixed[sd][1]
        r = runs.get((i, sd, spec))
        return None if r is None else r["rollout_time_s"]

    cols: dict[str, dict] = {}
    names = ["colocation", *(["paper fixed"] if pspec else []), "best fixed", *SWITCHING, *(["bound"] if bspec else [])]
    for name in names:
        spec = {"paper fixed": pspec, "bound": bspec}.get(name, name)
        sds = bound_seeds if name == "bound" else seeds
        col: dict = {"spec": spec if name != "best fixed" else None, "seeds": list(sds)}
        times = {sd: rt(spec, sd) for sd in sds}
        col["rollout_time_s"] = _spread_of(times)
        col["rollout_time_per_seed"] = times
        col["speedup"] = _spread_of({sd: _div(rt(base_spec, sd), times[sd]) for sd in sds})
        col["vs_best_fixed"] = _spread_of({sd: _div(fixed[sd][1], times[sd]) for sd in sds})
        if name == "best fixed":
            col["ratio_per_seed"] = {sd: fixed[sd][0] for sd in sds}
            col["found_by"] = {sd: fixed[sd][2] for sd in sds}
            # The warm-up of the grid's best run (a ratio found by the bound's sweep only: not kept).
            col["warmup_step_s"] = spread([mat.best[(i, sd)][1]["warmup_step_s"] for sd in sds
                                           if fixed[sd][2] == "sweep"])
        else:
            summs = {sd: runs[(i, sd, spec)] for sd in sds}
            col["warmup_step_s"] = spread([x["warmup_step_s"] for x in summs.values()])
        if name in (*SWITCHING, "bound"):
            col["start"] = {sd: summs[sd].get("start") for sd in sds}
            for k in ("switches", "switches_measured", "switches_per_step", "flip_backs", "flip_backs_run"):
                col[k] = spread([x.get(k) for x in summs.values()])
            col["flip_back_log"] = {sd: summs[sd].get("flip_back_log", []) for sd in sds}
            shares = {}
            for sd in bound_seeds:
                b = bounds.get(sd)
                if b is None:
                    continue
                st, bt, pt = fixed[sd][1], b["rollout_time_s"], times.get(sd)
                shares[sd] = (None if pt is None or st - bt < GAP_MIN * st else round((st - pt) / (st - bt), 4))
            col["gap_share_per_seed"] = shares
            col["gap_share"] = _spread_of(shares)
        if name == "bound":
            col["search"] = {sd: {k: (summs[sd].get("bound_search") or {}).get(k) for k in (
                "best_static", "best_static_rollout_s", "searched_rollout_s", "seeds", "chosen", "schedule",
                "segments", "lookaheads", "lookaheads_cut", "wall_s", "search_matches_replay")} for sd in sds}
        cols[name] = col
    gaps = {sd: (round((fixed[sd][1] - bounds[sd]["rollout_time_s"]) / fixed[sd][1], 4) if bounds.get(sd) else None)
            for sd in bound_seeds}
    # Sync: the step's floor (docs/simulator.md, "Where the time goes"), the same under every
    # policy: no schedule is faster, so the best fixed ratio over it is all any could gain.
    floors = {sd: ((runs.get((i, sd, "colocation")) or {}).get("trajectory_phases_s") or {}).get("floor_s")
              for sd in seeds}
    start = start_of(a, m, w)
    spec = get_workload(w)
    return {
        # A recorded workload is named by its file and the hash of its plans; agentic when
        # its trajectories have more than one turn.
        "model": m, "workload": spec.name, "staleness": s,
        **({"workload_log": w} if spec.recorded is not None else {}),
        "agentic": w in ("coding", "general") or (spec.recorded is not None and spec.turns_max > 1),
        "baseline": "colocation" if base_spec == "colocation" else f"paper fixed ({_ratio_of(base_spec)})",
        "paper_fixed": _ratio_of(pspec) if pspec else None,
        "bound_spec": bspec,
        "paper_speedup_range": paper_range(m, w),
        "start_per_seed": {sd: f"{start[0]}:{start[1]}" if start else _ratio_of(mat.best[(i, sd)][0]) for sd in seeds},
        "bound_gap_per_seed": gaps,
        "floor_s": _spread_of(floors),
        "headroom_over_floor": _spread_of({sd: _div(fixed[sd][1], floors[sd]) for sd in seeds}),
        "columns": cols,
    }


def _div(a, b):
    return round(a / b, 4) if a and b else None


def must_show(recs: list[dict]) -> list[dict]:
    """The issue's bars, on what this run measured."""
    out = []
    for r in recs:
        c = r["columns"]
        setting = f"{r['model']} {r['workload']}/{r['staleness']}"
        agentic = r["agentic"]
        bound = "bound" if "bound" in c else None
        if bound:
            v = c[bound]["vs_best_fixed"]["min"]
            out.append({"bar": "bound no slower than the best fixed ratio", "setting": setting, "value": v,
                        "ok": v is not None and v >= 1.0 - 1e-9})
        v = c["prorsa"]["vs_best_fixed"]["min"]
        out.append({"bar": "prorsa within 1% of the best fixed ratio", "setting": setting, "value": v,
                    "ok": v is not None and v >= 0.99})
        if agentic:
            pr, re_ = c["prorsa"]["rollout_time_s"]["mean"], c["reactive"]["rollout_time_s"]["mean"]
            out.append({"bar": "prorsa faster than reactive (agentic)", "setting": setting,
                        "value": _div(re_, pr), "ok": bool(pr and re_ and pr < re_)})
        if bound:
            for sd, g in r["bound_gap_per_seed"].items():
                if g is not None and g >= 0.05:
                    sh = c["prorsa"]["gap_share_per_seed"].get(sd)
                    out.append({"bar": "bound >= 5% faster: prorsa recovers >= half the gap", "setting":
                                f"{setting} seed {sd}", "value": sh, "ok": sh is not None and sh >= 0.5})
        if r["model"] == "mimo-v2.5-pro" and r["paper_fixed"]:
            v = c["prorsa"]["speedup"]["mean"]
            out.append({"bar": "MiMo: prorsa over the paper's fixed ratio >= 1.0x (paper 1.0-1.44x)",
                        "setting": setting, "value": v, "ok": v is not None and v >= 1.0})
        if bound:
            fb_b = c[bound]["flip_backs"]["max"] or 0
            for p in SWITCHING:
                fb = c[p]["flip_backs"]["max"]
                out.append({"bar": f"no flip-backs unless the bound flips back ({p})", "setting": setting,
                            "value": fb, "ok": fb is not None and (fb == 0 or fb_b > 0)})
    return out


# --- Markdown ------------------------------------------------------------------------------------


def _t(sp: dict, nd: int = 1) -> str:
    if sp is None or sp.get("mean") is None:
        return "-"
    if sp["n"] > 1 and sp["max"] != sp["min"]:
        return f"{sp['mean']:.{nd}f} ({sp['min']:.{nd}f}-{sp['max']:.{nd}f})"
    return f"{sp['mean']:.{nd}f}"


def _s(v: float | None) -> str:
    """One run's seconds."""
    return "-" if v is None else f"{v:.1f}"


def _x(sp: dict) -> str:
    if sp is None or sp.get("mean") is None:
        return "-"
    if sp["n"] > 1 and sp["max"] != sp["min"]:
        return f"{sp['mean']:.3f}x ({sp['min']:.3f}-{sp['max']:.3f})"
    return f"{sp['mean']:.3f}x"


def _share(sp: dict) -> str:
    if sp is None or sp.get("mean") is None:
        return "-"
    if sp["n"] > 1 and sp["max"] != sp["min"]:
        return f"{100 * sp['mean']:.0f}% ({100 * sp['min']:.0f}-{100 * sp['max']:.0f}%)"
    return f"{100 * sp['mean']:.0f}%"


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def to_markdown(rep: dict) -> str:
    m = rep["meta"]
    bound = "bound" if m["bound"] else None
    cols = [*SWITCHING, *([bound] if bound else [])]
    dag = "†" if bound and m["bound_seeds"] != m["seeds"] else ""
    lines = [
        "# Headline comparison",
        "",
        f"{'QUICK preset (a preview, not the measurement); ' if m['quick'] else ''}{m['steps']} steps (1 warm-up, "
        f"reported apart, + {m['steps'] - 1} measured); seeds {', '.join(map(str, m['seeds']))}; static grid "
        f"{m['grid']} (+ MiMo's paper ratio); batch {m['batch_size']}, {m['gpus']} GPUs; every switching policy "
        f"starts from {START_TEXT.get(m['start'], m['start'])}.",
    ]
    if bound:
        specs = ", ".join(f"`{spec}` on {w}" for w, spec in m["bound"].items() if w in m["workloads"])
        lines.append(f"Bound: {specs}; on seed(s) {', '.join(map(str, m['bound_seeds']))} only{' (†)' if dag else ''}: "
                     "its columns, the gap shares and its flip-backs are over those seeds.")
    lines += [
        f"Code {m['code_version']} (allocator+forecaster {m['allocator_code_version']}), commit {m['commit']}; "
        f"{m['simulations']} simulations, {m['simulated_now']} run now (the rest from the cache): wall "
        f"{m['wall_s']} s with {m['jobs']} process(es).",
        "",
        "Rollout time (simulated s, mean of the measured steps; mean over seeds (min-max)):",
        "",
        _row(["model", "workload", "stale", "colocation", "paper fixed", "best fixed (P:D)", *cols]),
        "|" + "---|" * (6 + len(cols)),
    ]
    for r in rep["settings"]:
        c = r["columns"]
        ratios = "/".join(dict.fromkeys(c["best fixed"]["ratio_per_seed"].values()))
        lines.append(_row([r["model"], r["workload"], str(r["staleness"]), _t(c["colocation"]["rollout_time_s"]),
                           f"{_t(c['paper fixed']['rollout_time_s'])} ({r['paper_fixed']})" if r["paper_fixed"] else "-",
                           f"{_t(c['best fixed']['rollout_time_s'])} ({ratios})",
                           *(_t(c.get(p, {}).get("rollout_time_s")) + (dag if p == bound else "") for p in cols)]))
    lines += ["", "Speedup over the baseline (DeepSeek-V3.2: colocation; MiMo-V2.5-Pro: the paper's fixed ratio), "
              "per seed, then mean (min-max); the paper's range beside it:", "",
              _row(["model", "workload", "stale", "baseline", "best fixed", *cols, "paper"]),
              "|" + "---|" * (6 + len(cols))]
    for r in rep["settings"]:
        c = r["columns"]
        pr = r["paper_speedup_range"]
        lines.append(_row([r["model"], r["workload"], str(r["staleness"]), r["baseline"], _x(c["best fixed"]["speedup"]),
                           *(_x(c.get(p, {}).get("speedup")) + (dag if p == bound else "") for p in cols),
                           f"{pr[0]}-{pr[1]}x" if pr else "-"]))
    lines += ["", "Against the best fixed ratio: speedup / share of the gap between the best fixed ratio and the "
              "bound that the policy recovers, (static - policy) / (static - bound); '-' where the bound is less "
              "than 1% faster than the best fixed ratio; and in sync the step's floor, which no schedule goes "
              "below, with the best fixed ratio's time over it (the most any schedule could gain):", "",
              _row(["model", "workload", "stale", "sync floor s (best fixed over it)", "bound over best fixed",
                    *SWITCHING]),
              "|" + "---|" * (5 + len(SWITCHING))]
    for r in rep["settings"]:
        c = r["columns"]
        floor = r.get("floor_s")
        lines.append(_row([r["model"], r["workload"], str(r["staleness"]),
                           f"{_t(floor)} ({_x(r['headroom_over_floor'])})" if floor and floor.get("mean") else "-",
                           (_x(c.get(bound, {}).get("vs_best_fixed")) + dag) if bound else "-",
                           *(f"{_x(c[p]['vs_best_fixed'])} / {_share(c[p]['gap_share'])}" for p in SWITCHING)]))
    if bound:
        lines += ["", "The bound's answer per seed: the best of the best fixed ratio held, the schedule its search "
                  "found, and each switching policy's own run replayed request for request (simulated s):", "",
                  _row(["model", "workload", "stale", "seed", "chosen", "best fixed held", "searched schedule",
                        "switching runs replayed"]), "|" + "---|" * 8]
        for r in rep["settings"]:
            for sd, q in (r["columns"].get(bound, {}).get("search") or {}).items():
                seeds = ", ".join(f"{name} {_s(v.get('rollout_s'))}" for name, v in (q.get("seeds") or {}).items())
                lines.append(_row([r["model"], r["workload"], str(r["staleness"]), str(sd), str(q.get("chosen")),
                                   _s(q.get("best_static_rollout_s")), _s(q.get("searched_rollout_s")),
                                   seeds or "-"]))
    lines += ["", "No flapping: switches per measured step (flip-backs in the measured steps: an engine switched "
              "back within its own previous switch time, drain included); mean over seeds:", "",
              _row(["model", "workload", "stale", *cols]), "|" + "---|" * (3 + len(cols))]
    for r in rep["settings"]:
        c = r["columns"]
        lines.append(_row([r["model"], r["workload"], str(r["staleness"]),
                           *(f"{_t(c.get(p, {}).get('switches_per_step'), 2)} ({_t(c.get(p, {}).get('flip_backs'), 1)})"
                             + (dag if p == bound else "") for p in cols)]))
    lines += ["", "Warm-up step (simulated s; not in the figures above):", "",
              _row(["model", "workload", "stale", "colocation", "best fixed", *cols]), "|" + "---|" * (5 + len(cols))]
    for r in rep["settings"]:
        c = r["columns"]
        lines.append(_row([r["model"], r["workload"], str(r["staleness"]), _t(c["colocation"]["warmup_step_s"]),
                           _t(c["best fixed"]["warmup_step_s"]), *(_t(c.get(p, {}).get("warmup_step_s")) for p in cols)]))
    notes = []
    for r in rep["settings"] if m["start"] == "best" else []:
        c = r["columns"]
        for sd, by in c["best fixed"]["found_by"].items():
            if by != "sweep":
                notes.append(f"- {r['model']} {r['workload']}/{r['staleness']} seed {sd}: the best fixed ratio "
                             f"({c['best fixed']['ratio_per_seed'][sd]}) is off the grid, from the bound's own sweep; "
                             f"the switching policies started from the grid's best ({r['start_per_seed'][sd]}).")
    if notes:
        lines += ["", *notes]
    lines += ["", "Must show:", "", "| bar | setting | value | ok |", "|---|---|---|---|"]
    for b in rep["must_show"]:
        v = b["value"]
        lines.append(f"| {b['bar']} | {b['setting']} | {'-' if v is None else v} | {'yes' if b['ok'] else 'NO'} |")
    return "\n".join(lines) + "\n"


# --- main ----------------------------------------------------------------------------------------


def _list(values: list[str] | None, cast=str):
    """``--opt a b`` or ``--opt a,b``."""
    if not values:
        return None
    return [cast(x) for v in values for x in v.split(",") if x]


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="preview: 3 steps, seed 0, the bound with beam 1 on a coarser grid (with --no-bound, a "
                    "4-point static grid)")
    ap.add_argument("--models", nargs="+", help=f"default: {' '.join(MODELS)}")
    ap.add_argument("--workloads", nargs="+", help=f"default: {' '.join(WORKLOADS)}")
    ap.add_argument("--staleness", nargs="+", help="default: 0 2 8")
    ap.add_argument("--seeds", nargs="+", help="default 0 1 2 (--quick: 0)")
    ap.add_argument("--steps", type=int, help="steps incl. the warm-up (default 6; --quick: 3)")
    ap.add_argument("--grid", type=int, help=f"static sweep points (default {FULL_GRID}; --quick --no-bound: 4)")
    ap.add_argument("--bound", nargs="+", help="the bound's spec, bound[:grid_s][:beam=B], for every workload or as "
                    "WORKLOAD=SPEC (default: " + " ".join(f"{w}={b}" for w, b in FULL["bound"].items()) + "; --quick: "
                    + " ".join(f"{w}={b}" for w, b in QUICK["bound"].items()) + ")")
    ap.add_argument("--bound-seeds", nargs="+", help="the seeds the bound runs on (default: 0)")
    ap.add_argument("--no-bound", action="store_true", help="leave the bound out")
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--dp-routing", default="load", help="load (default) or prefix (a DP-aware router)")
    ap.add_argument("--router-policy", default="queue",
                    help="queue (default) or smg (SGLang Model Gateway's cache_aware rule; docs/simulator.md)")
    ap.add_argument("--start", default="best",
                    help="the split every switching policy starts from: best (default: each seed's best static "
                    "ratio of the grid), paper (MiMo-V2.5-Pro's fixed ratio of the paper's Fig. 7 for the workload: "
                    "the ratio a user would take from the paper) or P:D")
    ap.add_argument("--with", dest="extra", nargs="+", default=[], metavar="POLICY",
                    help="further switching policies, each a column after prorsa (e.g. prorsa:capacity, the "
                    "capacity-ratio objective on every run, or prorsa:latency, turn latency on every run)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel processes (default: the CPU count)")
    ap.add_argument("--out", type=Path, default=Path(".prorsa/headline"),
                    help="cached runs (OUT/runs), headline.json and headline.md")
    a = ap.parse_args(argv)
    preset = QUICK if a.quick else FULL
    a.models = _list(a.models) or list(MODELS)
    a.workloads = _list(a.workloads) or list(WORKLOADS)
    a.staleness = _list(a.staleness, int) if a.staleness else list(STALENESS)
    a.seeds = _list(a.seeds, int) if a.seeds else list(preset["seeds"])
    a.steps = a.steps or preset["steps"]
    a.grid = a.grid or (FULL_GRID if a.quick and not a.no_bound else preset["grid"])
    bound = dict(preset["bound"])
    for item in _list(a.bound) or []:
        w, _, spec = item.partition("=") if "=" in item.split(":", 1)[0] else ("", "", item)
        if w and w not in WORKLOADS:
            ap.error(f"--bound {item!r}: unknown workload {w!r}")
        # A bare spec is every workload's, a recorded one's too (its grid has no default:
        # it should follow the steps' length, which the script cannot know beforehand).
        bound.update({w: spec} if w else {x: spec for x in [*WORKLOADS, *a.workloads]})
    a.bound = {} if a.no_bound else {w: b for w, b in bound.items() if w in a.workloads}
    a.bound_seeds = _list(a.bound_seeds, int) if a.bound_seeds else [x for x in preset["bound_seeds"] if x in a.seeds]
    a.bound_seeds = [x for x in a.bound_seeds if x in a.seeds] or a.seeds[:1]
    a.jobs = a.jobs or default_jobs()
    for m in a.models:
        if m not in BASELINE:
            ap.error(f"unknown model {m!r}; choose from {', '.join(MODELS)}")
    if a.start == "paper":
        if missing := [m for m in a.models if m not in PAPER_FIXED]:
            ap.error(f"--start paper: the paper gives no fixed ratio for {', '.join(missing)} (Fig. 7 is "
                     f"MiMo-V2.5-Pro's); use --models {' '.join(PAPER_FIXED)} or --start P:D")
    elif a.start != "best":
        try:
            st = parse_start(a.start)  # ("own" is None here: not a start this script takes)
            if not isinstance(st, tuple):
                raise ValueError
        except ValueError:
            ap.error(f"--start {a.start!r}: expected best, paper or P:D (e.g. 4:4)")
        for m in a.models:
            try:
                check_split(*st, get_profile(m).engines_in(a.gpus), m, f"--start {a.start}")
            except ValueError as exc:
                ap.error(str(exc))
        a.start = st
    for w in a.workloads:
        if w.startswith("log:"):
            try:
                get_workload(w)
            except ValueError as exc:
                ap.error(str(exc))
        elif w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}; choose from {', '.join(WORKLOADS)}, or log:PATH")
    try:
        build_config(dp_routing=a.dp_routing, router_policy=a.router_policy)
    except ValueError as exc:
        ap.error(str(exc))
    from prorsa_sim.catalog import make_policy

    a.extra = [x for x in _list(a.extra) or [] if x not in SWITCHING]
    for spec in a.extra:
        try:
            if spec.split(":")[0] not in ("prorsa", "reactive", "oracle"):
                raise ValueError(f"--with takes switching policies (prorsa, reactive, oracle with options), not {spec!r}")
            make_policy(spec)
        except ValueError as exc:
            ap.error(str(exc))
    for spec in a.bound.values():
        try:
            if spec.split(":")[0] != "bound":
                raise ValueError(f"--bound takes bound[:grid_s][:beam=B] specs, not {spec!r}")
            make_policy(spec)
        except ValueError as exc:
            ap.error(str(exc))
    return a


def main(argv=None) -> None:
    global SWITCHING, POLICIES
    a = parse(argv)
    # (the columns every table below iterates over)
    SWITCHING = (*SWITCHING, *a.extra)
    POLICIES = ["colocation", "static", *SWITCHING]
    a.out.mkdir(parents=True, exist_ok=True)
    version = code_versions()
    runs = a.out / "runs"
    # (a run whose cached result is of other code is run again into the same file: count
    # files that are new or rewritten, not only new ones)
    def stamps() -> dict:
        return {f: f.stat().st_mtime_ns for f in runs.glob("*.json")} if runs.exists() else {}

    before = stamps()
    t0 = time.perf_counter()
    mat = run(a, version)
    wall = time.perf_counter() - t0
    simulated = sum(before.get(f) != t for f, t in stamps().items())
    n_runs = len(mat.runs)
    recs = [setting_record(a, mat, i, m, w, s) for i, (m, w, s) in enumerate(settings_of(a))]
    rep = {
        "meta": {
            "quick": a.quick, "models": a.models, "workloads": a.workloads, "staleness": a.staleness,
            "seeds": a.seeds, "steps": a.steps, "measured_steps": a.steps - 1, "grid": a.grid, "bound": a.bound,
            "bound_seeds": a.bound_seeds if a.bound else [], "batch_size": a.batch_size, "gpus": a.gpus,
            "dp_routing": a.dp_routing, "router_policy": a.router_policy,
            "start": a.start if isinstance(a.start, str) else f"{a.start[0]}:{a.start[1]}",
            "jobs": a.jobs, "code_version": version.sim, "allocator_code_version": version.allocator,
            "commit": git_commit(), "wall_s": round(wall, 1), "gap_min": GAP_MIN,
            "simulations": n_runs, "simulated_now": simulated,
        },
        "settings": recs,
        "must_show": must_show(recs),
    }
    (a.out / "headline.json").write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n")
    md = to_markdown(rep)
    (a.out / "headline.md").write_text(md)
    print(md)
    print(f"-> {a.out / 'headline.json'}, {a.out / 'headline.md'}")


if __name__ == "__main__":
    main()
