"""SDK publish rate to a real JetStream, beside raw nats-py baselines measured in the same run.

    .venv/bin/python benchmarks/bench_sdk_publish.py [N] [--trajectories T]

Prints events/s for:
  * raw `js.publish` awaited one at a time (what a naive client does),
  * raw `js.publish_async` with pre-encoded payloads (the ceiling for nats-py),
  * prorsa_sdk.Emitter (builds + validates each event, buffers, pipelines, dedup ids),
  * prorsa_sdk.SyncEmitter from one thread,
and each rate as a ratio of the raw async ceiling. Every run ends with the stream holding
exactly the events published (checked).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time

import nats

from prorsa_runtime.natsserver import NatsServer
from prorsa_schemas import Namespace, RequestQueued, encode_event
from prorsa_sdk import Emitter, SyncEmitter


async def _count(url: str, ns: Namespace) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(ns.stream)).state.messages
    finally:
        await nc.close()


async def _setup(url: str, ns: Namespace) -> None:
    from prorsa_runtime.bus import ensure_stream

    nc = await nats.connect(url)
    await ensure_stream(nc.jetstream(), ns)
    await nc.close()


def _payloads(n: int, trajs: int) -> list[tuple[str, bytes]]:
    return [
        (f"b{i}", encode_event(RequestQueued(id=f"b{i}", ts=float(i), run="bench", traj=f"t{i % trajs}",
                                              req=f"r{i}", turn=i // trajs, prompt_tokens=1000)))
        for i in range(n)
    ]


async def raw_sync(url: str, ns: Namespace, n: int, trajs: int) -> float:
    await _setup(url, ns)
    data = _payloads(n, trajs)
    nc = await nats.connect(url)
    js = nc.jetstream()
    subj = ns.subject_for_type("request.queued")
    t0 = time.perf_counter()
    for mid, payload in data:
        await js.publish(subj, payload, headers={"Nats-Msg-Id": mid})
    dt = time.perf_counter() - t0
    await nc.close()
    assert await _count(url, ns) == n
    return n / dt


async def raw_async(url: str, ns: Namespace, n: int, trajs: int) -> float:
    await _setup(url, ns)
    data = _payloads(n, trajs)
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=4096)
    subj = ns.subject_for_type("request.queued")
    t0 = time.perf_counter()
    for mid, payload in data:
        await js.publish_async(subj, payload, headers={"Nats-Msg-Id": mid})
    await js.publish_async_completed()
    dt = time.perf_counter() - t0
    await nc.close()
    assert await _count(url, ns) == n
    return n / dt


async def sdk_async(url: str, ns: Namespace, n: int, trajs: int) -> float:
    async with Emitter("bench", url, namespace=ns) as em:
        await em.flush()  # connected and stream ready before the clock starts
        t0 = time.perf_counter()
        for i in range(n):
            await em.request_queued(f"t{i % trajs}", f"r{i}", i // trajs, 1000, ts=float(i))
            if i % 1000 == 0:
                await asyncio.sleep(0)
        await em.flush(timeout=600)
        dt = time.perf_counter() - t0
    assert await _count(url, ns) == n
    return n / dt


def sdk_sync(url: str, ns: Namespace, n: int, trajs: int) -> float:
    with SyncEmitter("bench", url, namespace=ns) as em:
        em.flush()
        t0 = time.perf_counter()
        for i in range(n):
            em.request_queued(f"t{i % trajs}", f"r{i}", i // trajs, 1000, ts=float(i))
        em.flush(timeout=600)
        dt = time.perf_counter() - t0
    assert asyncio.run(_count(url, ns)) == n
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int, nargs="?", default=100_000)
    ap.add_argument("--trajectories", type=int, default=2_000)
    args = ap.parse_args()
    n, trajs = args.n, args.trajectories
    with tempfile.TemporaryDirectory() as tmp, NatsServer(tmp, port=0) as server:
        url = server.url
        rates = {}
        rates["raw js.publish (awaited, 1 in flight)"] = asyncio.run(raw_sync(url, Namespace("b1", "B1"), min(n, 20_000), trajs))
        rates["raw js.publish_async (ceiling)"] = asyncio.run(raw_async(url, Namespace("b2", "B2"), n, trajs))
        rates["prorsa_sdk.Emitter"] = asyncio.run(sdk_async(url, Namespace("b3", "B3"), n, trajs))
        rates["prorsa_sdk.SyncEmitter (1 thread)"] = sdk_sync(url, Namespace("b4", "B4"), n, trajs)
    ceiling = rates["raw js.publish_async (ceiling)"]
    print(f"{n:,} events, {trajs:,} trajectories, one nats-server with JetStream file storage")
    for name, rate in rates.items():
        print(f"  {name:40s} {rate:>10,.0f} events/s   ({rate / ceiling:.2f} of the raw async ceiling)")


if __name__ == "__main__":
    main()
