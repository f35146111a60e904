"""Prefill completion times by per-instance queue simulation (Appendix B.7).

    b_j = max(u_j, v_m(j)) + g(x_j),   v_m(j) <- b_j

``u_j`` is when request ``j`` can start (its arrival), ``v_m`` when instance ``m`` is next
free and ``g(x)`` the profiled prefill time of ``x`` prompt tokens. The recursion is a
max-plus scan, so it vectorises: with ``C_j`` the running sum of ``g`` within an
instance's queue, ``b_j = C_j + max(v0_m - C_0, max_{k<=j} (u_k - C_{k-1}))``.

:class:`PrefillTimeModel` learns ``g(x) = a + b x`` online from observed service times
(see :meth:`~prorsa_forecaster.state.LiveState` for how they are measured), starting from
a prior (Dynamo's mocker profile) so that it answers before any history.
"""

from __future__ import annotations

import math

import numpy as np

# Dynamo mocker prefill profile: ms = 4.209989e-7 T^2 + 0.01518344 T + 16.50142, read as
# g = a + b n + d n ctx with n new tokens and ctx = cached + n/2 their mean attention
# context (for an uncached prompt n ctx = T^2 / 2): a = 16.5 ms, b = 15.2 us/token,
# d = 0.84 ns per (new token, context token) pair.
PRIOR_OVERHEAD_S = 0.0165
PRIOR_SECONDS_PER_TOKEN = 1.518344e-5
PRIOR_SECONDS_PER_PAIR = 8.419978e-10
# Feature scales: keep the normal equations well conditioned (tokens ~1e4, pairs ~1e9).
_SCALE = np.array([1.0, 1e-4, 1e-9])


def cost_features(tokens, cached=0.0) -> np.ndarray:
    """``(n, 3)`` features ``[1, new, new * mean context]`` of prompts of ``tokens`` tokens
    of which ``cached`` are a cached prefix (new = tokens - cached)."""
    x = np.clip(np.nan_to_num(np.asarray(tokens, dtype=float), nan=0.0), 0.0, 1e9)
    c = np.clip(np.nan_to_num(np.broadcast_to(np.asarray(cached, dtype=float), x.shape), nan=0.0), 0.0, x)
    new = x - c
    return np.stack(np.broadcast_arrays(np.ones_like(x), new, new * (c + 0.5 * new)), axis=-1)


