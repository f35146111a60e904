"""Database engines and migrations: SQLite (WAL) by default, PostgreSQL in production.

Errors name the database by :func:`shown_url` (its password masked) and say whether
retrying can help: :func:`is_permanent` tells a database that does not exist, refused
credentials or an unusable file (the tracker stops with :class:`DatabaseUnusable`) from
an outage (the tracker waits and retries).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, NoSuchModuleError, OperationalError

from prorsa_runtime.redact import mask_secrets, mask_url

DEFAULT_DB_URL = "sqlite:///prorsa-tracker.db"


class DatabaseUrlError(ValueError):
    """The database URL is malformed or names an unsupported backend."""


class DatabaseUnusable(RuntimeError):
    """The database refuses us for good (it does not exist, the credentials are refused, the
    file cannot be opened): retrying would not help. The message masks passwords."""


def shown_url(url: str) -> str:
    """``url`` as messages show it: the password masked (``postgresql://u:***@h/db``)."""
    return mask_url(url)


def error_line(exc: BaseException) -> str:
    """The first line of a database error (the driver's own message when there is one),
    with any password masked."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip()
    return mask_secrets(text.splitlines()[0] if text else type(exc).__name__)


# Messages of errors that no retry fixes (lower case): PostgreSQL's connection failures
# carry no SQLSTATE in psycopg, so the server's text is what there is to go by.
_PERMANENT = (
    "does not exist",  # database "x" / role "x" does not exist
    "password authentication failed",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "unable to open database file",  # SQLite: a path that cannot be created or opened
    "file is not a database",
    "readonly database",
)


def is_transient(exc: BaseException) -> bool:
    """True for an outage worth waiting out: a lost or refused connection, not a permanent error."""
    if not isinstance(exc, DBAPIError) or is_permanent(exc):
        return False
    return isinstance(exc, (OperationalError, InterfaceError)) or exc.connection_invalidated


def is_permanent(exc: BaseException) -> bool:
    """True when the database refuses us for good: retrying ``exc`` cannot succeed (a bad URL,
    a missing driver, a database or role that does not exist, refused credentials, a file
    that cannot be opened)."""
    if isinstance(exc, (DatabaseUrlError, ArgumentError, NoSuchModuleError, ImportError)):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    text = str(exc.orig if exc.orig is not None else exc).lower()
    return any(p in text for p in _PERMANENT)


def normalize_url(url: str) -> str:
    """Check a URL and pin the psycopg (v3) driver for PostgreSQL."""
    try:
        u = make_url(url)
    except (ArgumentError, ValueError, TypeError):  # ValueError: e.g. a port that is no number
        raise DatabaseUrlError(f"not a database URL: {shown_url(url)!r} (e.g. sqlite:///tracker.db or "
                               "postgresql://host/db)") from None
    if u.get_backend_name() == "postgresql":
        return u.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if u.get_backend_name() == "sqlite":
        return url
    raise DatabaseUrlError(f"unsupported database {u.get_backend_name()!r} in {u.render_as_string(hide_password=True)}: "
                           "use sqlite:/// or postgresql://")


def make_engine(url: str) -> Engine:
    """An engine for ``url``; SQLite gets WAL, NORMAL sync and a busy timeout.

    Raises:
        DatabaseUrlError: the URL is malformed, names another backend or a driver that is
            not installed (the message masks the password).
    """
    url = normalize_url(url)
    try:
        return _make_engine(url)
    except (ArgumentError, NoSuchModuleError, ImportError) as exc:
        raise DatabaseUrlError(f"cannot use {shown_url(url)}: {mask_secrets(str(exc).splitlines()[0])}") from None


def _make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        path = make_url(url).database
        if path and path != ":memory:":
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DatabaseUrlError(f"cannot create the folder of {shown_url(url)}: {exc.strerror}") from None
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
