"""State snapshots: restart in time proportional to the events since the last snapshot.

The tracker's in-memory state is a deterministic fold of the ``events`` table in ``pos``
order. Every ``snapshot_every`` stream messages the service pickles the state right after
a batch is applied and commits it in the SAME transaction as that batch's rows and
position, together with ``event_pos`` = the largest ``events.pos`` at that moment. So a
snapshot is always exactly the fold of the events up to ``event_pos``; a restart loads it
and folds only the events after it. A snapshot written by other code (another
``SNAPSHOT_FORMAT``) or that fails to load is ignored: the restart replays everything,
which is slower but gives the same state. The pickle is read only from the tracker's own
database.
"""

from __future__ import annotations

import dataclasses
import logging
import pickle

from sqlalchemy import Connection, Engine, select

from .core import apply
from .models import EventRow, SnapshotRow
from .state import TrackerState, content_digest
from .validated import load_validated

log = logging.getLogger("prorsa.tracker")

SNAPSHOT_FORMAT = 1
"""Bump when TrackerState (or anything it holds) changes shape: older snapshots are then ignored."""

NAME = "state"


def dump(state: TrackerState) -> bytes:
    """The state as bytes (call it between batches: the fold must not run meanwhile)."""
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


def save(conn: Connection, blob: bytes) -> None:
    """Store ``blob`` as the snapshot of every event written so far on ``conn``'s transaction."""
    pg = conn.dialect.name == "postgresql"
    top = conn.exec_driver_sql("SELECT COALESCE(MAX(pos), 0) FROM events").scalar()
    sql = ("INSERT INTO snapshots (name, format, event_pos, state) VALUES (?, ?, ?, ?) ON CONFLICT (name) "
           "DO UPDATE SET format = excluded.format, event_pos = excluded.event_pos, state = excluded.state")
    conn.exec_driver_sql(sql.replace("?", "%s") if pg else sql, (NAME, SNAPSHOT_FORMAT, int(top or 0), blob))


def _load(conn: Connection) -> tuple[TrackerState, int] | None:
    row = conn.execute(select(SnapshotRow.format, SnapshotRow.event_pos, SnapshotRow.state).where(SnapshotRow.name == NAME)).first()
    if row is None:
        return None
    if row.format != SNAPSHOT_FORMAT:
        log.warning("tracker: ignoring a snapshot of format %s (this code writes %s); replaying every event",
                    row.format, SNAPSHOT_FORMAT)
        return None
    try:
        loaded = pickle.loads(bytes(row.state))
    except Exception as exc:  # written by other code: fall back to the full replay
        log.warning("tracker: the state snapshot does not load (%r); replaying every event", exc)
        return None
    if not isinstance(loaded, TrackerState):
        log.warning("tracker: the state snapshot holds a %s; replaying every event", type(loaded).__name__)
        return None
    return loaded, int(row.event_pos)


def restore(engine: Engine, state: TrackerState, chunk: int = 10_000, use_snapshot: bool = True) -> int:
    """Rebuild ``state`` (in place): the snapshot, then the events after it, in ``pos`` order.

    Returns the number of events folded (all of them when there is no usable snapshot).
    """
    n = 0
    with engine.connect() as conn:
        after = 0
        got = _load(conn) if use_snapshot else None
        if got is not None:
            loaded, after = got
            for f in dataclasses.fields(TrackerState):
                setattr(state, f.name, getattr(loaded, f.name))
        q = select(EventRow.raw).where(EventRow.pos > after).order_by(EventRow.pos)
        seen = state.seen_ids
        for (raw,) in conn.execution_options(yield_per=chunk).execute(q):
            raw = bytes(raw)
            ev = load_validated(raw)  # validated before it was stored
            apply(state, ev)
            seen[ev.id] = content_digest(raw)
            n += 1
    return n
