"""Several policies side by side over seeds and settings, from a common start.

The common start: in a comparison every PD policy starts from the same P:D split -- the
best static ratio of the same setting and seed (``start="best"``, the default of
:func:`compare_seeds`) -- so a switching policy is measured against the best fixed ratio
from the very state that ratio runs in; colocation (all engines mixed) is its own baseline.
``start="P:D"`` names another common split, ``start="own"`` keeps each policy's own
initial roles (the allocator and reactive policies start at n/2 : n/2).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from .catalog import make_policy
from .runner import FULL_GRID, Job, is_pd_fixed, parse_start, pd_split, pick_best, run_jobs, sweep_specs
from .simconfig import SimConfig


def spread(xs: list[float | None]) -> dict:
    """mean, min, max and (population) std of the non-None values (None when there are none)."""
    v = [x for x in xs if x is not None and math.isfinite(x)]
    if not v:
        return {"mean": None, "min": None, "max": None, "std": None, "n": 0}
    m = sum(v) / len(v)
    return {
        "mean": round(m, 4), "min": round(min(v), 4), "max": round(max(v), 4),
        "std": round(math.sqrt(sum((x - m) ** 2 for x in v) / len(v)), 4), "n": len(v),
    }


SPREAD_KEYS = ("rollout_time_s", "warmup_step_s", "mean_trajectory_s", "gpu_idle_ratio", "gpu_imbalance_ratio",
               "gpu_unused_ratio", "switches", "preemptions")


@dataclass(frozen=True)
class Setting:
    """One setting of a sweep over several: its config (the seed is set per seed), fixed
    ratios (``static:P:D``) run besides the static grid (they count toward the best), and
    policies run on this setting only, besides the sweep's (e.g. a ``bound`` whose grid
    suits this workload's steps), and the P:D split its switching policies start from
    (``start``; None: the sweep's ``start``), e.g. a fixed ratio the paper gives for this
    workload."""

    cfg: SimConfig
    statics: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()
    start: tuple[int, int] | None = None


@dataclass
class Matrix:
    """What :func:`run_matrix` ran: every summary by (setting index, seed, spec) and the
    best static ratio by (setting index, seed): ``(spec, summary, every ratio's time)``."""

    settings: list[Setting]
    policies: list[str]
    seeds: list[int]
    seeds_for: dict[str, list[int]]
    start: str | None
    grid: int
    runs: dict[tuple[int, int, str], dict]
    best: dict[tuple[int, int], tuple[str, dict, dict[str, float]]]

    def rows(self, i: int) -> list[dict]:
        """Setting ``i``'s rows as :func:`compare_seeds` returns them: per policy its seeds,
        per-seed summaries (``static``: that seed's best ratio, with ``static_sweep``), the
        spread of each key of :data:`SPREAD_KEYS`, and the speedup over the first policy
        on the same seed."""
        rows = []
        extra = [p for p in self.settings[i].policies if p not in self.policies]
        for p in [*self.policies, *extra]:
            seeds = self.seeds_for.get(p, self.seeds)
            per_seed = []
            for s in seeds:
                if p == "static":
                    spec, summ, tried = self.best[(i, s)]
                    summ = dict(summ, static_sweep=tried)
                else:
                    summ = self.runs[(i, s, p)]
                per_seed.append(summ)
            rows.append({"spec": p, "policy": p, "seeds": list(seeds), "per_seed": per_seed})
        base = dict(zip(rows[0]["seeds"], rows[0]["per_seed"])) if rows else {}
        for row in rows:
            speed = []
            for s, r in zip(row["seeds"], row["per_seed"]):
                b = base.get(s)
                ok = b is not None and b["rollout_time_s"] and r["rollout_time_s"]
                speed.append(b["rollout_time_s"] / r["rollout_time_s"] if ok else None)
            row["speedup_per_seed"] = [round(x, 4) if x is not None else None for x in speed]
            row["speedup"] = spread(speed)
            for k in SPREAD_KEYS:
                row[k] = spread([r.get(k) for r in row["per_seed"]])
            if row["spec"] == "static":
                # The best ratio per seed; the row is named by them (one name when they agree).
                ratios = [r["policy"][len("static:"):] for r in row["per_seed"]]
                row["best_ratio_per_seed"] = ratios
                row["policy"] = "static:" + "/".join(dict.fromkeys(ratios))
        return rows


def chooses_start(spec: str) -> bool:
    """A policy that fixes its own start split (``bound``: the schedule it searched)."""
    return not is_pd_fixed(spec) and spec != "static" and bool(getattr(make_policy(spec), "chooses_start", False))


def run_matrix(settings: list[Setting], policies: list[str], seeds: list[int], n_jobs: int = 1,
               start: str | None = "best", grid: int = FULL_GRID, cache_dir: Path | None = None,
               progress: Callable[[Job], None] | None = None, on_total: Callable[[int], None] | None = None,
               version: str | Callable[[Job], str] | None = None,
               seeds_for: dict[str, list[int]] | None = None) -> Matrix:
    """Run each policy (``policies``, then the setting's own ``policies``) on each seed of
    each setting, through :func:`run_jobs` (parallel, cached). Phase 1, every setting at
    once so the process pool stays full: the fixed policies (colocation, ``static:P:D``),
    the static grid and each setting's extra ``statics``. Phase 2: the switching policies,
    started from the setting's own ``start`` where it has one, else from ``start``
    (``best``: that seed's best static ratio). Phase 3: a policy
    that chooses its own start (``bound``), handed the phase-1 sweep of its setting and
    seed and every phase-2 run of them as seeds (candidates it counts: it is then never
    slower than any of them). ``seeds_for``: a policy run on fewer seeds (those of
    ``seeds`` it lists)."""
    st = parse_start(start)
    only = seeds_for or {}
    pols = {i: list(policies) + [p for p in x.policies if p not in policies] for i, x in enumerate(settings)}
    every = list(dict.fromkeys(p for ps in pols.values() for p in ps))
    for_p = {p: [s for s in seeds if s in only.get(p, seeds)] for p in every}
    own = {p: chooses_start(p) for p in every if not is_pd_fixed(p) and p != "static"}
    sweeps: dict[int, list[str]] = {}
    phase1: list[tuple[int, Job]] = []
    phase2: list[tuple[bool, int, int, str]] = []
    for i, setting in enumerate(settings):
        switching = [p for p in dict.fromkeys(pols[i]) if p in own]
        fixed = [p for p in pols[i] if is_pd_fixed(p)]
        need_sweep = "static" in pols[i] or (st == "best" and setting.start is None and bool(switching))
        sweeps[i] = list(dict.fromkeys((sweep_specs(setting.cfg, grid) if need_sweep else []) + list(setting.statics)))
        for s in seeds:
            c = replace(setting.cfg, seed=s)
            specs = [q for q in fixed if s in for_p[q]] + sweeps[i]
            phase1 += [(i, Job(c, q)) for q in dict.fromkeys(specs)]
        phase2 += [(not own[p], i, s, p) for p in switching for s in for_p[p]]
    if on_total is not None:
        on_total(len(phase1) + len(phase2))
    runs: dict[tuple[int, int, str], dict] = {}
    for (i, j), summ in zip(phase1, run_jobs([j for _, j in phase1], n_jobs, cache_dir, progress, version)):
        runs[(i, j.cfg.seed, j.spec)] = summ
    best = {(i, s): pick_best(runs[(i, s, spec)] for spec in sweeps[i])
            for i in range(len(settings)) for s in seeds if sweeps[i]}
    jobs2: list[tuple[int, Job]] = []
    for common, i, s, p in phase2:
        if not common:
            continue
        if settings[i].start is not None:
            split = settings[i].start
        elif st == "best":
            split = pd_split(best[(i, s)][0])
        else:
            split = st if isinstance(st, tuple) else None
        jobs2.append((i, Job(replace(settings[i].cfg, seed=s), p, split)))
    for (i, j), summ in zip(jobs2, run_jobs([j for _, j in jobs2], n_jobs, cache_dir, progress, version)):
        runs[(i, j.cfg.seed, j.spec)] = summ
    jobs3: list[tuple[int, Job]] = []
    for common, i, s, p in phase2:
        if common:
            continue
        handed = tuple((j.spec, j.start[0], tuple(tuple(r) for r in runs[(i, s, j.spec)]["switch_requests"]))
                       for ii, j in jobs2 if ii == i and j.cfg.seed == s and j.start is not None
                       and "switch_requests" in runs[(i, s, j.spec)])
        swept = tuple((spec, runs[(i, s, spec)]["rollout_time_s"], runs[(i, s, spec)]["sim_time_s"])
                      for spec in sweeps[i] if spec.startswith("static:"))
        jobs3.append((i, Job(replace(settings[i].cfg, seed=s), p, None, handed, swept)))
    for (i, j), summ in zip(jobs3, run_jobs([j for _, j in jobs3], n_jobs, cache_dir, progress, version)):
        runs[(i, j.cfg.seed, j.spec)] = summ
    return Matrix(list(settings), list(policies), list(seeds), for_p, start, grid, runs, best)


def compare_seeds(cfg: SimConfig, policies: list[str], seeds: list[int], n_jobs: int = 1,
                  start: str | None = "best", grid: int = FULL_GRID, cache_dir: Path | None = None,
                  progress: Callable[[Job], None] | None = None, on_total: Callable[[int], None] | None = None,
                  version: str | Callable[[Job], str] | None = None) -> dict:
    """Run each policy on each seed (same seed, same workload); aggregate across seeds.

    ``static`` is the sweep (per seed: the best of ``grid`` ratios). Switching policies
    start from ``start`` (``best``: that seed's best static ratio, which runs the sweep
    even when ``static`` is not asked for). Returns ``{"seeds", "start", "rows"}``: one row
    per policy with its per-seed summaries, the spread of each key of
    :data:`SPREAD_KEYS` and the speedup over the first policy (per seed, then spread).
    (:func:`run_matrix` with one setting.)
    """
    m = run_matrix([Setting(cfg)], policies, seeds, n_jobs, start, grid, cache_dir, progress, on_total, version)
    return {"seeds": list(seeds), "start": start, "grid": grid, "rows": m.rows(0)}


def compare(cfg: SimConfig, policies: list[str], progress=None) -> list[dict]:
    """Run each policy on one seed (``cfg.seed``); summaries with the speedup vs the first
    (switching policies start from the best static ratio)."""
    out = compare_seeds(cfg, policies, [cfg.seed], n_jobs=1, progress=(lambda j: progress(j.spec)) if progress else None)
    rows = []
    for row in out["rows"]:
        s = dict(row["per_seed"][0])
        s["speedup"] = round(row["speedup"]["mean"], 3) if row["speedup"]["mean"] is not None else None
        rows.append(s)
    return rows


def with_overrides(cfg: SimConfig, **kw) -> SimConfig:
    return replace(cfg, **kw)
