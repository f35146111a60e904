"""The model client against a real HTTP engine, a real nats-server and a real tracker: event
times, streaming, the OpenAI API, engine failures, the sync twin."""

from __future__ import annotations

import asyncio

import pytest

from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import EventError
from prorsa_sdk import (
    EngineAborted, EngineError, Emitter, RolloutClient, SyncEmitter, SyncRolloutClient,
)


def _by_traj(events) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in events:
        out.setdefault(e.traj, []).append(e)
    return out


def _ts(evs, type_: str) -> list[float]:
    return [e.ts for e in evs if e.type == type_]


async def test_streamed_generate_publishes_prefill_finished_at_the_first_token_while_decoding(
        nats_url, ns, tracker, scripted_engine):
    url, script = scripted_engine
    script.prefill_s, script.decode_s = 0.3, 1.5
    async with Emitter("stream-run", nats_url, namespace=ns) as em, RolloutClient(em, url) as llm:
        async with llm.trajectory("s1", prompt_tokens=6) as traj:
            call = asyncio.create_task(traj.generate(input_ids=[1, 2, 3, 4, 5, 6], stream=True, tool_call=False))
            # dispatched, request.queued and prefill.finished are stored while the engine still decodes.
            await tracker.wait_events(3, timeout=30)
            assert not call.done()
            out = await call
            assert out.outcome.output_tokens == 8 and out.text == " tok" * 8 and out.req == "s1:1"
            async with traj.reward() as r:
                r.reward, r.admitted = 0.5, False
        await em.flush()
    await tracker.wait_events(6)
    evs = _by_traj(tracker.events())["s1"]
    assert [e.type for e in evs] == ["trajectory.dispatched", "request.queued", "prefill.finished",
                                     "decode.finished", "reward.started", "reward.finished"]
    queued, prefill, decode = evs[1].ts, evs[2].ts, evs[3].ts
    assert 0.25 <= prefill - queued < 1.2, (queued, prefill)  # the engine's 0.3 s prefill
    assert decode - prefill >= 1.4  # the 1.5 s decode
    assert evs[1].prompt_tokens == 6 and evs[2].cached_tokens == 2 and evs[3].finish == "stop"
    assert evs[5].admitted is False and evs[5].reward == 0.5
    assert tracker.anomalies() == [] and tracker.states() == {"s1": "done"}


async def test_whole_answers_take_the_first_token_time_from_sglang_metrics_and_openai_usage(
        nats_url, ns, tracker, scripted_engine):
    url, script = scripted_engine
    # The engine host's clock is 1000 s ahead: only its differences are used.
    script.prefill_s, script.decode_s, script.metrics, script.clock_offset = 0.3, 0.5, True, 1000.0
    async with Emitter("whole-run", nats_url, namespace=ns) as em, RolloutClient(em, url) as llm:
        async with llm.trajectory("w1", prompt_tokens=3) as traj:
            await traj.generate({"input_ids": [7, 8, 9], "sampling_params": {"max_new_tokens": 8}})
            async with traj.tool("search", calls=1) as t:  # the held answer becomes a tool call
                t.result_tokens, t.ok = 4, True
            script.metrics, script.prefill_s, script.decode_s, script.finish = False, 0.0, 0.0, "tool_calls"
            out = await traj.chat(model="m", messages=[{"role": "user", "content": "hi"}], prompt_tokens=20)
            assert out.outcome.finish == "tool" and out.text == "x" * 8
            async with traj.tool("python"):
                pass
            script.finish = "stop"
            out = await traj.completion(model="m", prompt="go on", prompt_tokens=31, stream=True)
            assert out.text == "x" * 8 and out.outcome.output_tokens == 8
        # Left without a reward: it waits in the tracker's reward state until one comes.
        await llm.get("w1").rewarded(True, reward=1.0)
        await em.flush()
    assert script.seen[2]["stream_options"] == {"include_usage": True}
    await tracker.wait_events(15)
    evs = _by_traj(tracker.events())["w1"]
    assert [e.type for e in evs] == [
        "trajectory.dispatched", "request.queued", "prefill.finished", "decode.finished", "tool.started",
        "tool.finished", "request.queued", "prefill.finished", "decode.finished", "tool.started", "tool.finished",
        "request.queued", "prefill.finished", "decode.finished", "reward.finished"]
    q, p, d = _ts(evs, "request.queued")[0], _ts(evs, "prefill.finished")[0], _ts(evs, "decode.finished")[0]
    assert 0.25 <= p - q < 1.0 and d - p >= 0.4, (q, p, d)
    assert [e.turn for e in evs if e.type == "request.queued"] == [0, 1, 2]
    assert [e.finish for e in evs if e.type == "decode.finished"] == ["tool", "tool", "stop"]
    assert [e.prompt_tokens for e in evs if e.type == "request.queued"] == [3, 20, 31]
    assert tracker.anomalies() == [] and tracker.states() == {"w1": "done"}


