"""How every service reads the stream: an ordered *pull* consumer with flow control.

Why pull, and why not nats-py's ordered push consumer:

* **Bounded pending.** The server sends only what a pull request asked for, and the reader
  asks only while fewer than ``max_pending`` messages are requested or handed to the
  service and not yet released (:meth:`OrderedReader.release`). A busy service stops
  asking instead of being cut by the server as a slow consumer, and nothing buffers
  without bound on either side.
* **No silent loss.** nats-py (2.16) checks an ordered push consumer's sequence *before* it
  queues a message for the callback, then drops the message when the client-side queue is
  full (``pending_msgs_limit`` / ``pending_bytes_limit``): the consumer's position has
  already moved past it, so the message is lost without a gap ever being seen. Here every
  message is checked where it is handed over: its consumer sequence must follow the
  previous one's, an idle heartbeat's ``Nats-Last-Consumer`` must not be ahead of the last
  message handed over, and a drop that nats-py reports (``SlowConsumerError``, through
  :func:`~prorsa_runtime.bus.connect`'s error handler) counts at once. Any discontinuity re-creates the consumer from the stream
  sequence after the last message handed over.
* **Heartbeats and reconnects.** Each pull request carries an idle heartbeat; when nothing
  (message, heartbeat or status) arrives for two heartbeats while a request is open, after
  a reconnect, or when the server says the consumer is gone (deleted, a leader change,
  removed for inactivity), the consumer is re-created from the same place, retrying with
  back-off for as long as it takes. The reader never ends the service.

The consumer is named (``Namespace.durable(...)``, so that a permission can name it), has
no acks (``AckPolicy.NONE``: the service's own position is the durable one), lives in
memory on one server (it is re-created whenever it is lost) and is removed by the server
after ``inactive_s`` without a pull request. Backlog figures come from the server's
consumer info (``num_pending``), refreshed every ``info_every_s``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy

from prorsa_schemas import Namespace

from .bus import DROPPED_HOOK
from .consumers import (GONE_STATUSES, LAST_CONSUMER_HEADER, ORDERED_INACTIVE_S, PENDING_MSGS_HEADER,
                        STATUS_HEADER, ack_sequences, delete_consumer)
from .redact import mask_secrets

log = logging.getLogger("prorsa.bus")

class OrderedReader:
    """An ordered pull consumer named ``name`` over ``subjects``, from ``start_seq``.

    ``on_msg(msg, stream_seq)`` is called for every message, in stream order, exactly once
    per reader (never with a sequence at or below one it was already given). The service
    calls :meth:`release` with the number of messages it has finished with; at most
    ``max_pending`` messages are ever requested or handed over and not yet released.

    Args:
        js: the JetStream context of the service's connection.
        ns: the namespace (its stream).
        name: the consumer name (``ns.durable(service)``).
        subjects: the filter subjects; one goes in the create request's subject, where a
            permission can pin it.
        on_msg: called synchronously with each message and its stream sequence.
        start_seq: the first stream sequence wanted (1: from the start).
        max_pending: most messages requested or handed over and not yet released.
        batch: most messages per pull request (default: a quarter of ``max_pending``).
        heartbeat_s: the idle heartbeat asked for in each pull request.
        expires_s: how long a pull request stays open.
        info_every_s: how often the consumer info (the backlog) is read; 0: never.
        pending_msgs_limit / pending_bytes_limit: the client-side queue of the delivery
            subscription (0: unbounded; the pull credit bounds it). Tests set them tiny.
    """

    def __init__(
        self,
        js: JetStreamContext,
        ns: Namespace,
        name: str,
        subjects: list[str],
        on_msg: Callable[[Msg, int], None],
        *,
        start_seq: int = 1,
        max_pending: int = 10_000,
        batch: int | None = None,
        heartbeat_s: float = 2.0,
        expires_s: float = 30.0,
        info_every_s: float = 5.0,
        inactive_s: float = ORDERED_INACTIVE_S,
        pending_msgs_limit: int = 0,
        pending_bytes_limit: int = 0,
    ) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be at least 1, got {max_pending}")
        if not subjects:
            raise ValueError("an OrderedReader needs at least one subject")
        if not 0 < heartbeat_s < expires_s / 2:
            raise ValueError(f"heartbeat_s ({heartbeat_s}) must be above 0 and under half of expires_s ({expires_s})")
        self.js = js
        self.nc: NATS = js._nc
        self.ns = ns
        self.name = name
        self.subjects = list(subjects)
        self.on_msg = on_msg
        self.max_pending = max_pending
        self.batch = max(1, min(batch or max(1, max_pending // 4), max_pending))
        self.heartbeat_s = heartbeat_s
        self.expires_s = expires_s
        self.info_every_s = info_every_s
        self.inactive_s = inactive_s
        self.pending_msgs_limit = pending_msgs_limit
        self.pending_bytes_limit = pending_bytes_limit
        self.last_seq = start_seq - 1  # the last stream sequence handed over
        # What a monitor reads.
        self.delivered = 0  # messages handed over
        self.resets = 0  # consumers re-created
        self.gaps = 0  # discontinuities seen (each caused a reset)
        self.last_reset_reason = ""
        self.num_pending: int | None = None  # the server's backlog at the last info read
        self.num_ack_pending: int | None = None
        self.in_transit = 0  # delivered by the server, not yet handed over, at the last info read
        self.info: ConsumerInfo | None = None
        # Flow control.
        self._unreleased = 0  # handed over, not yet released
        self._requested = 0  # asked for by open pull requests, not yet delivered
        self._dseq = 0  # consumer sequence of the last message of this incarnation
        self._cut: tuple[int, int] | None = None  # (consumer, stream) seq of the first message the client dropped
        self._gen = 0
        self._sub = None
        self._inbox = ""
        self._req = 0
        self._activity = 0  # bumped by everything the delivery subscription receives
        self._reconnects = 0
        self._resetting = False
        self._closed = False
        self._tasks: set[asyncio.Task] = set()
        self._watchdog: asyncio.Task | None = None
        self._info_task: asyncio.Task | None = None

    # -- life cycle --------------------------------------------------------------------

    async def start(self) -> "OrderedReader":
        """Create the consumer and ask for the first messages.

        Raises whatever the server answers to the first creation (a permission refused, no
        JetStream): a misconfiguration should stop the service at start, not be retried.
        """
        self._reconnects = self.nc.stats.get("reconnects", 0)
        await self._create()
        self._top_up()
        self._watchdog = asyncio.ensure_future(self._watch())
        if self.info_every_s > 0:
            self._info_task = asyncio.ensure_future(self._read_info_loop())
        return self

    async def stop(self, delete: bool = True) -> None:
        """Stop asking for messages; delete the consumer (best effort) unless ``delete`` is False."""
        self._closed = True
        self._gen += 1
        for t in (self._watchdog, self._info_task, *self._tasks):
            if t is not None:
                t.cancel()
        await self._unsubscribe()
        if delete and self.nc.is_connected:
            try:
                await asyncio.wait_for(delete_consumer(self.js, self.ns, self.name), 2.0)
            except Exception as exc:  # noqa: BLE001 - the server removes it after inactive_s anyway
                log.debug("deleting consumer %s: %r", self.name, exc)

    def release(self, n: int = 1) -> None:
        """The service has finished with ``n`` more messages: room for as many more."""
        self._unreleased = max(0, self._unreleased - n)
        self._top_up()

    @property
    def unreleased(self) -> int:
        """Messages handed over and not yet released."""
        return self._unreleased

    def backlog(self) -> int | None:
        """Messages not yet finished with: at the last info read, the server's
        ``num_pending`` (not yet delivered) + ``num_ack_pending`` + those delivered and not yet
        handed over (its ``delivered.consumer_seq`` minus the last one handed over); plus
        those handed over and not released now (None before the first read)."""
        if self.num_pending is None:
            return None
        return self.num_pending + (self.num_ack_pending or 0) + self.in_transit + self._unreleased

    # -- the consumer ------------------------------------------------------------------

    def _config(self) -> ConsumerConfig:
        start = self.last_seq + 1
        one = len(self.subjects) == 1
        return ConsumerConfig(
            name=self.name,
            ack_policy=AckPolicy.NONE,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start > 1 else DeliverPolicy.ALL,
            opt_start_seq=start if start > 1 else None,
            filter_subject=self.subjects[0] if one else None,
            filter_subjects=None if one else self.subjects,
            inactive_threshold=self.inactive_s,
            mem_storage=True,
            num_replicas=1,
        )

    async def _create(self) -> None:
        await self._unsubscribe()
        # A consumer's start cannot be updated: delete what an earlier incarnation (or a
        # crashed process) left under this name, then create it afresh.
        await delete_consumer(self.js, self.ns, self.name)
        await self.js.add_consumer(self.ns.stream, self._config())
        self._gen += 1
        gen = self._gen
        self._dseq = 0
        self._cut = None
        self._requested = 0
        self._inbox = self.nc.new_inbox()
        self._sub = sub = await self.nc.subscribe(
            f"{self._inbox}.*", cb=self._callback(gen),
            pending_msgs_limit=self.pending_msgs_limit, pending_bytes_limit=self.pending_bytes_limit,
        )
        # connect()'s error handler calls this when nats-py drops one of our messages.
        setattr(sub, DROPPED_HOOK, lambda exc: self._dropped(gen, exc))

    async def _unsubscribe(self) -> None:
        sub, self._sub = self._sub, None
        if sub is not None:
            try:
                await sub.unsubscribe()
            except Exception as exc:  # noqa: BLE001 - the connection may be down
                log.debug("unsubscribe: %r", exc)

    def _callback(self, gen: int):
        async def cb(msg: Msg) -> None:
            if gen != self._gen:  # an earlier incarnation's
                return
            self._activity += 1
            reply = msg.reply
            if not reply:
                self._status(msg)
                return
            sseq, dseq = ack_sequences(reply)
            self._requested -= 1
            if dseq != self._dseq + 1:
                if dseq > self._dseq:
                    self._gap(f"consumer sequence {dseq} after {self._dseq} (a message was dropped)")
                return  # at or below: a copy already handed over
            self._dseq = dseq
            if sseq <= self.last_seq:
                return
            self.last_seq = sseq
            self._unreleased += 1
            self.delivered += 1
            self.on_msg(msg, sseq)
            if self._cut is not None and dseq >= self._cut[0] - 1:
                self._cut_reached()
                return
            if self._requested < self.batch // 2 + 1:
                self._top_up()

        return cb

    def _status(self, msg: Msg) -> None:
        hdr = msg.headers or {}
        code = hdr.get(STATUS_HEADER, "")
        desc = str(hdr.get("Description", ""))
        if code == "100":  # idle heartbeat
            last = hdr.get(LAST_CONSUMER_HEADER)
            if last is not None and int(last) > self._dseq:
                self._gap(f"heartbeat says the consumer delivered {last}, the last handed over is {self._dseq}")
            return
        pending = hdr.get(PENDING_MSGS_HEADER)
        if code in ("408", "404") or (code == "409" and pending is not None and not desc.startswith(GONE_STATUSES)):
            # A request ended (expired, or a server limit) with this many messages unsent.
            self._requested = max(0, self._requested - int(pending or 0)) if pending is not None else 0
            self._top_up()
            return
        self._trigger(f"the server answered {code} {desc}".strip())

    def _dropped(self, gen: int, exc) -> None:
        if gen != self._gen:
            return
        if not exc.reply:  # a heartbeat or status: the stall check covers what it said
            return
        sseq, dseq = ack_sequences(exc.reply)
        # The messages queued before the dropped one are intact: hand them over first, then
        # re-create the consumer from the stream sequence after the last of them.
        if self._cut is None or dseq < self._cut[0]:
            self._cut = (dseq, sseq)
        if self._dseq >= self._cut[0] - 1:
            self._cut_reached()

    def _cut_reached(self) -> None:
        dseq, sseq = self._cut or (0, 0)
        self._gap(f"the client dropped stream seq {sseq} (consumer seq {dseq}): its queue was full")

    def _gap(self, why: str) -> None:
        self.gaps += 1
        self._trigger(why)

    # -- flow control --------------------------------------------------------------------

    def _top_up(self) -> None:
        if self._resetting or self._closed or self._sub is None:
            return
        room = self.max_pending - self._unreleased - self._requested
        while room >= min(self.batch, max(1, self.max_pending // 2)) or (room > 0 and self._requested == 0):
            n = min(room, self.batch)
            self._requested += n
            room -= n
            self._req += 1
            body = json.dumps({"batch": n, "expires": int(self.expires_s * 1e9),
                               "idle_heartbeat": int(self.heartbeat_s * 1e9)}).encode()
            self._spawn(self._send(body, f"{self._inbox}.{self._req}", self._gen))

    async def _send(self, body: bytes, reply: str, gen: int) -> None:
        if gen != self._gen:
            return
        try:
            await self.nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{self.ns.stream}.{self.name}", body, reply=reply)
        except Exception as exc:  # noqa: BLE001 - disconnected: the watchdog re-creates the consumer
            log.debug("pull request not sent: %r", exc)

    # -- recovery ----------------------------------------------------------------------

    def _trigger(self, why: str) -> None:
        if self._resetting or self._closed:
            return
        self._resetting = True
        self._gen += 1  # whatever the old incarnation still delivers is ignored
        self._spawn(self._reset(why))

    async def _reset(self, why: str) -> None:
        self.resets += 1
        self.last_reset_reason = why
        log.warning("consumer %s: %s; re-creating it after stream seq %d", self.name, why, self.last_seq)
        delay = 0.1
        try:
            while not self._closed:
                try:
                    await self._create()
                    break
                except Exception as exc:  # noqa: BLE001 - the server may be away or electing a leader
                    log.warning("consumer %s: re-creating failed (%s); retrying in %.1fs",
                                self.name, mask_secrets(repr(exc)), delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
        finally:
            self._resetting = False
        self._top_up()

    async def _watch(self) -> None:
        seen, quiet = self._activity, 0.0
        tick = self.heartbeat_s / 2
        while not self._closed:
            await asyncio.sleep(tick)
            reconnects = self.nc.stats.get("reconnects", 0)
            if reconnects != self._reconnects:
                self._reconnects = reconnects
                self._trigger("reconnected to the server")
                continue
            if self._activity != seen or self._requested <= 0 or self._resetting:
                seen, quiet = self._activity, 0.0
                continue
            quiet += tick
            if quiet >= 2 * self.heartbeat_s + tick:
                quiet = 0.0
                self._trigger(f"no message or heartbeat for {2 * self.heartbeat_s:g}s")

    async def read_info(self) -> ConsumerInfo | None:
        """Read the consumer info now (the backlog gauges read what this stores)."""
        try:
            info = await self.js.consumer_info(self.ns.stream, self.name, timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - being re-created, or the server is away
            log.debug("consumer info %s: %r", self.name, exc)
            return None
        self.info = info
        self.num_pending = info.num_pending
        self.num_ack_pending = info.num_ack_pending
        # Delivered by the server but not yet handed over (on the wire, in nats-py's queue):
        # neither num_pending nor the service counts them.
        delivered = info.delivered.consumer_seq if info.delivered else None
        self.in_transit = max(0, delivered - self._dseq) if delivered is not None and not self._resetting else 0
        return info

    async def _read_info_loop(self) -> None:
        while not self._closed:
            await self.read_info()
            await asyncio.sleep(self.info_every_s)

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._tasks.discard)
