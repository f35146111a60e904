"""An emulated SGLang server and router, served over real HTTP, for testing the engine
agent and the whole stack without GPUs. See docs/engine-agent.md."""

from .cluster import EmulatedCluster, EmulatedProcess, engine_command, router_command
from .engine import EmulatedEngine, EngineOptions
from .timing import Timing, default_timing

__all__ = [
    "EmulatedCluster",
    "EmulatedEngine",
    "EmulatedProcess",
    "EngineOptions",
    "Timing",
    "default_timing",
    "engine_command",
    "router_command",
]
