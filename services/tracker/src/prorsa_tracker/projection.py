"""The SQL projection: turn a batch of raw messages into rows, write them in one transaction.

Shared by the live service (position = stream sequence) and ``prorsa tracker load``
(position = log line). The consumer position is written in the same transaction as the
rows it covers, so a crash at any point neither loses nor double-applies an event: on
restart, :func:`restore` replays the ``events`` table through the core (rebuilding the
exact in-memory state) and the consumer resumes after the stored position.

A batch goes through three steps (:func:`process` runs them all):

1. :func:`decode_items`: each message becomes an event, or a rejection with its reason
   (not a valid event; a valid event on a subject its type does not belong to; live, an
   event stamped further ahead of the tracker's clock than ``max_clock_ahead_s``);
2. :func:`unknown_ids` / :func:`stored_events`: the ids that the in-memory cache of recent
   ids cannot decide are looked up in the ``events`` table, the authority on duplicates
   (its ``event_id`` is unique): an event the log already holds is never applied again,
   however old it is;
3. :func:`fold`: the rest is applied through the core into rows. A duplicate with the same
   bytes is skipped (counted); one with other content is an anomaly row and is not applied.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic_core import from_json
from sqlalchemy import Engine, select

from prorsa_schemas import EVENT_TYPES, EventError, Namespace, decode_event

from .core import apply
from . import snapshots, writer
from .models import PositionRow
from .state import Anomaly, RequestRecord, Span, TrackerState, Transition, content_digest
from .validated import load_validated


@dataclass
class Batch:
    """What one batch of messages produced: rows to write and outputs to publish.

    Rows are plain tuples in the column orders of :mod:`prorsa_tracker.writer`
    (``EVENT_COLS``, ``ANOMALY_COLS``, ...); ``trajectories`` holds the newest row of each
    trajectory the batch touched (one upsert per trajectory, not per event).
    """

    consumer: str
    from_stream: bool = True  # positions are stream sequences (else: log lines)
    position: int | None = None
    events: list[tuple] = field(default_factory=list)
    anomalies: list[tuple] = field(default_factory=list)
    requests: list[tuple] = field(default_factory=list)
    spans: list[tuple] = field(default_factory=list)
    trajectories: dict[tuple[str, str], tuple] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)
    transitions: list[Transition] = field(default_factory=list)
    anomaly_notes: list[Anomaly] = field(default_factory=list)
    duplicates: int = 0
    watermark: float | None = None
    run_rows: list[tuple] = field(default_factory=list)
    rejected: list[tuple] = field(default_factory=list)
    """``(pos, subject, raw, reason, kind)`` of each message not applied that is no plain
    duplicate (kind ``invalid``, ``subject`` or ``conflict``): the dead letters."""

    def __len__(self) -> int:
        return len(self.events) + len(self.anomalies) + self.duplicates


def anomaly_row(source: str, pos: int | None, reason: str, raw: bytes | None, a: Anomaly | None = None,
                subject: str | None = None) -> tuple:
    """An ``anomalies`` row (``ANOMALY_COLS`` order)."""
    if a is None:
        return (source, pos, None, None, None, None, None, reason, raw, subject)
    return (source, pos, a.event_id, a.run, a.traj, a.event_type, a.ts, reason, raw, subject)


def _request_row(r: RequestRecord) -> tuple:
    return (r.run, r.traj, r.req, r.turn, r.prompt_tokens, r.cached_tokens, r.output_tokens, r.queued_ts,
            r.prefill_started_ts, r.prefill_finished_ts, r.decode_finished_ts, r.finish, r.engine, r.decode_engine)


def _span_row(s: Span) -> tuple:
    return (s.run, s.traj, s.kind, s.start_ts, s.end_ts, s.mode, s.ok, s.tokens, s.reward)


_ENDED = {"reward.finished", "trajectory.dropped"}


def _traj_row(state: TrackerState, t: Transition, ev, dispatched_ts: float | None) -> tuple:
    # TRAJ_COLS order. state_ts is when the trajectory entered its state: the event's ts
    # when it moved, the core's record when it did not (tool.started, reward.started).
    et = ev.type
    if et in _ENDED:
        return (t.run, t.traj, t.to_state._value_, t.ts, dispatched_ts, t.ts, t.group, t.policy_version,
                t.sandbox_mode, t.turn, t.context_tokens, ev.admitted if et == "reward.finished" else None,
                ev.reward if et == "reward.finished" else None, ev.reason if et == "trajectory.dropped" else None)
    state_ts = t.ts
    if t.from_state is t.to_state:
        tr = state.trajectory(t.run, t.traj)
        if tr is not None:
            state_ts = tr.state_ts
    return (t.run, t.traj, t.to_state._value_, state_ts, dispatched_ts, None, t.group, t.policy_version,
            t.sandbox_mode, t.turn, t.context_tokens, None, None, None)


_MISS = object()


def _expected_subjects(ns: Namespace) -> dict[str, str]:
    return {t: ns.subject_for_type(t) for t in EVENT_TYPES}


def decode_items(items: Iterable[tuple], validated: bool = False, ns: Namespace | None = None,
                 not_after: float | None = None) -> list[tuple]:
    """``(pos, raw, event, reason, subject, kind)`` for each ``(pos, raw[, reason[, subject]])`` item.

    ``event`` is set and ``reason`` None for an event to apply; ``reason`` says why a message
    is rejected and ``kind`` (a dead letter's) what it is: ``invalid``, ``event`` None, when
    it is no valid event; ``subject`` when it is a valid event on a subject its type does
    not belong to (checked when ``ns`` and the item's subject are given); ``future`` when
    its ``ts`` is after ``not_after`` (the live tracker's clock plus ``max_clock_ahead_s``:
    :mod:`prorsa_runtime.clock`), so that it never moves the watermark. ``raw`` None (an
    unreadable log line the caller recorded) only moves the position. With ``validated``,
    ``reason`` comes from the receiver, which ran :func:`prorsa_schemas.decode_event`
    already (valid bytes are read back with :func:`~prorsa_tracker.validated.load_validated`).
    """
    expected = _expected_subjects(ns) if ns is not None else None
    out = []
    append = out.append
    for item in items:
        pos, raw = item[0], item[1]
        subject = item[3] if len(item) > 3 else None
        if raw is None:
            append((pos, None, None, None, None, None))
            continue
        ev = None
        if validated:
            invalid = item[2]
            if invalid is None:
                ev = load_validated(raw)
        else:
            try:
                ev = decode_event(raw)
                invalid = None
            except EventError as exc:
                invalid = exc.reason
        if invalid is not None:
            append((pos, raw, None, f"invalid event: {invalid}", subject, "invalid"))
            continue
        if expected is not None and subject is not None and subject != expected[ev.type]:
            append((pos, raw, ev, f"rejected: event of type {ev.type} on subject {subject!r}; events of that type are "
                                  f"published on {expected[ev.type]!r}", subject, "subject"))
            continue
        if not_after is not None and ev.ts > not_after:
            append((pos, raw, ev, f"rejected: ts {ev.ts:.3f} is after {not_after:.3f}, this tracker's clock plus "
                                  f"max_clock_ahead_s (a producer's clock or units are wrong)", subject, "future"))
            continue
        append((pos, raw, ev, None, subject, None))
    return out


def unknown_ids(state: TrackerState, decoded: list[tuple]) -> list[str]:
    """The ids of ``decoded`` events that the in-memory cache cannot decide (not in it, or in it
    with another or no content digest): the ones :func:`stored_events` must look up."""
    seen = state.seen_ids
    out = []
    for d in decoded:
        ev = d[2]
        if ev is None or d[3] is not None:
            continue
        h = seen.get(ev.id, _MISS)
        if h is _MISS or h is None or h != content_digest(d[1]):
            out.append(ev.id)
    return out


PG_LOOKUP_CHUNK = 5000
SQLITE_LOOKUP_CHUNK = 500  # bound variables per statement: far below SQLite's oldest limit (999)


def stored_events(engine: Engine, ids: list[str]) -> dict[str, bytes]:
    """``{event_id: raw}`` of those of ``ids`` that the ``events`` table holds."""
    if not ids:
        return {}
    pg = engine.dialect.name == "postgresql"
    found: dict[str, bytes] = {}
    uniq = list(dict.fromkeys(ids))
    step = PG_LOOKUP_CHUNK if pg else SQLITE_LOOKUP_CHUNK
    with engine.connect() as conn:
        for i in range(0, len(uniq), step):
            chunk = uniq[i : i + step]
            if pg:  # one index probe per id (with = ANY the planner picks a full scan below ~1M rows)
                rows = conn.exec_driver_sql(
                    "SELECT e.event_id, e.raw FROM unnest(%s::text[]) AS u(id) "
                    "CROSS JOIN LATERAL (SELECT event_id, raw FROM events WHERE event_id = u.id) AS e", (chunk,))
            else:
                rows = conn.exec_driver_sql(
                    f"SELECT event_id, raw FROM events WHERE event_id IN ({', '.join('?' * len(chunk))})", tuple(chunk))
            for eid, raw in rows:
                found[eid] = bytes(raw)
    return found


def _same_content(a: bytes, b: bytes) -> bool:
    if a == b:
        return True
    try:  # the same JSON written differently (key order, spacing) is the same event
        return from_json(a) == from_json(b)
    except ValueError:
        return False


def _remember(state: TrackerState, event_id: str, digest: int) -> None:
    seen = state.seen_ids
    seen[event_id] = digest
    if len(seen) > state.seen_capacity:
        seen.popitem(last=False)


def _duplicate_anomaly(ev, reason: str) -> Anomaly:
    return Anomaly(run=ev.run, traj=getattr(ev, "traj", None), event_id=ev.id, event_type=ev.type, ts=ev.ts,
                   reason=reason)


def process(state: TrackerState, consumer: str, items: Iterable[tuple], batch: Batch | None = None,
            validated: bool = False, engine: Engine | None = None, ns: Namespace | None = None) -> Batch:
    """Decode, de-duplicate and apply ``(position, raw[, reason[, subject]])`` items in order.

    The three steps of the module docstring in one call. With ``engine``, ids the in-memory
    cache cannot decide are looked up in its ``events`` table (the live service does that
    lookup itself, with retries, between :func:`decode_items` and :func:`fold`); without,
    only the cache decides. See :func:`decode_items` for ``validated`` and ``ns``.
    """
    decoded = decode_items(items, validated, ns)
    if engine is None:
        return fold(state, consumer, decoded, {}, batch)
    ids = unknown_ids(state, decoded)
    return fold(state, consumer, decoded, stored_events(engine, ids), batch, set(ids))


def fold(state: TrackerState, consumer: str, decoded: list[tuple], known: dict[str, bytes] | None = None,
         batch: Batch | None = None, asked: set[str] | None = None) -> Batch:
    """Apply :func:`decode_items` output in order; the rows go into ``batch``.

    ``known`` maps ids the ``events`` table already holds to their bytes: those events are
    duplicates (skipped, or an anomaly when the content differs), never applied again.
    ``asked`` is the set of ids that were looked up (:func:`unknown_ids` when the batch was
    prepared); an id outside it was in the window then with the same bytes, so it is a
    duplicate even if the window has let it go since (the service prepares a batch while
    the one before it is applied).
    Rejected messages become anomaly rows with the raw bytes, the reason and the subject;
    duplicates are skipped but still advance the position. From a stream, each
    transition's ``seq`` is its event's stream sequence.
    """
    b = batch if batch is not None else Batch(consumer)
    events, trajs, requests, spans = b.events, b.trajectories, b.requests, b.spans
    transitions, runs = b.transitions, b.runs
    from_stream = b.from_stream
    seen = state.seen_ids
    known = known or {}
    last = b.position
    pending: dict[tuple[str, str], tuple] = {}  # (run, traj) -> (last transition, its event, dispatched_ts)
    for pos, raw, ev, reason, subject, kind in decoded:
        if pos is not None:
            last = pos
        if raw is None:  # already recorded by the caller (an unreadable log line)
            continue
        if reason is not None:
            if ev is None:
                note = Anomaly(run=None, traj=None, event_id=None, event_type=None, ts=None, reason=reason)
            else:
                note = _duplicate_anomaly(ev, reason)
            b.anomaly_notes.append(note)
            b.anomalies.append(anomaly_row(consumer, pos, reason, raw, note if ev is not None else None, subject))
            b.rejected.append((pos, subject, raw, reason, kind))
            continue
        eid = ev.id
        original = known.get(eid) if known else None
        if original is not None:  # in the durable log: never applied twice, however old
            _remember(state, eid, content_digest(original))
            _count_duplicate(state, b, consumer, pos, ev, raw, subject, _same_content(original, raw))
            continue
        h = seen.get(eid, _MISS)
        if h is not _MISS:  # applied recently (maybe not committed yet)
            _count_duplicate(state, b, consumer, pos, ev, raw, subject, h is None or h == content_digest(raw))
            continue
        if asked is not None and eid not in asked:  # in the window when prepared, same bytes
            _count_duplicate(state, b, consumer, pos, ev, raw, subject, True)
            continue
        _, trans, anomalies = apply(state, ev)
        seen[eid] = content_digest(raw)  # apply() remembered the id; keep its content digest
        run = ev.run
        events.append((pos if from_stream else None, eid, run, getattr(ev, "traj", None), ev.type, ev.ts, raw))
        runs.add(run)
        for a in anomalies:
            b.anomaly_notes.append(a)
            b.anomalies.append(anomaly_row(consumer, pos, a.reason, raw, a, subject))
        for t in trans:
            if from_stream:
                t.seq = pos
            transitions.append(t)
            key = (t.run, t.traj)
            if t.from_state is None:
                disp = t.ts
            else:  # keep the INSERT's dispatched_ts when the batch also dispatched it
                p = pending.get(key)
                if p is not None:
                    disp = p[2]
                else:
                    prev = trajs.get(key)
                    disp = prev[4] if prev is not None else None
            pending[key] = (t, ev, disp)
            if t.request is not None:
                requests.append(_request_row(t.request))
            if t.span is not None:
                spans.append(_span_row(t.span))
    # One row per trajectory, built from its LAST transition of the call (most events only
    # supersede an earlier row of the batch). Built here, before the next batch is applied,
    # so the trajectory's state_ts read by _traj_row is still the one of that transition.
    for key, (t, ev, disp) in pending.items():
        trajs[key] = _traj_row(state, t, ev, disp)
    b.position = last
    b.watermark = state.watermark
    # The run rows as of the end of THIS batch (the service applies the next batch while
    # this one is written, so they cannot be read from the state later).
    b.run_rows = [_run_row(state, r) for r in sorted(runs)]
    return b


def _count_duplicate(state: TrackerState, b: Batch, consumer: str, pos, ev, raw: bytes, subject: str | None,
                     same: bool) -> None:
    """A re-sent event: counted when it is the same event, an anomaly row when it is not."""
    if same:
        state.duplicates += 1
        b.duplicates += 1
        return
    note = _duplicate_anomaly(ev, f"duplicate event id {ev.id!r} with other content: the event applied under "
                                  "this id differs; this copy is not applied")
    b.anomaly_notes.append(note)
    b.anomalies.append(anomaly_row(consumer, pos, note.reason, raw, note, subject))
    b.rejected.append((pos, subject, raw, note.reason, "conflict"))


def write(engine: Engine, state: TrackerState, b: Batch, snapshot: bytes | None = None) -> None:
    """Write a batch, the consumer position and (if given) a state snapshot in ONE transaction.

    ``state`` is unused (the batch carries everything); kept for callers' convenience.
    """
    st = writer.statements(engine)
    with engine.begin() as conn:
        writer.write_rows(conn, st, b)
        if b.run_rows:
            conn.exec_driver_sql(st.runs, b.run_rows)
        if b.position is not None:
            conn.exec_driver_sql(st.position, (b.consumer, b.position, b.watermark))
        if snapshot is not None:
            snapshots.save(conn, snapshot)


def _run_row(state: TrackerState, run: str) -> tuple:
    rs = state.runs.get(run)
    if rs is None:  # engine/control events only: a row with the defaults
        from .state import RunState

        rs = RunState(run)
    c = rs.config
    return (run, c.mode, c.batch_size, c.max_staleness, c.group_size, c.injection, c.declared, rs.policy_version,
            rs.dispatched, rs.rewarded, rs.admitted, rs.done, rs.dropped, len(rs.live), rs.first_ts, rs.last_ts)


def row_counts(engine: Engine) -> tuple[int, int]:
    """``(events, anomalies)``: the rows the two tables hold (what the metrics start from)."""
    with engine.connect() as conn:
        events = conn.exec_driver_sql("SELECT COUNT(*) FROM events").scalar()
        anomalies = conn.exec_driver_sql("SELECT COUNT(*) FROM anomalies").scalar()
    return int(events or 0), int(anomalies or 0)


def position(engine: Engine, consumer: str) -> int:
    """The last position ``consumer`` committed (0 when it never did)."""
    with engine.connect() as conn:
        got = conn.execute(select(PositionRow.seq).where(PositionRow.consumer == consumer)).scalar()
    return int(got or 0)


def restore(engine: Engine, state: TrackerState, chunk: int = 10_000) -> int:
    """Rebuild the in-memory state by folding EVERY stored event in applied order (no
    snapshot; :func:`prorsa_tracker.snapshots.restore` starts from one). Returns the count."""
    return snapshots.restore(engine, state, chunk, use_snapshot=False)
