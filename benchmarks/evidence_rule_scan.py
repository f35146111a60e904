"""Which runs the evidence rule's shortage reading changes: every setting, seed and start
ratio, each run to its first served rate.

    .venv/bin/python benchmarks/evidence_rule_scan.py [--models deepseek-v3.2 mimo-v2.5-pro]
        [--workloads math coding general] [--staleness 0 2 8] [--seeds 0 1 2] [--steps 6]
        [--starts 1:7 ... 7:1] [--dp-routing load|prefix] [--router-policy queue|smg] [--jobs 2]

Before a run's first served rate the priced rule moves only while the engines show a
shortage the move relieves (``pricing.role_pressed(..., short=True)``: a decode queue
counts only with the decode pool's KV at least half used). Each run here uses the plain
reading instead (any decode queue over 4 a engine counts) and stops at its first served
rate, after which the rule no longer applies and a run is the same either way. A run that
made a move before then which the shortage reading does not support is one the rule
changes: it is printed with the time and the reason of that move (``CHANGED``); every other
run is the same under both readings (``same``). One line per run, then the count.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp


class _Served(Exception):
    """The run reached its first served rate."""


def scan(job: tuple) -> str:
    workload, staleness, model, seed, start, steps, dp_routing, router_policy = job
    import prorsa_allocator.planner as planner
    import prorsa_allocator.pricing as pricing
    from prorsa_sim.catalog import make_policy
    from prorsa_sim.runner import StartAt
    from prorsa_sim.simconfig import build_config
    from prorsa_sim.simulator import Simulator

    shortage = pricing.role_pressed
    changed: list[tuple[float, str]] = []

    def plain(engines, to_role, short=False):  # the reading without the shortage condition
        return shortage(engines, to_role)

    select, context = planner.select_priced, planner.PricedContext

    def select_traced(alloc, engines, dv, now, cfg, cost, ctx, *a, **k):
        sel = select(alloc, engines, dv, now, cfg, cost, ctx, *a, **k)
        if sel.moves and cfg.served_evidence_first and not shortage(engines, sel.moves[0].to_role, short=True):
            changed.append((now, sel.reason))
        return sel

    def context_checked(*a, **k):
        ctx = context(*a, **k)
        if ctx.served:
            raise _Served
        return ctx

    pricing.role_pressed, planner.select_priced, planner.PricedContext = plain, select_traced, context_checked
    try:
        cfg = build_config(workload=workload, model=model, staleness=staleness, steps=steps, seed=seed,
                           dp_routing=dp_routing, router_policy=router_policy)
        p, d = (int(x) for x in start.split(":"))
        try:
            Simulator(cfg, StartAt(make_policy("prorsa"), p, d)).run()
        except _Served:
            pass
    finally:
        pricing.role_pressed, planner.select_priced, planner.PricedContext = shortage, select, context
    tag = f"{model} {workload}/{staleness} seed {seed} from {start}"
    if changed:
        return f"CHANGED {tag}: " + "; ".join(f"t = {t:.0f} s: {why}" for t, why in changed)
    return f"same    {tag}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["deepseek-v3.2", "mimo-v2.5-pro"])
    ap.add_argument("--workloads", nargs="+", default=["math", "coding", "general"])
    ap.add_argument("--staleness", nargs="+", type=int, default=[0, 2, 8])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--starts", nargs="+", default=[f"{p}:{8 - p}" for p in range(1, 8)])
    ap.add_argument("--dp-routing", default="load")
    ap.add_argument("--router-policy", default="queue")
    ap.add_argument("--jobs", type=int, default=1)
    a = ap.parse_args()
    for s in a.starts:
        p, sep, d = s.partition(":")
        if not (sep and p.isdigit() and d.isdigit()):
            ap.error(f"--starts {s!r}: expected P:D")
    jobs = [(w, st, m, sd, s, a.steps, a.dp_routing, a.router_policy)
            for m, w, st, sd, s in itertools.product(a.models, a.workloads, a.staleness, a.seeds, a.starts)]
    n_changed = 0
    with mp.get_context("spawn").Pool(a.jobs) as pool:
        for line in pool.imap(scan, jobs):
            n_changed += line.startswith("CHANGED")
            print(line, flush=True)
    print(f"{n_changed} of {len(jobs)} runs changed by the shortage reading")


if __name__ == "__main__":
    main()
