"""Turn a finished simulation into its summary (``summary.json``) and timeline."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    """What one run produced: the summary dict (JSON-ready, deterministic) and the
    per-window timeline for plots."""

    summary: dict
    timeline: list = field(default_factory=list)


def _r(x: float, nd: int = 4) -> float:
    return float(round(x, nd))


def _mean(xs) -> float | None:
    return _r(sum(xs) / len(xs), 3) if xs else None


def switch_stats(switch_log: list[dict], since_t: float | None, measured_steps: int) -> dict:
    """Switch counts and flip-backs from a run's ``switch_log`` (one record per completed
    switch: ``requested_t``, ``t`` back in service, ``engine``, ``from``, ``to``,
    ``drain_s``, ``switch_s``).

    *Measured* switches are those requested at or after ``since_t`` (the warm-up step's end;
    None: the whole run); ``switches_per_step`` divides them by ``measured_steps`` (at least
    one: a single-step run is measured over that step).

    A *flip-back*: an engine switches back to the role it left (B.to == A.from, B.from ==
    A.to for its previous switch A) with B requested less than A's own switch time
    (A.drain_s + A.switch_s: request to back in service, drain included) after A ended. It
    then served its new role for less time than it spent getting there. ``flip_backs``
    counts those whose switch back was requested in the measured period,
    ``flip_backs_run`` the whole run; ``flip_back_log`` lists them all (engine, the roles,
    when A ended, when B was requested, the time served in between, A's switch time)."""
    log = sorted(switch_log, key=lambda r: (r["requested_t"], r["t"], r["engine"]))
    measured = [r for r in log if since_t is None or r["requested_t"] >= since_t]
    last: dict[str, dict] = {}
    flips: list[dict] = []
    for r in log:
        prev = last.get(r["engine"])
        if prev is not None and r["from"] == prev["to"] and r["to"] == prev["from"]:
            took = prev["drain_s"] + prev["switch_s"]
            served = r["requested_t"] - prev["t"]
            if served < took:
                flips.append({
                    "engine": r["engine"], "from": prev["from"], "to": prev["to"], "back_in_service_t": prev["t"],
                    "switch_back_requested_t": r["requested_t"], "served_s": _r(served, 3), "switch_time_s": _r(took, 3),
                    "measured": since_t is None or r["requested_t"] >= since_t,
                })
        last[r["engine"]] = r
    return {
        "switches_measured": len(measured),
        "switches_per_step": _r(len(measured) / max(measured_steps, 1), 3),
        "flip_backs": sum(f["measured"] for f in flips),
        "flip_backs_run": len(flips),
        "flip_back_log": flips,
    }


def phase_breakdown(traj_times: list[float], traj_phases: list[tuple], step_tails: list[tuple]) -> dict:
    """Where the trajectories' time goes (:data:`~prorsa_sim.trajectories.PHASES`): the
    mean seconds per phase over ``traj_phases``, the same over the slowest 1% (at least
    one), and in a sync run the step's own: the phases of the trajectory that ended each
    step (they add up to the step time) and ``floor_s``, the mean over the steps of the
    largest floor of its trajectories: the time one spent in the workload's phases
    (sandbox, tools, reward) plus its decode steps at the model's fastest step
    (``Trajectories._floor``). No P:D split makes a sync step shorter than its floor, so
    the rollout time over the floor bounds the speedup any split can give."""
    from .trajectories import PHASES

    def mean_of(rows) -> dict:
        rows = list(rows)
        if not rows:
            return {}
        out = {name: _r(sum(r[i] for r in rows) / len(rows), 2) for i, name in enumerate(PHASES)}
        out["model"] = _r(out["prefill"] + out["decode"], 2)
        return out

    out: dict = {"mean": mean_of(traj_phases)}
    if traj_phases:
        k = max(1, len(traj_phases) // 100)
        slowest = sorted(range(len(traj_phases)), key=lambda i: traj_times[i])[-k:]
        out["slowest_1pct"] = {"n": k, **mean_of(traj_phases[i] for i in slowest)}
    if step_tails:
        out["step_tail"] = mean_of(p for p, _ in step_tails)
        out["floor_s"] = _r(sum(f for _, f in step_tails) / len(step_tails), 2)
    return out


def build_result(sim) -> Result:
    """Summarise ``sim`` (a finished :class:`~prorsa_sim.simulator.Simulator`).

    The measurement rule: the first step is the warm-up (it starts from an empty cluster)
    and is reported apart as ``warmup_step_s``; ``rollout_time_s``, ``mean_trajectory_s``
    and the ``gpu_*_ratio`` s are measured over the steps after it (with a single step,
    over that step: ``measured_steps`` is then 0). Token and event counts cover the run.
    """
    from .idealsplit import ideal_windows, summarize

    cfg = sim.cfg
    prof = sim.profile
    now = sim.counters()
    steps = sim.step_times
    trajs = sim.traj_times
    mark = getattr(sim, "warmup_mark", None) if len(steps) >= 2 else None
    base = mark or {k: 0 for k in now}
    measured = steps[1:] if mark else steps
    busy = now["busy"] - base["busy"]
    wait = now["wait"] - base["wait"]
    empty_rank = now["empty_rank"] - base["empty_rank"]
    total = cfg.total_gpus * max(now["t"] - base["t"], 1e-9)
    stepping = busy + wait + empty_rank
    traj_measured = trajs[base["trajs"]:] or trajs
    phases_measured = sim.traj_phases[base["trajs"]:] or sim.traj_phases
    tails_measured = sim.step_tails[1:] if mark else sim.step_tails
    summary = {
        "workload": cfg.workload,
        **({"recorded_workload": sim.spec.recorded.describe()} if sim.spec.recorded is not None else {}),
        "model": cfg.model,
        "policy": sim.policy.name,
        "mode": cfg.mode,
        "staleness": cfg.staleness,
        "seed": cfg.seed,
        "dp_routing": cfg.dp_routing,
        "router_policy": cfg.router_policy,
        "batch_size": cfg.batch_size,
        "engines": len(sim.engines),
        "gpus_per_engine": prof.gpus_per_engine,
        "initial_roles": dict(getattr(sim, "initial_role_counts", {})),
        "steps_done": len(steps),
        "measured_steps": len(steps) - 1 if mark else 0,
        # The first step (from an empty cluster), reported apart.
        "warmup_step_s": _r(steps[0], 3) if steps else None,
        # Mean of the steps after the warm-up (sync: step start to the last reward; async:
        # policy update to policy update).
        "rollout_time_s": _mean(measured),
        "step_times_s": [_r(x, 3) for x in steps],
        # Dispatch to reward, trajectories finished after the warm-up step.
        "mean_trajectory_s": _mean(traj_measured),
        "trajectories_done": len(trajs),
        # Where their time goes, and in sync the floor no split goes below
        # (:func:`phase_breakdown`).
        "trajectory_phases_s": phase_breakdown(traj_measured, phases_measured, tails_measured),
        "trajectories_dropped": sim.dropped,
        # Share of the GPU time of stepping engines lost waiting at the MoE sync for a
        # slower attention DP rank (the paper's Fig. 6 idle ratio).
        "gpu_idle_ratio": _r(wait / stepping) if stepping else 0.0,
        # Ranks with no work at all inside a stepping engine (cross-DP imbalance; the
        # paper excludes it from its idle ratio).
        "gpu_imbalance_ratio": _r(empty_rank / stepping) if stepping else 0.0,
        # GPU time of engines that had no work at all (e.g. the sync long tail).
        "gpu_unused_ratio": _r(max(0.0, total - stepping) / total),
        "gpu_busy_ratio": _r(busy / total),
        "prefill_tokens": sim.prefill_tokens,
        "prefill_computed_tokens": sum(e.prefill_tokens_done for e in sim.engines),
        "cached_tokens": sim.cached_tokens,
        "decode_tokens": sim.decode_tokens,
        "step_pd_ratio": sim.step_pd_ratio,
        "switches": sim.switches,
        "switch_requests": sim.requests,
        "preemptions": sim.preemptions,
        "events": sim.n_events,
        "sim_time_s": _r(sim.now, 3),
        "final_roles": {r: sum(e.role == r for e in sim.engines) for r in ("prefill", "decode", "mixed")},
        # --- switch mechanics (docs/simulator.md, "Role switches"): what drains cost.
        # Requests a drain aborted and re-queued (decode side: pending and in-flight ones
        # at once; anything still running at the drain deadline), of which at the deadline.
        "drain_aborts": sim.drain_aborts,
        "drain_deadline_aborts": sim.drain_deadline_aborts,
        # Prompts not yet started, moved to another prefill engine (no re-prefill).
        "drain_rerouted_reqs": sim.drain_rerouted_reqs,
        # Full prompt tokens (context + partial output) the drain-aborted requests re-queue.
        "drain_requeued_tokens": sim.drain_requeued_tokens,
        # Output tokens of requests aborted at the drain deadline (kept as context).
        "drain_aborted_decode_tokens": sim.drain_aborted_decode_tokens,
        # Prefix-cache tokens flushed by role switches, and by weight updates.
        "cache_lost_tokens": sim.cache_lost_tokens,
        "cache_flushed_at_update_tokens": sim.cache_flushed_at_update_tokens,
        # Decoding requests a retract pause took the KV of (they re-prefill after it).
        "update_retractions": sim.update_retractions,
        # Per switch: drain_s (request to empty), switch_s (empty to back in service).
        "switch_log": list(sim.switch_log),
    }
    # No flapping: switches per measured step, and engines switched back within their own
    # switch time (:func:`switch_stats`).
    summary.update(switch_stats(sim.switch_log, base["t"] if mark else None, summary["measured_steps"]))
    timeline = [
        {
            "t": w.t, "step": w.step, "prefill_demand": w.prefill_demand, "decode_admit": w.decode_admit,
            "decode_tokens": w.decode_tokens, "n_prefill": w.n_prefill, "n_decode": w.n_decode,
            "n_mixed": w.n_mixed, "n_switching": w.n_switching, "busy_gpu_s": w.busy_gpu_s,
            "wait_gpu_s": w.wait_gpu_s, "prefills_done": w.prefills_done,
            "prefill_prompt_done": w.prefill_prompt_done, "prefill_cached_done": w.prefill_cached_done,
            "decode_kv_tokens": w.decode_kv_tokens, "decode_seqs": w.decode_seqs,
        }
        for w in sim.windows
    ]
    ideal = ideal_windows(timeline, prof, len(sim.engines), cfg.window_s)
    for row, split in zip(timeline, ideal):
        row.update({k: v for k, v in split.items() if k not in ("t", "step")})
    summary["ideal_split"] = summarize(ideal, len(sim.engines))
    return Result(summary, timeline)
