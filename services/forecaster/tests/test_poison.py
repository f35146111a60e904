"""No poison: messages the forecaster cannot handle, published mid-run to a real nats-server,
are dead-lettered (a log line with subject, stream sequence and hash; a counter) and the
following events still make forecasts; a restart replays past them without stopping."""

import asyncio
import time

from prometheus_client import generate_latest

from prorsa_forecaster.service import Forecaster
from prorsa_forecaster.settings import ForecasterSettings
from prorsa_runtime import connect, ensure_stream, publish_event
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import encode_event

from .synth import rollout


async def test_poison_mid_run_is_dead_lettered_and_a_restart_replays_past_it(nats_url, ns, caplog):
    events = rollout(seed=7, concurrency=16, duration=40)
    nc = await connect(nats_url, "test")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    half = len(events) // 2
    for e in events[:half]:
        await publish_event(js, ns, e)
    s = ForecasterSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream)
    svc, stop = Forecaster(s), asyncio.Event()
    task = asyncio.create_task(svc.run(stop))
    # Mid-run: JSON nested 1,000 deep, bytes that are not UTF-8, a rollout event on an engine
    # subject, and a valid event stamped a year ahead of this host's clock (which would close
    # three million windows at once).
    wrong = events[half]
    year = time.time() + 365 * 86400
    poison = [
        (ns.subject_for_type("request.queued"), b"[" * 1000),
        (ns.subject_for_type("engine.stats"), b"\xff\xfe\x00"),
        (f"{ns.prefix}.engine.{wrong.type}", encode_event(wrong.model_copy(update={"id": "forged"}))),
        (ns.subject_for_type(wrong.type), encode_event(wrong.model_copy(update={"id": "from-the-future", "ts": year}))),
    ]
    seqs = [(await js.publish(subject, data)).seq for subject, data in poison]
    for e in events[half:]:
        await publish_event(js, ns, e)
    n_windows = int(events[-1].ts // 10)
    await async_wait_until(lambda: svc.published >= n_windows + 1 or task.done(), timeout=30, what="forecasts")
    assert not task.done(), task.exception()
    assert svc.published >= n_windows + 1  # the events after the poison made their forecasts
    assert svc.dead_letters.counts == {"invalid": 2, "subject": 1, "future": 1}
    assert "ahead of this host's clock" in svc.dead_letters.recent[3].reason
    assert [d.seq for d in svc.dead_letters.recent] == seqs
    assert [d.subject for d in svc.dead_letters.recent] == [p[0] for p in poison]
    assert "nested too deeply" in svc.dead_letters.recent[0].reason
    text = generate_latest(svc.registry).decode()
    assert 'prorsa_forecaster_dead_letters_total{kind="invalid"} 2.0' in text
    assert 'prorsa_forecaster_dead_letters_total{kind="subject"} 1.0' in text
    assert 'prorsa_forecaster_dead_letters_total{kind="future"} 1.0' in text
    assert any("dead letter (invalid)" in r.getMessage() and f"seq={seqs[0]}" in r.getMessage() for r in caplog.records)
    # a watermark no parser takes is skipped too
    # a watermark no parser takes is skipped too, and so is one from the future
    before = svc.published
    await nc.publish(ns.watermark(), b'{"ts": ' + b"[" * 1000 + b"}")
    await nc.publish(ns.watermark(), b'{"ts": %f}' % year)
    await nc.publish(ns.watermark(), b'{"ts": %f}' % (events[-1].ts + 25))
    await async_wait_until(lambda: svc.published >= before + 2 or task.done(), timeout=10, what="watermark windows")
    assert not task.done()
    assert svc.dead_letters.counts["future"] == 2 and "watermark" in svc.dead_letters.recent[-1].reason
    assert svc.loop.window_start < events[-1].ts + 60  # event time moved by the good watermark only
    # A jump of a thousand windows (an idle bus, or clocks that disagree) is passed over at
    # once, not closed window by window.
    await nc.publish(ns.watermark(), b'{"ts": %f}' % (events[-1].ts + 10_000))
    await async_wait_until(lambda: svc.loop.skipped > 0 or task.done(), timeout=10, what="the jump")
    assert svc.loop.skipped >= 990 and svc.loop.window_start >= events[-1].ts + 9_990
    assert "prorsa_forecaster_windows_skipped_total %.1f" % svc.loop.skipped in generate_latest(svc.registry).decode()
    stop.set()
    await asyncio.wait_for(task, 10)

    # A restart replays the stream from its start, poison included, and comes back to the same state.
    svc2, stop2 = Forecaster(s), asyncio.Event()
    task2 = asyncio.create_task(svc2.run(stop2))
    await async_wait_until(lambda: (svc2.ready.is_set() and svc2.loop.state.live == svc.loop.state.live
                                    and svc2.dead_letters.total == 4) or task2.done(), timeout=30, what="replay")
    assert not task2.done(), task2.exception()
    stop2.set()
    await asyncio.wait_for(task2, 10)
    await nc.close()
