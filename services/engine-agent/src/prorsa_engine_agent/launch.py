"""The launch command of an SGLang instance (pure: no I/O).

Flags verified against SGLang 0.5.23 (``sglang/srt/arg_groups/fields/*.py``): a flag is
its field name with dashes. ``--enable-pd-role-switch`` is added only when the instance
can switch in place (0.5.23 refuses it at startup with EP > 1, MoE all-to-all, PP > 1,
DCP > 1, DP-attention local control broadcast or speculative decoding, and the switch
needs the mooncake or mori backend: ``InstanceConfig.in_place_blockers``).
"""

from __future__ import annotations

import sys

from .config import InstanceConfig
from .weights import Weights

SGLANG_MODULE = "sglang.launch_server"
EMULATED_MODULE = "prorsa_emulated"


def sglang_args(inst: InstanceConfig, role: str, weights: Weights | None = None) -> list[str]:
    """The arguments after the module: the same for real and emulated SGLang.

    ``weights``: the model path and weight version to load (default: the instance's
    ``model`` and ``weight_version``); a relaunch passes the engine's current weights.
    """
    if role not in ("prefill", "decode"):
        raise ValueError(f"role must be prefill or decode, got {role!r}")
    w = weights or Weights(inst.model, inst.weight_version)
    args = [
        "--model-path", w.model_path,
        "--host", inst.bind_host,
        "--port", str(inst.port),
        "--disaggregation-mode", role,
        "--disaggregation-transfer-backend", inst.transfer_backend,
        # Each instance needs its own bootstrap port; only the prefill side listens on it,
        # but keeping it fixed across roles lets a switched instance keep its registration shape.
        "--disaggregation-bootstrap-port", str(inst.bootstrap_port),
        "--tp-size", str(inst.tp),
        "--enable-metrics",
    ]
    if w.weight_version != "default":
        args += ["--weight-version", w.weight_version]
    for flag, value, default in (("--dp-size", inst.dp, 1), ("--attn-dp-size", inst.attn_dp, 1),
                                 ("--ep-size", inst.ep, 1), ("--pp-size", inst.pp, 1),
                                 ("--dcp-size", inst.dcp, 1)):
        if value != default:
            args += [flag, str(value)]
    if inst.moe_a2a_backend != "none":
        args += ["--moe-a2a-backend", inst.moe_a2a_backend]
    if inst.speculative_algorithm:
        args += ["--speculative-algorithm", inst.speculative_algorithm]
    if inst.dp_attention_local_control_broadcast:
        args.append("--enable-dp-attention-local-control-broadcast")
    if not inst.in_place_blockers():
        args.append("--enable-pd-role-switch")
    return args + list(inst.extra_args)


def launch_command(inst: InstanceConfig, role: str, python: str | None = None,
                   weights: Weights | None = None) -> list[str]:
    """``python -m sglang.launch_server ...`` (or the emulated server for ``launch="emulated"``)."""
    if inst.launch == "external":
        raise ValueError(f"instance {inst.engine} is external: the agent does not launch it")
    module = EMULATED_MODULE if inst.launch == "emulated" else SGLANG_MODULE
    head = [python or sys.executable, "-m", module] + (["engine"] if inst.launch == "emulated" else [])
    return head + sglang_args(inst, role, weights)


def launch_env(inst: InstanceConfig) -> dict[str, str]:
    """Extra environment of the process (its GPUs)."""
    return {"CUDA_VISIBLE_DEVICES": inst.gpu_ids} if inst.gpu_ids else {}
