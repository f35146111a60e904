# Over 400 lines on purpose: a standalone benchmark script (load generator, rate search for
# SQLite and PostgreSQL, raw JetStream rate, report) that runs by itself with no helper module.
"""Overload benchmark: the highest sustained event rate at which the tracker's lag stays
bounded, into SQLite and into PostgreSQL, beside the raw JetStream consume rate measured
in the same run.

    .venv/bin/python benchmarks/bench_overload.py [--seconds 10] [--start 4000] [--max-rate 60000]
                                                 [--pg auto|URL|none] [--raw 100000]

Each trial publishes contract events (the tracker's example workload, 2,000 live
trajectories) at a fixed rate for ``--seconds`` from a separate process (core publishes,
paced every 10 ms), into a fresh stream, while the tracker (``prorsa tracker run``'s
service, its receiver process and default settings: batches of up to 5,000, transitions
published) consumes and commits them. Four times a second the lag is taken: events
published so far minus events committed. A rate is *sustained* when the publisher reached
it and, over the second half of the trial, the lag stays within one second's worth of
events or the 15,000 the batch pipeline holds by design, whichever is more, and grows by
less than 10% of the rate per second (least squares); every stored event must then be
committed (checked after the drain). With 10 s trials this tells a tracker about 10% short
of the rate from one that keeps up. The tracker's own gauge
(``prorsa_tracker_backlog_messages``, from JetStream consumer info read every 2 s) is
printed beside the measured lag. Rates go up by x1.5 from ``--start`` until one is not
sustained, then two bisection steps.

The raw consume rate: the same kind of consumer the tracker's receiver runs (an ordered
pull consumer, :class:`prorsa_runtime.reader.OrderedReader`) and nats-py's ordered push
consumer, each reading ``--raw`` stored events and doing nothing with them.

All of it shares the machine: the publisher, the nats-server, the tracker and its receiver
(and PostgreSQL) compete for the same cores, so the figures are the host's, not the
tracker's alone. ``--pg auto`` creates (and drops) a database next to PRORSA_TEST_PG_URL
(default postgresql://postgres@127.0.0.1:5432/test).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

WARMUP_S = 2.0
SAMPLE_S = 0.25
PIPELINE = 15_000
"""Backlog the tracker holds by design at any rate: a batch (up to 5,000) being written, one
being applied, one being prepared; more than this and a second's worth of events is lag."""


# --- the publisher process -----------------------------------------------------------------


async def _publish_paced(url: str, prefix: str, rate: float, seconds: float, path: str) -> None:
    from prorsa_runtime import connect

    with open(path, "rb") as fh:
        events = pickle.load(fh)
    n = min(len(events), int(rate * seconds))
    nc = await connect(url, "bench-overload-pub")
    print("started", flush=True)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    sent = 0
    told = t0
    while sent < n:  # every 10 ms, what is due by then (nats-py's flusher sends it)
        due = min(n, int((loop.time() - t0) * rate) + 1)
        while sent < due:
            suffix, eid, data = events[sent]
            await nc.publish(f"{prefix}.{suffix}", data, headers={"Nats-Msg-Id": eid})
            sent += 1
        if loop.time() - told >= SAMPLE_S / 2:
            print(sent, flush=True)  # progress: the bench's lag is sent - committed
            told = loop.time()
        if sent < n:
            await asyncio.sleep(0.01)
    await nc.flush()
    elapsed = loop.time() - t0
    await nc.close()
    print(json.dumps({"published": sent, "seconds": elapsed}), flush=True)


# --- events --------------------------------------------------------------------------------


class EventCache:
    """Pre-encoded events ``(subject without prefix, id, bytes)``, extended on demand and kept
    in a file the publisher process loads (encoding costs ~60 us an event: not in the timed part)."""

    def __init__(self, directory: str) -> None:
        from prorsa_tracker.examples import iter_workload

        self.path = os.path.join(directory, "events.pickle")
        self._it = iter_workload(10**9, run="overload", live=2000)
        self.events: list[tuple[str, str, bytes]] = []
        self._written = 0

    def ensure(self, n: int) -> str:
        from prorsa_schemas import DEFAULT, encode_event

        if len(self.events) < n:
            cut = len(DEFAULT.prefix) + 1
            for e in self._it:
                self.events.append((DEFAULT.subject_for(e)[cut:], e.id, encode_event(e)))
                if len(self.events) >= n:
                    break
        if self._written != len(self.events):
            with open(self.path, "wb") as fh:
                pickle.dump(self.events, fh, protocol=pickle.HIGHEST_PROTOCOL)
            self._written = len(self.events)
        return self.path


