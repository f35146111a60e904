"""Dead letters: what a consumer does with a message it cannot handle.

A message that is not a valid event, that arrives on a subject its type does not belong
to, or that makes the service's handler fail is recorded here and then acknowledged (or
skipped, on an ordered consumer), so the service moves on: no message can stop a service
or make it crash-loop on its replay. The record keeps what an operator needs to find and
inspect the message: the subject, the stream sequence, the reason, the size, a SHA-256 of
the bytes and a bounded prefix of them.

Each record becomes one structured log line (``dead letter`` with the fields above; with
``PRORSA_*_LOG_JSON`` the fields are keys of the JSON line) and counts in
``prorsa_<service>_dead_letters_total{kind}`` on the service's metrics port. The tracker
also writes each one to its ``anomalies`` table with the whole message.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Literal

from prometheus_client.core import CounterMetricFamily

PREFIX_BYTES = 256
"""Bytes of the message kept in the log line (the size and the hash name the rest)."""

Kind = Literal["invalid", "subject", "conflict", "handler", "future"]
"""``invalid``: not a valid event; ``subject``: a valid event on a subject its type does not
belong to; ``conflict``: an id already applied with other content; ``handler``: a valid
event the service failed on; ``future``: a valid event (or watermark) stamped further ahead
of the consumer's clock than it accepts (:mod:`prorsa_runtime.clock`)."""


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message a consumer could not handle."""

    service: str
    kind: Kind
    subject: str | None
    seq: int | None
    reason: str
    size: int
    sha256: str
    prefix: str  # the first PREFIX_BYTES bytes, undecodable bytes escaped

    def fields(self) -> dict:
        return asdict(self)


def dead_letter(service: str, kind: Kind, subject: str | None, seq: int | None, data: bytes,
                reason: str) -> DeadLetter:
    """The record of one message (pure: no logging, no counting)."""
    data = bytes(data)
    head = data[:PREFIX_BYTES].decode("utf-8", "backslashreplace")
    return DeadLetter(service, kind, subject, seq, reason, len(data), hashlib.sha256(data).hexdigest(), head)


class DeadLetters:
    """Records, logs and counts a service's dead letters; a Prometheus collector too.

    ``register`` it on the service's registry (``registry.register(dead_letters)``); it
    exposes ``prorsa_<service>_dead_letters_total{kind}``.
    """

    def __init__(self, service: str, logger: logging.Logger | None = None, keep: int = 20) -> None:
        self.service = service
        self.log = logger or logging.getLogger(f"prorsa.{service}")
        self.counts: Counter[str] = Counter()
        self.recent: list[DeadLetter] = []
        self._keep = keep

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def record(self, kind: Kind, subject: str | None, seq: int | None, data: bytes, reason: str) -> DeadLetter:
        """Record, log (one WARNING line) and count one message; returns the record."""
        dl = dead_letter(self.service, kind, subject, seq, data, reason)
        self.counts[kind] += 1
        self.recent.append(dl)
        del self.recent[: -self._keep]
        self.log.warning(
            "dead letter (%s) subject=%s seq=%s size=%d sha256=%s: %s; first bytes: %r",
            kind, subject, seq, dl.size, dl.sha256, reason, dl.prefix[:80],
            extra={"fields": {"dead_letter": dl.fields()}},
        )
        return dl

    def collect(self):
        fam = CounterMetricFamily(f"prorsa_{self.service.replace('-', '_')}_dead_letters",
                                  "messages dead-lettered (acknowledged without being applied), by kind",
                                  labels=["kind"])
        for kind in ("invalid", "subject", "conflict", "handler", "future"):
            fam.add_metric([kind], self.counts.get(kind, 0))
        yield fam
