"""The live tracker against poison and re-sent events, on a real nats-server with SQLite and
PostgreSQL: every message lands in a table (events or anomalies, with its bytes, reason,
stream sequence and subject), a restart does not trip over what it skipped, duplicates are
decided by the durable log (not by a memory window), subject and type must agree, and the
metrics count what the tables hold."""

from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager

import pytest
from prometheus_client import generate_latest
from sqlalchemy import func, select

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import EngineCommand, encode_event
from prorsa_tracker.db import make_engine
from prorsa_tracker.examples import EventFactory, workload
from prorsa_tracker.metrics import tracker_registry
from prorsa_tracker.models import AnomalyRow, EventRow
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings
from prorsa_tracker.testing import clean, snapshot


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/live.db"
    return request.getfixturevalue("pg_url")


async def send(url, ns, items) -> list[int]:
    """Publish ``(subject, bytes, msg_id or None)`` in order; their stream sequences."""
    nc = await connect(url, "test-pub")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    seqs = []
    for subject, data, msg_id in items:
        ack = await js.publish(subject, data, headers={"Nats-Msg-Id": msg_id} if msg_id else None)
        seqs.append(ack.seq)
    await nc.close()
    return seqs


def ev_items(ns, events):
    return [(ns.subject_for(e), encode_event(e), e.id) for e in events]


@asynccontextmanager
async def running(settings):
    tracker, stop = Tracker(settings), asyncio.Event()
    task = asyncio.create_task(tracker.run(stop))
    await async_wait_until(lambda: tracker.ready.is_set() or task.done(), timeout=60, what="tracker start")
    if task.done():
        task.result()  # raises what stopped it
    try:
        yield tracker
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def rows(url: str, model, *cols):
    eng = make_engine(url)
    with eng.connect() as c:
        got = c.execute(select(*cols).order_by(model.__table__.c[model.__table__.primary_key.columns.keys()[0]])).all()
        n = c.execute(select(func.count()).select_from(model)).scalar()
    eng.dispose()
    return got, n


def metric(tracker, name: str, labels: str = "") -> float:
    text = generate_latest(tracker_registry(tracker)).decode()
    for line in text.splitlines():
        if line.startswith(name + labels + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name}{labels} not in {text}")


async def test_poison_mid_run_is_dead_lettered_and_a_restart_carries_on(nats_url, ns, tmp_path, db_url) -> None:
    first = workload(40, run="r1", seed=1)
    second = workload(40, run="r1", seed=2, traj_prefix="u", run_started=False)
    cmd = EngineCommand(id="forged-1", ts=1.0, run="r1", cmd="c1", engine="e1", action="switch_role",
                        to_role="decode", deadline=99.0)
    poison = [
        (ns.subject_for_type("request.queued"), b"[" * 1000, None),  # RecursionError in a plain JSON parser
        (ns.subject_for_type("request.queued"), b"\xff\xfe\x00 not utf-8", None),
        (f"{ns.prefix}.rollout.engine.command", encode_event(cmd), cmd.id),  # a command on a rollout subject
    ]
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db_url, clock="event",
                        batch_max=200)
    await send(nats_url, ns, ev_items(ns, first))
    async with running(s) as tracker:
        seqs = (await send(nats_url, ns, poison + ev_items(ns, second)))[:3]
        total = len(first) + len(poison) + len(second)
        await async_wait_until(lambda: tracker.written >= total, timeout=60, what="every message committed")
        # The metrics count what the tables hold.
        assert metric(tracker, "prorsa_tracker_anomalies_total") == rows(db_url, AnomalyRow, AnomalyRow.id)[1] == 3
        assert metric(tracker, "prorsa_tracker_events_stored_total") == len(first) + len(second)
        assert metric(tracker, "prorsa_tracker_dead_letters_total", '{kind="invalid"}') == 2
        assert metric(tracker, "prorsa_tracker_dead_letters_total", '{kind="subject"}') == 1
    got, _ = rows(db_url, AnomalyRow, AnomalyRow.seq, AnomalyRow.subject, AnomalyRow.raw, AnomalyRow.reason,
                  AnomalyRow.event_id, AnomalyRow.type)
    assert [r.seq for r in got] == seqs  # their stream sequences
    assert [r.subject for r in got] == [p[0] for p in poison]
    assert [bytes(r.raw) for r in got] == [p[1] for p in poison]
    assert "nested too deeply" in got[0].reason and "not valid JSON" in got[1].reason
    assert "event of type engine.command on subject" in got[2].reason and (got[2].event_id, got[2].type) == ("forged-1", "engine.command")
    live, ref = snapshot(db_url), clean(tmp_path, first + second)
    for key in ("events", "trajectories", "requests", "spans", "runs"):
        assert live[key] == ref[key], key

    # A restart resumes after the poison (no crash, no replay of it) and applies what follows.
    third = workload(10, run="r1", seed=3, traj_prefix="w", run_started=False)
    async with running(s) as tracker:
        assert metric(tracker, "prorsa_tracker_anomalies_total") == 3  # read from the table at start
        await send(nats_url, ns, ev_items(ns, third))
        await async_wait_until(lambda: tracker.written >= len(third), timeout=60, what="events after the restart")
        assert tracker.dead_letters.total == 0
    assert snapshot(db_url)["trajectories"] == clean(tmp_path, first + second + third)["trajectories"]
    assert rows(db_url, AnomalyRow, AnomalyRow.id)[1] == 3


