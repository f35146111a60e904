"""A buffering, pipelined, exactly-once publisher to the JetStream stream.

Why not ``await js.publish()`` per event: that waits one round trip per event (a few
thousand events/s). Here up to ``max_inflight`` publishes are in flight at once, each
acknowledged by the stream; an event stays buffered until its ack arrives, and is re-sent
(same ``Nats-Msg-Id``, so the stream's duplicate window drops copies) after a timeout or
a reconnect. Nothing is lost while the bus is down, within ``max_buffer`` events.

Ordering: events that share an *ordering key* (the SDK uses the trajectory id) are sent
one at a time, the next only after the previous is acknowledged, so a re-send after an
outage can never overtake a later event of the same trajectory in the stream. Events of
different keys overlap freely, which is where the throughput comes from.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass, field

from nats.aio.client import Client as NATS

from prorsa_schemas import Event, Namespace, encode_event

from .bus import MSG_ID, Credentials, connect, open_stream

log = logging.getLogger("prorsa.publisher")


class BufferFull(RuntimeError):
    """More events are waiting for the bus than ``max_buffer`` allows."""


class PublisherClosed(RuntimeError):
    """The publisher was closed; it accepts no more events."""


@dataclass(slots=True)
class _Item:
    key: str
    msg_id: str
    subject: str
    data: bytes
    attempts: int = 0


@dataclass
class PublisherStats:
    submitted: int = 0
    acked: int = 0
    duplicates: int = 0
    resent: int = 0
    errors: int = 0
    connects: int = 0
    last_error: str = ""
    extra: dict = field(default_factory=dict)


class ReliablePublisher:
    """Publish events to the stream with buffering, pipelining and re-sends.

    Use as ``async with ReliablePublisher(url, "name", ns) as pub: pub.submit(event)``.
    ``submit`` never waits for the bus; ``flush()`` waits until every submitted event is
    durably stored (acknowledged by the stream).
    """

    def __init__(
        self,
        url: str,
        name: str,
        ns: Namespace,
        *,
        credentials: Credentials | None = None,
        max_inflight: int = 2048,
        ack_timeout: float = 5.0,
        max_buffer: int = 1_000_000,
        create_stream: bool = True,
    ):
        self.url = url
        self.name = name
        self.ns = ns
        self.credentials = credentials
        self.max_inflight = max_inflight
        self.ack_timeout = ack_timeout
        self.max_buffer = max_buffer
        self.create_stream = create_stream
        self.stats = PublisherStats()
        self.nc: NATS | None = None
        self._lanes: dict[str, deque[_Item]] = {}
        self._ready: deque[str] = deque()
        self._buffered = 0
        self._inflight = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._connected = asyncio.Event()
        self._drained = asyncio.Event()
        self._drain_mark = 0
        self._closing = False
        self._task: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._seq = 0

    # -- public API ------------------------------------------------------------------
    @property
    def pending(self) -> int:
        """Events submitted and not yet acknowledged by the stream."""
        return self._buffered

    async def start(self) -> "ReliablePublisher":
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"publisher:{self.name}")
        return self

    def submit(self, event: Event, key: str | None = None) -> None:
        """Buffer one event for publishing; returns at once."""
        self.submit_raw(self.ns.subject_for(event), event.id, encode_event(event), key)

    def submit_raw(self, subject: str, msg_id: str, data: bytes, key: str | None = None) -> None:
        """Buffer already-encoded bytes (e.g. a log line published verbatim)."""
        if self._closing:
            raise PublisherClosed(f"publisher {self.name} is closed")
        if self._fatal is not None:
            raise PublisherClosed(f"publisher {self.name} failed: {self._fatal}")
        if self._buffered >= self.max_buffer:
            raise BufferFull(
                f"{self._buffered} events are waiting for the bus at {self.url} "
                f"(max_buffer={self.max_buffer}); is the bus down?"
            )
        if key is None:
            self._seq += 1
            key = f"\0{self._seq}"
        item = _Item(key, msg_id, subject, data)
        lane = self._lanes.get(key)
        if lane is None:
            self._lanes[key] = deque([item])
            self._ready.append(key)
        else:
            lane.append(item)
        self._buffered += 1
        self.stats.submitted += 1
        self._idle.clear()
        self._wake.set()

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every submitted event is acknowledged.

        Raises:
            TimeoutError: events are still pending after ``timeout`` seconds.
        """
        try:
            await asyncio.wait_for(self._wait_idle(), timeout)
        except asyncio.TimeoutError:
            raise TimeoutError(
                f"{self._buffered} events still unacknowledged after {timeout}s "
                f"(bus {self.url}; last error: {self.stats.last_error or 'none'})"
            ) from None

    async def wait_below(self, limit: int) -> None:
        """Back-pressure for bulk producers: wait until fewer than ``limit`` are pending."""
        while self._buffered >= limit:
            if self._fatal is not None:
                raise PublisherClosed(f"publisher {self.name} failed: {self._fatal}")
            self._drained.clear()
            self._drain_mark = limit
            await self._drained.wait()

    async def _wait_idle(self) -> None:
        while self._buffered:
            if self._fatal is not None:
                raise PublisherClosed(f"publisher {self.name} failed: {self._fatal}")
            self._idle.clear()
            if not self._buffered:
                break
            await self._idle.wait()

    async def close(self, timeout: float | None = 30.0) -> None:
        """Flush (up to ``timeout``), then disconnect. Unsent events are reported, not hidden."""
        if self._task is None:
            self._closing = True
            return
        try:
            if self._buffered:
                await self.flush(timeout)
        finally:
            self._closing = True
            self._wake.set()
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            if self.nc is not None and not self.nc.is_closed:
                try:
                    await self.nc.close()
                except Exception:  # closing a broken connection may raise; nothing to do
                    pass
            if self._buffered:
                log.error("publisher %s closed with %d unacknowledged events", self.name, self._buffered)

    async def __aenter__(self) -> "ReliablePublisher":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- the sending loop ----------------------------------------------------------------
    async def _on_disconnect(self) -> None:
        self._connected.clear()

    async def _on_reconnect(self) -> None:
        self._connected.set()
        self._wake.set()

    async def _run(self) -> None:
        try:
            self.nc = await connect(
                self.url,
                self.name,
                credentials=self.credentials,
                timeout=float("inf"),
                on_disconnect=self._on_disconnect,
                on_reconnect=self._on_reconnect,
            )
        except Exception as exc:
            self._fatal = exc
            self._idle.set()
            self._drained.set()
            log.error("publisher %s cannot connect: %s", self.name, exc)
            return
        self.stats.connects += 1
        js = self.nc.jetstream(publish_async_max_pending=self.max_inflight * 2)
        if self.create_stream:
            wait = 0.5
            while True:
                try:
                    # Set up without a user; only checked (STREAM.INFO) with one, which the
                    # admin's `prorsa nats setup` may not have run for yet: wait for it.
                    await open_stream(js, self.ns, self.url, self.credentials)
                    break
                except Exception as exc:  # the bus or the stream may still be coming up
                    self.stats.last_error = repr(exc)
                    log.warning("publisher %s: stream not ready (%s); retrying in %gs", self.name, exc, wait)
                    await asyncio.sleep(wait)
                    wait = min(wait * 2, 5.0)
        self._connected.set()
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._ready and self._inflight < self.max_inflight:
                if not self.nc.is_connected:
                    await self._connected.wait()
                key = self._ready.popleft()
                lane = self._lanes.get(key)
                if not lane:
                    continue
                item = lane[0]
                try:
                    fut = await js.publish_async(
                        item.subject, item.data, headers={MSG_ID: item.msg_id}
                    )
                except Exception as exc:  # disconnected mid-call, buffer full, ...
                    self.stats.errors += 1
                    self.stats.last_error = repr(exc)
                    self._ready.appendleft(key)
                    await asyncio.sleep(0.05)
                    continue
                item.attempts += 1
                if item.attempts > 1:
                    self.stats.resent += 1
                self._inflight += 1
                timer = loop.call_later(self.ack_timeout, self._on_timeout, fut)
                fut.add_done_callback(lambda f, k=key, it=item, t=timer: self._on_done(f, k, it, t))

    def _on_timeout(self, fut: asyncio.Future) -> None:
        if not fut.done():
            fut.cancel()

    def _on_done(self, fut: asyncio.Future, key: str, item: _Item, timer: asyncio.TimerHandle) -> None:
        timer.cancel()
        self._inflight -= 1
        failed = fut.cancelled() or fut.exception() is not None
        if failed:
            if not fut.cancelled():
                self.stats.errors += 1
                self.stats.last_error = repr(fut.exception())
            # Still the head of its lane: send it again (same msg id: no duplicate).
            self._ready.append(key)
        else:
            ack = fut.result()
            if getattr(ack, "duplicate", False):
                self.stats.duplicates += 1
            lane = self._lanes[key]
            assert lane[0] is item
            lane.popleft()
            if lane:
                self._ready.append(key)
            else:
                del self._lanes[key]
            self._buffered -= 1
            self.stats.acked += 1
            if not self._buffered:
                self._idle.set()
            if self._buffered < self._drain_mark:
                self._drained.set()
        self._wake.set()
