"""sdk/examples run against the emulated PD cluster (emulated SGLang engines behind the
emulated router), a real nats-server and a real tracker: the tracker holds exactly the
events each example published, every trajectory is done, no anomaly."""

from __future__ import annotations

import asyncio
import enum
import importlib.util
import inspect
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import httpx

from prorsa_sdk import Emitter, SyncEmitter

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"prorsa_example_{name}", EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


class Recorder:
    """An emitter that remembers the id of every event it accepted."""

    def __init__(self, em):
        self.em, self.ids = em, []

    def __getattr__(self, name: str):
        method = getattr(self.em, name)
        if name in ("flush", "close", "start", "emit") or not callable(method):
            return method

        def call(*args, **kwargs):
            r = method(*args, **kwargs)
            if inspect.isawaitable(r):
                async def stored():
                    ev = await r
                    self.ids.append(ev.id)
                    return ev
                return stored()
            self.ids.append(r.id)
            return r
        return call


async def _check(tracker, ids: list[str], trajectories: int) -> list:
    await tracker.wait_events(len(ids))
    events = tracker.events()
    assert sorted(e.id for e in events) == sorted(ids)  # exactly the published events, once each
    assert tracker.anomalies() == []
    states = tracker.states()
    assert len(states) == trajectories and set(states.values()) == {"done"}, states
    return events


# -- slime ---------------------------------------------------------------------------------
@dataclass
class Sample:  # the fields of slime.utils.types.Sample the example uses
    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"

    group_index: int
    index: int
    tokens: list[int]
    response_length: int = 0
    loss_mask: list[int] | None = None
    reward: float | None = None
    status: Status = Status.PENDING


@dataclass
class DataSource:  # slime's data source: get_samples(n) -> n groups of n_samples_per_prompt
    per_prompt: int
    served: list = field(default_factory=list)

    def get_samples(self, n: int) -> list[list[Sample]]:
        groups = [[Sample(g, g * self.per_prompt + i, list(range(40 + 8 * g))) for i in range(self.per_prompt)]
                  for g in range(n)]
        self.served += groups
        return groups


async def test_slime_rollout_example(nats_url, ns, tracker, emulated_pd):
    slime = _load("slime_rollout")
    router = urlparse(emulated_pd)
    args = SimpleNamespace(sglang_router_ip=router.hostname, sglang_router_port=router.port, rollout_batch_size=3,
                           n_samples_per_prompt=2, rollout_max_response_len=16, max_turns=3)
    em = Recorder(SyncEmitter("slime-example", nats_url, namespace=ns))
    em.run_started("sync", batch_size=3, group_size=2)
    slime.setup(em)
    groups = await asyncio.to_thread(slime.generate_rollout, args, 0, DataSource(per_prompt=2))
    await asyncio.to_thread(em.flush)
    em.close()
    assert [len(g) for g in groups] == [2, 2, 2]
    for s in (s for g in groups for s in g):
        # The emulated engines always decode max_new_tokens: each answer ends with length.
        assert s.status is Sample.Status.TRUNCATED and s.reward == 1.0
        assert s.response_length == len(s.tokens) - (40 + 8 * s.group_index) > 0
    events = await _check(tracker, em.ids, trajectories=6)
    one = [e for e in events if getattr(e, "traj", None) == "g1-s2"]
    # Three turns: the engine's text has no <answer>, so the environment corrects it twice.
    assert [e.type for e in one] == [
        "trajectory.dispatched", "request.queued", "prefill.finished", "decode.finished", "tool.started",
        "tool.finished", "request.queued", "prefill.finished", "decode.finished", "tool.started", "tool.finished",
        "request.queued", "prefill.finished", "decode.finished", "reward.started", "reward.finished"]
    assert [e.prompt_tokens for e in one if e.type == "request.queued"] == [48, 48 + 16 + 3, 48 + 2 * (16 + 3)]
    assert [e.finish for e in one if e.type == "decode.finished"] == ["tool", "tool", "length"]


# -- AReaL -----------------------------------------------------------------------------------
class RouterEngine:
    """The part of AReaL's remote SGLang engine the workflow uses: agenerate() against the
    router's /generate, answering a ModelResponse-shaped object (ttft = latency, as AReaL's
    non-streaming engine reports)."""

    def __init__(self, url: str):
        self.http = httpx.AsyncClient(base_url=url, timeout=60.0)

    def get_version(self) -> int:
        return 0

    async def agenerate(self, req):
        t0 = time.monotonic()
        r = await self.http.post("/generate", json={
            "rid": req.rid, "input_ids": req.input_ids,
            "sampling_params": {"max_new_tokens": req.gconfig.max_new_tokens}})
        r.raise_for_status()
        out = r.json()
        latency = time.monotonic() - t0
        ids = out["output_ids"]
        return SimpleNamespace(input_tokens=req.input_ids, output_tokens=ids, output_len=len(ids),
                               stop_reason=out["meta_info"]["finish_reason"]["type"], latency=latency, ttft=latency)


async def test_areal_workflow_example(nats_url, ns, tracker, emulated_pd):
    areal = _load("areal_workflow")

    async def reward_fn(seq, data):
        return 1.0 if data["id"] % 2 == 0 else 0.0

    async def tool(call):
        return [5, 6, 7, 8]

    engine = RouterEngine(emulated_pd)
    async with Emitter("areal-example", nats_url, namespace=ns) as raw:
        em = Recorder(raw)
        workflow = areal.ProrsaToolWorkflow(
            em, reward_fn=reward_fn, gconfig=SimpleNamespace(max_new_tokens=12), make_request=SimpleNamespace,
            tool_parser=lambda resp, turn: SimpleNamespace(name="python") if turn < 2 else None, tool=tool)
        results = await asyncio.gather(*(workflow.arun_episode(engine, {"id": i, "input_ids": list(range(30 + i))})
                                         for i in range(6)))
        await raw.flush()
    await engine.http.aclose()
    assert [r is not None for r in results] == [True, False] * 3  # rejected episodes return None
    assert results[0]["rewards"] == [1.0] and len(results[0]["input_ids"][0]) == 30 + 3 * 12 + 2 * 4
    events = await _check(tracker, em.ids, trajectories=6)
    one = [e for e in events if getattr(e, "traj", None) == "3"]
    assert [e.type for e in one].count("tool.started") == 2
    assert [e.finish for e in one if e.type == "decode.finished"] == ["tool", "tool", "length"]
    assert sorted({e.traj for e in events if hasattr(e, "traj")}) == [str(i) for i in range(6)]
    assert [e.admitted for e in one if e.type == "reward.finished"] == [False]
