#!/usr/bin/env python3
"""Convert a public LLM serving trace (CSV or JSONL) into a contract event log (.jsonl / .jsonl.gz).

    .venv/bin/python scripts/trace_to_contract.py TRACE OUT.jsonl.gz [--format auto|azure|burstgpt|mooncake]
        [--minutes M] [--skip-minutes K] [--servers 4] [--tpot-ms 30] [--minimal] [--sessions]

Formats (a CSV's first line is its header, a JSONL trace starts with ``{``; ``auto`` tells
them apart by it):

* ``azure``: the Azure LLM inference traces (Azure/AzurePublicDataset,
  ``data/AzureLLMInferenceTrace_code.csv`` and ``_conv.csv``): ``TIMESTAMP,
  ContextTokens, GeneratedTokens``, the timestamp as ``2023-11-16 18:17:03.9799600``.
* ``burstgpt``: BurstGPT (HPMLL/BurstGPT, ``data/BurstGPT_*.csv``): ``Timestamp, Model,
  Request tokens, Response tokens, Total tokens, Log Type``, the timestamp in seconds.
  Rows with 0 response tokens (failed requests) are skipped.
* ``mooncake``: the Mooncake traces (kvcache-ai/Mooncake, ``FAST25-release/traces/
  conversation_trace.jsonl``: one hour of Kimi's chat service): one JSON object a line,
  ``timestamp`` (ms), ``input_length``, ``output_length`` and ``hash_ids``, the prompt's
  512-token blocks, an id per distinct prefix.

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

``--sessions`` (a trace with ``hash_ids``) rebuilds the conversations: a request whose
prompt starts with every full block of an earlier request's prompt, of at least two
blocks, is that request's next turn (of such requests not yet continued whose modelled
answer ended before this one arrived: the one sharing the most blocks, then one whose
whole prompt starts this one, then the latest; the shared first block, a system prompt,
alone does not link). A conversation is one trajectory: each answer ends with
``finish="tool"`` and a ``tool.started`` (the user's turn: a chat server does not know
whether the user will write again, so every answer waits), and the next turn's arrival is
its ``tool.finished`` (``result_tokens``: the prompt's growth past the previous prompt and
answer) then its ``request.queued``. A conversation's last wait never ends. On the
conversation trace 3,915 of the 12,031 requests continue a conversation (8,116
conversations, up to 43 turns; the user's wait has a median of 112 s).

Bad input (a missing file, an unknown header, a malformed row) ends with a message and
exit code 2, never a traceback. The fetched trace is not part of the repository: pass its
path.
"""

from __future__ import annotations

import argparse
import csv
import heapq
import json
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
    blocks: tuple[int, ...] = ()
    """Prefix block ids (Mooncake's ``hash_ids``), if the trace has them."""


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


def _read_mooncake(path: Path, fh) -> list[Row]:
    rows: list[Row] = []
    for n, line in enumerate(fh, start=1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            ts, prompt, output = float(rec["timestamp"]) / 1000.0, int(rec["input_length"]), int(rec["output_length"])
            blocks = tuple(int(b) for b in rec.get("hash_ids") or ())
        except (ValueError, KeyError, TypeError) as exc:
            raise TraceError(f"{path}:{n}: malformed line {line.strip()[:80]!r}: {exc!r}") from None
        if not math.isfinite(ts) or prompt < 0 or output < 0:
            raise TraceError(f"{path}:{n}: malformed line {line.strip()[:80]!r}: negative or non-finite value")
        rows.append(Row(ts, min(prompt, 10_000_000), min(output, 10_000_000), blocks))
    return rows


def read_rows(path: Path, fmt: str = "auto") -> list[Row]:
    """The trace's requests, in arrival order, times in seconds from the first."""
    try:
        fh = open(path, newline="")
        first = fh.read(1)
        fh.seek(0)
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path} is not a text trace") from None
    if fmt == "mooncake" or (fmt == "auto" and first == "{"):
        with fh:
            try:
                rows = _read_mooncake(path, fh)
            except UnicodeDecodeError:
                raise TraceError(f"{path} is not a text trace") from None
        return _from_first(rows, path)
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
    return _from_first(rows, path)


def _from_first(rows: list[Row], path: Path) -> list[Row]:
    if not rows:
        raise TraceError(f"{path}: no requests")
    rows.sort(key=lambda r: r.ts)
    t0 = rows[0].ts
    return [Row(r.ts - t0, r.prompt, r.output, r.blocks) for r in rows]


def _prefix_keys(blocks: tuple[int, ...]) -> list[int]:
    """keys[L]: one id per distinct first L blocks (a chained hash; keys[0] is the empty
    prefix)."""
    keys = [0]
    for b in blocks:
        keys.append(hash((keys[-1], b)))
    return keys


