"""Reads of events by type on a large log, with and without the ``events (type, pos)``
index, and what the index costs the write path.

    .venv/bin/python benchmarks/bench_type_reads.py [N] [--pg auto|off] [--repeat K]

The log is the example workload (``prorsa_tracker.examples.iter_workload``) of N events
with one engine's switch (``engine.switching`` + ``engine.switched``) every 1,000 events
and four engine registrations at the start: engine events are a few per thousand of a
rollout log's. For each database (SQLite in a temporary folder; PostgreSQL on fresh
databases of the server PRORSA_TEST_PG_URL names, dropped afterwards, unless ``--pg off``)
the same log is loaded twice into fresh
databases, first with the index dropped after the migrations (the baseline) and then with
it, and the script prints for each:

* the load rate (``tools.load``, the tracker's fold and SQL writes, 5,000 events a
  transaction): what the index costs every event written;
* the median time (of ``--repeat`` reads, default 5) of the console's engines view
  (``console_queries.engine_roles``: every engine event of every run up to the run's
  end) and of an export's engine context (``tools.engine_context`` with
  ``all_engines``: the engine events of other runs while the run was live);

with the ratios of the two. It asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

from sqlalchemy import text

from prorsa_runtime.testing import DEFAULT_PG_URL, temporary_database
from prorsa_schemas import Event, LogWriter
from prorsa_tracker import console_queries, tools
from prorsa_tracker.db import make_engine, migrate
from prorsa_tracker.examples import EventFactory, iter_workload

INDEX = "ix_events_type_pos"
ENGINES = 4


def log_events(n: int) -> Iterator[Event]:
    """The workload's events, an engine's switch every 1,000, engines published under their
    own run label as the engine agents do."""
    eng = EventFactory("agents", prefix="eng")
    for i in range(ENGINES):
        yield eng("engine.registered", 0.0, engine=f"e{i}", server=f"s{i}", role="prefill" if i < 2 else "decode",
                  gpus=16, kv_capacity_tokens=1_000_000)
    roles = ["prefill", "prefill", "decode", "decode"]
    for k, ev in enumerate(iter_workload(n)):
        yield ev
        if k % 1000 == 999:
            i = (k // 1000) % ENGINES
            to = "decode" if roles[i] == "prefill" else "prefill"
            yield eng("engine.switching", ev.ts, engine=f"e{i}", cmd=f"c{k}", from_role=roles[i], to_role=to)
            yield eng("engine.switched", ev.ts, engine=f"e{i}", cmd=f"c{k}", from_role=roles[i], to_role=to,
                      seconds=15.0)
            roles[i] = to


def median_s(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(url: str, log: Path, with_index: bool, repeat: int) -> dict:
    eng = make_engine(url)
    try:
        migrate(eng)
        if not with_index:
            with eng.begin() as conn:
                conn.execute(text(f"DROP INDEX {INDEX}"))
        t0 = time.perf_counter()
        counts = tools.load(eng, log)
        load_s = time.perf_counter() - t0
        if eng.dialect.name == "postgresql":
            with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE events"))
        else:
            with eng.begin() as conn:
                conn.execute(text("ANALYZE"))
        roles = median_s(lambda: console_queries.engine_roles(eng, "r1"), repeat)
        context = median_s(lambda: tools.engine_context(eng, "r1", all_engines=True), repeat)
        return {"events": counts["events"], "load_s": load_s, "roles_s": roles, "context_s": context}
    finally:
        eng.dispose()


def report(name: str, base: dict, indexed: dict) -> None:
    rate_b, rate_i = base["events"] / base["load_s"], indexed["events"] / indexed["load_s"]
    print(f"{name}: {indexed['events']:,} events")
    print(f"  load (fold + SQL writes)   without the index {rate_b:9,.0f} events/s   with it {rate_i:9,.0f} events/s"
          f"   ratio {rate_i / rate_b:.2f}")
    for key, what in (("roles_s", "console engines view"), ("context_s", "export engine context")):
        print(f"  {what:<26} without the index {base[key] * 1e3:9.1f} ms         with it {indexed[key] * 1e3:9.1f} ms"
              f"         {base[key] / max(indexed[key], 1e-9):.1f}x faster")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("n", nargs="?", type=int, default=500_000, help="events of the workload (default 500,000)")
    ap.add_argument("--pg", choices=("auto", "off"), default="auto",
                    help="auto: fresh databases on the server of PRORSA_TEST_PG_URL; off: SQLite only")
    ap.add_argument("--repeat", type=int, default=5, help="reads timed per query (the median is printed)")
    args = ap.parse_args(argv)
    if args.n < 1000 or args.repeat < 1:
        ap.error("N must be at least 1,000 and --repeat at least 1")
    with tempfile.TemporaryDirectory(prefix="prorsa-bench-") as tmp, ExitStack() as stack:
        log = Path(tmp) / "log.jsonl"
        with LogWriter(log) as w:
            for ev in log_events(args.n):
                w.write(ev)
        try:
            load_avg = "load average %.1f" % os.getloadavg()[0]
        except OSError:
            load_avg = "load average unknown"
        print(f"# {load_avg}")
        targets = [("SQLite", lambda k: f"sqlite:///{tmp}/{k}.db")]
        if args.pg != "off":
            base_url = os.environ.get("PRORSA_TEST_PG_URL", DEFAULT_PG_URL)
            targets.append(("PostgreSQL", lambda k: stack.enter_context(temporary_database(base_url, prefix="prorsa_bench_"))))
        for name, url_of in targets:
            base = measure(url_of("without"), log, False, args.repeat)
            indexed = measure(url_of("with"), log, True, args.repeat)
            report(name, base, indexed)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
