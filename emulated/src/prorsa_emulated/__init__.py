"""An emulated SGLang server and router, served over real HTTP, for testing the engine
agent and the whole stack without GPUs. See docs/engine-agent.md."""

from .cluster import (ROUTER_KINDS, EmulatedCluster, EmulatedProcess, engine_command, router_command,
                      sglang_router_command)
from .engine import EmulatedEngine
from .options import EngineOptions
from .profiles import DEFAULT_MODEL, EMULATED_PROFILES, emulated_profile
from .timing import ProfileTiming, Timing, default_timing

__all__ = [
    "EmulatedCluster",
    "EmulatedEngine",
    "EmulatedProcess",
    "EngineOptions",
    "DEFAULT_MODEL",
    "EMULATED_PROFILES",
    "ProfileTiming",
    "Timing",
    "default_timing",
    "emulated_profile",
    "engine_command",
    "router_command",
    "sglang_router_command",
    "ROUTER_KINDS",
]
