"""What an operator sees when things are wrong: `tracker run` stops with one clear line on a
database that cannot work and waits out one that is down; no password is ever printed;
`tracker load` reports poison lines and goes on; an export loads without anomalies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from sqlalchemy import func, select
from typer.testing import CliRunner

from prorsa_cli.main import app
from prorsa_runtime.testing import wait_until
from prorsa_schemas import LogWriter
from prorsa_tracker.db import make_engine
from prorsa_tracker.examples import EventFactory
from prorsa_tracker.models import AnomalyRow, EventRow

PRORSA = str(Path(sys.executable).with_name("prorsa"))
runner = CliRunner()
SECRET = "hunter2"


def text(r) -> str:
    return " ".join(r.output.split())


def tracker_run(db: str, tmp_path: Path, timeout: float = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PRORSA_TRACKER_DB_URL": db, "PRORSA_NATS_URL": "nats://127.0.0.1:1"}
    return subprocess.run([PRORSA, "tracker", "run"], env=env, capture_output=True, text=True, timeout=timeout,
                          cwd=tmp_path)


def last_line(err: str) -> str:
    return err.strip().splitlines()[-1]


@pytest.fixture
def pg_base():
    """The local PostgreSQL server's base URL (skips locally when it is unreachable, fails under CI)."""
    pytest.importorskip("psycopg")
    from sqlalchemy.engine import make_url

    from prorsa_runtime.testing import DEFAULT_PG_URL

    url = make_url(os.environ.get("PRORSA_TEST_PG_URL", DEFAULT_PG_URL))
    eng = make_engine(url.render_as_string(hide_password=False))
    try:
        with eng.connect() as c:
            c.exec_driver_sql("select 1")
    except Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(f"PostgreSQL unreachable under CI: {exc}")
        pytest.skip(f"PostgreSQL unreachable: {exc}")
    finally:
        eng.dispose()
    return url


def test_unknown_dialect_is_one_clear_line_without_the_password(tmp_path) -> None:
    r = tracker_run(f"mysql://root:{SECRET}@127.0.0.1/prorsa", tmp_path)
    assert r.returncode == 2
    assert SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert last_line(r.stderr) == "error: unsupported database 'mysql' in mysql://root:***@127.0.0.1/prorsa: use sqlite:/// or postgresql://"


def test_a_database_that_does_not_exist_stops_the_tracker_with_one_line(tmp_path, pg_base) -> None:
    db = pg_base.set(password=SECRET, database="prorsa_no_such_db").render_as_string(hide_password=False)
    r = tracker_run(db, tmp_path)
    assert r.returncode == 1, r.stderr
    assert SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr
    line = last_line(r.stderr)
    assert line.startswith("error: the database postgresql+psycopg://") and ":***@" in line
    assert 'database "prorsa_no_such_db" does not exist' in line


def test_refused_credentials_stop_the_tracker_with_one_line(tmp_path, pg_base) -> None:
    db = pg_base.set(username="prorsa_nobody", password=SECRET).render_as_string(hide_password=False)
    r = tracker_run(db, tmp_path)
    assert r.returncode == 1, r.stderr
    assert SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert 'role "prorsa_nobody" does not exist' in last_line(r.stderr)


