"""The tracker service: JetStream in, SQL log out, transitions and watermark published.

Consumption: a receiver child process (:mod:`prorsa_tracker.receiver`) runs an ordered
push consumer (no acks; DESIGN.md measured ~50k msg/s against ~8k for per-message-acked
pull) filtered to the rollout, engine and control subjects, starting after the stream
sequence stored in SQL, validates each message strictly and forwards them in batches;
this process reads, applies, writes and publishes, so receiving and processing use two
cores. The SQL
position is the only position: it is committed with the rows it covers, so after a
kill -9 the tracker rebuilds its state (snapshot + the events after it) and resumes
exactly after the last committed message; messages at or below the position are skipped.

Every message lands somewhere: a valid event in ``events``; a message that is no valid event,
a valid event on a subject its type does not belong to, or a re-sent id with other content
in ``anomalies`` (whole bytes, reason, stream sequence, subject), also logged as a dead
letter (``prorsa_tracker_dead_letters_total{kind}``). Duplicates are decided by the
``events`` table's unique event id (an in-memory window of recent ids is only the fast
path), so an old event re-sent after any window is still not applied twice.

Database errors: an outage (connection refused, the server restarting) is retried with
back-off and a log line; an error no retry fixes (the database does not exist, the
credentials are refused, the file cannot be opened) stops the tracker with
:class:`~prorsa_tracker.db.DatabaseUnusable`. Messages never show a password.

Per batch: decode and look up in ``events`` the ids the recent-id window cannot decide
(started while the previous batch is applied) -> apply (pure core) -> publish the batch's transitions as JSON arrays
of up to 1000 (``Nats-Msg-Id = tr-<first seq>-<last seq>``; each transition carries the
stream ``seq`` of its event) -> write rows + position in one transaction (retried while
the database is down) -> publish the watermark. Transitions go out before the commit, so
they are at-least-once: after a crash the uncommitted tail is published again (the same
ids when the batch boundaries repeat, else overlapping ranges); a reader skips any
transition whose ``seq`` is not above the last one it applied. In ``clock="wall"`` mode
an idle tracker publishes a heartbeat watermark at wall time; in ``clock="event"`` mode
(replay, simulation) never.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections import deque
from contextlib import AsyncExitStack
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError

from prorsa_runtime import connect, open_stream
from prorsa_runtime.deadletter import DeadLetters

from . import projection
from .core import new_state
from . import snapshots
from .db import DatabaseUnusable, error_line, is_permanent, is_transient, make_engine, migrate, shown_url
from .outputs import publish_outputs, publish_watermark
from .receiver import ReceiverProcess

log = logging.getLogger("prorsa.tracker")


@dataclass(slots=True)
class _Prepared:
    """A batch taken off the buffer and decoded, its duplicate lookup under way."""

    decoded: list
    n: int  # messages in it
    taken: int  # messages taken off the buffer (redeliveries included)
    asked: set[str]  # the ids looked up in the events table
    lookup: asyncio.Future | None  # -> {event_id: raw} of those the table holds


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
        self.transactions = 0  # batches committed by this process
        self.hub = None  # the console's live feed (console_live.Hub) while the HTTP API runs
        self.restored = 0  # events replayed at start (after the snapshot, if any)
        self.ready = asyncio.Event()
        self._buf: deque[tuple[int, bytes, str | None, str]] = deque()  # (seq, raw, invalid reason, subject)
        self._received = 0  # the last stream sequence the receiver handed over
        self._wake = asyncio.Event()
        self._subscribed = asyncio.Event()
        self._receiver: ReceiverProcess | None = None
        self._receiver_died = False
        self._writing: asyncio.Future | None = None
        self._next: _Prepared | None = None  # the batch after the one being applied
        self._last_snapshot = 0
        self.db_retries = 0  # database calls retried because the database was unavailable
        self.dead_letters = DeadLetters("tracker", log)
        # What the tables hold: counted at start, then what each commit adds.
        self.event_rows = 0
        self.anomaly_rows = 0
        self.duplicates = 0  # re-sent events skipped by this process (same id, same content)
        # Flow: messages forwarded by the receiver and credited back to it (committed or
        # skipped); the consumer's backlog as the server counts it, read by the receiver.
        self.forwarded = 0
        self.credited = 0
        self.consumer_pending: int | None = None
        self.consumer_in_transit = 0
        self.consumer_resets = 0

    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        async with AsyncExitStack() as stack:
            if s.gc_gen0:
                # Nearly everything the fold allocates dies within its batch; fewer young
                # collections, each over more garbage, cost less (restored on exit).
                stack.callback(gc.set_threshold, *gc.get_threshold())
                gc.set_threshold(s.gc_gen0, *gc.get_threshold()[1:])
            self.engine = make_engine(s.db_url)
            stack.callback(self.engine.dispose)
            if not await self._restore(stop):
                return
            self._received = self._last_snapshot = self.position
            log.info("tracker: restored the state (%s events replayed), resuming after stream seq %s",
                     self.restored, self.position)
            self.nc = await connect(s.nats_url, "prorsa-tracker", credentials=s.credentials())
            stack.push_async_callback(self.nc.close)
            self.js = self.nc.jetstream()
            await open_stream(self.js, self.ns, s.nats_url, s.credentials())
            if s.http_port is not None:
                from .api import serve_api

                from .console_live import Hub

                self.hub = Hub()  # the console's live stream: each committed batch
                stack.enter_context(serve_api(s.db_url, s.api_token, s.http_host, s.http_port, self.hub))
            self._start_receiver()
            stack.callback(self._stop_receiver)
            await self._until_subscribed(stop)
            if stop.is_set():
                return
            self.ready.set()
            await self._loop(stop)

    async def _restore(self, stop: asyncio.Event) -> bool:
        """Migrate, rebuild the state, read the position and the table counts; False when
        stopped while waiting for the database."""
        try:
            await self._until_db(stop, lambda: migrate(self.engine))
            self.restored = await self._until_db(stop, lambda: snapshots.restore(self.engine, self.state))
            self._size_dedup_cache()
            self.position = await self._until_db(stop, lambda: projection.position(self.engine, self.consumer))
            self.event_rows, self.anomaly_rows = await self._until_db(stop, lambda: projection.row_counts(self.engine))
        except (OperationalError, InterfaceError):
            if stop.is_set():
                log.info("tracker: stopped while waiting for the database")
                return False
            raise
        return True

    def _size_dedup_cache(self) -> None:
        # At least three batches: a batch's ids are looked up while the batch before it is
        # applied and the one before that may still be written; neither is in the table
        # then, so both must still be in the window when this batch is applied.
        cap = max(self.settings.dedup_cache, 3 * self.settings.batch_max)
        self.state.seen_capacity = cap
        seen = self.state.seen_ids
        while len(seen) > cap:
            seen.popitem(last=False)

    # -- the receiver child ----------------------------------------------------------------

    def _start_receiver(self) -> None:
        s = self.settings
        cfg = {"url": s.nats_url, "name": "prorsa-tracker-receiver", "credentials": s.credentials(),
               "prefix": self.ns.prefix, "stream": self.ns.stream, "start_seq": self._received + 1,
               "max_inflight": s.max_inflight}
        self._subscribed.clear()
        self._receiver_died = False
        self._receiver = ReceiverProcess(cfg, self._on_items, self._on_receiver_exit)
        self._receiver.start(asyncio.get_running_loop())

    def _stop_receiver(self) -> None:
        if self._receiver is not None:
            self._receiver.stop()

    def _on_items(self, items: list | dict) -> None:
        if isinstance(items, dict):  # the consumer's figures, as the server counts them
            self.consumer_pending = items["num_pending"]
            self.consumer_in_transit = items["in_transit"]
            self.consumer_resets = items["resets"]
            return
        if not items:  # the child's "subscribed"
            self._subscribed.set()
            return
        self.forwarded += len(items)
        self._buf.extend(items)
        self._received = items[-1][0]
        self._wake.set()

    def _on_receiver_exit(self) -> None:
        self._receiver_died = True
        self._wake.set()

    async def _until_subscribed(self, stop: asyncio.Event) -> None:
        while not self._subscribed.is_set() and not stop.is_set():
            waiter = asyncio.ensure_future(self._subscribed.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait([waiter, stopper], timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            stopper.cancel()
            if self._receiver_died:
                await self._restart_receiver(stop)

    async def _restart_receiver(self, stop: asyncio.Event) -> None:
        log.warning("tracker: the receiver process ended; restarting it after stream seq %s", self._received)
        self._stop_receiver()
        try:
            await asyncio.wait_for(stop.wait(), self.settings.db_retry_s)
        except TimeoutError:
            pass
        if not stop.is_set():
            self._start_receiver()

    # -- the loop ------------------------------------------------------------------------

    async def _loop(self, stop: asyncio.Event) -> None:
        s = self.settings
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if self._receiver_died:
                    await self._restart_receiver(stop)
                    continue
                if not self._buf and self._next is None:
                    await self._flush_write()
                    if self._buf:
                        continue
                    woken = await self._wait_for_messages(stopper, s.heartbeat_s)
                    if not woken and s.clock == "wall":
                        await self._publish_watermark(heartbeat=True)
                    continue
                if self._next is None and self.settings.linger_s > 0:
                    await self._linger(stopper)
                await self._one_batch(stop)
        finally:
            stopper.cancel()
            nxt, self._next = self._next, None
            if nxt is not None and nxt.lookup is not None:  # not applied: the restart takes it again
                if nxt.lookup.done():
                    if not nxt.lookup.cancelled():
                        nxt.lookup.exception()  # retrieved: an outage at stop is no error
                else:
                    nxt.lookup.cancel()
            await self._flush_write()

    async def _linger(self, stopper: asyncio.Future) -> None:
        """Let a batch smaller than ``batch_max`` grow for up to ``linger_s``: a trickle of
        messages (a live run: a few hundred a second, in bursts) is then one transaction
        (a thread hop, a commit, the pages it writes, one transitions publish) per linger,
        not one per few messages. A full buffer, a stop or a receiver that died ends it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.linger_s
        while len(self._buf) < self.settings.batch_max and not self._receiver_died and not stopper.done():
            left = deadline - loop.time()
            if left <= 0:
                return
            await self._wait_for_messages(stopper, left)

    async def _wait_for_messages(self, stopper: asyncio.Future, timeout: float) -> bool:
        """Wait up to ``timeout`` for the receiver to hand over messages (or a stop);
        False when the time ran out."""
        self._wake.clear()
        waiter = asyncio.ensure_future(self._wake.wait())
        done, _ = await asyncio.wait([waiter, stopper], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        return bool(done)

    def _take(self) -> tuple[list[tuple[int, bytes, str | None, str]], int]:
        """Up to batch_max new messages, and how many were taken off the buffer."""
        items = []
        buf = self._buf
        pos = self.position
        n = min(len(buf), self.settings.batch_max)
        for _ in range(n):
            item = buf.popleft()
            if item[0] > pos:  # at or below: already committed (a redelivery)
                items.append(item)
        return items, n

    def _prepare(self, stop: asyncio.Event) -> _Prepared | None:
        """Take and decode the next batch, and start looking up in ``events`` the ids the
        recent-id window cannot decide (None when every message taken was a redelivery)."""
        items, taken = self._take()
        if not items:
            self._credit(taken)
            return None
        s = self.settings
        # Live (wall clock), an event stamped too far ahead never moves the watermark.
        not_after = time.time() + s.max_clock_ahead_s if s.clock == "wall" and s.max_clock_ahead_s else None
        decoded = projection.decode_items(items, validated=True, ns=self.ns, not_after=not_after)
        ids = projection.unknown_ids(self.state, decoded)
        lookup = None
        if ids:  # the durable log decides what the window cannot
            lookup = asyncio.ensure_future(self._until_db(stop, lambda: projection.stored_events(self.engine, ids)))
        return _Prepared(decoded, len(items), taken, set(ids), lookup)

    async def _one_batch(self, stop: asyncio.Event) -> None:
        cur, self._next = self._next or self._prepare(stop), None
        if cur is None:
            return
        try:
            known = await cur.lookup if cur.lookup is not None else {}
        except (OperationalError, InterfaceError):  # stopping during an outage: restart resumes
            return
        # The next batch's lookup runs (in a thread, or on the database server) while this
        # one is applied: _size_dedup_cache keeps enough ids in the window for that. A
        # batch that is not full yet lingers first (_linger), unless the linger is off.
        if len(self._buf) >= self.settings.batch_max or (self._buf and self.settings.linger_s <= 0):
            self._next = self._prepare(stop)
        batch = projection.fold(self.state, self.consumer, cur.decoded, known, asked=cur.asked)
        if self.settings.publish_transitions:
            await self._publish_outputs(batch)
        # Pipelining: batch k is written (in a thread) while batch k+1 is decoded and
        # applied here; writes stay in order because each waits for the previous one.
        snap = self._snapshot_due(batch)  # now: the next batch is applied while this one is written
        await self._flush_write()
        self._writing = asyncio.ensure_future(self._write(stop, batch, cur.n, cur.taken, snap))

    @property
    def receiver_pid(self) -> int | None:
        """The receiver child's process id (None while it is not running)."""
        return self._receiver.pid if self._receiver is not None else None

    def _credit(self, n: int) -> None:
        self.credited += n
        if self._receiver is not None:
            self._receiver.credit(n)

    @property
    def inflight(self) -> int:
        """Messages the receiver forwarded that are not yet committed (or skipped)."""
        return self.forwarded - self.credited

    def backlog(self) -> int | None:
        """Messages not yet committed, as the receiver last read the consumer info: not yet
        delivered (``num_pending``), delivered and not yet handed over by the receiver; plus
        those handed over and not yet committed now."""
        if self.consumer_pending is None:
            return None
        return self.consumer_pending + self.consumer_in_transit + self.inflight

    async def _flush_write(self) -> None:
        if self._writing is not None:
            w, self._writing = self._writing, None
            await w

    async def _write(self, stop: asyncio.Event, batch, n: int, taken: int, snap: bytes | None) -> None:
        try:
            await self._until_db(stop, lambda: projection.write(self.engine, self.state, batch, snap))
        except (OperationalError, InterfaceError):  # stopping during an outage: restart restores
            return
        self.position = batch.position or self.position
        if snap is not None:
            self._last_snapshot = self.position
        self.written += n
        self.transactions += 1
        self.event_rows += len(batch.events)
        if self.hub is not None:
            self.hub.publish(batch.events)
        self.anomaly_rows += len(batch.anomalies)
        self.duplicates += batch.duplicates
        for pos, subject, raw, reason, kind in batch.rejected:  # committed: now say so
            self.dead_letters.record(kind, subject, pos, raw, reason)
        self._credit(taken)
        await self._publish_watermark()

    def _snapshot_due(self, batch) -> bytes | None:
        # The state after THIS batch, committed in the same transaction as its rows.
        every = self.settings.snapshot_every
        if not every or batch.position is None or batch.position - self._last_snapshot < every:
            return None
        return snapshots.dump(self.state)

    async def _publish_outputs(self, batch) -> None:
        await publish_outputs(self.nc, self.ns, batch)

    async def _publish_watermark(self, heartbeat: bool = False) -> None:
        await publish_watermark(self.nc, self.ns, self.state.watermark, self.position, self.state.applied, heartbeat)

    async def _until_db(self, stop: asyncio.Event, fn):
        """Run a blocking database call in a thread, retrying while the database is down.

        Raises:
            DatabaseUnusable: the error is one no retry fixes (see :func:`~prorsa_tracker.db.is_permanent`).
        """
        delay = self.settings.db_retry_s
        while True:
            try:
                return await asyncio.to_thread(fn)
            except DBAPIError as exc:
                if is_permanent(exc):
                    raise DatabaseUnusable(
                        f"the database {shown_url(self.settings.db_url)} cannot be used: {error_line(exc)}") from None
                if not is_transient(exc) or stop.is_set():
                    raise
                self.db_retries += 1
                log.warning("tracker: database %s unavailable (%s); retrying in %.1fs",
                            shown_url(self.settings.db_url), error_line(exc), delay)
                try:
                    await asyncio.wait_for(stop.wait(), delay)
                except TimeoutError:
                    pass
                delay = min(delay * 2, 5.0)
