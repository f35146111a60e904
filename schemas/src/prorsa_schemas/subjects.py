"""Subject, stream and durable-consumer names: the only place they are spelt.

Services never build subjects from string literals; they ask a :class:`Namespace`. Tests
use a unique namespace per test so that many tests share one nats-server safely.

Layout (for the default prefix ``prorsa``)::

    prorsa.rollout.<type>          rollout events     e.g. prorsa.rollout.request.queued
    prorsa.engine.<type>           engine events      e.g. prorsa.engine.engine.stats
    prorsa.control.<type>          control events     e.g. prorsa.control.engine.command
    prorsa.tracker.transitions     canonical state transitions (tracker output)
    prorsa.tracker.watermark       event-time watermark / heartbeat (tracker -> forecaster, allocator)
    prorsa.tracker.anomalies       anomaly notices (tracker output)

docs/asyncapi.yaml describes every subject (``prorsa schema --asyncapi``).

Run and engine ids are deliberately NOT subject tokens: the contract allows characters in
them (``.``, ``*``, ``>``, spaces) that are special in NATS subjects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .events import CONTROL_TYPES, ENGINE_TYPES, EVENT_TYPES, ROLLOUT_TYPES, Event

_TOKEN = re.compile(r"^[A-Za-z0-9_-]+$")
_STREAM = re.compile(r"^[A-Za-z0-9_-]{1,32}$")


def category(event_type: str) -> str:
    """``rollout``, ``engine`` or ``control`` for a contract event type."""
    if event_type in ROLLOUT_TYPES:
        return "rollout"
    if event_type in ENGINE_TYPES:
        return "engine"
    if event_type in CONTROL_TYPES:
        return "control"
    raise ValueError(f"unknown event type {event_type!r}")


@dataclass(frozen=True)
class Namespace:
    """A subject prefix and the JetStream stream that captures it."""

    prefix: str = "prorsa"
    stream: str = "PRORSA"

    def __post_init__(self) -> None:
        if not all(_TOKEN.match(tok) for tok in self.prefix.split(".")):
            raise ValueError(
                f"subject prefix {self.prefix!r} must be dot-separated tokens of [A-Za-z0-9_-]"
            )
        if not _STREAM.match(self.stream):
            raise ValueError(f"stream name {self.stream!r} must be 1..32 of [A-Za-z0-9_-]")

    # -- the stream ---------------------------------------------------------------
    def stream_subjects(self) -> list[str]:
        return [f"{self.prefix}.>"]

    # -- contract events ---------------------------------------------------------
    def subject_for_type(self, event_type: str) -> str:
        return f"{self.prefix}.{category(event_type)}.{event_type}"

    def subject_for(self, event: Event) -> str:
        return self.subject_for_type(event.type)

    def subject_mismatch(self, event_type: str, subject: str) -> str | None:
        """None when ``subject`` is where ``event_type`` events are published, else why not.

        Consumers reject an event whose subject and type disagree (an ``engine.command``
        published on a rollout subject is no command): the subject is what NATS
        permissions are granted on, so only the agreement of the two makes them mean
        anything.
        """
        expected = self.subject_for_type(event_type)
        if subject == expected:
            return None
        return (f"event of type {event_type} on subject {subject!r}: events of that type are published on "
                f"{expected!r}; not applied")

    def rollout_all(self) -> str:
        return f"{self.prefix}.rollout.>"

    def engine_all(self) -> str:
        return f"{self.prefix}.engine.>"

    def control_all(self) -> str:
        return f"{self.prefix}.control.>"

    def commands(self) -> str:
        return self.subject_for_type("engine.command")

    def forecasts(self) -> str:
        return self.subject_for_type("forecast.window")

    def plans(self) -> str:
        return self.subject_for_type("allocation.plan")

    # -- internal service subjects ---------------------------------------------------
    def transitions(self) -> str:
        return f"{self.prefix}.tracker.transitions"

    def watermark(self) -> str:
        return f"{self.prefix}.tracker.watermark"

    def anomalies(self) -> str:
        return f"{self.prefix}.tracker.anomalies"

    def invalid(self) -> str:
        """A rollout subject of no event type: tests publish bytes that are no event here
        (every consumer of ``rollout_all()`` dead-letters them)."""
        return f"{self.prefix}.rollout.invalid"

    # -- durable consumers ------------------------------------------------------------
    def durable(self, service: str, instance: str = "") -> str:
        name = f"{self.stream.lower()}-{service}" + (f"-{instance}" if instance else "")
        if not _TOKEN.match(name):
            raise ValueError(f"durable name {name!r} must be of [A-Za-z0-9_-]")
        return name


DEFAULT = Namespace()

assert all(DEFAULT.subject_for_type(t) for t in EVENT_TYPES)
