"""The query commands as a person reads them: whole ids and UTC times at 80 columns, only
rollout runs by default, `--since/--until` in the forms people type, one clear line and
exit 1 for what is not there; `--version`, flags without a type, a bad NATS URL refused
fast. Real `prorsa` processes on real SQLite files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from prorsa_runtime.humane import TimeError, fit_columns, human_ts, parse_time, table_width
from prorsa_schemas import LogWriter
from prorsa_tracker.examples import EventFactory, workload

PRORSA = [sys.executable, "-m", "prorsa_cli.main"]
RUN = "demo-20261106-173001-7f3a9c"  # as long as the ids `prorsa demo` makes
T0 = 1796100000.0  # 2026-12-01 04:40:00 UTC


def prorsa(*args: str, columns: int = 80, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`prorsa` as a process, in a terminal ``columns`` wide."""
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": str(columns)}
    env.pop("PRORSA_TRACKER_DB_URL", None)
    env.pop("PRORSA_NATS_URL", None)
    return subprocess.run([*PRORSA, *args], capture_output=True, text=True, timeout=timeout, env=env)


def cli(*args: str, columns: int = 80):
    """`prorsa` in this process (a second each saved), its tables ``columns`` wide."""
    from typer.testing import CliRunner

    from prorsa_runtime import cli as common
    from prorsa_cli.main import app

    widths = common.out.width, common.console.width
    common.out.width = common.console.width = columns
    try:
        return CliRunner(env={"PRORSA_TRACKER_DB_URL": None, "PRORSA_NATS_URL": None}).invoke(app, list(args))
    finally:
        common.out.width, common.console.width = widths


def make_db(folder: Path, t0: float = T0, n: int = 3) -> str:
    """A tracker database with one rollout run and the two pseudo-runs services label with."""
    evs = workload(n, run=RUN, t0=t0, traj_prefix="traj-0123456789abcdef")
    agent, services = EventFactory("engines", prefix="eng"), EventFactory("prorsa", prefix="svc")
    evs += [agent("engine.registered", t0 - 1, engine="e1", server="s1", role="prefill", gpus=8, kv_capacity_tokens=1000),
            services("engine.registered", t0 - 1, engine="e2", server="s1", role="decode", gpus=8, kv_capacity_tokens=1000)]
    log = folder / "run.jsonl"
    with LogWriter(log) as w:
        for e in sorted(evs, key=lambda e: e.ts):
            w.write(e)
    db = f"sqlite:///{folder / 'tracker.db'}"
    r = cli("tracker", "load", str(log), "--db", db)
    assert r.exit_code == 0, r.output
    return db


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> str:
    return make_db(tmp_path_factory.mktemp("queries"))


# -- pure rules ---------------------------------------------------------------------------------

def test_times_people_type_are_read() -> None:
    now = 1796100000.0
    assert parse_time("2026-12-01T04:40:00", now) == now  # no offset: UTC
    assert parse_time("2026-12-01 04:40", now) == now
    assert parse_time("2026-12-01T04:40:00Z", now) == now
    assert parse_time("2026-12-01T06:40:00+02:00", now) == now
    assert parse_time("1796100000", now) == now and parse_time("1796100000.5", now) == now + 0.5
    assert parse_time("-10m", now) == now - 600 == parse_time("10m", now)
    assert parse_time("2h", now) == now - 7200 and parse_time("1d", now) == now - 86400
    assert parse_time("now", now) == now
    for bad in ("yesterday", "12/01/2026", "-10x", ""):
        with pytest.raises(TimeError, match="not a time"):
            parse_time(bad, now)


def test_tables_show_utc_times_and_drop_the_least_useful_columns_first() -> None:
    assert human_ts(1796100000.0) == "2026-12-01 04:40:00"
    assert human_ts(1796100000.25, ms=True) == "2026-12-01 04:40:00.250"
    assert human_ts(None) == "" and human_ts(float("nan")) == ""
    widths = {"id": 30, "a": 10, "b": 10, "c": 10}
    assert fit_columns(["id", "a", "b", "c"], widths, 200, ["c", "b"]) == ["id", "a", "b", "c"]
    assert table_width([30, 10]) <= 55 < table_width([30, 10, 10])
    assert fit_columns(["id", "a", "b", "c"], widths, 55, ["c", "b"]) == ["id", "a"]
    # Columns not offered for dropping stay, even when the table is still too wide.
    assert fit_columns(["id", "a", "b", "c"], widths, 10, ["c"]) == ["id", "a", "b"]


# -- the commands -------------------------------------------------------------------------------

def test_runs_at_80_columns_keep_the_run_id_whole_with_utc_times(db: str) -> None:
    r = prorsa("runs", "--db", db)  # a real process: the width comes from the terminal (COLUMNS)
    assert r.returncode == 0, r.stderr
    assert RUN in r.stdout and "…" not in r.stdout
    assert "2026-12-01 04:40" in r.stdout and "(UTC)" in r.stdout and "17961" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    assert "left out at this width" in r.stderr  # and says so
    wide = cli("runs", "--db", db, columns=200)
    assert "injection" in wide.stdout and "left out" not in wide.stderr


def test_runs_lists_rollout_runs_and_all_adds_the_service_labels(db: str) -> None:
    rows = json.loads(cli("runs", "--db", db, "--json").stdout)
    assert [row["run"] for row in rows] == [RUN]
    rows = json.loads(cli("runs", "--db", db, "--json", "--all").stdout)
    assert sorted(row["run"] for row in rows) == sorted([RUN, "engines", "prorsa"])
    assert all(isinstance(row["first_ts"], (float, type(None))) for row in rows)  # JSON keeps epoch seconds
    assert "engines" not in cli("runs", "--db", db).stdout


