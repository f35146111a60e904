"""The tracker service: JetStream in, SQL log out, transitions and watermark published.

Consumption: an ordered push consumer (no acks; DESIGN.md measured ~50k msg/s against
~8k for per-message-acked pull) filtered to the rollout, engine and control subjects,
starting after the stream sequence stored in SQL. The SQL position is the only position:
it is committed with the rows it covers, so after a kill -9 the tracker rebuilds its state
from the ``events`` table and resumes exactly after the last committed message; messages
at or below the position (a redelivery after a consumer reset) are skipped.

Per batch: decode + apply (pure core) -> publish transitions (``Nats-Msg-Id =
tr-<event id>``, so a batch re-published after a crash is de-duplicated by the stream)
-> write rows + position in one transaction (retried while the database is down) ->
publish the watermark. In ``clock="wall"`` mode an idle tracker publishes a heartbeat
watermark at wall time; in ``clock="event"`` mode (replay, simulation) never.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from contextlib import AsyncExitStack

from nats.js.api import ConsumerConfig, DeliverPolicy
from pydantic import BaseModel
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.bus import MSG_ID

from . import projection
from .core import new_state
from .db import make_engine, migrate

log = logging.getLogger("prorsa.tracker")


class Watermark(BaseModel):
    """Published on ``ns.watermark()``: event time has reached ``ts`` (no earlier event follows
    from this tracker's view of the stream, up to ``seq``)."""

    ts: float | None
    seq: int
    heartbeat: bool = False
    applied: int = 0


def _stream_seq(reply: str) -> int:
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending> (v1), or the v2
    # form with <domain>.<account hash> after $JS.ACK and a trailing token.
    parts = reply.split(".")
    return int(parts[5] if len(parts) == 9 else parts[7])


class Tracker:
    """One tracker process. ``await Tracker(settings).run(stop)``; ``ready`` is set once it
    consumes. Attributes ``state``, ``position`` and ``written`` are for tests and metrics."""

    def __init__(self, settings) -> None:
        self.settings = settings
        self.ns = settings.namespace()
        self.consumer = self.ns.durable("tracker")
        self.state = new_state()
        self.position = 0
        self.written = 0  # messages committed by this process
        self.ready = asyncio.Event()
        self._buf: deque[tuple[str, bytes]] = deque()
        self._wake = asyncio.Event()
        self._resubscribe = False
        self._sub = None
        self._writing: asyncio.Future | None = None

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        async with AsyncExitStack() as stack:
            self.engine = make_engine(s.db_url)
            stack.callback(self.engine.dispose)
            await self._until_db(stop, lambda: migrate(self.engine))
            n = await self._until_db(stop, lambda: projection.restore(self.engine, self.state))
            self.position = await self._until_db(stop, lambda: projection.position(self.engine, self.consumer))
            log.info("tracker: restored %s events, resuming after stream seq %s", n, self.position)
            self.nc = await connect(s.nats_url, "prorsa-tracker", credentials=s.credentials(), on_reconnect=self._on_reconnect)
            stack.push_async_callback(self.nc.close)
            self.js = self.nc.jetstream()
            await ensure_stream(self.js, self.ns)
            if s.http_port is not None:
                from .api import serve_api

                stack.enter_context(serve_api(s.db_url, s.api_token, s.http_host, s.http_port))
            await self._subscribe()
            self.ready.set()
            await self._loop(stop)

    async def _on_reconnect(self) -> None:
        # nats-py's ordered consumer does not always recover across a server restart:
        # recreate it from our own committed position instead.
        self._resubscribe = True
        self._wake.set()

    async def _subscribe(self) -> None:
        if self._sub is not None:
            try:
                await self._sub.unsubscribe()
            except Exception as exc:  # the old consumer may be gone with the old server
                log.debug("unsubscribe: %r", exc)
        self._buf.clear()
        cfg = ConsumerConfig(
            filter_subjects=[self.ns.rollout_all(), self.ns.engine_all(), self.ns.control_all()],
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.position + 1,
        )

        async def on_msg(msg) -> None:
            self._buf.append((msg.reply, msg.data))
            self._wake.set()

        self._sub = await self.js.subscribe(
            self.ns.rollout_all(), stream=self.ns.stream, ordered_consumer=True, config=cfg, cb=on_msg,
            pending_msgs_limit=200_000, pending_bytes_limit=512 * 1024 * 1024,
        )
        self._resubscribe = False

    async def _loop(self, stop: asyncio.Event) -> None:
        s = self.settings
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if self._resubscribe:
                    try:
                        await self._subscribe()
                    except Exception as exc:  # server still coming back: try again shortly
                        log.warning("tracker: resubscribe failed (%r); retrying", exc)
                        await asyncio.wait([stopper], timeout=s.db_retry_s)
                        continue
                if not self._buf:
                    await self._flush_write()
                    if self._buf:
                        continue
                    self._wake.clear()
                    waiter = asyncio.ensure_future(self._wake.wait())
                    done, _ = await asyncio.wait([waiter, stopper], timeout=s.heartbeat_s, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    if not done and s.clock == "wall":
                        await self._publish_watermark(heartbeat=True)
                    continue
                await self._one_batch(stop)
        finally:
            stopper.cancel()
            await self._flush_write()

    def _take(self) -> list[tuple[int, bytes]]:
        items = []
        buf = self._buf
        while buf and len(items) < self.settings.batch_max:
            reply, data = buf.popleft()
            seq = _stream_seq(reply)
            if seq > self.position:  # at or below: already committed (a redelivery)
                items.append((seq, data))
        return items

    async def _one_batch(self, stop: asyncio.Event) -> None:
        items = self._take()
        if not items:
            return
        batch = projection.process(self.state, self.consumer, items)
        if self.settings.publish_transitions:
            await self._publish_outputs(batch)
        # Pipelining: batch k is written (in a thread) while batch k+1 is decoded and
        # applied here; writes stay in order because each waits for the previous one.
        await self._flush_write()
        self._writing = asyncio.ensure_future(self._write(stop, batch, len(items)))

    async def _flush_write(self) -> None:
        if self._writing is not None:
            w, self._writing = self._writing, None
            await w

    async def _write(self, stop: asyncio.Event, batch, n: int) -> None:
        try:
            await self._until_db(stop, lambda: projection.write(self.engine, self.state, batch))
        except (OperationalError, InterfaceError):  # stopping during an outage: restart restores
            return
        self.position = batch.position or self.position
        self.written += n
        await self._publish_watermark()

    async def _publish_outputs(self, batch) -> None:
        pub = self.nc.publish
        subj = self.ns.transitions()
        for t in batch.transitions:
            await pub(subj, t.to_json(), headers={MSG_ID: f"tr-{t.event_id}"})
        asubj = self.ns.anomalies()
        for a in batch.anomaly_notes:
            await pub(asubj, a.to_json())

    async def _publish_watermark(self, heartbeat: bool = False) -> None:
        ts = self.state.watermark
        if heartbeat:  # production only: event time is wall time when the bus is quiet
            ts = max(ts or 0.0, time.time())
        wm = Watermark(ts=ts, seq=self.position, heartbeat=heartbeat, applied=self.state.applied)
        try:
            await self.nc.publish(self.ns.watermark(), wm.model_dump_json().encode())
        except Exception as exc:  # the bus is down: the next one will do
            log.debug("watermark not published: %r", exc)

    async def _until_db(self, stop: asyncio.Event, fn):
        """Run a blocking database call in a thread, retrying while the database is down."""
        delay = self.settings.db_retry_s
        while True:
            try:
                return await asyncio.to_thread(fn)
            except DBAPIError as exc:
                transient = isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated
                if not transient or stop.is_set():
                    raise
                log.warning("tracker: database unavailable (%s); retrying in %.1fs", str(exc).splitlines()[0], delay)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, 5.0)
