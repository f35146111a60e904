"""Online estimates the optimisation needs: θᴾ, C_KVᴰ, mᴾ/mᴰ and switch costs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from prorsa_schemas import EngineStats

from .config import AllocatorConfig
from .engines import EngineView


@dataclass
class PrefillThroughput:
    """θᴾ: full-prompt tokens per second that one prefill instance serves.

    Only a backlogged engine's rate measures its capacity (an idle engine's rate measures
    its demand), so only samples with queued requests count. The engine reports computed
    tokens per second; cached prefix tokens cost (almost) nothing, so in the full-prompt
    convention of Ŵᴾ one instance serves ``rate / (1 - cache_hit_rate)`` tokens per second
    (paper §4.2 and Appendix B.1: θᴾ "already incorporates the average prefix-cache hit ratio").
    """

    value: float
    alpha: float = 0.2
    max_hit: float = 0.95
    samples: int = 0

    @classmethod
    def from_config(cls, config: AllocatorConfig) -> "PrefillThroughput":
        return cls(config.prefill_tokens_per_s, config.theta_alpha, config.max_cache_hit_rate)

    def observe(self, stats: EngineStats) -> bool:
        """Fold in one stats sample; returns whether it counted."""
        rate = stats.prefill_tokens_per_s
        if stats.role != "prefill" or rate is None or rate <= 0 or stats.queued_reqs <= 0:
            return False
        hit = min(stats.cache_hit_rate or 0.0, self.max_hit)
        sample = rate / (1.0 - hit)
        self.value = sample if self.samples == 0 else (1 - self.alpha) * self.value + self.alpha * sample
        self.samples += 1
        return True


@dataclass
class SwitchCost:
    """Seconds a switch takes after the drain, per mode, learned from engine.switched."""

    in_place_s: float
    restart_s: float
    alpha: float = 0.3

    @classmethod
    def from_config(cls, config: AllocatorConfig) -> "SwitchCost":
        return cls(config.in_place_switch_s, config.restart_switch_s, config.switch_cost_alpha)

    def observe(self, mode: str | None, seconds: float) -> None:
        # The reported time includes the drain; that is a (small) overestimate we accept
        # rather than guess how the agent split it.
        if mode == "restart":
            self.restart_s = (1 - self.alpha) * self.restart_s + self.alpha * seconds
        elif mode == "in_place":
            self.in_place_s = (1 - self.alpha) * self.in_place_s + self.alpha * seconds

    def for_engine(self, view: EngineView) -> float:
        """An engine that advertises in-place switching switches in place; any other restarts."""
        return self.in_place_s if "in_place" in view.switch_modes else self.restart_s


def decode_kv_capacity(engines: list[EngineView]) -> float:
    """C_KVᴰ: the mean KV capacity of the decode engines (of all PD engines if none is decode)."""
    decode = [v.kv_capacity_tokens for v in engines if v.committed_role == "decode" and v.kv_capacity_tokens > 0]
    pool = decode or [v.kv_capacity_tokens for v in engines if v.kv_capacity_tokens > 0]
    return float(statistics.fmean(pool)) if pool else 0.0


def gpus_per_instance(engines: list[EngineView], role: str, override: int | None) -> int:
    """mᴾ or mᴰ: the override, else the median GPUs of that role's engines (of all if none)."""
    if override is not None:
        return override
    pool = [v.gpus for v in engines if v.committed_role == role] or [v.gpus for v in engines]
    return max(1, int(round(statistics.median(pool)))) if pool else 1
