"""The ``prorsa sim paper`` report as text: its cells (:func:`fmt_value`, :func:`miss_text`)
and its markdown tables (:func:`to_markdown`), for the CLI and ``benchmarks/paper_report.py``."""

from __future__ import annotations


def fmt_value(v, unit=""):
    """A report cell: ``-`` for none, a list in brackets, a ratio in percent."""
    if v is None:
        return "-"
    if isinstance(v, list):
        return "[" + ", ".join(fmt_value(x, unit) for x in v) + "]"
    if isinstance(v, str):
        return v
    if unit == "ratio":
        return f"{100 * v:.1f}%"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def miss_text(r: dict) -> str:
    """How far a figure misses the paper's range: ``in range``, or the miss (absolute, relative)."""
    if r["within"] is None:
        return "-"
    if r["within"]:
        return "in range"
    rel = r["miss_rel"]
    return f"{r['miss_abs']:+.3g} ({100 * rel:+.0f}%)" if rel is not None else f"{r['miss_abs']:+.3g}"


def phase_shares(e: dict, policy: str, part: str = "mean") -> str:
    """The shares of a trajectory's time (the mean one, or in sync the step-ending one)
    spent in prefill (with its queue) and in decode (with the KV transfer), which a P:D
    split changes, as ``prefill+decode%``."""
    ph = e.get("phases", {}).get(policy, {}).get(part)
    total = sum(v for k, v in ph.items() if k != "model") if ph else 0
    if not total:
        return "-"
    return f"{100 * ph['prefill'] / total:.0f}+{100 * ph['decode'] / total:.0f}%"


def ceiling_text(e: dict) -> str:
    """A sync setting's floor and the highest speedup over colocation any split could give."""
    f, c = e.get("floor_s"), e.get("speedup_ceiling")
    return f"{f['mean']:.0f} ({c['mean']:.2f}x)" if f and c else "-"


def to_markdown(rep: dict) -> str:
    """The report as markdown tables (for benchmarks/paper_report.py)."""
    m = rep["meta"]
    lines = [
        "# Simulator vs paper",
        "",
        f"Settings: models {', '.join(m['models'])}; workloads {', '.join(m['workloads'])}; staleness "
        f"{', '.join(map(str, m['staleness']))}; seeds {', '.join(map(str, m['seeds']))}; {m['steps']} steps "
        f"(1 warm-up + {m['measured_steps']} measured); static grid {m['grid']}; batch {m['batch_size']}; "
        f"{m['gpus']} GPUs; PD = {m['pd']}{'; QUICK preset' if m['quick'] else ''}. Code {m['code_version']}"
        f" (commit {m['commit']}).",
        "",
        f"Calibration: {m['calibration']}. Point figures count as met within +-{100 * m['point_tolerance']:.0f}%.",
        "",
        "| source | figure | setting | paper | sim (mean) | sim spread | within | miss | status |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rep["figures"]:
        within = "-" if r["within"] is None else ("yes" if r["within"] else "no")
        lines.append(
            f"| {r['section']} | {r['figure']} | {r['setting']} | {fmt_value(r['paper'], r['unit'])} | "
            f"{fmt_value(r['sim'], r['unit'])} | {fmt_value(r['sim_spread'], r['unit'])} | {within} | {miss_text(r)} | "
            f"{r['status']} |"
        )
    lines += ["", "## Must show", "", "| bar | setting | value | ok | note |", "|---|---|---|---|---|"]
    for b in rep["must_show"]:
        lines.append(f"| {b['bar']} | {b['setting']} | {fmt_value(b['value'])} | {'yes' if b['ok'] else 'NO'} | "
                     f"{b.get('note', '')} |")
    lines += ["", "## Per setting", "",
              "| model | workload | staleness | colocation s | PD s | PD | speedup (min-max) | coloc idle | "
              "traj s coloc -> PD | prefill+decode share of a trajectory, coloc -> PD | sync floor s (speedup ceiling) | "
              "ideal split moves |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for e in rep["settings"]:
        sp = e["speedup"]
        lines.append(
            f"| {e['model']} | {e['workload']} | {e['staleness']} | {fmt_value(e['colocation']['rollout_time_s']['mean'])} | "
            f"{fmt_value(e['pd']['rollout_time_s']['mean'])} | {e['pd_policy']} | {fmt_value(sp['mean'])} "
            f"({fmt_value(sp['min'])}-{fmt_value(sp['max'])}) | {fmt_value(e['colocation']['gpu_idle_ratio']['mean'], 'ratio')} | "
            f"{fmt_value(e['colocation']['mean_trajectory_s']['mean'])} -> {fmt_value(e['pd']['mean_trajectory_s']['mean'])} | "
            f"{phase_shares(e, 'colocation')} -> {phase_shares(e, 'pd')} | {ceiling_text(e)} | "
            f"{fmt_value(e['ideal_split_moves_per_seed'])} |"
        )
    return "\n".join(lines) + "\n"
