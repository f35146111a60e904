"""Run simulations: one policy (with the ``static`` sweep), or several side by side over
seeds, in parallel processes, with an optional on-disk cache.

The measurement rule (see :func:`prorsa_sim.summary.build_result`): the first step is the
warm-up, reported apart; the rollout time is the mean of the steps after it.

The common start: in a comparison every PD policy starts from the same P:D split -- the
best static ratio of the same setting and seed (``start="best"``, the default of
:func:`compare_seeds`) -- so a switching policy is measured against the best fixed ratio
from the very state that ratio runs in; colocation (all engines mixed) is its own baseline.
``start="P:D"`` names another common split, ``start="own"`` keeps each policy's own
initial roles (the allocator and reactive policies start at n/2 : n/2).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from prorsa_emulated.costmodel import get_profile
from prorsa_schemas import LogWriter

from .policy import Observation, Policy, StaticPD, SwitchRequest, make_policy, static_sweep_ratios
from .simulator import SimConfig, Simulator
from .summary import Result

FULL_GRID = 7
"""Points of the static sweep: every ratio of an 8-engine cluster, 7 evenly spaced ones for
Qwen3's 32 engines (:func:`static_sweep_ratios`)."""


def is_pd_fixed(spec: str) -> bool:
    """Policies whose roles never change: colocation and ``static:P:D``."""
    return spec == "colocation" or spec.startswith("static:")


@dataclass
class StartAt:
    """A policy started from a given P:D split instead of its own initial roles (the
    common start of a comparison); everything else is the wrapped policy's."""

    inner: Policy
    n_prefill: int
    n_decode: int

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def wants_future(self) -> bool:
        return getattr(self.inner, "wants_future", False)

    def initial_roles(self, profile, n_engines: int) -> list[str]:
        if self.n_prefill + self.n_decode != n_engines or self.n_prefill < 1 or self.n_decode < 1:
            raise ValueError(f"start {self.n_prefill}:{self.n_decode} does not split {n_engines} engines")
        return ["prefill"] * self.n_prefill + ["decode"] * self.n_decode

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        return self.inner.on_window(obs)


def parse_start(text: str | None) -> tuple[int, int] | str | None:
    """``best`` / ``own`` / ``P:D`` (None: own)."""
    if text in (None, "own"):
        return None
    if text == "best":
        return "best"
    m = re.fullmatch(r"(\d+):(\d+)", text)
    if not m:
        raise ValueError(f"bad start {text!r}: expected best, own or P:D (e.g. 4:4)")
    return int(m[1]), int(m[2])


def build_policy(spec: str, start: tuple[int, int] | None = None) -> Policy:
    """``make_policy(spec)``, started from ``start`` when it is a switching policy (not
    one that ``chooses_start`` itself, as ``bound`` does)."""
    pol = make_policy(spec)
    if start is not None and not is_pd_fixed(spec) and not getattr(pol, "chooses_start", False):
        return StartAt(pol, *start)
    return pol


def simulate(cfg: SimConfig, policy_spec: str, sink=None, progress=None, start: tuple[int, int] | None = None,
             search_progress=None) -> Result:
    """Run one simulation of a concrete policy (not the ``static`` sweep).

    A policy with ``prepare(cfg, progress)`` (``bound``: its search) is prepared first,
    with ``search_progress``; its ``search_report`` goes into the summary as
    ``bound_search``."""
    pol = build_policy(policy_spec, start)
    if hasattr(pol, "prepare"):
        pol.prepare(cfg, progress=search_progress)
    res = Simulator(cfg, pol, sink=sink).run(progress=progress)
    if getattr(pol, "search_report", None) is not None:
        res.summary["bound_search"] = pol.search_report
    return res


# --- jobs: one simulation each, run in parallel processes, cached on disk ------------------

# costmodel is prorsa_emulated's (the simulator and the emulated engines share it).
_RESULT_MODULES = ("cluster", "costmodel", "engines", "simulator", "summary", "workloads", "policy",
                   "runner", "idealsplit")


