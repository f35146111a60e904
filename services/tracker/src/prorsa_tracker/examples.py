"""Small, deterministic contract event streams for tests, benchmarks and docs.

:class:`EventFactory` builds valid events with unique ids; :func:`agentic_trajectory`
spells out one trajectory's legal lifecycle (sandbox, turns with tool calls, reward);
:func:`workload` interleaves many of them by event time.
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Iterator

from prorsa_schemas import EVENT_TYPES, Event


class EventFactory:
    """Builds contract events for one run with ids ``<prefix>-<n>``."""

    def __init__(self, run: str = "r1", prefix: str = "e"):
        self.run = run
        self.prefix = prefix
        self._n = itertools.count(1)

    def __call__(self, type_: str, ts: float, **fields) -> Event:
        """One validated event of ``type_`` at ``ts`` (``id`` and ``run`` filled in)."""
        fields.setdefault("run", self.run)
        fields.setdefault("id", f"{self.prefix}-{next(self._n)}")
        return EVENT_TYPES[type_](ts=ts, **fields)


def agentic_trajectory(
    f: EventFactory, traj: str, t0: float, *, turns: int = 3, rng: random.Random | None = None,
    sandbox: bool = True, group: str | None = None,
) -> list[Event]:
    """A legal lifecycle: dispatch, sandbox, ``turns`` requests with tool calls, reward."""
    rng = rng or random.Random(hash(traj) & 0xFFFF)
    t = t0
    prompt = rng.randint(200, 2000)
    out = [f("trajectory.dispatched", t, traj=traj, prompt_tokens=prompt, group=group, policy_version=0)]
    if sandbox:
        mode = "prewarm" if rng.random() < 0.7 else "cold"
        t += 0.01
        out.append(f("sandbox.started", t, traj=traj, mode=mode))
        t += rng.uniform(0.1, 0.5) if mode == "prewarm" else rng.uniform(2, 8)
        out.append(f("sandbox.ready", t, traj=traj))
    ctx = prompt
    for turn in range(turns):
        req = f"{traj}-q{turn}"
        t += 0.01
        out.append(f("request.queued", t, traj=traj, req=req, turn=turn, prompt_tokens=ctx, engine="p0"))
        t += rng.uniform(0.0, 0.2)
        out.append(f("prefill.started", t, traj=traj, req=req, engine="p0"))
        t += rng.uniform(0.05, 0.3)
        out.append(f("prefill.finished", t, traj=traj, req=req, engine="p0", cached_tokens=ctx // 2, decode_engine="d0"))
        t += rng.uniform(0.5, 3.0)
        out_tokens = rng.randint(20, 800)
        last = turn == turns - 1
        out.append(f("decode.finished", t, traj=traj, req=req, output_tokens=out_tokens, finish="stop" if last else "tool"))
        ctx += out_tokens
        if not last:
            t += 0.01
            out.append(f("tool.started", t, traj=traj, tool="bash", calls=1))
            t += rng.expovariate(1.0)
            result = rng.randint(10, 500)
            out.append(f("tool.finished", t, traj=traj, result_tokens=result, ok=True))
            ctx += result
    t += 0.01
    out.append(f("reward.started", t, traj=traj))
    t += rng.uniform(0.1, 2.0)
    out.append(f("reward.finished", t, traj=traj, admitted=rng.random() < 0.8, reward=1.0))
    return out


def workload(
    n_traj: int, *, run: str = "r1", seed: int = 0, turns: int = 3, spacing: float = 0.05,
    t0: float = 0.0, traj_prefix: str = "t", run_started: bool = True,
) -> list[Event]:
    """``n_traj`` trajectories dispatched every ``spacing`` s, merged in event-time order."""
    rng = random.Random(seed)
    f = EventFactory(run, prefix=f"{run}-{traj_prefix}-{seed}")
    lists = [
        agentic_trajectory(f, f"{traj_prefix}{i}", t0 + i * spacing, turns=turns, rng=random.Random(rng.random()))
        for i in range(n_traj)
    ]
    head = [f("run.started", t0, mode="async", batch_size=max(1, n_traj), group_size=1)] if run_started else []
    return head + list(heapq.merge(*lists, key=lambda e: e.ts))


def iter_workload(n_events: int, *, run: str = "r1", seed: int = 0, live: int = 1000) -> Iterator[Event]:
    """A stream of ``n_events`` events, ``live`` trajectories at a time (batch after batch)."""
    produced = 0
    for batch in itertools.count():
        for ev in workload(live, run=run, seed=seed, t0=batch * 1000.0, traj_prefix=f"b{batch}t", run_started=batch == 0):
            yield ev
            produced += 1
            if produced >= n_events:
                return
