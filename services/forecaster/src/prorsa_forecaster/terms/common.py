"""What the terms share: request loads per service class, and delay kernels over the
window's sub-steps.

A predicted request is a load row ``[count, prompt tokens, computed tokens, attention
pairs]`` for each outcome of its prefix-cache lookup (a hit computes only the new tokens,
a miss all of them): the decode-admission queue model needs its prefill time, not only
its prompt. Rows are summed per service-time class (``CLASS_EDGES``) and per sub-step,
``(4, N_CLASSES, steps)``, which is what every arrival term returns.
"""

from __future__ import annotations

import numpy as np

from ..config import ForecastConfig
from ..guards import clean
from ..snapshot import Snapshot

MAX_SERVERS = 4096  # per instance; far beyond any data-parallel size
# Service-time classes of predicted requests (upper edges, seconds; the last is open).


CLASS_EDGES = np.geomspace(0.02, 60.0, 15)


N_CLASSES = len(CLASS_EDGES) + 1


def pooled_cost(snap: Snapshot) -> np.ndarray:
    """``(a, b, d)`` of g averaged over the instances, weighted by their servers."""
    a = np.clip(clean(snap.instance_overhead), 0.0, 1e4)
    b = np.clip(clean(snap.instance_per_token), 0.0, 1.0)
    d = np.clip(clean(snap.column("instance_per_pair", "instance_overhead")), 0.0, 1e-3)
    w = np.clip(clean(snap.column("instance_servers", "instance_overhead", 1.0)), 1.0, MAX_SERVERS)
    return np.array([np.average(a, weights=w), np.average(b, weights=w), np.average(d, weights=w)])


