"""The pure parts: the switch state machine, command decisions, config, launch command and load parsing."""

from __future__ import annotations

from dataclasses import replace

import pytest

from prorsa_engine_agent.clients import CounterRate, parse_loads
from prorsa_engine_agent.config import ConfigError, InstanceConfig, load_config
from prorsa_engine_agent.core import (MAX_REDRAINS, Phase, Switch, Verdict, advance, begin, decide, event_id,
                                     resume)
from prorsa_engine_agent.launch import launch_command
from prorsa_schemas import EngineCommand


def _cmd(to: str = "decode", deadline: float = 100.0) -> EngineCommand:
    return EngineCommand(id="i", ts=0.0, run="r", cmd="c1", engine="e0", action="switch_role",
                         to_role=to, deadline=deadline)


def _walk(sw, outcomes, **kw):
    phases = [sw.phase]
    for ok in outcomes:
        sw = advance(sw, ok, "why", **kw)
        phases.append(sw.phase)
    return sw, phases


def test_happy_paths_in_place_and_restart():
    sw, phases = _walk(begin(_cmd(), "prefill", "in_place", 0.0), [True] * 6)
    assert phases == [Phase.PRECHECK, Phase.DEREGISTER, Phase.DRAIN, Phase.SWITCH, Phase.HEALTH,
                      Phase.REGISTER, Phase.DONE]
    assert sw.role_now == "decode"
    _, phases = _walk(begin(_cmd(), "prefill", "restart", 0.0), [True] * 6)
    assert Phase.RESTART in phases and phases[-1] is Phase.DONE


def test_a_flip_refused_as_busy_drains_again_a_bounded_number_of_times():
    sw = begin(_cmd(), "prefill", "in_place", 0.0)
    for _ in range(3):  # PRECHECK, DEREGISTER, DRAIN
        sw = advance(sw, True)
    assert sw.phase is Phase.SWITCH
    for n in range(1, MAX_REDRAINS + 1):
        sw = advance(sw, False, "instance is not idle", busy=True)
        assert (sw.phase, sw.redrains, sw.error) == (Phase.DRAIN, n, "")
        sw = advance(sw, True)  # idle again: flip again
        assert sw.phase is Phase.SWITCH
    # Busy at every flip: the old role is intact, so the engine goes back to the router.
    sw = advance(sw, False, "instance is not idle", busy=True)
    assert sw.phase is Phase.RESTORE_REGISTER and "instance is not idle" in sw.error
    assert sw.role_now == "prefill"
    # A refusal that is not "busy" restores at once; an unsafe one is not re-drained.
    sw1 = advance(advance(advance(advance(begin(_cmd(), "prefill", "in_place", 0.0), True), True), True),
                  False, "transfer backend", busy=False)
    assert sw1.phase is Phase.RESTORE_REGISTER and sw1.redrains == 0
    sw2 = advance(advance(advance(advance(begin(_cmd(), "prefill", "in_place", 0.0), True), True), True),
                  False, "not idle", busy=True, safe_to_restore=False)
    assert sw2.phase is Phase.RESTORE_RESTART
    # A restart that finds the engine busy before its stop drains again too.
    sw3 = replace(begin(_cmd(), "prefill", "restart", 0.0), phase=Phase.RESTART)
    sw3 = advance(sw3, False, "1 running just before the stop", busy=True)
    assert (sw3.phase, sw3.redrains) == (Phase.DRAIN, 1)
    # The journal keeps the count; a journal written before the field existed reads as 0.
    j = sw.to_json()
    assert Switch.from_json(j).redrains == MAX_REDRAINS
    del j["redrains"]
    assert Switch.from_json(j).redrains == 0


def test_drain_timeout_aborts_then_restores_when_still_busy():
    sw, phases = _walk(begin(_cmd(), "prefill", "in_place", 0.0), [True, True, False, False, True])
    assert phases[2:] == [Phase.DRAIN, Phase.ABORT, Phase.RESTORE_REGISTER, Phase.FAILED]
    assert "timed out draining" in sw.error and sw.role_now == "prefill"


