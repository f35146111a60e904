"""load -> export round trip, history by hand, query errors, the HTTP API, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from prorsa_cli.main import app
from prorsa_schemas import LogWriter
from prorsa_tracker import queries
from prorsa_tracker.api import create_app
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.examples import EventFactory, workload
from prorsa_tracker.tools import load

runner = CliRunner()


def text(r) -> str:
    """The command's output with rich's line wrapping undone."""
    return " ".join(r.output.split())


def small_log(path):
    f = EventFactory("r1", prefix="x")
    evs = [
        f("trajectory.dispatched", 1.0, traj="a", prompt_tokens=100, group="g"),
        f("sandbox.started", 1.5, traj="a", mode="cold"),
        f("sandbox.ready", 4.5, traj="a"),
        f("request.queued", 5.0, traj="a", req="q0", turn=0, prompt_tokens=120),
        f("prefill.finished", 6.0, traj="a", req="q0", cached_tokens=20, decode_engine="d1"),
        f("decode.finished", 8.0, traj="a", req="q0", output_tokens=30, finish="tool"),
        f("tool.finished", 10.0, traj="a", result_tokens=40),
        f("request.queued", 10.5, traj="a", req="q1", turn=1, prompt_tokens=190),
        f("prefill.finished", 11.0, traj="a", req="q1"),
        f("decode.finished", 12.0, traj="a", req="q1", output_tokens=5, finish="stop"),
        f("reward.finished", 14.0, traj="a", admitted=True, reward=0.5),
        f("tool.started", 15.0, traj="a"),  # after the end: an anomaly, still logged
    ]
    with LogWriter(path) as w:
        for e in evs:
            w.write(e)
        w.write_raw(b'{"v":1,"type":"nope"}')
    return evs


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/t.db"
    return request.getfixturevalue("pg_url")


def test_load_export_round_trip_and_history_by_hand(db_url, tmp_path) -> None:
    log = tmp_path / "in.jsonl"
    small_log(log)
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db_url])
    assert r.exit_code == 0, r.output
    assert "12 events, 2 anomalies" in text(r)
    r = runner.invoke(app, ["tracker", "load", str(log), "--db", db_url])
    assert "0 events" in text(r) and "13 lines already loaded" in text(r)  # resumable, idempotent
    out = tmp_path / "out.jsonl"
    r = runner.invoke(app, ["export", "--run", "r1", "--db", db_url, "-o", str(out)])
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == b"".join(line for line in log.read_bytes().splitlines(keepends=True) if b"nope" not in line)
    h = queries.history(make_engine(db_url), "r1", "a")
    assert [(s["from"], s["to"]) for s in h["timeline"]] == [
        (None, "dispatched"), ("dispatched", "sandbox"), ("sandbox", "ready"), ("ready", "queued"),
        ("queued", "decode"), ("decode", "tool"), ("tool", "ready"), ("ready", "queued"), ("queued", "decode"),
        ("decode", "reward"), ("reward", "done"),
    ]
    q0, q1 = h["requests"]
    assert (q0["prompt_tokens"], q0["cached_tokens"], q0["output_tokens"], q0["ttft_s"], q0["decode_s"], q0["finish"]) == (120, 20, 30, 1.0, 2.0, "tool")
    assert (q1["prompt_tokens"], q1["output_tokens"], q1["finish"]) == (190, 5, "stop")
    assert [(s["kind"], s["start_ts"], s["end_ts"]) for s in h["spans"]] == [("sandbox", 1.5, 4.5), ("tool", 8.0, 10.0), ("reward", 12.0, 14.0)]
    assert h["trajectory"]["dispatched_ts"] == 1.0 and h["trajectory"]["state"] == "done" and h["trajectory"]["admitted"] is True
    assert len(h["anomalies"]) == 1 and "already ended" in h["anomalies"][0]["reason"]
    r = runner.invoke(app, ["history", "a", "--run", "r1", "--db", db_url])
    assert r.exit_code == 0 and "2 turns" in text(r)
    r = runner.invoke(app, ["trajectories", "--run", "r1", "--db", db_url, "--state", "done", "--json"])
    assert r.exit_code == 0 and '"traj": "a"' in text(r)


def test_query_errors_are_clear(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    log = tmp_path / "in.jsonl"
    small_log(log)
    runner.invoke(app, ["tracker", "load", str(log), "--db", url])
    r = runner.invoke(app, ["trajectories", "--run", "r1", "--db", url, "--state", "flying"])
    assert r.exit_code == 2 and "unknown state" in text(r)
    r = runner.invoke(app, ["history", "zz", "--run", "r1", "--db", url])
    assert r.exit_code == 1 and "no trajectory" in text(r)
    (tmp_path / "empty.db").touch()
    r = runner.invoke(app, ["runs", "--db", f"sqlite:///{tmp_path}/empty.db"])
    assert r.exit_code == 1 and "not a tracker database" in text(r)
    r = runner.invoke(app, ["runs", "--db", f"sqlite:///{tmp_path}/missing.db"])
    assert r.exit_code == 1 and "no tracker database at" in text(r) and not (tmp_path / "missing.db").exists()
    r = runner.invoke(app, ["runs", "--db", "mysql://x/y"])
    assert r.exit_code == 2 and "unsupported database" in text(r)
    r = runner.invoke(app, ["tracker", "load", str(tmp_path / "missing.jsonl"), "--db", url])
    assert r.exit_code == 2 and "no such log file" in text(r)


def test_http_api_token_pagination_and_4xx(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    eng = make_engine(url)
    migrate(eng)
    log = tmp_path / "w.jsonl"
    with LogWriter(log) as w:
        for e in workload(25, turns=1):
            w.write(e)
    load(eng, log)
    c = TestClient(create_app(url, "s3cret"))
    assert c.get("/v1/runs").status_code == 401
    assert c.get("/v1/runs", headers={"Authorization": "Bearer wrong"}).status_code == 401
    h = {"Authorization": "Bearer s3cret"}
    runs = c.get("/v1/runs", headers=h).json()
    assert runs[0]["run"] == "r1" and runs[0]["done"] == 25
    seen = []
    offset = 0
    while offset is not None:
        page = c.get("/v1/runs/r1/trajectories", params={"limit": 10, "offset": offset}, headers=h).json()
        seen += [t["traj"] for t in page["items"]]
        offset = page["next_offset"]
    assert len(seen) == 25 == len(set(seen))
    assert c.get("/v1/runs/r1/trajectories", params={"state": "flying"}, headers=h).status_code == 400
    assert c.get("/v1/runs/r1/trajectories", params={"limit": "many"}, headers=h).status_code == 422
    # An offset past the databases' 64-bit integers (SQLite: OverflowError) is a 422, not a 500.
    for path in ("/v1/runs/r1/trajectories", "/v1/anomalies"):
        assert c.get(path, params={"offset": 2**63}, headers=h).status_code == 422
        assert c.get(path, params={"offset": 2**63 - 1}, headers=h).json()["items"] == []
    assert c.get("/v1/runs/r1/trajectories", params={"since": 5, "until": 1}, headers=h).status_code == 400
    assert c.get("/v1/runs/r1/trajectories/nope", headers=h).status_code == 404
    assert c.get("/v1/runs/nope/trajectories", headers=h).status_code == 404  # a run the log never held
    empty = c.get("/v1/runs/r1/trajectories", params={"state": "live"}, headers=h)
    assert empty.status_code == 200 and empty.json()["items"] == []  # a run it holds, nothing matching
    assert c.get("/v1/runs/r1/trajectories/t3", headers=h).json()["trajectory"]["state"] == "done"
    assert "/v1/runs/{run}/trajectories" in c.get("/openapi.json").json()["paths"]
