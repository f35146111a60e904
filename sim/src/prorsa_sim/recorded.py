"""A workload recorded in an event log (``--workload log:PATH``).

The simulator's own workloads draw every trajectory's plan from distributions
(:mod:`.workloads`). A recorded workload takes the plans from a log in the event contract
instead: a run exported from the tracker (``prorsa export``), a simulator's or the live
demo's log, or a public trace converted to the contract (``scripts/trace_to_contract.py``).
So an operator can ask what another P:D split, colocation or Prorsa's allocator would have
made of *their* rollout, and the project's comparisons can run on trajectories it did not
generate.

The log is read through the tracker's fold (``prorsa_tracker.core``), so its events mean
what they mean to the tracker: the contract's lifecycle, with an event it refuses counted
(``skipped``) and the trajectory it belongs to judged on the rest.

What a trajectory's plan takes from the log (each complete trajectory: one that has a
``reward.finished`` and an answer to each of its turns; the others are counted and left
out. A log with no ``reward.finished`` at all, a serving or chat trace, ends each
trajectory with its last answer, admitted, and drops a wait after it that never returned):

- ``prompt_tokens``: the first request's full prompt;
- per turn (the requests of one ``turn`` value, in turn order): the output tokens, summed
  over the turn's requests (an aborted request's partial answer and the re-prefilled rest);
- the tool-result tokens of each turn but the last: the next turn's first prompt less this
  turn's first prompt and output (never below 0: what the framework adds between turns,
  the tool result and the chat template, is the prompt's growth);
- the time between turns: from the turn's last answer (``decode.finished``) to the next
  turn's first ``request.queued``; tool calls and whatever else the framework did then;
- the sandbox: the mode of ``sandbox.started`` and the time to ``sandbox.ready`` (kept as
  recorded; no prewarm pool is simulated for it); none when the log has no sandbox events
  for the trajectory;
- the reward time (the last answer to ``reward.finished``), ``admitted`` and ``reward``.

What the log does not decide stays the simulator's: the timing of prefill and decode (the
cluster's, which the split changes), when the sampler dispatches (``--staleness``,
``--batch-size``: set them to the log's ``run.started`` to replay its sampler), and the
order of the trajectories. Seed 0 takes the recorded groups in the order they started;
another seed takes them in an order drawn from that seed, so seeds compare policies on
the same trajectories dealt differently. Groups (``trajectory.dispatched.group``, GRPO)
stay together: the simulated group size is ``run.started.group_size`` where the log gives
one value, else the most common recorded group size; a recorded group of another size is
cut to it or repeats its members. The workload is cycled when a run needs more
trajectories than the log holds.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from prorsa_schemas import read_log
from prorsa_tracker.core import apply, new_state
from prorsa_tracker.state import TrajState

from .plan import TrajectoryPlan

PREFIX = "log:"
"""A workload name that starts with it names a log (``log:PATH``)."""

@dataclass
class _Traj:
    """One trajectory's events as read (before it becomes a plan)."""

    run: str = ""
    group: str | None = None
    sandbox_mode: str | None = None
    sandbox_start: float | None = None
    sandbox_ready: float | None = None
    turns: dict[int, dict] = field(default_factory=dict)
    """turn -> {"prompt", "queued" (first ts), "output", "answered" (its answer's ts)}."""
    reward_ts: float | None = None
    admitted: bool = False
    reward: float = 0.0
    dropped: bool = False


