"""The rollout driver's asynchronous sampler against live emulated engines, a router and a
nats-server: the staleness bound, the launch budget, whole GRPO groups, the weight sync that
pauses every engine, and a lifecycle that ends every trajectory exactly once."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from collections import Counter

import httpx
import pytest

from prorsa_emulated import EmulatedCluster
from prorsa_runtime.bus import connect, ensure_stream
from prorsa_runtime.testing import stream_messages
from prorsa_schemas import Namespace
from prorsa_sim.workloads import get_workload

pytestmark = pytest.mark.slow


async def _events(url: str, ns: Namespace) -> list:
    return [event for _, event in await stream_messages(url, ns)]


async def _drive(nats_url: str, ns: Namespace, router: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prorsa_sim.driver", "--router", router, "--nats", nats_url,
        "--prefix", ns.prefix, "--stream", ns.stream, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    return proc.returncode, out.decode(), err.decode()


async def test_async_driver_keeps_the_bound_and_syncs_weights_on_live_engines(nats_url, ns):
    nc = await connect(nats_url, "test-setup")
    await ensure_stream(nc.jetstream(), ns)
    await nc.close()
    batch, staleness, steps = 8, 1, 4
    spec = get_workload("general")
    with EmulatedCluster(["prefill", "decode"], speed=50.0, router_kind="emulated").start(register=True) as c:
        router = c.router.url
        rc, out, err = await _drive(
            nats_url, ns, router, "--workload", "general", "--batch-size", str(batch), "--steps", str(steps),
            "--staleness", str(staleness), "--max-turns", "6", "--max-output", "256", "--speed", "50",
            "--train-s", "2", "--weight-sync-s", "1")
        assert rc == 0, out + err
        versions = [httpx.get(f"{e.url}/model_info", timeout=5).json().get("weight_version") for e in c.engines]
    result = json.loads(out)
    events = await _events(nats_url, ns)
    types = Counter(e.type for e in events)

    # The sampler is described as it ran.
    started = [e for e in events if e.type == "run.started"]
    assert len(started) == 1 and started[0].mode == "async" and started[0].max_staleness == staleness
    assert started[0].batch_size == batch and started[0].group_size == spec.group_size
    # One update per step, each synced to the engines (the last too: the run ends after it,
    # and the engines report the version policy.updated named).
    assert [e.version for e in events if e.type == "policy.updated"] == list(range(1, steps + 1))
    assert versions == [str(steps)] * 2
    assert result["weight_syncs"] == steps and result["paused_engines"] == 2 * steps
    assert result["mode"] == "async" and len(result["step_times_s"]) == steps

    # Launch budget (AReaL): by version v at most (v + staleness + 1) batches over the
    # admission rate, rounded up to whole GRPO groups; dispatched under the version then.
    version, launched = 0, Counter()
    for e in events:
        if e.type == "policy.updated":
            version = e.version
        elif e.type == "trajectory.dispatched":
            assert e.policy_version == version
            launched[version] += 1
            budget = math.ceil((version + staleness + 1) * batch / spec.admission_rate)
            budget = -(-budget // spec.group_size) * spec.group_size
            assert sum(launched.values()) <= budget
    assert sum(launched.values()) == types["trajectory.dispatched"] == result["trajectories"]
    # Groups whole: every group has group_size members.
    groups = Counter(e.group for e in events if e.type == "trajectory.dispatched")
    assert set(groups.values()) == {spec.group_size}

    # Every trajectory ends exactly once: a reward, or a drop ("stale" past the bound at an
    # update, "aborted" at the end of the run).
    dispatched_at = {e.traj: e.policy_version for e in events if e.type == "trajectory.dispatched"}
    ended = Counter()
    version = 0
    for e in events:
        if e.type == "policy.updated":
            version = e.version
        elif e.type in ("reward.finished", "trajectory.dropped"):
            ended[e.traj] += 1
            if e.type == "trajectory.dropped":
                assert e.reason in ("stale", "aborted")
                if e.reason == "stale":
                    assert dispatched_at[e.traj] < version - staleness
    assert set(ended) == set(dispatched_at) and set(ended.values()) == {1}
    # The run's end drops what is live before the last update is published, so that the
    # update carries no trajectory over (nothing of the run follows it).
    last_update = max(i for i, e in enumerate(events) if e.type == "policy.updated")
    at_end = [i for i, e in enumerate(events) if e.type == "trajectory.dropped" and e.reason == "aborted"]
    assert at_end and max(at_end) < last_update
    assert not [e for e in events[last_update + 1:] if e.type in ("request.queued", "trajectory.dispatched")]
    # The trainer took each batch from admitted rewards: enough were admitted for every update.
    admitted = sum(1 for e in events if e.type == "reward.finished" and e.admitted)
    assert admitted >= steps * batch
    # A request the weight sync aborted is re-sent (the same turn, its context plus what it
    # had generated) once the engines resume, unless its trajectory was dropped.
    aborts = [e for e in events if e.type == "decode.finished" and e.finish == "abort"]
    assert len(aborts) == result["aborted_requests"]
    queued = [(i, e) for i, e in enumerate(events) if e.type == "request.queued"]
    turn_of = {e.req: (e.traj, e.turn, e.prompt_tokens) for _, e in queued}
    position = {id(e): i for i, e in enumerate(events)}
    for a in aborts:
        traj, turn, prompt = turn_of[a.req]
        again = [e for i, e in queued if i > position[id(a)] and e.traj == traj and e.turn == turn]
        dropped = any(e.type == "trajectory.dropped" and e.traj == traj for e in events)
        assert dropped or (again and again[0].prompt_tokens == prompt + a.output_tokens), a
    # Every event the driver published is in the stream.
    assert result["events"] == len(events)
    # prefill.finished carries the cached_tokens of the first chunk's meta_info: none on a
    # trajectory's first turn (the prompts are each trajectory's own), and a later turn
    # of the same conversation finds its previous prompt in the prefix cache.
    queued_turn = {e.req: e.turn for _, e in queued}
    finished = [e for e in events if e.type == "prefill.finished" and e.cached_tokens is not None]
    assert len(finished) >= types["prefill.finished"] - len(aborts)  # an abort before the first token has none
    assert all(e.cached_tokens == 0 for e in finished if queued_turn[e.req] == 0)
    assert any(e.cached_tokens > 0 for e in finished if queued_turn[e.req] > 0)


@pytest.mark.parametrize("mode", ["in_place", "retract"])
async def test_a_weight_sync_that_does_not_abort_leaves_the_requests_in_flight_to_finish(nats_url, ns, mode):
    """SGLang's other two pause modes: nothing is aborted or re-sent; a request under way at
    an update ends normally after the engines continue (under ``retract`` it is re-prefilled
    inside the engine, unseen by the framework)."""
    nc = await connect(nats_url, "test-setup")
    await ensure_stream(nc.jetstream(), ns)
    await nc.close()
    steps = 3
    with EmulatedCluster(["prefill", "decode"], speed=50.0, router_kind="emulated").start(register=True) as c:
        rc, out, err = await _drive(
            nats_url, ns, c.router.url, "--workload", "general", "--batch-size", "8", "--steps", str(steps),
            "--staleness", "1", "--max-turns", "6", "--max-output", "256", "--speed", "50",
            "--train-s", "2", "--weight-sync-s", "1", "--pause-mode", mode)
        assert rc == 0, out + err
    result = json.loads(out)
    assert result["pause_mode"] == mode and result["weight_syncs"] == steps
    events = await _events(nats_url, ns)
    assert result["aborted_requests"] == 0
    assert not [e for e in events if e.type == "decode.finished" and e.finish == "abort"]
    # Each turn is queued once: nothing is re-sent.
    turns = Counter((e.traj, e.turn) for e in events if e.type == "request.queued")
    assert set(turns.values()) == {1}
    # Requests in flight at an update (queued before it, not ended by then) end normally
    # after it, unless their trajectory is dropped there.
    updates = [i for i, e in enumerate(events) if e.type == "policy.updated"][:-1]  # the last ends the run
    ended_at = {e.req: i for i, e in enumerate(events) if e.type == "decode.finished"}
    dropped = {e.traj for e in events if e.type == "trajectory.dropped"}
    spanning = [e for i, e in enumerate(events) if e.type == "request.queued" and e.traj not in dropped
                and any(i < u < ended_at.get(e.req, -1) for u in updates)]
    assert spanning, "no request was in flight at an update"
    finish = {e.req: e.finish for e in events if e.type == "decode.finished"}
    assert {finish[e.req] for e in spanning} <= {"tool", "stop"}
    # Every trajectory ends exactly once.
    ended = Counter(e.traj for e in events if e.type in ("reward.finished", "trajectory.dropped"))
    assert set(ended.values()) == {1}
    assert set(ended) == {e.traj for e in events if e.type == "trajectory.dispatched"}
