"""Pytest fixtures on real infrastructure, shared by every package's tests.

* ``nats_server``: one real nats-server per test session (free port, own JetStream store),
  started by waiting for its "Server is ready" line, never by sleeping.
* ``nats_factory``: start extra servers that a test may kill and restart.
* ``ns``: a unique subject prefix and stream per test, so tests share a server safely.
* ``pg_url``: a fresh PostgreSQL database per test on the local server
  (``PRORSA_TEST_PG_URL``, default ``postgresql+psycopg://postgres@127.0.0.1:5432/test``).
  When the server cannot be reached the test is skipped locally, but FAILS under CI
  (``CI`` set): the PostgreSQL tests must run there.
* ``wait_until`` / ``async_wait_until``: poll a condition with a timeout.
* ``stream_messages``: every message of a namespace's stream, in order, decoded.

Enabled by ``pytest_plugins = ["prorsa_runtime.testing"]`` in the root conftest.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from prorsa_schemas import Namespace

from .natsserver import NatsServer

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def wait_until(cond: Callable[[], object], timeout: float = 30.0, interval: float = 0.01, what: str = "") -> object:
    """Poll ``cond`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        time.sleep(interval)


async def async_wait_until(
    cond: Callable[[], object | Awaitable[object]], timeout: float = 30.0, interval: float = 0.01, what: str = ""
) -> object:
    """Async :func:`wait_until`; ``cond`` may be a coroutine function."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = cond()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or cond}")
        await asyncio.sleep(interval)


async def stream_messages(url: str, ns: Namespace) -> list:
    """Every message of ``ns``'s stream on the server at ``url``, in stream order, as
    ``(Nats-Msg-Id, event)`` pairs (events decoded against the contract)."""
    import nats

    from prorsa_schemas import decode_event

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        total = (await js.stream_info(ns.stream)).state.messages
        sub = await js.subscribe(ns.stream_subjects()[0], ordered_consumer=True)
        out = []
        for _ in range(total):
            msg = await sub.next_msg(timeout=10)
            out.append(((msg.headers or {}).get("Nats-Msg-Id"), decode_event(msg.data)))
        return out
    finally:
        await nc.close()


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    server = NatsServer(tmp_path_factory.mktemp("nats-store"), port=0).start()
    yield server
    server.stop()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    if not nats_server.running():  # a test killed the shared server: bring it back
        nats_server.start()
    return nats_server.url


@pytest.fixture
def nats_factory(tmp_path: Path) -> Iterator[Callable[..., NatsServer]]:
    """Start private servers that a test may kill, restart or stop; all are stopped after."""
    servers: list[NatsServer] = []

    def make(**kwargs: object) -> NatsServer:
        store = tmp_path / f"nats-{len(servers)}"
        server = NatsServer(store, port=int(kwargs.pop("port", 0)), **kwargs).start()  # type: ignore[arg-type]
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def ns() -> Namespace:
    tag = uuid.uuid4().hex[:10]
    return Namespace(prefix=f"t{tag}", stream=f"T{tag}")


def _pg_base_url() -> str:
    return os.environ.get("PRORSA_TEST_PG_URL", DEFAULT_PG_URL)


@pytest.fixture
def pg_url() -> Iterator[str]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.engine import make_url

    base = make_url(_pg_base_url())
    admin = sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql("select 1")
    except Exception as exc:
        admin.dispose()
        msg = f"PostgreSQL at {base.render_as_string(hide_password=True)} is unreachable: {exc}"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI must run the PostgreSQL tests)")
        pytest.skip(msg)
    admin.dispose()
    with temporary_database(base.render_as_string(hide_password=False), prefix="prorsa_t_") as url:
        yield url


@contextmanager
def temporary_database(base_url: str, prefix: str = "prorsa_tmp_") -> Iterator[str]:
    """Create an empty PostgreSQL database next to ``base_url``'s; drop it on exit.

    Used by the ``pg_url`` fixture and by the benchmarks.
    """
    import sqlalchemy
    from sqlalchemy.engine import make_url

    base = make_url(base_url)
    if base.drivername == "postgresql":
        base = base.set(drivername="postgresql+psycopg")
    admin = sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT")
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
