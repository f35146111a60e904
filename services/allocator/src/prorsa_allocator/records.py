"""What the allocator keeps for logs, metrics, the simulator and tests: each forecast's
:class:`Decision`, the event counters and the completed switches' durations."""

from __future__ import annotations

from dataclasses import dataclass, field

from prorsa_schemas import Event

from .optimize import Allocation
from .switching import Selection


@dataclass
class Decision:
    """What one forecast led to (kept for logs, metrics, the simulator and tests)."""

    t: float
    allocation: Allocation | None = None
    selection: Selection | None = None
    skipped: str = ""
    events: list[Event] = field(default_factory=list)
    at_update: bool = False
    """The weight-update pause's own decision (``Allocator.on_pause``), planned from the
    last window at the update rather than at a window's start."""
    spread_binds: bool = False
    """Whether ``decode_spread_cap`` could change this decision: the decode demand beyond KV
    (uncapped) exceeds the KV share, and the spread is below that demand or the PD engines'
    count. A run in which no decision has it set decides as with the cap off."""


@dataclass
class Counters:
    forecasts: int = 0
    stale: int = 0
    plans: int = 0
    commands: int = 0
    advised: int = 0
    """Switches planned and not commanded (advisory mode: ``AllocatorConfig.actuate`` False)."""
    retries: int = 0
    abandoned: int = 0
    failed: int = 0
    switched: int = 0
    notes: int = 0


SWITCH_BUCKETS_S = (5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0)
"""Histogram bounds of completed switch durations: in place (seconds) to restarts (minutes)."""


@dataclass
class SwitchDurations:
    """Completed switches' ``engine.switched.seconds`` per mode, as a cumulative histogram."""

    buckets: dict[str, list[int]] = field(default_factory=dict)
    count: dict[str, int] = field(default_factory=dict)
    total_s: dict[str, float] = field(default_factory=dict)

    def observe(self, mode: str | None, seconds: float) -> None:
        m = mode or "unknown"
        counts = self.buckets.setdefault(m, [0] * len(SWITCH_BUCKETS_S))
        for i, bound in enumerate(SWITCH_BUCKETS_S):
            if seconds <= bound:
                counts[i] += 1
        self.count[m] = self.count.get(m, 0) + 1
        self.total_s[m] = self.total_s.get(m, 0.0) + seconds
