"""An AReaL rollout workflow that publishes its lifecycle to Prorsa.

AReaL (https://github.com/inclusionAI/AReaL) runs ``await workflow.arun_episode(engine, data)``
for every episode; ``engine`` is its InferenceEngine (``await engine.agenerate(req)`` ->
``ModelResponse`` with ``output_tokens``, ``stop_reason``, ``latency``, ``ttft``). AReaL
is not imported here: pass ``make_request=areal.api.ModelRequest`` and your
``GenerationHyperparameters`` as ``gconfig``, and use it where a ``RolloutWorkflow`` goes::

    workflow = ProrsaToolWorkflow(emitter, reward_fn=my_reward, gconfig=gconfig,
                                  make_request=ModelRequest, tool_parser=my_parser, tool=my_tool)

AReaL's engine makes the HTTP calls, so the model requests are wrapped with
``traj.request(...)`` (the generic hook for any client); the tool and the reward with
``traj.tool(...)`` / ``traj.reward()``. The Prorsa lines are the ``traj`` ones.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from prorsa_sdk import RolloutClient

ToolCall = Any


class ProrsaToolWorkflow:
    """A multi-turn tool-using agent: generate; if the output calls a tool, run it and
    append its result; else score the answer. Shaped as AReaL's ``RolloutWorkflow``."""

    def __init__(self, emitter: Any, *, reward_fn: Callable[[list[int], dict], Awaitable[float]],
                 gconfig: Any, make_request: Callable[..., Any],
                 tool_parser: Callable[[Any, int], ToolCall | None], tool: Callable[[ToolCall], Awaitable[list[int]]],
                 max_turns: int = 4):
        self.llm = RolloutClient(emitter)  # no base_url: AReaL's engine sends the requests
        self.reward_fn, self.gconfig, self.make_request = reward_fn, gconfig, make_request
        self.tool_parser, self.tool, self.max_turns = tool_parser, tool, max_turns

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, Any] | None:
        prompt = list(data["input_ids"])
        seq, loss_mask = list(prompt), [0] * len(prompt)
        version = engine.get_version() if hasattr(engine, "get_version") else None
        traj_id = str(data["id"]) if data.get("id") is not None else uuid.uuid4().hex
        async with self.llm.trajectory(traj_id, len(prompt),
                                       group=data.get("group"), policy_version=version) as traj:
            for turn in range(self.max_turns):
                async with traj.request(len(seq)) as span:
                    resp = await engine.agenerate(self.make_request(rid=uuid.uuid4().hex, input_ids=list(seq),
                                                                    gconfig=self.gconfig))
                    call = self.tool_parser(resp, turn) if turn < self.max_turns - 1 else None
                    # AReaL's non-streaming engines report ttft = latency: a real ttft is smaller.
                    ttft = resp.ttft if math.isfinite(resp.ttft) and resp.ttft < resp.latency else None
                    await span.done(resp.output_len, resp.stop_reason, ttft=ttft, tool_call=call is not None)
                seq += resp.output_tokens
                loss_mask += [1] * resp.output_len
                if call is None:
                    break
                async with traj.tool(getattr(call, "name", None)) as t:
                    obs = await self.tool(call)
                    t.result_tokens, t.ok = len(obs), True
                seq += obs
                loss_mask += [0] * len(obs)
            async with traj.reward() as r:
                r.reward = float(await self.reward_fn(seq, data))
                r.admitted = r.reward > 0  # AReaL drops (returns None for) rejected episodes
        if not r.admitted:
            return None
        return {"input_ids": [seq], "loss_mask": [loss_mask], "rewards": [r.reward]}
