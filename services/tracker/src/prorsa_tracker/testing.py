"""Test helpers: a private PostgreSQL server, publishing a workload, and what a database shows.

A private PostgreSQL server per test is for tests that stop and restart the database.

The shared server on localhost:5432 (the ``pg_url`` fixture) must not be stopped, so a
test that takes PostgreSQL away runs its own: ``initdb`` into a temporary directory and
``pg_ctl`` on a free port. initdb refuses to run as root, so as root (CI) the server runs
as the ``postgres`` user in a directory that user owns.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from prorsa_runtime import connect, ensure_stream
from prorsa_schemas import LogWriter, encode_event

from . import projection
from .db import make_engine, migrate
from .models import EventRow, RequestRow, RunRow, SpanRow, TrajectoryRow
from .tools import load


def _bindir() -> Path | None:
    env = os.environ.get("PRORSA_PG_BINDIR")
    candidates = [env] if env else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
    candidates += ["/usr/local/pgsql/bin", "/usr/local/bin", "/usr/bin"]
    for c in candidates:
        if c and (Path(c) / "initdb").exists() and (Path(c) / "pg_ctl").exists():
            return Path(c)
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivatePostgres:
    """One throwaway PostgreSQL server: ``start()``, ``stop()`` (immediate: like a crash), ``url``."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.dir = Path(tempfile.mkdtemp(prefix="prorsa-pg-"))
        self.data = self.dir / "data"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        cmd = [*self.as_user, str(self.bindir / tool), *args]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            log = self.dir / "log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stdout}{r.stderr}{tail}")

    def start(self) -> PrivatePostgres:
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=20"
        self._run("pg_ctl", "-D", str(self.data), "-o", opts, "-l", str(self.dir / "log"), "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "immediate") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def close(self) -> None:
        if self.running():
            try:
                self.stop()
            except RuntimeError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def private_pg() -> Iterator[PrivatePostgres]:
    """A started private PostgreSQL server (removed afterwards). Skips only outside CI when
    the server binaries are not installed; under CI their absence is a failure."""
    bindir = _bindir()
    if bindir is None:
        msg = "PostgreSQL server binaries (initdb, pg_ctl) not found; set PRORSA_PG_BINDIR"
        if os.environ.get("CI"):
            pytest.fail(msg + " (CI must run the PostgreSQL outage test)")
        pytest.skip(msg)
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        pytest.fail("running as root needs runuser to start PostgreSQL as the postgres user")
    pg = PrivatePostgres(bindir)
    try:
        yield pg.start()
    finally:
        pg.close()


# --- the bus and the database as a user sees them ---------------------------------------


async def publish(url, ns, events, invalid: bool = True) -> None:
    """Publish ``events`` (with their ids as Nats-Msg-Id) and then, unless ``invalid`` is
    False, one invalid message."""
    nc = await connect(url, "test-pub")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    for e in events:
        await nc.publish(ns.subject_for(e), encode_event(e), headers={"Nats-Msg-Id": e.id})
    if invalid:
        await nc.publish(ns.invalid(), b"not json at all")
    await nc.flush()
    await nc.close()


def snapshot(url: str) -> dict:
    """What a user can see in the database, minus row ids."""
    eng = make_engine(url)
    with eng.connect() as c:
        snap = {
            "events": c.execute(select(EventRow.event_id, EventRow.raw).order_by(EventRow.pos)).all(),
            "dup_ids": c.execute(select(func.count()).select_from(EventRow)).scalar()
            - c.execute(select(func.count(func.distinct(EventRow.event_id)))).scalar(),
            "trajectories": sorted(c.execute(select(*TrajectoryRow.__table__.c)).all()),
            "requests": sorted(tuple(r)[1:] for r in c.execute(select(*RequestRow.__table__.c)).all()),
            "spans": sorted(tuple(r)[1:] for r in c.execute(select(*SpanRow.__table__.c)).all()),
            "runs": c.execute(select(*RunRow.__table__.c)).all(),
        }
    eng.dispose()
    return snap


def clean(tmp_path: Path, events) -> dict:
    """The :func:`snapshot` of a clean offline ``load`` of ``events`` into a fresh SQLite file."""
    log = tmp_path / "clean.jsonl"
    with LogWriter(log) as w:
        for e in events:
            w.write(e)
    url = f"sqlite:///{tmp_path}/clean.db"
    eng = make_engine(url)
    migrate(eng)
    load(eng, log)
    return snapshot(url)


def committed(url: str, ns) -> int:
    """The stream sequence the live tracker of ``ns`` has committed in ``url`` (0: none yet)."""
    eng = make_engine(url)
    try:
        return projection.position(eng, ns.durable("tracker"))
    except Exception:
        return 0
    finally:
        eng.dispose()
