"""One window's forecast over 10k and 100k live trajectories (target: <= 50 ms at 100k).

Builds a LiveState by folding synthetic events (trajectories spread over every state),
then times ``snapshot(t)`` + ``forecast(...)`` (what the service does once per window),
next to a baseline measured in the same run: one pass of Python over the trajectories
(what a non-vectorised forecaster would at least cost).

    .venv/bin/python benchmarks/bench_forecast.py [--sizes 10000 100000] [--repeat 20] [--attn-dp 16] [--pending-update]
        [--landed-update] [-o KEY=VALUE ...]

``--attn-dp N`` registers the 8 prefill engines with N attention data-parallel ranks each
(N prefill queues per engine in the queue simulation), as SGLang DP-attention engines do,
and names each live request's rank in ``request.queued.dp_rank``.
``-o KEY=VALUE`` overrides a ``ForecastConfig`` field (as ``prorsa forecast-eval -o``
does), to time what one part costs, e.g. ``-o use_dp_rank=false``. ``--pending-update``
makes the run async with a weight update triggered and not yet landed, the worst case of
the decode admissions (a mixture over every sub-step it may land in). ``--landed-update``
publishes a weight update 2 s before the window and aborts half of the decodes under way
at it, so that the forecast re-queues both halves (``terms/update.py``, ``requeues``: the
aborted ones, and the rest as decodes that update is about to abort). ``--groups G``
puts the trajectories in GRPO groups of G whose tool durations share a group effect
(lognormal, sigma 0.6), so that the forecast runs with the group and trajectory effects
on tool durations (frailty.py): each open call on its own time scale, each decoding or
queued trajectory's next call with its own kernel.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import typer

from prorsa_forecaster.cli import parse_options
from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.core import forecast
from prorsa_forecaster.state import LiveState
from prorsa_schemas import EVENT_TYPES


def build(n: int, seed: int = 0, attn_dp: int = 0, pending_update: bool = False, groups: int = 0,
          landed_update: bool = False) -> LiveState:
    rng = np.random.default_rng(seed)
    history_n = 2000
    n_groups = max(history_n // groups, 1) if groups else 0
    effect = rng.normal(0.0, 0.6, n_groups)
    st = LiveState(ForecastConfig())
    mk = EVENT_TYPES
    k = 0

    def ev(type_, ts, **f):
        nonlocal k
        k += 1
        return mk[type_](id=f"b{k}", ts=ts, run="bench", **f)

    if pending_update:
        # Async run, 500 admitted samples per update: the history below triggers one
        # (observed at ts 30, so the trigger -> update delay is learnt once) and, with
        # 1333 admitted, the next one at once: it is pending at t = 100 and may land in
        # any sub-step of the window, so the update mixture runs for each.
        st.apply(ev("run.started", 0.0, mode="async", batch_size=500))
    if attn_dp:
        for e in range(8):
            st.apply(ev("engine.registered", 0.0, engine=f"p{e}", server=f"s{e}", role="prefill", gpus=16,
                        kv_capacity_tokens=10**7, parallel={"attn_dp": attn_dp, "dp": attn_dp}))
    # Some history so every duration model is non-trivial.
    for i in range(history_n):
        t = f"h{i}"
        grp = {"group": f"hg{i // groups}"} if groups else {}
        st.apply(ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=3000, **grp))
        st.apply(ev("request.queued", 1.0, traj=t, req=f"{t}-0", turn=0, prompt_tokens=3100, engine=f"p{i % 8}"))
        st.apply(ev("prefill.finished", 1.2, traj=t, req=f"{t}-0", engine=f"p{i % 8}"))
        st.apply(ev("decode.finished", 5.0, traj=t, req=f"{t}-0", output_tokens=300, finish="tool"))
        mu = 1.0 + (effect[i // groups] if groups else 0.0)
        st.apply(ev("request.queued", 5.0 + rng.lognormal(mu, 1), traj=t, req=f"{t}-1", turn=1, prompt_tokens=4000,
                    engine=f"p{i % 8}"))
        # Three in four find their previous prompt cached: a learnt hit rate, so that
        # queued warm requests below have a cache flip (the start spread's work).
        st.apply(ev("prefill.finished", 20.0, traj=t, req=f"{t}-1", engine=f"p{i % 8}", cached_tokens=3100 if i % 4 else 0))
        st.apply(ev("decode.finished", 25.0, traj=t, req=f"{t}-1", output_tokens=300, finish="stop"))
        if groups and i % groups == 0:
            continue  # one member a group stays in its reward: the group stays live
        st.apply(ev("reward.finished", 25.0 + rng.lognormal(1, 0.5), traj=t, admitted=bool(i % 3)))
    if pending_update:
        st.apply(ev("policy.updated", 30.0, version=1))
    # n live trajectories spread over start-up, queued, prefill, decode, tool and reward.
    for i in range(n):
        t = f"t{i}"
        ts = 30.0 + rng.random() * 60
        grp = {"group": f"hg{i % n_groups}"} if groups else {}
        st.apply(ev("trajectory.dispatched", ts, traj=t, prompt_tokens=3000, **grp))
        phase = i % 6
        if phase == 0:
            st.apply(ev("sandbox.started", ts, traj=t, mode="prewarm" if i % 4 else "cold"))
            continue
        if phase == 1 and i % 12 == 7:
            # Half of the queued ones are on their second turn: warm, a cache flip each.
            st.apply(ev("request.queued", ts, traj=t, req=f"{t}-w", turn=0, prompt_tokens=3000, engine=f"p{i % 8}"))
            st.apply(ev("prefill.finished", ts + 0.2, traj=t, req=f"{t}-w", engine=f"p{i % 8}", cached_tokens=0))
            st.apply(ev("decode.finished", ts + 0.5, traj=t, req=f"{t}-w", output_tokens=200, finish="tool"))
        turn = 1 if phase == 1 and i % 12 == 7 else 0
        # With DP ranks, the router names the rank (request.queued.dp_rank), so the queue
        # model places each request on its rank's server.
        rank = {"dp_rank": (i // 8) % attn_dp} if attn_dp else {}
        st.apply(ev("request.queued", ts + 1, traj=t, req=f"{t}-0", turn=turn, prompt_tokens=3000 + i % 5000,
                    engine=f"p{i % 8}", **rank))
        if phase == 1:
            continue
        st.apply(ev("prefill.started", ts + 1.5, traj=t, req=f"{t}-0", engine=f"p{i % 8}"))
        if phase == 2:
            continue
        st.apply(ev("prefill.finished", ts + 2, traj=t, req=f"{t}-0", engine=f"p{i % 8}"))
        if phase == 3:
            continue
        st.apply(ev("decode.finished", ts + 5, traj=t, req=f"{t}-0", output_tokens=200, finish="tool" if phase == 4 else "stop"))
    if landed_update:
        # Every live decode (phase 3) began before this update; half are aborted by it.
        st.apply(ev("policy.updated", 98.0, version=st.updates + 1))
        for i in range(3, n, 12):
            st.apply(ev("decode.finished", 98.03, traj=f"t{i}", req=f"t{i}-0", output_tokens=100, finish="abort"))
    return st


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--attn-dp", type=int, default=0, help="attention DP ranks per prefill engine (0: unregistered)")
    ap.add_argument("--pending-update", action="store_true", help="a triggered weight update may land in the window (the update mixture runs)")
    ap.add_argument("--landed-update", action="store_true",
                    help="a weight update landed 2 s before the window; half the decodes under way aborted (the re-queue term runs)")
    ap.add_argument("--groups", type=int, default=0, help="GRPO group size whose tool durations share an effect (0: no groups)")
    ap.add_argument("-o", "--option", action="append", default=[], help="ForecastConfig override KEY=VALUE (repeatable)")
    args = ap.parse_args()
    try:
        overrides = parse_options(args.option)
    except typer.Exit as e:  # the message is printed already
        raise SystemExit(e.exit_code) from None
    cfg = ForecastConfig(**overrides)
    for n in args.sizes:
        st = build(n, attn_dp=args.attn_dp, pending_update=args.pending_update, groups=args.groups,
                   landed_update=args.landed_update)
        if args.landed_update:
            snap = st.snapshot(100.0)
            from prorsa_forecaster.terms.update import cut_by_update
            print(f"landed update: {len(snap.aborted_elapsed):,} aborted, {int(cut_by_update(snap).sum()):,} decodes under way at it")
        if args.groups and not st.history.frailty.active:
            raise SystemExit("--groups: the group effects were not estimated (frailty inactive)")
        t = 100.0
        times, snaps = [], []
        for _ in range(args.repeat):
            a = time.perf_counter()
            snap = st.snapshot(t)
            b = time.perf_counter()
            f = forecast(snap, st.history, cfg)
            c = time.perf_counter()
            times.append(c - a)
            snaps.append(b - a)
        # Baseline: a single Python loop touching each live trajectory once.
        a = time.perf_counter()
        total = 0.0
        for i in range(st.n):
            if st.state[i]:
                total += float(st.prompt[i])
        loop_s = time.perf_counter() - a
        print(
            f"live={st.live:>7,} attn_dp={args.attn_dp} pending_update={args.pending_update} landed_update={args.landed_update} "
            f"groups={args.groups}  forecast window: median {1e3 * statistics.median(times):6.1f} ms "
            f"(p90 {1e3 * sorted(times)[int(0.9 * len(times)) - 1]:6.1f} ms; snapshot {1e3 * statistics.median(snaps):5.1f} ms)  "
            f"| baseline python loop over trajectories: {1e3 * loop_s:6.1f} ms  "
            f"| W^P={f.prefill_tokens:,.0f} A^D={f.decode_admit_tokens:,.0f}"
        )


if __name__ == "__main__":
    main()
