"""The price of the drain rule (docs/simulator.md, "Role switches"): one run per drain
deadline, MiMo-V2.5-Pro coding at staleness 2, printing switch durations by direction,
rollout time and the drain_* summary keys.

``--policy fixed`` (default) runs a fixed switch schedule that is the same at every
deadline (start 5:3; every 300 s engine e005 flips decode -> prefill, and back 300 s
later), so only the drain rule differs; any other value is a policy spec (e.g. ``prorsa``),
whose switches then depend on the deadline.

    .venv/bin/python benchmarks/drain_price.py [--deadlines 0,10,30,60] [--policy fixed]
        [--steps 2] [--seed 0]

One line of JSON per deadline. rollout_mean_s is the mean of all steps (warm-up included).
"""

from __future__ import annotations

import argparse
import json
import statistics as st
import time

from prorsa_sim.catalog import make_policy
from prorsa_sim.policy import StaticPD, SwitchRequest
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator

PERIOD_S = 300.0
"""CHOICE: the fixed schedule's period; long enough for each switch to finish."""


class FixedSchedule(StaticPD):
    """5:3, then e005 flips role at every multiple of PERIOD_S."""

    def on_window(self, obs):
        k = int(obs.t // PERIOD_S)
        if k >= 1 and obs.t % PERIOD_S < obs.window_s:
            return [SwitchRequest("e005", "prefill" if k % 2 else "decode")]
        return []


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--deadlines", default="0,10,30,60")
    ap.add_argument("--policy", default="fixed")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    for d in (float(x) for x in a.deadlines.split(",")):
        policy = FixedSchedule(5, 3, name="fixed") if a.policy == "fixed" else make_policy(a.policy)
        cfg = SimConfig(workload="coding", model="mimo-v2.5-pro", staleness=2, steps=a.steps, seed=a.seed)
        sim = Simulator(cfg, policy)
        sim.drain_deadline_s = d
        t0 = time.time()
        s = sim.run().summary
        out = {"deadline_s": d, "policy": a.policy, "wall_s": round(time.time() - t0, 1),
               "rollout_mean_s": round(st.mean(s["step_times_s"]), 1), "step_times_s": s["step_times_s"],
               "switches": s["switches"], "prefill_computed_tokens": s["prefill_computed_tokens"]}
        out.update({k: v for k, v in s.items() if k.startswith("drain_") or k == "cache_lost_tokens"})
        for role in ("decode", "prefill"):
            xs = [x["drain_s"] + x["switch_s"] for x in s["switch_log"] if x["from"] == role]
            ds = [x["drain_s"] for x in s["switch_log"] if x["from"] == role]
            if xs:
                out[f"from_{role}"] = {"n": len(xs), "mean_s": round(st.mean(xs), 1), "max_s": round(max(xs), 1),
                                       "mean_drain_s": round(st.mean(ds), 2)}
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
