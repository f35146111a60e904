"""The forecaster under a flood: with a small max_pending it never holds more than that many
messages, folds every event of a backlog far larger, and skips none (the consumer is never
re-created for a gap)."""

from __future__ import annotations

import asyncio

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import encode_event
from prorsa_forecaster.service import Forecaster
from prorsa_forecaster.settings import ForecasterSettings

from .synth import rollout


async def test_a_backlog_far_above_max_pending_is_folded_in_full_and_in_bounds(nats_url, ns):
    events = rollout(seed=3, concurrency=32, duration=120)
    nc = await connect(nats_url, "test")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    for e in events:
        await nc.publish(ns.subject_for(e), encode_event(e), headers={"Nats-Msg-Id": e.id})
    await nc.flush()
    svc = Forecaster(ForecasterSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream,
                                        max_pending=100, tracker_gate=False))
    stop = asyncio.Event()
    task = asyncio.create_task(svc.run(stop))
    most = 0

    def folded() -> bool:
        nonlocal most
        if svc.reader is not None:
            most = max(most, svc.reader.unreleased)  # handed over, not yet folded in (queued or in hand)
        return svc.m_events._value.get() == len(events)

    await async_wait_until(folded, timeout=60, interval=0.001, what="every event folded in")
    assert len(events) > 20 * 100 and most <= 100
    assert svc.reader.gaps == 0 and svc.reader.resets == 0
    await svc.reader.read_info()
    assert svc.reader.backlog() == 0
    stop.set()
    await asyncio.wait_for(task, 10)
    await nc.close()
