"""verl's agent loops and agent-loop worker, publishing each trajectory's lifecycle.

* :class:`ProrsaAgentLoopWorker` (verl's ``AgentLoopWorker``): every agent-loop run is a
  trajectory (:class:`~.session.LiveTrajectory`, current while the run and its
  post-processing are awaited). verl's built-in ``tool_agent`` and ``single_turn_agent`` run
  as :class:`ProrsaToolAgentLoop` and :class:`ProrsaSingleTurnAgentLoop`. The reward the
  worker computes (verl's streaming reward loop) is ``reward.started`` ... ``reward.finished``;
  a run that raises is ``trajectory.dropped``. Its LLM client must be a
  :class:`~.server.ProrsaLLMServerClient`, which publishes each model request's events.
* :class:`ProrsaAgentLoopMixin`: ``trajectory.dispatched`` when the agent loop has built its
  first prompt (``ct_build_initial_tokens``, with the prompt's token count); put it first in
  a custom agent loop's bases, and use :func:`~.session.current_trajectory` for its sandbox
  (``async with current_trajectory().sandbox("cold"):``) or tools.
* :class:`ProrsaToolAgentLoop`: each tool round (``_handle_processing_tools_state``, the
  parallel calls of one answer) is ``tool.started`` ... ``tool.finished`` with the tokens
  the results added to the context.
* :class:`ProrsaAgentLoopManager`: verl's ``AgentLoopManager`` with these workers and the
  router's client, for ``actor_rollout_ref.rollout.agent.agent_loop_manager_class`` (verl's
  trainer with ``trainer.use_v1=False``; :mod:`.agent_loop_tq` has the V1 one). It publishes
  ``run.started`` from the config.
"""

from __future__ import annotations

from typing import Any

import ray
from verl.experimental.agent_loop.agent_loop import AgentLoopManager, AgentLoopWorker, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop

from .server import ProrsaLLMServerClient
from .session import LiveTrajectory, Session, current_trajectory, trajectory_id
from .trainer import publish_run_started

PRORSA_LOOPS = {"tool_agent": "prorsa_tool_agent", "single_turn_agent": "prorsa_single_turn_agent"}
"""verl's built-in agent loops and the Prorsa subclasses a Prorsa worker runs instead."""


class ProrsaAgentLoopMixin:
    """``trajectory.dispatched`` once the first prompt is built (see the module docstring)."""

    async def ct_build_initial_tokens(self, messages: list[dict], *args: Any, **kwargs: Any) -> list[int]:
        ids = await super().ct_build_initial_tokens(messages, *args, **kwargs)  # type: ignore[misc]
        live = current_trajectory()
        if live is not None:
            await live.dispatch(len(ids))
        return ids


def _tool_name(calls: list[Any]) -> str | None:
    """The tools of one round, for ``tool.started``'s ``tool`` (printable, at most 128 characters)."""
    names = sorted({str(getattr(c, "name", "")) for c in calls} - {""})
    name = ",".join(names)[:128]
    return name if name and name.isprintable() else None


@register("prorsa_tool_agent")
class ProrsaToolAgentLoop(ProrsaAgentLoopMixin, ToolAgentLoop):
    """verl's ``ToolAgentLoop`` with dispatch and tool events (see the module docstring)."""

    async def _handle_processing_tools_state(self, agent_data: Any) -> Any:
        live = current_trajectory()
        if live is None or live.handle is None:
            return await super()._handle_processing_tools_state(agent_data)
        calls = list(agent_data.tool_calls[: self.max_parallel_calls])
        before = len(agent_data.prompt_ids)
        async with live.tool(_tool_name(calls), len(calls) or None) as span:
            state = await super()._handle_processing_tools_state(agent_data)
            span.result_tokens = max(0, len(agent_data.prompt_ids) - before)
        return state


@register("prorsa_single_turn_agent")
class ProrsaSingleTurnAgentLoop(ProrsaAgentLoopMixin, SingleTurnAgentLoop):
    """verl's ``SingleTurnAgentLoop`` with ``trajectory.dispatched``."""


