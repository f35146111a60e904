"""The ``bound`` policy: the hindsight-best dynamic P:D schedule the search finds.

A *schedule* is piecewise constant on a grid of ``grid_s`` seconds (default 60): segment k,
``[k * grid_s, (k + 1) * grid_s)``, has a target number of prefill engines; at the window
that opens the segment the policy asks for the switches that reach it (the rest decode).
Switches go through the simulator's own mechanics (drain, deadline aborts, switch time,
the prefix cache lost; in the weight-update pause, no drain), so a schedule pays what any
policy pays.

The search (:func:`search`; docs/simulator.md, "The bound") runs on the simulator's own
forked state (:meth:`Simulator.fork`, a deep copy that goes on by itself):

1. The static sweep (every ratio of an 8-engine cluster, the runner's grid otherwise)
   gives the best static ratio P* and its rollout time.
2. The warm-up step is not measured: the search holds P* through it (with ``--steps 1``,
   through the first segment) and starts at the first grid boundary after it. Every
   candidate then shares the warm-up, and the rollout time of a schedule is its run's end
   time minus a constant: the search minimises time.
3. Beam search with a base plan (a rollout algorithm): each beam member is a forked
   simulation at the segment boundary with its schedule so far and a *plan* for the rest
   (at first: P* held). Each member is expanded by every candidate target for the segment
   (every static-sweep ratio and the neighbours +-1, +-2 of the member's planned target);
   a child is scored by simulating ahead, from a fork, to the *finish line* -- the end of
   the next step that no member has completed yet -- under two continuations: the
   target held, and the target for this one segment followed by the parent's plan; the
   better of the two is the child's score and new plan. The ``beam`` best children
   (ties: candidate order) go on; the next segment starts from them. A child that cannot
   enter the beam (its lookahead passes the beam's worst score) is cut short.
4. The parent's own plan is always among its children (same target, same continuation,
   score reused), so the best score in the beam never gets worse: the search ends with a
   schedule at least as fast as P* held, measured on the same forks.
5. The answer is the best of the searched schedule, P* (the static run) and the *seeds*:
   the runs of other policies on the same setting and seed, replayed request for request
   (:class:`~.schedule.RecordedPolicy`; a comparison passes its switching policies' runs),
   each measured by a full simulation under the summary's rule; the reported run replays
   it. So the bound is never slower than the best fixed ratio nor than any policy it was
   handed: a schedule some policy found is a schedule that exists.

Spec: ``bound[:<grid_s>][:beam=<B>][:in_place|:restart]``, e.g. ``bound:30``,
``bound:120:beam=1``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from prorsa_emulated.costmodel import ModelProfile, get_profile

from ..policy import Observation, SwitchRequest, static_sweep_ratios
from .schedule import GRID_S, RecordedPolicy, SchedulePolicy, changes

BEAM = 2
"""CHOICE: members kept per segment. Each member costs ~2 x (candidates - 1) lookaheads
per segment; 2 keeps a paper-scale DeepSeek run within tens of minutes on one core."""
StaticSweep = Callable[..., tuple]
"""``static_sweep(cfg) -> (best spec, its Result, {spec: rollout s})``: the runner's ``best_static``."""
Seeds = dict[str, tuple[int, list]]
"""``{policy name: (prefill engines it started with, its summary's switch_requests)}``."""
NEIGHBOURS = 2
"""CHOICE: besides the static-sweep ratios, a member's candidates include its planned
target +-1 and +-2 engines (all ratios of an 8-engine cluster are sweep ratios anyway)."""


# --- the search --------------------------------------------------------------------------------


@dataclass
class _Member:
    sim: object
    """The forked simulation at the current segment boundary."""
    plan: list[int]
    """Schedule: the segments already run, then the plan for the rest (last holds)."""
    score: float
    """Time the plan reaches ``line`` (the finish line it was scored against)."""
    line: int
    order: int = 0


@dataclass
class SearchStats:
    segments: int = 0
    lookaheads: int = 0
    pruned: int = 0
    reused: int = 0
    forks: int = 0
    sim_s_lookahead: float = 0.0
    sim_s_advance: float = 0.0
    candidates: list[int] = field(default_factory=list)
    members: list[int] = field(default_factory=list)


