"""Policies drive role switches through the interface; the CLI writes what it promises."""

import json
from dataclasses import dataclass

import pytest
from typer.testing import CliRunner

from prorsa_cli.main import app
from prorsa_schemas import read_log
from prorsa_sim.catalog import make_policy
from prorsa_sim.policy import Observation, SwitchRequest, static_sweep_ratios
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator
from prorsa_tracker.core import apply, new_state


@dataclass
class FlipOnce:
    """Start 4:4, move one prefill engine to decode at the first window; peek the future."""

    name: str = "flip-once"
    wants_future: bool = True
    seen: list = None

    def initial_roles(self, profile, n):
        return ["prefill"] * (n // 2) + ["decode"] * (n - n // 2)

    def on_window(self, obs: Observation):
        if self.seen is None:
            self.seen = []
        fut = obs.future(obs.window_s)
        self.seen.append((obs.t, len(obs.events), fut.prefill_tokens, fut.decode_admit_tokens))
        if len(self.seen) == 1:
            return [SwitchRequest(obs.engines[0].engine, "decode", "in_place")]
        return []


def test_a_policy_switch_drains_switches_and_logs_it(tmp_path):
    from prorsa_schemas import LogWriter

    policy = FlipOnce()
    cfg = SimConfig(workload="general", staleness=2, steps=2, batch_size=48)
    with LogWriter(tmp_path / "ev.jsonl") as sink:
        res = Simulator(cfg, policy, sink=sink).run()
    assert res.summary["switches"] == 1
    assert res.summary["final_roles"] == {"prefill": 3, "decode": 5, "mixed": 0}
    state, anomalies, kinds = new_state(), [], []
    for line in read_log(tmp_path / "ev.jsonl"):
        state, _, an = apply(state, line.event)
        anomalies += an
        if line.event.type.startswith("engine.switch") or line.event.type == "engine.command":
            kinds.append((line.event.type, line.event.ts))
    assert anomalies == []
    assert [k for k, _ in kinds] == ["engine.command", "engine.switching", "engine.switched"]
    # The switch takes at least the in-place switch time after the drain.
    assert kinds[2][1] - kinds[1][1] >= 15.0
    # The oracle hook saw real future demand, and the observation carried the events.
    assert all(n > 0 for _, n, _, _ in policy.seen)
    assert sum(p for _, _, p, _ in policy.seen) > 0


def test_oracle_future_matches_what_then_happens():
    seen = []

    @dataclass
    class Peek:
        name: str = "peek"
        wants_future: bool = True

        def initial_roles(self, profile, n):
            return ["mixed"] * n

        def on_window(self, obs):
            seen.append(obs.future(obs.window_s))
            return []

    res = Simulator(SimConfig(workload="general", staleness=0, steps=1, batch_size=32), Peek()).run()
    # Window k's actual queued prompt tokens are what the fork predicted at its start
    # (minus the backlog, which the forecast definition also counts).
    assert len(seen) >= 10
    for fut, nxt in zip(seen, res.timeline[1:]):
        assert fut.t == nxt["t"]
        assert fut.arrival_tokens == nxt["prefill_demand"]
        assert fut.decode_admit_tokens == nxt["decode_admit"]
        assert fut.prefill_tokens >= fut.arrival_tokens


def test_policy_specs_are_validated():
    assert make_policy("static:5:3").name == "static:5:3"
    with pytest.raises(ValueError, match="static:P:D"):
        make_policy("static:5")
    with pytest.raises(ValueError, match="unknown policy"):
        make_policy("magic")
    with pytest.raises(ValueError, match="P \\+ D must equal"):
        Simulator(SimConfig(batch_size=8), make_policy("static:5:5")).run()
    assert static_sweep_ratios(8) == [(p, 8 - p) for p in range(1, 8)]
    assert len(static_sweep_ratios(32)) == 7


def test_cli_run_writes_log_summary_and_plot(tmp_path):
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["sim", "run", "--workload", "math", "--staleness", "0", "--model", "qwen3-235b",
                                 "--policy", "static:16:16", "--steps", "1", "--batch-size", "32", "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    for key in ("rollout_time_s", "step_times_s", "mean_trajectory_s", "gpu_idle_ratio", "prefill_tokens",
                "decode_tokens", "switches"):
        assert key in summary
    assert summary["policy"] == "static:16:16"
    assert (out / "timeline.png").read_bytes()[:4] == b"\x89PNG"
    assert sum(1 for _ in read_log(out / "events.jsonl.gz")) == summary["events"]


def test_cli_compare_json_and_bad_input():
    runner = CliRunner()
    r = runner.invoke(app, ["sim", "compare", "--workload", "general", "--model", "deepseek-v3.2", "--policies",
                            "colocation,static:4:4", "--steps", "1", "--batch-size", "24", "--seeds", "0", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert [row["policy"] for row in rows] == ["colocation", "static:4:4"]
    assert rows[0]["speedup"] == 1.0
    bad = runner.invoke(app, ["sim", "run", "--workload", "chess", "--out", "/tmp/x"])
    assert bad.exit_code == 2 and "unknown workload" in bad.output
    bad = runner.invoke(app, ["sim", "compare", "--policies", "colocation,warp"])
    assert bad.exit_code == 2 and "unknown policy" in bad.output
    bad = runner.invoke(app, ["sim", "run", "--model", "gpt-9", "--out", "/tmp/x"])
    assert bad.exit_code == 2 and "unknown model" in bad.output
    bad = runner.invoke(app, ["sim", "compare", "--dp-routing", "random"])
    assert bad.exit_code == 2 and "unknown dp routing" in bad.output
    bad = runner.invoke(app, ["sim", "run", "--router-policy", "random", "--out", "/tmp/x"])
    assert bad.exit_code == 2 and "unknown router policy" in bad.output
    # A split that is not one of the cluster's (8 deepseek-v3.2 engines of 128 GPUs) is one
    # line before anything runs, not a traceback from a worker process.
    for args in (["sim", "compare", "--policies", "colocation,static:9:9"],
                 ["sim", "compare", "--policies", "prorsa", "--start", "0:8"],
                 ["sim", "run", "--policy", "static:2:2", "--out", "/tmp/x"]):
        bad = runner.invoke(app, args)
        assert bad.exit_code == 2 and "P + D = 8 (the deepseek-v3.2 engines" in bad.output, (args, bad.output)
    for fixed in ("colocation", "static", "static:4:4"):
        bad = runner.invoke(app, ["sim", "paper", "--pd-policy", fixed, "--out", "/tmp/x"])
        assert bad.exit_code == 2 and "--pd-policy takes a switching policy" in bad.output, bad.output
    bad = runner.invoke(app, ["sim", "compare", "--seeds", "0,-1"])
    assert bad.exit_code == 2 and "--seeds must be >= 0, got -1" in bad.output


def test_cli_compare_takes_the_dp_routing():
    runner = CliRunner()
    base = ["sim", "compare", "--workload", "general", "--model", "deepseek-v3.2", "--policies", "colocation",
            "--steps", "1", "--batch-size", "24", "--seeds", "0", "--jobs", "1", "--json"]
    rows = {}
    for mode in ("load", "prefix"):
        r = runner.invoke(app, [*base, "--dp-routing", mode])
        assert r.exit_code == 0, r.output
        rows[mode] = json.loads(r.stdout)[0]["per_seed"][0]
        assert rows[mode]["dp_routing"] == mode
    # Following the prefix reuses more of it: fewer prompt tokens are computed.
    assert rows["prefix"]["prefill_computed_tokens"] < rows["load"]["prefill_computed_tokens"]
    r = runner.invoke(app, [*base, "--dp-routing", "prefix", "--router-policy", "smg"])
    assert r.exit_code == 0, r.output
    smg = json.loads(r.stdout)[0]["per_seed"][0]
    assert smg["router_policy"] == "smg" and rows["prefix"]["router_policy"] == "queue"


def test_cli_takes_the_trainer_time(tmp_path):
    # Async: a policy update comes a training time after a batch of rewards is in, so no
    # step (update to update) is shorter than --train-s.
    runner = CliRunner()
    out = tmp_path / "run"
    r = runner.invoke(app, ["sim", "run", "--workload", "general", "--staleness", "2", "--model", "deepseek-v3.2",
                            "--policy", "static:4:4", "--steps", "2", "--batch-size", "24", "--train-s", "90",
                            "--no-plot", "--out", str(out)])
    assert r.exit_code == 0, r.output
    steps = json.loads((out / "summary.json").read_text())["step_times_s"]
    assert len(steps) == 2 and min(steps) >= 90.0, steps
    bad = runner.invoke(app, ["sim", "compare", "--train-s", "-1"])
    assert bad.exit_code == 2 and "--train-s must be >= 0" in bad.output