@dataclass(frozen=True, eq=False)
class RecordedWorkload:
    """The plans of a log's complete trajectories, grouped as recorded
    (:func:`load_recorded`)."""

    path: str
    digest: str
    """A hash of the plans: part of a simulation's cache key."""
    plans: tuple[TrajectoryPlan, ...]
    """The plan of each complete trajectory."""
    groups: tuple[tuple[int, ...], ...]
    """Indices into ``plans`` of each recorded group, in dispatch order."""
    group_size: int
    skipped: dict[str, int]
    """Trajectories left out, by reason; ``invalid lines`` counts lines that are not events."""
    run_started: dict | None
    """The log's first ``run.started`` (mode, batch_size, ...), or None."""

    @property
    def name(self) -> str:
        return f"{PREFIX}{Path(self.path).name}@{self.digest}"

    def describe(self) -> dict:
        """What a simulation's summary says of the workload (``recorded_workload``)."""
        return {"name": self.name, "trajectories": len(self.plans), "groups": len(self.groups),
                "group_size": self.group_size, "skipped": dict(self.skipped), "run_started": self.run_started}

    def plan(self, seed: int, index: int):
        """The plan of the simulation's trajectory ``index`` under ``seed`` (a copy: a
        simulation may cap it)."""
        order = _slots(self, seed)
        p = self.plans[order[index % len(order)]]
        return replace(p, outputs=list(p.outputs), results=list(p.results), tool_s=list(p.tool_s))


@lru_cache(maxsize=64)
def _slots(w: RecordedWorkload, seed: int) -> tuple[int, ...]:
    """The plan index of every trajectory slot: groups in dispatch order (seed 0) or an
    order drawn from the seed, each cut or cycled to ``group_size`` members."""
    order = np.arange(len(w.groups))
    if seed:
        order = np.random.default_rng([seed, 0x10C]).permutation(len(w.groups))
    out: list[int] = []
    for g in order:
        members = w.groups[int(g)]
        out.extend(members[k % len(members)] for k in range(w.group_size))
    return tuple(out)


def _read(path: str) -> tuple[list[_Traj], dict | None, Counter, int, int]:
    """Every trajectory of the log through the tracker's fold (``prorsa_tracker.core``: the
    contract's lifecycle, its requests closed and its spans timed as the tracker stores
    them), the events taken in event-time order (a log written in arrival order, such as
    a live run's, may hold a trajectory's events out of order), the trajectories in the
    order of their first event; the first ``run.started``; the group sizes the log's
    ``run.started`` events declare; the count of invalid lines; and the count of events the
    lifecycle refused (the tracker's anomalies)."""
    events = []
    run_started = None
    group_sizes: Counter = Counter()
    invalid = 0
    for seq, line in enumerate(read_log(path)):
        ev = line.event
        if ev is None:
            invalid += 1
            continue
        if ev.type == "run.started":
            if run_started is None:
                run_started = {k: v for k, v in ev.model_dump().items()
                               if k in ("mode", "batch_size", "max_staleness", "group_size")}
            if ev.group_size:
                group_sizes[ev.group_size] += 1
        events.append((ev.ts, seq, ev))
    if not events:
        raise ValueError(f"workload log {path}: no valid event in it ({invalid} invalid lines)")
    events.sort(key=lambda x: x[:2])
    state = new_state()
    trajs: dict[tuple[str, str], _Traj] = {}
    for _, _, ev in events:
        for t in apply(state, ev)[1]:
            _fold(trajs.setdefault((t.run, t.traj), _Traj(run=t.run)), t, ev)
    return list(trajs.values()), run_started, group_sizes, invalid, state.anomalies


def _fold(tr: _Traj, t, ev) -> None:
    """One of a trajectory's transitions (``prorsa_tracker.state.Transition``, of event
    ``ev``) into what its plan is made of."""
    if t.event_type == "trajectory.dispatched":
        tr.group = t.group
    elif t.event_type == "request.queued":
        tr.turns.setdefault(ev.turn, {"prompt": ev.prompt_tokens, "queued": t.ts, "output": 0, "answered": None})
    elif t.event_type == "reward.finished":
        tr.reward_ts, tr.admitted, tr.reward = t.ts, bool(t.span.ok), float(t.span.reward or 0.0)
    if t.to_state == TrajState.DROPPED:
        tr.dropped = True
    if t.span is not None and t.span.kind == "sandbox":
        tr.sandbox_mode, tr.sandbox_start, tr.sandbox_ready = t.span.mode, t.span.start_ts, t.span.end_ts
    rec = t.request
    if rec is not None and rec.turn in tr.turns:
        turn = tr.turns[rec.turn]
        turn["output"] += rec.output_tokens or 0
        if rec.finish in ("tool", "stop", "length"):
            turn["answered"] = rec.decode_finished_ts


