"""Publish an event log to the bus (used by `prorsa publish` and `prorsa replay`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from prorsa_runtime.publisher import ReliablePublisher
from prorsa_schemas import Namespace, read_log

from prorsa_runtime.cli import console

_HIGH_WATER = 50_000


@dataclass
class PublishResult:
    published: int = 0
    invalid: int = 0
    duplicates: int = 0


async def publish_log(
    log: Path,
    url: str,
    ns: Namespace,
    *,
    speed: float | None = None,
    timeout: float = 120.0,
    connect_timeout: float = 30.0,
    progress: bool = True,
) -> PublishResult:
    """Publish every valid line of ``log`` verbatim; report invalid lines on stderr.

    With ``speed``, an event with time ``ts`` is sent ``(ts - ts0) / speed`` seconds after
    the first; otherwise as fast as the bus acknowledges.
    """
    from prorsa_runtime.bus import Credentials, connect, open_stream

    # Fail fast with a clear message when the bus or the stream is not there (the publisher
    # itself would wait forever, which is right for the SDK but not for a CLI).
    creds = Credentials.from_env()
    probe = await connect(url, "prorsa-publish-probe", timeout=connect_timeout, credentials=creds)
    try:
        await open_stream(probe.jetstream(), ns, url, creds)
    finally:
        await probe.close()

    result = PublishResult()
    loop = asyncio.get_running_loop()
    pub = ReliablePublisher(url, "prorsa-publish", ns, credentials=creds)
    await pub.start()
    t0_wall = loop.time()
    ts0: float | None = None
    cols = (TextColumn("[bold]publish"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*cols, console=console, disable=not progress, transient=True) as bar:
        task = bar.add_task("publish", total=None)
        for line in read_log(log):
            if line.event is None:
                result.invalid += 1
                console.print(f"{log}:{line.lineno}: skipped: {line.error.reason}", highlight=False)
                continue
            ev = line.event
            if speed is not None:
                ts0 = ev.ts if ts0 is None else ts0
                delay = t0_wall + (ev.ts - ts0) / speed - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)  # pacing to event time, not synchronisation
            pub.submit_raw(ns.subject_for(ev), ev.id, line.raw, getattr(ev, "traj", None))
            result.published += 1
            if pub.pending >= _HIGH_WATER:
                await pub.wait_below(_HIGH_WATER // 2)
            if result.published % 1000 == 0:
                bar.update(task, completed=result.published - pub.pending)
                await asyncio.sleep(0)
        bar.update(task, completed=result.published - pub.pending)
        try:
            await pub.flush(timeout)
        finally:
            result.duplicates = pub.stats.duplicates
            await pub.close(timeout=1.0)
    return result