def test_a_wrong_password_stops_the_tracker_with_one_line(tmp_path, private_pg) -> None:
    """A private server that asks for a password (scram) for one role: the wrong one is refused."""
    hba = private_pg.data / "pg_hba.conf"
    hba.write_text("host all prorsa_pw 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
    private_pg._run("pg_ctl", "-D", str(private_pg.data), "reload")
    eng = make_engine(private_pg.url)
    with eng.begin() as c:
        c.exec_driver_sql("CREATE ROLE prorsa_pw LOGIN PASSWORD 'right-one'")
    eng.dispose()
    db = f"postgresql://prorsa_pw:{SECRET}@127.0.0.1:{private_pg.port}/postgres"

    def refused() -> bool:  # the reload has taken effect
        probe = make_engine(db)
        try:
            probe.connect().close()
            return False
        except Exception as exc:
            return "password authentication failed" in str(exc)
        finally:
            probe.dispose()

    wait_until(refused, timeout=30, what="the server to ask prorsa_pw for its password")
    r = tracker_run(db, tmp_path)
    assert r.returncode == 1, r.stderr
    assert SECRET not in r.stdout + r.stderr and "Traceback" not in r.stderr
    line = last_line(r.stderr)
    assert 'password authentication failed for user "prorsa_pw"' in line and "prorsa_pw:***@" in line


def test_an_sqlite_file_that_is_no_database_stops_the_tracker(tmp_path) -> None:
    path = tmp_path / "t.db"
    path.write_bytes(b"this is not an SQLite file" * 100)
    r = tracker_run(f"sqlite:///{path}", tmp_path)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert last_line(r.stderr) == f"error: the database sqlite:///{path} cannot be used: file is not a database"


def test_a_database_that_is_down_is_waited_for_with_back_off(tmp_path) -> None:
    # A port bound and held but not listening: a connection is refused (an outage), and no
    # other test process can start a server on it while the tracker retries (a port only
    # found free can be taken by one: the refusal then becomes that server's reply).
    held = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    held.bind(("127.0.0.1", 0))
    port = held.getsockname()[1]
    db = f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/prorsa"
    env = {**os.environ, "PRORSA_TRACKER_DB_URL": db, "PRORSA_NATS_URL": "nats://127.0.0.1:1",
           "PRORSA_TRACKER_DB_RETRY_S": "0.1"}
    proc = subprocess.Popen([PRORSA, "tracker", "run"], env=env, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        wait_until(lambda: sum("unavailable" in x for x in lines) >= 3, timeout=30, what="three retries")
        assert proc.poll() is None  # still waiting, not given up
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(30)
        held.close()
    reader.join(10)
    retries = [x for x in lines if "unavailable" in x]
    assert rc == 0
    assert all(SECRET not in x for x in lines) and ":***@" in retries[0]
    assert "Connection refused" in retries[0]
    # the waits grow: 0.1, 0.2, 0.4 ...
    assert [x.split("retrying in ")[1].split("s")[0] for x in retries[:3]] == ["0.1", "0.2", "0.4"]


def test_load_and_queries_never_print_the_password(tmp_path, pg_base) -> None:
    log = tmp_path / "in.jsonl"
    log.write_text("")
    bad = pg_base.set(password=SECRET, database="prorsa_no_such_db").render_as_string(hide_password=False)
    # A database that is not there: exit 1 for a query (nothing to read), 2 for a URL that is wrong.
    for args, code in ((["tracker", "load", str(log), "--db", bad], 2), (["runs", "--db", bad], 1),
                       (["export", "--run", "r", "--db", bad], 1),
                       (["runs", "--db", f"postgresql://u:{SECRET}@127.0.0.1:notaport/x"], 2)):
        r = runner.invoke(app, args)
        assert r.exit_code == code, (args, r.output)
        assert SECRET not in r.output and ":***@" in r.output, (args, r.output)


def test_load_reports_poison_lines_with_their_number_and_goes_on(tmp_path) -> None:
    f = EventFactory("r1")
    log = tmp_path / "poison.jsonl"
    with LogWriter(log) as w:
        w.write(f("trajectory.dispatched", 1.0, traj="a", prompt_tokens=10))
        w.write_raw(b"[" * 1000)
        w.write_raw(b"\xff\xfe not utf-8")
        w.write(f("request.queued", 2.0, traj="a", req="q", turn=0, prompt_tokens=10))
    db = f"sqlite:///{tmp_path}/t.db"
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db])
    assert r.exit_code == 0 and "Traceback" not in r.output, r.output
    assert "2 events, 2 anomalies" in text(r)
    lines = [x for x in r.output.splitlines() if x.startswith(f"{log}:") and x[len(str(log)) + 1].isdigit()]
    assert [x.split(": ", 1)[0] for x in lines] == [f"{log}:2", f"{log}:3"]
    assert "nested too deeply" in lines[0] and "not valid JSON" in lines[1]
    eng = make_engine(db)
    with eng.connect() as c:
        got = c.execute(select(AnomalyRow.seq, AnomalyRow.reason, AnomalyRow.raw).order_by(AnomalyRow.id)).all()
    eng.dispose()
    assert [(g.seq, bytes(g.raw)) for g in got] == [(2, b"[" * 1000), (3, b"\xff\xfe not utf-8")]
    assert "nested too deeply" in got[0].reason