def fresh_ns():
    from prorsa_schemas import Namespace

    tag = uuid.uuid4().hex[:8]
    return Namespace(prefix=f"o{tag}", stream=f"O{tag}")


async def publish_all(url: str, ns, events) -> None:
    """Store ``events`` in ``ns``'s stream (fire and forget, then check the count)."""
    from prorsa_runtime import connect, ensure_stream

    nc = await connect(url, "bench-overload-fill")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    for i, (suffix, eid, data) in enumerate(events):
        await nc.publish(f"{ns.prefix}.{suffix}", data, headers={"Nats-Msg-Id": eid})
        if i % 2000 == 1999:
            await nc.flush()
    await nc.flush()
    deadline = time.monotonic() + 20
    while (stored := (await js.stream_info(ns.stream)).state.messages) != len(events):
        if time.monotonic() > deadline:
            raise SystemExit(f"the stream holds {stored:,} of {len(events):,} events (the server dropped "
                             "fire-and-forget publishes); use a smaller --raw")
        await asyncio.sleep(0.1)
    await nc.close()


# --- the raw consume baseline --------------------------------------------------------------


async def raw_rates(url: str, ns, n: int) -> tuple[float, float]:
    """(ordered pull, nats-py ordered push) messages/s over the tracker's subjects, nothing done."""
    from nats.js.api import ConsumerConfig, DeliverPolicy

    from prorsa_runtime import connect
    from prorsa_runtime.reader import OrderedReader

    nc = await connect(url, "bench-overload-raw")
    js = nc.jetstream()
    subjects = [ns.rollout_all(), ns.engine_all(), ns.control_all()]
    got, done = [0], asyncio.Event()

    def on_msg(msg, seq) -> None:
        got[0] += 1
        reader.release()
        if got[0] >= n:
            done.set()

    t = time.perf_counter()
    reader = await OrderedReader(js, ns, "raw-pull", subjects, on_msg, max_pending=100_000, batch=4000,
                                 info_every_s=0).start()
    await asyncio.wait_for(done.wait(), 300)
    pull = n / (time.perf_counter() - t)
    await reader.stop()

    got[0], done = 0, asyncio.Event()

    async def cb(msg) -> None:
        got[0] += 1
        if got[0] >= n:
            done.set()

    cfg = ConsumerConfig(filter_subjects=subjects, deliver_policy=DeliverPolicy.ALL)
    t = time.perf_counter()
    sub = await js.subscribe(subjects[0], stream=ns.stream, ordered_consumer=True, config=cfg, cb=cb,
                             pending_msgs_limit=200_000, pending_bytes_limit=512 << 20)
    await asyncio.wait_for(done.wait(), 300)
    push = n / (time.perf_counter() - t)
    await sub.unsubscribe()
    await nc.close()
    return pull, push


# --- one trial -----------------------------------------------------------------------------


@dataclass
class Trial:
    rate: float
    published: int = 0
    publish_s: float = 0.0
    committed_rate: float = 0.0  # commits/s between the warm-up and the end of publishing
    slope: float = 0.0  # lag growth, messages/s (least squares over the second half)
    max_late: int = 0  # the largest lag of the second half
    gauge_max: int = 0  # the largest prorsa_tracker_backlog_messages seen
    end_backlog: int = 0
    max_backlog: int = 0
    drain_s: float | None = None
    lost: int = 0  # stored but not committed after the drain
    dropped_by_server: int = 0  # published but not stored (the bus's ingest, not the tracker)
    samples: list[tuple[float, int]] = field(default_factory=list)

    @property
    def offered(self) -> float:
        return self.published / self.publish_s if self.publish_s else 0.0

    @property
    def sustained(self) -> bool:
        return (self.lost == 0 and self.dropped_by_server == 0 and self.drain_s is not None
                and self.offered >= 0.95 * self.rate and self.max_late <= max(PIPELINE, self.rate)
                and self.slope < 0.1 * self.rate)


async def _stored(js, ns) -> int:
    info = await js.stream_info(ns.stream, subjects_filter=ns.rollout_all())
    return sum((info.state.subjects or {}).values())


