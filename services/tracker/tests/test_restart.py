"""Restarts: a state snapshot plus the events after it rebuild the same state as replaying
every event (and a snapshot this code cannot read is ignored); the receiver child process
killed mid-ingest is restarted without losing or repeating anything."""

from __future__ import annotations

import asyncio
import os
import signal

from sqlalchemy import update

from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import encode_event
from prorsa_tracker import projection, snapshots
from prorsa_tracker.core import new_state
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.models import SnapshotRow
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.testing import clean, publish, snapshot


def test_snapshot_then_tail_equals_full_replay_and_unreadable_snapshots_are_ignored(tmp_path) -> None:
    eng = make_engine(f"sqlite:///{tmp_path}/s.db")
    migrate(eng)
    raws = [encode_event(e) for e in iter_workload(12_000, live=400)]
    live = new_state()
    for i in range(0, len(raws), 1000):
        b = projection.process(live, "c", [(i + j + 1, r) for j, r in enumerate(raws[i : i + 1000])])
        projection.write(eng, live, b, snapshots.dump(live) if i == 7000 else None)

    from_snap = new_state()
    assert snapshots.restore(eng, from_snap) == 4000  # only the events after the snapshot
    assert from_snap == live
    full = new_state()
    assert projection.restore(eng, full) == 12_000
    assert full == live

    for bad in ({"format": snapshots.SNAPSHOT_FORMAT + 1}, {"state": b"not a pickle"}):
        with eng.begin() as c:
            c.execute(update(SnapshotRow).values(**bad))
        st = new_state()
        assert snapshots.restore(eng, st) == 12_000  # a full replay, the same state
        assert st == live
    eng.dispose()


async def test_receiver_killed_mid_ingest_is_restarted_and_nothing_is_lost_or_repeated(nats_url, ns, tmp_path) -> None:
    events = list(iter_workload(20_000, live=500))
    await publish(nats_url, ns, events)
    db = f"sqlite:///{tmp_path}/live.db"
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, clock="event",
                        batch_max=500, db_retry_s=0.05, max_inflight=1000)  # the receiver is held back
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    try:
        await async_wait_until(lambda: tracker.written >= 2000, timeout=60, what="ingest")
        first = tracker._receiver.pid
        os.kill(first, signal.SIGKILL)
        await async_wait_until(lambda: tracker._receiver.pid not in (None, first), timeout=30, what="a new receiver")
        await async_wait_until(lambda: tracker.written >= 20_001, timeout=90, what="full ingest")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert tracker.state.applied == 20_000
    live, ref = snapshot(db), clean(tmp_path, events)
    assert live["dup_ids"] == 0 and len(live["events"]) == 20_000
    for key in ("events", "trajectories", "requests", "spans", "runs"):
        assert live[key] == ref[key], key
