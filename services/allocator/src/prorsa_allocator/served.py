"""The 'priced' rule's measured rates: the full-prompt prefill rate the cluster served at
each prefill count (``Allocator.served``: count -> (EMA, windows, last window start)), and
the prefill pool's prefix-cache hit ratio."""

from __future__ import annotations

from prorsa_schemas import ForecastWindow

from .config import AllocatorConfig


def measure_served(served: dict[int, tuple[float, int, float]], engines: list, fc: ForecastWindow,
                   cfg: AllocatorConfig, last_update_ts: float | None, first_t: float | None,
                   backlog: dict[int, float] | None = None) -> None:
    """Fold the last window's served prefill rate into the rate of the prefill count
    that served it: Σ over prefill engines of computed tokens/s / (1 − hit), the
    full-prompt tokens the cluster prefilled per second. In a closed rollout loop that
    is the rate turns go round, whichever role limits it: a prefill count whose decode
    side chokes serves fewer prompts however large the prefill queue looks. Only whole
    windows count: no switch under way, every engine in its role for the window, and
    no weight-update pause in it; and only saturated ones (some engine queues at the
    window's end): below capacity the rate is the demand, not what the split can serve
    (a warm-up ramp would otherwise veto the counts it passed through).

    ``backlog``: the prefill engines' mean queued requests per engine at the end of the
    same windows, averaged as the rate is (whether the prefill role had room to give)."""
    if any(v.switching_to is not None for v in engines) or not any(v.queued_reqs > 0 for v in engines):
        return
    if any(v.since_ts > fc.t - fc.horizon for v in engines if v.switched):
        return
    if last_update_ts is not None and fc.t - last_update_ts < fc.horizon + cfg.weight_sync_s:
        return
    if cfg.served_ramp_s is not None and first_t is not None and fc.t - first_t < cfg.served_ramp_s:
        return
    rate, p, queued = 0.0, 0, 0
    for v in engines:
        if v.role == "prefill":
            p += 1
            queued += v.queued_reqs
            hit = min(v.cache_hit_rate or 0.0, cfg.max_cache_hit_rate)
            rate += (v.prefill_tokens_per_s or 0.0) / (1.0 - hit)
    old = served.get(p)
    a = cfg.served_alpha
    q = queued / p if p else 0.0
    if old is None or fc.t - old[2] > cfg.served_memory_s:
        served[p] = (rate, 1, fc.t)  # none yet, or too old to build on
        w = 1.0
    else:
        w = max(a, 1.0 / (old[1] + 1))  # the mean until 1/alpha windows, then the EMA
        served[p] = ((1 - w) * old[0] + w * rate, old[1] + 1, fc.t)
    if backlog is not None:
        backlog[p] = q if w >= 1.0 or p not in backlog else (1 - w) * backlog[p] + w * q


def pool_hit(engines: list) -> float:
    """The prefill pool's prefix-cache hit ratio: the mean of its engines' last reports."""
    hits = [v.cache_hit_rate for v in engines if v.role == "prefill" and v.cache_hit_rate is not None]
    return sum(hits) / len(hits) if hits else 0.0
