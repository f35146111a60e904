"""The rollout driver: a simulated agentic-RL rollout loop against a live stack.

It plays the RL framework's part in `prorsa up --emulated-cluster`: trajectories from the
simulator's workloads send real ``/generate`` requests through the router (sglang-router, or
the emulated one), run
simulated sandboxes, tools and rewards, and publish every lifecycle event through the client
SDK (:class:`prorsa_sdk.Emitter`). Run it with ``python -m prorsa_sim.driver --help``.
"""

from .config import DriverConfig
from .loop import DriverResult, run_driver

__all__ = ["DriverConfig", "DriverResult", "run_driver"]