ALLOCATOR_POLICIES = ("prorsa", "oracle")
"""Policies whose results also depend on the allocator and the forecaster (and the
tracker's fold the forecaster runs): their cache key hashes those sources too."""

_NOT_IN_RESULTS = ("cli.py", "service.py", "settings.py", "metrics.py", "testing.py", "evaluate.py")


def _hash_files(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin).parent


def _allocator_files() -> list[Path]:
    files: list[Path] = []
    for pkg in ("prorsa_allocator", "prorsa_forecaster"):
        files += sorted(f for f in _package_dir(pkg).glob("*.py") if f.name not in _NOT_IN_RESULTS)
    tracker = _package_dir("prorsa_tracker")
    files += [tracker / f for f in ("core.py", "engines.py", "state.py")]
    return files


def uses_allocator(spec: str) -> bool:
    return spec.split(":", 1)[0] in ALLOCATOR_POLICIES


def code_version(spec: str | None = None) -> str:
    """Hash of the sources that decide a simulation's result (the cache key's code part:
    a changed cost model, workload or engine invalidates every cached result): the
    simulator's modules and its policies. For a fixed policy (``spec`` colocation or
    ``static:P:D``, which load no policy module) the modules only; for a policy of
    :data:`ALLOCATOR_POLICIES`, the allocator's and forecaster's sources too, joined with
    ``+``."""
    here = Path(__file__).parent
    core = [(_package_dir("prorsa_emulated") if m == "costmodel" else here) / f"{m}.py" for m in _RESULT_MODULES]
    if spec is not None and is_pd_fixed(spec):
        return _hash_files(core)
    sim = _hash_files(core + sorted((here / "policies").glob("*.py")))
    return f"{sim}+{_hash_files(_allocator_files())}" if spec is not None and uses_allocator(spec) else sim


@dataclass(frozen=True)
class CodeVersions:
    """The code versions taken once (:func:`code_versions`): a long sweep keys its cache
    by them, so edits made while it runs do not make it recompute what it has just run.
    Called with a job, the version of that job's policy (:func:`code_version`)."""

    fixed: str
    sim: str
    allocator: str

    def __call__(self, job: Job) -> str:
        if is_pd_fixed(job.spec):
            return self.fixed
        return f"{self.sim}+{self.allocator}" if uses_allocator(job.spec) else self.sim

    def __str__(self) -> str:
        return self.sim


def code_versions() -> CodeVersions:
    sim, alloc = code_version("prorsa").split("+")
    return CodeVersions(code_version("colocation"), sim, alloc)


@dataclass(frozen=True)
class Job:
    """One simulation: a setting, a concrete policy and the P:D split it starts from."""

    cfg: SimConfig
    spec: str
    start: tuple[int, int] | None = None

    def key(self) -> str:
        c = self.cfg
        st = f"@{self.start[0]}-{self.start[1]}" if self.start and not is_pd_fixed(self.spec) else ""
        name = (f"{c.workload}_{c.model}_s{c.staleness}_b{c.batch_size}_g{c.total_gpus}_n{c.steps}"
                f"_seed{c.seed}_{self.spec}{st}")
        extra = {k: v for k, v in asdict(c).items()
                 if k not in ("workload", "model", "staleness", "batch_size", "total_gpus", "steps", "seed", "run")}
        digest = hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:6]
        return re.sub(r"[^A-Za-z0-9_.@=-]", "-", f"{name}_{digest}")


def run_job(job: Job) -> dict:
    """Run one job; its summary (no timeline), with the start split recorded."""
    res = simulate(job.cfg, job.spec, start=job.start if not is_pd_fixed(job.spec) else None)
    s = res.summary
    s["start"] = (f"{job.start[0]}:{job.start[1]}" if job.start and not is_pd_fixed(job.spec)
                  and "bound_search" not in s else None)
    return s