def _slope(points: list[tuple[float, int]]) -> float:
    if len(points) < 3:
        return 0.0
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else 0.0


async def trial(url: str, db_url: str, rate: float, seconds: float, cache: EventCache, transitions: bool) -> Trial:
    from prorsa_runtime import connect, ensure_stream
    from prorsa_tracker.service import Tracker
    from prorsa_tracker.settings import TrackerSettings

    ns = fresh_ns()
    path = cache.ensure(int(rate * seconds))
    nc = await connect(url, "bench-overload-monitor")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    tr = Tracker(TrackerSettings(nats_url=url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db_url,
                                 clock="event", publish_transitions=transitions))
    stop = asyncio.Event()
    task = asyncio.create_task(tr.run(stop))
    await asyncio.wait_for(tr.ready.wait(), 120)
    consumer = ns.durable("tracker")

    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--publish", url, ns.prefix, str(rate), str(seconds), path,
        stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = await proc.stdout.readline()
    if line.strip() != b"started":
        raise SystemExit(f"the publisher did not start: {line!r}")
    res = Trial(rate)
    t0 = time.perf_counter()
    sent = 0
    report = None
    reader = asyncio.ensure_future(proc.stdout.readline())
    committed_at_warmup = None
    t_warm = 0.0
    while report is None:
        done, _ = await asyncio.wait([reader], timeout=SAMPLE_S)
        if done:
            line = reader.result().strip()
            if line.startswith(b"{"):
                report = json.loads(line)
                sent = report["published"]
            else:
                sent = int(line)
                reader = asyncio.ensure_future(proc.stdout.readline())
        t = time.perf_counter() - t0
        if report is None:
            res.samples.append((t, sent - tr.written))  # the lag: published, not yet committed
            res.gauge_max = max(res.gauge_max, tr.backlog() or 0)
        if committed_at_warmup is None and t >= WARMUP_S:
            committed_at_warmup, t_warm = tr.written, t
    t_end = time.perf_counter() - t0
    committed_at_end = tr.written
    await proc.wait()
    res.samples.append((t_end, sent - committed_at_end))
    res.published, res.publish_s = report["published"], report["seconds"]
    # The lag over the second half (the first holds the start: an empty pipeline filling up).
    second = [b for t, b in res.samples if t >= t_end / 2]
    res.max_late = max(second, default=0)
    res.slope = _slope([(t, b) for t, b in res.samples if t >= t_end / 2])
    res.end_backlog = res.samples[-1][1]
    res.max_backlog = max((b for _, b in res.samples), default=0)
    if committed_at_warmup is not None and t_end > t_warm:
        res.committed_rate = (committed_at_end - committed_at_warmup) / (t_end - t_warm)
    # What the stream stored of it: a fire-and-forget publish the server could not take is
    # dropped by the bus, before the tracker could see it.
    deadline = time.monotonic() + 10
    while (stored := await _stored(js, ns)) < res.published and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    res.dropped_by_server = res.published - stored
    # Drain: every stored event committed (up to 2 minutes).
    t_stop = time.perf_counter()
    while tr.written < stored and time.perf_counter() - t_stop < 120:
        await asyncio.sleep(0.05)
    if tr.written >= stored:
        res.drain_s = time.perf_counter() - t_stop
    res.lost = max(0, stored - tr.written)
    stop.set()
    await asyncio.wait_for(task, 60)
    await js.delete_stream(ns.stream)
    await nc.close()
    return res


def show(label: str, r: Trial) -> None:
    drain = f"{r.drain_s:5.1f}s" if r.drain_s is not None else "  n/a"
    print(f"  {label:<11} offered {r.offered:>8,.0f}/s  committed {r.committed_rate:>8,.0f}/s  lag end "
          f"{r.end_backlog:>7,}  max {r.max_backlog:>7,} (gauge {r.gauge_max:>7,})  trend {r.slope:>+7,.0f}/s  "
          f"drain {drain}  "
          f"{'sustained' if r.sustained else 'NOT sustained'}{f'  LOST {r.lost:,}' if r.lost else ''}"
          f"{f'  (the server dropped {r.dropped_by_server:,} publishes)' if r.dropped_by_server else ''}", flush=True)


