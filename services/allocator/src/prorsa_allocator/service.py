"""The allocator service: the thin I/O shell around :class:`~prorsa_allocator.planner.Allocator`.

* It reads the engine and control events and, of the rollout events, ``policy.updated``
  (the weight-update pause and the step's opening it opens) and ``run.started`` (a run's
  mode, which decides the 'auto' objective): :func:`allocator_subjects`.
* On start it replays those events (an ordered pull consumer from
  the first message, :class:`~prorsa_runtime.reader.OrderedReader`: at most ``max_pending``
  messages requested or queued, none ever skipped, re-created after a gap, a missed
  heartbeat or a reconnect) to rebuild the engine table and the commands in flight; events up to the
  stream's last sequence at start are folded in without acting (``act=False``), so a
  restarted allocator never re-issues a plan or a command.
* Live, each engine event, forecast and command echo goes through ``Allocator.handle``; the
  plans and commands it returns are published through a :class:`ReliablePublisher` (one
  ordering lane, event ids derived from the forecast id, so a re-send is de-duplicated).
* Deadlines expire on event time: every event advances it, and so does the tracker's
  watermark (``ns.watermark()``, core NATS, ``{"ts": ...}``), so a command whose engine went
  silent is retried or abandoned even when no other event arrives. Watermarks are ignored
  until the replay has caught up (the table is not complete before).
* A message it cannot handle (not a valid event, on a subject its type does not belong to,
  one stamped more than ``max_clock_ahead_s`` ahead of this host's clock, which would
  expire every deadline at once: :mod:`prorsa_runtime.clock`, or one the planner fails on)
  and a malformed or future watermark are dead-lettered
  (:mod:`prorsa_runtime.deadletter`: a log line with subject, stream sequence, reason, size
  and hash; ``prorsa_allocator_dead_letters_total{kind}``) and skipped; nothing a message
  holds stops the service or its replay after a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field


from prorsa_runtime import ReliablePublisher, connect, open_stream
from prorsa_runtime.clock import ahead_of_clock
from prorsa_runtime.reader import OrderedReader
from prorsa_runtime.deadletter import DeadLetters
from prorsa_schemas import (
    AllocationPlan, EngineCommand, Event, EventError, Namespace, SubjectMismatch, decode_event,
    decode_message,
)

from .planner import Allocator
from .settings import AllocatorSettings

log = logging.getLogger("prorsa.allocator.service")

_LANE = "allocator"  # one ordering key: a plan precedes its commands in the stream


def allocator_subjects(ns: Namespace) -> list[str]:
    """What the allocator reads: every engine and control event, ``policy.updated`` and
    ``run.started``."""
    return [ns.engine_all(), ns.control_all(), ns.subject_for_type("policy.updated"),
            ns.subject_for_type("run.started")]


@dataclass
class ServiceState:
    """What the running service exposes to its health check, metrics and tests."""

    allocator: Allocator
    replay_until: int = 0
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    processed: int = 0
    invalid: int = 0
    published: int = 0
    last_invalid: str = ""
    plans: list[AllocationPlan] = field(default_factory=list)
    watermarks: int = 0
    """Tracker watermarks applied (event time advanced without an event)."""
    watermark_ts: float | None = None
    dead_letters: DeadLetters = field(default_factory=lambda: DeadLetters("allocator", log))
    reader: OrderedReader | None = None
    """The consumer (its backlog figures feed the metrics)."""

    def health(self) -> tuple[bool, dict]:
        a = self.allocator
        return self.caught_up.is_set(), {
            "caught_up": self.caught_up.is_set(),
            "engines": len(a.table.engines),
            "commands_in_flight": len(a.table.commands),
            "processed": self.processed,
            "invalid": self.invalid,
            "event_time": a.now,
            "watermarks": self.watermarks,
            "dead_letters": self.dead_letters.total,
            **a.counters.__dict__,
        }


@dataclass(frozen=True, slots=True)
class _Watermark:
    data: bytes
    subject: str


class AllocatorService:
    """Consume engine and control events, publish allocation plans and engine commands."""

    def __init__(self, settings: AllocatorSettings, allocator: Allocator | None = None):
        self.settings = settings
        self.ns: Namespace = settings.namespace()
        self.state = ServiceState(allocator or Allocator(settings.allocator_config()))
        self._queue: asyncio.Queue = asyncio.Queue()
        self.clock = time.time  # the host's clock, which no event's ts may run too far ahead of

    async def run(self, stack: AsyncExitStack, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (the shape :func:`run_until_stopped` expects)."""
        s = self.settings
        nc = await connect(s.nats_url, "prorsa-allocator", credentials=s.credentials())
        stack.push_async_callback(nc.close)
        js = nc.jetstream()
        await open_stream(js, self.ns, s.nats_url, s.credentials())
        pub = ReliablePublisher(s.nats_url, "prorsa-allocator-pub", self.ns, credentials=s.credentials())
        await pub.start()
        stack.push_async_callback(pub.close)
        if not self.state.allocator.config.actuate:
            log.warning("advisory mode (actuate=false): plans are published and logged, no engine is switched")
        info = await js.stream_info(self.ns.stream)
        self.state.replay_until = info.state.last_seq
        if self.state.replay_until == 0:
            self.state.caught_up.set()

        def on_msg(msg, seq: int) -> None:
            self._queue.put_nowait(msg)

        async def on_watermark(msg) -> None:
            # Through the same queue: a watermark is applied in order with the events.
            self._queue.put_nowait(_Watermark(msg.data, msg.subject))

        # One ordered consumer over the subjects keeps their relative stream order (a
        # command is always folded in before the engine.switched that answers it). Of the
        # rollout events only policy.updated: it opens the weight-update pause (a switch
        # then needs no drain) and the step's opening the allocator holds through; and
        # run.started, whose mode decides the 'auto' objective.
        # At most max_pending messages are requested or queued here and not yet handled.
        self.reader = await OrderedReader(
            js, self.ns, self.ns.durable("allocator"), allocator_subjects(self.ns), on_msg,
            max_pending=s.max_pending,
        ).start()
        self.state.reader = self.reader
        stack.push_async_callback(self.reader.stop)
        wm_sub = await nc.subscribe(self.ns.watermark(), cb=on_watermark)
        stack.push_async_callback(wm_sub.unsubscribe)
        log.info(
            "allocator on %s (stream %s): replaying %d stream messages, then acting",
            s.nats_url, self.ns.stream, self.state.replay_until,
        )
        stopper = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                getter = asyncio.create_task(self._queue.get())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    break
                msg = getter.result()
                if isinstance(msg, _Watermark):
                    self._watermark(msg.data, pub, msg.subject)
                else:
                    try:
                        self._process(msg.data, msg.metadata.sequence.stream, pub, msg.subject)
                    finally:
                        self.reader.release()
        finally:
            stopper.cancel()

    def _watermark(self, data: bytes, pub: ReliablePublisher, subject: str | None = None) -> None:
        """Apply one tracker watermark: advance event time, publish the retries it causes."""
        st = self.state
        try:
            ts = json.loads(data)["ts"]
            if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts)):
                raise ValueError(f"ts must be a finite number or null, got {ts!r}")
        except Exception as exc:  # noqa: BLE001 - any bad watermark (even JSON nested too deep) is skipped
            st.invalid += 1
            reason = f"invalid watermark: {str(exc)[:200] or type(exc).__name__}"
            st.last_invalid = reason
            st.dead_letters.record("invalid", subject, None, data, reason)
            return
        future = None if ts is None else ahead_of_clock(float(ts), self.clock(), self.settings.max_clock_ahead_s)
        if future is not None:
            st.invalid += 1
            st.last_invalid = f"watermark {future}"
            st.dead_letters.record("future", subject, None, data, st.last_invalid)
            return
        if ts is None or not st.caught_up.is_set():
            return  # no event yet, or the replay is not complete: nothing to expire against
        st.watermarks += 1
        st.watermark_ts = float(ts)
        try:
            out = st.allocator.advance(float(ts))
        except Exception:  # a bug must not stop the control loop
            log.exception("allocator failed on watermark %s", ts)
            return
        self._publish(out, pub)

    def _process(self, data: bytes, seq: int, pub: ReliablePublisher, subject: str | None = None) -> None:
        st = self.state
        act = seq > st.replay_until
        if act and not st.caught_up.is_set():
            st.caught_up.set()
            log.info("caught up at stream sequence %d: %d engines, %d commands in flight",
                     seq, len(st.allocator.table.engines), len(st.allocator.table.commands))
        if seq == st.replay_until:  # the last message of the replay, whatever it holds
            st.caught_up.set()
        try:
            event = decode_message(data, subject, self.ns) if subject is not None else decode_event(data)
        except SubjectMismatch as exc:
            st.invalid += 1
            st.last_invalid = exc.reason
            st.dead_letters.record("subject", subject, seq, data, exc.reason)
            return
        except EventError as exc:
            st.invalid += 1
            st.last_invalid = exc.reason
            st.dead_letters.record("invalid", subject, seq, data, exc.reason)
            return
        future = ahead_of_clock(event.ts, self.clock(), self.settings.max_clock_ahead_s)
        if future is not None:
            st.invalid += 1
            st.last_invalid = future
            st.dead_letters.record("future", subject, seq, data, future)
            return
        st.processed += 1
        self._publish(self._handle(event, act, data, seq, subject), pub)

    def _publish(self, out: list[Event], pub: ReliablePublisher) -> None:
        st = self.state
        for ev in out:
            pub.submit(ev, key=_LANE)
            st.published += 1
            if isinstance(ev, AllocationPlan):
                st.plans.append(ev)
                del st.plans[:-100]
                d = st.allocator.last_decision
                d = d if d is not None and d.t == ev.t else None  # the decision behind this plan
                why = (d.selection.reason if d.selection is not None else d.skipped) if d is not None else ""
                at = " at the weight update" if d is not None and d.at_update else ""
                advised = not st.allocator.config.actuate
                moves = ", ".join(f"{m.engine} -> {m.to_role}" for m in ev.switches or [])
                log.info("%s t=%s%s: %d prefill : %d decode, delta=%.3f, feasible=%s, %d switches%s%s",
                         "advice (not commanded)" if advised else "plan", ev.t, at, ev.n_prefill, ev.n_decode,
                         ev.delta, ev.feasible, len(ev.switches or []), f" [{moves}]" if advised and moves else "",
                         f" ({why})" if why else "")
            elif isinstance(ev, EngineCommand):
                log.info("command %s: %s -> %s by %.1f", ev.cmd, ev.engine, ev.to_role, ev.deadline)

    def _handle(self, event: Event, act: bool, data: bytes = b"", seq: int | None = None,
                subject: str | None = None) -> list[Event]:
        try:
            return self.state.allocator.handle(event, act=act)
        except Exception as exc:  # a bug must not stop the control loop; the event is dead-lettered
            log.exception("allocator failed on %s %s; event skipped", event.type, event.id)
            self.state.dead_letters.record("handler", subject, seq, data, f"the allocator failed on it: {exc!r}")
            return []
