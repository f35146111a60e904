"""The prefill pool's prefix working set against its cache, on one contract log (the
figures behind docs/allocator.md's "Under a DP-aware gateway").

    .venv/bin/python benchmarks/prefix_working_set.py LOG [LOG ...] [--bucket 60]

A trajectory's next turn can hit the prefill cache only if its last prompt is still
cached somewhere in the pool. The working set W is the sum, over the live trajectories
(dispatched, not yet rewarded or dropped) that have sent a request, of the
``prompt_tokens`` of their last ``request.queued``. The pool's cache can hold at most C,
the ``kv_capacity_tokens`` of the engines in the prefill role (from ``engine.registered``
and ``engine.switched``; prefills in flight take part of it). Per bucket of ``--bucket``
seconds of event time it prints the mean W, the mean C, W/C, and the share of the prompt
tokens the pool computed (1 - cached/prompt over the bucket's ``prefill.finished``), then
the same over the run from its second weight update on (the warm-up step left out). Where
W/C is well under 1 the pool can keep every live prefix; above 1 it cannot, and under a
router that keeps each conversation on the engine that holds its prefix the computed
share rises with W/C.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field

import numpy as np

from prorsa_schemas import read_log


@dataclass
class Bucket:
    w: list[float] = field(default_factory=list)
    c: list[float] = field(default_factory=list)
    prompt: float = 0.0
    cached: float = 0.0

    def line(self) -> tuple[float, float, float, float] | None:
        if not self.w:
            return None
        w, c = float(np.mean(self.w)), float(np.mean(self.c))
        computed = 1.0 - self.cached / self.prompt if self.prompt > 0 else float("nan")
        return w, c, (w / c if c > 0 else float("inf")), computed


def scan(path: str, bucket_s: float) -> tuple[dict[int, Bucket], Bucket, int, int]:
    """Buckets by event time, the run from its second update on, the updates seen and the
    lines that are not contract events (left out)."""
    live: dict[str, int] = {}  # trajectory -> its last prompt (0 before its first request)
    prompts: dict[str, int] = {}  # request -> its prompt tokens, until its prefill.finished
    w_total = 0
    roles: dict[str, str] = {}
    capacity: dict[str, int] = {}
    buckets: dict[int, Bucket] = {}
    measured = Bucket()
    updates = bad = 0
    for line in read_log(path):
        ev = line.event
        if ev is None:
            bad += 1
            continue
        kind = ev.type
        if kind == "trajectory.dispatched":
            live.setdefault(ev.traj, 0)
        elif kind == "request.queued":
            prompts[ev.req] = ev.prompt_tokens
            if ev.traj in live:
                w_total += ev.prompt_tokens - live[ev.traj]
                live[ev.traj] = ev.prompt_tokens
        elif kind in ("reward.finished", "trajectory.dropped") and ev.traj in live:
            w_total -= live.pop(ev.traj)
        elif kind == "engine.registered":
            roles[ev.engine], capacity[ev.engine] = ev.role, ev.kv_capacity_tokens
        elif kind == "engine.switched":
            roles[ev.engine] = ev.to_role
        elif kind == "policy.updated":
            updates += 1
        c = sum(capacity[e] for e, r in roles.items() if r == "prefill")
        b = buckets.setdefault(int(ev.ts // bucket_s), Bucket())
        if kind == "prefill.finished" and ev.req in prompts:
            prompt, cached = prompts.pop(ev.req), float(ev.cached_tokens or 0)
            for target in (b, measured) if updates >= 2 else (b,):
                target.prompt += prompt
                target.cached += cached
        if kind in ("request.queued", "reward.finished", "trajectory.dropped", "engine.switched"):
            for target in (b, measured) if updates >= 2 else (b,):
                target.w.append(float(w_total))
                target.c.append(float(c))
    return buckets, measured, updates, bad


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", help="contract logs (events.jsonl.gz of `prorsa sim run`, `prorsa export`)")
    ap.add_argument("--bucket", type=float, default=60.0, help="seconds of event time per printed line (default 60)")
    ap.add_argument("--summary", action="store_true", help="print the run lines only")
    args = ap.parse_args(argv)
    if not args.bucket > 0:
        ap.error("--bucket must be > 0")
    for path in args.logs:
        try:
            buckets, measured, updates, bad = scan(path, args.bucket)
        except (OSError, ValueError) as exc:
            print(f"{path}: cannot read: {exc}", file=sys.stderr)
            return 1
        print(f"# {path}")
        if bad:
            print(f"{bad} line(s) are not contract events and were left out", file=sys.stderr)
        if not args.summary:
            print(f"{'t (s)':>8} {'W (M tok)':>10} {'C (M tok)':>10} {'W/C':>6} {'computed':>9}")
            for k in sorted(buckets):
                got = buckets[k].line()
                if got:
                    w, c, ratio, computed = got
                    print(f"{k * args.bucket:8.0f} {w / 1e6:10.2f} {c / 1e6:10.2f} {ratio:6.2f} {computed:9.1%}")
        got = measured.line()
        if got is None:
            print("run after the second weight update: no events (fewer than two policy.updated)")
        else:
            w, c, ratio, computed = got
            print(f"run after the second weight update ({updates} updates): W {w / 1e6:.2f}M tokens, "
                  f"C {c / 1e6:.2f}M, W/C {ratio:.2f}, computed {computed:.1%} of the prompt tokens")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
