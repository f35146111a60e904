#!/usr/bin/env python3
"""Convert a public LLM serving trace (CSV) into a contract event log (.jsonl / .jsonl.gz).

    .venv/bin/python scripts/trace_to_contract.py TRACE.csv OUT.jsonl.gz [--format auto|azure|burstgpt]
        [--minutes M] [--skip-minutes K] [--servers 4] [--tpot-ms 30] [--minimal]

Formats (the first line of the CSV is its header; ``auto`` tells them apart by it):

* ``azure``: the Azure LLM inference traces (Azure/AzurePublicDataset,
  ``data/AzureLLMInferenceTrace_code.csv`` and ``_conv.csv``): ``TIMESTAMP,
  ContextTokens, GeneratedTokens``, the timestamp as ``2023-11-16 18:17:03.9799600``.
* ``burstgpt``: BurstGPT (HPMLL/BurstGPT, ``data/BurstGPT_*.csv``): ``Timestamp, Model,
  Request tokens, Response tokens, Total tokens, Log Type``, the timestamp in seconds.
  Rows with 0 response tokens (failed requests) are skipped.

Each row is one request of its own trajectory (a serving trace has no sessions): a
``trajectory.dispatched`` and a ``request.queued`` at its arrival (``ts`` in seconds from the first kept row), then a
``prefill.finished`` and a ``decode.finished`` (``finish="stop"``). The trace says when
a request arrived and how many tokens it had and made, not when its prefill ended, so
that is modelled (CHOICE, stated so that nothing is read into it): ``--servers`` FIFO
prefill servers, each request on the one free first, taking g(x) = 16.5 ms + 15.2 us x
+ 0.42 ns x^2 for x prompt tokens (Dynamo's mocker prefill profile, ms = 4.21e-7 x^2 +
0.0152 x + 16.5), then ``GeneratedTokens`` x ``--tpot-ms`` of decode. No run, engine,
sandbox, tool or reward event is written: what a serving system's request log holds.
``--minimal`` leaves out ``prefill.finished`` too (only ``trajectory.dispatched``,
``request.queued`` and ``decode.finished``: decode admissions cannot be scored on it).

Bad input (a missing file, an unknown header, a malformed row) ends with a message and
exit code 2, never a traceback. The fetched trace is not part of the repository: pass its
path.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import math
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

# Dynamo's mocker prefill profile (the forecaster's prior too, prefill_queue.py).
PREFILL_A_S = 0.0165
PREFILL_B_S = 1.518344e-5
PREFILL_C_S = 4.209989e-10

AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT = ("Timestamp", "Request tokens", "Response tokens")


class TraceError(ValueError):
    """The trace cannot be converted (the message says where and why)."""


@dataclass(frozen=True)
class Row:
    ts: float
    prompt: int
    output: int


def prefill_seconds(x: int) -> float:
    return PREFILL_A_S + PREFILL_B_S * x + PREFILL_C_S * x * x


def detect(header: list[str]) -> str:
    names = {h.strip() for h in header}
    if set(AZURE) <= names:
        return "azure"
    if set(BURSTGPT) <= names:
        return "burstgpt"
    raise TraceError(f"unknown header {header!r}: expected Azure ({', '.join(AZURE)}) or BurstGPT ({', '.join(BURSTGPT)})")


def _azure_ts(text: str) -> float:
    # Seven fractional digits: Python's %f takes at most six.
    text = text.strip()
    head, _, frac = text.partition(".")
    base = datetime.strptime(head, "%Y-%m-%d %H:%M:%S").timestamp()
    return base + (float("0." + frac) if frac else 0.0)


def read_rows(path: Path, fmt: str = "auto") -> list[Row]:
    """The trace's requests, in arrival order, times in seconds from the first."""
    try:
        fh = open(path, newline="")
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    rows: list[Row] = []
    with fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{path} is empty")
        kind = detect(header) if fmt == "auto" else fmt
        cols = AZURE if kind == "azure" else BURSTGPT
        idx = {h.strip(): i for i, h in enumerate(header)}
        if not set(cols) <= idx.keys():
            raise TraceError(f"{path}: header {header!r} lacks {', '.join(c for c in cols if c not in idx)} ({kind} format)")
        ti, pi, oi = (idx[c] for c in cols)
        for n, rec in enumerate(reader, start=2):
            if not rec or all(not c.strip() for c in rec):
                continue
            try:
                ts = _azure_ts(rec[ti]) if kind == "azure" else float(rec[ti])
                prompt, output = int(float(rec[pi])), int(float(rec[oi]))
            except (ValueError, IndexError) as exc:
                raise TraceError(f"{path}:{n}: malformed row {rec!r}: {exc}") from None
            if not math.isfinite(ts) or prompt < 0 or output < 0:
                raise TraceError(f"{path}:{n}: malformed row {rec!r}: negative or non-finite value")
            if kind == "burstgpt" and output == 0:
                continue  # a failed request
            rows.append(Row(ts, min(prompt, 10_000_000), min(output, 10_000_000)))
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r.ts)
    t0 = rows[0].ts
    return [Row(r.ts - t0, r.prompt, r.output) for r in rows]


