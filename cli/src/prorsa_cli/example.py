"""A small, deterministic example log of an agentic run, for the foundation demo.

It follows the contract's state machine (sandbox -> turns of queued/prefill/decode/tool ->
reward) with seeded random lengths. The simulator (`prorsa sim run`) produces realistic
logs; this exists so that `prorsa demo` has something to publish before the simulator.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator

from prorsa_schemas import (
    DecodeFinished,
    Event,
    PrefillFinished,
    PrefillStarted,
    RequestQueued,
    RewardFinished,
    RewardStarted,
    RunStarted,
    SandboxReady,
    SandboxStarted,
    ToolFinished,
    ToolStarted,
    TrajectoryDispatched,
)


def example_events(trajectories: int = 64, seed: int = 0, run: str = "example") -> Iterator[Event]:
    """Yield a valid, ts-ordered event stream for ``trajectories`` multi-turn trajectories."""
    rng = random.Random(seed)
    heap: list[tuple[float, int, dict]] = []
    n = 0

    def push(ts: float, cls: type[Event], **fields: object) -> None:
        nonlocal n
        n += 1
        heapq.heappush(heap, (round(ts, 6), n, {"cls": cls, **fields}))

    push(0.0, RunStarted, mode="async", batch_size=trajectories, max_staleness=2, group_size=4)
    for i in range(trajectories):
        traj = f"t{i:05d}"
        t = rng.uniform(0, 5)
        prompt = rng.randint(500, 3000)
        push(t, TrajectoryDispatched, traj=traj, prompt_tokens=prompt, group=f"g{i // 4}", policy_version=0)
        mode = "prewarm" if rng.random() < 0.8 else "cold"
        t += 0.01
        push(t, SandboxStarted, traj=traj, mode=mode)
        t += rng.uniform(0.2, 1.0) if mode == "prewarm" else rng.uniform(5, 20)
        push(t, SandboxReady, traj=traj)
        ctx = prompt
        turns = rng.randint(1, 6)
        for turn in range(turns):
            req = f"{traj}-r{turn}"
            t += 0.001
            push(t, RequestQueued, traj=traj, req=req, turn=turn, prompt_tokens=ctx)
            t += rng.uniform(0.05, 0.5)
            push(t, PrefillStarted, traj=traj, req=req, engine="p0")
            t += ctx / 20000
            push(t, PrefillFinished, traj=traj, req=req, engine="p0", cached_tokens=0, decode_engine="d0")
            out = rng.randint(50, 800)
            t += out * 0.02
            last = turn == turns - 1
            push(t, DecodeFinished, traj=traj, req=req, output_tokens=out, finish="stop" if last else "tool")
            ctx += out
            if not last:
                t += 0.001
                push(t, ToolStarted, traj=traj, tool="bash", calls=1)
                t += rng.expovariate(1 / 3.0)
                res = rng.randint(20, 2000)
                push(t, ToolFinished, traj=traj, result_tokens=res, ok=True)
                ctx += res
        t += 0.01
        push(t, RewardStarted, traj=traj)
        t += rng.uniform(0.5, 3.0)
        push(t, RewardFinished, traj=traj, admitted=rng.random() < 0.7, reward=rng.random())
    while heap:
        ts, k, f = heapq.heappop(heap)
        cls = f.pop("cls")
        yield cls(id=f"{run}-{k}", ts=ts, run=run, **f)
