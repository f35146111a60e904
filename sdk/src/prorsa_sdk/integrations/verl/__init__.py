"""Prorsa in verl (https://github.com/volcengine/verl, 0.9.1): every trajectory's lifecycle
from verl's agent loops, and verl's model requests through the SGLang router in PD mode.

The lines a verl user adds (docs/integrations.md)::

    export PRORSA_ROUTER_URL=http://router:30000 PRORSA_NATS_URL=nats://rollout:PASSWORD@bus:4222 PRORSA_RUN=grpo-7
    python -m verl.trainer.main_ppo ... \\
        +actor_rollout_ref.rollout.agent.agent_loop_manager_class=prorsa_sdk.integrations.verl.ProrsaAgentLoopManagerTQ
    # where your launcher holds the trainer, after trainer.init():
    from prorsa_sdk.integrations.verl import watch_trainer
    watch_trainer(trainer)                  # run.started, policy.updated after each weight sync

This module imports without verl: the names below load verl when first used.
"""

from __future__ import annotations

import importlib
from typing import Any

from .session import LiveTrajectory, Session, current_trajectory
from .trainer import publish_run_started, run_started_fields, watch_trainer

_LAZY = {
    "ProrsaLLMServerClient": "server",
    "sglang_body": "server",
    "ProrsaAgentLoopMixin": "agent_loop",
    "ProrsaToolAgentLoop": "agent_loop",
    "ProrsaSingleTurnAgentLoop": "agent_loop",
    "ProrsaWorkerMixin": "agent_loop",
    "ProrsaAgentLoopWorker": "agent_loop",
    "ProrsaAgentLoopManager": "agent_loop",
    "ProrsaAgentLoopWorkerTQ": "agent_loop_tq",
    "ProrsaAgentLoopManagerTQ": "agent_loop_tq",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        mod = importlib.import_module(f"{__name__}.{module}")
    except ImportError as exc:
        raise ImportError(f"prorsa_sdk.integrations.verl.{name} needs verl (pip install verl==0.9.1): {exc}") from exc
    return getattr(mod, name)


__all__ = ["LiveTrajectory", "Session", "current_trajectory", "publish_run_started", "run_started_fields",
           "watch_trainer", *_LAZY]
