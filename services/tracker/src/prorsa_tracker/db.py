"""Database engines and migrations: SQLite (WAL) by default, PostgreSQL in production."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

DEFAULT_DB_URL = "sqlite:///prorsa-tracker.db"


class DatabaseUrlError(ValueError):
    """The database URL is malformed or names an unsupported backend."""


def normalize_url(url: str) -> str:
    """Check a URL and pin the psycopg (v3) driver for PostgreSQL."""
    try:
        u = make_url(url)
    except ArgumentError as exc:
        raise DatabaseUrlError(f"not a database URL: {url!r} (e.g. sqlite:///tracker.db or postgresql://host/db)") from exc
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if u.get_backend_name() == "sqlite":
        return url
    raise DatabaseUrlError(f"unsupported database {u.get_backend_name()!r}: use sqlite:/// or postgresql://")


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, NORMAL sync and a busy timeout."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        eng = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(eng, "connect")
        def _pragmas(dbapi_conn, _record) -> None:  # noqa: ANN001
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            # NORMAL in WAL mode: a commit survives a process crash (kill -9); only an OS
            # crash can lose the last transactions, never corrupt the file.
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return eng
    return create_engine(url, pool_pre_ping=True)


def migrate(url_or_engine: str | Engine) -> None:
    """Bring the schema to the newest Alembic revision (idempotent)."""
    from alembic import command
    from alembic.config import Config

    eng = make_engine(url_or_engine) if isinstance(url_or_engine, str) else url_or_engine
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(__file__).parent / "migrations"))
    with eng.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    if isinstance(url_or_engine, str):
        eng.dispose()
