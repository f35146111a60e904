"""The ``reactive`` policy: a load-based autoscaler, as Dynamo's planner and llm-d's
autoscaler do -- no forecast, thresholds on what the engines report now, +-1 engine a step.

Thresholds (CHOICES, documented in docs/allocator.md):
* prefill pressure: mean queued requests per prefill engine > ``queue_high`` (4: more than
  a few chunks of backlog means TTFT grows by whole prefill passes);
* decode pressure: mean KV utilisation of decode engines > ``kv_high`` (0.85: SGLang starts
  retracting requests near a full KV pool) or decode queue > ``queue_high``;
* relief: a role is "idle enough" to give an engine below ``queue_low`` (0.5) /
  ``kv_low`` (0.5).
Moves one engine toward the pressured role when the other role is relieved, at most one
move per ``cooldown_s`` (30 s, the same minimum dwell the allocator uses), least loaded first.
"""

from __future__ import annotations

from dataclasses import dataclass

from prorsa_emulated.costmodel import ModelProfile

from ..policy import Observation, SwitchRequest


@dataclass
class ReactivePolicy:
    name: str = "reactive"
    wants_future: bool = False
    queue_high: float = 4.0
    queue_low: float = 0.5
    kv_high: float = 0.85
    kv_low: float = 0.5
    cooldown_s: float = 30.0
    switch_mode: str | None = None
    """``in_place`` / ``restart``; None: in place when the profile allows it."""
    _last: float = -1e18

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        n_p = max(1, n_engines // 2)
        return ["prefill"] * n_p + ["decode"] * (n_engines - n_p)

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        if any(v.switching for v in obs.engines) or obs.t - self._last < self.cooldown_s:
            return []
        pre = [v for v in obs.engines if v.role == "prefill"]
        dec = [v for v in obs.engines if v.role == "decode"]
        if not pre or not dec:
            return []
        p_queue = sum(v.queued_reqs for v in pre) / len(pre)
        d_queue = sum(v.queued_reqs for v in dec) / len(dec)
        d_kv = sum(v.kv_used_tokens for v in dec) / max(1, sum(v.kv_capacity_tokens for v in dec))
        prefill_hot = p_queue > self.queue_high
        decode_hot = d_kv > self.kv_high or d_queue > self.queue_high
        prefill_cool = p_queue < self.queue_low
        decode_cool = d_kv < self.kv_low and d_queue < self.queue_low
        mode = self.switch_mode or ("in_place" if "in_place" in obs.profile.switch_modes else "restart")
        if prefill_hot and decode_cool and len(dec) > 1:
            donor, to_role = dec, "prefill"
        elif decode_hot and prefill_cool and len(pre) > 1:
            donor, to_role = pre, "decode"
        else:
            return []
        v = min(donor, key=lambda e: (e.running_reqs + e.queued_reqs, e.kv_used_tokens, e.engine))
        self._last = obs.t
        return [SwitchRequest(v.engine, to_role, mode)]
