"""The V1 trainer's agent-loop manager (verl's default, ``trainer.use_v1=True``: outputs go
through TransferQueue) with Prorsa's worker and the router's client:
``actor_rollout_ref.rollout.agent.agent_loop_manager_class=prorsa_sdk.integrations.verl.ProrsaAgentLoopManagerTQ``."""

from __future__ import annotations

from typing import Any

import ray
from verl.trainer.ppo.v1.agent_loop_tq import AgentLoopManagerTQ, AgentLoopWorkerTQ

from .agent_loop import ProrsaWorkerMixin, prorsa_client
from .trainer import publish_run_started


class ProrsaAgentLoopWorkerTQ(ProrsaWorkerMixin, getattr(AgentLoopWorkerTQ, "__ray_actor_class__", AgentLoopWorkerTQ)):
    """verl's TransferQueue agent-loop worker publishing each trajectory."""


class ProrsaAgentLoopManagerTQ(AgentLoopManagerTQ):
    """verl's ``AgentLoopManagerTQ`` with :class:`ProrsaAgentLoopWorkerTQ` and the router's client."""

    def __init__(self, config: Any, llm_client: Any = None, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None):
        client = prorsa_client(config, llm_client)
        super().__init__(config, client, teacher_client, reward_loop_worker_handles)
        self.agent_loop_workers_class = ray.remote(ProrsaAgentLoopWorkerTQ)
        publish_run_started(config, client.session)


__all__ = ["ProrsaAgentLoopManagerTQ", "ProrsaAgentLoopWorkerTQ"]
