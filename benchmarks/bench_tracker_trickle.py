"""Tracker CPU under a live trickle: what the tracker costs while a run publishes a few
hundred events a second (the live demo's rate), against the batch linger
(``PRORSA_TRACKER_LINGER_S``). Each linger in the same run, on the same events, each run on
a stream of its own; the first linger given is the baseline of the ratio.

    .venv/bin/python benchmarks/bench_tracker_trickle.py [N] [--rate 300] [--lingers 0,0.05] [--repeat 3]

The tracker runs in this process (its receiver is its own child process, as in
production); a child process publishes N events (the tracker's synthetic workload) at
``--rate`` events/s in bursts every 20 ms. CPU is this process's (every thread) plus the
receiver's, from the first publish until all N are committed, in CPU seconds per 1,000
events; beside it the transactions the tracker committed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prorsa_runtime import NatsServer
from prorsa_schemas import Namespace
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings

PUBLISHER = """
import asyncio, sys, time
from prorsa_runtime import connect, ensure_stream
from prorsa_schemas import Namespace, encode_event
from prorsa_tracker.examples import iter_workload

async def main(url, prefix, stream, n, rate):
    ns = Namespace(prefix=prefix, stream=stream)
    nc = await connect(url, "trickle-pub")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    events = list(iter_workload(n, live=200))
    per_tick, tick = max(int(rate * 0.02), 1), 0.02
    t0 = time.perf_counter()
    for k in range(0, n, per_tick):
        for e in events[k:k + per_tick]:
            await js.publish(ns.subject_for(e), encode_event(e), headers={"Nats-Msg-Id": e.id})
        await asyncio.sleep(max(t0 + (k // per_tick + 1) * tick - time.perf_counter(), 0.0))
    await nc.close()

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])))
"""


def cpu_of(pid: int | None) -> float:
    """CPU seconds (user + system) of a live process, 0 when it is gone."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def one_run(url: str, db: str, ns: Namespace, n: int, rate: float, linger: float) -> tuple[float, int, float]:
    """(CPU s per 1000 events, transactions, wall s) of one trickle."""
    s = TrackerSettings(nats_url=url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db, linger_s=linger)
    tr, stop = Tracker(s), asyncio.Event()
    task = asyncio.create_task(tr.run(stop))
    await asyncio.wait_for(tr.ready.wait(), 60)
    receiver = tr.receiver_pid
    cpu0, rcv0, t0 = time.process_time(), cpu_of(receiver), time.perf_counter()
    pub = subprocess.Popen([sys.executable, "-c", PUBLISHER, url, ns.prefix, ns.stream, str(n), str(rate)])
    while tr.written < n:
        if pub.poll() not in (None, 0):
            raise SystemExit(f"the publisher failed (exit {pub.returncode})")
        await asyncio.sleep(0.05)
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0 + cpu_of(receiver) - rcv0
    txns = tr.transactions
    pub.wait()
    stop.set()
    await task
    return cpu / n * 1000.0, txns, wall


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("n", type=int, nargs="?", default=15_000, help="events a run publishes")
    ap.add_argument("--rate", type=float, default=300.0, help="events per second")
    ap.add_argument("--lingers", default="0,0.05", help="comma-separated PRORSA_TRACKER_LINGER_S values; the first is the baseline")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each linger, interleaved (medians reported)")
    a = ap.parse_args()
    if a.n < 1 or a.rate <= 0 or a.repeat < 1:
        ap.error("N, --rate and --repeat must be positive")
    try:
        lingers = [float(x) for x in a.lingers.split(",")]
    except ValueError:
        ap.error(f"--lingers must be comma-separated numbers, got {a.lingers!r}")
    d = tempfile.mkdtemp()
    srv = NatsServer(d, port=0).start()
    results: dict[float, list[tuple[float, int, float]]] = {x: [] for x in lingers}
    try:
        k = 0
        for _ in range(a.repeat):
            for linger in lingers:  # interleaved: a shared machine's load falls on each alike
                k += 1
                ns = Namespace(prefix=f"trickle{k}", stream=f"TRICKLE{k}")
                r = await one_run(srv.url, f"sqlite:///{d}/t{k}.db", ns, a.n, a.rate, linger)
                results[linger].append(r)
                print(f"  linger {linger:g} s: {r[0]:.3f} CPU s / 1000 events, {r[1]:,} transactions, {r[2]:.1f} s",
                      file=sys.stderr)
    finally:
        srv.stop()
    base = statistics.median(x[0] for x in results[lingers[0]])
    print(f"tracker under a trickle of {a.rate:g} events/s, {a.n:,} events, {a.repeat} runs each (medians):")
    for linger in lingers:
        cpu = statistics.median(x[0] for x in results[linger])
        txns = statistics.median(x[1] for x in results[linger])
        print(f"  linger {linger:<5g} s  {cpu:6.3f} CPU s / 1000 events  ({cpu / base:.2f} of linger {lingers[0]:g})"
              f"   {txns:>7,.0f} transactions ({a.n / txns:,.1f} events each)")


if __name__ == "__main__":
    asyncio.run(main())
