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


async def test_sync_driver_syncs_the_weights_before_the_next_batch(nats_url, ns):
    nc = await connect(nats_url, "test-setup")
    await ensure_stream(nc.jetstream(), ns)
    await nc.close()
    with EmulatedCluster(["prefill", "decode"], speed=SPEED, router_kind="emulated").start(register=True) as c:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prorsa_sim.driver", "--router", c.router.url, "--nats", nats_url,
            "--prefix", ns.prefix, "--stream", ns.stream, "--workload", "general", "--batch-size", "4",
            "--steps", "2", "--max-turns", "3", "--max-output", "128", "--speed", str(SPEED),
            "--train-s", "2", "--weight-sync-s", str(WEIGHT_SYNC_S),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 300)
        assert proc.returncode == 0, out.decode() + err.decode()
        versions = [httpx.get(f"{e.url}/model_info", timeout=5).json().get("weight_version") for e in c.engines]
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
