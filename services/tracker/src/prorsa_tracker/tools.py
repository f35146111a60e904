"""Offline tools: ``load`` a log file into a database (resumable) and ``export`` a run."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import Engine

from prorsa_schemas import LogWriter
from prorsa_schemas.codec import iter_raw_lines, open_log_binary

from . import projection, snapshots
from .core import new_state
from .queries import iter_raw_events


def load_consumer(path: str | os.PathLike) -> str:
    """The position key of a loaded file (its absolute path)."""
    return f"load:{Path(path).resolve()}"


def load(engine: Engine, path: str | os.PathLike, batch_size: int = 5000,
         progress: Callable[[int], None] | None = None) -> dict:
    """Apply a log file into the database; resumable: lines already committed are skipped.

    The in-memory state is first rebuilt from the database (so a load continues the same
    fold), then each batch and the file position (its line number) commit together.
    Returns counts: ``lines`` read, ``skipped`` (already loaded), ``events`` and
    ``anomalies`` written, ``duplicates``.
    """
    consumer = load_consumer(path)
    state = new_state()
    snapshots.restore(engine, state)
    done_upto = projection.position(engine, consumer)
    counts = {"lines": 0, "skipped": 0, "events": 0, "anomalies": 0, "duplicates": 0}
    items: list[tuple[int, bytes]] = []
    unreadable: list[dict] = []

    def flush() -> None:
        if not items and not unreadable:
            return
        b = projection.Batch(consumer, from_stream=False)
        b.anomalies.extend(unreadable)
        unreadable.clear()
        projection.process(state, consumer, items, b)
        projection.write(engine, state, b)
        counts["events"] += len(b.events)
        counts["anomalies"] += len(b.anomalies)
        counts["duplicates"] += b.duplicates
        if progress:
            progress(len(items))
        items.clear()

    with open_log_binary(path) as fh:
        for lineno, raw, error in iter_raw_lines(fh):
            counts["lines"] += 1
            if lineno <= done_upto:
                counts["skipped"] += 1
                if progress:
                    progress(1)
                continue
            if raw is None:  # unreadable (too long, truncated): keep the reason
                reason = error.reason if error is not None else "unreadable line"
                unreadable.append(projection.anomaly_row(consumer, lineno, reason, None))
                items.append((lineno, None))  # advances the position only
            else:
                items.append((lineno, raw))
            if len(items) >= batch_size:
                flush()
    flush()
    return counts


def export(engine: Engine, run: str, out: str | os.PathLike) -> int:
    """Write ``run``'s events, byte-identical, as a contract log: ordered by ``ts``, ties in
    stream order (EVENTS.md). On a live bus, producers interleave slightly out of ts order
    (stream order is not ts order), and a log in stream order would not re-validate."""
    n = 0
    with LogWriter(out) as w:
        for raw in iter_raw_events(engine, run, by_ts=True):
            w.write_raw(raw)
            n += 1
    return n
