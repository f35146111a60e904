"""PostgreSQL stopped mid-ingest and started again: the tracker waits, resumes, and every
event is applied exactly once (a private server: see conftest.py)."""

from __future__ import annotations

import asyncio

from prorsa_runtime.testing import async_wait_until
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings

from prorsa_tracker.testing import clean, publish, snapshot


async def test_postgres_outage_mid_ingest_waits_resumes_and_applies_each_event_once(nats_url, ns, tmp_path, private_pg) -> None:
    events = list(iter_workload(16_000, live=500))
    await publish(nats_url, ns, events[:12_000])
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=private_pg.url,
                        clock="event", batch_max=500, max_inflight=3000, db_retry_s=0.05)
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    try:
        await async_wait_until(lambda: tracker.written >= 3000, timeout=90, what="ingest before the outage")
        await asyncio.to_thread(private_pg.stop)  # immediate: connections die mid-transaction
        down_at = tracker.written
        await async_wait_until(lambda: tracker.db_retries >= 3, timeout=60, what="the tracker retrying")
        # While the database is down: nothing is committed, the tracker keeps running, and
        # new events still arrive (the receiver pauses at max_inflight instead of buffering).
        await publish(nats_url, ns, events[12_000:])
        await async_wait_until(lambda: tracker.db_retries >= 6, timeout=60, what="more retries")
        assert not task.done()
        assert tracker.written <= down_at + 500  # at most the batch in flight when it stopped
        await asyncio.to_thread(private_pg.start)
        # 16,000 events + 2 invalid messages (one per publish call)
        await async_wait_until(lambda: tracker.written >= 16_002, timeout=120, what="ingest after the outage")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
    assert tracker.state.applied == 16_000
    live, ref = snapshot(private_pg.url), clean(tmp_path, events)
    assert live["dup_ids"] == 0 and len(live["events"]) == 16_000
    for key in ("events", "trajectories", "requests", "spans", "runs"):
        assert live[key] == ref[key], key
