"""Bytes <-> event, and streaming JSONL / .jsonl.gz event logs.

A log is read one line at a time, so a multi-GB file never sits in memory; a line longer
than ``max_line_bytes`` is reported and skipped without being read into memory whole.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import from_json

from .errors import MISSING, EventError, SubjectMismatch, Violation
from .events import AnyEvent, Event
from .subjects import Namespace

_ADAPTER: TypeAdapter[Event] = TypeAdapter(AnyEvent)

DEFAULT_MAX_LINE_BYTES = 1 << 20
"""The longest line a log reader accepts (1 MiB): no contract event comes near it."""


def decode_event(data: bytes | str, max_bytes: int = DEFAULT_MAX_LINE_BYTES, strict_fields: bool = False) -> Event:
    """Parse and validate one event. Never raises anything but :class:`EventError`.

    A field the event's type does not name is not an error (EVENTS.md, forward
    compatibility): it is kept on the event (``model_extra``; ``encode_event`` writes it
    back). ``strict_fields`` (the strict validation mode of ``prorsa validate --strict``)
    reports such fields as violations instead.

    Any failure of the parser or the validator (a JSON nested thousands deep, bytes that
    are not UTF-8, input over ``max_bytes``, a MemoryError, a bug) becomes an
    ``EventError`` with a reason, so one bad message cannot take a consumer down.

    Raises:
        EventError: with a reason naming the field, its value and the rule it broke.
    """
    if not isinstance(data, (bytes, bytearray, str)):
        raise EventError.single(f"an event must be bytes or text, not {type(data).__name__}")
    if len(data) > max_bytes:
        raise EventError.single(f"event is {len(data)} bytes, longer than the limit of {max_bytes} bytes")
    try:
        event = _ADAPTER.validate_json(data, strict=True)
        if "v" not in event.model_fields_set:
            raise EventError([_MISSING_V])
        if strict_fields:
            extra = unknown_fields(event)
            if extra:
                raise EventError([Violation(f, MISSING, "is not a field of this event type") for f in extra])
        return event
    except EventError:
        raise
    except ValidationError as exc:
        failure: ValidationError | BaseException = exc
    except Exception as exc:  # noqa: BLE001 - RecursionError, MemoryError, ...: any failure is a reason
        failure = exc
    if isinstance(failure, ValidationError):
        try:
            obj = _peek(data)
            error = _with_missing_v(EventError.from_validation(failure, raw_type=_type_of(obj)), obj)
        except Exception as exc:  # noqa: BLE001 - describing the error failed (e.g. a repr too deep)
            error = _undecodable(exc)
    else:
        error = _undecodable(failure)
    raise error from None


def unknown_fields(model: BaseModel, prefix: str = "") -> list[str]:
    """Paths of the fields ``model`` (an event, or an object inside one) carries that its
    type does not name, e.g. ``["colour", "switches[0].weight"]``."""
    out = [f"{prefix}{k}" for k in (model.model_extra or {})]
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out += unknown_fields(value, f"{prefix}{name}.")
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    out += unknown_fields(item, f"{prefix}{name}[{i}].")
    return out


def decode_message(data: bytes | str, subject: str, ns: Namespace) -> Event:
    """Decode one bus message and check that its subject is where its type belongs.

    Raises:
        SubjectMismatch: a valid event on another type's subject (``.event`` holds it).
        EventError: the bytes are not a valid event.
    """
    event = decode_event(data)
    why = ns.subject_mismatch(event.type, subject)
    if why is not None:
        raise SubjectMismatch(why, event)
    return event


def _undecodable(exc: BaseException) -> EventError:
    """The reason for an input the parser or validator could not even judge."""
    if isinstance(exc, RecursionError):
        return EventError.single("not valid JSON (nested too deeply to parse)")
    if isinstance(exc, MemoryError):
        return EventError.single("cannot be decoded: out of memory while parsing it")
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return EventError.single(f"cannot be decoded ({type(exc).__name__}{': ' + text if text else ''})")


def event_from_dict(obj: dict) -> Event:
    """Validate an already-parsed JSON object (strict, like :func:`decode_event`; ``v``
    must be present)."""
    try:
        event = _ADAPTER.validate_python(obj, strict=True)
        if "v" not in event.model_fields_set:
            raise EventError([_MISSING_V])
        return event
    except EventError:
        raise
    except ValidationError as exc:
        try:
            error = _with_missing_v(EventError.from_validation(exc, raw_type=_type_of(obj)), obj)
        except Exception as inner:  # noqa: BLE001
            error = _undecodable(inner)
    except Exception as exc:  # noqa: BLE001
        error = _undecodable(exc)
    raise error from None


def encode_event(event: Event) -> bytes:
    """Compact JSON of an event, carrying only the fields that are set."""
    return event.model_dump_json(exclude_none=True).encode()


_MISSING_V = Violation(
    "v", MISSING, "is required but missing (the contract version, 1, is an envelope field of every event)")
"""The models default ``v`` to 1 for events built in Python; on the wire (bytes, parsed
JSON) it is a required envelope field (EVENTS.md), checked here."""


def _peek(data: bytes | str) -> object:
    # pydantic-core's parser: bounded recursion (a ValueError, not a RecursionError).
    try:
        return from_json(data)
    except Exception:  # noqa: BLE001 - nothing to look at
        return None


def _type_of(obj: object) -> str | None:
    tag = obj.get("type") if isinstance(obj, dict) else None
    return tag if isinstance(tag, str) else None


def _with_missing_v(error: EventError, obj: object) -> EventError:
    """``error`` plus the missing-``v`` violation when ``obj`` is an object without ``v``
    (validation passes over it: the models default it for Python callers)."""
    if isinstance(obj, dict) and "v" not in obj:
        return EventError([_MISSING_V, *error.violations])
    return error


@dataclass(frozen=True, slots=True)
class LogLine:
    """One non-blank line of a log: its 1-based number, raw bytes, and event or error."""

    lineno: int
    raw: bytes
    event: Event | None
    error: EventError | None

    @property
    def ok(self) -> bool:
        return self.error is None


def _is_gzip(path: Path) -> bool:
    with open(path, "rb") as fh:
        return fh.read(2) == b"\x1f\x8b"


def open_log_binary(path: str | os.PathLike) -> BinaryIO:
    """Open a log for reading bytes, decompressing gzip (detected by its magic bytes)."""
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"event log not found: {p}")
    if p.is_dir():
        raise IsADirectoryError(f"event log is a directory: {p}")
    if _is_gzip(p):
        return gzip.open(p, "rb")  # type: ignore[return-value]
    return open(p, "rb")


TRUNCATED = "log is truncated or corrupt"
"""How the reason of a line :func:`iter_raw_lines` could not read begins when the stream
broke there (a truncated gzip, corrupt deflate data): the log ends early."""


def iter_raw_lines(
    fh: BinaryIO, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[tuple[int, bytes | None, EventError | None]]:
    """Yield ``(lineno, raw, error)`` for every non-blank line of a byte stream.

    ``raw`` is None when the line could not be read (too long, or the stream broke); the
    error says why. A broken stream (truncated gzip, corrupt deflate data) ends iteration
    after reporting it once.
    """
    lineno = 0
    while True:
        try:
            line = fh.readline(max_line_bytes + 1)
        except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
            yield lineno + 1, None, EventError.single(f"{TRUNCATED}: {exc}")
            return
        if not line:
            return
        lineno += 1
        if len(line) > max_line_bytes and not line.endswith(b"\n"):
            # Skip the rest of this line without holding it in memory.
            size = len(line)
            try:
                while line and not line.endswith(b"\n"):
                    line = fh.readline(max_line_bytes + 1)
                    size += len(line)
            except (EOFError, gzip.BadGzipFile, zlib.error, OSError) as exc:
                yield lineno, None, EventError.single(f"{TRUNCATED}: {exc}")
                return
            yield lineno, None, EventError.single(
                f"line is {size} bytes, longer than the limit of {max_line_bytes} bytes"
            )
            continue
        stripped = line.strip()
        if not stripped:
            continue
        yield lineno, stripped, None


def read_log(
    path: str | os.PathLike, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, strict_fields: bool = False
) -> Iterator[LogLine]:
    """Stream a .jsonl or .jsonl.gz log, validating each line (``strict_fields``: fields a
    type does not name are violations, see :func:`decode_event`).

    Invalid lines are yielded with their error, never raised: a reader decides what to do
    with them (``validate`` reports them, ``load`` records them as anomalies).
    """
    with open_log_binary(path) as fh:
        for lineno, raw, error in iter_raw_lines(fh, max_line_bytes):
            if raw is None:
                yield LogLine(lineno, b"", None, error)
                continue
            try:
                yield LogLine(lineno, raw, decode_event(raw, max_line_bytes, strict_fields), None)
            except EventError as exc:
                yield LogLine(lineno, raw, None, exc)


def iter_events(path: str | os.PathLike) -> Iterator[Event]:
    """Stream only the valid events of a log (for tools that skip bad lines knowingly)."""
    for line in read_log(path):
        if line.event is not None:
            yield line.event


class LogWriter:
    """Write events to a .jsonl or (by suffix) .jsonl.gz log.

    The gzip header carries no file name or timestamp, so the same events always give
    byte-identical files (the simulator's determinism depends on it).
    """

    def __init__(self, path: str | os.PathLike, compresslevel: int = 6):
        self.path = Path(path)
        self.count = 0
        self._raw = open(self.path, "wb")
        if self.path.name.endswith(".gz"):
            self._fh: BinaryIO = gzip.GzipFile(
                filename="", mode="wb", fileobj=self._raw, mtime=0, compresslevel=compresslevel
            )  # type: ignore[assignment]
        else:
            self._fh = self._raw

    def write(self, event: Event) -> None:
        self.write_raw(encode_event(event))

    def write_raw(self, raw: bytes) -> None:
        """Write one already-encoded event (e.g. the exact bytes a producer sent)."""
        if b"\n" in raw:
            raise ValueError("an encoded event must not contain a newline")
        self._fh.write(raw + b"\n")
        self.count += 1

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()
        if not self._raw.closed:
            self._raw.close()

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
