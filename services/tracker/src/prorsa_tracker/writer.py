"""The SQL writer: a processed batch's rows and the consumer position in ONE transaction.

The hot tables are written with one ``executemany`` of plain tuples per table through
``Connection.exec_driver_sql``: the DBAPI (sqlite3 / psycopg 3) binds the rows in C, so
there is no per-row SQLAlchemy parameter processing (it was ~25% of the ingest profile),
while errors still come back as SQLAlchemy ``DBAPIError``s and a dead connection is
invalidated in the pool (what the service's database-outage retry relies on).
The statements are the same on SQLite and PostgreSQL apart from the placeholder.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine

EVENT_COLS = ("seq", "event_id", "run", "traj", "type", "ts", "raw")
ANOMALY_COLS = ("source", "seq", "event_id", "run", "traj", "type", "ts", "reason", "raw")
REQUEST_COLS = (
    "run", "traj", "req", "turn", "prompt_tokens", "cached_tokens", "output_tokens", "queued_ts",
    "prefill_started_ts", "prefill_finished_ts", "decode_finished_ts", "finish", "engine", "decode_engine",
)
SPAN_COLS = ("run", "traj", "kind", "start_ts", "end_ts", "mode", "ok", "tokens", "reward")
TRAJ_COLS = (
    "run", "traj", "state", "state_ts", "dispatched_ts", "ended_ts", "grp", "policy_version", "sandbox_mode",
    "turns", "context_tokens", "admitted", "reward", "drop_reason",
)
RUN_COLS = (
    "run", "mode", "batch_size", "max_staleness", "group_size", "injection", "declared", "policy_version",
    "dispatched", "rewarded", "admitted", "done", "dropped", "live", "first_ts", "last_ts",
)


def _insert(table: str, cols: tuple[str, ...], conflict: str = "") -> str:
    return f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))}){conflict}"


def _upsert(table: str, cols: tuple[str, ...], key: tuple[str, ...], keep: tuple[str, ...] = ()) -> str:
    sets = ", ".join(f"{c} = excluded.{c}" for c in cols if c not in key and c not in keep)
    return _insert(table, cols, f" ON CONFLICT ({', '.join(key)}) DO UPDATE SET {sets}")


# The unique event_id is the last guard against a re-sent event: skip it, never fail.
SQL_EVENTS = _insert("events", EVENT_COLS, " ON CONFLICT (event_id) DO NOTHING")
SQL_ANOMALIES = _insert("anomalies", ANOMALY_COLS)
SQL_REQUESTS = _insert("requests", REQUEST_COLS)
SQL_SPANS = _insert("spans", SPAN_COLS)
# dispatched_ts is written once, by the row's first INSERT (later events leave it alone).
SQL_TRAJECTORIES = _upsert("trajectories", TRAJ_COLS, ("run", "traj"), keep=("dispatched_ts",))
SQL_RUNS = _upsert("runs", RUN_COLS, ("run",))
SQL_POSITION = _upsert("positions", ("consumer", "seq", "watermark"), ("consumer",))


class Statements:
    """The statements in the dialect's placeholder style (``?`` for sqlite3, ``%s`` for psycopg)."""

    def __init__(self, engine: Engine) -> None:
        pg = engine.dialect.name == "postgresql"

        def fix(sql: str) -> str:
            return sql.replace("?", "%s") if pg else sql

        self.events = fix(SQL_EVENTS)
        self.anomalies = fix(SQL_ANOMALIES)
        self.requests = fix(SQL_REQUESTS)
        self.spans = fix(SQL_SPANS)
        self.trajectories = fix(SQL_TRAJECTORIES)
        self.runs = fix(SQL_RUNS)
        self.position = fix(SQL_POSITION)


_STATEMENTS: dict[int, Statements] = {}


def statements(engine: Engine) -> Statements:
    """The (cached) statements for ``engine``'s dialect."""
    st = _STATEMENTS.get(id(engine.dialect))
    if st is None:
        st = _STATEMENTS[id(engine.dialect)] = Statements(engine)
    return st


def write_rows(conn: Connection, st: Statements, b) -> None:
    """Insert a batch's rows (tuples in the column orders above) on ``conn``, in its transaction."""
    many = conn.exec_driver_sql
    if b.events:
        many(st.events, b.events)
    if b.anomalies:
        many(st.anomalies, b.anomalies)
    if b.requests:
        many(st.requests, b.requests)
    if b.spans:
        many(st.spans, b.spans)
    if b.trajectories:
        many(st.trajectories, list(b.trajectories.values()))
