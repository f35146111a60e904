"""Run simulations: one policy (with the ``static`` sweep), or several side by side."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from prorsa_schemas import LogWriter

from .costmodel import get_profile
from .policy import StaticPD, make_policy, static_sweep_ratios
from .simulator import SimConfig, Simulator
from .summary import Result


def simulate(cfg: SimConfig, policy_spec: str, sink=None, progress=None) -> Result:
    """Run one simulation of a concrete policy (not the ``static`` sweep)."""
    return Simulator(cfg, make_policy(policy_spec), sink=sink).run(progress=progress)


def best_static(cfg: SimConfig, progress=None) -> tuple[str, Result, dict[str, float]]:
    """The paper's static baseline: try the P:D ratios, keep the lowest rollout time.

    Returns the winning ``static:P:D``, its result, and every ratio's rollout time.
    """
    n = get_profile(cfg.model).engines_in(cfg.total_gpus)
    tried: dict[str, float] = {}
    best: tuple[str, Result] | None = None
    for p, d in static_sweep_ratios(n):
        spec = f"static:{p}:{d}"
        res = Simulator(cfg, StaticPD(p, d)).run()
        rt = res.summary["rollout_time_s"]
        tried[spec] = rt if rt is not None else float("inf")
        if best is None or tried[spec] < tried[best[0]]:
            best = (spec, res)
        if progress is not None:
            progress(spec)
    assert best is not None
    return best[0], best[1], tried


def run_to_dir(cfg: SimConfig, policy_spec: str, out: Path, progress=None, plot: bool = True) -> Result:
    """``prorsa sim run``: write ``events.jsonl.gz``, ``summary.json``, ``timeline.png``."""
    out.mkdir(parents=True, exist_ok=True)
    sweep = None
    if policy_spec == "static":
        policy_spec, _, sweep = best_static(cfg)
    with LogWriter(out / "events.jsonl.gz") as sink:
        res = simulate(cfg, policy_spec, sink=sink, progress=progress)
    if sweep is not None:
        res.summary["static_sweep"] = sweep
    (out / "summary.json").write_text(json.dumps(res.summary, indent=2, sort_keys=True) + "\n")
    (out / "timeline.json").write_text(json.dumps(res.timeline, sort_keys=True) + "\n")
    if plot:
        from .plot import plot_timeline

        plot_timeline(res, out / "timeline.png", title=f"{cfg.workload} / {cfg.model} / {res.summary['policy']}")
    return res


def compare(cfg: SimConfig, policies: list[str], progress=None) -> list[dict]:
    """Run each policy on the same seeded workload; rows with speedup vs the first."""
    rows = []
    for spec in policies:
        if spec == "static":
            name, res, sweep = best_static(cfg)
            res.summary["static_sweep"] = sweep
        else:
            res = simulate(cfg, spec)
        rows.append(res.summary)
        if progress is not None:
            progress(spec)
    base = rows[0]["rollout_time_s"] if rows else None
    for r in rows:
        r["speedup"] = round(base / r["rollout_time_s"], 3) if base and r["rollout_time_s"] else None
    return rows


def with_overrides(cfg: SimConfig, **kw) -> SimConfig:
    return replace(cfg, **kw)