async def test_engine_failures_are_reported_as_the_contract_allows_and_re_raised(
        nats_url, ns, tracker, scripted_engine):
    url, script = scripted_engine
    async with Emitter("fail-run", nats_url, namespace=ns) as em, RolloutClient(em, url) as llm:
        async with llm.trajectory("f1", prompt_tokens=2) as traj:
            script.fail = [503]
            with pytest.raises(EngineError, match="HTTP 503") as err:
                await traj.generate(input_ids=[1, 2])
            assert err.value.status == 503
            out = await traj.generate(input_ids=[1, 2])  # the retry re-sends the same queued request
            assert out.req == "f1:1" and script.seen[-1]["rid"] == "f1:1"
            script.finish = "abort"  # aborted mid-decode (one token streamed): decode.finished(abort)
            with pytest.raises(EngineAborted, match="scripted abort"):
                await traj.generate(input_ids=[1, 2, 0, 1], stream=True)
            script.finish = "stop"
            await traj.generate(input_ids=[1, 2, 0, 1], tool_call=True)  # the re-prefill: a new request
            with pytest.raises(ValueError, match="prompt_tokens"):
                await traj.chat(messages=[{"role": "user", "content": "?"}])
            with pytest.raises(ValueError, match="prompt_tokens must be an int"):
                await traj.chat(messages=[], prompt_tokens=-1)
            with pytest.raises(EventError, match="tool"):  # refused by the contract: nothing changes
                async with traj.tool("x" * 500):
                    pass
            await traj.drop("stale")
        with pytest.raises(RuntimeError, match="sandbox down"):
            async with llm.trajectory("f2", prompt_tokens=2) as traj2:
                async with traj2.sandbox("cold"):
                    raise RuntimeError("sandbox down")
        await em.flush()
    await tracker.wait_events(14)
    evs = _by_traj(tracker.events())
    assert [(e.type, getattr(e, "req", None)) for e in evs["f1"]] == [
        ("trajectory.dispatched", None), ("request.queued", "f1:1"), ("prefill.finished", "f1:1"),
        ("decode.finished", "f1:1"), ("request.queued", "f1:2"), ("prefill.finished", "f1:2"),
        ("decode.finished", "f1:2"), ("request.queued", "f1:3"), ("prefill.finished", "f1:3"),
        ("decode.finished", "f1:3"), ("trajectory.dropped", None)]
    assert [e.finish for e in evs["f1"] if e.type == "decode.finished"] == ["tool", "abort", "tool"]
    assert evs["f1"][-1].reason == "stale"
    assert [e.type for e in evs["f2"]] == ["trajectory.dispatched", "sandbox.started", "trajectory.dropped"]
    assert tracker.anomalies() == [] and tracker.states() == {"f1": "dropped", "f2": "dropped"}


async def test_the_sync_client_in_threads(nats_url, ns, tracker, scripted_engine):
    url, script = scripted_engine

    def rollout(i: int) -> None:
        with llm.trajectory(f"y{i}", prompt_tokens=3, group="g") as traj:
            with traj.sandbox("prewarm"):
                pass
            traj.generate(input_ids=[1, 2, 3], stream=i % 2 == 0)
            with traj.tool("shell") as t:
                t.result_tokens = 5
            traj.generate(input_ids=[1, 2, 3] + list(range(13)))
            with traj.reward() as r:
                r.reward = 1.0

    em = SyncEmitter("sync-run", nats_url, namespace=ns)
    with SyncRolloutClient(em, url) as llm:
        await asyncio.gather(*(asyncio.to_thread(rollout, i) for i in range(4)))
    with pytest.raises(TypeError, match="SyncEmitter"):
        async with Emitter("x", nats_url, namespace=ns) as aem:
            SyncRolloutClient(aem, url).trajectory("z", 1).start()
    await asyncio.to_thread(em.flush)
    em.close()
    await tracker.wait_events(4 * 13)
    await async_wait_until(lambda: len(tracker.states()) == 4, timeout=10)
    assert tracker.anomalies() == [] and set(tracker.states().values()) == {"done"}
    assert len(tracker.events()) == 4 * 13
