"""The SQL writer: a processed batch's rows and the consumer position in ONE transaction.

The hot tables are written with one ``executemany`` of plain tuples per table through
``Connection.exec_driver_sql``: the DBAPI (sqlite3 / psycopg 3) binds the rows in C, so
there is no per-row SQLAlchemy parameter processing (it was ~25% of the ingest profile),
while errors still come back as SQLAlchemy ``DBAPIError``s and a dead connection is
invalidated in the pool (what the service's database-outage retry relies on).
On SQLite the rows go as multi-row ``INSERT ... VALUES (...), (...), ...`` of up to 250
rows per statement: sqlite3 releases the interpreter lock around every statement step, and
with one row per step the writer thread had to win the lock back from the busy fold
thousands of times per batch (writes took 2-4x their solo time in the live pipeline). On PostgreSQL,
psycopg's executemany still costs ~20 us of Python per row and a server round trip per
pipeline sync, so each table is ONE statement whose parameters are column arrays
(``INSERT ... SELECT * FROM unnest($1::bigint[], $2::text[], ...) WITH ORDINALITY ...
ORDER BY ordinality``): the rows are inserted in batch order (``events.pos`` is the
applied order) with the same ON CONFLICT clauses as on SQLite.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine

EVENT_COLS = ("seq", "event_id", "run", "traj", "type", "ts", "raw")
ANOMALY_COLS = ("source", "seq", "event_id", "run", "traj", "type", "ts", "reason", "raw", "subject")
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


# PostgreSQL array types of the columns (for the unnest form).
PG_TYPES = {
    "seq": "bigint", "event_id": "text", "run": "text", "traj": "text", "type": "text", "ts": "float8",
    "raw": "bytea", "source": "text", "reason": "text", "req": "text", "turn": "integer",
    "prompt_tokens": "bigint", "cached_tokens": "bigint", "output_tokens": "bigint", "queued_ts": "float8",
    "prefill_started_ts": "float8", "prefill_finished_ts": "float8", "decode_finished_ts": "float8",
    "finish": "text", "engine": "text", "decode_engine": "text", "kind": "text", "start_ts": "float8",
    "end_ts": "float8", "mode": "text", "ok": "boolean", "tokens": "bigint", "reward": "float8",
    "state": "text", "state_ts": "float8", "dispatched_ts": "float8", "ended_ts": "float8", "grp": "text",
    "policy_version": "integer", "sandbox_mode": "text", "turns": "integer", "context_tokens": "bigint",
    "admitted": "boolean", "drop_reason": "text", "subject": "text",
}


def _pg_unnest(sql: str, cols: tuple[str, ...]) -> str:
    # "INSERT INTO t (cols) VALUES (?, ...) <conflict>" -> the same rows from column arrays.
    head, rest = sql.split(" VALUES ", 1)
    conflict = rest[rest.index(")") + 1 :]
    arrays = ", ".join(f"%b::{PG_TYPES[c]}[]" for c in cols)  # %b: binary arrays, dumped in C
    return (f"{head} SELECT {', '.join(cols)} FROM unnest({arrays}) WITH ORDINALITY AS u({', '.join(cols)}, ord) "
            f"ORDER BY ord{conflict}")


class Statements:
    """The statements of one dialect: ``?`` placeholders for sqlite3; for psycopg ``%s`` and,
    for the per-row tables, the column-array form (``pg`` True)."""

    def __init__(self, engine: Engine) -> None:
        self.pg = pg = engine.dialect.name == "postgresql"

        def fix(sql: str, cols: tuple[str, ...] | None = None) -> str:
            if not pg:
                return sql
            return _pg_unnest(sql, cols) if cols else sql.replace("?", "%s")

        self.events = fix(SQL_EVENTS, EVENT_COLS)
        self.anomalies = fix(SQL_ANOMALIES, ANOMALY_COLS)
        self.requests = fix(SQL_REQUESTS, REQUEST_COLS)
        self.spans = fix(SQL_SPANS, SPAN_COLS)
        self.trajectories = fix(SQL_TRAJECTORIES, TRAJ_COLS)
        self.runs = fix(SQL_RUNS)
        self.position = fix(SQL_POSITION)


_STATEMENTS: dict[str, Statements] = {}


def statements(engine: Engine) -> Statements:
    """The (cached) statements for ``engine``'s dialect."""
    name = engine.dialect.name
    st = _STATEMENTS.get(name)
    if st is None:
        st = _STATEMENTS[name] = Statements(engine)
    return st


def _columns(conn: Connection):
    def many(sql: str, rows) -> None:
        conn.exec_driver_sql(sql, tuple(list(col) for col in zip(*rows)))

    return many


ROWS_PER_STATEMENT = 250  # x 14 columns at most: far below SQLite's 32766 variables
_MULTI: dict[tuple[str, int], str] = {}


def _multirow(sql: str, rows: int) -> str:
    # "INSERT INTO t (cols) VALUES (?, ...) <conflict>" -> the same with ``rows`` tuples.
    got = _MULTI.get((sql, rows))
    if got is None:
        head, rest = sql.split(" VALUES ", 1)
        end = rest.index(")") + 1
        got = f"{head} VALUES {', '.join([rest[:end]] * rows)}{rest[end:]}"
        if len(_MULTI) < 4096:
            _MULTI[(sql, rows)] = got
    return got


def _multirows(conn: Connection):
    def many(sql: str, rows) -> None:
        for i in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[i : i + ROWS_PER_STATEMENT]
            conn.exec_driver_sql(_multirow(sql, len(chunk)), tuple([v for r in chunk for v in r]))

    return many


def write_rows(conn: Connection, st: Statements, b) -> None:
    """Insert a batch's rows (tuples in the column orders above) on ``conn``, in its transaction."""
    many = _columns(conn) if st.pg else _multirows(conn)
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
