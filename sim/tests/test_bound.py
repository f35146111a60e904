"""The ``bound`` policy: the hindsight-best dynamic P:D schedule (policies/bound.py).

A hand-built case whose best grid schedule is known by enumeration, the guarantee against
the best static ratio on small seeded settings, determinism of the schedule and of the
replayed events, the spec, and the runs of other policies it counts among its candidates."""

import dataclasses
import itertools

import pytest

from prorsa_schemas import read_log
from prorsa_sim import trajectories as trajmod
from prorsa_sim import workloads as W
from prorsa_sim.policies.bound import BoundPolicy, parse_bound
from prorsa_sim.policies.schedule import RecordedPolicy, SchedulePolicy
from prorsa_sim.catalog import make_policy
from prorsa_sim.policy import StaticPD
from prorsa_sim.compare import compare_seeds
from prorsa_sim.runner import StartAt, run_to_dir, simulate
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator
from prorsa_sim.workloads import TrajectoryPlan
from prorsa_tracker.core import apply, new_state

# --- the hand-built case -------------------------------------------------------------------
#
# Three Qwen3-235B engines (12 GPUs), one synchronous step of 64 trajectories with two
# turns each: a 30,000-token prompt answered in 16 tokens (the step opens with a prefill
# burst of 1.92M tokens), a 1 s tool call, then 3,000 output tokens over a ~30,000-token
# context (decode-heavy: 64 such sequences need ~1.9M KV tokens, more than one engine's
# 1.23M). Two prefill engines halve the burst; two decode engines hold the decode batch.
# So the best schedule starts 2:1 and turns 1:2 once the burst is done.

PHASE_PROMPT, PHASE_OUT1, PHASE_OUT2 = 30_000, 16, 3_000


@pytest.fixture
def phase(monkeypatch):
    spec = dataclasses.replace(W.MATH, name="phase", group_size=1, reward_median_s=0.5, admission_rate=1.0)
    monkeypatch.setitem(W.WORKLOADS, "phase", spec)
    real = trajmod.plan_trajectory

    def plan(spec_, seed, index):
        if spec_.name != "phase":
            return real(spec_, seed, index)
        return TrajectoryPlan(prompt_tokens=PHASE_PROMPT, outputs=[PHASE_OUT1, PHASE_OUT2], results=[16],
                              tool_s=[1.0], cold_start_s=0.0, prewarm_s=0.0, reward_s=0.5, admitted=True,
                              reward=1.0)

    monkeypatch.setattr(trajmod, "plan_trajectory", plan)
    return SimConfig(workload="phase", model="qwen3-235b", staleness=0, steps=1, batch_size=64, total_gpus=12)


def _rollout(cfg, policy) -> float:
    return Simulator(cfg, policy).run().summary["rollout_time_s"]


def test_bound_finds_the_known_best_schedule_of_a_phase_change(phase):
    cfg = phase
    statics = {p: _rollout(cfg, StaticPD(p, 3 - p)) for p in (1, 2)}
    # Every schedule on the 30 s grid over the first 6 segments (then held): the optimum.
    grid = {sched: _rollout(cfg, SchedulePolicy(list(sched), 30.0)) for sched in itertools.product((1, 2), repeat=6)}
    best_sched = min(grid, key=lambda s: (grid[s], s))
    assert best_sched == (2, 1, 1, 1, 1, 1)  # prefill-heavy for the burst, then decode-heavy

    res = simulate(cfg, "bound:30")
    s, b = res.summary, res.summary["bound_search"]
    assert b["chosen"] == "searched"
    assert b["schedule"] == [[0.0, 2], [30.0, 1]]
    assert s["rollout_time_s"] == grid[best_sched]
    assert s["rollout_time_s"] < min(statics.values()) * 0.9  # the switch pays, clearly
    assert s["switches"] == 1 and s["switch_log"][0]["requested_t"] == 30.0
    # The search measured on its forks what the replay measures.
    assert b["search_matches_replay"] is True
    assert b["best_static_rollout_s"] == min(statics.values())