def test_trajectories_and_history_at_80_columns_keep_ids_whole(db: str) -> None:
    r = cli("trajectories", "--run", RUN, "--db", db)
    assert r.exit_code == 0, r.output
    for i in range(3):
        assert f"traj-0123456789abcdef{i}" in r.stdout
    assert RUN in r.stdout and "…" not in r.stdout and "2026-12-01 04:40:0" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 80
    h = cli("history", "traj-0123456789abcdef0", "--run", RUN, "--db", db)
    assert h.exit_code == 0, h.output
    assert "traj-0123456789abcdef0-q0" in h.stdout and "…" not in h.stdout
    assert "(UTC 2026-12-01)" in h.stdout  # one day: the date once, times of day with ms
    assert max(len(line) for line in h.stdout.splitlines()[1:]) <= 80  # the tables (line 1 is a sentence)


def test_since_and_until_take_iso_epoch_and_relative_times(tmp_path: Path) -> None:
    t0 = time.time() - 3600  # an hour ago: the trajectories end within a minute of it
    db = make_db(tmp_path, t0=t0)

    def trajs(*args: str) -> int:
        r = cli("trajectories", "--run", RUN, "--db", db, "--json", *args)
        assert r.exit_code == 0, r.output
        return len(json.loads(r.stdout))

    assert trajs("--since", "2h") == 3 and trajs("--since", "-30m") == 0
    assert trajs("--until", str(t0 - 60)) == 0 and trajs("--until", f"{t0 + 60:.3f}") == 3
    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t0 - 60))
    assert trajs("--since", iso) == 3 and trajs("--until", iso) == 0
    r = cli("trajectories", "--run", RUN, "--db", db, "--since", "yesterday", columns=200)
    assert r.exit_code == 2 and "--since: not a time: 'yesterday'" in r.stderr


def test_an_unknown_run_is_an_error_with_the_runs_there_are(db: str) -> None:
    for args in (["trajectories", "--run", "nope"], ["history", "t1", "--run", "nope"], ["export", "--run", "nope"]):
        r = cli(*args, "--db", db, columns=300)
        assert r.exit_code == 1, (args, r.output)
        assert "no run 'nope'" in r.stderr and RUN in r.stderr, args
        assert r.stdout == ""


def test_a_missing_sqlite_file_is_an_error_and_nothing_is_created(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "tracker.db"
    r = prorsa("runs", "--db", f"sqlite:///{missing}", columns=300)
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith(f"error: no tracker database at {missing}: the file does not exist"), r.stderr
    r = cli("trajectories", "--run", RUN, "--db", f"sqlite:///{missing}", columns=300)
    assert r.exit_code == 1 and "no tracker database at" in r.stderr
    assert not (tmp_path / "no").exists()


def test_help_shows_no_type_beside_flags_and_version_prints() -> None:
    r = cli("runs", "--help", columns=120)
    assert "--json" in r.stdout and "--all" in r.stdout and "<bool>" not in r.stdout
    assert "<bool>" not in cli("--help").stdout
    v = prorsa("--version")
    assert v.returncode == 0 and v.stdout.startswith("prorsa 0.") and "prorsa-tracker" in v.stdout


def test_a_bad_nats_url_fails_in_seconds(tmp_path: Path) -> None:
    from prorsa_runtime import free_port

    log = tmp_path / "e.jsonl"
    with LogWriter(log) as w:
        w.write(EventFactory("r")("trajectory.dispatched", 1.0, traj="a", prompt_tokens=1))
    for url in ("not a url", "http://127.0.0.1:4222", "nats://host:99999"):
        r = cli("publish", str(log), "--nats", url, columns=300)
        said = " ".join(r.stderr.replace("│", " ").split())  # typer's error box wraps the line
        assert r.exit_code == 2 and "is not a NATS URL" in said, (url, r.output)
    start = time.monotonic()  # a URL where nothing listens: the default wait is 3 s, not 30
    r = cli("publish", str(log), "--nats", f"nats://127.0.0.1:{free_port()}", columns=300)
    elapsed = time.monotonic() - start
    assert r.exit_code == 1 and "could not connect" in r.stderr and "within 3s" in r.stderr
    assert elapsed < 8, elapsed


def test_report_reads_metrics_with_prometheus_client_parser() -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge

    from prorsa_cli.report import scrape
    from prorsa_runtime.metrics import serve_metrics

    reg = CollectorRegistry()
    Gauge("prorsa_forecaster_wape", "w", ["series"], registry=reg).labels("prefill").set(0.0875)
    Counter("prorsa_forecaster_windows", "n", registry=reg).inc(3)
    server = serve_metrics(reg, 0, lambda: (True, {}), host="127.0.0.1")
    try:
        m = scrape(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert m['prorsa_forecaster_wape{series="prefill"}'] == 0.0875
    assert m["prorsa_forecaster_windows_total"] == 3.0

    class NotMetrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's API
            body = b"<html>not metrics</html>"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    other = ThreadingHTTPServer(("127.0.0.1", 0), NotMetrics)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        assert scrape(f"http://127.0.0.1:{other.server_address[1]}") == {}
    finally:
        other.shutdown()
