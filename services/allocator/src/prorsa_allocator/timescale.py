"""The allocator's settings for a cluster whose time runs ``speed`` times faster than the
wall clock (the emulated cluster of ``prorsa up --emulated-cluster``, whose engines and
rollout driver run ``speed`` simulated seconds per wall second while every service reads
the wall clock).

Every duration in :class:`~prorsa_allocator.config.AllocatorConfig` (a field named
``*_s``) stands for a span of the cluster's time: a drain deadline, a switch, the weight
sync, a dwell, a planning horizon, the time a served rate takes to settle. In wall
seconds such a span is ``speed`` times shorter; a rate (``RATES``, per second) is
``speed`` times higher. Scaling them all keeps the allocator's decisions what they would
be on a real cluster of the same shape: a 30 s dwell stays a 30 s dwell of the cluster's
time, where unscaled it would span ten times as much of the run.
"""

from __future__ import annotations

from .config import AllocatorConfig
from .settings import ENV_PREFIX

RATES = ("prefill_tokens_per_s",)
"""Fields that are rates per second (multiplied by ``speed``); every other ``*_s`` field
is a duration (divided by ``speed``)."""


def time_scaled(speed: float, config: AllocatorConfig | None = None) -> dict[str, float]:
    """``config``'s (default: the defaults') durations divided by ``speed`` and rates
    multiplied by it, as ``{field: value}``; fields left unset (None) are not in it."""
    if not speed > 0:
        raise ValueError(f"speed must be > 0, got {speed!r}")
    cfg = config or AllocatorConfig()
    out: dict[str, float] = {}
    for name in AllocatorConfig.model_fields:
        value = getattr(cfg, name)
        if not name.endswith("_s") or value is None:
            continue
        out[name] = float(value) * speed if name in RATES else float(value) / speed
    return out


def time_scaled_env(speed: float, config: AllocatorConfig | None = None) -> dict[str, str]:
    """:func:`time_scaled` as ``PRORSA_ALLOCATOR_*`` environment variables."""
    return {ENV_PREFIX + name.upper(): f"{value:.6g}" for name, value in time_scaled(speed, config).items()}


__all__ = ["RATES", "time_scaled", "time_scaled_env"]