def test_bound_equals_the_best_static_where_switching_cannot_pay(phase):
    # A restart switch takes 390 s (costmodel: Qwen3-235B), longer than the whole step.
    cfg = phase
    res = simulate(cfg, "bound:30:restart")
    s, b = res.summary, res.summary["bound_search"]
    best = min(_rollout(cfg, StaticPD(p, 3 - p)) for p in (1, 2))
    assert s["rollout_time_s"] == best
    assert b["chosen"] == "static" and s["switches"] == 0 and len(b["schedule"]) == 1


# --- the guarantee on seeded workloads --------------------------------------------------------


@pytest.mark.parametrize("workload,staleness,seed,batch", [("general", 0, 0, 32), ("coding", 2, 1, 16)])
def test_bound_is_never_slower_than_the_best_static_ratio(workload, staleness, seed, batch):
    cfg = SimConfig(workload=workload, model="qwen3-235b", staleness=staleness, steps=2, batch_size=batch,
                    total_gpus=16)
    out = compare_seeds(cfg, ["static", "bound:60:beam=1"], [seed], n_jobs=1)
    static, bound = (row["per_seed"][0] for row in out["rows"])
    assert bound["rollout_time_s"] <= static["rollout_time_s"]
    b = bound["bound_search"]
    assert b["best_static"] == static["policy"] and b["best_static_rollout_s"] == static["rollout_time_s"]
    # The budget is reported.
    assert b["segments"] >= 1 and b["lookaheads"] >= 1 and b["sim_s_explored"] > 0 and b["wall_s"] > 0
    assert b["candidates_per_segment"]["max"] == 3  # every ratio of a 4-engine cluster
    assert bound["start"] is None  # the bound chooses its own start


# --- determinism and the replay's events -------------------------------------------------------


def test_bound_is_deterministic_and_its_replay_writes_a_valid_log(tmp_path):
    cfg = SimConfig(workload="general", model="qwen3-235b", staleness=2, steps=2, batch_size=16, total_gpus=16, seed=3)
    runs = []
    for name in ("a", "b"):
        res = run_to_dir(cfg, "bound:60:beam=1", tmp_path / name, plot=False)
        runs.append((res.summary, (tmp_path / name / "events.jsonl.gz").read_bytes()))
    (s0, ev0), (s1, ev1) = runs
    assert s0["bound_search"]["schedule"] == s1["bound_search"]["schedule"]
    assert s0["rollout_time_s"] == s1["rollout_time_s"] and s0["switch_log"] == s1["switch_log"]
    assert ev0 == ev1  # byte-identical logs
    # A normal run's log: the tracker folds it with zero anomalies, and every switch of the
    # schedule is commanded, announced and completed as any policy's is.
    state, types, anomalies = new_state(), [], []
    for line in read_log(tmp_path / "a" / "events.jsonl.gz"):
        assert line.ok, line.error
        state, _, an = apply(state, line.event)
        anomalies += an
        types.append(line.event.type)
    assert anomalies == []
    assert types[0] == "run.started" and "policy.updated" in types
    assert types.count("engine.switching") == types.count("engine.switched") == s0["switches"]
    assert s0["bound_search"]["search_matches_replay"] is True


def test_spec_and_preparation():
    pol = make_policy("bound:30:beam=3:restart")
    assert isinstance(pol, BoundPolicy) and (pol.grid_s, pol.beam, pol.switch_mode) == (30.0, 3, "restart")
    assert pol.name == "bound:30:beam=3:restart" and make_policy("bound").name == "bound"
    for bad in ("bound:abc", "bound:beam=0", "bound:-5", "bound:beam=x"):
        with pytest.raises(ValueError):
            parse_bound(bad)
    with pytest.raises(ValueError, match="prepare"):
        Simulator(SimConfig(total_gpus=32, batch_size=8), make_policy("bound"))
    with pytest.raises(ValueError, match="multiple"):
        simulate(SimConfig(model="qwen3-235b", total_gpus=12, batch_size=8, steps=1), "bound:25")


