"""The foundation demo: a local bus, an example log published through the SDK, read back.

Later issues replace this with the live system (`prorsa up --emulated-cluster`).
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import Counter
from pathlib import Path

from rich.table import Table

from prorsa_runtime.natsserver import NatsServer
from prorsa_schemas import DEFAULT, LogWriter, decode_event, read_log

from .common import console, out
from .example import example_events


async def _publish_and_read(url: str, log: Path) -> tuple[int, Counter[str], float]:
    import nats

    from prorsa_sdk import Emitter

    events = [line.event for line in read_log(log)]
    t0 = time.perf_counter()
    async with Emitter(run="example", nats_url=url) as em:
        for ev in events:
            await em.emit(ev)
        await em.flush(60)
    rate = len(events) / (time.perf_counter() - t0)

    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.subscribe(DEFAULT.stream_subjects()[0], ordered_consumer=True)
    seen: Counter[str] = Counter()
    total = (await js.stream_info(DEFAULT.stream)).state.messages
    n = 0
    while n < total:
        msg = await sub.next_msg(timeout=10)
        seen[decode_event(msg.data).type] += 1
        n += 1
    await nc.close()
    return n, seen, rate


def run_demo(workdir: Path, trajectories: int) -> int:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    log = workdir / "example.jsonl.gz"
    with LogWriter(log) as w:
        for ev in example_events(trajectories):
            w.write(ev)
    console.print(f"wrote {w.count} events of {trajectories} trajectories to {log}")
    with NatsServer(workdir / "nats", port=0) as server:
        console.print(f"started nats-server with JetStream at {server.url}")
        n, seen, rate = asyncio.run(_publish_and_read(server.url, log))
    table = Table(title="events in the stream, by type")
    table.add_column("type")
    table.add_column("count", justify="right")
    for k, v in sorted(seen.items()):
        table.add_row(k, str(v))
    out.print(table)
    out.print(
        f"published {w.count} events through the SDK at {rate:,.0f} events/s; "
        f"{n} read back from the stream, all valid."
    )
    out.print(f"validate the log yourself: prorsa validate {log}")
    return 0 if n == w.count else 1