def link_sessions(rows: list[Row], ends: list[float]) -> list[int | None]:
    """Per request, the earlier request it continues (see the module doc), or None:
    request i is continued by j when j's first len(i) - 1 blocks are i's (its full blocks;
    its last block is partial, and the answer and the next message extend it), at least
    two, i is not continued yet and its answer ended (``ends[i]``) before j arrived. The
    longest such match wins; among equals, one whose whole prompt starts j's, then the
    latest."""
    parent: list[int | None] = [None] * len(rows)
    by_prefix: dict[int, list[int]] = {}
    continued: set[int] = set()
    for j, r in enumerate(rows):
        keys = _prefix_keys(r.blocks)
        for n in range(len(r.blocks) - 1, 1, -1):
            cands = [i for i in by_prefix.get(keys[n], ()) if i not in continued and ends[i] <= r.ts]
            if cands:
                # Rather one whose whole prompt, its last block too, starts this one.
                whole = [i for i in cands if r.blocks[:len(rows[i].blocks)] == rows[i].blocks]
                parent[j] = (whole or cands)[-1]
                continued.add(parent[j])
                break
        if len(r.blocks) >= 3:
            by_prefix.setdefault(keys[len(r.blocks) - 1], []).append(j)
    return parent


def convert(rows: list[Row], out: Path, run: str = "trace", servers: int = 4, tpot_ms: float = 30.0,
            minimal: bool = False, sessions: bool = False) -> int:
    """Write the contract log; returns the number of events."""
    from prorsa_schemas import (DecodeFinished, LogWriter, PrefillFinished, RequestQueued, ToolFinished, ToolStarted,
                                TrajectoryDispatched)

    if servers < 1:
        raise TraceError("--servers must be >= 1")
    if not (tpot_ms >= 0 and math.isfinite(tpot_ms)):
        raise TraceError("--tpot-ms must be >= 0")
    if sessions and not any(r.blocks for r in rows):
        raise TraceError("--sessions needs a trace with prefix blocks (hash_ids: the mooncake format)")
    free = [0.0] * servers  # when each prefill server is next free (a heap)
    prefill_done, ends = [], []
    for r in rows:
        start = max(heapq.heappop(free), r.ts)
        done = start + prefill_seconds(r.prompt)
        heapq.heappush(free, done)
        prefill_done.append(done)
        ends.append(done + r.output * tpot_ms / 1000.0)
    parent = link_sessions(rows, ends) if sessions else [None] * len(rows)
    traj_of: list[str] = []
    turn_of: list[int] = []
    events = []
    for i, r in enumerate(rows):
        p = parent[i]
        traj, turn = (traj_of[p], turn_of[p] + 1) if p is not None else (f"r{i}", 0)
        traj_of.append(traj)
        turn_of.append(turn)
        req = str(turn)
        if p is None:
            events.append((r.ts, -1, TrajectoryDispatched(id=f"{traj}-t", ts=r.ts, run=run, traj=traj,
                                                          prompt_tokens=r.prompt)))
        else:
            grew = max(0, r.prompt - rows[p].prompt - rows[p].output)
            events.append((r.ts, -1, ToolFinished(id=f"{traj}-f{turn}", ts=r.ts, run=run, traj=traj, result_tokens=grew)))
        events.append((r.ts, 0, RequestQueued(id=f"{traj}-q{req}", ts=r.ts, run=run, traj=traj, req=req, turn=turn,
                                              prompt_tokens=r.prompt)))
        if not minimal:
            events.append((prefill_done[i], 1, PrefillFinished(id=f"{traj}-p{req}", ts=prefill_done[i], run=run,
                                                               traj=traj, req=req)))
        events.append((ends[i], 2, DecodeFinished(id=f"{traj}-d{req}", ts=ends[i], run=run, traj=traj, req=req,
                                                  output_tokens=r.output, finish="tool" if sessions else "stop")))
        if sessions:
            events.append((ends[i], 3, ToolStarted(id=f"{traj}-s{req}", ts=ends[i], run=run, traj=traj, tool="user")))
    events.sort(key=lambda e: (e[0], e[1]))
    with LogWriter(out) as w:
        for _, _, ev in events:
            w.write(ev)
    return len(events)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="the trace (CSV, or JSONL for mooncake)")
    ap.add_argument("out", type=Path, help="the log to write (.jsonl or .jsonl.gz)")
    ap.add_argument("--format", choices=("auto", "azure", "burstgpt", "mooncake"), default="auto")
    ap.add_argument("--run", default="trace", help="run id of every event")
    ap.add_argument("--skip-minutes", type=float, default=0.0, help="leave out the trace's first K minutes")
    ap.add_argument("--minutes", type=float, default=None, help="keep M minutes (after the skipped ones)")
    ap.add_argument("--servers", type=int, default=4, help="FIFO prefill servers of the modelled prefill")
    ap.add_argument("--tpot-ms", type=float, default=30.0, help="decode milliseconds per generated token")
    ap.add_argument("--minimal", action="store_true", help="no prefill.finished (requests and their ends only)")
    ap.add_argument("--sessions", action="store_true",
                    help="rebuild conversations from the prefix blocks (mooncake): one trajectory each, the user's "
                         "turn as a tool call")
    args = ap.parse_args(argv)
    try:
        rows = read_rows(args.trace, args.format)
        lo = args.skip_minutes * 60.0
        hi = math.inf if args.minutes is None else lo + args.minutes * 60.0
        rows = [r for r in rows if lo <= r.ts < hi]
        if not rows:
            raise TraceError("no requests in the chosen minutes")
        n = convert(rows, args.out, args.run, args.servers, args.tpot_ms, args.minimal, args.sessions)
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
