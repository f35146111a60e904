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


def build_result(sim) -> Result:
    """Summarise ``sim`` (a finished :class:`~prorsa_sim.simulator.Simulator`)."""
    cfg = sim.cfg
    prof = sim.profile
    busy = sum(e.busy_s for e in sim.engines)
    wait = sum(e.wait_s for e in sim.engines)
    empty_rank = sum(e.empty_rank_s for e in sim.engines)
    total = cfg.total_gpus * max(sim.now, 1e-9)
    stepping = busy + wait + empty_rank
    steps = sim.step_times
    trajs = sim.traj_times
    summary = {
        "workload": cfg.workload,
        "model": cfg.model,
        "policy": sim.policy.name,
        "mode": cfg.mode,
        "staleness": cfg.staleness,
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "engines": len(sim.engines),
        "gpus_per_engine": prof.gpus_per_engine,
        "steps_done": len(steps),
        "rollout_time_s": _r(sum(steps) / len(steps), 3) if steps else None,
        "step_times_s": [_r(x, 3) for x in steps],
        "mean_trajectory_s": _r(sum(trajs) / len(trajs), 3) if trajs else None,
        "trajectories_done": len(trajs),
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
        # Per switch: drain_s (request to empty), switch_s (empty to back in service).
        "switch_log": list(sim.switch_log),
    }
    timeline = [
        {
            "t": w.t, "prefill_demand": w.prefill_demand, "decode_admit": w.decode_admit,
            "decode_tokens": w.decode_tokens, "n_prefill": w.n_prefill, "n_decode": w.n_decode,
            "n_mixed": w.n_mixed, "n_switching": w.n_switching, "busy_gpu_s": w.busy_gpu_s,
            "wait_gpu_s": w.wait_gpu_s,
        }
        for w in sim.windows
    ]
    return Result(summary, timeline)
