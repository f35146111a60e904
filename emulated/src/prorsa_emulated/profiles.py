"""Which cost model an emulated engine runs: the simulator's profiles
(``prorsa_emulated.costmodel``) plus a small single-GPU one, the default, that keeps tests fast.

``--emulated-model NAME`` selects it (not ``--model``: that is SGLang's alias of
``--model-path``, so the agent's launch command may already carry it).
"""

from __future__ import annotations

from .costmodel import PROFILES, ModelProfile, get_profile

# A Qwen3-8B-class dense model on one H200-class GPU, BF16. [HF] Qwen3-8B config: 36 layers,
# 8 KV heads x 128 dims, 32 query heads, ~8.2B parameters. Constants that are not derived
# from the config are CHOICEs in the spirit of the simulator's profiles.
SMALL = ModelProfile(
    name="qwen3-8b",
    gpus_per_engine=1,
    attn_dp=1,
    attn_tp=1,
    ep=1,
    chunk_size=8192,  # CHOICE: SGLang's default chunked prefill size for a large GPU
    kv_bytes_per_token=2 * 36 * 8 * 128 * 2,  # [HF] K+V, 36 layers, 8 KV heads, BF16
    weight_gb_per_gpu=16.4,  # [HF] 8.2B x 2 bytes
    active_params=8.2e9,
    prefill_fixed_s=0.004,  # CHOICE: launch overhead of 36 layers, no EP all-to-all
    attn_flops_per_pair=4 * 32 * 128 * 36,  # [HF] QK^T + PV, 32 heads x 128, 36 layers
    decode_comm_s=0.0,  # one GPU: no collective
    decode_s_per_seq=0.00003,  # CHOICE
    kv_read_bytes_per_token=2 * 36 * 8 * 128 * 2,
    in_place_switch_s=2.0,  # CHOICE: small KV pool and CUDA graphs
    restart_switch_s=60.0,  # CHOICE: 16 GB of weights
    notes="default of the emulated server: one GPU, fast enough for tests",
)

DEFAULT_MODEL = SMALL.name
EMULATED_PROFILES: dict[str, ModelProfile] = {SMALL.name: SMALL, **PROFILES}


def emulated_profile(name: str) -> ModelProfile:
    """The named profile; ``ValueError`` listing the valid names otherwise."""
    if name in EMULATED_PROFILES:
        return EMULATED_PROFILES[name]
    try:
        return get_profile(name)
    except ValueError:
        raise ValueError(f"unknown emulated model {name!r}; choose one of: "
                         f"{', '.join(sorted(EMULATED_PROFILES))}") from None


def prefill_seconds(profile: ModelProfile, new_tokens: int, context_tokens: int = 0) -> float:
    """One request's prefill alone on an idle rank: its chunks one after another."""
    total, done = 0.0, 0
    while done < new_tokens:
        n = min(profile.chunk_size, new_tokens - done)
        total += profile.prefill_time(n, context_tokens + done)
        done += n
    return total
