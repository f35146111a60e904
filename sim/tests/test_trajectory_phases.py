"""Where the trajectories' time goes (``summary.phase_breakdown``) and the sync step's floor
that bounds any P:D split's speedup over colocation (``paper._ceiling``)."""

from __future__ import annotations

import pytest

from prorsa_sim.catalog import make_policy
from prorsa_sim.paper import _ceiling
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator
from prorsa_sim.summary import phase_breakdown
from prorsa_sim.trajectories import FIXED_PHASES, PHASES, Traj

SYNC = SimConfig(workload="coding", model="deepseek-v3.2", staleness=0, steps=3, batch_size=16, total_gpus=64)


def test_phase_breakdown_by_hand():
    # Three trajectories: (sandbox, prefill, decode, tool, reward) seconds.
    times = [10.0, 30.0, 20.0]
    phases = [(1.0, 2.0, 3.0, 3.0, 1.0), (2.0, 4.0, 10.0, 12.0, 2.0), (1.0, 3.0, 6.0, 9.0, 1.0)]
    tails = [((2.0, 4.0, 10.0, 12.0, 2.0), 16.0), ((1.0, 1.0, 2.0, 20.0, 1.0), 22.0)]
    out = phase_breakdown(times, phases, tails)
    assert out["mean"] == {"sandbox": 1.33, "prefill": 3.0, "decode": 6.33, "tool": 8.0, "reward": 1.33, "model": 9.33}
    # The slowest 1% of 3 trajectories is one: the 30 s one.
    assert out["slowest_1pct"] == {"n": 1, "sandbox": 2.0, "prefill": 4.0, "decode": 10.0, "tool": 12.0, "reward": 2.0,
                                   "model": 14.0}
    assert out["step_tail"]["tool"] == 16.0 and out["step_tail"]["model"] == 8.5
    assert out["floor_s"] == 19.0
    # Async (no step tails) and an empty run.
    assert "floor_s" not in phase_breakdown(times, phases, []) and phase_breakdown([], [], []) == {"mean": {}}


def test_phases_add_up_to_each_trajectory_and_the_sync_step():
    sim = Simulator(SYNC, make_policy("static:2:2"))
    s = sim.run().summary
    assert len(sim.traj_phases) == len(sim.traj_times) == 3 * 16
    for total, ph in zip(sim.traj_times, sim.traj_phases):
        assert len(ph) == len(PHASES) and min(ph) >= 0
        assert sum(ph) == pytest.approx(total, abs=1e-6)
        assert ph[PHASES.index("tool")] > 0 and ph[PHASES.index("decode")] > 0
    # A sync step's trajectories start with it: the last one's phases are the step time,
    # and the floor is at most that.
    assert len(sim.step_tails) == 3
    for step, (ph, floor) in zip(sim.step_times, sim.step_tails):
        assert sum(ph) == pytest.approx(step, abs=1e-6)
        assert sum(ph[i] for i in FIXED_PHASES) <= floor <= step
    br = s["trajectory_phases_s"]
    assert sum(v for k, v in br["mean"].items() if k != "model") == pytest.approx(s["mean_trajectory_s"], abs=0.05)
    assert sum(v for k, v in br["step_tail"].items() if k != "model") == pytest.approx(s["rollout_time_s"], abs=0.05)
    assert br["floor_s"] == pytest.approx(sum(f for _, f in sim.step_tails[1:]) / 2, abs=0.01)


def test_a_trajectorys_floor_by_hand():
    sim = Simulator(SYNC, make_policy("colocation"))
    # DeepSeek-V3.2's fastest step: the weights read and the EP all-to-all (costmodel).
    assert sim.min_decode_step_s == pytest.approx(sim.profile.decode_fixed_s + sim.profile.decode_s_per_seq)
    tr = Traj(0, "t0", "g0", None, 0, 0.0, phase_s=[2.0, 5.0, 40.0, 30.0, 3.0], decode_steps=1000)
    # Sandbox 2 + tools 30 + reward 3, and 1,000 decode steps at the fastest step; the
    # prefill (5 s) and the measured decode (40 s) do not count.
    assert sim._floor(tr) == pytest.approx(35.0 + 1000 * sim.min_decode_step_s)


def test_the_floor_is_the_workloads_own_and_bounds_every_split():
    # The same plans run under every policy: the floor does not depend on the split, and
    # no split's step is shorter than it.
    runs = {p: Simulator(SYNC, make_policy(p)).run().summary for p in ("colocation", "static:1:3", "static:3:1")}
    floors = {p: s["trajectory_phases_s"]["floor_s"] for p, s in runs.items()}
    assert max(floors.values()) - min(floors.values()) < 1e-6 * max(floors.values()) + 0.02
    for s in runs.values():
        assert s["rollout_time_s"] >= s["trajectory_phases_s"]["floor_s"]
    co = runs["colocation"]
    got = _ceiling({"per_seed": [co, co]})
    assert got["floor_s"]["mean"] == co["trajectory_phases_s"]["floor_s"]
    assert got["speedup_ceiling"]["mean"] == pytest.approx(co["rollout_time_s"] / co["trajectory_phases_s"]["floor_s"],
                                                           abs=1e-4)
    for s in runs.values():
        assert co["rollout_time_s"] / s["rollout_time_s"] <= got["speedup_ceiling"]["max"] + 1e-9
    # Async runs have no floor, and no ceiling is claimed for them.
    asy = Simulator(SimConfig(workload="coding", model="deepseek-v3.2", staleness=2, steps=2, batch_size=16,
                              total_gpus=64), make_policy("colocation")).run().summary
    assert "floor_s" not in asy["trajectory_phases_s"] and _ceiling({"per_seed": [asy]}) == {}
