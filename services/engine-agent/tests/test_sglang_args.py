"""The launch command against SGLang 0.5.23's argument definitions.

Two checks. (1) Static, runs everywhere: the sglang==0.5.23 wheel is fetched with
``pip download --no-deps`` (cached under ~/.cache/prorsa/sglang or PRORSA_SGLANG_CACHE;
PRORSA_SGLANG_WHEEL points at a wheel file instead), its flag declarations are read with
``ast`` and every flag and value the agent builds is checked against them (details at the
static tests below). If the source cannot be obtained the static tests FAIL under CI
(``CI`` set) and skip locally with the reason. (2) The full parser, below, when SGLang
itself imports:

SGLang 0.5.23's ``sglang/__init__.py`` imports torch, and its parser module imports its
platform layer, which imports torch too: the parser cannot be loaded without torch. CI has
no torch, so this test skips there and says why. Point ``PRORSA_SGLANG_PYTHON`` at an
interpreter that has ``sglang==0.5.23`` (and torch, CPU build is enough) to run it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from prorsa_engine_agent.config import InstanceConfig
from prorsa_engine_agent.launch import sglang_args

CHECK = r"""
import json, sys
from sglang.srt.server_args import ServerArgs
import argparse
p = argparse.ArgumentParser()
ServerArgs.add_cli_args(p)
ns = p.parse_args(json.loads(sys.argv[1]))
print(json.dumps({k: getattr(ns, k, None) for k in ("disaggregation_mode", "disaggregation_bootstrap_port",
      "disaggregation_transfer_backend", "enable_pd_role_switch", "tp_size", "ep_size", "port", "enable_metrics")}))
"""


def _python() -> str:
    py = os.environ.get("PRORSA_SGLANG_PYTHON", sys.executable)
    probe = subprocess.run([py, "-c", "import sglang.srt.server_args"], capture_output=True, text=True)
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["?"])[-1]
        pytest.skip(f"SGLang's argument parser cannot be imported with {py} ({last}); sglang 0.5.23 "
                    "needs torch even for its parser. Set PRORSA_SGLANG_PYTHON to an interpreter with "
                    "sglang==0.5.23 and torch to run this check.")
    return py


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("kw", [dict(tp=2), dict(ep=4, tp=4, transfer_backend="nixl")])
def test_launch_args_parse_with_sglang(role, kw):
    py = _python()
    inst = InstanceConfig(engine="e", port=30001, model="Qwen/Qwen3-8B", bootstrap_port=9001, **kw)
    args = sglang_args(inst, role)
    out = subprocess.run([py, "-c", CHECK, json.dumps(args)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    ns = json.loads(out.stdout.strip().splitlines()[-1])
    assert ns["disaggregation_mode"] == role
    assert ns["disaggregation_bootstrap_port"] == 9001
    assert ns["port"] == 30001 and ns["enable_metrics"] is True
    assert ns["enable_pd_role_switch"] is (not inst.in_place_blockers())


# -- static check: runs everywhere (CI included) ------------------------------------------------
# What is checked: every flag the agent builds exists in SGLang 0.5.23's own declarations
# (read from the downloaded wheel's source with `ast`, see prorsa_engine_agent.sglang_flags),
# store-true flags carry no value, valued flags have one, int/float values convert and
# values are within declared choices (--disaggregation-mode, --disaggregation-transfer-backend,
# --moe-a2a-backend ...), and --model-path is present. What is NOT checked: values of flags
# with custom type parsers or actions, run-time computed choices, and SGLang's post-parse
# validation (resolve_once); the full-parser test above covers those where SGLang imports.

@pytest.fixture(scope="module")
def sglang_flags():
    from prorsa_engine_agent.sglang_flags import SglangSourceError, fetch_sglang_source, read_flags

    try:
        root = fetch_sglang_source()
    except SglangSourceError as exc:
        reason = f"cannot obtain sglang==0.5.23's source for the static flag check: {exc}"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return read_flags(root)


def test_static_reader_finds_sglang_declarations(sglang_flags):
    # If SGLang's layout changed and the reader found little, the check below would be vacuous.
    assert len({s.dest for s in sglang_flags.values()}) > 400
    assert sglang_flags["--disaggregation-mode"].choices == ("null", "prefill", "decode")
    assert "mori" in sglang_flags["--disaggregation-transfer-backend"].choices
    assert sglang_flags["--tp-size"].value_type == "int"
    assert sglang_flags["--model"] is sglang_flags["--model-path"]
    assert sglang_flags["--enable-pd-role-switch"].kind == "bool"


def test_static_checker_rejects_what_argparse_would(sglang_flags):
    from prorsa_engine_agent.sglang_flags import check_args

    bad = ["--tp-size", "two", "--disaggregation-mode", "mixed", "--no-such-flag",
           "--enable-metrics=1", "--port"]
    problems = check_args(bad, sglang_flags)
    assert any("'two' is not a valid int" in p for p in problems)
    assert any("'mixed' is not one of" in p for p in problems)
    assert "unknown flag --no-such-flag" in problems
    assert "--enable-metrics takes no value" in problems
    assert "--port expects a value" in problems
    assert "required flag --model-path is missing" in problems


INSTANCES = [
    dict(),
    dict(tp=2),
    dict(tp=4, dp=2, attn_dp=2, transfer_backend="mori", decode_cuda_graph_memory_gb=1.5),
    dict(ep=4, tp=4, transfer_backend="nixl"),
    dict(ep=16, tp=16, attn_dp=16, moe_a2a_backend="deepep", pp=2),
    dict(speculative_algorithm="EAGLE", allow_in_place=False),
    dict(extra_args=["--mem-fraction-static", "0.85", "--chunked-prefill-size", "4096",
                     "--context-length", "131072", "--trust-remote-code"]),
    dict(dcp=2, attn_dp=2, tp=2, dp_attention_local_control_broadcast=True, weight_version="7",
         host="0.0.0.0", extra_args=["--disaggregation-ib-device", "mlx5_0"]),
]


@pytest.mark.parametrize("role", ["prefill", "decode"])
@pytest.mark.parametrize("kw", INSTANCES, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()) or "default")
def test_launch_args_match_sglang_declarations(sglang_flags, role, kw):
    from prorsa_engine_agent.sglang_flags import check_args

    inst = InstanceConfig(engine="e", port=30001, model="Qwen/Qwen3-8B", bootstrap_port=9001, **kw)
    args = sglang_args(inst, role)
    assert check_args(args, sglang_flags) == []
    assert ("--enable-pd-role-switch" in args) is (not inst.in_place_blockers())
