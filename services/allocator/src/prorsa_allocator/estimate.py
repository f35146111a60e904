"""Online estimates the optimisation needs: θᴾ, C_KVᴰ, mᴾ/mᴰ and switch costs."""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from prorsa_schemas import EngineStats

from .config import AllocatorConfig
from .engines import EngineView


@dataclass
class PrefillThroughput:
    """θᴾ: full-prompt tokens per second that one prefill instance serves.

    Only a backlogged engine's rate measures its capacity (an idle engine's rate measures
    its demand), so only samples with queued requests count. The engine reports computed
    tokens per second; cached prefix tokens cost (almost) nothing, so in the full-prompt
    convention of Ŵᴾ one instance serves ``rate / (1 - cache_hit_rate)`` tokens per second
    (paper §4.2 and Appendix B.1: θᴾ "already incorporates the average prefix-cache hit ratio").

    A queue at the moment of the sample is not a saturated window: the rate is an average
    over the stats interval, the queue an instant. An engine idle for most of the window
    that has just received two requests reports ``queued_reqs = 2`` with a rate of a few
    hundred tokens/s (math, async: 569 tokens/s against a capacity of ~83k). That one
    sample, the first, made θᴾ 569 and the prefill demand 74 instances; at the next
    burst three busy decode engines were switched to prefill and could not drain. So a
    sample counts only when the engine is both running and queueing (``running_reqs > 0``
    and ``queued_reqs > 0``), and θᴾ is a high quantile (``quantile``, default the 75th
    percentile) of the last ``window`` such samples, not a mean: capacity is the rate a
    backlogged engine sustains, and the window still follows a real change (longer
    contexts, another cache-hit level) within a few windows. The window starts holding
    ``prior_samples`` copies of the prior. (With the running-and-queued rule alone, once
    the simulator reported a prefill in progress as running, the same math window gave
    a first sample of 569 tokens/s with one request running and one queued.)

    The two factors are estimated apart: the quantile is taken over the computed rates,
    the engine's own capacity, and the hit ratio is the mean over the last ``hit_samples``
    backlogged samples, the pool's cache as it is now. θᴾ = quantile / (1 − hit). The hit
    moves far faster than the capacity: a weight update flushes every cache, and under a
    cache-aware gateway the pool's hit goes from 0.94 to 0.1 and back within minutes. A
    quantile over the samples' full-prompt rates mixes the cold samples with the warm
    ones for as long as the window holds both, so once the cache was back θᴾ still read
    cold for another window or two and the prefill demand looked several times its size
    (DeepSeek-V3.2 coding/2 under the gateway, seed 1: aᴾ 20 engines and θᴾ 90k at
    t = 1,480 s, the window the cache came back in, and a move to 7:1 held to the run's
    end, 8% slower than 6:2 held). Before any backlogged sample the hit is 0 and θᴾ the
    prior.
    """

    value: float
    window: int = 64
    quantile: float = 0.75
    max_hit: float = 0.95
    prior_samples: int = 8
    hit_samples: int = 16
    samples: int = 0
    _recent: deque = field(default_factory=deque)
    _hits: deque = field(default_factory=deque)

    def __post_init__(self) -> None:
        # The prior enters the window as pseudo-samples, which the first ``window`` real
        # ones push out: a single early sample cannot set θᴾ on its own.
        self._recent.extend([self.value] * min(self.prior_samples, self.window))
        self._hits = deque(maxlen=self.hit_samples)

    @property
    def hit(self) -> float:
        """The mean hit ratio of the last ``hit_samples`` backlogged samples (0 before any)."""
        return sum(self._hits) / len(self._hits) if self._hits else 0.0

    @classmethod
    def from_config(cls, config: AllocatorConfig) -> "PrefillThroughput":
        return cls(config.prefill_tokens_per_s, config.theta_window, config.theta_quantile, config.max_cache_hit_rate,
                   config.theta_prior_samples)

    def observe(self, stats: EngineStats) -> bool:
        """Fold in one stats sample; returns whether it counted."""
        rate = stats.prefill_tokens_per_s
        if stats.role != "prefill" or rate is None or rate <= 0 or stats.queued_reqs <= 0 or stats.running_reqs <= 0:
            return False
        self._recent.append(rate)
        while len(self._recent) > self.window:
            self._recent.popleft()
        self._hits.append(min(max(stats.cache_hit_rate or 0.0, 0.0), self.max_hit))
        computed = float(np.quantile(np.fromiter(self._recent, float, len(self._recent)), self.quantile))
        self.value = computed / (1.0 - self.hit)
        self.samples += 1
        return True


