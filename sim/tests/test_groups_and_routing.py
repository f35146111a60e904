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
    return SimpleNamespace(tid=tid, last_rank=None, router_prefix=0, router_gen=0,
                           shared_key=shared_key, shared_tokens=shared_tokens)


class Recorder(ClusterSim):
    def __init__(self, profile, roles, dp_routing="prefix", router_policy="queue"):
        super().__init__(profile, roles, dp_routing=dp_routing, router_policy=router_policy)
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


def _busy(rank, n):
    """``n`` queued requests on ``rank`` (its load for the router), not started."""
    rank.waiting.extend(Req(_traj(f"x{rank.idx}-{i}"), f"x{rank.idx}-{i}", 5000, 1) for i in range(n))
    rank.waiting_tokens += 5000 * n


def test_smg_keeps_the_prefix_until_the_loads_are_imbalanced():
    prof = get_profile("deepseek-v3.2")

    def route(policy, queued, prev_prompt=5000, mode="prefix"):
        sim = Recorder(prof, ["mixed", "mixed"], dp_routing=mode, router_policy=policy)
        home = sim.engines[1].ranks[3]
        _busy(home, queued)
        tr = _traj("t")
        tr.last_rank, tr.router_prefix = home, prev_prompt
        home.cache_put("t", prev_prompt)
        req = Req(tr, "t-r2", 5200, 5)
        sim.route_prefill(req)
        return req.rank.engine.index, req.rank.idx

    # 10 requests queued on the rank that served the trajectory's last request (50,000
    # tokens): the queue rule moves the turn to an idle rank (50,000 - 5,000 cached >
    # 0); SMG keeps it (loads 10 against 0 differ by less than 64 requests).
    assert route("queue", 10) == (0, 0)
    assert route("smg", 10) == (1, 3)
    # 70 queued: 70 - 0 > 64 and 70 > 1.5 x 0, imbalanced: SMG sends it to the least loaded.
    assert route("smg", 70) == (0, 0)
    # A prefix under 0.3 of the prompt (1,000 of 5,200) is no match: the smallest tree
    # (every rank's is empty: the first) takes it.
    assert route("smg", 10, prev_prompt=1000) == (0, 0)
    # Without DP awareness SMG picks the engine (the prefix's: its load, 10, is within 64
    # of the other's) and the engine's data-parallel controller the rank, by load.
    assert route("smg", 10, mode="load") == (1, 0)
    assert route("smg", 70, mode="load") == (0, 0)
    with pytest.raises(ValueError, match="router_policy"):
        ClusterSim(prof, ["mixed"], router_policy="random")


def test_smg_forgets_the_prefixes_of_a_worker_that_switched_away_and_back():
    # The gateway removes a worker that leaves (a role switch begins) with its prefix tree;
    # when it registers again its tree is empty, so the prefix a trajectory last sent it
    # matches nothing there (the engine flushed its cache too).
    prof = get_profile("deepseek-v3.2")

    def route(switch_away_and_back):
        sim = Recorder(prof, ["prefill", "prefill", "decode"], router_policy="smg")
        # 32 fresh first turns: the smallest-tree rule gives every rank one (3,000 tokens).
        for i in range(32):
            sim.route_prefill(Req(_traj(f"f{i}"), f"f{i}-r1", 3000, 5))
        eng = sim.engines[0]
        if switch_away_and_back:
            # Engine 0's queued turns go to engine 1 when its drain begins, and it comes
            # back to prefill empty, with empty trees.
            assert sim.request_switch(eng, "decode", "in_place", "c1")
            sim.run_until(lambda: eng.switch is None)
            assert sim.request_switch(eng, "prefill", "in_place", "c2")
            sim.run_until(lambda: eng.switch is None)
        # The trajectory's previous request (5,000 tokens) went to engine 0's rank 5
        # before any switch.
        tr = _traj("t")
        tr.last_rank, tr.router_prefix = eng.ranks[5], 5000
        req = Req(tr, "t-r2", 5200, 5)
        sim.route_prefill(req)
        return req.rank.engine.index, req.rank.idx

    # Kept: the prefix (5,000 of 5,200 tokens) matches the rank that served it.
    assert route(False) == (0, 5)
    # Forgotten: no match, so the smallest tree takes it: engine 0's first rank (every
    # engine-0 tree is empty; engine 1's hold the re-queued turns).
    assert route(True) == (0, 0)


def test_smg_smallest_tree_spreads_first_requests_and_follows_the_group():
    # Fresh trajectories with no prefix anywhere go to the worker whose tree (what the
    # router has sent it) is smallest, so a burst is spread over the ranks at once (the
    # engine's own cache fills only when a prefill ends); a GRPO group's later members
    # follow its first member's rank (the shared prompt matches all of theirs).
    prof = get_profile("deepseek-v3.2")
    sim = Recorder(prof, ["mixed"], router_policy="smg")
    ranks = []
    for i in range(16):
        req = Req(_traj(f"f{i}"), f"f{i}-r1", 3000, 5)
        sim.route_prefill(req)
        ranks.append(req.rank.idx)
    assert sorted(ranks) == list(range(16))
    first = Req(_traj("g-a", "g@0", 3000), "g-a-r1", 3000, 5)
    sim.route_prefill(first)
    second = Req(_traj("g-b", "g@0", 3000), "g-b-r1", 3000, 5)
    sim.route_prefill(second)
    assert second.rank is first.rank


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