async def test_an_event_from_the_future_is_an_anomaly_and_never_moves_the_watermark(nats_url, ns, db_url) -> None:
    """Live (wall clock), an event stamped more than max_clock_ahead_s ahead of the tracker's
    clock is kept whole as an anomaly row, dead-lettered (kind future), and neither stored
    nor applied: the watermark the forecaster and allocator follow stays where the real
    events put it (a year ahead, it would close three million forecast windows)."""
    events = workload(20, run="r1", seed=4)
    ahead = events[5].model_copy(update={"id": "from-the-future", "ts": time.time() + 365 * 86400})
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db_url, clock="wall",
                        batch_max=200)
    async with running(s) as tracker:
        seq = (await send(nats_url, ns, ev_items(ns, [ahead])))[0]
        await send(nats_url, ns, ev_items(ns, events))
        await async_wait_until(lambda: tracker.written >= len(events) + 1, timeout=60, what="every message committed")
        assert tracker.state.watermark == max(e.ts for e in events)
        assert metric(tracker, "prorsa_tracker_dead_letters_total", '{kind="future"}') == 1
        assert metric(tracker, "prorsa_tracker_events_stored_total") == len(events)
    got, n = rows(db_url, AnomalyRow, AnomalyRow.seq, AnomalyRow.raw, AnomalyRow.reason, AnomalyRow.event_id)
    assert n == 1 and got[0].seq == seq and got[0].event_id == "from-the-future"
    assert bytes(got[0].raw) == encode_event(ahead) and "this tracker's clock plus max_clock_ahead_s" in got[0].reason


async def test_a_taken_api_port_stops_the_tracker_with_the_reason(nats_url, ns, db_url) -> None:
    """Asked for its query API on a port something else holds, the tracker stops with the
    reason (it ran on without the API, and a stop then ended in a CancelledError)."""
    import socket

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db_url,
                            clock="event", http_port=port, api_token="t")
        with pytest.raises(OSError, match=f"cannot serve the query API on 127.0.0.1:{port}"):
            async with running(s):
                pass


def test_the_future_bound_is_the_callers_and_off_it_applies_like_any_event() -> None:
    from prorsa_tracker import projection
    from prorsa_tracker.core import new_state

    events = workload(3, run="r1", seed=5)
    last = max(e.ts for e in events)
    items = [(i, encode_event(e)) for i, e in enumerate(events)]
    bounded = projection.decode_items(items, not_after=last - 0.5)
    kinds = [d[5] for d in bounded]
    assert kinds == [None if e.ts <= last - 0.5 else "future" for e in events] and "future" in kinds
    # No bound (the tracker in clock="event" mode, `prorsa tracker load`): every event applies.
    st = new_state()
    b = projection.fold(st, "c", projection.decode_items(items))
    assert len(b.events) == len(events) and not b.rejected and st.watermark == last


def _trajectory_paused_in_tool(f: EventFactory) -> tuple[list, list]:
    """Trajectory "a" up to a tool call, and its rest; a request.queued re-sent while it is in
    Tool would be LEGAL for the state machine (it would move "a" back to queued)."""
    head = [
        f("trajectory.dispatched", 0.0, traj="a", prompt_tokens=100),
        f("request.queued", 1.0, traj="a", req="q0", turn=0, prompt_tokens=100),
        f("prefill.finished", 2.0, traj="a", req="q0"),
        f("decode.finished", 3.0, traj="a", req="q0", output_tokens=10, finish="tool"),
    ]
    tail = [
        f("request.queued", 1000.0, traj="a", req="q1", turn=1, prompt_tokens=150),
        f("prefill.finished", 1001.0, traj="a", req="q1"),
        f("decode.finished", 1002.0, traj="a", req="q1", output_tokens=5, finish="stop"),
        f("reward.finished", 1003.0, traj="a", admitted=True),
    ]
    return head, tail


