"""The allocator's decision at every window of one simulated run (what docs/allocator.md's
explanations were read from).

    .venv/bin/python benchmarks/allocator_trace.py WORKLOAD STALENESS [--policy prorsa]
        [--model deepseek-v3.2] [--steps 2] [--start P:D] [--from 0] [--to inf] [--quiet-band]
        [--gpus 128] [--batch-size 512] [--max-turns N --max-output N --no-group-prefix]
        [--dp-routing load|prefix] [--router-policy queue|smg] [--served]
        [--set FIELD=VALUE ...]

One line per window, and one per weight update whose pause the allocator decides at the
update ("update"): the prefill engines now, the demands in instances (aᴾ, aᴰ), the
target P:D, the forecast (Ŵᴾ, Kᴰ, Âᴰ, and ``arr``, the share of Ŵᴾ its arrival terms bring:
``planner.prefill_fed_share``), the decode engines' sequences, θᴾ, the engines
commanded and the reason. ``--quiet-band`` leaves out the windows whose prefill count is
already inside the target band. The last line is the rollout time, the switch count and the
number of decisions the decode spread cap could change (``Decision.spread_binds``).
"""

from __future__ import annotations

import argparse
import math

from prorsa_allocator.planner import prefill_fed_share
from prorsa_allocator.served import pool_hit
from prorsa_sim.catalog import make_policy
from prorsa_sim.policies import allocator_overrides
from prorsa_sim.runner import StartAt
from prorsa_sim.simconfig import build_config
from prorsa_sim.simulator import Simulator


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", help="math, coding, general, or log:PATH (a recorded workload)")
    ap.add_argument("staleness", type=int)
    ap.add_argument("--policy", default="prorsa", help="prorsa or oracle, with their :options")
    ap.add_argument("--model", default="deepseek-v3.2")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--gpus", type=int, default=128)
    ap.add_argument("--max-turns", type=int, default=None, help="cap on turns (the live demo: 6)")
    ap.add_argument("--max-output", type=int, default=None, help="cap on output tokens a turn (the live demo: 512)")
    ap.add_argument("--no-group-prefix", action="store_true", help="no shared first prompt in a GRPO group")
    ap.add_argument("--dp-routing", default="load", help="load (default) or prefix (a DP-aware router)")
    ap.add_argument("--router-policy", default="queue", help="queue (default) or smg (the gateway's cache_aware)")
    ap.add_argument("--from", dest="t_from", type=float, default=0.0)
    ap.add_argument("--to", dest="t_to", type=float, default=math.inf)
    ap.add_argument("--start", default=None, help="P:D split to start from (default: the policy's own)")
    ap.add_argument("--quiet-band", action="store_true", help="leave out windows already in the target band")
    ap.add_argument("--served", action="store_true",
                    help="also print the served rate of each prefill count measured so far (EMA, full-prompt "
                    "tokens/s) and the prefill pool's cache hit ratio")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                    help="an AllocatorConfig field over its default (an ablation), e.g. --set settle_s=0; the same "
                    "as the policy spec's :FIELD=VALUE (prorsa:settle_s=0)")
    args = ap.parse_args()
    raw = {}
    for item in args.overrides:
        name, sep, value = item.partition("=")
        if not sep:
            ap.error(f"--set {item!r}: expected FIELD=VALUE with FIELD one of AllocatorConfig's fields")
        if name in raw:
            ap.error(f"--set {item!r}: {name} is set twice ({name}={raw[name]} and {item})")
        raw[name] = value
    try:  # validated and typed once; the driver lays them over the profile's priors
        overrides = allocator_overrides(raw)
    except ValueError as e:
        ap.error(f"--set: {e}")
    if not args.policy.split(":")[0] in ("prorsa", "oracle"):
        ap.error("--policy must be prorsa or oracle (the policies that run the allocator)")

    try:
        cfg = build_config(workload=args.workload, model=args.model, staleness=args.staleness, steps=args.steps,
                           seed=args.seed, batch_size=args.batch_size, total_gpus=args.gpus,
                           max_turns=args.max_turns, max_output=args.max_output,
                           group_prefix=not args.no_group_prefix, dp_routing=args.dp_routing,
                           router_policy=args.router_policy)
    except ValueError as e:
        ap.error(str(e))
    policy = make_policy(args.policy)
    driver = policy.driver
    driver.overrides = overrides
    if args.start:
        p, d = (int(x) for x in args.start.split(":"))
        policy = StartAt(policy, p, d)
    decide = driver.decide

    def traced(obs, fc):
        out = decide(obs, fc)
        alloc = driver.allocator
        d = alloc.last_decision
        a = d.allocation if d else None
        if a is None or not (args.t_from <= obs.t <= args.t_to):
            return out
        reason = d.selection.reason if d.selection else d.skipped
        if args.quiet_band and "within target band" in reason:
            return out
        n_p = sum(v.role == "prefill" for v in obs.engines)
        seqs = sum(v.running_reqs + v.queued_reqs for v in alloc.table.engines.values() if v.role == "decode")
        moves = [(m.engine.engine, m.to_role) for m in d.selection.moves] if d.selection else []
        print(f"t={obs.t:7.0f} P={n_p} aP={a.prefill_demand:6.2f} aD={a.decode_demand:5.2f} "
              f"target={a.n_prefill}:{a.n_decode} W={fc.prefill_tokens / 1e6:6.2f}M Kd={fc.decode_kv_now / 1e6:5.2f}M "
              f"Ad={fc.decode_admit_tokens / 1e6:5.2f}M arr={prefill_fed_share(fc):4.2f} seqs={seqs} theta={alloc.theta.value:7.0f} "
              f"moves={moves} {reason}")
        if args.served:
            rates = " ".join(f"{p}:{v[0] / 1e3:.0f}k/{v[1]}" for p, v in sorted(alloc.served.items()))
            print(f"         served (count:rate/windows) {rates or '-'} pool hit {pool_hit(list(alloc.table.engines.values())):.2f}")
        return out

    spread_binds = 0

    def counted(obs, fc):
        nonlocal spread_binds
        out = traced(obs, fc)
        d = driver.allocator.last_decision if driver.allocator else None
        spread_binds += bool(d is not None and d.t == fc.t and d.spread_binds)
        return out

    driver.decide = counted
    on_update = driver.on_update

    def traced_update(obs):
        # The pause's own decision, taken at the update (Allocator.on_pause): one line when
        # it is taken, marked "update", the engines as they are in the pause.
        before = driver.allocator.last_decision if driver.allocator else None
        out = on_update(obs)
        d = driver.allocator.last_decision if driver.allocator else None
        if d is not None and d is not before and d.allocation is not None and args.t_from <= obs.t <= args.t_to:
            a = d.allocation
            n_p = sum(v.role == "prefill" for v in obs.engines)
            moves = [(m.engine.engine, m.to_role) for m in d.selection.moves] if d.selection else []
            reason = d.selection.reason if d.selection else d.skipped
            print(f"t={obs.t:7.1f} update P={n_p} aP={a.prefill_demand:6.2f} aD={a.decode_demand:5.2f} "
                  f"target={a.n_prefill}:{a.n_decode} moves={moves} {reason}")
        return out

    driver.on_update = traced_update
    res = Simulator(cfg, policy).run()
    print(f"rollout time {res.summary['rollout_time_s']} s, {res.summary['switches']} switches, "
          f"final roles {res.summary['final_roles']}, decode spread cap in play in {spread_binds} decisions")


if __name__ == "__main__":
    main()
