"""Engine timing for clients of the emulated server (the rollout driver estimates when a
prefill finishes with it).

:func:`default_timing` answers from the same cost-model profile the emulated engines run
(``profiles.py``; default ``qwen3-8b``). :class:`Timing` keeps NVIDIA Dynamo's mocker
constants (shared/DESIGN.md) for comparison:

* prefill ms = 4.209989e-7 * T^2 + 0.01518344 * T + 16.50142   (T new tokens)
* decode step ms = -25.74 * u^2 + 54.01 * u + 5.74, floor 1 ms  (u = used KV / total KV)
"""

from __future__ import annotations

from dataclasses import dataclass

from .costmodel import ModelProfile
from .profiles import DEFAULT_MODEL, emulated_profile, prefill_seconds


@dataclass(frozen=True)
class Timing:
    """Dynamo mocker costs, in emulated seconds (divide by the speed factor for wall time)."""

    prefill_a: float = 4.209989e-7
    prefill_b: float = 0.01518344
    prefill_c: float = 16.50142
    decode_a: float = -25.74
    decode_b: float = 54.01
    decode_c: float = 5.74
    kv_transfer_gb_s: float = 64.0
    kv_bytes_per_token: int = 160 * 1024  # a mid-size dense model, bf16

    def prefill_seconds(self, new_tokens: int) -> float:
        """Time to prefill ``new_tokens`` uncached prompt tokens."""
        t = float(max(0, new_tokens))
        return (self.prefill_a * t * t + self.prefill_b * t + self.prefill_c) / 1000.0

    def decode_step_seconds(self, kv_utilisation: float) -> float:
        """Time of one decode step (one token per running request) at KV utilisation ``u``."""
        u = min(1.0, max(0.0, kv_utilisation))
        ms = self.decode_a * u * u + self.decode_b * u + self.decode_c
        return max(1.0, ms) / 1000.0

    def kv_transfer_seconds(self, tokens: int) -> float:
        """PD KV transfer time for ``tokens`` of prompt."""
        return tokens * self.kv_bytes_per_token / (self.kv_transfer_gb_s * 1e9)


@dataclass(frozen=True)
class ProfileTiming:
    """The same three questions answered by a cost-model profile, for one request alone on
    an idle rank (the emulated engine adds batching, queueing and chunk sharing)."""

    profile: ModelProfile

    def prefill_seconds(self, new_tokens: int) -> float:
        return prefill_seconds(self.profile, new_tokens)

    def decode_step_seconds(self, kv_utilisation: float) -> float:
        u = min(1.0, max(0.0, kv_utilisation))
        return self.profile.decode_step_time(1, int(u * self.profile.kv_capacity_per_rank))

    def kv_transfer_seconds(self, tokens: int) -> float:
        return self.profile.kv_transfer_time(tokens)


def default_timing(model: str = DEFAULT_MODEL) -> ProfileTiming:
    """Timing of the emulated engines' profile ``model``."""
    return ProfileTiming(emulated_profile(model))
