"""GRPO groups (shared prompt and its prefix cache, whole-group dispatch, correlated tool
latencies) and how a request's attention-DP rank is chosen."""

from types import SimpleNamespace

import numpy as np
import pytest

from prorsa_emulated.costmodel import get_profile
from prorsa_schemas import events as E
from prorsa_sim.cluster import ClusterSim
from prorsa_sim.engines import Req
from prorsa_sim.catalog import make_policy
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator
from prorsa_sim.workloads import get_workload, group_of, plan_trajectory


def _traj(tid, shared_key=None, shared_tokens=0):
    return SimpleNamespace(tid=tid, last_rank=None, shared_key=shared_key, shared_tokens=shared_tokens)


class Recorder(ClusterSim):
    def __init__(self, profile, roles, dp_routing="prefix"):
        super().__init__(profile, roles, dp_routing=dp_routing)
        self.started = []

    def _on_prefill_started(self, eng, req):
        self.started.append((req.rid, req.cached, req.pf_left))


def test_group_members_share_their_first_prompt_and_its_prefix_cache():
    spec = get_workload("general")
    plans = [plan_trajectory(spec, 7, i) for i in range(3 * spec.group_size)]
    by_group = {}
    for i, p in enumerate(plans):
        by_group.setdefault(group_of(spec, i), set()).add(p.prompt_tokens)
    assert all(len(v) == 1 for v in by_group.values())
    assert len({next(iter(v)) for v in by_group.values()}) == 3

    # Hand-computed: the first member prefills all 3,000 tokens; the second, routed to the
    # same rank (it follows the group's prefix), reuses 2,999 (SGLang always computes the
    # last prompt token) and computes one.
    sim = Recorder(get_profile("deepseek-v3.2"), ["mixed"])
    a = Req(_traj("a", "g0@0", 3000), "a-r1", 3000, 5)
    sim.route_prefill(a)
    sim.run_until(lambda: a.out_target <= 0 or not a.alive)
    b = Req(_traj("b", "g0@0", 3000), "b-r1", 3000, 5)
    sim.route_prefill(b)
    assert b.rank is a.rank
    sim.run_until(lambda: len(sim.started) == 2)
    assert sim.started == [("a-r1", 0, 3000), ("b-r1", 2999, 1)]


def test_dp_routing_load_ignores_the_prefix_and_prefix_follows_it():
    prof = get_profile("deepseek-v3.2")
    for mode, expected_rank, expected_cached in (("prefix", 3, 5000), ("load", 0, 0)):
        sim = Recorder(prof, ["mixed"], dp_routing=mode)
        home = sim.engines[0].ranks[3]
        home.cache_put("t", 5000)
        tr = _traj("t")
        tr.last_rank = home
        req = Req(tr, "t-r2", 5200, 5)
        sim.route_prefill(req)
        assert req.rank.idx == expected_rank, mode
        sim.run_until(lambda: bool(sim.started))
        assert sim.started[0][1] == expected_cached, mode
    with pytest.raises(ValueError, match="dp_routing"):
        ClusterSim(prof, ["mixed"], dp_routing="random")


def test_async_dispatch_launches_whole_groups():
    class Sink(list):
        def write(self, ev):
            self.append(ev)

    sink = Sink()
    cfg = SimConfig(workload="general", staleness=2, steps=2, batch_size=20, total_gpus=32, seed=3)
    Simulator(cfg, make_policy("colocation"), sink=sink).run()
    counts = {}
    for ev in sink:
        if isinstance(ev, E.TrajectoryDispatched):
            counts[ev.group] = counts.get(ev.group, 0) + 1
    g = get_workload("general").group_size
    # batch 20 is not a multiple of 8: the bounds alone would cut a group.
    assert counts and all(n == g for n in counts.values()), counts


def test_tool_latencies_are_correlated_within_a_group():
    spec = get_workload("coding")
    n_groups, g = 150, spec.group_size
    logs = np.array([
        np.log(np.median(plan_trajectory(spec, 11, i).tool_s or [1.0])) for i in range(n_groups * g)
    ]).reshape(n_groups, g)
    # Intra-class correlation: the share of variance between groups.
    between = logs.mean(axis=1).var(ddof=1) - logs.var(axis=1, ddof=1).mean() / g
    icc = between / (between + logs.var(axis=1, ddof=1).mean())
    # Group sigma 0.6 against trajectory 0.3 and the per-call spread averaged over turns.
    assert icc > 0.3


def test_the_live_demos_caps():
    # The live rollout driver caps turns and outputs; the simulator runs that scenario with
    # the same caps (one plan, cut the same way).
    from prorsa_sim.simconfig import build_config
    from prorsa_sim.workloads import TrajectoryPlan

    plan = TrajectoryPlan(1000, [300, 900, 50, 700], [10, 20, 30], [1.0, 2.0, 3.0], 0.0, 0.0, 1.0, True, 1.0)
    cut = plan.capped(max_turns=2, max_output=512)
    assert (cut.outputs, cut.results, cut.tool_s) == ([300, 512], [10], [1.0])
    assert plan.capped().outputs == plan.outputs and plan.capped(max_turns=9).results == plan.results
    assert plan.capped(max_turns=1).results == [] and plan.capped(max_turns=1).outputs == [300]
    with pytest.raises(ValueError, match="--max-turns must be >= 1"):
        build_config(max_turns=0)

    class Sink(list):
        write = list.append

    events = Sink()
    cfg = SimConfig(workload="general", model="deepseek-v3.2", steps=1, batch_size=16, total_gpus=64,
                    max_turns=2, max_output=64)
    Simulator(cfg, make_policy("colocation"), sink=events).run()
    turns: dict[str, int] = {}
    for e in events:
        if isinstance(e, E.RequestQueued):
            turns[e.traj] = max(turns.get(e.traj, 0), e.turn + 1)
    assert len(turns) == 16 and max(turns.values()) == 2
    outs = [e.output_tokens for e in events if isinstance(e, E.DecodeFinished)]
    assert outs and max(outs) == 64


def test_without_the_group_prefix_no_member_finds_its_groups_prompt_cached():
    # The live driver's prompt texts are each trajectory's own: `--no-group-prefix` runs the
    # same plans with no shared first prompt, so the members compute what the group's
    # prefix cache saved them (the same prompt tokens sent either way).
    def run(shared: bool) -> dict:
        cfg = SimConfig(workload="general", model="deepseek-v3.2", steps=1, batch_size=32, total_gpus=64,
                        max_turns=2, max_output=64, group_prefix=shared)
        return Simulator(cfg, make_policy("colocation")).run().summary

    shared, own = run(True), run(False)
    assert shared["prefill_tokens"] == own["prefill_tokens"]
    assert shared["cached_tokens"] > 10 * own["cached_tokens"]
    saved = shared["cached_tokens"] - own["cached_tokens"]
    assert own["prefill_computed_tokens"] - shared["prefill_computed_tokens"] == saved
