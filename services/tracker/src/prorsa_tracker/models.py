"""SQLAlchemy 2.0 models of the durable trajectory log (one schema for SQLite and PostgreSQL).

``events`` is append-only: the exact bytes of every valid event, in the order applied
(``pos``), with its JetStream sequence. The other tables are projections of it, written in
the same transaction as the consumer ``positions`` row that covers them.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, Index, Integer, LargeBinary, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY (the rowid alias).
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class EventRow(Base):
    __tablename__ = "events"
    pos: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    seq: Mapped[int | None] = mapped_column(BigInteger)  # stream sequence (None: loaded from a file)
    event_id: Mapped[str] = mapped_column(String(128), unique=True)
    run: Mapped[str] = mapped_column(String(128))
    traj: Mapped[str | None] = mapped_column(String(128))
    type: Mapped[str] = mapped_column(String(32))
    ts: Mapped[float] = mapped_column(Float)
    raw: Mapped[bytes] = mapped_column(LargeBinary)
    # (type, pos): the reads that select a few types out of the log (engine events, the
    # forecast windows: console_queries.py, tools.py) use it instead of scanning the table.
    __table_args__ = (Index("ix_events_run_traj_pos", "run", "traj", "pos"), Index("ix_events_run_pos", "run", "pos"),
                      Index("ix_events_type_pos", "type", "pos"))


class TrajectoryRow(Base):
    __tablename__ = "trajectories"
    run: Mapped[str] = mapped_column(String(128), primary_key=True)
    traj: Mapped[str] = mapped_column(String(128), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    state_ts: Mapped[float] = mapped_column(Float)
    dispatched_ts: Mapped[float | None] = mapped_column(Float)
    ended_ts: Mapped[float | None] = mapped_column(Float)
    group: Mapped[str | None] = mapped_column("grp", String(128))
    policy_version: Mapped[int | None] = mapped_column(Integer)
    sandbox_mode: Mapped[str | None] = mapped_column(String(16))
    turns: Mapped[int] = mapped_column(Integer)
    context_tokens: Mapped[int] = mapped_column(BigInteger)
    admitted: Mapped[bool | None] = mapped_column(Boolean)
    reward: Mapped[float | None] = mapped_column(Float)
    drop_reason: Mapped[str | None] = mapped_column(String(16))
    __table_args__ = (Index("ix_traj_run_state", "run", "state"), Index("ix_traj_run_dispatched", "run", "dispatched_ts"))


class RequestRow(Base):
    __tablename__ = "requests"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run: Mapped[str] = mapped_column(String(128))
    traj: Mapped[str] = mapped_column(String(128))
    req: Mapped[str] = mapped_column(String(128))
    turn: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    cached_tokens: Mapped[int | None] = mapped_column(BigInteger)
    output_tokens: Mapped[int | None] = mapped_column(BigInteger)
    queued_ts: Mapped[float] = mapped_column(Float)
    prefill_started_ts: Mapped[float | None] = mapped_column(Float)
    prefill_finished_ts: Mapped[float | None] = mapped_column(Float)
    decode_finished_ts: Mapped[float | None] = mapped_column(Float)
    finish: Mapped[str] = mapped_column(String(16))
    engine: Mapped[str | None] = mapped_column(String(128))
    decode_engine: Mapped[str | None] = mapped_column(String(128))
    __table_args__ = (Index("ix_requests_run_traj", "run", "traj"),)


class SpanRow(Base):
    __tablename__ = "spans"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run: Mapped[str] = mapped_column(String(128))
    traj: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(16))
    start_ts: Mapped[float] = mapped_column(Float)
    end_ts: Mapped[float] = mapped_column(Float)
    mode: Mapped[str | None] = mapped_column(String(128))
    ok: Mapped[bool | None] = mapped_column(Boolean)
    tokens: Mapped[int | None] = mapped_column(BigInteger)
    reward: Mapped[float | None] = mapped_column(Float)
    __table_args__ = (Index("ix_spans_run_traj", "run", "traj"),)


class AnomalyRow(Base):
    __tablename__ = "anomalies"
    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(512))  # consumer name or "load:<file>"
    seq: Mapped[int | None] = mapped_column(BigInteger)  # stream sequence or log line
    event_id: Mapped[str | None] = mapped_column(String(128))
    run: Mapped[str | None] = mapped_column(String(128))
    traj: Mapped[str | None] = mapped_column(String(128))
    type: Mapped[str | None] = mapped_column(String(64))
    ts: Mapped[float | None] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(Text)
    raw: Mapped[bytes | None] = mapped_column(LargeBinary)  # the whole message (None: an unreadable log line)
    subject: Mapped[str | None] = mapped_column(String(512))  # the bus subject (None: from a log file)
    __table_args__ = (Index("ix_anomalies_run", "run"),)


class RunRow(Base):
    __tablename__ = "runs"
    run: Mapped[str] = mapped_column(String(128), primary_key=True)
    mode: Mapped[str] = mapped_column(String(8))
    batch_size: Mapped[int | None] = mapped_column(Integer)
    max_staleness: Mapped[int | None] = mapped_column(Integer)
    group_size: Mapped[int] = mapped_column(Integer)
    injection: Mapped[str] = mapped_column(String(16))
    declared: Mapped[bool] = mapped_column(Boolean)
    policy_version: Mapped[int | None] = mapped_column(Integer)
    dispatched: Mapped[int] = mapped_column(BigInteger)
    rewarded: Mapped[int] = mapped_column(BigInteger)
    admitted: Mapped[int] = mapped_column(BigInteger)
    done: Mapped[int] = mapped_column(BigInteger)
    dropped: Mapped[int] = mapped_column(BigInteger)
    live: Mapped[int] = mapped_column(BigInteger)
    first_ts: Mapped[float | None] = mapped_column(Float)
    last_ts: Mapped[float | None] = mapped_column(Float)


class PositionRow(Base):
    """How far a consumer (or a ``load`` of one file) got: written with the rows it covers."""

    __tablename__ = "positions"
    consumer: Mapped[str] = mapped_column(String(512), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger)  # last stream sequence (or log line) applied
    watermark: Mapped[float | None] = mapped_column(Float)


class SnapshotRow(Base):
    """The tracker's in-memory state after every event with ``pos <= event_pos`` (a pickle of
    :class:`~prorsa_tracker.state.TrackerState`), so a restart replays only the events after it."""

    __tablename__ = "snapshots"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    format: Mapped[int] = mapped_column(Integer)  # SNAPSHOT_FORMAT of the code that wrote it
    event_pos: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[bytes] = mapped_column(LargeBinary)