def test_cli_run_and_compare_take_the_bound():
    import json

    from typer.testing import CliRunner

    from prorsa_cli.main import app

    common = ["--workload", "general", "--staleness", "2", "--model", "qwen3-235b", "--gpus", "12",
              "--batch-size", "8", "--steps", "1"]
    r = CliRunner().invoke(app, ["sim", "compare", *common, "--policies", "static,bound:60:beam=1", "--seeds", "0",
                                 "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    static, bound = json.loads(r.stdout)
    assert bound["policy"] == "bound:60:beam=1"
    assert bound["rollout_time_s"]["mean"] <= static["rollout_time_s"]["mean"]
    assert "bound_search" in bound["per_seed"][0]
    bad = CliRunner().invoke(app, ["sim", "run", *common, "--policy", "bound:beam=zero", "--out", "unused"])
    assert bad.exit_code != 0 and "beam" in bad.output


# --- seeds: other policies' runs among the candidates -------------------------------------------


def test_a_recorded_run_replays_to_the_event():
    cfg = SimConfig(workload="coding", model="qwen3-235b", staleness=2, steps=2, batch_size=16, total_gpus=16, seed=1)
    live = Simulator(cfg, StartAt(make_policy("reactive"), 2, 2)).run().summary
    assert live["switch_requests"], "the case must switch"
    again = Simulator(cfg, RecordedPolicy(2, live["switch_requests"])).run().summary
    for key in ("rollout_time_s", "step_times_s", "switch_log", "switches", "events", "switch_requests"):
        assert again[key] == live[key], key


def test_the_bound_counts_the_runs_it_is_handed(phase):
    # Restart switches (390 s) cannot pay within the step, so the search keeps the best
    # static ratio; a run handed to it that switched in place at 30 s is faster, and is
    # what the bound answers (replayed request for request).
    cfg = phase
    in_place = Simulator(cfg, SchedulePolicy([2, 1], 30.0)).run().summary
    static = min(_rollout(cfg, StaticPD(p, 3 - p)) for p in (1, 2))
    assert in_place["rollout_time_s"] < static
    res = simulate(cfg, "bound:30:restart", seeds={"in-place": (2, in_place["switch_requests"])})
    s, b = res.summary, res.summary["bound_search"]
    assert b["chosen"] == "seed:in-place" and b["schedule"] is None
    assert b["seeds"]["in-place"] == {"rollout_s": in_place["rollout_time_s"], "start_prefill": 2,
                                      "requests": len(in_place["switch_requests"]), "switches": 1}
    assert s["rollout_time_s"] == in_place["rollout_time_s"] and s["switch_log"] == in_place["switch_log"]
    # A slower seed is reported and not chosen.
    slow = Simulator(cfg, SchedulePolicy([1, 2], 30.0)).run().summary
    res = simulate(cfg, "bound:30:restart", seeds={"slow": (1, slow["switch_requests"])})
    assert res.summary["bound_search"]["chosen"] == "static" and res.summary["rollout_time_s"] == static


def test_a_comparison_hands_the_bound_its_switching_runs_and_sweep():
    cfg = SimConfig(workload="coding", model="qwen3-235b", staleness=2, steps=2, batch_size=16, total_gpus=16, seed=1)
    out = compare_seeds(cfg, ["static", "reactive", "bound:60:beam=1"], [1], n_jobs=1)
    static, reactive, bound = (row["per_seed"][0] for row in out["rows"])
    b = bound["bound_search"]
    assert b["seeds"]["reactive"]["rollout_s"] == reactive["rollout_time_s"]  # the same run again
    assert bound["rollout_time_s"] <= min(static["rollout_time_s"], reactive["rollout_time_s"])
    assert b["best_static_rollout_s"] == static["rollout_time_s"]
    assert b["static_sweep"][static["policy"]] == static["rollout_time_s"]
