"""One valid example of every contract event type, with every optional field set."""

from __future__ import annotations

ENV = {"v": 1, "ts": 12.5, "run": "run-1.a_b"}

FULL: dict[str, dict] = {
    "run.started": {"mode": "async", "batch_size": 64, "max_staleness": 2, "group_size": 8,
                    "injection": "group", "prompt_tokens_mean": 900},
    "trajectory.dispatched": {"traj": "t1", "prompt_tokens": 812, "group": "g1", "policy_version": 3},
    "sandbox.started": {"traj": "t1", "mode": "cold"},
    "sandbox.ready": {"traj": "t1"},
    "request.queued": {"traj": "t1", "req": "r1", "turn": 0, "prompt_tokens": 812, "engine": "p0", "dp_rank": 3},
    "prefill.started": {"traj": "t1", "req": "r1", "engine": "p0"},
    "prefill.finished": {"traj": "t1", "req": "r1", "engine": "p0", "cached_tokens": 12, "decode_engine": "d0"},
    "decode.finished": {"traj": "t1", "req": "r1", "output_tokens": 90, "finish": "tool"},
    "tool.started": {"traj": "t1", "tool": "bash", "calls": 2},
    "tool.finished": {"traj": "t1", "result_tokens": 300, "ok": True},
    "reward.started": {"traj": "t1"},
    "reward.finished": {"traj": "t1", "admitted": True, "reward": 0.5},
    "trajectory.dropped": {"traj": "t1", "reason": "stale"},
    "policy.updated": {"version": 4},
    "engine.registered": {"engine": "e0", "server": "s0", "role": "prefill", "gpus": 8,
                          "kv_capacity_tokens": 1_000_000, "url": "http://10.0.0.1:30000",
                          "parallel": {"tp": 8, "dp": 1, "ep": 8, "attn_dp": 8},
                          "switch_modes": ["in_place", "restart"]},
    "engine.stats": {"engine": "e0", "role": "decode", "running_reqs": 3, "queued_reqs": 1,
                     "kv_used_tokens": 100, "kv_capacity_tokens": 1000, "prefill_tokens_per_s": 0.0,
                     "decode_tokens_per_s": 1500.5, "cache_hit_rate": 0.25},
    "engine.switching": {"engine": "e0", "cmd": "c1", "from_role": "prefill", "to_role": "decode", "mode": "in_place"},
    "engine.switched": {"engine": "e0", "cmd": "c1", "from_role": "prefill", "to_role": "decode",
                        "seconds": 3.2, "mode": "restart"},
    "engine.switch_failed": {"engine": "e0", "cmd": "c1", "role": "prefill", "error": "not idle"},
    "engine.deregistered": {"engine": "e0", "reason": "shutdown"},
    "forecast.window": {"t": 10.0, "horizon": 10.0, "prefill_tokens": 1e6, "decode_admit_tokens": 5e5,
                        "decode_kv_tokens": 5e5, "decode_kv_now": 2e6,
                        "components": {"sampler": 1.0, "sandbox": 2.0, "ready": 3.0, "tool": 4.0,
                                       "inflight": 5.0, "bias": -0.5},
                        "blend": {"prefill": {"lifecycle": 0.9, "last_value": 0.1}, "decode": {"lifecycle": 1.0},
                                  "new": {"lifecycle": 0.5, "kalman": 0.5}}},
    "allocation.plan": {"t": 10.0, "n_prefill": 3, "n_decode": 5, "delta": 0.2, "feasible": True,
                        "switches": [{"engine": "e0", "to_role": "decode"}]},
    "engine.command": {"cmd": "c1", "engine": "e0", "action": "switch_role", "to_role": "decode", "deadline": 40.0},
}

OPTIONAL: dict[str, set[str]] = {
    "run.started": {"max_staleness", "group_size", "injection", "prompt_tokens_mean"},
    "trajectory.dispatched": {"group", "policy_version"},
    "request.queued": {"engine", "dp_rank"},
    "prefill.started": {"engine"},
    "prefill.finished": {"engine", "cached_tokens", "decode_engine"},
    "tool.started": {"tool", "calls"},
    "tool.finished": {"ok"},
    "reward.finished": {"reward"},
    "engine.registered": {"url", "parallel", "switch_modes"},
    "engine.stats": {"prefill_tokens_per_s", "decode_tokens_per_s", "cache_hit_rate"},
    "engine.switching": {"mode"},
    "engine.switched": {"mode"},
    "forecast.window": {"components", "blend"},
    "allocation.plan": {"switches"},
}


def event(kind: str, **override: object) -> dict:
    obj = {**ENV, "id": f"id-{kind}", "type": kind, **FULL[kind]}
    obj.update(override)
    return obj


def minimal(kind: str) -> dict:
    obj = event(kind)
    for name in OPTIONAL.get(kind, set()):
        obj.pop(name)
    return obj
