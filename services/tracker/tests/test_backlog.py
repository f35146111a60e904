"""Flow control and the backlog gauge: while the database cannot take a commit, the receiver
asks the server for no more than max_inflight messages, the rest waits in the stream, and
prorsa_tracker_backlog_messages (read from JetStream consumer info) counts every message
not yet committed; once the database is back, everything is committed and the gauge is 0."""

from __future__ import annotations

import asyncio
import sqlite3

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import encode_event
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.metrics import tracker_registry
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings

N = 3000


async def test_a_blocked_database_holds_the_backlog_in_the_stream_and_the_gauge_counts_it(nats_url, ns, tmp_path):
    db = tmp_path / "t.db"
    tracker = Tracker(TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream,
                                      db_url=f"sqlite:///{db}", clock="event", max_inflight=1000, batch_max=200))
    stop = asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await asyncio.wait_for(tracker.ready.wait(), 30)
    reg = tracker_registry(tracker)
    labels = {"consumer": ns.durable("tracker")}

    def gauge(name: str) -> float | None:
        return reg.get_sample_value(f"prorsa_tracker_{name}", labels)

    lock = sqlite3.connect(db, timeout=30)
    lock.execute("BEGIN EXCLUSIVE")  # no commit gets through: the tracker waits on it
    try:
        nc = await connect(nats_url, "test-pub")
        js = nc.jetstream()
        await ensure_stream(js, ns)
        for e in iter_workload(N, live=100):
            await nc.publish(ns.subject_for(e), encode_event(e), headers={"Nats-Msg-Id": e.id})
        await nc.flush()
        await async_wait_until(lambda: gauge("backlog_messages") == N, timeout=30,
                               what="the gauge to count every message not committed")
        # At most max_inflight messages left the stream; the server holds the rest.
        assert tracker.written == 0 and tracker.inflight <= 1000
        assert gauge("consumer_pending") >= N - 1000
        info = await js.consumer_info(ns.stream, ns.durable("tracker"))
        assert info.num_pending >= N - 1000
    finally:
        lock.rollback()
        lock.close()
    await async_wait_until(lambda: tracker.written == N, timeout=60, what="every message committed")
    await async_wait_until(lambda: gauge("backlog_messages") == 0, timeout=10, what="the gauge back to 0")
    stop.set()
    await asyncio.wait_for(task, 30)
    await nc.close()