def test_load_of_a_cut_gzip_log_fails_and_the_whole_log_continues_it(tmp_path) -> None:
    import gzip

    f = EventFactory("r1")
    whole = tmp_path / "whole.jsonl.gz"
    with LogWriter(whole) as w:
        for i in range(400):
            w.write(f("trajectory.dispatched", 1.0 + i, traj=f"t{i}", prompt_tokens=10 + i))
    log = tmp_path / "run.jsonl.gz"
    data = whole.read_bytes()
    log.write_bytes(data[: len(data) // 2])
    db = f"sqlite:///{tmp_path}/t.db"
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "ends early" in text(r) and "truncated or corrupt" in text(r)
    eng = make_engine(db)
    with eng.connect() as c:
        first = c.scalar(select(func.count()).select_from(EventRow))
    assert 0 < first < 400
    # The complete log under the same name continues after the last whole line.
    log.write_bytes(data)
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db])
    assert r.exit_code == 0, r.output
    assert f"{400 - first} events" in text(r) and f"{first} lines already loaded" in text(r)
    with eng.connect() as c:
        assert c.scalar(select(func.count()).select_from(EventRow)) == 400
    eng.dispose()
    assert len(gzip.decompress(data).splitlines()) == 400


def test_load_of_a_file_with_no_valid_event_fails(tmp_path) -> None:
    log = tmp_path / "notes.jsonl"
    log.write_text("hello\n{\"a\": 1}\n")
    db = f"sqlite:///{tmp_path}/t.db"
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db])
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "no line of" in text(r) and "0 events, 2 anomalies" in text(r)
    # Loaded again, nothing is new: nothing to complain about.
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db])
    assert r.exit_code == 0 and "2 lines already loaded" in text(r), r.output


def _cluster_log(path: Path) -> None:
    """Engines registered under the agents' run; switches carry the rollout runs' ids, and
    run r0 switches e2 in between run r1's switches of it."""
    eng, r0, r1 = EventFactory("engines", prefix="g"), EventFactory("r0", prefix="z"), EventFactory("r1", prefix="y")
    evs = [
        eng("engine.registered", 1.0, engine="e1", server="s1", role="prefill", gpus=8, kv_capacity_tokens=1000),
        eng("engine.registered", 1.0, engine="e2", server="s1", role="decode", gpus=8, kv_capacity_tokens=1000),
        eng("engine.registered", 1.0, engine="e3", server="s2", role="decode", gpus=8, kv_capacity_tokens=1000),
        eng("engine.stats", 2.0, engine="e1", role="prefill", running_reqs=0, queued_reqs=0, kv_used_tokens=0,
            kv_capacity_tokens=1000),
        r1("trajectory.dispatched", 3.0, traj="a", prompt_tokens=10),
        r1("engine.switching", 4.0, engine="e2", cmd="c1", from_role="decode", to_role="prefill"),
        r1("engine.switched", 5.0, engine="e2", cmd="c1", from_role="decode", to_role="prefill", seconds=1.0),
        r0("engine.switching", 6.0, engine="e2", cmd="c0", from_role="prefill", to_role="decode"),
        r0("engine.switched", 7.0, engine="e2", cmd="c0", from_role="prefill", to_role="decode", seconds=1.0),
        eng("engine.stats", 7.5, engine="e3", role="decode", running_reqs=0, queued_reqs=0, kv_used_tokens=0,
            kv_capacity_tokens=1000),
        r1("engine.switching", 8.0, engine="e2", cmd="c2", from_role="decode", to_role="prefill"),
        r1("engine.switched", 9.0, engine="e2", cmd="c2", from_role="decode", to_role="prefill", seconds=1.0),
        r1("engine.switching", 10.0, engine="e1", cmd="c3", from_role="prefill", to_role="decode"),
        r1("engine.switch_failed", 11.0, engine="e1", cmd="c3", role="prefill", error="not idle"),
        r1("trajectory.dropped", 12.0, traj="a", reason="aborted"),
    ]
    with LogWriter(path) as w:
        for e in evs:
            w.write(e)


