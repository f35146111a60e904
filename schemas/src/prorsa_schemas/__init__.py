"""Prorsa event contract v1 (docs/contract.md): models, subjects and codec. No I/O."""

from .codec import (
    DEFAULT_MAX_LINE_BYTES,
    LogLine,
    LogWriter,
    decode_event,
    decode_message,
    encode_event,
    event_from_dict,
    iter_events,
    read_log,
)
from .errors import EventError, SubjectMismatch, Violation
from .envelope import CONTRACT_VERSION, MAX_TOKENS, Event
from .events import *  # noqa: F403
from .events import CONTROL_TYPES, ENGINE_TYPES, EVENT_TYPES, ROLLOUT_TYPES, AnyEvent
from .subjects import DEFAULT, Namespace, category

__all__ = [
    "AnyEvent",
    "CONTRACT_VERSION",
    "CONTROL_TYPES",
    "DEFAULT",
    "DEFAULT_MAX_LINE_BYTES",
    "ENGINE_TYPES",
    "EVENT_TYPES",
    "Event",
    "EventError",
    "LogLine",
    "LogWriter",
    "MAX_TOKENS",
    "Namespace",
    "ROLLOUT_TYPES",
    "SubjectMismatch",
    "Violation",
    "category",
    "decode_event",
    "decode_message",
    "encode_event",
    "event_from_dict",
    "iter_events",
    "read_log",
] + [cls.__name__ for cls in EVENT_TYPES.values()]
