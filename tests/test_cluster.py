"""A three-node JetStream cluster with the stream on three replicas: a node killed (kill -9)
mid-run loses and duplicates nothing.

Three local nats-servers (the pinned binary) run the shipped deploy/nats/cluster/nats-<n>.conf
(ports moved to free local ones): routes that log in, the Prorsa users. The stream is set up
by `prorsa nats setup`'s code as admin with --replicas 3; the tracker (its own user, SQLite)
consumes, an SDK Emitter (user rollout) publishes. Killed: first the stream's leader
(publishes wait for a new one), then, once it is back, the node holding the tracker's
consumer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from prorsa_cli.natssetup import setup_stream
from prorsa_runtime import connect
from prorsa_runtime.bus import Credentials, wait_for_jetstream
from prorsa_runtime.natsserver import NatsCluster, NatsServer
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import DEFAULT, Namespace
from prorsa_sdk import Emitter
from prorsa_tracker.db import make_engine
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.models import AnomalyRow, EventRow
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.testing import committed

N = 6000
ROOT = Path(__file__).resolve().parents[1]
USERS = {"admin": "ADMIN", "rollout": "ROLLOUT", "tracker": "TRACKER", "forecaster": "FORECASTER",
         "allocator": "ALLOCATOR", "engine-agent": "AGENT"}
PASSWORDS = {user: f"p{uuid.uuid4().hex}" for user in USERS}


def creds(user: str) -> Credentials:
    return Credentials(user=user, password=PASSWORDS[user])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    """The shipped three-node configuration, on this machine."""
    env = {f"PRORSA_{var}_NATS_PASSWORD": PASSWORDS[user] for user, var in USERS.items()}
    files = [ROOT / "deploy" / "nats" / "cluster" / f"nats-{i}.conf" for i in (1, 2, 3)]
    c = NatsCluster(tmp_path / "cluster", config_files=files, environ=env).start()
    yield c
    c.stop()


async def _rollout_messages(js, ns: Namespace) -> int:
    info = await js.stream_info(ns.stream, subjects_filter=ns.rollout_all())
    return sum((info.state.subjects or {}).values())


async def test_killing_nodes_of_a_three_node_cluster_one_at_a_time_loses_and_duplicates_nothing(
        cluster: NatsCluster, tmp_path: Path):
    ns = DEFAULT  # the users' permissions name the default subjects, stream and consumers
    url = cluster.url
    admin = await connect(url, "test-admin", credentials=creds("admin"))
    js = admin.jetstream(timeout=10.0)
    await wait_for_jetstream(js, timeout=30)
    # A stream made with one replica is moved onto three by the admin step, messages kept.
    assert "1 replica(s)" in await setup_stream(url, ns, creds("admin"))
    line = await setup_stream(url, ns, creds("admin"), replicas=3)
    assert line.startswith("updated stream PRORSA") and "1 replica(s) instead of 3" in line, line
    assert line.endswith("3 replica(s)") and PASSWORDS["admin"] not in line
    async def replicated() -> bool:  # a leader and two replicas caught up with it
        info = await js.stream_info(ns.stream)
        return (info.config.num_replicas == 3 and info.cluster.leader is not None and len(info.cluster.replicas or []) == 2
                and all(p.current and not p.offline for p in info.cluster.replicas))

    await async_wait_until(replicated, timeout=30, what="three replicas of the stream")

    db = f"sqlite:///{tmp_path}/tracker.db"
    tracker = Tracker(TrackerSettings(nats_url=url, nats_user="tracker", nats_password=PASSWORDS["tracker"],
                                      db_url=db, clock="event", batch_max=500))
    stop = asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await asyncio.wait_for(tracker.ready.wait(), 30)

    events = list(iter_workload(N, run="cluster", live=200))
    ids = {e.id for e in events}
    third = N // 3
    async with Emitter(run="cluster", nats_url=url, credentials=creds("rollout"), ack_timeout=2.0) as em:
        for e in events[:third]:
            await em.emit(e)
        # Mid-run (the tracker has committed part of the first third, more is in flight):
        # kill -9 the stream's leader; the publishes go on once the other two elect one.
        await async_wait_until(lambda: committed(db, ns) > 0, timeout=30, what="the tracker's first commit")
        leader = (await js.stream_info(ns.stream)).cluster.leader
        cluster.node(leader).kill()
        for e in events[third:2 * third]:
            await em.emit(e)
        await em.flush(timeout=60)
        assert (await js.stream_info(ns.stream)).cluster.leader != leader
        # The node comes back and catches up; then kill -9 the node that holds the tracker's
        # consumer (one replica, in memory): the tracker re-creates it on another node.
        await asyncio.to_thread(cluster.node(leader).restart)

        await async_wait_until(replicated, timeout=30, what="the restarted node to catch up")
        consumer_node = (await js.consumer_info(ns.stream, ns.durable("tracker"))).cluster.leader
        cluster.node(consumer_node).kill()
        for e in events[2 * third:]:
            await em.emit(e)
        await em.flush(timeout=60)  # every event acknowledged by the stream (re-sent where needed)

    async def all_committed() -> bool:
        return tracker.event_rows >= N

    await async_wait_until(all_committed, timeout=60, what="the tracker to hold every event")

    async def consumer_moved() -> bool:
        # The tracker re-created its consumer: it lives on a surviving node. (Not a count of
        # the tracker's resets: a reset still retrying when the node dies, after the first
        # kill's reconnect, creates the consumer on a surviving node without a new one.)
        try:
            info = await js.consumer_info(ns.stream, ns.durable("tracker"), timeout=2.0)
        except Exception:  # noqa: BLE001 - not re-created yet, or the node asked is electing
            return False
        return info.cluster is not None and info.cluster.leader not in (None, consumer_node)

    await async_wait_until(consumer_moved, timeout=60, what="the consumer re-created on a surviving node")
    stop.set()
    await asyncio.wait_for(task, 30)

    # Published = stored: in the stream (a surviving node answers, with a new leader) ...
    assert await _rollout_messages(js, ns) == N
    # ... and in the durable log, each event once, none recorded as an anomaly.
    eng = make_engine(db)
    with eng.connect() as c:
        stored = c.execute(select(EventRow.event_id)).scalars().all()
        anomalies = c.execute(select(func.count()).select_from(AnomalyRow)).scalar()
    eng.dispose()
    assert len(stored) == len(set(stored)) == N and set(stored) == ids
    assert anomalies == 0
    await admin.close()


def test_replicas_on_a_single_server_are_refused_with_what_they_need(tmp_path: Path):
    server = NatsServer(tmp_path / "one", port=0).start()
    try:
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PRORSA_")}, "PRORSA_NATS_URL": server.url}
        cmd = [sys.executable, "-m", "prorsa_cli.main", "nats", "setup"]
        r = subprocess.run(cmd + ["--replicas", "3"], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "refused 3 replicas" in r.stderr and "need a cluster" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
        r = subprocess.run(cmd, env={**env, "PRORSA_STREAM_REPLICAS": "0"}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 2 and "PRORSA_STREAM_REPLICAS" in r.stderr, r.stderr
        r = subprocess.run(cmd, env={**env, "PRORSA_STREAM_REPLICAS": "1"}, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "created stream PRORSA" in r.stdout and "1 replica(s)" in r.stdout, r.stdout
    finally:
        server.stop()