def prorsa_session(client: Any) -> Session:
    if not isinstance(client, ProrsaLLMServerClient):
        raise TypeError(f"a Prorsa agent-loop worker sends through ProrsaLLMServerClient, got {type(client).__name__} "
                        "(use ProrsaAgentLoopManager, or pass ProrsaLLMServerClient(config) as llm_client)")
    return client.session


class ProrsaWorkerMixin:
    """What a Prorsa agent-loop worker adds to verl's (see the module docstring)."""

    llm_client: Any
    reward_loop_worker_handles: Any

    async def generate_sequences(self, batch: Any) -> Any:
        try:
            return await super().generate_sequences(batch)  # type: ignore[misc]
        finally:  # the batch's events are stored before the trainer sees the batch
            await prorsa_session(self.llm_client).flush()

    async def _run_agent_loop(self, sampling_params: dict[str, Any], trajectory: dict[str, Any], *,
                              agent_name: str, trace: bool = True, **kwargs: Any) -> Any:
        session = prorsa_session(self.llm_client)
        n = kwargs.get("session_id", trajectory.get("rollout_n", 0))
        tid = trajectory_id(trajectory.get("step"), trajectory.get("sample_index"), n, bool(trajectory.get("validate")))
        uid = kwargs.get("uid")
        live = LiveTrajectory(session, tid, group=str(uid) if uid is not None else None)
        token = live.enter()
        try:
            out = await super()._run_agent_loop(  # type: ignore[misc]
                sampling_params, trajectory, agent_name=PRORSA_LOOPS.get(agent_name, agent_name), trace=trace,
                **kwargs)
            await live.finish(getattr(out, "reward_score", None))
            return out
        except BaseException as exc:
            await live.fail(exc)
            raise
        finally:
            live.leave(token)

    async def _compute_score(self, outputs: list[Any], kwargs: dict) -> None:
        live = current_trajectory()
        final = outputs[-1]
        computes = final.reward_score is None and self.reward_loop_worker_handles is not None
        if live is None or not live.rewardable or not computes:
            await super()._compute_score(outputs, kwargs)  # type: ignore[misc]
            if live is not None and final.reward_score is not None:
                await live.finish(final.reward_score)  # the agent loop scored it: reward.finished
            return
        async with live.reward() as span:
            await super()._compute_score(outputs, kwargs)  # type: ignore[misc]
            span.reward = final.reward_score


class ProrsaAgentLoopWorker(ProrsaWorkerMixin, AgentLoopWorker):
    """verl's ``AgentLoopWorker`` publishing each trajectory (see the module docstring)."""


def prorsa_client(config: Any, llm_client: Any) -> ProrsaLLMServerClient:
    """``llm_client`` if it is Prorsa's, else a :class:`ProrsaLLMServerClient` for ``config``
    (the router's URL from ``$PRORSA_ROUTER_URL``)."""
    if isinstance(llm_client, ProrsaLLMServerClient):
        return llm_client
    client = ProrsaLLMServerClient(config)
    if client.session.router_url is None:
        client.session.client()  # raises: the router's URL is missing
    return client


class ProrsaAgentLoopManager(AgentLoopManager):
    """verl's ``AgentLoopManager`` with :class:`ProrsaAgentLoopWorker` and the router's client."""

    def __init__(self, config: Any, llm_client: Any = None, teacher_client: Any = None,
                 reward_loop_worker_handles: Any = None):
        self.agent_loop_workers_class = ray.remote(ProrsaAgentLoopWorker)
        client = prorsa_client(config, llm_client)
        super().__init__(config, client, teacher_client, reward_loop_worker_handles)
        publish_run_started(config, client.session)


__all__ = [
    "PRORSA_LOOPS", "ProrsaAgentLoopManager", "ProrsaAgentLoopMixin", "ProrsaAgentLoopWorker",
    "ProrsaSingleTurnAgentLoop", "ProrsaToolAgentLoop", "ProrsaWorkerMixin", "prorsa_client",
]
