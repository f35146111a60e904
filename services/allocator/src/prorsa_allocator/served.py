"""The 'priced' rule's measured rates: the full-prompt prefill rate the cluster served at
each prefill count (``Allocator.served``: count -> (EMA, windows, last window start)), the
prefill pool's prefix-cache hit ratio, and the cache regime those rates were measured in
(:class:`CacheRegime`)."""

from __future__ import annotations

from dataclasses import dataclass

from prorsa_schemas import ForecastWindow

from .config import AllocatorConfig


def measure_served(served: dict[int, tuple[float, int, float]], engines: list, fc: ForecastWindow,
                   cfg: AllocatorConfig, last_update_ts: float | None, first_t: float | None,
                   backlog: dict[int, float] | None = None, cache_cold: bool = False,
                   miss: dict[int, float] | None = None) -> bool:
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
    same windows, averaged as the rate is (whether the prefill role had room to give).

    ``miss``: the prefill pool's prefix-cache miss ratio (1 − its engines' mean hit, each
    capped at ``max_cache_hit_rate``) in the same windows, averaged as the rate is: what
    a count's prefill engines compute of each prompt they are sent.

    ``cache_cold``: the pool's cache has not come back since the last weight update
    (:class:`CacheRegime`); such windows are not measured either. Returns whether the
    window was measured."""
    if cache_cold:
        return False
    if any(v.switching_to is not None for v in engines) or not any(v.queued_reqs > 0 for v in engines):
        return False
    if any(v.since_ts > fc.t - fc.horizon for v in engines if v.switched):
        return False
    if not after_pause(fc, cfg, last_update_ts):
        return False
    if cfg.served_ramp_s is not None and first_t is not None and fc.t - first_t < cfg.served_ramp_s:
        return False
    rate, p, queued, hits = 0.0, 0, 0, 0.0
    for v in engines:
        if v.role == "prefill":
            p += 1
            queued += v.queued_reqs
            hit = min(v.cache_hit_rate or 0.0, cfg.max_cache_hit_rate)
            hits += hit
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
        _fold(backlog, p, q, w)
    if miss is not None and p:
        _fold(miss, p, 1.0 - hits / p, w)
    return True


def after_pause(fc: ForecastWindow, cfg: AllocatorConfig, last_update_ts: float | None) -> bool:
    """Whether the engines' reports at window ``fc`` cover a whole window past the last
    weight update's pause: [t − S, t) begins at or after the update plus ``weight_sync_s``.
    A report of an earlier window mixes the pause in; and its ``cache_hit_rate``, a gauge
    of the last prefills an engine finished, is the one from before the update when no
    prefill has finished since (SGLang logs the hit rate of the batches it runs, the
    simulator keeps the last window's ratio): read as the pool's cache, it says the cache
    is back before anything has been prefilled on the new weights."""
    return last_update_ts is None or fc.t - last_update_ts >= fc.horizon + cfg.weight_sync_s


def _fold(avg: dict[int, float], p: int, x: float, w: float) -> None:
    """Fold ``x`` into count ``p``'s average with the served rate's weight ``w`` (1: it
    restarts, as the rate did)."""
    avg[p] = x if w >= 1.0 or p not in avg else (1 - w) * avg[p] + w * x


def pool_hit(engines: list) -> float:
    """The prefill pool's prefix-cache hit ratio: the mean of its engines' last reports."""
    hits = [v.cache_hit_rate for v in engines if v.role == "prefill" and v.cache_hit_rate is not None]
    return sum(hits) / len(hits) if hits else 0.0


@dataclass
class CacheRegime:
    """Whether the prefill pool's prefix cache is back after a weight update.

    A weight update flushes every cache. Where prompts share long prefixes and the router
    keeps them on one engine (a GRPO group, a coding agent's growing context, SGLang
    Model Gateway's cache-aware routing) the pool computes a few percent of each prompt
    when warm and all of it when cold: after the update a prefill engine serves a tenth
    of the full-prompt tokens it served before, for as long as the carried-over contexts
    take to be prefilled once (about 200 s on DeepSeek-V3.2 coding/8 under the gateway's
    rule, pool hit 0.05 -> 0.9; benchmarks/allocator_trace.py ``--served``). Planned on,
    those windows ask for several times the prefill engines the step needs once the cache
    is back, by when a switch made for them has landed; measured, they lower the served
    rate of the count that met them, so that the veto compares a cold count with a warm
    one.

    The reference is the pool's miss ratio (1 − hit, the hit capped at ``max_hit``) over
    the windows the served rates were measured in, the plain mean over the first
    1/``alpha`` of them, then an EMA. After an update the regime is cold until a window
    after the pause shows a miss ratio within ``ratio`` times the reference, or until
    ``max_s`` after the update (the workload's reuse has changed: the reference restarts
    from the next measured windows). ``ratio`` 0: never cold."""

    ratio: float
    max_s: float
    alpha: float
    max_hit: float
    miss_ref: float | None = None
    windows: int = 0
    update_ts: float | None = None
    cold: bool = False

    def on_update(self, ts: float) -> None:
        """A weight update at ``ts``: cold, if there is a reference to come back to."""
        self.update_ts = ts
        self.cold = self.ratio > 0 and self.miss_ref is not None

    def observe(self, t: float, hit: float) -> None:
        """The pool's hit ratio in window ``t`` after the pause: back, or still cold."""
        if not self.cold or self.update_ts is None or self.miss_ref is None:
            return
        if self.miss(hit) <= self.ratio * self.miss_ref:
            self.cold = False
        elif t - self.update_ts > self.max_s:
            self.cold = False
            self.miss_ref, self.windows = None, 0

    def measured(self, hit: float) -> None:
        """A window whose served rate was measured, at pool hit ``hit``."""
        m = self.miss(hit)
        self.windows += 1
        w = max(self.alpha, 1.0 / self.windows)
        self.miss_ref = m if self.miss_ref is None else (1 - w) * self.miss_ref + w * m

    def miss(self, hit: float) -> float:
        return 1.0 - min(max(hit, 0.0), self.max_hit)
