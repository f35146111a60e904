"""verl's real agent-loop worker and ToolAgentLoop (verl 0.9.1, CPU torch), driven directly
(no Ray), send their model requests through sglang-router 0.3.2 in PD mode to emulated
SGLang engines, call a tool, and get their reward from verl's reward-loop worker; the
tracker stores exactly the events the adapter published, every trajectory is done, and
there is no anomaly. The trainer's hook publishes run.started and policy.updated."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest
from verl.experimental.reward_loop.reward_loop import RewardLoopWorker
from verl.protocol import DataProto

from prorsa_sdk import SyncEmitter
from prorsa_sdk.integrations import verl as prorsa_verl
from prorsa_sdk.integrations.verl import ProrsaAgentLoopWorker, ProrsaLLMServerClient, trainer

pytestmark = pytest.mark.timeout(240)


class Actor:
    """A Ray actor handle's call shape (``handle.method.remote(...)``) on a local object: verl's
    agent-loop worker calls its reward-loop workers so, and this test runs them in-process."""

    def __init__(self, obj: object):
        self.obj = obj

    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(remote=getattr(self.obj, name))


def prompts(batch: int, n: int) -> DataProto:
    """A rollout batch as verl's trainer hands it to a worker: each prompt repeated n times."""
    rows = [g for g in range(batch) for _ in range(n)]
    col = lambda values: np.array(values, dtype=object)  # noqa: E731
    return DataProto(non_tensor_batch={
        "raw_prompt": col([[{"role": "user", "content": "what is the answer " * (g + 1)}] for g in rows]),
        "agent_name": col(["tool_agent"] * len(rows)),
        "index": np.array(rows),
        "uid": col([f"prompt-{g}" for g in rows]),
        "data_source": col(["itest"] * len(rows)),
        "reward_model": col([{"ground_truth": str(0.25 * g)} for g in rows]),
        "extra_info": col([{} for _ in rows]),
        "tools_kwargs": col([{} for _ in rows]),
    }, meta_info={"global_steps": 1, "validate": False})


async def test_verl_tool_agent_loop_through_the_router_publishes_every_trajectory(
        nats_url, ns, tracker, emulated_pd, verl_case):
    c = verl_case
    em = c.Recorder(SyncEmitter("verl-itest", nats_url, namespace=ns))
    client = ProrsaLLMServerClient(c.config, router_url=emulated_pd, emitter=em, max_new_tokens=8)
    reward = Actor(RewardLoopWorker(c.config))
    worker = ProrsaAgentLoopWorker(c.config, client, reward_loop_worker_handles=[reward])
    out = await worker.generate_sequences(prompts(c.batch, c.n))
    await client.session.aclose()
    em.close()

    trajectories = c.batch * c.n
    assert len(out) == trajectories
    assert list(out.non_tensor_batch["__num_turns__"]) == [1 + c.turns + (c.turns - 1)] * trajectories
    events = await c.check(tracker, em.ids, trajectories=trajectories)
    by_traj: dict[str, list] = {}
    for e in events:
        by_traj.setdefault(e.traj, []).append(e)
    turn = ["request.queued", "prefill.finished", "decode.finished"]
    tool = ["tool.started", "tool.finished"]
    for traj, evs in by_traj.items():
        assert [e.type for e in evs] == (["trajectory.dispatched"] + (turn + tool) * (c.turns - 1) + turn
                                         + ["reward.started", "reward.finished"]), traj
        assert [e.finish for e in evs if e.type == "decode.finished"] == ["tool"] * (c.turns - 1) + ["length"]
        assert [e.output_tokens for e in evs if e.type == "decode.finished"] == [8] * c.turns
        assert [e.tool for e in evs if e.type == "tool.started"] == ["search"] * (c.turns - 1)
        queued = [e.prompt_tokens for e in evs if e.type == "request.queued"]
        results = [e.result_tokens for e in evs if e.type == "tool.finished"]
        # Each request's prompt is the last one, its 8 answer tokens and the tool result's tokens.
        assert queued[0] == evs[0].prompt_tokens
        assert all(queued[i + 1] == queued[i] + 8 + results[i] for i in range(c.turns - 1)), (queued, results)
        group = int(evs[0].group.split("-")[1])
        assert evs[-1].reward == 0.25 * group  # verl's reward loop ran the reward function
    # The samples of one prompt share its group; prompts of more words are longer.
    groups = {}
    for evs in by_traj.values():
        groups.setdefault(evs[0].group, set()).add(evs[0].prompt_tokens)
    assert sorted(groups) == [f"prompt-{g}" for g in range(c.batch)]
    assert all(len(v) == 1 for v in groups.values())
    assert [next(iter(groups[f"prompt-{g}"])) for g in range(c.batch)] == sorted(
        next(iter(v)) for v in groups.values())


async def test_the_trainer_hook_publishes_run_started_and_each_weight_sync(nats_url, ns, tracker, verl_case):
    c = verl_case
    trainer.reset()
    em = c.Recorder(SyncEmitter("verl-itest", nats_url, namespace=ns))
    session = prorsa_verl.Session("http://127.0.0.1:9", emitter=em)

    class WeightSync:  # the trainer's checkpoint manager: update_weights(global_steps) syncs the weights
        def __init__(self):
            self.synced: list[int] = []

        def update_weights(self, global_steps=None):
            self.synced.append(global_steps)

    sync = WeightSync()
    verl_trainer = SimpleNamespace(config=c.config, checkpoint_manager=sync)
    prorsa_verl.watch_trainer(verl_trainer, session)
    for step in range(3):  # verl: update_weights(0) after loading, then after each step
        verl_trainer.checkpoint_manager.update_weights(step)
    # The agent-loop manager made in the same process publishes no second run.started.
    manager = prorsa_verl.ProrsaAgentLoopManagerTQ(c.config, ProrsaLLMServerClient(c.config, session=session))
    assert manager.llm_client.session is session
    em.close()
    assert sync.synced == [0, 1, 2]
    await tracker.wait_events(len(em.ids))
    events = tracker.events()
    assert sorted(e.id for e in events) == sorted(em.ids) and tracker.anomalies() == []
    run = [e for e in events if e.type == "run.started"]
    assert [(e.mode, e.batch_size, e.group_size) for e in run] == [("sync", c.batch, c.n)]
    assert [e.version for e in events if e.type == "policy.updated"] == [0, 1, 2]
    with pytest.raises(ValueError, match="checkpoint_manager"):
        prorsa_verl.watch_trainer(SimpleNamespace(config=c.config, checkpoint_manager=None))
    trainer.reset()
    await asyncio.sleep(0)
