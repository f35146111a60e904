"""The launch options of an emulated SGLang instance, named like SGLang's flags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .profiles import DEFAULT_MODEL

Mode = Literal["null", "prefill", "decode"]
SWITCH_BACKENDS = ("mooncake", "mori")
"""Transfer backends SGLang 0.5.23 can switch roles with at run time."""


@dataclass
class EngineOptions:
    """Launch options, named like SGLang's flags."""

    model_path: str = "emulated/model"
    weight_version: str = "default"
    """--weight-version; moved by /update_weights_from_disk (weights.py)."""
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_mode: Mode = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    enable_pd_role_switch: bool = False
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    pp_size: int = 1
    max_total_num_tokens: int | None = None
    """KV tokens of the whole engine; default: the profile's capacity."""
    max_running_requests: int | None = None
    """--max-running-requests of the engine (split over its attention-DP ranks); default:
    SGLang's own (``engine.max_running_per_rank``)."""
    chunked_prefill_size: int | None = None
    """Default: the profile's chunk size."""
    # emulation knobs (not SGLang flags)
    emulated_model: str = DEFAULT_MODEL
    emulated_dp_routing: str = "load"
    """``load``: the attention-DP rank is the least loaded (SGLang's data-parallel controller
    picks by load, not by prefix); ``prefix``: the rank holding the longest cached prefix
    wins when it is no more loaded once the cached tokens are counted off (a DP-aware,
    cache-aware router). As the simulator's ``SimConfig.dp_routing``."""
    speed: float = 1.0
    startup_seconds: float = 0.0
    switch_seconds: float | None = None
    """In-place switch time; default: the profile's ``in_place_switch_s``."""
    decode_cuda_graph_memory_gb: float = 1.5
    fail_switch: bool = False
    serve_bootstrap: bool = False
    """Listen on ``disaggregation_bootstrap_port`` while in the prefill role (pd.py); the
    server process sets it, an engine built inside a test process does not."""