async def test_an_old_event_resent_after_the_memory_window_is_not_applied_again(nats_url, ns, tmp_path, db_url) -> None:
    f = EventFactory("r1", prefix="a")
    head, tail = _trajectory_paused_in_tool(f)
    filler = workload(150, run="r1", seed=4, t0=4.0, traj_prefix="f")  # ~2,500 events: far past the window
    queued = head[1]
    other = queued.model_copy(update={"prompt_tokens": 999})  # the same id, other content
    # New Nats-Msg-Ids: the stream's own duplicate window does not catch them (as after 10 minutes).
    resent = [(ns.subject_for(queued), encode_event(queued), "resend-1"),
              (ns.subject_for(other), encode_event(other), "resend-2")]
    s = TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db_url, clock="event",
                        batch_max=100, dedup_cache=1000)
    async with running(s) as tracker:
        await send(nats_url, ns, ev_items(ns, head + filler))
        await async_wait_until(lambda: tracker.written >= len(head) + len(filler), timeout=60, what="first part")
        assert queued.id not in tracker.state.seen_ids  # long out of the memory window
        await send(nats_url, ns, resent + ev_items(ns, tail))
        await async_wait_until(lambda: tracker.written >= len(head) + len(filler) + 2 + len(tail), timeout=60,
                               what="the re-sends and the rest")
        assert tracker.duplicates == 1
        assert metric(tracker, "prorsa_tracker_duplicates_total") == 1
        assert metric(tracker, "prorsa_tracker_dead_letters_total", '{kind="conflict"}') == 1
    live, ref = snapshot(db_url), clean(tmp_path, head + filler + tail)
    for key in ("events", "trajectories", "requests", "spans", "runs"):
        assert live[key] == ref[key], key  # as if the re-sends never happened
    got, n = rows(db_url, AnomalyRow, AnomalyRow.event_id, AnomalyRow.reason, AnomalyRow.raw, AnomalyRow.subject)
    assert n == 1, got  # only the one with other content: the plain re-send is a counted duplicate
    assert got[0].event_id == queued.id and "other content" in got[0].reason
    assert bytes(got[0].raw) == encode_event(other) and got[0].subject == ns.subject_for(other)

    # After a restart (the window now holds only what the snapshot or replay put there) the
    # same re-send is still a duplicate: the events table decides.
    async with running(s) as tracker:
        before = tracker.written
        await send(nats_url, ns, [(ns.subject_for(queued), encode_event(queued), "resend-3")])
        await async_wait_until(lambda: tracker.written > before, timeout=60, what="the third re-send")
        assert tracker.duplicates == 1 and tracker.dead_letters.total == 0
    assert snapshot(db_url)["trajectories"] == ref["trajectories"]
    assert rows(db_url, EventRow, EventRow.pos)[1] == len(head) + len(filler) + len(tail)


def test_load_decides_duplicates_by_the_database_too(tmp_path, db_url) -> None:
    """``prorsa tracker load`` of a second file that re-sends an old event (and one with other
    content) applies neither."""
    from prorsa_schemas import LogWriter
    from prorsa_tracker.db import migrate
    from prorsa_tracker.tools import load

    f = EventFactory("r1", prefix="a")
    head, tail = _trajectory_paused_in_tool(f)
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    with LogWriter(one) as w:
        for e in head:
            w.write(e)
    with LogWriter(two) as w:
        w.write(head[1])
        w.write(head[1].model_copy(update={"prompt_tokens": 7}))
        for e in tail:
            w.write(e)
    eng = make_engine(db_url)
    migrate(eng)
    assert load(eng, one)["events"] == 4
    # a window of 2 ids (the last two events of one.jsonl): only the database knows "a-2"
    counts = load(eng, two, batch_size=2, dedup_cache=2)
    eng.dispose()
    assert (counts["events"], counts["duplicates"], counts["anomalies"]) == (4, 1, 1)
    assert snapshot(db_url)["trajectories"] == clean(tmp_path, head + tail)["trajectories"]


def test_a_batch_prepared_before_the_window_moved_on_still_finds_its_duplicates(tmp_path) -> None:
    """The service prepares batch k+1 (decode, look up what the window cannot decide) while
    batch k is applied. An id the window held at preparation and let go since is still a
    duplicate: it was not looked up, and is not applied again."""
    from prorsa_tracker import projection
    from prorsa_tracker.core import new_state
    from prorsa_tracker.db import migrate

    url = f"sqlite:///{tmp_path}/p.db"
    eng = make_engine(url)
    migrate(eng)
    f = EventFactory("r1", prefix="p")
    a = [f("trajectory.dispatched", float(i), traj=f"a{i}", prompt_tokens=1) for i in range(4)]
    b = [f("trajectory.dispatched", 10.0 + i, traj=f"b{i}", prompt_tokens=1) for i in range(4)]
    st = new_state(seen_capacity=4)
    batch = projection.process(st, "c", [(i + 1, encode_event(e)) for i, e in enumerate(a)], engine=eng)
    projection.write(eng, st, batch)
    # prepare the next-but-one batch (a re-send of a[0]) while the window still holds it
    later = projection.decode_items([(9, encode_event(a[0]))])
    asked = projection.unknown_ids(st, later)
    assert asked == []  # the window decides: same id, same bytes
    # batch b is applied meanwhile and pushes a[0] out of the window
    projection.fold(st, "c", projection.decode_items([(5 + i, encode_event(e)) for i, e in enumerate(b)]))
    assert a[0].id not in st.seen_ids
    out = projection.fold(st, "c", later, {}, asked=set(asked))
    assert (len(out.events), out.duplicates, len(out.anomalies)) == (0, 1, 0)
    eng.dispose()
