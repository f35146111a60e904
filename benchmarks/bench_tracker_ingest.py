"""Tracker ingest benchmark: events/s from a real JetStream into SQLite and PostgreSQL,
beside the raw JetStream consume rate measured in the same run; and the memory of 100k
live trajectories in the core.

    .venv/bin/python benchmarks/bench_tracker_ingest.py [N] [--pg postgresql://postgres@127.0.0.1/test]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import tracemalloc

from nats.js.api import ConsumerConfig, DeliverPolicy

from prorsa_runtime import NatsServer, connect, ensure_stream
from prorsa_schemas import Namespace, encode_event
from prorsa_tracker.core import apply, new_state
from prorsa_tracker.examples import iter_workload, workload
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings


async def raw_consume(url: str, ns: Namespace, n: int) -> float:
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
    await js.subscribe(ns.rollout_all(), stream=ns.stream, ordered_consumer=True, config=cfg, cb=cb,
                       pending_msgs_limit=200_000, pending_bytes_limit=512 << 20)
    await asyncio.wait_for(done.wait(), 300)
    rate = n / (time.perf_counter() - t)
    await nc.close()
    return rate


async def ingest(url: str, ns: Namespace, db: str, n: int) -> float:
    tr, stop = Tracker(TrackerSettings(nats_url=url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, clock="event")), asyncio.Event()
    task = asyncio.create_task(tr.run(stop))
    await asyncio.wait_for(tr.ready.wait(), 60)  # timed from the first message consumed, after restore+migrate
    t = time.perf_counter()
    while tr.written < n:  # durable: `written` counts committed messages
        await asyncio.sleep(0.01)
    rate = n / (time.perf_counter() - t)
    stop.set()
    await task
    return rate


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
    ap.add_argument("--pg", default=None, help="PostgreSQL URL of an EMPTY database to ingest into")
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
        await nc.close()
        raw = await raw_consume(srv.url, ns, a.n)
        print(f"raw JetStream consume (ordered push): {raw:,.0f} events/s")
        sq = await ingest(srv.url, ns, f"sqlite:///{d}/bench.db", a.n)
        print(f"tracker ingest into SQLite:            {sq:,.0f} events/s ({sq / raw:.2f} of raw)")
        if a.pg:
            pg = await ingest(srv.url, ns, a.pg, a.n)
            print(f"tracker ingest into PostgreSQL:        {pg:,.0f} events/s ({pg / raw:.2f} of raw)")
    finally:
        srv.stop()
    live, mib = memory_100k_live()
    print(f"core memory with {live:,} live trajectories: {mib:,.0f} MiB")


if __name__ == "__main__":
    asyncio.run(main())
