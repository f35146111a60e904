"""What the tracker publishes: transitions in JSON arrays that fit a message, the anomalies,
and the event-time watermark (see :mod:`prorsa_tracker.service` for when)."""

from __future__ import annotations

import logging
import time

from pydantic import BaseModel

from prorsa_runtime.bus import MSG_ID
from prorsa_schemas import Namespace

from .state import encode_transitions

log = logging.getLogger("prorsa.tracker")


class Watermark(BaseModel):
    """Published on ``ns.watermark()``: event time has reached ``ts`` (no earlier event follows
    from this tracker's view of the stream, up to ``seq``)."""

    ts: float | None
    seq: int
    heartbeat: bool = False
    applied: int = 0


TRANSITIONS_PER_MESSAGE = 1000
"""Transitions per message on ``ns.transitions()`` (~0.4 MB; split further to fit the
server's max_payload). One message per event cost more than the rest of ingest."""


def chunks(items: list, n: int):
    for i in range(0, len(items), n):
        yield items[i : i + n]


def transition_payloads(chunk: list, max_payload: int):
    """``(json, first seq, last seq)`` for ``chunk``, halved until each fits in a message."""
    data = encode_transitions(chunk)
    if len(data) > max_payload and len(chunk) > 1:
        half = len(chunk) // 2
        yield from transition_payloads(chunk[:half], max_payload)
        yield from transition_payloads(chunk[half:], max_payload)
        return
    yield data, chunk[0].seq, chunk[-1].seq


async def publish_outputs(nc, ns: Namespace, batch) -> None:
    """A batch's transitions (``Nats-Msg-Id = tr-<first seq>-<last seq>``) and its anomalies."""
    subj = ns.transitions()
    for chunk in chunks(batch.transitions, TRANSITIONS_PER_MESSAGE):
        for payload, first, last in transition_payloads(chunk, nc.max_payload):
            await nc.publish(subj, payload, headers={MSG_ID: f"tr-{first}-{last}"})
    asubj = ns.anomalies()
    for a in batch.anomaly_notes:
        await nc.publish(asubj, a.to_json())


async def publish_watermark(nc, ns: Namespace, ts: float | None, seq: int, applied: int, heartbeat: bool = False) -> None:
    """The watermark: event time ``ts`` reached at stream position ``seq``. A heartbeat
    (production only) says event time is wall time when the bus is quiet. Not published
    when the bus is down: the next one will do."""
    if heartbeat:
        ts = max(ts or 0.0, time.time())
    wm = Watermark(ts=ts, seq=seq, heartbeat=heartbeat, applied=applied)
    try:
        await nc.publish(ns.watermark(), wm.model_dump_json().encode())
    except Exception as exc:  # noqa: BLE001 - the bus is down
        log.debug("watermark not published: %r", exc)