def default_jobs() -> int:
    """Parallel processes by default: the machine's CPUs."""
    return os.cpu_count() or 1


def run_jobs(jobs: list[Job], n_jobs: int = 1, cache_dir: Path | None = None,
             progress: Callable[[Job], None] | None = None,
             version: str | Callable[[Job], str] | None = None) -> list[dict]:
    """Run ``jobs`` (results in the same order). ``n_jobs`` > 1: in that many processes
    (``concurrent.futures.ProcessPoolExecutor``). ``cache_dir``: a job whose result file
    ``<key>.json`` (with the same code version) is there is not run again, and every new
    result is written there as soon as it is done, so an interrupted sweep resumes.
    ``version``: the code version to key the cache by -- one string, or a function of the
    job (:class:`CodeVersions`); default: :func:`code_versions` now. A long report passes
    the one it started with, so edits made meanwhile do not make it recompute what it has
    just run."""
    if version is None:
        version = code_versions()
    ver: Callable[[Job], str] = version if callable(version) else (lambda _job, v=version: v)
    results: list[dict | None] = [None] * len(jobs)
    todo: list[int] = []
    for i, job in enumerate(jobs):
        cached = _read_cache(cache_dir, job, ver(job))
        if cached is not None:
            results[i] = cached
            if progress is not None:
                progress(job)
        else:
            todo.append(i)
    # The same job twice in the list runs once.
    first: dict[str, int] = {}
    unique = [i for i in todo if first.setdefault(jobs[i].key(), i) == i]

    def done(i: int, summary: dict) -> None:
        _write_cache(cache_dir, jobs[i], ver(jobs[i]), summary)
        for j in todo:
            if jobs[j].key() == jobs[i].key():
                results[j] = summary
                if progress is not None:
                    progress(jobs[j])

    if n_jobs <= 1 or len(unique) <= 1:
        for i in unique:
            done(i, run_job(jobs[i]))
    else:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(n_jobs, len(unique)), mp_context=ctx) as pool:
            futs = {pool.submit(run_job, jobs[i]): i for i in unique}
            for fut in as_completed(futs):
                done(futs[fut], fut.result())
    return results  # type: ignore[return-value]


def _cache_path(cache_dir: Path, job: Job) -> Path:
    return cache_dir / "runs" / f"{job.key()}.json"


def _read_cache(cache_dir: Path | None, job: Job, version: str) -> dict | None:
    if cache_dir is None:
        return None
    p = _cache_path(cache_dir, job)
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    if doc.get("code_version") != version or doc.get("job") != _job_doc(job):
        return None
    return doc["summary"]


def _job_doc(job: Job) -> dict:
    return {"cfg": asdict(job.cfg), "spec": job.spec, "start": list(job.start) if job.start else None}


def _write_cache(cache_dir: Path | None, job: Job, version: str, summary: dict) -> None:
    if cache_dir is None:
        return
    p = _cache_path(cache_dir, job)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"code_version": version, "job": _job_doc(job), "summary": summary}, sort_keys=True))
    tmp.replace(p)


# --- the static sweep ---------------------------------------------------------------------


def sweep_specs(cfg: SimConfig, grid: int = FULL_GRID) -> list[str]:
    """The ``static:P:D`` specs the sweep tries for ``cfg``'s cluster."""
    n = get_profile(cfg.model).engines_in(cfg.total_gpus)
    return [f"static:{p}:{d}" for p, d in static_sweep_ratios(n, grid)]


def pick_best(summaries: Iterable[dict]) -> tuple[str, dict, dict[str, float]]:
    """The lowest rollout time among static summaries: (spec, summary, every spec's time)."""
    tried: dict[str, float] = {}
    best = None
    for s in summaries:
        rt = s["rollout_time_s"]
        tried[s["policy"]] = rt if rt is not None else float("inf")
        if best is None or tried[s["policy"]] < tried[best["policy"]]:
            best = s
    if best is None:
        raise ValueError("empty static sweep")
    return best["policy"], best, tried


