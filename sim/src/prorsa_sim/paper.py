"""``prorsa sim paper``: the paper's §5 figures beside the simulator's.

It runs the paper's settings (3 models x math / coding / general x staleness 0, 2, 8 at
128 GPUs and 512 trajectories a step), each as colocation and PD over several seeds, and
prints every figure of the paper's evaluation next to the simulator's: the paper's value
or range, the simulator's (mean over seeds, with its spread), whether it lies in the
paper's range and by how much it misses (:func:`miss`).

"PD" is the best static P:D ratio of the setting (the sweep, per seed) unless a switching
policy is named (``pd_policy``: it then starts from that best static ratio, as every
comparison does, :mod:`prorsa_sim.compare`). The paper's PD figures are Prorsa's, i.e. PD
with role switching; the static ratio is the paper's ablation baseline (Fig. 7).

Calibrated or checked: every paper figure here is a **check** -- no constant of the cost
model or of the workloads was set from any of them (docs/simulator.md: the workload
parameters are CHOICES; the cost model is built from [LMSYS], the models' configs and
SGLang, see ``prorsa sim calibrate``). One figure is also asserted by a test without being
fitted: §5.4's coding/general trajectory-time ratio (``sim/tests/test_workloads.py`` checks
it lies in 3-5x on DeepSeek-V3.2 in sync colocation).

Every simulation is cached in ``OUT/runs/<setting>_<policy>_seed<s>.json`` (with a hash of
the simulator's code), so an interrupted or extended report resumes where it stopped.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from .compare import Setting, run_matrix, spread
from .runner import FULL_GRID, code_versions, default_jobs
from .simconfig import SimConfig

MODELS = ("qwen3-235b", "deepseek-v3.2", "mimo-v2.5-pro")
WORKLOADS = ("math", "coding", "general")
STALENESS = (0, 2, 8)
"""[P] §5: on-policy (sync), max staleness 2 and 8."""

POINT_TOLERANCE = 0.10
"""CHOICE: a point figure of the paper (no range given) counts as met when the simulator's
value is within 10% of it -- about the spread the paper's own figures show between
neighbouring settings; the miss is reported either way."""

QUICK = {"steps": 3, "seeds": [0], "grid": 4}
"""``--quick``: 1 warm-up + 2 measured steps, one seed, a 4-point static grid (1:7, 3:5,
5:3, 7:1 on 8 engines) -- a preview, not the measurement (the full report: 6 steps, seeds
0, 1, 2, every ratio of 8 engines / 7 of Qwen3's 32)."""

FULL = {"steps": 6, "seeds": [0, 1, 2], "grid": FULL_GRID}

# --- the paper's figures ----------------------------------------------------------------

TABLE2 = {
    # [P] Table 2: mean end-to-end trajectory completion time (s), general agent task.
    "qwen3-235b": {"colocation": (133.88, 169.14, 176.55), "prorsa": (78.98, 86.96, 80.40)},
    "deepseek-v3.2": {"colocation": (713.05, 723.96, 939.54), "prorsa": (119.47, 123.21, 128.12)},
    "mimo-v2.5-pro": {"colocation": (253.17, 198.08, 252.36), "prorsa": (195.35, 158.90, 216.42)},
}
FIG5_SPEEDUP = {
    # [P] §5.2 / Fig. 5: Prorsa's rollout speedup over colocation.
    ("deepseek-v3.2", "coding"): (2.54, 4.05),
    ("deepseek-v3.2", "general"): (2.35, 2.99),
}
FIG5_AGENTIC = (1.11, 4.05)
"""[P] §5.2: both agentic tasks, all models and staleness settings."""
FIG5_MATH_NORM = (0.86, 1.28)
"""[P] §5.2: math, normalised rollout step time (PD / colocation), all settings."""
FIG6_IDLE = (0.0376, 0.5998)
"""[P] §5.3 / Fig. 6: colocation GPU idle ratio, all settings."""
FIG6_IDLE_DEEPSEEK = (0.3621, 0.5998)
"""[P] §5.3: DeepSeek-V3.2 (16 attention DP ranks)."""
MIMO_AGENTIC_IDLE_MAX = 0.26
"""[P] §3.2: MiMo-V2.5-Pro, the two agentic tasks: idle ratio "up to 26%"."""
S54_TRAJ = {"coding": 846.0, "general": 216.0}
"""[P] §5.4: MiMo-V2.5-Pro mean trajectory completion time (s)."""
S54_RATIO = 846.0 / 216.0
FIG7_BEST = {"math": (4, 4), "coding": (5, 3), "general": (3, 5)}
"""[P] §5.4 / Fig. 7: MiMo-V2.5-Pro's optimal fixed P:D ratios."""

CHECK = "check"
CHECK_TESTED = "check (asserted in 3-5x by sim/tests/test_workloads.py, not fitted)"


def miss(value: float | None, lo: float, hi: float | None = None, tolerance: float = POINT_TOLERANCE) -> dict:
    """Where ``value`` lies against the paper's range ``[lo, hi]`` (a point figure when
    ``hi`` is None: the range is ``lo`` +- ``tolerance``). ``miss_abs`` / ``miss_rel``: how
    far outside the range (signed: negative below, positive above; 0 inside), absolute and
    relative to the nearest bound."""
    point = hi is None
    a, b = (lo * (1 - tolerance), lo * (1 + tolerance)) if point else (lo, hi)
    if value is None:
        return {"within": None, "miss_abs": None, "miss_rel": None, "band": [a, b], "point": point}
    if value < a:
        bound = a
    elif value > b:
        bound = b
    else:
        bound = None
    if bound is None:
        return {"within": True, "miss_abs": 0.0, "miss_rel": 0.0, "band": [round(a, 6), round(b, 6)], "point": point}
    return {
        "within": False, "miss_abs": round(value - bound, 6),
        "miss_rel": round(value / bound - 1, 6) if bound else None,
        "band": [round(a, 6), round(b, 6)], "point": point,
    }


@dataclass(frozen=True)
class Options:
    models: tuple[str, ...] = MODELS
    workloads: tuple[str, ...] = WORKLOADS
    staleness: tuple[int, ...] = STALENESS
    seeds: tuple[int, ...] = (0, 1, 2)
    steps: int = 6
    grid: int = FULL_GRID
    jobs: int = 1
    pd_policy: str | None = None
    batch_size: int = 512
    gpus: int = 128
    quick: bool = False
    dp_routing: str = "load"
    router_policy: str = "queue"


def _cfg(o: Options, model: str, workload: str, staleness: int) -> SimConfig:
    return SimConfig(workload=workload, model=model, staleness=staleness, steps=o.steps,
                     batch_size=o.batch_size, total_gpus=o.gpus, dp_routing=o.dp_routing,
                     router_policy=o.router_policy)


def _policies(o: Options) -> list[str]:
    return ["colocation", "static"] + ([o.pd_policy] if o.pd_policy else [])


def run_settings(o: Options, out: Path, progress=None, on_total=None, version=None) -> list[dict]:
    """Run (or load from ``out``'s cache) every setting; one aggregated entry per setting
    (:func:`prorsa_sim.compare.run_matrix`: colocation and the sweep of every setting at
    once, then the switching policy from each seed's best static ratio)."""
    version = version or code_versions()
    settings = [(m, w, s) for m in o.models for w in o.workloads for s in o.staleness]
    mat = run_matrix([Setting(_cfg(o, m, w, s)) for m, w, s in settings], _policies(o), list(o.seeds), o.jobs,
                     "best", o.grid, out, progress, on_total, version)
    entries = []
    for i, (m, w, s) in enumerate(settings):
        rows = {r["spec"]: r for r in mat.rows(i)}
        pd_row = rows[o.pd_policy] if o.pd_policy else rows["static"]
        co = rows["colocation"]
        entries.append({
            "model": m, "workload": w, "staleness": s,
            "colocation": _agg(co), "pd": _agg(pd_row), "static": _agg(rows["static"]),
            "pd_policy": pd_row["policy"], "best_ratio_per_seed": rows["static"]["best_ratio_per_seed"],
            "speedup": pd_row["speedup"], "speedup_per_seed": pd_row["speedup_per_seed"],
            "static_sweep_per_seed": [r.get("static_sweep") for r in rows["static"]["per_seed"]],
            "ideal_split_moves_per_seed": [r["ideal_split"]["moves_max"] for r in co["per_seed"]],
            "traj_reduction": _ratio(co["mean_trajectory_s"]["mean"], pd_row["mean_trajectory_s"]["mean"]),
            "phases": {"colocation": _phases(co), "pd": _phases(pd_row)},
            **_ceiling(co),
        })
    return entries


def _phases(row: dict) -> dict:
    """Over the seeds, where the policy's trajectories spend their time (seconds per phase,
    ``summary.phase_breakdown``): the mean trajectory, and in sync the step-ending one."""
    out = {}
    for part in ("mean", "step_tail"):
        got = [r["trajectory_phases_s"][part] for r in row["per_seed"]
               if r.get("trajectory_phases_s", {}).get(part)]
        if got:
            out[part] = {k: round(sum(g[k] for g in got) / len(got), 2) for k in got[0]}
    return out


def _ceiling(co: dict) -> dict:
    """Sync only: the step's floor (``summary.phase_breakdown``: the largest, over its
    trajectories, of their sandbox, tools and reward, which the same plans make the same
    under every policy, plus their decode steps at the fastest step) and the highest rollout
    speedup over colocation any P:D split could reach, colocation's step time over that
    floor, per seed."""
    floors, ceil = [], []
    for r in co["per_seed"]:
        f = r.get("trajectory_phases_s", {}).get("floor_s")
        if not f or not r.get("rollout_time_s"):
            return {}
        floors.append(f)
        ceil.append(r["rollout_time_s"] / f)
    if not floors:
        return {}
    return {"floor_s": spread(floors), "speedup_ceiling": spread(ceil)}


def _agg(row: dict) -> dict:
    keys = ("rollout_time_s", "warmup_step_s", "mean_trajectory_s", "gpu_idle_ratio", "gpu_imbalance_ratio",
            "gpu_unused_ratio", "switches", "preemptions")
    return {"policy": row["policy"], **{k: row[k] for k in keys}}


def _ratio(a, b):
    return round(a / b, 4) if a and b else None


def _get(entries, m, w, s):
    for e in entries:
        if (e["model"], e["workload"], e["staleness"]) == (m, w, s):
            return e
    return None


def _row(section, figure, setting, paper, lo, hi, sim, spread=None, status=CHECK, note="", unit=""):
    return {
        "section": section, "figure": figure, "setting": setting, "paper": paper, "sim": sim,
        "sim_spread": spread, "unit": unit, **miss(sim, lo, hi), "status": status, "note": note,
    }


def _sp(d: dict | None) -> list | None:
    return [d["min"], d["max"]] if d and d.get("min") is not None else None


def figures(entries: list[dict], o: Options) -> list[dict]:
    """Every paper figure the run covers, beside the simulator's (see :func:`miss`)."""
    rows: list[dict] = []
    stal_name = {0: "on-policy", 2: "staleness 2", 8: "staleness 8"}
    pd_name = o.pd_policy or "best static"
    # Table 2.
    for m in o.models:
        if m not in TABLE2:
            continue
        for i, s in enumerate(STALENESS):
            e = _get(entries, m, "general", s)
            if e is None:
                continue
            setting = f"{m} / general / {stal_name[s]}"
            co, pd = e["colocation"]["mean_trajectory_s"], e["pd"]["mean_trajectory_s"]
            pc, pp = TABLE2[m]["colocation"][i], TABLE2[m]["prorsa"][i]
            rows.append(_row("Table 2", "trajectory time, colocation (s)", setting, pc, pc, None, co["mean"], _sp(co), unit="s"))
            rows.append(_row("Table 2", f"trajectory time, PD (paper: Prorsa; sim: {pd_name}) (s)", setting, pp, pp, None,
                             pd["mean"], _sp(pd), unit="s"))
            rows.append(_row("Table 2", "trajectory-time reduction, colocation / PD (x)", setting, round(pc / pp, 3),
                             round(pc / pp, 3), None, e["traj_reduction"], unit="x"))
    # Fig. 5 speedups, per setting, then the range over staleness.
    for m in o.models:
        for w in o.workloads:
            es = [e for e in (_get(entries, m, w, s) for s in o.staleness) if e is not None]
            if not es:
                continue
            if w == "math":
                lo, hi = FIG5_MATH_NORM
                fig, src = "normalised rollout step time, PD / colocation", "Fig. 5 (math, all models)"
                vals = [(e, _inv(e["speedup"]["mean"]), _inv_spread(e["speedup"])) for e in es]
            else:
                lo, hi = FIG5_SPEEDUP.get((m, w), FIG5_AGENTIC)
                src = "Fig. 5 (DeepSeek-V3.2)" if (m, w) in FIG5_SPEEDUP else "Fig. 5 / §5.2 (agentic, all models)"
                fig = f"rollout speedup, PD ({pd_name}) over colocation"
                vals = [(e, e["speedup"]["mean"], _sp(e["speedup"])) for e in es]
            for e, v, sp in vals:
                rows.append(_row(src, fig, f"{m} / {w} / {stal_name[e['staleness']]}", f"{lo}-{hi}", lo, hi, _round(v),
                                 sp, unit="x"))
                if w != "math" and e.get("speedup_ceiling"):
                    c, f = e["speedup_ceiling"], e["floor_s"]
                    rows.append(_row(src, "the highest speedup any P:D split could give: colocation's sync step over "
                                     "its floor", f"{m} / {w} / {stal_name[e['staleness']]}", f"{lo}-{hi}", lo, hi,
                                     c["mean"], _sp(c), unit="x", status="ceiling: no split is faster",
                                     note=f"floor {f['mean']:.0f} s (tools, sandbox, reward and decode steps at the "
                                          f"fastest step) of colocation's {e['colocation']['rollout_time_s']['mean']:.0f} s"))
            got = [v for _, v, _ in vals if v is not None]
            if len(got) > 1:
                rows.append(_row(src, fig + " -- range over staleness", f"{m} / {w}", f"{lo}-{hi}", lo, hi,
                                 None, [round(min(got), 3), round(max(got), 3)], unit="x",
                                 note="the sim range's bounds are each checked by the per-setting rows"))
    # Fig. 6 idle ratios (colocation).
    for e in entries:
        m = e["model"]
        lo, hi = FIG6_IDLE_DEEPSEEK if m == "deepseek-v3.2" else FIG6_IDLE
        src = "Fig. 6 (DeepSeek-V3.2)" if m == "deepseek-v3.2" else "Fig. 6 (all settings)"
        idle = e["colocation"]["gpu_idle_ratio"]
        rows.append(_row(src, "colocation GPU idle ratio", f"{m} / {e['workload']} / {stal_name[e['staleness']]}",
                         f"{lo:.2%}-{hi:.2%}", lo, hi, idle["mean"], _sp(idle), unit="ratio",
                         note="the paper does not say which tasks Fig. 6 covers" if e["workload"] == "math" else ""))
    mimo = [e for e in entries if e["model"] == "mimo-v2.5-pro" and e["workload"] in ("coding", "general")]
    if mimo:
        top = max(mimo, key=lambda e: e["colocation"]["gpu_idle_ratio"]["mean"] or 0)
        rows.append(_row("§3.2", "MiMo agentic colocation idle ratio, max over settings", "mimo-v2.5-pro / agentic",
                         MIMO_AGENTIC_IDLE_MAX, MIMO_AGENTIC_IDLE_MAX, None, top["colocation"]["gpu_idle_ratio"]["mean"],
                         unit="ratio", note=f"max at {top['workload']} / {stal_name[top['staleness']]}"))
    # §5.4: MiMo coding vs general trajectory time.
    for s in o.staleness:
        c, g = _get(entries, "mimo-v2.5-pro", "coding", s), _get(entries, "mimo-v2.5-pro", "general", s)
        setting = f"mimo-v2.5-pro / {stal_name[s]} / PD ({pd_name})"
        for w, e in (("coding", c), ("general", g)):
            if e is not None:
                v = e["pd"]["mean_trajectory_s"]
                rows.append(_row("§5.4", f"{w} trajectory time (s)", setting, S54_TRAJ[w], S54_TRAJ[w], None, v["mean"],
                                 _sp(v), unit="s", note="the paper does not name the staleness; every setting is shown"))
        if c is not None and g is not None:
            r = _ratio(c["pd"]["mean_trajectory_s"]["mean"], g["pd"]["mean_trajectory_s"]["mean"])
            rows.append(_row("§5.4", "coding / general trajectory time (x)", setting, round(S54_RATIO, 3), S54_RATIO,
                             None, r, unit="x", status=CHECK_TESTED))
    # Fig. 7: MiMo's best fixed ratio per task (within one engine = the bar).
    for w in o.workloads:
        for s in o.staleness:
            e = _get(entries, "mimo-v2.5-pro", w, s)
            if e is None:
                continue
            pp, pdn = FIG7_BEST[w]
            ratios = e["best_ratio_per_seed"]
            ps = [int(r.split(":")[0]) for r in ratios]
            mean_p = sum(ps) / len(ps)
            rows.append(_row("Fig. 7", "best fixed ratio: prefill engines of 8", f"mimo-v2.5-pro / {w} / {stal_name[s]}",
                             f"{pp}:{pdn}", pp - 1, pp + 1, round(mean_p, 3), [min(ps), max(ps)], unit="engines",
                             note="range = within one engine; sim ratios per seed: " + ", ".join(ratios)))
    return rows


def _inv(x):
    return 1.0 / x if x else None


def _inv_spread(sp: dict):
    if not sp or sp.get("min") is None or not sp["min"] or not sp["max"]:
        return None
    return [round(1 / sp["max"], 4), round(1 / sp["min"], 4)]


def _round(x, nd=4):
    return round(x, nd) if x is not None else None


def must_show(entries: list[dict]) -> list[dict]:
    """The bars this testbed must clear (DeepSeek-V3.2 speedups and idle, MiMo's best
    ratios within one engine, the ideal split moving by >= 2 engines within a step)."""
    out = []
    for e in entries:
        m, w, s = e["model"], e["workload"], e["staleness"]
        setting = f"{m} / {w} / {s}"
        sp = e["speedup"]["mean"]
        if m == "deepseek-v3.2" and w in ("coding", "general"):
            c = e.get("speedup_ceiling")
            out.append({"bar": "PD >= 2x colocation", "setting": setting, "value": sp, "ok": bool(sp and sp >= 2.0),
                        "note": f"no split can reach 2x: at most {c['mean']:.2f}x (the step's floor)"
                                if c and c["mean"] < 2.0 else ""})
            idle = e["colocation"]["gpu_idle_ratio"]["mean"]
            out.append({"bar": "colocation idle >= 30%", "setting": setting, "value": idle, "ok": bool(idle and idle >= 0.30)})
        if m == "deepseek-v3.2" and w == "math":
            v = _inv(sp)
            out.append({"bar": "math PD/colocation step time in 0.8-1.35", "setting": setting, "value": _round(v),
                        "ok": bool(v and 0.8 <= v <= 1.35)})
        if m == "mimo-v2.5-pro":
            pp = FIG7_BEST[w][0]
            ps = [int(r.split(":")[0]) for r in e["best_ratio_per_seed"]]
            out.append({"bar": f"MiMo best ratio within one engine of {pp}:{8 - pp}", "setting": setting,
                        "value": e["best_ratio_per_seed"], "ok": all(abs(p - pp) <= 1 for p in ps)})
        moves = e["ideal_split_moves_per_seed"]
        out.append({"bar": "ideal split moves >= 2 engines within a step (colocation run)", "setting": setting,
                    "value": moves, "ok": bool(moves) and min(moves) >= 2})
    return out


def git_commit() -> str | None:
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                           cwd=Path(__file__).parent, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], capture_output=True, text=True,
                               cwd=Path(__file__).parent, timeout=10).stdout.strip()
        return r.stdout.strip() + ("+dirty" if dirty else "") if r.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def report(o: Options, out: Path, progress=None, on_total=None) -> dict:
    """Run the settings (cached in ``out``) and build the report."""
    out.mkdir(parents=True, exist_ok=True)
    version = code_versions()
    entries = run_settings(o, out, progress, on_total, version)
    return {
        "meta": {
            "models": list(o.models), "workloads": list(o.workloads), "staleness": list(o.staleness),
            "seeds": list(o.seeds), "steps": o.steps, "measured_steps": max(0, o.steps - 1), "grid": o.grid,
            "batch_size": o.batch_size, "gpus": o.gpus, "pd": o.pd_policy or "best static (sweep)",
            "dp_routing": o.dp_routing, "router_policy": o.router_policy,
            "quick": o.quick, "code_version": str(version),
            "allocator_code_version": version.allocator if o.pd_policy else None, "commit": git_commit(),
            "point_tolerance": POINT_TOLERANCE,
            "calibration": "no paper §5 figure was used to set a constant: every row is a check "
                           "(prorsa sim calibrate shows what the cost model is built from)",
        },
        "settings": entries,
        "figures": figures(entries, o),
        "must_show": must_show(entries),
    }


def options(models=None, workloads=None, staleness=None, seeds=None, steps=None, grid=None, jobs=None,
            pd_policy=None, batch_size=512, gpus=128, quick=False, dp_routing="load",
            router_policy="queue") -> Options:
    """Options with the ``--quick`` or full preset filling what is not given."""
    preset = QUICK if quick else FULL
    return Options(
        models=tuple(models or MODELS), workloads=tuple(workloads or WORKLOADS),
        staleness=tuple(STALENESS if staleness is None else staleness),
        seeds=tuple(preset["seeds"] if seeds is None else seeds),
        steps=preset["steps"] if steps is None else steps, grid=preset["grid"] if grid is None else grid,
        jobs=default_jobs() if jobs is None else jobs, pd_policy=pd_policy, batch_size=batch_size, gpus=gpus,
        quick=quick, dp_routing=dp_routing, router_policy=router_policy,
    )
