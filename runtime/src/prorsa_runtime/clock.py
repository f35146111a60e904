"""Events from the future: the check a live consumer makes before an event moves its time.

Every service keeps event time: the tracker's watermark is the largest ``ts`` it applied,
the forecaster closes every window an event's ``ts`` has passed, the allocator expires each
command whose deadline event time has passed, and an engine agent keeps the newest
``policy.updated``. Time only moves forward, so one event stamped far ahead of every
producer's clock (a wrong clock, a unit error: milliseconds for seconds, a forged message)
would move it past everything at once: a year ahead, the forecaster would close three
million windows and the allocator expire every command it sends from then on, until the
stream is cleaned.

A live consumer therefore compares each event's ``ts`` with its own host's clock and
dead-letters one more than ``max_clock_ahead_s`` ahead of it (kind ``future``; the tracker
keeps it whole in its ``anomalies`` table), so it never moves event time. Producers stamp
``ts`` from their wall clocks (``prorsa_sdk``; an emulated cluster run ``speed`` times
faster still stamps the wall clock), so on hosts whose clocks are kept in step (NTP: within
milliseconds) no real event comes near the bound. Logs replayed offline (``prorsa
forecast-eval``, the simulator, the tracker in ``clock="event"`` mode) are not checked:
their clock is not this host's.
"""

from __future__ import annotations

import math

DEFAULT_MAX_CLOCK_AHEAD_S = 300.0
"""CHOICE: five minutes. Far above the skew of clocks kept by NTP (milliseconds) or of a
host whose clock is set by hand and checked now and then (seconds), and at the default
S = 10 s at most 30 windows the forecaster would close early."""


def ahead_of_clock(ts: float, now: float, max_ahead_s: float | None) -> str | None:
    """Why an event stamped ``ts`` must not be applied at wall time ``now`` (None: it may).

    ``max_ahead_s`` None or 0 turns the check off.
    """
    if not max_ahead_s or not math.isfinite(ts):
        return None
    ahead = ts - now
    if ahead <= max_ahead_s:
        return None
    return (f"rejected: ts {ts:.3f} is {ahead:,.0f} s ahead of this host's clock ({now:.3f}), more than "
            f"max_clock_ahead_s = {max_ahead_s:g}; applied, it would move event time past every window and "
            f"deadline (a producer's clock or units are wrong)")


__all__ = ["DEFAULT_MAX_CLOCK_AHEAD_S", "ahead_of_clock"]
