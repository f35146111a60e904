"""The SQL projection: turn a batch of raw messages into rows, write them in one transaction.

Shared by the live service (position = stream sequence) and ``prorsa tracker load``
(position = log line). The consumer position is written in the same transaction as the
rows it covers, so a crash at any point neither loses nor double-applies an event: on
restart, :func:`restore` replays the ``events`` table through the core (rebuilding the
exact in-memory state) and the consumer resumes after the stored position.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import Engine, select

from prorsa_schemas import EventError, decode_event

from .core import apply
from . import snapshots, writer
from .models import EventRow, PositionRow
from .state import Anomaly, RequestRecord, Span, TrackerState, Transition
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

    def __len__(self) -> int:
        return len(self.events) + len(self.anomalies) + self.duplicates


def anomaly_row(source: str, pos: int | None, reason: str, raw: bytes | None, a: Anomaly | None = None) -> tuple:
    """An ``anomalies`` row (``ANOMALY_COLS`` order)."""
    if a is None:
        return (source, pos, None, None, None, None, None, reason, raw)
    return (source, pos, a.event_id, a.run, a.traj, a.event_type, a.ts, reason, raw)


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


def process(state: TrackerState, consumer: str, items: Iterable[tuple], batch: Batch | None = None,
            validated: bool = False) -> Batch:
    """Decode and apply ``(position, raw)`` items in order; the rows go into ``batch``.

    With ``validated``, items are ``(position, raw, reason)`` from the receiver, which has
    run :func:`prorsa_schemas.decode_event` on each already: ``reason`` is None for a valid
    event (read back with :func:`~prorsa_tracker.validated.load_validated`) or why it is
    invalid. Invalid bytes become anomaly rows (with the raw bytes and the reason);
    duplicates (by event id) are skipped but still advance the position. From a stream,
    each transition's ``seq`` is its event's stream sequence.
    """
    b = batch if batch is not None else Batch(consumer)
    events, trajs, requests, spans = b.events, b.trajectories, b.requests, b.spans
    transitions, runs = b.transitions, b.runs
    from_stream = b.from_stream
    seen = state.seen_ids
    last = b.position
    pending: dict[tuple[str, str], tuple] = {}  # (run, traj) -> (last transition, its event, dispatched_ts)
    for item in items:
        pos, raw = item[0], item[1]
        if pos is not None:
            last = pos
        if raw is None:  # already recorded by the caller (an unreadable log line)
            continue
        invalid = None
        if validated:
            invalid = item[2]
            if invalid is None:
                ev = load_validated(raw)
        else:
            try:
                ev = decode_event(raw)
            except EventError as exc:
                invalid = exc.reason
        if invalid is not None:
            note = Anomaly(run=None, traj=None, event_id=None, event_type=None, ts=None, reason=f"invalid event: {invalid}")
            b.anomaly_notes.append(note)
            b.anomalies.append(anomaly_row(consumer, pos, note.reason, raw))
            continue
        if ev.id in seen:
            state.duplicates += 1
            b.duplicates += 1
            continue
        _, trans, anomalies = apply(state, ev)
        run = ev.run
        events.append((pos if from_stream else None, ev.id, run, getattr(ev, "traj", None), ev.type, ev.ts, raw))
        runs.add(run)
        for a in anomalies:
            b.anomaly_notes.append(a)
            b.anomalies.append(anomaly_row(consumer, pos, a.reason, raw, a))
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


def position(engine: Engine, consumer: str) -> int:
    """The last position ``consumer`` committed (0 when it never did)."""
    with engine.connect() as conn:
        got = conn.execute(select(PositionRow.seq).where(PositionRow.consumer == consumer)).scalar()
    return int(got or 0)


def restore(engine: Engine, state: TrackerState, chunk: int = 10_000) -> int:
    """Rebuild the in-memory state by folding EVERY stored event in applied order (no
    snapshot; :func:`prorsa_tracker.snapshots.restore` starts from one). Returns the count."""
    return snapshots.restore(engine, state, chunk, use_snapshot=False)
