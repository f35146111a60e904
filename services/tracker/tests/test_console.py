"""The web console: its queries (pure cores and SQL), its JSON endpoints and token, the live
hub's bounded queues, and the server-sent stream fed by a running tracker through a real
nats-server. The headless Chromium test is in test_console_browser.py."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from fastapi.testclient import TestClient

from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import LogWriter, encode_event
from prorsa_tracker import console_queries as cq
from prorsa_tracker.api import create_app
from prorsa_tracker.console_demo import T0, demo_events
from prorsa_tracker.console_live import Hub
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.examples import EventFactory
from prorsa_tracker.queries import QueryError
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.console_browser import free_port
from prorsa_tracker.testing import publish
from prorsa_tracker.tools import load

H = {"Authorization": "Bearer s3cret"}


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("console")
    log = d / "demo.jsonl"
    with LogWriter(log) as w:
        for e in demo_events():
            w.write(e)
    url = f"sqlite:///{d}/demo.db"
    eng = make_engine(url)
    migrate(eng)
    assert load(eng, log)["anomalies"] == 0
    eng.dispose()
    return url


# --- pure cores ----------------------------------------------------------------------------


def test_demand_windows_follow_the_contract_definitions() -> None:
    reqs = [
        (1.0, 3.0, 12.0, 100),    # queued in w0, admitted in w0, in decode at t=10
        (4.0, 14.0, None, 50),    # queued in w0, still waiting at t=10: backlog of w1; admitted in w1; decoding at t=20
        (12.0, None, None, 7),    # queued in w1, never prefilled: backlog of every later window
        (21.0, 22.0, 29.0, 1000),  # w2 only
    ]
    fc = [{"t": 10.0, "horizon": 10.0, "prefill_tokens": 60.0, "decode_admit_tokens": 40.0, "decode_kv_tokens": 5.0,
           "decode_kv_now": 100.0}]
    out = cq.demand_windows(reqs, fc, horizon=99.0)
    assert out["horizon"] == 10.0  # the forecast's horizon wins
    w = out["windows"]
    assert [x["t"] for x in w] == [0.0, 10.0, 20.0]
    assert [x["prefill_tokens"] for x in w] == [150, 57, 1007]
    assert [x["decode_admit_tokens"] for x in w] == [100, 50, 1000]
    assert [x["decode_kv_tokens"] for x in w] == [0, 100, 50]
    assert w[0]["forecast"] is None and w[1]["forecast"]["prefill_tokens"] == 60.0
    assert cq.demand_windows([], [], 10.0) == {"horizon": 10.0, "windows": []}
    with pytest.raises(QueryError, match="at most"):
        cq.demand_windows([(0.0, None, None, 1), (1e6, None, None, 1)], [], 1.0)


def test_role_steps_and_switch_rows() -> None:
    f = EventFactory()
    reg = lambda ts, e, role: f("engine.registered", ts, engine=e, server="s", role=role, gpus=8,  # noqa: E731
                                kv_capacity_tokens=1000)
    evs = [json.loads(encode_event(ev)) for ev in [
        reg(1, "a", "prefill"), reg(2, "b", "decode"), reg(2, "c", "decode"),
        f("engine.switching", 10, engine="c", cmd="k1", from_role="decode", to_role="prefill"),
        f("engine.switched", 13, engine="c", cmd="k1", from_role="decode", to_role="prefill", seconds=2.5),
        f("engine.deregistered", 20, engine="b", reason="gone"),
        # A switch of an engine that never registered counts from its engine.switching on.
        f("engine.switching", 25, engine="x", cmd="k9", from_role="decode", to_role="prefill"),
        f("engine.switch_failed", 27, engine="x", cmd="k9", role="decode", error="refused")]]
    steps = cq.role_steps(evs, start=5)
    assert [(s["ts"], s["prefill"], s["decode"], s["switching"]) for s in steps] == [
        (5, 1, 2, 0), (10, 1, 1, 1), (13, 2, 1, 0), (20, 2, 0, 0), (25, 2, 0, 1), (27, 2, 1, 0)]
    plan = {"type": "allocation.plan", "ts": 9, "t": 5.0, "n_prefill": 2, "n_decode": 1, "delta": 0.25, "feasible": True,
            "switches": [{"engine": "c", "to_role": "prefill"}]}
    cmds = [{"type": "engine.command", "ts": 9.5, "cmd": "k1", "engine": "c", "to_role": "prefill", "deadline": 40},
            {"type": "engine.command", "ts": 30, "cmd": "k2", "engine": "a", "to_role": "decode", "deadline": 35,
             "reason": "an operator's note"}]
    orphan = {"type": "engine.switched", "ts": 50, "engine": "a", "cmd": "other", "from_role": "prefill",
              "to_role": "decode", "seconds": 1.0}
    rows = cq.switch_rows(cmds, evs[3:5] + [orphan], [plan], now=60)
    assert [(r["cmd"], r["from_role"], r["to_role"], r["outcome"], r["seconds"]) for r in rows] == [
        ("k1", "decode", "prefill", "switched", 2.5), ("k2", None, "decode", "no outcome by the deadline", None),
        ("other", "prefill", "decode", "switched", 1.0)]
    assert rows[0]["elapsed_s"] == 3.5
    assert rows[0]["reason"] == "plan of the window at 5.0 s: target 2P:1D, delta +0.25, lists this engine"
    assert rows[1]["reason"] == "an operator's note" and rows[2]["reason"] == "no engine.command of this run"


def test_switches_plans_advised_and_nobody_commanded_are_rows_of_their_own() -> None:
    # An allocator in advisory mode: plans every 10 s list switches, no command follows.
    # Consecutive plans advising the same move are one row; a move that stops being advised
    # closes its row, and one advised again later opens another. A plan whose switch was
    # commanded (before the next plan) adds no advice row.
    def plan(ts, *moves):
        return {"type": "allocation.plan", "ts": ts, "t": ts - 0.5, "n_prefill": 3, "n_decode": 1, "delta": 0.1,
                "feasible": True, "switches": [{"engine": e, "to_role": r} for e, r in moves] or None}

    plans = [plan(10, ("d1", "prefill"), ("d3", "prefill")), plan(20, ("d1", "prefill"), ("d3", "prefill")),
             plan(30, ("d1", "prefill")), plan(40), plan(50, ("d1", "prefill")), plan(60, ("p0", "decode"))]
    cmds = [{"type": "engine.command", "ts": 60, "cmd": "k1", "engine": "p0", "to_role": "decode", "deadline": 90}]
    rows = cq.switch_rows(cmds, [], plans, now=70)
    got = [(r["ts"], r["engine"], r["from_role"], r["to_role"], r["outcome"]) for r in rows]
    assert got == [
        (10, "d1", "decode", "prefill", "advised in 3 plans until 30.0 s, not commanded"),
        (10, "d3", "decode", "prefill", "advised in 2 plans until 20.0 s, not commanded"),
        (50, "d1", "decode", "prefill", "advised, not commanded"),
        (60, "p0", None, "decode", "commanded"),
    ]
    assert rows[0]["cmd"] is None and rows[0]["reason"] == (
        "plan of the window at 9.5 s: target 3P:1D, delta +0.10, lists this engine")
    assert cq.advised_rows(cmds, plans[-1:]) == []
    # Two plans at one event time (the weight-update pause's, with its command, and the
    # window's that came in the same instant), the command at that time too: commanded,
    # whichever order the plans are stored in.
    pause, window = plan(70, ("d2", "prefill")), plan(70)
    cmd = {"type": "engine.command", "ts": 70, "cmd": "k2", "engine": "d2", "to_role": "prefill", "deadline": 100}
    for both in ([pause, window], [window, pause]):
        assert cq.advised_rows([cmd], both) == []
        assert [r["outcome"] for r in cq.switch_rows([cmd], [], both, now=80)] == ["commanded"]


# --- the hub -------------------------------------------------------------------------------


def _row(seq, run, traj, typ, ts=1.0):
    return (seq, f"id{seq}", run, traj, typ, ts, b"{}")


async def test_hub_queues_are_bounded_drop_the_oldest_and_say_so() -> None:
    hub = Hub(queue_max=3)
    mine, other = hub.subscribe("r1"), hub.subscribe("r2")
    for seq in range(1, 6):
        hub.publish([_row(seq, "r1", f"t{seq}", "request.queued", ts=seq)])
    items, dropped = hub.take(mine)
    assert dropped == 2 and [i["seq"] for i in items] == [3, 4, 5] and items[0]["trajs"] == ["t3"]
    assert hub.take(mine) == ([], 0)
    assert hub.take(other) == ([], 0)  # another run's rollout events are not r2's
    hub.publish([_row(6, "engines", None, "engine.registered"), _row(7, "engines", None, "engine.stats"),
                 _row(8, "r1", "t1", "decode.finished")])
    await asyncio.wait_for(other.wake.wait(), 5)
    items, _ = hub.take(other)
    assert items == [{"run": "engines", "n": 2, "types": {"engine.registered": 1, "engine.stats": 1}, "trajs": [],
                      "ts": 1.0, "seq": 7}]
    items, _ = hub.take(mine)
    assert [i["run"] for i in items] == ["r1", "engines"] and items[0]["types"] == {"decode.finished": 1}
    hub.unsubscribe(mine)
    hub.unsubscribe(other)
    assert hub.clients == 0
    with pytest.raises(ValueError):
        Hub(queue_max=0)


# --- the HTTP endpoints ----------------------------------------------------------------------


def test_console_endpoints_token_and_errors(demo_db) -> None:
    c = TestClient(create_app(demo_db, "s3cret"))
    page = c.get("/console/")
    assert page.status_code == 200 and "Prorsa console" in page.text
    assert "demo" not in page.text and "s3cret" not in page.text  # the shell holds no data
    assert c.get("/console", follow_redirects=False).headers["location"] == "/console/"
    for asset in ("console.js", "chart.js", "console.css"):
        assert c.get(f"/console/static/{asset}").status_code == 200
    for path in ("/console/api/runs", "/console/api/runs/demo", "/console/api/runs/demo/windows",
                 "/console/api/runs/demo/engines", "/console/api/runs/demo/switches",
                 "/console/api/runs/demo/trajectories/t3", "/console/api/runs/demo/stream"):
        assert c.get(path).status_code == 401, path
        assert c.get(path, headers={"Authorization": "Bearer nope"}).status_code == 401, path

    runs = c.get("/console/api/runs", headers=H).json()
    assert runs["live"] is False
    assert {(r["run"], r["rollout"]) for r in runs["runs"]} == {("demo", True), ("engines", False)}
    ov = c.get("/console/api/runs/demo", headers=H).json()
    assert ov["states"] == {"done": 120} and ov["run"]["dispatched"] == 120
    win = c.get("/console/api/runs/demo/windows", headers=H).json()
    assert win["horizon"] == 5.0 and win["windows"][0]["t"] == T0
    assert all(w["forecast"] is not None for w in win["windows"])
    assert sum(w["decode_admit_tokens"] for w in win["windows"]) > 0
    steps = c.get("/console/api/runs/demo/engines", headers=H).json()["steps"]
    assert (steps[0]["prefill"], steps[0]["decode"]) == (2, 2) and steps[0]["ts"] == T0
    assert max(s["prefill"] for s in steps) == 3 and (steps[-1]["prefill"], steps[-1]["decode"]) == (2, 2)
    sw = c.get("/console/api/runs/demo/switches", headers=H).json()["switches"]
    assert [(s["engine"], s["from_role"], s["to_role"], s["outcome"].split(":")[0], s["seconds"]) for s in sw] == [
        ("d1", "decode", "prefill", "switched", 3.4), ("p1", "prefill", "decode", "failed", None),
        ("d1", "prefill", "decode", "switched", 2.9)]
    assert all("lists this engine" in s["reason"] for s in sw)
    tr = c.get("/console/api/runs/demo/trajectories/t3", headers=H).json()
    types = [e["type"] for e in tr["events"]]
    assert types[0] == "trajectory.dispatched" and types[-1] == "reward.finished" and len(tr["timeline"]) == len(types)

    assert c.get("/console/api/runs/nope", headers=H).status_code == 404
    assert c.get("/console/api/runs/nope/switches", headers=H).status_code == 404
    assert c.get("/console/api/runs/demo/trajectories/nope", headers=H).status_code == 404
    assert c.get("/console/api/runs/demo/windows", params={"horizon": 0}, headers=H).status_code == 422
    assert c.get("/console/api/runs/demo/windows", params={"horizon": "x"}, headers=H).status_code == 422
    r = c.get("/console/api/runs/demo/stream", headers=H)
    assert r.status_code == 503 and "tracker's ingest" in r.json()["detail"]


# --- the live stream through a running tracker ------------------------------------------------


async def _sse(lines, want):
    """Parse server-sent events from ``lines`` until ``want(events)`` holds."""
    events, kind = [], None
    async for line in lines:
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            events.append((kind, json.loads(line[6:])))
            if want(events):
                return events
    raise AssertionError(f"the stream ended: {events}")


async def test_stream_carries_committed_events_from_the_bus(nats_url, ns, tmp_path) -> None:
    events = demo_events(n_traj=10)
    port = free_port()
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=f"sqlite:///{tmp_path}/t.db",
                        clock="event", http_port=port, api_token="s3cret", publish_transitions=False)
    tracker, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    try:
        await async_wait_until(lambda: tracker.ready.is_set(), timeout=30, what="tracker ready")
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            assert (await client.get("/console/api/runs/demo/stream")).status_code == 401
            assert (await client.get("/console/api/runs/bad run/stream", headers=H)).status_code == 400
            async with client.stream("GET", "/console/api/runs/demo/stream", headers=H) as resp:
                assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
                lines = resp.aiter_lines()
                hello = await _sse(lines, lambda ev: len(ev) == 1)
                assert hello == [("hello", {"run": "demo", "queue_max": 256})]
                await async_wait_until(lambda: tracker.hub.clients == 1, timeout=10, what="subscribed")
                await publish(nats_url, ns, events)
                n_demo = sum(e.run == "demo" for e in events)
                got = await asyncio.wait_for(_sse(lines, lambda ev: sum(d["n"] for k, d in ev if d["run"] == "demo") >= n_demo
                                                  and any(d["run"] == "engines" for k, d in ev)), 60)
        batches = [d for k, d in got if k == "batch"]
        demo = [d for d in batches if d["run"] == "demo"]
        assert sum(d["n"] for d in demo) == n_demo  # every committed event of the run, once
        assert {"t0", "t9"} <= {t for d in demo for t in d["trajs"]}
        assert sum(d["types"].get("engine.switched", 0) for d in demo) == 2
        eng = [d for d in batches if d["run"] == "engines"]
        assert sum(d["types"]["engine.registered"] for d in eng) == 4
        await async_wait_until(lambda: tracker.hub.clients == 0, timeout=15, what="the client unsubscribed")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
