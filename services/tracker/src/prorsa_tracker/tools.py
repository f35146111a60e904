"""Offline tools: ``load`` a log file into a database (resumable) and ``export`` a run.

An export is a contract log that loads cleanly on its own: the run's events, plus the
engine events of other runs that the run's own engine events depend on. Engine agents
publish ``engine.registered`` and ``engine.stats`` under their own run id while the
switches they carry out for a rollout run (``engine.switching``/``switched``/
``switch_failed``) carry that run's id; without the registration (and whatever changed the
engine's role in between) a load of the run alone would record every switch as an
anomaly.
"""

from __future__ import annotations

import heapq
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic_core import from_json
from sqlalchemy import Engine, select

from prorsa_schemas import ENGINE_TYPES, LogWriter
from prorsa_schemas.codec import TRUNCATED, iter_raw_lines, open_log_binary

from . import projection, snapshots
from .core import new_state
from .models import EventRow


def load_consumer(path: str | os.PathLike) -> str:
    """The position key of a loaded file (its absolute path)."""
    return f"load:{Path(path).resolve()}"


def load(engine: Engine, path: str | os.PathLike, batch_size: int = 5000,
         progress: Callable[[int], None] | None = None, dedup_cache: int | None = None,
         rejected: Callable[[int, str], None] | None = None) -> dict:
    """Apply a log file into the database; resumable: lines already committed are skipped.

    The in-memory state is first rebuilt from the database (so a load continues the same
    fold), then each batch and the file position (its line number) commit together. An
    event whose id the database already holds is not applied again (an anomaly row when
    its content differs); an invalid line is an anomaly row with its line number.
    ``dedup_cache`` bounds the in-memory window of recent ids (default: the core's; at
    least one batch). ``rejected(lineno, reason)`` is called, once its batch is committed,
    for each line not applied that is no plain duplicate (invalid, unreadable, or a re-sent
    id with other content). Returns counts: ``lines`` read, ``skipped`` (already loaded),
    ``events`` and ``anomalies`` written, ``duplicates``, and ``truncated``: why the log
    ended early (a truncated or corrupt gzip stream, with its line number), or None.
    """
    consumer = load_consumer(path)
    state = new_state()
    snapshots.restore(engine, state)
    if dedup_cache is not None:
        state.seen_capacity = max(dedup_cache, batch_size)
        while len(state.seen_ids) > state.seen_capacity:
            state.seen_ids.popitem(last=False)
    done_upto = projection.position(engine, consumer)
    counts: dict = {"lines": 0, "skipped": 0, "events": 0, "anomalies": 0, "duplicates": 0, "truncated": None}
    items: list[tuple[int, bytes]] = []
    unreadable: list[tuple] = []

    def flush() -> None:
        if not items and not unreadable:
            return
        b = projection.Batch(consumer, from_stream=False)
        b.anomalies.extend(unreadable)
        bad = [(row[1], row[7]) for row in unreadable]
        unreadable.clear()
        projection.process(state, consumer, items, b, engine=engine)  # the events table decides duplicates
        projection.write(engine, state, b)
        if rejected is not None:
            bad += [(pos, reason) for pos, _, _, reason, _ in b.rejected]
            for lineno, reason in sorted(bad):
                rejected(lineno, reason)
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
                if reason.startswith(TRUNCATED):
                    # The stream broke inside this line: the position stays on the last whole
                    # line, so a load of the complete log continues with this one.
                    counts["truncated"] = f"line {lineno}: {reason}"
                else:
                    items.append((lineno, None))  # advances the position only
            else:
                items.append((lineno, raw))
            if len(items) >= batch_size:
                flush()
    flush()
    return counts


