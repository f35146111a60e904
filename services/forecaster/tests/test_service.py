"""The service on a real nats-server: events in, forecast.window out, online WAPE."""

import asyncio

import pytest

from nats.aio.client import Client as NATS

from prorsa_forecaster.service import Forecaster
from prorsa_forecaster.settings import ForecasterSettings
from prorsa_runtime import connect, ensure_stream, publish_event
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import decode_event

from .synth import rollout


async def test_service_publishes_one_forecast_per_window_and_tracks_wape(nats_url, ns):
    events = rollout(seed=5, concurrency=16, duration=40)
    nc: NATS = await connect(nats_url, "test")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    got = []

    async def on_forecast(msg):
        got.append(decode_event(msg.data))

    await nc.subscribe(ns.forecasts(), cb=on_forecast)
    # Half the events before the service starts (it must replay them), half after.
    half = len(events) // 2
    for e in events[:half]:
        await publish_event(js, ns, e)
    s = ForecasterSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream)
    svc = Forecaster(s)
    stop = asyncio.Event()
    task = asyncio.create_task(svc.run(stop))
    await nc.publish(ns.subject_for_type("request.queued"), b"not json")  # a bad message
    for e in events[half:]:
        await publish_event(js, ns, e)
    last_t = events[-1].ts
    n_windows = int(last_t // 10)  # windows that closed (the one holding the last event stays open)
    await async_wait_until(lambda: svc.published >= n_windows + 1, timeout=30, what="forecasts")
    await async_wait_until(lambda: len(got) >= n_windows + 1, timeout=10, what="forecast events")
    ts = [f.t for f in got]
    assert ts == sorted(set(ts)) and ts[0] == 0.0 and all(b - a == 10.0 for a, b in zip(ts, ts[1:]))
    assert all(f.type == "forecast.window" and f.horizon == 10.0 for f in got)
    assert any(f.prefill_tokens > 0 and f.components.tool > 0 for f in got)
    assert svc.wape["prefill"].value is not None and svc.m_invalid._value.get() == 1
    # The corrections the latest forecast was made with, as the history holds them.
    h = svc.loop.state.history
    reg = svc.registry
    assert reg.get_sample_value("prorsa_forecaster_correction", {"kind": "prefill_tool"}) == h.correction.factors()["tool"]
    assert reg.get_sample_value("prorsa_forecaster_correction", {"kind": "admitted_share"}) == h.correction.share.factor
    assert reg.get_sample_value("prorsa_forecaster_correction", {"kind": "decode"}) == pytest.approx(h.correction.decode.factor)
    # Each forecast says what it is made of (forecast.window.blend), and so do the metrics.
    assert all(sum(f.blend.prefill.values()) == pytest.approx(1.0) and "lifecycle" in f.blend.decode for f in got)
    assert got[0].blend.prefill["lifecycle"] == 1.0  # before any window closed, the lifecycle forecast alone
    weights = h.correction.prefill_blend.blend.named()
    assert reg.get_sample_value("prorsa_forecaster_blend_weight", {"series": "prefill", "predictor": "kalman"}) == pytest.approx(weights["kalman"])
    # A tracker watermark past the next boundary closes the open window without events.
    before = svc.published
    await nc.publish(ns.watermark(), b'{"ts": %f}' % (last_t + 25))
    await async_wait_until(lambda: svc.published >= before + 2, timeout=10, what="watermark windows")
    stop.set()
    await asyncio.wait_for(task, 10)

    # A restart replays the stream and publishes no window twice.
    svc2 = Forecaster(s)
    stop2 = asyncio.Event()
    task2 = asyncio.create_task(svc2.run(stop2))
    await async_wait_until(lambda: svc2.loop.state.live == svc.loop.state.live and svc2.ready.is_set(), timeout=30)
    await async_wait_until(lambda: svc2.loop.window_start is not None and svc2.loop.window_start >= svc.loop.window_start - 20, timeout=30)
    stop2.set()
    await asyncio.wait_for(task2, 10)
    assert svc2.published == 0
    assert len(got) == svc.published  # every forecast reached the bus exactly once
    await nc.close()