def _plan_of(tr: _Traj, rewarded: bool):
    """The plan of one trajectory, or the reason it has none (``rewarded``: the log has
    rewards, so a trajectory without one is unfinished)."""
    if tr.dropped:
        return "dropped"
    if rewarded and tr.reward_ts is None:
        return "unfinished (no reward.finished)"
    if not tr.turns:
        return "no request"
    turns = [tr.turns[k] for k in sorted(tr.turns)]
    if any(x["answered"] is None for x in turns):
        return "a turn without an answer"
    if not rewarded:
        # A serving or chat trace: the trajectory ends with its last answer, admitted.
        tr.reward_ts, tr.admitted, tr.reward = turns[-1]["answered"], True, 0.0
    outputs = [max(1, int(x["output"])) for x in turns]
    results, tools = [], []
    for a, b, out in zip(turns, turns[1:], outputs):
        results.append(max(0, int(b["prompt"]) - int(a["prompt"]) - out))
        tools.append(max(0.0, float(b["queued"] - a["answered"])))
    reward_s = max(0.0, float(tr.reward_ts - turns[-1]["answered"]))
    if tr.sandbox_mode is not None and tr.sandbox_start is not None and tr.sandbox_ready is not None:
        sandbox, sandbox_s = tr.sandbox_mode, max(0.0, float(tr.sandbox_ready - tr.sandbox_start))
    else:
        sandbox, sandbox_s = "none", 0.0
    return TrajectoryPlan(
        prompt_tokens=max(1, int(turns[0]["prompt"])), outputs=outputs, results=results, tool_s=tools,
        cold_start_s=sandbox_s, prewarm_s=sandbox_s, reward_s=reward_s, admitted=tr.admitted,
        reward=tr.reward, sandbox=sandbox,
    )


def load_recorded(path: str | os.PathLike) -> RecordedWorkload:
    """Read a log's complete trajectories as plans (raises ``ValueError`` with the reason
    when the log cannot give a workload)."""
    p = str(path)
    if not Path(p).is_file():
        raise ValueError(f"workload log not found: {p}")
    trajs, run_started, declared, invalid, refused = _read(p)
    plans, groups_of, skipped = [], {}, Counter()
    rewarded = any(tr.reward_ts is not None for tr in trajs)
    for i, tr in enumerate(trajs):
        plan = _plan_of(tr, rewarded)
        if isinstance(plan, str):
            skipped[plan] += 1
            continue
        # A group is one run's; a trajectory without a group is a group of its own.
        groups_of.setdefault((tr.run, tr.group) if tr.group is not None else i, []).append(len(plans))
        plans.append(plan)
    if invalid:
        skipped["invalid lines"] = invalid
    if refused:
        skipped["events the lifecycle refused"] = refused
    if not plans:
        why = ", ".join(f"{n} {r}" for r, n in skipped.items()) or "no trajectory events"
        raise ValueError(f"workload log {p}: no complete trajectory (one with reward.finished): {why}")
    if not any(pl.admitted for pl in plans):
        raise ValueError(f"workload log {p}: none of its {len(plans)} complete trajectories was admitted "
                         "(reward.finished admitted=true); the sampler could never fill a training batch")
    groups = tuple(tuple(m) for m in groups_of.values())
    if len(declared) == 1:
        size = next(iter(declared))
    else:
        size = Counter(len(m) for m in groups).most_common(1)[0][0]
    h = hashlib.sha256()
    for pl in plans:
        h.update(repr((pl.prompt_tokens, pl.outputs, pl.results, [round(x, 6) for x in pl.tool_s],
                       round(pl.cold_start_s, 6), round(pl.reward_s, 6), pl.admitted, pl.reward,
                       pl.sandbox)).encode())
    h.update(repr((groups, size)).encode())
    return RecordedWorkload(p, h.hexdigest()[:12], tuple(plans), groups, int(size), dict(skipped), run_started)