def test_unsafe_switch_failure_restarts_in_old_role_or_goes_down():
    sw = begin(_cmd(), "prefill", "in_place", 0.0)
    sw = advance(advance(advance(sw, True), True), True)  # at SWITCH
    restarted = advance(sw, False, "teardown failed", safe_to_restore=False)
    assert restarted.phase is Phase.RESTORE_RESTART
    assert advance(restarted, True).phase is Phase.RESTORE_REGISTER
    assert advance(sw, False, "x", safe_to_restore=True).phase is Phase.RESTORE_REGISTER
    assert advance(sw, False, "x", safe_to_restore=False, can_restart=False).phase is Phase.DOWN
    with pytest.raises(ValueError):
        advance(advance(advance(sw, False, "x"), True), True)  # FAILED is final


def test_resume_abandons_a_drain_but_reruns_later_phases():
    sw = begin(_cmd(), "prefill", "in_place", 0.0)
    assert resume(sw) == sw  # PRECHECK touched nothing: run it again
    assert resume(advance(advance(sw, True), True)).phase is Phase.RESTORE_REGISTER
    at_switch = advance(advance(advance(sw, True), True), True)
    assert resume(at_switch) == at_switch


def test_a_refused_precheck_fails_with_the_engine_untouched():
    sw = advance(begin(_cmd(), "prefill", "restart", 0.0), False, "weights unknown")
    assert sw.phase is Phase.FAILED and sw.error == "switch refused: weights unknown"
    assert sw.role_now == "prefill"
    # A restart refused before the stop (safe) only re-registers; after it, it relaunches.
    at_restart = advance(advance(advance(begin(_cmd(), "prefill", "restart", 0.0), True), True), True)
    assert at_restart.phase is Phase.RESTART
    assert advance(at_restart, False, "x", safe_to_restore=True).phase is Phase.RESTORE_REGISTER
    assert advance(at_restart, False, "x", safe_to_restore=False).phase is Phase.RESTORE_RESTART


def test_decisions():
    base = dict(now=0.0, role="prefill", modes=["in_place", "restart"], seen=False, busy_with=None,
                elsewhere=False, blockers=[])
    assert decide(_cmd(), **base).verdict is Verdict.EXECUTE
    assert decide(_cmd(), **{**base, "seen": True}).verdict is Verdict.DUPLICATE
    assert decide(_cmd(), **{**base, "role": None}).verdict is Verdict.REFUSE
    assert decide(_cmd(), **{**base, "role": None, "elsewhere": True}).verdict is Verdict.IGNORE
    assert "deadline" in decide(_cmd(deadline=1.0), **{**base, "now": 2.0}).reason
    assert "already switching" in decide(_cmd(), **{**base, "busy_with": "c0"}).reason
    assert decide(_cmd("prefill"), **base).verdict is Verdict.ALREADY
    assert decide(_cmd(), **{**base, "modes": [], "blockers": ["ep=2"]}).verdict is Verdict.REFUSE
    assert decide(_cmd(), **{**base, "modes": ["restart"]}).mode == "restart"
    assert len(event_id("x" * 128, "switched")) <= 128


def test_launch_command_and_in_place_rules():
    inst = InstanceConfig(engine="e", port=30001, model="m", bootstrap_port=9001, tp=2)
    cmd = launch_command(inst, "prefill", python="py")
    assert cmd[:3] == ["py", "-m", "sglang.launch_server"]
    assert cmd[cmd.index("--disaggregation-mode") + 1] == "prefill"
    assert cmd[cmd.index("--disaggregation-bootstrap-port") + 1] == "9001"
    assert "--enable-pd-role-switch" in cmd and inst.switch_modes() == ["in_place", "restart"]
    ep = InstanceConfig(engine="e", port=30001, ep=4)
    assert "--enable-pd-role-switch" not in launch_command(ep, "decode") and ep.switch_modes() == ["restart"]
    ext = InstanceConfig(engine="e", port=30001, launch="external", transfer_backend="nixl")
    assert ext.switch_modes() == []
    with pytest.raises(ValueError):
        launch_command(ext, "decode")


