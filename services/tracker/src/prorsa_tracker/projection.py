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
from sqlalchemy.dialects import postgresql, sqlite

from prorsa_schemas import EventError, decode_event

from .core import apply
from .models import AnomalyRow, EventRow, PositionRow, RequestRow, RunRow, SpanRow, TrajectoryRow
from .state import Anomaly, TrackerState, Transition


@dataclass
class Batch:
    """What one batch of messages produced: rows to write and outputs to publish."""

    consumer: str
    from_stream: bool = True  # positions are stream sequences (else: log lines)
    position: int | None = None
    events: list[dict] = field(default_factory=list)
    anomalies: list[dict] = field(default_factory=list)
    requests: list[dict] = field(default_factory=list)
    spans: list[dict] = field(default_factory=list)
    trajectories: dict[tuple[str, str], dict] = field(default_factory=dict)
    runs: set[str] = field(default_factory=set)
    transitions: list[Transition] = field(default_factory=list)
    anomaly_notes: list[Anomaly] = field(default_factory=list)
    duplicates: int = 0
    watermark: float | None = None

    def __len__(self) -> int:
        return len(self.events) + len(self.anomalies) + self.duplicates


def _traj_row(state: TrackerState, t: Transition, ev) -> dict:
    live = t.to_state.live
    tr = state.trajectory(t.run, t.traj) if live else None
    return {
        "run": t.run,
        "traj": t.traj,
        "state": t.to_state.value,
        "state_ts": tr.state_ts if tr is not None else t.ts,
        "dispatched_ts": t.ts if t.from_state is None else None,
        "ended_ts": None if live else t.ts,
        "grp": t.group,
        "policy_version": t.policy_version,
        "sandbox_mode": t.sandbox_mode,
        "turns": t.turn,
        "context_tokens": t.context_tokens,
        "admitted": ev.admitted if ev.type == "reward.finished" else None,
        "reward": ev.reward if ev.type == "reward.finished" else None,
        "drop_reason": ev.reason if ev.type == "trajectory.dropped" else None,
    }


def process(state: TrackerState, consumer: str, items: Iterable[tuple[int | None, bytes | None]], batch: Batch | None = None) -> Batch:
    """Decode and apply ``(position, raw)`` items in order; the rows go into ``batch``.

    Invalid bytes become anomaly rows (with the raw bytes and the reason); duplicates
    (by event id) are skipped but still advance the position.
    """
    b = batch if batch is not None else Batch(consumer)
    for pos, raw in items:
        if pos is not None:
            b.position = pos
        if raw is None:  # already recorded by the caller (an unreadable log line)
            continue
        try:
            ev = decode_event(raw)
        except EventError as exc:
            note = Anomaly(run=None, traj=None, event_id=None, event_type=None, ts=None, reason=f"invalid event: {exc.reason}")
            b.anomaly_notes.append(note)
            b.anomalies.append({"source": consumer, "seq": pos, "event_id": None, "run": None, "traj": None,
                                "type": None, "ts": None, "reason": note.reason, "raw": raw})
            continue
        if state.is_duplicate(ev.id):
            state.duplicates += 1
            b.duplicates += 1
            continue
        _, transitions, anomalies = apply(state, ev)
        traj = getattr(ev, "traj", None)
        b.events.append({"seq": pos if b.from_stream else None, "event_id": ev.id, "run": ev.run,
                         "traj": traj, "type": ev.type, "ts": ev.ts, "raw": raw})
        b.runs.add(ev.run)
        for a in anomalies:
            b.anomaly_notes.append(a)
            b.anomalies.append({"source": consumer, "seq": pos, "event_id": a.event_id, "run": a.run, "traj": a.traj,
                                "type": a.event_type, "ts": a.ts, "reason": a.reason, "raw": raw})
        for t in transitions:
            b.transitions.append(t)
            row = _traj_row(state, t, ev)
            prev = b.trajectories.get((t.run, t.traj))
            if prev is not None and row["dispatched_ts"] is None:  # keep it for the INSERT
                row["dispatched_ts"] = prev["dispatched_ts"]
            b.trajectories[(t.run, t.traj)] = row
            if t.request is not None:
                b.requests.append(t.request.as_dict())
            if t.span is not None:
                b.spans.append(t.span.as_dict())
    b.watermark = state.watermark
    return b


def _insert(engine: Engine):
    return postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert


def write(engine: Engine, state: TrackerState, b: Batch) -> None:
    """Write a batch and the consumer position in ONE transaction."""
    ins = _insert(engine)
    with engine.begin() as conn:
        if b.events:
            conn.execute(ins(EventRow.__table__).on_conflict_do_nothing(index_elements=["event_id"]), b.events)
        if b.anomalies:
            conn.execute(AnomalyRow.__table__.insert(), b.anomalies)
        if b.requests:
            conn.execute(RequestRow.__table__.insert(), b.requests)
        if b.spans:
            conn.execute(SpanRow.__table__.insert(), b.spans)
        if b.trajectories:
            t = TrajectoryRow.__table__
            stmt = ins(t)
            keep = {"run", "traj", "dispatched_ts"}
            stmt = stmt.on_conflict_do_update(
                index_elements=["run", "traj"], set_={c.name: stmt.excluded[c.name] for c in t.c if c.name not in keep}
            )
            conn.execute(stmt, list(b.trajectories.values()))
        if b.runs:
            rows = [_run_row(state, r) for r in sorted(b.runs)]
            t = RunRow.__table__
            stmt = ins(t)
            stmt = stmt.on_conflict_do_update(index_elements=["run"], set_={c.name: stmt.excluded[c.name] for c in t.c if c.name != "run"})
            conn.execute(stmt, rows)
        if b.position is not None:
            t = PositionRow.__table__
            stmt = ins(t).values(consumer=b.consumer, seq=b.position, watermark=b.watermark)
            stmt = stmt.on_conflict_do_update(index_elements=["consumer"], set_={"seq": stmt.excluded.seq, "watermark": stmt.excluded.watermark})
            conn.execute(stmt)


def _run_row(state: TrackerState, run: str) -> dict:
    rs = state.runs.get(run)
    if rs is None:  # engine/control events only: a row with the defaults
        from .state import RunState

        rs = RunState(run)
    c = rs.config
    return {
        "run": run, "mode": c.mode, "batch_size": c.batch_size, "max_staleness": c.max_staleness,
        "group_size": c.group_size, "injection": c.injection, "declared": c.declared,
        "policy_version": rs.policy_version, "dispatched": rs.dispatched, "rewarded": rs.rewarded,
        "admitted": rs.admitted, "done": rs.done, "dropped": rs.dropped, "live": len(rs.live),
        "first_ts": rs.first_ts, "last_ts": rs.last_ts,
    }


def position(engine: Engine, consumer: str) -> int:
    """The last position ``consumer`` committed (0 when it never did)."""
    with engine.connect() as conn:
        got = conn.execute(select(PositionRow.seq).where(PositionRow.consumer == consumer)).scalar()
    return int(got or 0)


def restore(engine: Engine, state: TrackerState, chunk: int = 10_000) -> int:
    """Rebuild the in-memory state by folding the stored events in applied order.

    Deterministic: the fold gives the very state the crashed process had after its last
    commit. Returns the number of events replayed.
    """
    n = 0
    with engine.connect() as conn:
        result = conn.execution_options(yield_per=chunk).execute(select(EventRow.raw).order_by(EventRow.pos))
        for (raw,) in result:
            apply(state, decode_event(bytes(raw)))
            n += 1
    return n
