"""The live tracker on a real nats-server and real databases: exactly once across a kill -9
of the tracker and a nats-server restart (the PostgreSQL outage: test_pg_outage.py)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import select

from prorsa_runtime import connect
from prorsa_runtime.testing import async_wait_until
from prorsa_tracker import projection
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.outputs import Watermark
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.state import Transition, decode_transitions
from prorsa_tracker.testing import clean, committed, publish, snapshot

PRORSA = str(Path(sys.executable).with_name("prorsa"))


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def children(pid: int) -> list[int]:
    """Live child processes of ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


async def test_kill_minus_9_mid_ingest_applies_every_event_exactly_once(nats_url, ns, tmp_path) -> None:
    events = list(iter_workload(30_000, live=600))
    await publish(nats_url, ns, events)
    db = f"sqlite:///{tmp_path}/live.db"
    env = {**os.environ, "PRORSA_NATS_URL": nats_url, "PRORSA_SUBJECT_PREFIX": ns.prefix, "PRORSA_STREAM": ns.stream,
           "PRORSA_TRACKER_DB_URL": db, "PRORSA_TRACKER_CLOCK": "event", "PRORSA_TRACKER_BATCH_MAX": "500"}
    env["PRORSA_TRACKER_SNAPSHOT_EVERY"] = "4000"  # restarts load a snapshot, then the events after it
    for _ in range(2):  # kill it twice, at different points
        proc = subprocess.Popen([PRORSA, "tracker", "run"], env=env, stderr=subprocess.DEVNULL)
        start = committed(db, ns)
        await async_wait_until(lambda: committed(db, ns) > start + 6000, timeout=60, what="ingest progress")
        receivers = children(proc.pid)
        assert receivers  # the receiver process
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # the receiver dies with its parent
        await async_wait_until(lambda: not any(alive(pid) for pid in receivers), timeout=20,
                               what="the orphaned receiver to exit")
    assert committed(db, ns) < 30_001  # it really died mid-ingest
    proc = subprocess.Popen([PRORSA, "tracker", "run"], env=env, stderr=subprocess.DEVNULL)
    try:
        await async_wait_until(lambda: committed(db, ns) >= 30_001, timeout=240, what="full ingest")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    live, ref = snapshot(db), clean(tmp_path, events)
    assert live["dup_ids"] == 0
    assert len(live["events"]) == 30_000
    for key in ("events", "trajectories", "requests", "spans", "runs"):
        assert live[key] == ref[key], key


async def test_nats_restart_loses_nothing_and_publishes_transitions(nats_factory, ns, tmp_path) -> None:
    server = nats_factory()
    events = list(iter_workload(6_000, live=300))
    db = f"sqlite:///{tmp_path}/live.db"
    s = TrackerSettings(nats_url=server.url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, clock="event")
    tracker = Tracker(s)
    stop = asyncio.Event()
    await publish(server.url, ns, events[:3000])
    task = asyncio.create_task(tracker.run(stop))
    await async_wait_until(lambda: tracker.written >= 3001, timeout=60, what="first half")
    server.stop()
    server.start()
    await publish(server.url, ns, events[3000:])
    # stream sequences now interleave the tracker's own transitions: count messages instead
    await async_wait_until(lambda: tracker.written >= 6002, timeout=60, what="second half after restart")
    stop.set()
    await task
    assert tracker.state.applied == 6000
    assert snapshot(db)["trajectories"] == clean(tmp_path, events)["trajectories"]
    # The transitions are in the stream exactly once each (as the forecaster reads them),
    # and the last watermark is the largest event ts.
    nc = await connect(server.url, "watcher")
    js = nc.jetstream()
    seen: list[Transition] = []
    sub = await js.subscribe(ns.transitions(), ordered_consumer=True)
    while len(seen) < 5999:  # every event but run.started is a trajectory event
        seen.extend(decode_transitions((await sub.next_msg(timeout=10)).data))
    wm = await js.get_last_msg(ns.stream, ns.watermark())
    await nc.close()
    assert len({t.event_id for t in seen}) == 5999
    # in stream order, each with its event's stream sequence
    assert [t.seq for t in seen] == sorted(t.seq for t in seen) and None not in {t.seq for t in seen}
    assert seen[0].event_id == events[1].id and seen[0].to_state.value == "dispatched"
    mark = Watermark.model_validate_json(wm.data)
    assert mark.ts == max(e.ts for e in events) and not mark.heartbeat


async def test_idle_tracker_heartbeats_in_wall_clock_mode(nats_url, ns, tmp_path) -> None:
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream,
                        db_url=f"sqlite:///{tmp_path}/t.db", clock="wall", heartbeat_s=0.05)
    nc = await connect(nats_url, "watcher")
    marks: list[Watermark] = []

    async def on_mark(m):
        marks.append(Watermark.model_validate_json(m.data))

    await nc.subscribe(ns.watermark(), cb=on_mark)
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await async_wait_until(lambda: len(marks) >= 2, timeout=20, what="heartbeats")
    stop.set()
    await task
    await nc.close()
    assert all(m.heartbeat and m.ts > 1e9 for m in marks)  # wall time, since no event came


def test_invalid_messages_become_anomalies_with_raw_bytes(tmp_path) -> None:
    from prorsa_tracker.core import new_state
    from prorsa_tracker.models import AnomalyRow

    url = f"sqlite:///{tmp_path}/t.db"
    eng = make_engine(url)
    migrate(eng)
    st = new_state()
    b = projection.process(st, "c", [(1, b"\xff\xfe garbage"), (2, b'{"v":1,"id":"x","type":"trajectory.dispatched","ts":-1,"run":"r","traj":"a","prompt_tokens":1}')])
    projection.write(eng, st, b)
    with eng.connect() as c:
        rows = c.execute(select(AnomalyRow.raw, AnomalyRow.reason, AnomalyRow.seq)).all()
    assert [bytes(r[0]) for r in rows] == [b"\xff\xfe garbage", b'{"v":1,"id":"x","type":"trajectory.dispatched","ts":-1,"run":"r","traj":"a","prompt_tokens":1}']
    assert "ts" in rows[1][1] and rows[1][2] == 2
    assert projection.position(eng, "c") == 2


async def test_transitions_off_writes_everything_but_publishes_no_transition(nats_url, ns, tmp_path) -> None:
    # PRORSA_TRACKER_PUBLISH_TRANSITIONS=false (nobody reads ns.transitions()): the same rows,
    # nothing on the transitions subject, the watermark still published.
    events = list(iter_workload(2000, live=50))
    await publish(nats_url, ns, events)
    db = f"sqlite:///{tmp_path}/off.db"
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, clock="event",
                        publish_transitions=False, gc_gen0=0)
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await async_wait_until(lambda: tracker.written >= len(events), timeout=60, what="ingest")
    stop.set()
    await task
    assert snapshot(db)["trajectories"] == clean(tmp_path, events)["trajectories"]
    nc = await connect(nats_url, "watcher")
    js = nc.jetstream()
    info = await js.stream_info(ns.stream, subjects_filter=ns.transitions())
    wm = await js.get_last_msg(ns.stream, ns.watermark())
    await nc.close()
    assert not info.state.subjects  # no message on the transitions subject
    assert Watermark.model_validate_json(wm.data).applied == len(events)