class PrefillTimeModel:
    """Online least squares of prefill time on ``[1, new tokens, new x context]``.

    ``g(x, cached) = a + b (x - cached) + d (x - cached)(cached + (x - cached)/2)``: a fixed
    cost per request, a linear (GEMM) cost per computed token and an attention cost per
    (new token, context token) pair, which is what makes a long warm-cache turn cost far
    more than its few new tokens suggest. Coefficients stay >= 0 (active-set refit). It
    starts from a prior (Dynamo's mocker profile) worth ``prior_weight`` observations and
    forgets old observations with the given half-life.
    """

    __slots__ = ("_xtx", "_xty", "_decay", "n", "_coef")

    def __init__(
        self,
        overhead_s: float = PRIOR_OVERHEAD_S,
        seconds_per_token: float = PRIOR_SECONDS_PER_TOKEN,
        prior_weight: float = 4.0,
        half_life: float = 2000.0,
        seconds_per_pair: float = PRIOR_SECONDS_PER_PAIR,
    ) -> None:
        self._decay = 0.5 ** (1.0 / half_life)
        self.n = 0
        self._xtx = np.zeros((3, 3))
        self._xty = np.zeros(3)
        self._coef: np.ndarray | None = None
        prior = np.array([overhead_s, seconds_per_token, seconds_per_pair])
        # Prior pseudo observations: uncached prompts of 1k and 16k tokens, and warm turns
        # (2k new tokens after a 30k prefix) so that every coefficient is pinned.
        for x, c in ((1000.0, 0.0), (16000.0, 0.0), (32000.0, 30000.0)):
            f = cost_features(x, c) * _SCALE
            self._add(f, float(f @ (prior / _SCALE)), prior_weight / 3)

    def _add(self, f: np.ndarray, y: float, w: float) -> None:
        self._xtx += w * np.outer(f, f)
        self._xty += w * f * y
        self._coef = None

    def observe(self, tokens: float, seconds: float, cached: float = 0.0) -> None:
        """One observed prefill time (ignored when not finite or negative)."""
        vals = (tokens, seconds, cached)
        if not all(math.isfinite(v) and v >= 0 for v in vals):
            return
        self._xtx *= self._decay
        self._xty *= self._decay
        self._add(cost_features(float(tokens), min(float(cached), float(tokens))) * _SCALE, float(seconds), 1.0)
        self.n += 1

    def coefficients3(self) -> tuple[float, float, float]:
        """``(a, b, d)``, each >= 0."""
        if self._coef is None:
            active = [0, 1, 2]
            coef = np.zeros(3)
            ridge = 1e-9 * (np.trace(self._xtx) + 1.0)
            while active:
                sub = np.ix_(active, active)
                try:
                    sol = np.linalg.solve(self._xtx[sub] + ridge * np.eye(len(active)), self._xty[active])
                except np.linalg.LinAlgError:
                    sol = np.zeros(len(active))
                if np.all(sol >= 0) and np.all(np.isfinite(sol)):
                    coef[:] = 0.0
                    coef[active] = sol
                    break
                del active[int(np.argmin(np.nan_to_num(sol, nan=-np.inf)))]
            self._coef = coef * _SCALE
        a, b, d = (float(v) for v in self._coef)
        return a, b, d

    def coefficients(self) -> tuple[float, float]:
        """``(a, b)``: the fixed and per-token terms (see :meth:`coefficients3`)."""
        a, b, _ = self.coefficients3()
        return a, b

    def g(self, tokens: np.ndarray, cached: np.ndarray | float = 0.0) -> np.ndarray:
        """Predicted prefill seconds for each prompt length (and cached prefix)."""
        return cost_features(tokens, cached) @ np.array(self.coefficients3())


def stable_by(keys: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``order`` re-sorted by ``keys[order]``, small non-negative ints (an instance or a
    server), keeping its order within a key. Keys below 2^15 are sorted as int16, which
    numpy sorts by radix, about nine times faster than int64 at 30k keys."""
    k = np.asarray(keys)[order]
    if k.size and k.min() >= 0 and k.max() < 2**15:
        k = k.astype(np.int16)
    return order[np.argsort(k, kind="stable")]


def fifo_order(instance: np.ndarray, arrival: np.ndarray, by_arrival: np.ndarray | None = None) -> np.ndarray:
    """The positions sorted by instance, then arrival, then position: each queue's FIFO
    order (``np.lexsort((positions, arrival, instance))``). ``by_arrival``: the positions
    already sorted stably by arrival, where the caller has them."""
    o = np.argsort(arrival, kind="stable") if by_arrival is None else by_arrival
    return stable_by(instance, o)


def simulate_queues(
    instance: np.ndarray,
    arrival: np.ndarray,
    service: np.ndarray,
    free_at: np.ndarray,
    order: np.ndarray | None = None,
) -> np.ndarray:
    """Completion time of every request under FIFO per-instance queues.

    Args:
        instance: int index of each request's instance, 0..M-1.
        arrival: ``u_j``, when each request can start (its queue order is by arrival,
            ties in input order).
        service: ``g(x_j)``, seconds of prefill for each request.
        free_at: ``v_m`` for each of the M instances: when it is next free.
        order: :func:`fifo_order` of ``instance`` and ``arrival``, where the caller has it.

    Returns:
        ``b_j`` for each request, in input order.
    """
    n = len(arrival)
    if n == 0:
        return np.zeros(0)
    if order is None:
        order = fifo_order(instance, arrival)
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