def _norm(plan: list[int]) -> tuple[int, ...]:
    """A schedule without its trailing repeats (the last entry holds anyway)."""
    end = len(plan)
    while end > 1 and plan[end - 1] == plan[end - 2]:
        end -= 1
    return tuple(plan[:end])


def _over(sim) -> bool:
    """The run is over: its steps are done, or it passed the safety stop."""
    return sim.done or sim.now > sim.cfg.max_sim_s


def _until(sim, t: float) -> None:
    """Run ``sim`` through every event before ``t`` (the window at ``t`` is left for the
    caller to steer)."""
    cap = sim.cfg.max_sim_s
    sim.run_until(lambda: sim.done or sim.now > cap or not sim._heap or sim._heap[0][0] >= t)


def _candidates(planned: int, n: int, sweep: list[int]) -> list[int]:
    """The planned target first, then its neighbours, then the other sweep ratios."""
    out = [planned]
    for d in range(1, NEIGHBOURS + 1):
        out += [planned - d, planned + d]
    out += sorted(sweep, key=lambda p: (abs(p - planned), p))
    seen: list[int] = []
    for p in out:
        if 1 <= p <= n - 1 and p not in seen:
            seen.append(p)
    return seen


def search(cfg, static_sweep: StaticSweep, grid_s: float = GRID_S, beam: int = BEAM, switch_mode: str | None = None,
           progress: Callable[[int, int, dict], None] | None = None,
           seeds: Seeds | None = None) -> tuple[list[int], dict, str | None]:
    """Search a schedule for ``cfg`` (see the module doc). ``static_sweep(cfg)`` runs the
    static sweep (the runner's ``best_static``); ``seeds``, other policies' runs to count
    among the candidates. Returns the chosen schedule, the ``bound_search`` report, and
    the seed chosen instead of a schedule (its name; None when a schedule is)."""
    from ..simulator import Simulator

    wall0 = time.perf_counter()
    prof = get_profile(cfg.model)
    n = prof.engines_in(cfg.total_gpus)
    if n < 2:
        raise ValueError(f"bound needs at least two engines; {cfg.total_gpus} GPUs hold {n}")
    if grid_s <= 0 or abs(grid_s / cfg.window_s - round(grid_s / cfg.window_s)) > 1e-9:
        raise ValueError(f"bound: the grid ({grid_s} s) must be a positive multiple of the {cfg.window_s} s window")
    if beam < 1:
        raise ValueError("bound: beam must be >= 1")
    best_spec, best_res, tried = static_sweep(cfg)
    p_star = int(best_spec.split(":")[1])
    r_star = best_res.summary["rollout_time_s"]
    sweep = [p for p, _ in static_sweep_ratios(n)]
    stats = SearchStats()
    wall_sweep = time.perf_counter() - wall0

    def mk(schedule: list[int]):
        sim = Simulator(cfg, SchedulePolicy(list(schedule), grid_s, switch_mode))
        sim.forking = True
        sim.begin()
        return sim

    def fork(sim):
        stats.forks += 1
        return sim.fork()

    # Hold P* through the warm-up step (through the first segment with one step).
    root = mk([p_star])
    if cfg.steps >= 2:
        root.run_until(lambda: root.done or root.step >= 1 or root.now > cfg.max_sim_s)
    k = max(1, math.floor(root.now / grid_s + 1e-9) + 1)
    _until(root, k * grid_s)
    k0 = k
    root.policy.schedule = [p_star] * k
    stats.sim_s_advance += root.now
    est_total = max(1, math.ceil((best_res.summary["sim_time_s"] - k0 * grid_s) / grid_s))
    members = [_Member(root, [p_star] * k, math.inf, -1)]

    def score(sim, plan: list[int], line: int, cut: float) -> float:
        look = fork(sim)
        look.policy.schedule = list(plan)
        t0 = look.now
        look.run_until(lambda: look.step >= line or look.now > cut or look.now > cfg.max_sim_s)
        stats.lookaheads += 1
        stats.sim_s_lookahead += look.now - t0
        if look.step >= line:
            return look.now
        stats.pruned += 1
        return math.inf

    while any(not _over(m.sim) for m in members):
        line = min(cfg.steps, max(m.sim.step for m in members) + 1)
        kids: list[tuple[float, int, _Member | None, list[int], _Member]] = []
        seen: set[tuple[int, ...]] = set()
        order = 0

        def cut() -> float:
            finite = sorted(s for s, *_ in kids if s < math.inf)
            return finite[beam - 1] if len(finite) >= beam else math.inf

        for m in members:
            if _over(m.sim):
                kids.append((m.sim.now if m.sim.done else math.inf, order, None, m.plan, m))
                order += 1
                continue
            # The member's own plan first: its score stands when the finish line has not moved.
            if m.line == line:
                stats.reused += 1
                own = m.score
            else:
                own = score(m.sim, m.plan, line, math.inf)
            kids.append((own, order, m, m.plan, m))
            order += 1
            # The plan, its last entry repeated (it holds), to segment k + 1 at least.
            full = m.plan + [m.plan[-1]] * max(0, k + 2 - len(m.plan))
            cands = _candidates(full[k], n, sweep)
            stats.candidates.append(len(cands))
            seen.add(_norm(m.plan))
            for target in cands[1:]:
                # Schedules another member's expansion already scored (same state at the
                # boundary, so the same score) are not scored again.
                best_plan, best_score = None, math.inf
                for plan in (full[:k] + [target], full[:k] + [target] + full[k + 1:]):
                    if _norm(plan) in seen:
                        continue
                    seen.add(_norm(plan))
                    s = score(m.sim, plan, line, min(cut(), best_score))
                    if best_plan is None or s < best_score:
                        best_plan, best_score = plan, s
                if best_plan is not None:
                    kids.append((best_score, order, m, best_plan, m))
                    order += 1
        kids.sort(key=lambda x: (x[0], x[1]))
        chosen, taken = [], set()
        for x in kids:
            if x[0] < math.inf and _norm(x[3]) not in taken and len(chosen) < beam:
                chosen.append(x)
                taken.add(_norm(x[3]))
        chosen = chosen or kids[:1]
        # The last child of a parent takes its simulation; the others fork it.
        last_use = {id(x[4]): i for i, x in enumerate(chosen)}
        new: list[_Member] = []
        for i, (s, o, parent, plan, src) in enumerate(chosen):
            if parent is None:
                new.append(src)
                continue
            sim = src.sim if last_use[id(src)] == i else fork(src.sim)
            sim.policy.schedule = list(plan)
            t0 = sim.now
            _until(sim, (k + 1) * grid_s)
            stats.sim_s_advance += sim.now - t0
            new.append(_Member(sim, list(plan), s, line, o))
        members = new
        stats.members.append(len(members))
        k += 1
        stats.segments += 1
        if progress is not None:
            best = min(m.score for m in members)
            progress(stats.segments, max(est_total, stats.segments), {
                "t": round(k * grid_s), "best_finish_s": None if best == math.inf else round(best, 1),
                "lookaheads": stats.lookaheads, "sim_s": round(stats.sim_s_lookahead + stats.sim_s_advance),
            })

    finished = sorted(members, key=lambda m: (m.sim.now if m.sim.done else math.inf, m.order))
    found = finished[0]
    found_plan = found.plan
    # Measure the searched schedule as the summary does: a full run of its own.
    from ..summary import build_result

    check = Simulator(cfg, SchedulePolicy(list(found_plan), grid_s, switch_mode)).run()
    r_found = check.summary["rollout_time_s"]
    fork_result = build_result(found.sim).summary["rollout_time_s"]
    use_found = r_found is not None and (r_star is None or r_found < r_star)
    schedule = list(found_plan) if use_found else [p_star]
    best_r = r_found if use_found else r_star
    # The seeds: each policy's run again, request for request (ties go to the schedule).
    seed_report: dict[str, dict] = {}
    chosen_seed = None
    for name, (n_prefill, requests) in (seeds or {}).items():
        run = Simulator(cfg, RecordedPolicy(n_prefill, list(requests), name=name)).run().summary
        r = run["rollout_time_s"]
        seed_report[name] = {"rollout_s": r, "start_prefill": n_prefill, "requests": len(requests),
                             "switches": run["switches"]}
        if r is not None and (best_r is None or r < best_r):
            best_r, chosen_seed = r, name
    cand_mean = sum(stats.candidates) / len(stats.candidates) if stats.candidates else 0.0
    report = {
        "grid_s": grid_s,
        "beam_width": beam,
        "neighbours": NEIGHBOURS,
        "candidates_per_segment": {"max": max(stats.candidates, default=0), "mean": round(cand_mean, 2)},
        "continuations_per_candidate": 2,
        "search_start_s": round(k0 * grid_s, 3),
        "segments": stats.segments,
        "lookaheads": stats.lookaheads,
        "lookaheads_cut": stats.pruned,
        "scores_reused": stats.reused,
        "forks": stats.forks,
        "sim_s_explored": round(stats.sim_s_lookahead + stats.sim_s_advance, 1),
        "sim_s_lookahead": round(stats.sim_s_lookahead, 1),
        "static_sweep": tried,
        "static_sweep_s": round(wall_sweep, 2),
        "best_static": best_spec,
        "best_static_rollout_s": r_star,
        "searched_rollout_s": r_found,
        "search_matches_replay": fork_result == r_found,
        "seeds": seed_report,
        "chosen": f"seed:{chosen_seed}" if chosen_seed else "searched" if use_found else "static",
        "schedule": None if chosen_seed else changes(schedule, grid_s),
        "space_log10": round(stats.segments * math.log10(n - 1), 2) if n > 2 else 0.0,
        "explored_schedules": stats.lookaheads + stats.reused,
        "wall_s": None,
    }
    report["wall_s"] = round(time.perf_counter() - wall0, 2)
    return schedule, report, chosen_seed


