"""One simulation of one concrete policy (:func:`simulate`), the static sweep
(:func:`best_static`, :func:`pick_best`) and the start a switching policy is handed
(:class:`StartAt`).

Everything here decides a simulation's result, so this module is part of the cache key's
code (:data:`prorsa_sim.runner._RESULT_MODULES`); the jobs, their cache and the CLI's
output (:mod:`prorsa_sim.runner`) are not, so editing them does not re-run a sweep.

The measurement rule (see :func:`prorsa_sim.summary.build_result`): the first step is the
warm-up, reported apart; the rollout time is the mean of the steps after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from prorsa_emulated.costmodel import get_profile

from .catalog import make_policy
from .policy import Observation, Policy, StaticPD, SwitchRequest, static_sweep_ratios
from .simconfig import SimConfig
from .simulator import Simulator
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

    def on_update(self, obs: Observation) -> list[SwitchRequest]:
        hook = getattr(self.inner, "on_update", None)
        return hook(obs) if hook is not None else []


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
             search_progress=None, seeds: dict[str, tuple[int, list]] | None = None,
             sweep: dict[str, tuple[float, float]] | None = None) -> Result:
    """Run one simulation of a concrete policy (not the ``static`` sweep).

    A policy with ``prepare(cfg, static_sweep, progress, seeds)`` (``bound``: its search)
    is prepared first, with :func:`best_static` (or, given ``sweep``, ``{static spec:
    (rollout s, simulated s)}`` of every ratio already run, that sweep), ``search_progress``
    and ``seeds`` (other policies' runs: ``{name: (start prefill count, switch_requests)}``);
    its ``search_report`` goes into the summary as ``bound_search``."""
    pol = build_policy(policy_spec, start)
    if hasattr(pol, "prepare"):
        static_sweep = best_static
        if sweep and set(sweep_specs(cfg)) <= set(sweep):
            static_sweep = lambda _cfg: swept(sweep)  # noqa: E731 -- the ratios already run
        pol.prepare(cfg, static_sweep=static_sweep, progress=search_progress, seeds=seeds)
    res = Simulator(cfg, pol, sink=sink).run(progress=progress)
    if getattr(pol, "search_report", None) is not None:
        res.summary["bound_search"] = pol.search_report
    return res


def swept(sweep: dict[str, tuple[float, float]]) -> tuple[str, Result, dict[str, float]]:
    """:func:`best_static`'s answer from a sweep already run (``{spec: (rollout s,
    simulated s)}``): the best spec (:func:`pick_best`), a result carrying its two figures,
    every spec's time."""
    best, summary, tried = pick_best({"policy": spec, "rollout_time_s": rt, "sim_time_s": st}
                                     for spec, (rt, st) in sweep.items())
    return best, Result(summary), tried


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


def pd_split(spec: str) -> tuple[int, int]:
    """(P, D) of ``static:P:D``."""
    p, d = spec.split(":")[1:]
    return int(p), int(d)