@pytest.fixture(params=["sqlite", "postgres"])
def db_pair(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/a.db", f"sqlite:///{tmp_path}/b.db"
    return request.getfixturevalue("pg_url"), f"sqlite:///{tmp_path}/b.db"


def test_an_export_loads_without_anomalies(tmp_path, db_pair) -> None:
    full, fresh = db_pair
    log, out = tmp_path / "cluster.jsonl", tmp_path / "r1.jsonl"
    _cluster_log(log)
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", full])
    assert r.exit_code == 0 and "15 events, 0 anomalies" in text(r), r.output
    r = runner.invoke(app, ["export", "--run", "r1", "--db", full, "-o", str(out)])
    assert r.exit_code == 0, r.output
    # r1's 8 events, e1's and e2's registrations and e1's stats (run "engines"), r0's switch
    # of e2 between r1's two; not e3, which r1's events never name
    assert "exported 13 events of run r1" in text(r) and "5 of them engine events of other runs" in text(r)
    r = runner.invoke(app, ["validate", str(out)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["tracker", "load", str(out), "--db", fresh])
    assert r.exit_code == 0 and "13 events, 0 anomalies" in text(r), r.output
    r = runner.invoke(app, ["export", "--run", "r1", "--db", full])  # to stdout: the same bytes
    assert r.exit_code == 0 and r.stdout_bytes == out.read_bytes()
    eng = make_engine(fresh)
    with eng.connect() as c:
        assert c.execute(select(func.count()).select_from(AnomalyRow)).scalar() == 0
        assert c.execute(select(func.count()).select_from(EventRow)).scalar() == 13
    eng.dispose()
    # --with-engines adds e3 (stats while r1 was live, and its registration before): the
    # cluster as the run saw it, for a forecast replay; it loads without anomalies too
    wide = tmp_path / "r1-engines.jsonl"
    r = runner.invoke(app, ["export", "--run", "r1", "--db", full, "--with-engines", "-o", str(wide)])
    assert r.exit_code == 0 and "exported 15 events of run r1" in text(r), r.output
    assert "7 of them engine events of other runs" in text(r), r.output
    lines = wide.read_bytes().splitlines()
    assert sum(b'"engine":"e3"' in line for line in lines) == 2 and set(out.read_bytes().splitlines()) < set(lines)
    r = runner.invoke(app, ["tracker", "load", str(wide), "--db", f"sqlite:///{tmp_path}/w.db"])
    assert r.exit_code == 0 and "15 events, 0 anomalies" in text(r), r.output
    # the run alone (what an export held before) records every switch of an unregistered engine
    alone = tmp_path / "alone.jsonl"
    alone.write_bytes(b"".join(line for line in out.read_bytes().splitlines(keepends=True) if b'"run":"r1"' in line))
    r = runner.invoke(app, ["tracker", "load", str(alone), "--db", f"sqlite:///{tmp_path}/c.db"])
    assert "8 events, 0 anomalies" not in text(r)