def engine_context(engine: Engine, run: str, all_engines: bool = False) -> list[tuple[float, int, bytes]]:
    """``(ts, pos, raw)`` of the engine events of OTHER runs that ``run`` needs to load cleanly.

    For each engine that ``run``'s own engine events name: that engine's events of any other
    run from its last ``engine.registered`` before the run's first event about it, up to the
    run's last event about it (everything that shaped the engine's state meanwhile, e.g. a
    switch another run commanded). With ``all_engines``, also every engine with an event of
    another run while ``run`` was live (between its first and last event in the stream),
    e.g. the registrations and stats that engine agents publish under their own run: what a
    replay of the forecaster needs to see the cluster the run ran on. Sorted by ``(ts, pos)``.
    """
    types = sorted(ENGINE_TYPES)
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    with engine.connect() as conn:
        registers: set[str] = set()  # engines whose first event in the run is their registration
        # Sorted here, not by the database: ordered by pos, the planners read the run's
        # every event through (run, pos) rather than its few engine events through (type, pos).
        q = select(EventRow.pos, EventRow.type, EventRow.raw).where(EventRow.run == run, EventRow.type.in_(types))
        rows = [(pos, type_, bytes(raw)) for pos, type_, raw in conn.execution_options(yield_per=10_000).execute(q)]
        if all_engines:
            # The run's first and last position: one probe each of (run, pos).
            ends = [conn.execute(select(EventRow.pos).where(EventRow.run == run).order_by(o).limit(1)).scalar()
                    for o in (EventRow.pos.asc(), EventRow.pos.desc())]
            if ends[0] is not None:
                q = (select(EventRow.pos, EventRow.type, EventRow.raw)
                     .where(EventRow.pos.between(*ends), EventRow.type.in_(types), EventRow.run != run))
                rows += [(pos, type_, bytes(raw)) for pos, type_, raw in conn.execute(q)]
        rows.sort()
        for pos, type_, raw in rows:
            name = from_json(raw)["engine"]
            if name not in first:
                first[name] = pos
                if type_ == "engine.registered":
                    registers.add(name)
            last[name] = pos
        if not first:
            return []
        start = dict(first)  # an engine never registered before the run: nothing earlier to add
        looking = set(first) - registers
        q = (select(EventRow.pos, EventRow.raw)
             .where(EventRow.type == "engine.registered", EventRow.pos < max(first.values()))
             .order_by(EventRow.pos.desc()))
        if looking:  # newest first: stop as soon as each engine has its registration
            res = conn.execution_options(yield_per=1000).execute(q)
            for pos, raw in res:
                name = from_json(bytes(raw))["engine"]
                if name in looking and pos < first[name]:
                    start[name] = pos
                    looking.discard(name)
                    if not looking:
                        break
            res.close()
        out = []
        q = (select(EventRow.pos, EventRow.ts, EventRow.raw)
             .where(EventRow.pos.between(min(start.values()), max(last.values())), EventRow.type.in_(types),
                    EventRow.run != run)
             .order_by(EventRow.pos))
        for pos, ts, raw in conn.execution_options(yield_per=10_000).execute(q):
            raw = bytes(raw)
            name = from_json(raw)["engine"]
            if name in start and start[name] <= pos <= last[name]:
                out.append((ts, pos, raw))
    out.sort()
    return out


def export_events(engine: Engine, run: str, context: list[tuple[float, int, bytes]] | None = None) -> Iterator[bytes]:
    """``run``'s events and their :func:`engine_context`, byte-identical, as a contract log
    orders them: by ``ts``, ties in stream order (EVENTS.md). On a live bus producers
    interleave slightly out of ts order (stream order is not ts order), and a log in stream
    order would not re-validate."""
    ctx = engine_context(engine, run) if context is None else context
    with engine.connect() as conn:
        q = select(EventRow.ts, EventRow.pos, EventRow.raw).where(EventRow.run == run).order_by(EventRow.ts, EventRow.pos)
        own = ((ts, pos, bytes(raw)) for ts, pos, raw in conn.execution_options(yield_per=10_000).execute(q))
        for _, _, raw in heapq.merge(own, ctx):
            yield raw


def export(engine: Engine, run: str, out: str | os.PathLike, all_engines: bool = False) -> tuple[int, int]:
    """Write :func:`export_events` to ``out`` (.jsonl or .jsonl.gz); returns ``(events written,
    of them engine events of other runs)``. ``all_engines``: see :func:`engine_context`."""
    ctx = engine_context(engine, run, all_engines)
    n = 0
    with LogWriter(out) as w:
        for raw in export_events(engine, run, ctx):
            w.write_raw(raw)
            n += 1
    return n, len(ctx)
