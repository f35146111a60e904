"""Run simulations as jobs: in parallel processes, with an on-disk cache keyed by the code
each result depends on; ``prorsa sim run``'s output directory (:func:`run_to_dir`).
:mod:`prorsa_sim.compare` runs several policies side by side over seeds.

One simulation (:func:`simulate`), the static sweep and the common start are
:mod:`prorsa_sim.simulation`'s, re-exported here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from prorsa_schemas import LogWriter

from .recorded import PREFIX as RECORDED
from .simconfig import SimConfig
from .workloads import get_workload
from .simulation import (  # noqa: F401 -- re-exported: the runner's public names
    FULL_GRID,
    StartAt,
    best_static,
    build_policy,
    is_pd_fixed,
    parse_start,
    pd_split,
    pick_best,
    simulate,
    sweep_specs,
    swept,
)


# --- jobs: one simulation each, run in parallel processes, cached on disk ------------------

# costmodel is prorsa_emulated's (the simulator and the emulated engines share it).
_RESULT_MODULES = ("cluster", "switching", "costmodel", "engines", "simulator", "trajectories", "simconfig",
                   "summary", "workloads", "policy", "catalog", "simulation", "idealsplit", "sampler", "recorded", "plan")


ALLOCATOR_POLICIES = ("prorsa", "oracle")
"""Policies whose results also depend on the allocator and the forecaster (and the
tracker's fold the forecaster runs): their cache key hashes those sources too."""

_NOT_IN_RESULTS = ("cli.py", "service.py", "settings.py", "metrics.py", "testing.py", "evaluate.py")

_ROUTER_MODULES = {"smg": ("smg",)}
"""prorsa_emulated modules whose code only a run under that ``router_policy`` executes: the
gateway rule's thresholds (``prorsa_emulated.smg``, which ``cluster`` imports and calls only
in its ``smg`` route). They key those runs only, so that the default router's results keep
their key when the gateway rule changes."""


def _hash_files(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        # the path below its package for a module in a subpackage (terms/common.py), so
        # that two modules of one name do not hash alike; the name alone at the top
        h.update((f.name if f.parent.name.startswith("prorsa_") or f.parent.name == "policies"
                  else f"{f.parent.name}/{f.name}").encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def _package_dir(name: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(name)
    assert spec is not None and spec.origin is not None, name
    return Path(spec.origin).parent


def _allocator_files() -> list[Path]:
    """The allocator's and forecaster's sources, subpackages included (the forecaster's
    terms live in ``prorsa_forecaster/terms/``), less the service shells."""
    files: list[Path] = []
    for pkg in ("prorsa_allocator", "prorsa_forecaster"):
        root = _package_dir(pkg)
        files += sorted((f for f in root.rglob("*.py")
                         if f.name not in _NOT_IN_RESULTS and "tests" not in f.relative_to(root).parts),
                        key=lambda f: f.relative_to(root).as_posix())
    tracker = _package_dir("prorsa_tracker")
    files += [tracker / f for f in ("core.py", "transitions.py", "lifecycle.py", "engines.py", "state.py")]
    schemas = _package_dir("prorsa_schemas")
    files += [schemas / f for f in ("registry.py", "fold.py")]  # the engine registry they all fold with
    return files


def uses_allocator(spec: str) -> bool:
    return spec.split(":", 1)[0] in ALLOCATOR_POLICIES


def router_version(router_policy: str) -> str:
    """Hash of the modules only a run under ``router_policy`` imports (:data:`_ROUTER_MODULES`);
    '' for a router rule that has none (the default ``queue``)."""
    mods = _ROUTER_MODULES.get(router_policy, ())
    return _hash_files([_package_dir("prorsa_emulated") / f"{m}.py" for m in mods]) if mods else ""


def code_version(spec: str | None = None, router_policy: str = "queue") -> str:
    """Hash of the sources that decide a simulation's result (the cache key's code part:
    a changed cost model, workload or engine invalidates every cached result): the
    simulator's modules and its policies. For a fixed policy (``spec`` colocation or
    ``static:P:D``, which load no policy module) the modules only; for a policy of
    :data:`ALLOCATOR_POLICIES`, the allocator's and forecaster's sources too, joined with
    ``+``; under a router rule with modules of its own (``smg``), theirs too, joined with
    ``+<rule>``."""
    here = Path(__file__).parent
    core = [(_package_dir("prorsa_emulated") if m == "costmodel" else here) / f"{m}.py" for m in _RESULT_MODULES]
    if spec is not None and is_pd_fixed(spec):
        v = _hash_files(core)
    else:
        sim = _hash_files(core + sorted((here / "policies").glob("*.py")))
        v = f"{sim}+{_hash_files(_allocator_files())}" if spec is not None and uses_allocator(spec) else sim
    r = router_version(router_policy)
    return f"{v}+{router_policy}{r}" if r else v


@dataclass(frozen=True)
class CodeVersions:
    """The code versions taken once (:func:`code_versions`): a long sweep keys its cache
    by them, so edits made while it runs do not make it recompute what it has just run.
    Called with a job, the version of that job's policy (:func:`code_version`)."""

    fixed: str
    sim: str
    allocator: str
    routers: tuple[tuple[str, str], ...] = ()
    """(router rule, :func:`router_version`) for each rule with modules of its own."""

    def __call__(self, job: Job) -> str:
        if is_pd_fixed(job.spec):
            v = self.fixed
        else:
            v = f"{self.sim}+{self.allocator}" if uses_allocator(job.spec) else self.sim
        r = dict(self.routers).get(job.cfg.router_policy, "")
        return f"{v}+{job.cfg.router_policy}{r}" if r else v

    def __str__(self) -> str:
        return self.sim


def code_versions() -> CodeVersions:
    sim, alloc = code_version("prorsa").split("+")
    return CodeVersions(code_version("colocation"), sim, alloc,
                        tuple((rule, router_version(rule)) for rule in sorted(_ROUTER_MODULES)))


@dataclass(frozen=True)
class Job:
    """One simulation: a setting, a concrete policy and the P:D split it starts from; for a
    policy that searches (``bound``), the other policies' runs it counts among its
    candidates (``seeds``: ``((name, start prefill count, switch_requests), ...)``) and the
    static sweep already run (``sweep``: ``((spec, rollout s, simulated s), ...)``)."""

    cfg: SimConfig
    spec: str
    start: tuple[int, int] | None = None
    seeds: tuple = ()
    sweep: tuple = ()

    def inputs_digest(self) -> str | None:
        """A hash of ``seeds`` and ``sweep`` (None without them): part of the cache key."""
        if not self.seeds and not self.sweep:
            return None
        doc = json.dumps([list(self.seeds), list(self.sweep)], sort_keys=True, default=list)
        return hashlib.sha256(doc.encode()).hexdigest()[:12]

    def key(self) -> str:
        c = self.cfg
        st = f"@{self.start[0]}-{self.start[1]}" if self.start and not is_pd_fixed(self.spec) else ""
        # A recorded workload is named by its file and the hash of its plans
        # (``recorded.RecordedWorkload.name``): a changed log is a different workload.
        workload = get_workload(c.workload).name if c.workload.startswith(RECORDED) else c.workload
        name = (f"{workload}_{c.model}_s{c.staleness}_b{c.batch_size}_g{c.total_gpus}_n{c.steps}"
                f"_seed{c.seed}_{self.spec}{st}")
        extra = {k: v for k, v in asdict(c).items()
                 if k not in ("workload", "model", "staleness", "batch_size", "total_gpus", "steps", "seed", "run")}
        digest = hashlib.sha256(json.dumps(extra, sort_keys=True).encode()).hexdigest()[:6]
        inputs = self.inputs_digest()
        return re.sub(r"[^A-Za-z0-9_.@=-]", "-", f"{name}_{digest}" + (f"_in{inputs[:6]}" if inputs else ""))


def run_job(job: Job) -> dict:
    """Run one job; its summary (no timeline), with the start split recorded."""
    seeds = {name: (int(p), [list(r) for r in reqs]) for name, p, reqs in job.seeds} or None
    sweep = {spec: (rt, st) for spec, rt, st in job.sweep} or None
    res = simulate(job.cfg, job.spec, start=job.start if not is_pd_fixed(job.spec) else None, seeds=seeds,
                   sweep=sweep)
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
    doc = {"cfg": asdict(job.cfg), "spec": job.spec, "start": list(job.start) if job.start else None}
    inputs = job.inputs_digest()
    if inputs is not None:
        doc["inputs"] = inputs
    return doc


def _write_cache(cache_dir: Path | None, job: Job, version: str, summary: dict) -> None:
    if cache_dir is None:
        return
    p = _cache_path(cache_dir, job)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"code_version": version, "job": _job_doc(job), "summary": summary}, sort_keys=True))
    tmp.replace(p)


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
            st = pd_split(best)
    # Written aside and moved into place once the run has ended: a run that fails (or is
    # interrupted) leaves the folder's last complete log, not an empty one beside its summary.
    part = out / ".events.partial.jsonl.gz"
    try:
        with LogWriter(part) as sink:
            res = simulate(cfg, policy_spec, sink=sink, progress=progress,
                           start=st if isinstance(st, tuple) else None, search_progress=search_progress)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    part.replace(out / "events.jsonl.gz")
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


def check_split(p: int, d: int, n_engines: int, model: str, what: str) -> None:
    """ValueError unless P:D is a split of the cluster's ``n_engines`` engines (``what`` names
    the option, e.g. ``static:9:9`` or ``--start 9:9``): checked before any simulation runs,
    so a wrong one is one line, not a traceback from a worker process."""
    if p < 1 or d < 1 or p + d != n_engines:
        raise ValueError(f"{what}: expected P:D with P, D >= 1 and P + D = {n_engines} (the {model} engines "
                         f"of this cluster)")


def check_specs(specs: list[str], n_engines: int, model: str) -> None:
    """Build every spec (:func:`~prorsa_sim.catalog.make_policy`; ``static`` is the sweep)
    and check each fixed ratio's split against the cluster; ValueError with the first
    problem."""
    from .catalog import make_policy
    from .policy import StaticPD

    for spec in specs:
        if spec == "static":
            continue
        pol = make_policy(spec)
        if isinstance(pol, StaticPD):
            check_split(pol.n_prefill, pol.n_decode, n_engines, model, spec)
