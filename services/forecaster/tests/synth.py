"""A small closed-loop rollout generator for the forecaster's tests (not the simulator).

Async rollout with ``replace`` injection: ``concurrency`` trajectories live at once; each
reward completion launches a replacement. Sandboxes (prewarm or cold), multi-turn tool
calls with lognormal durations, one FIFO prefill pool of ``prefill_servers`` servers
(service a + b x), decode at a fixed token rate. Optional events can be left out to
check that the forecaster degrades gracefully.
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np

from prorsa_schemas import EVENT_TYPES, Event


def rollout(
    *,
    seed: int = 0,
    concurrency: int = 64,
    duration: float = 300.0,
    prefill_servers: int = 2,
    sandbox: bool = True,
    prefill_started: bool = True,
    run_started: bool = True,
    tools: bool = True,
) -> list[Event]:
    rng = np.random.default_rng(seed)
    ids = itertools.count()
    out: list[Event] = []
    heap: list = []
    seq = itertools.count()

    def emit(type_: str, ts: float, **f) -> None:
        out.append(EVENT_TYPES[type_](id=f"s{seed}-{next(ids)}", ts=round(ts, 6), run="synth", **f))

    def at(ts: float, fn, *args) -> None:
        heapq.heappush(heap, (ts, next(seq), fn, args))

    free_at = [0.0] * prefill_servers
    n_traj = itertools.count()

    def launch(ts: float) -> None:
        i = next(n_traj)
        traj = f"t{i}"
        prompt = int(rng.lognormal(np.log(3000), 0.3))
        turns = int(np.clip(rng.lognormal(np.log(6), 0.5), 1, 30))
        emit("trajectory.dispatched", ts, traj=traj, prompt_tokens=prompt)
        start = ts
        if sandbox:
            cold = rng.random() < 0.2
            emit("sandbox.started", ts + 0.01, traj=traj, mode="cold" if cold else "prewarm")
            start = ts + 0.01 + (rng.lognormal(np.log(15), 0.4) if cold else 1.0 + 0.2 * rng.random())
            at(start, lambda t, tr=traj: emit("sandbox.ready", t, traj=tr))
        at(start + 0.01, request, traj, prompt + 50, 0, turns)

    def request(ts: float, traj: str, prompt: int, turn: int, turns: int) -> None:
        req = f"{traj}-{turn}"
        emit("request.queued", ts, traj=traj, req=req, turn=turn, prompt_tokens=prompt)
        k = int(np.argmin(free_at))
        begin = max(ts, free_at[k])
        end = begin + 0.02 + 2e-5 * prompt
        free_at[k] = end
        if prefill_started:
            at(begin, lambda t: emit("prefill.started", t, traj=traj, req=req, engine=f"p{k}"))
        at(end, finished, traj, req, prompt, turn, turns, k)

    def finished(ts, traj, req, prompt, turn, turns, k) -> None:
        emit("prefill.finished", ts, traj=traj, req=req, engine=f"p{k}")
        out_tokens = int(np.clip(rng.lognormal(np.log(250), 0.6), 8, 4000))
        at(ts + out_tokens / 40.0, decoded, traj, req, prompt + out_tokens, turn, turns, out_tokens)

    def decoded(ts, traj, req, ctx, turn, turns, out_tokens) -> None:
        last = turn + 1 >= turns
        emit("decode.finished", ts, traj=traj, req=req, output_tokens=out_tokens, finish="stop" if last else "tool")
        if last:
            if tools:
                emit("reward.started", ts + 0.01, traj=traj)
            at(ts + 0.01 + rng.lognormal(np.log(6), 0.5), rewarded, traj)
            return
        if tools:
            emit("tool.started", ts + 0.01, traj=traj, tool="bash", calls=1)
        dur = float(np.clip(rng.lognormal(np.log(3), 1.0), 0.05, 120))
        result = int(rng.lognormal(np.log(600), 0.8))
        if tools:
            at(ts + 0.01 + dur, lambda t: emit("tool.finished", t, traj=traj, result_tokens=result, ok=True))
        at(ts + 0.02 + dur, request, traj, ctx + result + 20, turn + 1, turns)

    def rewarded(ts, traj) -> None:
        emit("reward.finished", ts, traj=traj, admitted=bool(rng.random() < 0.7), reward=1.0)
        if ts < duration:
            at(ts + 0.05, launch)

    if run_started:
        emit("run.started", 0.0, mode="async", batch_size=concurrency, prompt_tokens_mean=3000)
    for j in range(concurrency):
        at(0.5 + 0.02 * j, launch)
    while heap:
        ts, _, fn, args = heapq.heappop(heap)
        fn(ts, *args)
    out.sort(key=lambda e: e.ts)  # stable: same-ts events keep their emission order
    return out
