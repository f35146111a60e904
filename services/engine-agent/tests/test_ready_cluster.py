"""Pure parts of a real-cluster deployment: advertised addresses, SGLang's in-place refusals,
which weights a restart loads, the update guard, and the example config in deploy/."""

from __future__ import annotations

from pathlib import Path

import pytest

from prorsa_engine_agent.config import ConfigError, InstanceConfig, load_config, routable_address
from prorsa_engine_agent.inplace import graph_memory_refusal, server_blockers
from prorsa_engine_agent.launch import launch_command, sglang_args
from prorsa_engine_agent.weights import Policy, Reported, Weights, resolve, update_in_progress

ROOT = Path(__file__).resolve().parents[3]


def _load(tmp_path: Path, text: str):
    p = tmp_path / "agent.toml"
    p.write_text(text)
    return load_config(p)


def test_engines_register_under_a_routable_address(tmp_path, monkeypatch):
    for k in ("PRORSA_AGENT_ROUTER_URL", "PRORSA_AGENT_ADVERTISE_HOST", "PRORSA_AGENT_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    remote = 'router_url = "http://10.9.8.7:30080"\n'
    # Default with a remote router: this host's routable address, bound and advertised.
    addr = routable_address()
    assert addr is not None and not addr.startswith("127.")
    inst = _load(tmp_path, remote + "[[instances]]\nengine='a'\nport=30001\n").instances[0]
    assert inst.url == f"http://{addr}:30001" and inst.bind_host == addr
    # Per server, then per instance; bind everywhere, advertise one address.
    cfg = _load(tmp_path, remote + "advertise_host = '10.0.0.3'\n[[instances]]\nengine='a'\nport=1\n"
                "host='0.0.0.0'\n[[instances]]\nengine='b'\nport=2\nadvertise_host='10.0.0.4'\n")
    assert [i.url for i in cfg.instances] == ["http://10.0.0.3:1", "http://10.0.0.4:2"]
    assert cfg.instances[0].bind_host == "0.0.0.0"
    assert sglang_args(cfg.instances[0], "prefill")[sglang_args(cfg.instances[0], "prefill").index("--host") + 1] == "0.0.0.0"
    # A local router: loopback, as before.
    local = _load(tmp_path, "router_url = 'http://127.0.0.1:30080'\n[[instances]]\nengine='a'\nport=1\n")
    assert local.instances[0].url == "http://127.0.0.1:1"
    # Loopback towards a remote router, or a wildcard advertised: refused, saying what to set.
    for bad in ("host='127.0.0.1'", "advertise_host='localhost'", "advertise_host='0.0.0.0'",
                "host='127.0.0.1'\nadvertise_host='10.0.0.3'"):
        with pytest.raises(ConfigError, match="advertise_host"):
            _load(tmp_path, remote + f"[[instances]]\nengine='a'\nport=1\n{bad}\n")


@pytest.mark.parametrize("kw, why", [
    (dict(dcp=2), "decode context parallelism"),
    (dict(extra_args=["--dcp-size", "2"]), "decode context parallelism"),
    (dict(attn_dp=2, dp_attention_local_control_broadcast=True), "local control broadcast"),
    (dict(attn_dp=2, extra_args=["--enable-dp-attention-local-control-broadcast"]), "local control broadcast"),
    (dict(extra_args=["--disaggregation-decode-allocation-policy", "prefill_complete"]), "prefill_complete"),
])
def test_sglangs_start_refusals_of_the_role_switch_flag(kw, why):
    inst = InstanceConfig(engine="e", port=30001, **kw)
    assert any(why in b for b in inst.in_place_blockers()), inst.in_place_blockers()
    assert "--enable-pd-role-switch" not in launch_command(inst, "prefill", python="py")
    assert inst.switch_modes() == ["restart"]
    # Broadcast without attention DP is no blocker (SGLang checks both).
    assert not InstanceConfig(engine="e", port=1, dp_attention_local_control_broadcast=True).in_place_blockers()


def test_refusals_read_from_a_running_engine():
    ok = {"enable_pd_role_switch": True, "disaggregation_mode": "prefill",
          "disaggregation_transfer_backend": "mooncake", "ep_size": 1, "pp_size": 1, "dcp_size": 1}
    assert server_blockers(ok) == []
    for change, why in ((dict(enable_pd_role_switch=False), "without --enable-pd-role-switch"),
                        (dict(dcp_size=2), "decode context parallelism"),
                        (dict(attn_dp_size=4, enable_dp_attention_local_control_broadcast=True), "broadcast"),
                        (dict(disaggregation_transfer_backend="nixl"), "nixl"),
                        (dict(speculative_algorithm="EAGLE"), "speculative"),
                        (dict(disaggregation_mode="null"), "not in PD")):
        assert any(why in b for b in server_blockers({**ok, **change})), change
    # The decode graph memory: needed for a flip to decode unless graphs already exist.
    assert "decode_cuda_graph_memory_gb" in graph_memory_refusal("decode", None, {"internal_states": [{}]})
    assert graph_memory_refusal("decode", 1.5, None) == ""
    assert graph_memory_refusal("prefill", None, None) == ""
    assert graph_memory_refusal("decode", None, {"internal_states": [{"decode_cuda_graph_bs": [1, 2]}]}) == ""


def test_which_weights_a_restart_loads():
    launched = Weights("Qwen/Qwen3-8B", "default", since=100.0)
    same = Reported("Qwen/Qwen3-8B", "default")
    assert resolve(launched, same, None, None, 200.0).weights == launched
    # Loaded from disk: the engine's path and version.
    w = resolve(launched, Reported("/ckpt/7", "7"), None, None, 200.0).weights
    assert (w.model_path, w.weight_version) == ("/ckpt/7", "7")
    # A new version at the same path: only with a template or the policy's path.
    assert resolve(launched, Reported("Qwen/Qwen3-8B", "7"), None, None, 200.0).weights is None
    w = resolve(launched, Reported("Qwen/Qwen3-8B", "7"), None, "/ckpt/{version}/hf", 200.0).weights
    assert w.model_path == "/ckpt/7/hf"
    w = resolve(launched, Reported("Qwen/Qwen3-8B", "7"), Policy(7, 150.0, "/p/7"), None, 200.0).weights
    assert w.model_path == "/p/7"
    # A policy update after the launch while the engine reports its launch weights: unknown.
    got = resolve(launched, same, Policy(2, 150.0), None, 200.0)
    assert got.weights is None and "policy version 2" in got.reason
    assert resolve(launched, same, Policy(2, 50.0), None, 200.0).weights == launched  # older than launch
    # The engine does not answer: launch weights, or the policy's.
    assert resolve(launched, None, None, None, 200.0).weights == launched
    assert resolve(launched, None, Policy(3, 150.0, "/p/3"), None, 200.0).weights.model_path == "/p/3"
    assert resolve(launched, None, Policy(3, 150.0), None, 200.0).weights is None


def test_update_in_progress_signs():
    assert update_in_progress(None, True, None) == ""
    assert "paused" in update_in_progress(None, False, None)
    assert "has not finished" in update_in_progress(Reported("m", "4"), True, Policy(5, 1.0))
    assert update_in_progress(Reported("m", "5"), True, Policy(5, 1.0)) == ""
    assert update_in_progress(Reported("m", "default"), None, Policy(5, 1.0)) == ""


def test_the_example_deployment_config_loads(monkeypatch):
    for k in ("PRORSA_AGENT_ROUTER_URL", "PRORSA_AGENT_ADVERTISE_HOST", "PRORSA_AGENT_CONFIG"):
        monkeypatch.delenv(k, raising=False)
    cfg = load_config(ROOT / "deploy" / "agent.toml")
    assert cfg.settings.router_url.startswith("http://") and len(cfg.instances) >= 2
    assert {i.role for i in cfg.instances} == {"prefill", "decode"}
    for inst in cfg.instances:
        assert inst.launch == "sglang" and not inst.url.startswith("http://127.")
        assert inst.switch_modes()[0] == "in_place"
