"""Tracker ingest benchmark: events/s from a real JetStream into SQLite and PostgreSQL,
each beside the raw JetStream consume rate measured right before it in the same run (the
machine is shared, so the ratio is the figure to compare); restart time with and without
a state snapshot; the memory of 100k live trajectories in the core.

    .venv/bin/python benchmarks/bench_tracker_ingest.py [N] [--repeat K] [--pg auto|URL] [--no-transitions]

``--pg auto`` creates (and drops) a fresh database on PRORSA_TEST_PG_URL (default
postgresql://postgres@127.0.0.1:5432/postgres); a URL must name an EMPTY database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import tracemalloc
from contextlib import contextmanager

from nats.js.api import ConsumerConfig, DeliverPolicy

from prorsa_runtime import NatsServer, connect, ensure_stream
from prorsa_schemas import Namespace, encode_event
from prorsa_tracker import projection, snapshots
from prorsa_tracker.core import apply, new_state
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.examples import iter_workload, workload
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings


async def raw_consume(url: str, ns: Namespace, n: int) -> float:
    """Messages/s of a bare ordered push consumer over the same subjects (nothing done with them)."""
    nc = await connect(url, "bench-raw")
    js = nc.jetstream()
    got, done = [0], asyncio.Event()

    async def cb(msg) -> None:
        got[0] += 1
        if got[0] >= n:
            done.set()

    cfg = ConsumerConfig(filter_subjects=[ns.rollout_all(), ns.engine_all(), ns.control_all()],
                         deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=1)
    t = time.perf_counter()
    sub = await js.subscribe(ns.rollout_all(), stream=ns.stream, ordered_consumer=True, config=cfg, cb=cb,
                             pending_msgs_limit=200_000, pending_bytes_limit=512 << 20)
    await asyncio.wait_for(done.wait(), 300)
    rate = n / (time.perf_counter() - t)
    await sub.unsubscribe()
    await nc.close()
    return rate


async def ingest(url: str, ns: Namespace, db: str, n: int, transitions: bool = True) -> float:
    """Events/s from the tracker's first consumed message until all ``n`` are committed."""
    s = TrackerSettings(nats_url=url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, clock="event",
                        publish_transitions=transitions)
    tr, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tr.run(stop))
    await asyncio.wait_for(tr.ready.wait(), 60)  # timed from here: after migrate, restore, subscribe
    t = time.perf_counter()
    while tr.written < n:  # durable: `written` counts committed messages
        await asyncio.sleep(0.005)
    rate = n / (time.perf_counter() - t)
    stop.set()
    await task
    return rate


@contextmanager
def fresh_pg(spec: str):
    """A URL of an empty PostgreSQL database: ``spec`` itself, or (``auto``) a new one."""
    if spec != "auto":
        yield spec
        return
    from prorsa_runtime.testing import temporary_database

    base = os.environ.get("PRORSA_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    with temporary_database(base, prefix="prorsa_bench_") as url:
        yield url


def restart_times(db: str) -> tuple[int, float, int, float]:
    """(events folded, seconds) of a restart from a snapshot + tail, and of a full replay."""
    eng = make_engine(db)
    st = new_state()
    t = time.perf_counter()
    n_snap = snapshots.restore(eng, st)
    t_snap = time.perf_counter() - t
    st = new_state()
    t = time.perf_counter()
    n_full = projection.restore(eng, st)
    t_full = time.perf_counter() - t
    eng.dispose()
    return n_snap, t_snap, n_full, t_full


def memory_100k_live() -> tuple[float, float]:
    evs = [e for e in workload(100_000, turns=2, spacing=0.0) if e.type in ("trajectory.dispatched", "sandbox.started", "sandbox.ready", "request.queued")]
    tracemalloc.start()
    st = new_state()
    for e in evs:
        apply(st, e)
    live = st.live_count()
    cur, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return live, cur / 2**20


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("n", type=int, nargs="?", default=100_000)
    ap.add_argument("--repeat", type=int, default=1, help="measure raw + ingest this many times (median reported)")
    ap.add_argument("--pg", default=None, help="'auto' or the URL of an EMPTY PostgreSQL database")
    ap.add_argument("--no-transitions", action="store_true", help="also measure SQLite ingest without publishing transitions")
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    srv = NatsServer(d, port=0).start()
    try:
        ns = Namespace()
        nc = await connect(srv.url, "bench-pub")
        js = nc.jetstream()
        await ensure_stream(js, ns)
        for e in iter_workload(a.n, live=2000):
            await nc.publish(ns.subject_for(e), encode_event(e), headers={"Nats-Msg-Id": e.id})
        await nc.flush()
        # Fire-and-forget publishes at full speed can overflow the server's ingest queue
        # (300k here lost ~40k): the ingest would then wait forever for events that never
        # arrived, so check the stream holds all N first.
        stored, deadline = -1, time.perf_counter() + 10
        while stored != a.n and time.perf_counter() < deadline:  # the server stores asynchronously
            stored = (await js.stream_info(ns.stream)).state.messages
            if stored != a.n:
                await asyncio.sleep(0.2)
        await nc.close()
        if stored != a.n:
            raise SystemExit(f"the stream holds {stored:,} of the {a.n:,} published events (the server dropped "
                             "some fire-and-forget publishes); use a smaller N")

        async def pair(label: str, db_for_run, **kw) -> None:
            raws, rates = [], []
            for i in range(a.repeat):
                raws.append(await raw_consume(srv.url, ns, a.n))
                with db_for_run(i) as db:
                    rates.append(await ingest(srv.url, ns, db, a.n, **kw))
            ratios = [r / w for r, w in zip(rates, raws)]
            print(f"{label:<34} {statistics.median(rates):>8,.0f} events/s   raw consume {statistics.median(raws):>8,.0f}/s"
                  f"   ratio {statistics.median(ratios):.2f} (runs: {', '.join(f'{x:.2f}' for x in ratios)})")

        @contextmanager
        def sqlite(i: int):
            yield f"sqlite:///{d}/bench-{i}.db"

        await pair("tracker ingest into SQLite", sqlite)
        if a.no_transitions:
            @contextmanager
            def sqlite_nt(i: int):
                yield f"sqlite:///{d}/bench-nt-{i}.db"

            await pair("  (without publishing transitions)", sqlite_nt, transitions=False)
        if a.pg:
            await pair("tracker ingest into PostgreSQL", lambda i: fresh_pg(a.pg))
    finally:
        srv.stop()
    # Restart cost: the live tracker wrote one snapshot (every 200k messages by default);
    # write one at the end of an offline load so both paths are measured on the same data.
    db = f"sqlite:///{d}/bench-0.db"
    eng = make_engine(db)
    migrate(eng)
    st = new_state()
    snapshots.restore(eng, st)
    with eng.begin() as c:
        snapshots.save(c, snapshots.dump(st))
    eng.dispose()
    n_snap, t_snap, n_full, t_full = restart_times(db)
    print(f"restart: snapshot + {n_snap:,} events {t_snap:.2f} s; full replay of {n_full:,} events {t_full:.2f} s")
    live, mib = memory_100k_live()
    print(f"core memory with {live:,} live trajectories: {mib:,.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