def service_class(load: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """The service-time class of each request row (:func:`request_rows`; a row may be
    weighted by its probability: its count column, so the time is per request)."""
    g = cost[0] * load[:, 0] + cost[1] * load[:, 2] + cost[2] * load[:, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(load[:, 0] > 0, g / load[:, 0], 0.0)
    return np.searchsorted(CLASS_EDGES, np.nan_to_num(per, nan=0.0, posinf=0.0))


def class_sums(load: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """``(4, N_CLASSES)`` loads summed per class."""
    return np.stack([np.bincount(cls, weights=load[:, j], minlength=N_CLASSES)[:N_CLASSES] for j in range(4)])


def definite(x: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """Load rows of requests with a known cached prefix (inputs already cleaned)."""
    c = np.minimum(cached, x)
    new = x - c
    out = np.empty((len(x), 4))
    out[:, 0] = 1.0
    out[:, 1] = x
    out[:, 2] = new
    out[:, 3] = new * (c + 0.5 * new)
    return out


def request_rows(x, prefix=0.0, hit=1.0, cold: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The two outcomes of each request's prefix-cache lookup, as load rows.

    A request whose trajectory's previous prompt (``prefix`` tokens) is cached finds it
    with probability ``hit`` (else it misses entirely: a cache is flushed, evicted, or the
    request was routed elsewhere); either way a share ``cold`` of the prompt may be found
    cached (e.g. a shared system prompt). Returns ``(hit_rows, miss_rows)``, each ``(n, 4)``
    ([1, prompt, computed tokens, attention pairs]), already weighted by their probability.
    Hit and miss are kept apart because prefill time is far from linear in them.
    """
    x = clean(np.atleast_1d(np.asarray(x, dtype=float)))
    p = np.broadcast_to(clean(prefix), x.shape)
    hit = np.clip(np.nan_to_num(np.broadcast_to(np.asarray(hit, dtype=float), x.shape), nan=1.0), 0.0, 1.0)[:, None]
    cold = float(np.clip(np.nan_to_num(cold, nan=0.0), 0.0, 1.0))
    base = cold * x
    return hit * definite(x, np.maximum(p, base)), (1.0 - hit) * definite(x, base)


def request_loads(x, prefix=0.0, hit: float = 1.0, cold: float = 0.0) -> np.ndarray:
    """``(n, 4)`` expected load columns of requests: [1, prompt, computed tokens, attention
    pairs] (computed = prompt - cached prefix; pairs = computed x its mean context),
    averaged over the cache lookup's outcomes (see :func:`request_rows`)."""
    h, m = request_rows(x, prefix, hit, cold)
    return h + m


def rows(snap: Snapshot, x: np.ndarray, prefix=0.0, weight=None) -> np.ndarray:
    """Load rows of requests (both cache outcomes stacked: ``(2n, 4)``), each counting
    with its ``weight`` (the probability that it comes at all; 1 when None)."""
    hit = snap.unrouted_hit(np.broadcast_to(np.asarray(prefix, dtype=float), np.shape(x)))
    h, m = request_rows(x, prefix, hit, snap.cache_cold)
    out = np.concatenate((h, m))
    return out if weight is None else out * np.tile(np.asarray(weight, dtype=float), 2)[:, None]


def spread(model, elapsed: np.ndarray, x: np.ndarray, prefix, snap: Snapshot, cost: np.ndarray, cfg: ForecastConfig, weight=None) -> np.ndarray:
    """Expected arrivals per service class and sub-step, ``(4, N_CLASSES, steps)``, of
    requests of ``x`` prompt tokens (``prefix`` of them cached on a hit) whose waiting
    time follows ``model`` (conditioned on the elapsed time); each request counts with
    its ``weight`` (see :func:`rows`)."""
    load = rows(snap, x, prefix, weight)
    e = np.concatenate((elapsed, elapsed))
    return model.weighted_steps(e, load, cfg.horizon, cfg.steps, service_class(load, cost), N_CLASSES)


def by_step(load: np.ndarray, cls: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``(4, N_CLASSES, steps)``: load rows summed per service class, each row spread
    over the sub-steps by its ``(rows, steps)`` weights."""
    out = np.zeros((4, N_CLASSES, weights.shape[1]))
    for c in np.unique(cls):
        sel = cls == c
        out[:, c, :] = load[sel].T @ weights[sel]
    return out


def delay_pmf(model, horizon: float, steps: int, thetas: np.ndarray | None = None) -> np.ndarray:
    """Pr(delay in sub-step l) for an event placed mid-sub-step, l = 0..steps-1. With
    ``thetas``, one row per theta for delays ``T0 exp(theta)``, ``model`` being T0's (the
    group and trajectory effects, frailty.py), read in one ``cdf`` call."""
    h = horizon / steps
    edges = np.concatenate(([0.0], (np.arange(steps) + 0.5) * h))
    if thetas is not None:
        edges = edges[None, :] * np.exp(-np.asarray(thetas, dtype=float))[:, None]
    return np.clip(np.diff(model.cdf(edges), axis=-1), 0.0, 1.0)


def _lagged(pmf: np.ndarray) -> np.ndarray:
    """``(..., steps, steps)``: mass in sub-step k lands in sub-step j with ``pmf[..., j - k]``."""
    steps = pmf.shape[-1]
    k = np.arange(steps)
    lag = k[None, :] - k[:, None]
    return np.where(lag >= 0, pmf[..., np.clip(lag, 0, steps - 1)], 0.0)


def kernel(model, horizon: float, steps: int) -> np.ndarray:
    """(steps, steps) matrix: mass placed in sub-step k lands in sub-step j after a fresh
    delay drawn from ``model`` (upper triangular; what falls past the window is lost)."""
    return _lagged(delay_pmf(model, horizon, steps))


def scaled_kernels(model, thetas: np.ndarray, horizon: float, steps: int) -> np.ndarray:
    """:func:`kernel` of delays ``T0 exp(theta)`` for each theta: ``(len(thetas), steps, steps)``."""
    return _lagged(delay_pmf(model, horizon, steps, thetas))
