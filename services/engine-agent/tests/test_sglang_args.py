"""The launch command against SGLang's real argument parser, when SGLang is importable.

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