def best_static(cfg: SimConfig, progress=None, grid: int = FULL_GRID) -> tuple[str, Result, dict[str, float]]:
    """The paper's static baseline: try the P:D ratios, keep the lowest rollout time.

    Returns the winning ``static:P:D``, its result, and every ratio's rollout time.
    """
    tried: dict[str, float] = {}
    best: tuple[str, Result] | None = None
    for spec in sweep_specs(cfg, grid):
        p, d = (int(x) for x in spec.split(":")[1:])
        res = Simulator(cfg, StaticPD(p, d)).run()
        rt = res.summary["rollout_time_s"]
        tried[spec] = rt if rt is not None else float("inf")
        if best is None or tried[spec] < tried[best[0]]:
            best = (spec, res)
        if progress is not None:
            progress(spec)
    assert best is not None
    return best[0], best[1], tried


def _split(spec: str) -> tuple[int, int]:
    p, d = spec.split(":")[1:]
    return int(p), int(d)


def run_to_dir(cfg: SimConfig, policy_spec: str, out: Path, progress=None, plot: bool = True,
               start: str | None = None, n_jobs: int = 1, search_progress=None) -> Result:
    """``prorsa sim run``: write ``events.jsonl.gz``, ``summary.json``, ``timeline.json``,
    ``timeline.png`` and ``ideal_split.png``. ``start``: ``best`` / ``P:D`` / ``own`` (a
    switching policy's initial split; ``best`` runs the static sweep first)."""
    out.mkdir(parents=True, exist_ok=True)
    sweep = None
    st = parse_start(start)
    if policy_spec == "static" or (st == "best" and not is_pd_fixed(policy_spec)):
        specs = sweep_specs(cfg)
        sums = run_jobs([Job(cfg, s) for s in specs], n_jobs=n_jobs)
        best, _, sweep = pick_best(sums)
        if policy_spec == "static":
            policy_spec = best
        if st == "best":
            st = _split(best)
    with LogWriter(out / "events.jsonl.gz") as sink:
        res = simulate(cfg, policy_spec, sink=sink, progress=progress, start=st if isinstance(st, tuple) else None,
                       search_progress=search_progress)
    if sweep is not None:
        res.summary["static_sweep"] = sweep
    (out / "summary.json").write_text(json.dumps(res.summary, indent=2, sort_keys=True) + "\n")
    (out / "timeline.json").write_text(json.dumps(res.timeline, sort_keys=True) + "\n")
    if plot:
        from .plot import plot_ideal_split, plot_timeline

        title = f"{cfg.workload} / {cfg.model} / staleness {cfg.staleness} / {res.summary['policy']}"
        plot_timeline(res, out / "timeline.png", title=title)
        plot_ideal_split(res, out / "ideal_split.png", title=title)
    return res


# --- comparisons over seeds -----------------------------------------------------------------


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
    suits this workload's steps)."""

    cfg: SimConfig
    statics: tuple[str, ...] = ()
    policies: tuple[str, ...] = ()


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
    started from ``start`` (``best``: that seed's best static ratio; a policy that chooses
    its own start, as ``bound``, runs from it, and first, being the slowest).
    ``seeds_for``: a policy run on fewer seeds (those of ``seeds`` it lists)."""
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
        need_sweep = "static" in pols[i] or (st == "best" and bool(switching))
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
    for _, i, s, p in sorted(phase2, key=lambda x: x[0]):  # stable: the self-starting ones first
        split = _split(best[(i, s)][0]) if st == "best" else (st if isinstance(st, tuple) else None)
        jobs2.append((i, Job(replace(settings[i].cfg, seed=s), p, None if own[p] else split)))
    for (i, j), summ in zip(jobs2, run_jobs([j for _, j in jobs2], n_jobs, cache_dir, progress, version)):
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