def convert(rows: list[Row], out: Path, run: str = "trace", servers: int = 4, tpot_ms: float = 30.0,
            minimal: bool = False) -> int:
    """Write the contract log; returns the number of events."""
    from prorsa_schemas import DecodeFinished, LogWriter, PrefillFinished, RequestQueued, TrajectoryDispatched

    if servers < 1:
        raise TraceError("--servers must be >= 1")
    if not (tpot_ms >= 0 and math.isfinite(tpot_ms)):
        raise TraceError("--tpot-ms must be >= 0")
    free = [0.0] * servers  # when each prefill server is next free (a heap)
    events = []
    for i, r in enumerate(rows):
        traj = f"r{i}"
        events.append((r.ts, -1, TrajectoryDispatched(id=f"{traj}-t", ts=r.ts, run=run, traj=traj, prompt_tokens=r.prompt)))
        events.append((r.ts, 0, RequestQueued(id=f"{traj}-q", ts=r.ts, run=run, traj=traj, req="0", turn=0, prompt_tokens=r.prompt)))
        start = max(heapq.heappop(free), r.ts)
        done = start + prefill_seconds(r.prompt)
        heapq.heappush(free, done)
        if not minimal:
            events.append((done, 1, PrefillFinished(id=f"{traj}-p", ts=done, run=run, traj=traj, req="0")))
        end = done + r.output * tpot_ms / 1000.0
        events.append((end, 2, DecodeFinished(id=f"{traj}-d", ts=end, run=run, traj=traj, req="0",
                                              output_tokens=r.output, finish="stop")))
    events.sort(key=lambda e: (e[0], e[1]))
    with LogWriter(out) as w:
        for _, _, ev in events:
            w.write(ev)
    return len(events)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="the trace CSV")
    ap.add_argument("out", type=Path, help="the log to write (.jsonl or .jsonl.gz)")
    ap.add_argument("--format", choices=("auto", "azure", "burstgpt"), default="auto")
    ap.add_argument("--run", default="trace", help="run id of every event")
    ap.add_argument("--skip-minutes", type=float, default=0.0, help="leave out the trace's first K minutes")
    ap.add_argument("--minutes", type=float, default=None, help="keep M minutes (after the skipped ones)")
    ap.add_argument("--servers", type=int, default=4, help="FIFO prefill servers of the modelled prefill")
    ap.add_argument("--tpot-ms", type=float, default=30.0, help="decode milliseconds per generated token")
    ap.add_argument("--minimal", action="store_true", help="no prefill.finished (requests and their ends only)")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.trace, args.format)
        lo = args.skip_minutes * 60.0
        hi = math.inf if args.minutes is None else lo + args.minutes * 60.0
        rows = [r for r in rows if lo <= r.ts < hi]
        if not rows:
            raise TraceError("no requests in the chosen minutes")
        n = convert(rows, args.out, args.run, args.servers, args.tpot_ms, args.minimal)
    except TraceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"{len(rows)} requests, {n} events -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
