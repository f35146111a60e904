"""The batch linger (``PRORSA_TRACKER_LINGER_S``): a trickle of messages waits up to the
linger for more, so that one transaction holds many; a full batch, or a stop, does not wait
for it. On a real nats-server and a real SQLite file."""

from __future__ import annotations

import asyncio

from prorsa_runtime.testing import async_wait_until
from prorsa_tracker.examples import iter_workload
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.testing import publish, snapshot


def _settings(nats_url, ns, tmp_path, **kw) -> TrackerSettings:
    return TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream,
                           db_url=f"sqlite:///{tmp_path}/t.db", clock="event", **kw)


async def test_a_trickle_within_the_linger_is_one_transaction(nats_url, ns, tmp_path) -> None:
    events = list(iter_workload(12, live=3))
    tracker, stop = Tracker(_settings(nats_url, ns, tmp_path, linger_s=2.0)), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await asyncio.wait_for(tracker.ready.wait(), 60)
    await publish(nats_url, ns, events, invalid=False)  # all within 2 s
    await async_wait_until(lambda: tracker.written >= len(events), timeout=30, what="ingest")
    stop.set()
    await task
    assert tracker.transactions == 1
    assert len(snapshot(f"sqlite:///{tmp_path}/t.db")["events"]) == len(events)


async def test_a_full_batch_does_not_wait_for_the_linger(nats_url, ns, tmp_path) -> None:
    # batch_max 4 and a linger of 10 s (the most it takes): every 4 messages are written at
    # once, well before the linger would end.
    events = list(iter_workload(8, live=2))
    tracker, stop = Tracker(_settings(nats_url, ns, tmp_path, linger_s=10.0, batch_max=4)), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await asyncio.wait_for(tracker.ready.wait(), 60)
    await publish(nats_url, ns, events, invalid=False)
    await async_wait_until(lambda: tracker.written >= len(events), timeout=5, what="two full batches")
    stop.set()
    await task
    assert tracker.transactions == 2


async def test_a_stop_during_the_linger_loses_nothing(nats_url, ns, tmp_path) -> None:
    events = list(iter_workload(6, live=2))
    s = _settings(nats_url, ns, tmp_path, linger_s=10.0)
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await asyncio.wait_for(tracker.ready.wait(), 60)
    await publish(nats_url, ns, events, invalid=False)
    await async_wait_until(lambda: len(tracker._buf) + tracker.written >= len(events), timeout=30, what="delivery")
    stop.set()  # while the batch lingers: the stop does not wait the 10 s out
    await asyncio.wait_for(task, 5)
    # What the stop left uncommitted is delivered again to the next run, and written.
    again, stop2 = Tracker(_settings(nats_url, ns, tmp_path, linger_s=0.0)), asyncio.Event()
    task2 = asyncio.create_task(again.run(stop2))
    await async_wait_until(lambda: tracker.written + again.written >= len(events), timeout=30, what="resume")
    stop2.set()
    await task2
    assert len(snapshot(f"sqlite:///{tmp_path}/t.db")["events"]) == len(events)
