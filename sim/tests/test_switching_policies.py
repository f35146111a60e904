"""The switching policies (reactive, prorsa, oracle): found by name without an import,
``--policies all``, the switch mode, and what they see (engine.stats rates)."""

import subprocess
import sys

import pytest

from prorsa_schemas import LogWriter, read_log
from prorsa_sim.policies import ProrsaPolicy, ReactivePolicy
from prorsa_sim.catalog import expand_policies, make_policy
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator


def test_switching_policies_are_found_by_name_in_a_fresh_interpreter():
    code = "from prorsa_sim.catalog import make_policy; print([make_policy(n).name for n in ('prorsa', 'reactive:restart', 'oracle:in_place')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['prorsa', 'reactive:restart', 'oracle:in_place']"


def test_policy_lists_and_modes_are_validated():
    assert expand_policies("all") == ["colocation", "static", "reactive", "prorsa", "oracle"]
    assert expand_policies("all:restart, static:2:6") == [
        "colocation", "static", "reactive:restart", "prorsa:restart", "oracle:restart", "static:2:6"
    ]
    assert make_policy("prorsa:restart").switch_mode == "restart"
    assert make_policy("oracle").wants_future and make_policy("oracle").switch_mode is None
    with pytest.raises(ValueError, match="prorsa:restart"):
        make_policy("prorsa:sideways")


def test_restart_mode_reaches_the_engines_and_stats_carry_prefill_rates(tmp_path):
    # A reactive policy that always finds prefill hot and decode cool: it moves decode
    # engines to prefill, by restart.
    policy = ReactivePolicy(queue_high=-1.0, queue_low=1e9, kv_low=2.0, cooldown_s=10.0, switch_mode="restart")
    cfg = SimConfig(workload="general", model="qwen3-235b", staleness=0, steps=1, batch_size=32)
    with LogWriter(tmp_path / "ev.jsonl") as sink:
        Simulator(cfg, policy, sink=sink).run()
    events = [line.event for line in read_log(tmp_path / "ev.jsonl")]
    modes = [e.mode for e in events if e.type == "engine.switching"]
    assert modes and set(modes) == {"restart"}
    assert all(e.seconds >= 390.0 for e in events if e.type == "engine.switched")
    # engine.stats report computed prefill throughput (prefill engines) and a cache hit ratio,
    # as an SGLang agent does; decode engines report none.
    stats = [e for e in events if e.type == "engine.stats"]
    assert any(e.prefill_tokens_per_s for e in stats if e.role == "prefill")
    assert all(e.prefill_tokens_per_s is None for e in stats if e.role == "decode")
    assert any(e.cache_hit_rate is not None for e in stats if e.role == "prefill")


def test_prorsa_paper_keeps_the_papers_rule_and_prorsa_sees_the_updates():
    assert make_policy("prorsa:paper").driver.rule == "paper"
    assert make_policy("prorsa:paper:restart").driver.switch_mode == "restart"
    assert make_policy("prorsa").driver.rule == "priced"
    with pytest.raises(ValueError):
        make_policy("prorsa:restart:paper")  # the rule comes first
    # The default prorsa folds policy.updated in (the weight-update pause is free to switch in).
    policy = make_policy("prorsa")
    res = Simulator(SimConfig(workload="general", staleness=2, steps=2, batch_size=48), policy).run()
    assert res.summary["trajectories_done"] > 0
    assert policy.driver.allocator.last_update_ts is not None
    assert policy.driver.allocator.config.rule == "priced"
    # The 'auto' objective, resolved by the run's run.started: asynchronous here.
    assert policy.driver.allocator.requested.objective == "auto"
    assert policy.driver.allocator.config.objective == "capacity"


def test_prorsa_judges_a_sync_run_by_saturation_unless_told_capacity():
    for spec, objective in (("prorsa", "saturation"), ("prorsa:capacity", "capacity")):
        policy = make_policy(spec)
        res = Simulator(SimConfig(workload="general", staleness=0, steps=2, batch_size=48), policy).run()
        assert res.summary["trajectories_done"] > 0
        cfg = policy.driver.allocator.config
        assert (cfg.rule, cfg.objective) == ("priced", objective), spec


def test_prorsa_latency_is_the_priced_rule_judging_moves_by_turn_latency():
    assert make_policy("prorsa:latency").driver.rule == "latency"
    assert make_policy("prorsa:latency:restart").driver.switch_mode == "restart"
    with pytest.raises(ValueError):
        make_policy("prorsa:paper:latency")  # one rule
    policy = make_policy("prorsa:latency")
    res = Simulator(SimConfig(workload="general", staleness=2, steps=2, batch_size=48), policy).run()
    assert res.summary["trajectories_done"] > 0
    cfg = policy.driver.allocator.config
    assert (cfg.rule, cfg.objective) == ("priced", "turn_latency")


