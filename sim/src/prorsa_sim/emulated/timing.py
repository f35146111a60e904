"""Engine timing behind the emulated SGLang server.

The emulated server needs two numbers: how long a prefill of ``T`` new tokens takes, and
how long one decode step takes at KV utilisation ``u``. When the simulator's cost model
(``prorsa_sim.costmodel``) provides a ``ModelProfile`` with ``prefill_seconds`` /
``decode_step_seconds``, it is used; otherwise the constants of NVIDIA Dynamo's mocker
(documented in shared/DESIGN.md) are:

* prefill ms = 4.209989e-7 * T^2 + 0.01518344 * T + 16.50142   (T new tokens)
* decode step ms = -25.74 * u^2 + 54.01 * u + 5.74, floor 1 ms  (u = used KV / total KV)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Emulated engine costs, in emulated seconds (divide by the speed factor for wall time)."""

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


def default_timing() -> Timing:
    """The simulator's cost model when it is available, else Dynamo's mocker constants."""
    try:  # the cost model is owned by the simulator; adapt to it when it is there
        from prorsa_sim import costmodel  # type: ignore[attr-defined]
    except ImportError:
        return Timing()
    profile_cls = getattr(costmodel, "ModelProfile", None)
    if profile_cls is None:
        return Timing()
    try:
        profile = profile_cls()
    except TypeError:
        return Timing()
    if hasattr(profile, "prefill_seconds") and hasattr(profile, "decode_step_seconds"):
        return _ProfileTiming(profile)  # type: ignore[return-value]
    return Timing()


class _ProfileTiming(Timing):
    """A :class:`Timing` that delegates to a cost-model profile."""

    def __init__(self, profile: object):
        object.__setattr__(self, "_profile", profile)

    def prefill_seconds(self, new_tokens: int) -> float:
        return float(self._profile.prefill_seconds(new_tokens))  # type: ignore[attr-defined]

    def decode_step_seconds(self, kv_utilisation: float) -> float:
        return float(self._profile.decode_step_seconds(kv_utilisation))  # type: ignore[attr-defined]
