"""Allocator speed: one planning decision (optimise + choose switches + build events) for
a cluster of N engines. Target: under 5 ms for 1,024 engines.

Run:  .venv/bin/python benchmarks/bench_allocator.py [--engines 1024] [--repeat 200] [--clock wall|cpu]
                                                  [--objective capacity|turn_latency|saturation]

``--objective``: what the priced gain test judges a move by: the capacity ratio (an
asynchronous run's, and the default here), turn latency, or saturation (a synchronous run's
under the allocator's default ``auto``: the benchmark's clusters see no run.started, so it
is set).

``--clock cpu`` times each decision by the thread's CPU time (``time.thread_time``) instead
of the wall clock: on a host shared with other work it measures what a decision costs,
not how long the process waited for a core (on an idle host the two agree, the decision
being single-threaded and CPU-bound).

Baseline, measured in the same run: the same decision with the §4.2 search done by a plain
Python loop over nᴾ instead of the vectorised one, and the cost of folding one engine.stats.
"""

from __future__ import annotations

import argparse
import gc
import logging
import random
import statistics
import time

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.optimize import Capacity, Demand, instance_demands, solve
from prorsa_allocator.planner import Allocator
from prorsa_allocator.testing import KV, THETA, forecast, registered, stats


def build(n: int, seed: int = 1, initial_fraction: float | None = None, objective: str = "capacity") -> Allocator:
    rng = random.Random(seed)
    # With a decode step model, so every decision also computes the latency-balance term.
    # served_evidence_first off: a fresh allocator has no served rate yet, and the rule would
    # hold every move, so the plans that move engines would time nothing but the hold.
    cfg = AllocatorConfig(prefill_tokens_per_s=THETA, max_switch_fraction=0.25, decode_step_fixed_s=0.03,
                          decode_step_per_seq_s=1e-5, decode_step_per_kv_token_s=1e-9,
                          served_evidence_first=False, objective=objective)
    if initial_fraction is not None:
        cfg = cfg.model_copy(update={"initial_switch_fraction": initial_fraction})
    alloc = Allocator(cfg)
    for i in range(n):
        role = "prefill" if i < n // 4 else "decode"
        alloc.handle(registered(f"e{i}", role, gpus=8))
        alloc.handle(stats(f"e{i}", role, ts=1.0, running=rng.randint(0, 40), kv_used=rng.randint(0, KV)))
    return alloc


def admitting(fc):
    """The forecast with decode admissions (a decode turn of 2 windows), so the
    latency-balance term is evaluated rather than skipped."""
    return fc.model_copy(update={"decode_admit_tokens": fc.decode_kv_now / 2})


def python_loop_solve(demand: Demand, cap: Capacity) -> tuple[int, int, float]:
    a_p, a_d = instance_demands(demand, cap)
    best = (1, 1, -1.0)
    for p in range(1, (cap.gpu_budget - cap.gpus_decode) // cap.gpus_prefill + 1):
        d = (cap.gpu_budget - cap.gpus_prefill * p) // cap.gpus_decode
        if d < 1:
            break
        r = min(p / a_p if a_p else 1e9, d / a_d if a_d else 1e9)
        if r > best[2]:
            best = (p, d, r)
    return best


CLOCK = time.perf_counter


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        out.append((CLOCK() - t0) * 1e3)
    return out


def report(name: str, ms: list[float]) -> None:
    ms = sorted(ms)
    p99 = ms[min(len(ms) - 1, int(0.99 * len(ms)))]
    print(f"{name:58s} median {statistics.median(ms):8.3f} ms   p99 {p99:8.3f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engines", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="wall: perf_counter; cpu: the thread's CPU time (a shared host)")
    ap.add_argument("--objective", choices=("capacity", "turn_latency", "saturation"), default="capacity",
                    help="the gain test's objective (saturation: a synchronous run's under 'auto')")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.thread_time if args.clock == "cpu" else time.perf_counter
    logging.disable(logging.WARNING)  # the steady cluster's decisions are not what we time
    n = args.engines

    # A decision that switches (prefill-heavy demand on a decode-heavy cluster): each run
    # starts from a fresh copy of the same cluster so every decision does the full work.
    # Measured twice: the first plan (uncapped by default: initial_switch_fraction = 1.0)
    # and a plan under the steady-state cap (a quarter of the engines), as every later plan is.
    t = [1000.0]

    def measure(initial_fraction: float | None) -> tuple[list[float], int]:
        runs = min(args.repeat, 50)
        clusters = [build(n, initial_fraction=initial_fraction, objective=args.objective) for _ in range(runs)]
        ms: list[float] = []
        commands = 0
        for i in range(runs):
            alloc = clusters.pop()
            t[0] += 10.0
            gc.collect()  # building the next cluster is not part of the decision
            t0 = CLOCK()
            out = alloc.handle(admitting(forecast(t=t[0], prefill_engines=n * 0.6, decode_engines=n * 0.3)))
            dt = (CLOCK() - t0) * 1e3
            commands = sum(1 for e in out if e.type == "engine.command")
            if i:  # the first is a warm-up (first-call imports and caches)
                ms.append(dt)
        return ms, commands

    first_ms, first_cmds = measure(None)
    capped_ms, capped_cmds = measure(0.25)
    steady = build(n, objective=args.objective)

    def decide_steady() -> None:
        t[0] += 10.0
        # Demand that the current 1:3 split already meets: the plan needs no switch.
        steady.handle(admitting(forecast(t=t[0], prefill_engines=n * 0.125, decode_engines=n * 0.375)))

    d = Demand(n * 0.6 * 10 * THETA, 10.0, n * 0.3 * KV)
    c = Capacity(THETA, KV, 8, 8, 8 * n)
    print(f"allocator benchmark: {n} engines x 8 GPUs, target < 5 ms per decision ({args.clock} clock, "
          f"objective {args.objective})")
    report(f"first plan, uncapped (plan + {first_cmds} commands)", first_ms)
    report(f"plan under the 1/4 cap (plan + {capped_cmds} commands)", capped_ms)
    report("decision, no switch needed (plan only)", timed(decide_steady, args.repeat))
    report("§4.2 search alone, vectorised (numpy)", timed(lambda: solve(d, c), args.repeat))
    report("baseline: §4.2 search as a Python loop", timed(lambda: python_loop_solve(d, c), args.repeat))
    ev = stats("e1", "decode", ts=2000.0, running=3, kv_used=100)
    report("fold one engine.stats (x1000)", timed(lambda: [steady.handle(ev) for _ in range(1000)], 20))
    assert solve(d, c).delta + 1 == python_loop_solve(d, c)[2]


if __name__ == "__main__":
    main()