async def search(label: str, url: str, db_for, a, cache: EventCache) -> Trial | None:
    print(f"{label}:", flush=True)
    best: Trial | None = None
    worst: float | None = None
    rate = float(a.start)
    while rate <= a.max_rate:
        with db_for() as db:
            r = await trial(url, db, rate, a.seconds, cache, not a.no_transitions)
        show(f"{rate:,.0f}/s", r)
        if not r.sustained:
            worst = rate
            break
        best = r
        rate *= 1.5
    for _ in range(2 if worst is not None and best is not None else 0):
        rate = round((best.rate + worst) / 2, -2)
        with db_for() as db:
            r = await trial(url, db, rate, a.seconds, cache, not a.no_transitions)
        show(f"{rate:,.0f}/s", r)
        if r.sustained:
            best = r
        else:
            worst = rate
    return best


@contextmanager
def pg_database(spec: str):
    if spec != "auto":
        yield spec
        return
    from prorsa_runtime.testing import temporary_database

    base = os.environ.get("PRORSA_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test")
    with temporary_database(base, prefix="prorsa_overload_") as url:
        yield url


def pg_reachable(spec: str) -> str | None:
    """None when PostgreSQL can be used, else why not."""
    import sqlalchemy

    from prorsa_runtime.redact import mask_url

    url = os.environ.get("PRORSA_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test") \
        if spec == "auto" else spec
    try:
        eng = sqlalchemy.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))
        with eng.connect() as c:
            c.exec_driver_sql("select 1")
        eng.dispose()
    except Exception as exc:  # noqa: BLE001 - reported, the SQLite half still runs
        return f"PostgreSQL at {mask_url(url)} is unreachable: {str(exc).splitlines()[0]}"
    return None


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0, help="publishing time per trial")
    ap.add_argument("--start", type=float, default=4000, help="first rate tried, events/s")
    ap.add_argument("--max-rate", type=float, default=60000, help="highest rate tried, events/s")
    ap.add_argument("--raw", type=int, default=100_000, help="events read for the raw consume rate")
    ap.add_argument("--pg", default="auto", help="'auto', the URL of an EMPTY PostgreSQL database, or 'none'")
    ap.add_argument("--no-transitions", action="store_true", help="the tracker does not publish transitions")
    ap.add_argument("--only", choices=["sqlite", "postgresql"], help="one backend only")
    a = ap.parse_args()
    if a.seconds <= WARMUP_S + 1 or a.start <= 0 or a.max_rate < a.start or a.raw < 1000:
        ap.error("--seconds must exceed 3, --start be positive, --max-rate >= --start, --raw >= 1000")

    from prorsa_runtime import NatsServer

    d = tempfile.mkdtemp(prefix="prorsa-overload-")
    srv = NatsServer(Path(d) / "nats", port=0).start()
    try:
        cache = EventCache(d)
        cache.ensure(a.raw)
        ns = fresh_ns()
        await publish_all(srv.url, ns, cache.events[: a.raw])
        pull, push = await raw_rates(srv.url, ns, a.raw)
        print(f"raw JetStream consume, {a.raw:,} stored events, nothing done with them: ordered pull (the "
              f"tracker's consumer) {pull:,.0f}/s, nats-py ordered push {push:,.0f}/s", flush=True)
        results: dict[str, Trial | None] = {}
        if a.only in (None, "sqlite"):
            n = iter(range(10**6))

            @contextmanager
            def sqlite():
                yield f"sqlite:///{d}/tracker-{next(n)}.db"

            results["SQLite"] = await search("tracker into SQLite", srv.url, sqlite, a, cache)
        if a.only in (None, "postgresql") and a.pg != "none":
            why = pg_reachable(a.pg)
            if why:
                print(f"tracker into PostgreSQL: skipped ({why})")
            else:
                results["PostgreSQL"] = await search("tracker into PostgreSQL", srv.url, lambda: pg_database(a.pg),
                                                     a, cache)
        print()
        for name, best in results.items():
            if best is None:
                print(f"sustained into {name}: below {a.start:,.0f} events/s (the first rate tried)")
            else:
                print(f"sustained into {name}: {best.rate:,.0f} events/s with bounded lag (at most "
                      f"{best.max_backlog:,} events behind), {best.rate / pull:.2f} of the raw ordered-pull consume rate "
                      f"{pull:,.0f}/s")
    finally:
        srv.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--publish":
        _, _, url, prefix, rate, seconds, path = sys.argv
        asyncio.run(_publish_paced(url, prefix, float(rate), float(seconds), path))
    else:
        asyncio.run(main())