# --- the policy ------------------------------------------------------------------------------


@dataclass
class BoundPolicy:
    """``prepare(cfg, static_sweep)`` searches (the runner calls it before the run, with its
    static sweep); the run then replays the chosen schedule as a normal simulation (events
    and all)."""

    grid_s: float = GRID_S
    beam: int = BEAM
    switch_mode: str | None = None
    name: str = "bound"
    wants_future: bool = False
    chooses_start: bool = True
    """The schedule fixes the start split: a comparison's common start does not apply."""
    schedule: list[int] | None = None
    search_report: dict | None = None

    def prepare(self, cfg, static_sweep: StaticSweep, progress: Callable[[int, int, dict], None] | None = None,
                seeds: Seeds | None = None) -> None:
        """Search the schedule; ``static_sweep(cfg)`` runs the static sweep it starts from;
        ``seeds`` are other policies' runs to count among the candidates."""
        self.schedule, self.search_report, seed = search(cfg, static_sweep, self.grid_s, self.beam, self.switch_mode,
                                                         progress, seeds)
        if seed is not None:
            n_prefill, requests = (seeds or {})[seed]
            self._replay = RecordedPolicy(n_prefill, list(requests), name=self.name)
        else:
            self._replay = SchedulePolicy(self.schedule, self.grid_s, self.switch_mode, name=self.name)

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        if self.schedule is None:
            raise ValueError("bound: the schedule is searched by prepare(cfg) before the run "
                             "(prorsa_sim.runner.simulate does it)")
        return self._replay.initial_roles(profile, n_engines)

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        return self._replay.on_window(obs)

    def on_update(self, obs: Observation) -> list[SwitchRequest]:
        # A recorded run's requests made at a weight update come back there.
        hook = getattr(self._replay, "on_update", None)
        return hook(obs) if hook is not None else []


def parse_bound(spec: str) -> BoundPolicy:
    """``bound[:<grid_s>][:beam=<B>][:in_place|:restart]``."""
    name, *parts = spec.split(":")
    pol = BoundPolicy()
    for part in parts:
        if part in ("in_place", "restart"):
            pol.switch_mode = part
        elif part.startswith("beam="):
            try:
                pol.beam = int(part[len("beam="):])
            except ValueError:
                raise ValueError(f"bad policy {spec!r}: beam needs an integer") from None
            if pol.beam < 1:
                raise ValueError(f"bad policy {spec!r}: beam must be >= 1")
        else:
            try:
                pol.grid_s = float(part)
            except ValueError:
                raise ValueError(f"bad policy {spec!r}: expected bound[:<grid_s>][:beam=<B>][:in_place|:restart]") from None
            if not pol.grid_s > 0 or pol.grid_s == float("inf"):
                raise ValueError(f"bad policy {spec!r}: the grid must be a positive number of seconds")
    if parts:
        pol.name = spec
    return pol
