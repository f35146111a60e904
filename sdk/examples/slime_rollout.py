"""A slime multi-turn agent that publishes its lifecycle to Prorsa.

Plug it into slime (https://github.com/THUDM/slime) with::

    --custom-generate-function-path slime_rollout.generate     # one sample's agent loop
    --custom-rm-path slime_rollout.reward_func                 # its reward (ends the trajectory)
    # or, replacing the whole rollout:
    --rollout-function-path slime_rollout.generate_rollout

Signatures as slime calls them (slime is not imported here: ``args`` is slime's argparse
namespace, ``sample`` a ``slime.utils.types.Sample``, ``data_source`` slime's data source):

* ``async def generate(args, sample, sampling_params) -> Sample``
* ``async def reward_func(args, sample, **kwargs) -> float``
* ``def generate_rollout(args, rollout_id, data_source, evaluation=False) -> list[list[Sample]]``

The agent is search-r1's shape: the model answers in ``<answer>``, calls the search tool in
``<search>``; any other output gets the environment's correction and another turn.
The Prorsa lines are the ``llm.trajectory`` / ``traj.*`` ones; the rest is the agent.
Events go to ``PRORSA_NATS_URL`` under the run ``PRORSA_RUN`` (or call :func:`setup`).
"""

from __future__ import annotations

import asyncio
import os
import re
from typing import Any

from prorsa_sdk import EngineAborted, RolloutClient, SyncEmitter

_EMITTER: Any = None
_CLIENTS: dict[int, RolloutClient] = {}  # one per event loop (httpx connections belong to a loop)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)


def setup(emitter: Any) -> None:
    """Use this emitter (a SyncEmitter: slime calls us from several threads and loops)."""
    global _EMITTER
    _EMITTER = emitter


def _client(args: Any) -> RolloutClient:
    global _EMITTER
    if _EMITTER is None:
        _EMITTER = SyncEmitter(run=os.environ.get("PRORSA_RUN", "slime"))
        _EMITTER.run_started("sync", batch_size=args.rollout_batch_size, group_size=args.n_samples_per_prompt)
    loop = id(asyncio.get_running_loop())
    if loop not in _CLIENTS:
        _CLIENTS[loop] = RolloutClient(_EMITTER, f"http://{args.sglang_router_ip}:{args.sglang_router_port}")
    return _CLIENTS[loop]


def traj_id(sample: Any) -> str:
    return f"g{sample.group_index}-s{sample.index}"


async def search(query: str) -> list[int]:
    """The tool: stands in for a retrieval server; returns the observation's token ids."""
    await asyncio.sleep(0)
    return [101, 102, 103] + [len(query) % 50]


async def generate(args: Any, sample: Any, sampling_params: dict) -> Any:
    """slime's custom generate function: one sample's multi-turn agent loop."""
    llm = _client(args)
    prompt = list(sample.tokens)
    max_turns = getattr(args, "max_turns", 3)
    async with llm.trajectory(traj_id(sample), len(prompt), group=str(sample.group_index)) as traj:
        tokens, loss_mask = list(prompt), []
        for turn in range(max_turns):
            try:
                out = await traj.generate(input_ids=tokens, sampling_params=sampling_params)
            except EngineAborted:  # a weight update aborted it: slime re-runs aborted samples
                await traj.drop("aborted")
                sample.status = sample.Status.ABORTED
                return sample
            tokens += out.output_ids
            loss_mask += [1] * len(out.output_ids)
            m = _ACTION.search(out.text)
            if (m and m.group(1) == "answer") or turn == max_turns - 1:
                break  # the answer (or the turn budget): the trajectory goes on to its reward
            async with traj.tool("search" if m else "feedback") as tool:
                obs = await search(m.group(2)) if m else [7, 8, 9]  # the environment's correction
                tool.result_tokens = len(obs)
            tokens += obs
            loss_mask += [0] * len(obs)
    sample.tokens = tokens
    sample.response_length = len(tokens) - len(prompt)
    sample.loss_mask = loss_mask
    sample.status = sample.Status.TRUNCATED if out.outcome.finish == "length" else sample.Status.COMPLETED
    return sample


async def reward_func(args: Any, sample: Any, **kwargs: Any) -> float:
    """slime's custom reward model: scores the sample, and ends its trajectory."""
    traj = _client(args).get(traj_id(sample))
    async with traj.reward() as r:
        r.reward = 1.0 if sample.response_length > 0 else 0.0
        r.admitted = sample.response_length > 0  # your admission rule (e.g. not a degenerate group)
    return r.reward


def generate_rollout(args: Any, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Any]]:
    """slime's rollout function: a batch of prompt groups, each sample generated and scored."""
    groups = data_source.get_samples(args.rollout_batch_size)

    async def one(sample: Any) -> Any:
        sample = await generate(args, sample, {"max_new_tokens": args.rollout_max_response_len})
        if sample.status != sample.Status.ABORTED:
            sample.reward = await reward_func(args, sample)
        return sample

    async def run() -> list[list[Any]]:
        try:
            done = await asyncio.gather(*(asyncio.gather(*(one(s) for s in group)) for group in groups))
            return [list(group) for group in done]
        finally:
            await _CLIENTS.pop(id(asyncio.get_running_loop())).aclose()

    return asyncio.run(run())
