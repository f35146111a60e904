"""SGLang's own refusals of an in-place role flip, read from the engine (pure).

The agent checks these before it touches an engine (the PRECHECK phase), so a switch SGLang
would refuse is refused with the engine still registered and serving. Sources (SGLang
0.5.23): ``arg_groups/pd_disaggregation_hook.py`` (what ``--enable-pd-role-switch`` is
refused with at start), ``disaggregation/role_switch.py`` (what ``/pd_role_switch`` needs:
the flag, PD mode, mooncake or mori, and ``decode_cuda_graph_memory_gb`` when a flip to
decode has to capture decode CUDA graphs). The launch-side rules are
``InstanceConfig.in_place_blockers``; these read the running engine's ``/server_info``
(its startup arguments), which also covers engines the agent adopted but did not launch.
"""

from __future__ import annotations

SWITCH_BACKENDS = ("mooncake", "mori")
"""Transfer backends SGLang 0.5.23 can switch roles with at run time."""


def _n(info: dict, key: str) -> int:
    v = info.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else 1


def server_blockers(info: dict) -> list[str]:
    """Why the engine whose ``/server_info`` is ``info`` cannot flip in place (empty: it can)."""
    out = []
    if info.get("enable_pd_role_switch") is False:
        out.append("started without --enable-pd-role-switch")
    mode = info.get("disaggregation_mode")
    if mode not in (None, "prefill", "decode"):
        out.append(f"not in PD disaggregation mode (disaggregation_mode={mode!r})")
    backend = info.get("disaggregation_transfer_backend")
    if backend is not None and backend not in SWITCH_BACKENDS:
        out.append(f"transfer backend {backend!r} (needs mooncake or mori)")
    for key, what in (("ep_size", "expert parallelism"), ("pp_size", "pipeline parallelism"),
                      ("dcp_size", "decode context parallelism")):
        if _n(info, key) > 1:
            out.append(f"{what} ({key}={_n(info, key)})")
    attn_dp = max(_n(info, "attn_dp_size"), _n(info, "dp_size") if info.get("enable_dp_attention") else 1)
    if attn_dp > 1 and info.get("enable_dp_attention_local_control_broadcast"):
        out.append("DP attention local control broadcast")
    a2a = info.get("moe_a2a_backend")
    if a2a not in (None, "none"):
        out.append(f"MoE all-to-all ({a2a})")
    if info.get("speculative_algorithm"):
        out.append(f"speculative decoding ({info['speculative_algorithm']})")
    return out


def decode_graphs_captured(info: dict | None) -> bool:
    """Whether the engine already holds decode CUDA graphs (then a flip to decode needs no
    ``decode_cuda_graph_memory_gb``): ``internal_states[].decode_cuda_graph_bs`` non-empty."""
    states = (info or {}).get("internal_states") or []
    return bool(states) and all(isinstance(s, dict) and s.get("decode_cuda_graph_bs") for s in states)


def graph_memory_refusal(to_role: str, figure: float | None, info: dict | None) -> str:
    """Why a flip to ``to_role`` would be refused for want of the decode graph memory ("" if not)."""
    if to_role != "decode" or figure is not None or decode_graphs_captured(info):
        return ""
    return ("a flip to decode needs decode_cuda_graph_memory_gb (SGLang refuses it without one "
            "before capturing decode CUDA graphs) and none is known: set "
            "decode_cuda_graph_memory_gb on the instance, or run a decode engine on this server "
            "to read it from")
