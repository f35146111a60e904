"""A deterministic demo run for the console's tests and screenshots: an agentic workload
(:func:`examples.workload`) with the control loop around it: four engines registered by an
engine agent, a ``forecast.window`` and an ``allocation.plan`` per window, and role
switches (commanded, switching, switched; one failed)."""

from __future__ import annotations

import random

from prorsa_schemas import Event

from .console_queries import demand_windows
from .examples import EventFactory, workload

T0 = 1_796_100_000.0  # 2026-12-01 04:40 UTC: event time as production has it (epoch seconds)
HORIZON = 5.0


def demo_events(run: str = "demo", n_traj: int = 120, seed: int = 0) -> list[Event]:
    """Every event of the demo run, ordered by ts (the engine agent's under ``engines``)."""
    rollout = workload(n_traj, run=run, seed=seed, turns=3, spacing=0.5, t0=T0)
    eng = EventFactory("engines", prefix=f"{run}-agent")
    ctl = EventFactory(run, prefix=f"{run}-ctl")
    out: list[Event] = [
        eng("engine.registered", T0 - 5 + i, engine=e, server="node-0", role=role, gpus=8, kv_capacity_tokens=2_000_000)
        for i, (e, role) in enumerate([("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode")])
    ]
    reqs: dict[str, list] = {}
    for ev in rollout:
        if ev.type == "request.queued":
            reqs[ev.req] = [ev.ts, None, None, ev.prompt_tokens]
        elif ev.type == "prefill.finished":
            reqs[ev.req][1] = ev.ts
        elif ev.type == "decode.finished":
            reqs[ev.req][2] = ev.ts
    actual = demand_windows([tuple(r) for r in reqs.values()], [], HORIZON, start=T0)["windows"]
    rng = random.Random(seed)
    # Three switches: d1 to prefill as the load builds, p1 to decode (it fails), d1 back to decode.
    switches = [("d1", "decode", "prefill", 12.05, 3.4, False), ("p1", "prefill", "decode", 30.05, 0.0, True),
                ("d1", "prefill", "decode", 52.05, 2.9, False)]
    for w in actual:  # a forecast a little off the truth, published as its window opens
        noise = lambda: 1 + rng.uniform(-0.25, 0.25)  # noqa: E731
        kv = w["decode_kv_tokens"]
        out.append(ctl("forecast.window", w["t"], t=w["t"], horizon=HORIZON, prefill_tokens=w["prefill_tokens"] * noise(),
                       decode_admit_tokens=w["decode_admit_tokens"] * noise(), decode_kv_tokens=kv * 0.3 * noise(),
                       decode_kv_now=kv))
        rel = w["t"] - T0
        n_p = 3 if 10 <= rel < 30 else 2
        moves = [{"engine": e, "to_role": to} for e, _, to, at, _, _ in switches if rel <= at < rel + HORIZON]
        out.append(ctl("allocation.plan", w["t"] + 0.05, t=w["t"], n_prefill=n_p, n_decode=4 - n_p,
                       delta=round(rng.uniform(-0.1, 0.4), 3), feasible=True, switches=moves or None))
    for k, (engine, frm, to, at, secs, fail) in enumerate(switches):
        cmd, t = f"{run}-cmd-{k}", T0 + at
        out.append(ctl("engine.command", t, cmd=cmd, engine=engine, action="switch_role", to_role=to, deadline=t + 30))
        out.append(ctl("engine.switching", t + 0.4, engine=engine, cmd=cmd, from_role=frm, to_role=to, mode="in_place"))
        if fail:
            out.append(ctl("engine.switch_failed", t + 1.5, engine=engine, cmd=cmd, role=frm,
                           error="drain deadline passed with 3 requests running"))
        else:
            out.append(ctl("engine.switched", t + 0.4 + secs, engine=engine, cmd=cmd, from_role=frm, to_role=to,
                           seconds=secs, mode="in_place"))
    return sorted(out + rollout, key=lambda e: e.ts)