def test_allocator_settings_in_the_spec_reach_the_allocator_over_the_profiles_priors():
    from prorsa_emulated.costmodel import get_profile
    from typer.testing import CliRunner

    from prorsa_cli.main import app

    spec = "prorsa:capacity:restart:settle_s=0:served_veto_yields_to_state=false"
    p = make_policy(spec)
    assert (p.name, p.switch_mode, p.driver.rule) == (spec, "restart", "capacity")
    assert p.driver.overrides == {"settle_s": 0.0, "served_veto_yields_to_state": False}
    assert make_policy("prorsa").driver.overrides is None and make_policy("oracle:settle_s=5").driver.overrides == {
        "settle_s": 5.0}
    for bad, why in (("prorsa:nope=1", "'nope' is not a setting of the allocator"),
                     ("prorsa:settle_s=-1", "settle_s: Input should be greater than or equal to 0"),
                     ("prorsa:objective=sideways", "objective: Input should be"),
                     ("prorsa:settle_s=0:settle_s=1", r"settle_s is set twice \(settle_s=0 and settle_s=1\)"),
                     ("prorsa:settle_s=0:tpot=0.1", "FIELD=VALUE"),  # tpot before the settings
                     ("reactive:settle_s=0", "reactive:restart")):  # reactive runs no allocator
        with pytest.raises(ValueError, match=f"bad policy {bad!r}: .*{why}"):
            make_policy(bad)
    # A run: the allocator runs with them, laid over the defaults and the profile's priors.
    policy = make_policy("prorsa:hysteresis=0.2:prefill_tokens_per_s=12345")
    cfg = SimConfig(workload="general", staleness=2, steps=1, batch_size=48)
    assert Simulator(cfg, policy).run().summary["trajectories_done"] > 0
    run_cfg = policy.driver.allocator.config
    assert (run_cfg.hysteresis, run_cfg.prefill_tokens_per_s) == (0.2, 12345.0)
    assert run_cfg.in_place_switch_s == get_profile(cfg.model).in_place_switch_s
    # The CLI refuses a bad one by name, before simulating anything.
    bad = CliRunner().invoke(app, ["sim", "run", "--policy", "prorsa:nope=1", "--steps", "1", "--out", "unused"])
    assert bad.exit_code != 0 and "'nope' is not a setting of the allocator" in bad.output


def test_prorsa_learns_prefill_throughput_from_engine_stats():
    policy = ProrsaPolicy()
    res = Simulator(SimConfig(workload="general", staleness=2, steps=2, batch_size=48), policy).run()
    assert res.summary["trajectories_done"] > 0
    theta = policy.driver.allocator.theta
    assert theta.samples > 0  # backlogged prefill engines reported their rates


def test_cli_compare_all_runs_every_policy():
    import json

    from typer.testing import CliRunner

    from prorsa_cli.main import app

    r = CliRunner().invoke(app, ["sim", "compare", "--workload", "general", "--staleness", "2", "--policies", "all",
                                 "--steps", "1", "--batch-size", "8", "--gpus", "32", "--seeds", "0", "--jobs", "1", "--json"])
    assert r.exit_code == 0, r.output
    names = [row["policy"] for row in json.loads(r.stdout)]
    assert names[0] == "colocation" and names[1].startswith("static:") and names[2:] == ["reactive", "prorsa", "oracle"]
    bad = CliRunner().invoke(app, ["sim", "compare", "--policies", "all,prorsa:sideways"])
    assert bad.exit_code == 2 and "prorsa:restart" in bad.output


def test_oracle_fork_survives_a_deep_object_graph():
    # The oracle deep-copies the simulation; long queues nest deeper than Python's default
    # recursion limit (math / staleness 2 at batch 512 raised RecursionError). Emulated
    # here with a low ambient limit on a small run.
    import sys

    from prorsa_sim.policies import OraclePolicy

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        res = Simulator(SimConfig(workload="math", staleness=2, steps=1, batch_size=64), OraclePolicy()).run()
    finally:
        sys.setrecursionlimit(limit)
    assert res.summary["trajectories_done"] > 0
    assert sys.getrecursionlimit() == limit


def test_tpot_option_sizes_decode_by_step_time():
    from prorsa_emulated.costmodel import get_profile
    from prorsa_sim.policies.prorsa import decode_step_prior

    p = make_policy("prorsa:restart:tpot=0.1")
    assert (p.name, p.driver.switch_mode, p.driver.tpot_slack) == ("prorsa:restart:tpot=0.1", "restart", 0.1)
    assert make_policy("oracle:tpot=0.2").driver.tpot_slack == 0.2 and make_policy("prorsa").driver.tpot_slack is None
    for bad in ("prorsa:tpot=x", "prorsa:tpot=0", "reactive:tpot=0.1", "prorsa:tpot=0.1:restart"):
        with pytest.raises(ValueError, match="bad policy"):
            make_policy(bad)
    # The per-engine step prior reproduces the profile's step when the load is spread over
    # the attention-DP ranks.
    prof = get_profile("deepseek-v3.2")
    prior = decode_step_prior(prof)
    seqs, kv = 1600, 16_000_000
    per_engine = prior["decode_step_fixed_s"] + seqs * prior["decode_step_per_seq_s"] + kv * prior["decode_step_per_kv_token_s"]
    assert per_engine == pytest.approx(prof.decode_step_time(seqs // prof.attn_dp, kv // prof.attn_dp))
