"""Prefill completion times by per-instance queue simulation (Appendix B.7).

    b_j = max(u_j, v_m(j)) + g(x_j),   v_m(j) <- b_j

``u_j`` is when request ``j`` can start (its arrival), ``v_m`` when instance ``m`` is next
free and ``g(x)`` the profiled prefill time of ``x`` prompt tokens. The recursion is a
max-plus scan, so it vectorises: with ``C_j`` the running sum of ``g`` within an
instance's queue, ``b_j = C_j + max(v0_m - C_0, max_{k<=j} (u_k - C_{k-1}))``.

:class:`PrefillTimeModel` learns ``g(x) = a + b x`` online from observed service times
(see :meth:`~prorsa_forecaster.state.LiveState` for how they are measured), starting from
a prior (Dynamo's mocker profile, linearised) so that it answers before any history.
"""

from __future__ import annotations

import math

import numpy as np

# Dynamo mocker prefill profile: ms = 4.209989e-7 T^2 + 0.01518344 T + 16.50142.
# Linearised around T = 8k tokens, in seconds: a = 16.5 ms, b ~ 18.6 us/token.
PRIOR_OVERHEAD_S = 0.0165
PRIOR_SECONDS_PER_TOKEN = 1.86e-5


class PrefillTimeModel:
    """Online least squares of service time on prompt tokens, with a prior."""

    __slots__ = ("_sw", "_sx", "_sy", "_sxx", "_sxy", "_decay", "n")

    def __init__(
        self,
        overhead_s: float = PRIOR_OVERHEAD_S,
        seconds_per_token: float = PRIOR_SECONDS_PER_TOKEN,
        prior_weight: float = 4.0,
        half_life: float = 2000.0,
    ) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self.n = 0
        # Prior pseudo observations at 1k and 16k tokens on the prior line.
        self._sw = self._sx = self._sy = self._sxx = self._sxy = 0.0
        for x in (1000.0, 16000.0):
            self._add(x, overhead_s + seconds_per_token * x, prior_weight / 2)

    def _add(self, x: float, y: float, w: float) -> None:
        self._sw += w
        self._sx += w * x
        self._sy += w * y
        self._sxx += w * x * x
        self._sxy += w * x * y

    def observe(self, tokens: float, seconds: float) -> None:
        """One observed prefill service time (ignored when not finite or negative)."""
        if not (math.isfinite(tokens) and math.isfinite(seconds) and tokens >= 0 and seconds >= 0):
            return
        d = self._decay
        self._sw *= d
        self._sx *= d
        self._sy *= d
        self._sxx *= d
        self._sxy *= d
        self._add(float(tokens), float(seconds), 1.0)
        self.n += 1

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)`` of ``g(x) = a + b x``, both kept >= 0 (a time never shrinks with x)."""
        var = self._sxx * self._sw - self._sx * self._sx
        if self._sw <= 0:
            return PRIOR_OVERHEAD_S, PRIOR_SECONDS_PER_TOKEN
        if var <= 1e-9 * max(1.0, self._sxx * self._sw):
            # All observations at one size: a pure rate through the origin.
            b = self._sxy / self._sxx if self._sxx > 0 else PRIOR_SECONDS_PER_TOKEN
            return 0.0, max(b, 0.0)
        b = (self._sxy * self._sw - self._sx * self._sy) / var
        a = (self._sy - b * self._sx) / self._sw
        if b < 0:
            b = 0.0
            a = self._sy / self._sw
        if a < 0:
            a = 0.0
            b = self._sxy / self._sxx if self._sxx > 0 else PRIOR_SECONDS_PER_TOKEN
        return float(a), float(b)

    def g(self, tokens: np.ndarray) -> np.ndarray:
        """Predicted prefill seconds for each prompt length."""
        a, b = self.coefficients()
        return a + b * np.clip(np.asarray(tokens, dtype=float), 0.0, None)


def simulate_queues(
    instance: np.ndarray,
    arrival: np.ndarray,
    service: np.ndarray,
    free_at: np.ndarray,
) -> np.ndarray:
    """Completion time of every request under FIFO per-instance queues.

    Args:
        instance: int index of each request's instance, 0..M-1.
        arrival: ``u_j``, when each request can start (its queue order is by arrival,
            ties in input order).
        service: ``g(x_j)``, seconds of prefill for each request.
        free_at: ``v_m`` for each of the M instances: when it is next free.

    Returns:
        ``b_j`` for each request, in input order.
    """
    n = len(arrival)
    if n == 0:
        return np.zeros(0)
    order = np.lexsort((np.arange(n), arrival, instance))
    inst = instance[order]
    u = arrival[order]
    w = service[order]
    cum = np.cumsum(w)
    # Start index of each instance's run in the sorted order.
    starts = np.flatnonzero(np.concatenate(([True], inst[1:] != inst[:-1])))
    run_id = np.cumsum(np.concatenate(([False], inst[1:] != inst[:-1]))) if n else np.zeros(0, int)
    base = np.concatenate(([0.0], cum))[starts][run_id]  # cum sum before the run starts
    c = cum - base  # C_j within the run
    c_prev = c - w  # C_{j-1}
    lead = u - c_prev
    # The instance's own availability enters as a term before the first request.
    v0 = free_at[inst[starts]]
    # Grouped running max: offset each run so earlier runs can never win.
    span = float(np.max(np.abs(lead)) + np.max(np.abs(v0)) + 1.0)
    offset = run_id * (4.0 * span)
    running = np.maximum.accumulate(lead + offset) - offset
    best = np.maximum(running, v0[run_id])
    b = c + best
    out = np.empty(n)
    out[order] = b
    return out