def test_config_errors_are_clear(tmp_path, monkeypatch):
    monkeypatch.delenv("PRORSA_AGENT_CONFIG", raising=False)
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "a.toml"
    bad.write_text("server = 'x'\n")
    with pytest.raises(ConfigError, match="at least one"):
        load_config(bad)
    bad.write_text("[[instances]]\nengine='a'\nport=1\n[[instances]]\nengine='a'\nport=2\n")
    with pytest.raises(ConfigError, match="share engine"):
        load_config(bad)
    bad.write_text("[[instances]]\nengine='a'\nport=1\ncolour='red'\n")
    with pytest.raises(ConfigError, match="colour"):
        load_config(bad)
    bad.write_text("router_url='ftp://x'\n[[instances]]\nengine='a'\nport=1\n")
    with pytest.raises(ConfigError, match="router_url"):
        load_config(bad)
    bad.write_text("[[instances]\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(bad)
    good = tmp_path / "g.toml"
    good.write_text("router_url='http://r:1'\n[[instances]]\nengine='a'\nport=30001\n")
    monkeypatch.setenv("PRORSA_AGENT_ROUTER_URL", "http://env:2")
    assert load_config(good).settings.router_url == "http://env:2"  # env overrides the file


def test_loads_sum_ranks_and_the_prefill_counter():
    rank = dict(num_running_reqs=2, num_waiting_reqs=1, num_used_tokens=100, max_total_num_tokens=1000,
                gen_throughput=50.0, cache_hit_rate=0.5, total_prefill_uncached_tokens=7000,
                disaggregation={"prefill_inflight_queue_reqs": 3})
    load = parse_loads({"loads": [rank, {**rank, "total_prefill_uncached_tokens": 3000, "cache_hit_rate": 0.3}]})
    assert (load.running, load.waiting, load.pd_queued, load.capacity_tokens) == (4, 2, 6, 2000)
    # engine.stats' queued_reqs: what waits for this engine, not what waits on its PD peer.
    assert load.queued == 2 and not load.idle
    dec = dict(num_running_reqs=1, num_waiting_reqs=1,
               disaggregation={"decode_prealloc_queue_reqs": 2, "decode_transfer_queue_reqs": 5})
    pd = parse_loads({"loads": [dec, dec]})
    assert (pd.queued, pd.pd_queued, pd.prealloc) == (6, 14, 4)
    assert load.gen_throughput == 100.0 and load.cache_hit_rate == pytest.approx(0.4)
    assert load.prefill_computed_total == 10_000
    # A rank without the counter (an SGLang older than it) makes the sum unknown, not short.
    old = {k: v for k, v in rank.items() if k != "total_prefill_uncached_tokens"}
    assert parse_loads({"loads": [rank, old]}).prefill_computed_total is None
    assert parse_loads({"loads": [{**rank, "total_prefill_uncached_tokens": "x"}]}).prefill_computed_total is None


def test_counter_rate():
    r = CounterRate()
    assert r.rate(1000, 10.0, "prefill") is None  # first sample
    assert r.rate(3000, 12.0, "prefill") == 1000.0  # 2000 tokens in 2 s
    assert r.rate(3000, 13.0, "prefill") == 0.0
    assert r.rate(500, 14.0, "prefill") is None  # counter went back: the engine restarted
    assert r.rate(1500, 15.0, "prefill") == 1000.0
    assert r.rate(2500, 16.0, "decode") is None  # across a switch: neither role's rate
    assert r.rate(2500, 16.0, "decode") is None  # no time passed
    assert r.rate(None, 17.0, "decode") is None and r.rate(2600, 18.0, "decode") is None
    assert r.rate(2700, 19.0, "decode") == 100.0