@dataclass
class SwitchCost:
    """Seconds a switch takes after the drain, per mode, learned from engine.switched."""

    in_place_s: float
    restart_s: float
    alpha: float = 0.3

    @classmethod
    def from_config(cls, config: AllocatorConfig) -> "SwitchCost":
        return cls(config.in_place_switch_s, config.restart_switch_s, config.switch_cost_alpha)

    def observe(self, mode: str | None, seconds: float) -> None:
        # ``seconds`` arrives net of the drain the planner expected (EngineTable); what is
        # left is the switch itself plus any drain beyond the estimate.
        if mode == "restart":
            self.restart_s = (1 - self.alpha) * self.restart_s + self.alpha * seconds
        elif mode == "in_place":
            self.in_place_s = (1 - self.alpha) * self.in_place_s + self.alpha * seconds

    def for_engine(self, view: EngineView) -> float:
        """An engine that advertises in-place switching switches in place; any other restarts."""
        return self.in_place_s if "in_place" in view.switch_modes else self.restart_s

    def for_engines(self, views: Sequence[EngineView]) -> np.ndarray:
        """:meth:`for_engine` of each of ``views``, as an array."""
        return np.fromiter((self.for_engine(v) for v in views), float, len(views))


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """What the optimisation needs to know about the PD engines, gathered in one pass.

    Attributes:
        engines: the engines in (or switching between) the prefill and decode roles.
        kv_capacity: C_KVᴰ, mean KV capacity of the decode engines (of all, if none is decode).
        gpus_prefill / gpus_decode: mᴾ / mᴰ, median GPUs of that role's engines (of all, if none).
        gpu_budget: G, the GPUs of all PD engines.
        n_prefill: the engines counted as prefill (where they are going, if switching).
    """

    engines: list[EngineView]
    kv_capacity: float
    gpus_prefill: int
    gpus_decode: int
    gpu_budget: int
    n_prefill: int = 0


def cluster_shape(views: Iterable[EngineView], m_p: int | None = None, m_d: int | None = None) -> ClusterShape:
    """Gather :class:`ClusterShape`; ``m_p``/``m_d`` override the GPUs per instance."""
    engines: list[EngineView] = []
    gpus: dict[str, list[int]] = {"prefill": [], "decode": []}
    kv: dict[str, list[int]] = {"prefill": [], "decode": []}
    for v in views:
        role = v.switching_to or v.role
        if role not in gpus:
            continue
        engines.append(v)
        gpus[role].append(v.gpus)
        if v.kv_capacity_tokens > 0:
            kv[role].append(v.kv_capacity_tokens)
    every = gpus["prefill"] + gpus["decode"]
    kv_pool = kv["decode"] or kv["prefill"]

    def median_gpus(role: str, override: int | None) -> int:
        if override is not None:
            return override
        pool = gpus[role] or every
        return max(1, int(round(statistics.median(pool)))) if pool else 1

    return ClusterShape(
        engines=engines,
        kv_capacity=float(statistics.fmean(kv_pool)) if kv_pool else 0.0,
        gpus_prefill=median_gpus("prefill", m_p),
        gpus_decode=median_gpus("decode", m_d),
        gpu_budget=sum(every),
        n_prefill=len(gpus["prefill"]),
    )
