"""The rollout driver's synchronous sampler against live emulated engines, a router and a
nats-server: between two steps the new weights reach every engine (pause, flush, the sync
time, the new version, resume) before the next batch is dispatched, as the simulator's
sync step does it."""

from __future__ import annotations

import asyncio
import json
import sys

import httpx
import pytest

from prorsa_emulated import EmulatedCluster
from prorsa_runtime.bus import connect, ensure_stream
from prorsa_runtime.testing import stream_messages

pytestmark = pytest.mark.slow

SPEED, WEIGHT_SYNC_S = 50.0, 5.0


async def _drive(nats_url, ns, *args: str):
    """Run the driver (``args`` after the bus and router options) against a prefill and a
    decode emulated engine until it exits; its stdout and each engine's weight version."""
    nc = await connect(nats_url, "test-setup")
    await ensure_stream(nc.jetstream(), ns)
    await nc.close()
    with EmulatedCluster(["prefill", "decode"], speed=SPEED, router_kind="emulated").start(register=True) as c:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prorsa_sim.driver", "--router", c.router.url, "--nats", nats_url,
            "--prefix", ns.prefix, "--stream", ns.stream, "--speed", str(SPEED), *args,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode == 0, out.decode() + err.decode()
        versions = [httpx.get(f"{e.url}/model_info", timeout=5).json().get("weight_version") for e in c.engines]
    return out, versions


async def test_sync_driver_syncs_the_weights_before_the_next_batch(nats_url, ns):
    out, versions = await _drive(nats_url, ns, "--workload", "general", "--batch-size", "4", "--steps", "2",
                                 "--max-turns", "3", "--max-output", "128", "--train-s", "2",
                                 "--weight-sync-s", str(WEIGHT_SYNC_S))
    result = json.loads(out)
    events = [event for _, event in await stream_messages(nats_url, ns)]

    # One update between the two steps, synced to both engines: they report its version.
    assert [e.version for e in events if e.type == "policy.updated"] == [1]
    assert versions == ["1", "1"]
    assert result["mode"] == "sync" and result["weight_syncs"] == 1 and result["paused_engines"] == 2
    # The second batch waits for the sync: every one of its dispatches comes at least the
    # sync time after the update (the driver sleeps it before resuming the engines).
    update = next(e.ts for e in events if e.type == "policy.updated")
    second = [e.ts for e in events if e.type == "trajectory.dispatched" and e.traj.startswith("s1-")]
    first = [e.ts for e in events if e.type == "trajectory.dispatched" and e.traj.startswith("s0-")]
    assert len(first) == len(second) == 4
    assert max(first) < update
    assert min(second) - update >= WEIGHT_SYNC_S / SPEED
    # Nothing was in flight at the pause: the batch had drained, so nothing was aborted.
    assert result["aborted_requests"] == 0


async def test_the_driver_replays_a_recorded_workload_live(nats_url, ns, tmp_path):
    """``--workload log:PATH`` (``prorsa_sim.recorded``): the live driver sends each recorded
    trajectory's prompts and keeps its recorded sandbox start."""
    from prorsa_schemas import LogWriter
    from prorsa_schemas import events as E

    path = tmp_path / "recorded.jsonl.gz"
    with LogWriter(path) as w:
        n = 0
        for i, mode in enumerate(("cold", "prewarm")):
            traj = f"x{i}"
            for cls, ts, fields in (
                (E.TrajectoryDispatched, 0.0, {"prompt_tokens": 900}),
                (E.SandboxStarted, 0.0, {"mode": mode}),
                (E.SandboxReady, 3.0, {}),
                (E.RequestQueued, 3.0, {"req": f"{traj}-1", "turn": 0, "prompt_tokens": 900}),
                (E.PrefillFinished, 4.0, {"req": f"{traj}-1"}),
                (E.DecodeFinished, 5.0, {"req": f"{traj}-1", "output_tokens": 64, "finish": "tool"}),
                (E.RequestQueued, 9.0, {"req": f"{traj}-2", "turn": 1, "prompt_tokens": 1200}),
                (E.PrefillFinished, 10.0, {"req": f"{traj}-2"}),
                (E.DecodeFinished, 11.0, {"req": f"{traj}-2", "output_tokens": 32, "finish": "stop"}),
                (E.RewardFinished, 12.0, {"admitted": True}),
            ):
                n += 1
                w.write(cls(id=f"e{n}", ts=ts, run="rec", traj=traj, **fields))
    await _drive(nats_url, ns, "--workload", f"log:{path}", "--batch-size", "2", "--steps", "1", "--train-s", "2")
    events = [event for _, event in await stream_messages(nats_url, ns)]
    queued = sorted((e.turn, e.prompt_tokens) for e in events if e.type == "request.queued")
    # Turn 1's prompt is the first prompt, the answer and the recorded 236 tokens of result.
    assert queued == [(0, 900), (0, 900), (1, 1200), (1, 1200)]
    assert sorted(e.mode for e in events if e.type == "sandbox.started") == ["cold", "prewarm"]
    assert sum(e.type == "reward.finished" for e in events) == 2
