"""Workload generators: math, coding agent, general agent (paper §3.1, §5.1).

Every trajectory's whole plan (turns, output lengths, tool results and durations, sandbox
and reward times, admission) is drawn at dispatch from its own generator seeded by
``(seed, trajectory index)``. So the same seed gives the same trajectories under every
policy: policies are compared on the same workload, and an oracle can know it.

Group structure (GRPO, [GRPO] Shao et al. 2024): the ``group_size`` trajectories of one group
answer the same prompt, so they share their first prompt token for token (one prefix in the
radix cache), they are dispatched together, and they run in the same environment (one
repository, one tool server), so their tool latencies are correlated: each tool duration is
the workload's lognormal times a group factor and a trajectory factor (lognormal random
effects with medians 1), drawn from generators seeded by the group and the trajectory.

Numbers are CHOICES made to reproduce the paper's characterisation (documented in
docs/simulator.md) unless a source is named, not measured traces.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .plan import TrajectoryPlan
from .recorded import PREFIX, load_recorded


@dataclass(frozen=True)
class WorkloadSpec:
    """Parameters of one task family (lognormal distributions are given by median and
    sigma; a lognormal is heavy-tailed, which is what tool and turn counts look like)."""

    name: str
    group_size: int
    turns_median: float
    turns_sigma: float
    turns_max: int
    prompt_median: float
    prompt_sigma: float
    output_median: float
    output_sigma: float
    output_max: int
    result_median: float
    result_sigma: float
    tool_median_s: float
    tool_sigma: float
    tool_max_s: float
    max_context: int
    sandbox: bool
    prewarm_s: float
    cold_median_s: float
    reward_median_s: float
    admission_rate: float
    prewarm_pool: int
    """Prewarmed sandboxes available at once (refilled after a cold-start time)."""
    tool_group_sigma: float = 0.0
    """Sigma of the per-group tool-latency factor (one environment per group)."""
    tool_traj_sigma: float = 0.0
    """Sigma of the per-trajectory tool-latency factor (one sandbox per trajectory)."""
    recorded: object = None
    """The :class:`~prorsa_sim.recorded.RecordedWorkload` whose plans this workload replays
    (``log:PATH``); None for a drawn workload."""


MATH = WorkloadSpec(
    name="math",
    group_size=16,  # CHOICE: GRPO groups of 16 are common for AIME-style math
    turns_median=1, turns_sigma=0.0, turns_max=1,  # single turn
    prompt_median=250, prompt_sigma=0.4,  # AIME problems: a few hundred tokens
    output_median=9000, output_sigma=0.7, output_max=32768,  # long reasoning, 32k cap
    result_median=0, result_sigma=0.0,
    tool_median_s=0.0, tool_sigma=0.0, tool_max_s=0.0,
    max_context=40960,
    sandbox=False, prewarm_s=0.0, cold_median_s=0.0,
    reward_median_s=1.0,  # rule-based verifier
    admission_rate=0.8,
    prewarm_pool=0,
)

CODING = WorkloadSpec(
    name="coding",
    group_size=8,
    turns_median=26, turns_sigma=0.6, turns_max=100,  # SWE-style: many turns
    prompt_median=5000, prompt_sigma=0.3,  # task + repo context
    output_median=280, output_sigma=0.8, output_max=8192,  # one tool call + brief thought
    result_median=900, result_sigma=1.1,  # file views / test logs, heavy tail
    tool_median_s=6.0, tool_sigma=1.1, tool_max_s=600.0,  # slow sandboxes, test runs
    max_context=98304,
    sandbox=True, prewarm_s=2.0, cold_median_s=45.0,  # container pull + repo setup
    reward_median_s=30.0,  # running the test suite
    admission_rate=0.6,
    prewarm_pool=384,
    # CHOICE: a group works on one repository, whose test suite and build speed set most
    # of its tool latency (spread of 0.6 between groups); a trajectory's own sandbox adds
    # less (0.3). The per-call sigma is reduced so the pooled spread stays ~1.3.
    tool_group_sigma=0.6, tool_traj_sigma=0.3,
)

GENERAL = WorkloadSpec(
    name="general",
    group_size=8,
    turns_median=9, turns_sigma=0.5, turns_max=40,  # MCP/tool use: fewer turns
    prompt_median=3500, prompt_sigma=0.3,  # tool schemas + task
    output_median=300, output_sigma=0.7, output_max=8192,
    result_median=700, result_sigma=1.0,
    tool_median_s=2.5, tool_sigma=1.1, tool_max_s=300.0,  # API calls, shorter
    max_context=65536,
    sandbox=True, prewarm_s=1.0, cold_median_s=15.0,
    reward_median_s=8.0,  # LLM judge / rubric
    admission_rate=0.7,
    prewarm_pool=384,
    # CHOICE: a group shares one task and its tool servers (MCP endpoints, APIs): 0.4
    # between groups, 0.3 between trajectories.
    tool_group_sigma=0.4, tool_traj_sigma=0.3,
)

WORKLOADS: dict[str, WorkloadSpec] = {w.name: w for w in (MATH, CODING, GENERAL)}


def get_workload(name: str) -> WorkloadSpec:
    """Return the named workload (``log:PATH``: the workload recorded in that log,
    :mod:`.recorded`), or raise ``ValueError`` listing the valid names."""
    if name.startswith(PREFIX):
        path = name[len(PREFIX):]
        try:
            st = os.stat(path)
        except OSError:
            raise ValueError(f"workload log not found: {path!r} (--workload log:PATH)") from None
        return _recorded_spec(path, st.st_mtime_ns, st.st_size)
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(
            f"unknown workload {name!r}; choose one of: {', '.join(WORKLOADS)}, or log:PATH"
        ) from None


def median(values, default: float = 0.0) -> float:
    """The median of ``values`` (``default`` when there are none)."""
    return float(np.median(values)) if len(values) else default


@lru_cache(maxsize=8)
def _recorded_spec(path: str, mtime_ns: int, size: int) -> WorkloadSpec:
    """The spec of a recorded workload (cached per file version): its plans, and the
    medians of what they hold for the fields the simulator reads from a spec."""
    w = load_recorded(path)
    plans = w.plans
    outs = [o for p in plans for o in p.outputs]
    results = [r for p in plans for r in p.results]
    tools = [t for p in plans for t in p.tool_s]
    boxes = {m: [p.cold_start_s for p in plans if p.sandbox == m] for m in ("prewarm", "cold")}
    return WorkloadSpec(
        name=w.name, group_size=w.group_size,
        turns_median=median([len(p.outputs) for p in plans]), turns_sigma=0.0,
        turns_max=max(len(p.outputs) for p in plans),
        prompt_median=median([p.prompt_tokens for p in plans]), prompt_sigma=0.0,
        output_median=median(outs), output_sigma=0.0, output_max=max(outs),
        result_median=median(results), result_sigma=0.0,
        tool_median_s=median(tools), tool_sigma=0.0, tool_max_s=max(tools, default=0.0),
        # Room for every recorded context: no recorded turn is cut by the context limit.
        max_context=max(p.prompt_tokens + sum(p.outputs) + sum(p.results) for p in plans) + 1,
        sandbox=any(p.sandbox in ("prewarm", "cold") for p in plans),
        prewarm_s=median(boxes["prewarm"]), cold_median_s=median(boxes["cold"]),
        reward_median_s=median([p.reward_s for p in plans]),
        admission_rate=sum(p.admitted for p in plans) / len(plans),
        prewarm_pool=0,  # each plan keeps its recorded sandbox mode and time
        recorded=w,
    )


def sandbox_start(plan: TrajectoryPlan, spec: WorkloadSpec, pool_free: int) -> tuple[str | None, float, bool]:
    """How a trajectory's sandbox starts: its mode (None: it has none), its seconds, and
    whether it takes a prewarmed sandbox from the pool."""
    if plan.sandbox == "none" or (plan.sandbox is None and not spec.sandbox):
        return None, 0.0, False
    if plan.sandbox is not None:
        return plan.sandbox, plan.prewarm_s if plan.sandbox == "prewarm" else plan.cold_start_s, False
    if pool_free > 0:
        return "prewarm", plan.prewarm_s, True
    return "cold", plan.cold_start_s, False


def _lognormal(rng: np.random.Generator, median: float, sigma: float, size=None):
    if sigma <= 0:
        return np.full(size, median) if size is not None else median
    return median * np.exp(sigma * rng.standard_normal(size))


def group_of(spec: WorkloadSpec, index: int) -> int:
    """The GRPO group of trajectory ``index`` (groups are consecutive indices)."""
    return index // spec.group_size


def plan_trajectory(spec: WorkloadSpec, seed: int, index: int) -> TrajectoryPlan:
    """Draw trajectory ``index``'s plan from its own generator (independent of policy);
    what its group shares (the prompt, the environment's tool speed) comes from the
    group's generator. A recorded workload's plan is the recorded one its seed deals to
    ``index`` (:meth:`.recorded.RecordedWorkload.plan`)."""
    if spec.recorded is not None:
        return spec.recorded.plan(seed, index)
    rng = np.random.default_rng([seed, index, 0x5eed])
    grng = np.random.default_rng([seed, group_of(spec, index), 0x9e0])
    prompt = int(max(16, _lognormal(grng, spec.prompt_median, spec.prompt_sigma)))
    group_tool = float(_lognormal(grng, 1.0, spec.tool_group_sigma))
    turns = int(np.clip(round(_lognormal(rng, spec.turns_median, spec.turns_sigma)), 1, spec.turns_max))
    traj_tool = float(_lognormal(rng, 1.0, spec.tool_traj_sigma))
    outs = np.clip(_lognormal(rng, spec.output_median, spec.output_sigma, turns), 8, spec.output_max)
    results = np.clip(_lognormal(rng, max(spec.result_median, 1), spec.result_sigma, turns), 0, 32768)
    tool_median = max(spec.tool_median_s, 1e-3) * group_tool * traj_tool
    tools = np.clip(_lognormal(rng, tool_median, spec.tool_sigma, turns), 0.05, max(spec.tool_max_s, 0.05))
    cold = float(_lognormal(rng, max(spec.cold_median_s, 1e-3), 0.5))
    reward_s = float(max(0.05, _lognormal(rng, max(spec.reward_median_s, 1e-3), 0.5)))
    admitted = bool(rng.random() < spec.admission_rate)
    return TrajectoryPlan(
        prompt_tokens=prompt,
        outputs=[int(x) for x in outs],
        results=[int(x) for x in results[: turns - 1]] if spec.result_median > 0 else [0] * (turns - 1),
        tool_s=[float(x) for x in tools[: turns - 1]],
        cold_start_s=cold if spec.sandbox else 0.0,
        prewarm_s=spec.prewarm_s,
        reward_s=reward_s,
        admitted=admitted,
        reward=1.0 if admitted else 0.0,
    )
