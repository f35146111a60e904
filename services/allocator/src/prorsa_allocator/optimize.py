"""The allocation optimisation of paper §4.2: how many prefill and decode instances.

    nᴾ = ⌈Ŵᴾ / (S·θᴾ) · (1+δ)⌉,   nᴰ = ⌈(Kᴰ + K̂ᴰ) / C_KVᴰ · (1+δ)⌉,
    maximise δ  subject to  mᴾ·nᴾ + mᴰ·nᴰ ≤ G.

Write aᴾ = Ŵᴾ/(S·θᴾ) and aᴰ = (Kᴰ+K̂ᴰ)/C_KVᴰ (the demands in instances). For integer
counts (nᴾ, nᴰ) the largest δ they support is min(nᴾ/aᴾ, nᴰ/aᴰ) − 1, so maximising δ is
maximising the smaller capacity-to-demand ratio over budget-feasible integer pairs. The
paper's fallback when even δ = 0 is infeasible (minimise the larger demand-to-capacity
ratio) is the same objective, so one exact search answers both cases: ``feasible`` is
whether the optimum reaches δ ≥ 0. The search enumerates every nᴾ (vectorised), which is
exact for any mᴾ ≠ mᴰ and still well under a millisecond for thousands of GPUs.

The counts returned are the SMALLEST that achieve the optimal δ (the paper's ceilings);
GPUs left over are ``spare_gpus``, which the switch selector leaves in their current role
so that spare capacity never causes a switch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# A ratio this close to an integer boundary is treated as on it: forecasts are floats,
# and ceil(2.0000000001) must not ask for a third instance.
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Demand:
    """One window's demand, in the paper's terms.

    Attributes:
        prefill_tokens: Ŵᴾ, prompt tokens to prefill in the window (full prompts).
        horizon_s: S, the window length in seconds.
        decode_kv_tokens: Kᴰ + K̂ᴰ, decode KV tokens now plus those admitted in the window.
        decode_instances: decode demand in instances by step time (``decode.py``: the
            engines that keep a decode step within the TPOT target); 0: KV only (the paper).
            The decode demand is the larger of this and the KV term.
    """

    prefill_tokens: float
    horizon_s: float
    decode_kv_tokens: float
    decode_instances: float = 0.0

    def __post_init__(self) -> None:
        for name in ("prefill_tokens", "decode_kv_tokens", "decode_instances"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if not math.isfinite(self.horizon_s) or self.horizon_s <= 0:
            raise ValueError(f"horizon_s must be a finite number > 0, got {self.horizon_s!r}")


@dataclass(frozen=True, slots=True)
class Capacity:
    """Per-instance capacities and the GPU budget.

    Attributes:
        prefill_tokens_per_s: θᴾ, full-prompt tokens per second one prefill instance serves.
        decode_kv_tokens: C_KVᴰ, KV tokens one decode instance holds.
        gpus_prefill: mᴾ, GPUs per prefill instance.
        gpus_decode: mᴰ, GPUs per decode instance.
        gpu_budget: G, GPUs available to the two roles.
    """

    prefill_tokens_per_s: float
    decode_kv_tokens: float
    gpus_prefill: int
    gpus_decode: int
    gpu_budget: int

    def __post_init__(self) -> None:
        for name in ("prefill_tokens_per_s", "decode_kv_tokens"):
            v = getattr(self, name)
            if not math.isfinite(v) or v <= 0:
                raise ValueError(f"{name} must be a finite number > 0, got {v!r}")
        if self.gpus_prefill < 1 or self.gpus_decode < 1:
            raise ValueError("GPUs per instance must be >= 1")
        if self.gpu_budget < self.gpus_prefill + self.gpus_decode:
            raise ValueError(
                f"a budget of {self.gpu_budget} GPUs cannot hold one prefill ({self.gpus_prefill} GPUs) "
                f"and one decode ({self.gpus_decode} GPUs) instance"
            )


@dataclass(frozen=True, slots=True)
class Allocation:
    """The target PD ratio.

    Attributes:
        n_prefill: nᴾ.  n_decode: nᴰ.
        delta: the headroom δ achieved (negative when infeasible: the capacity shortfall,
            e.g. -0.2 means the bottleneck role has 80% of the capacity its demand needs).
        feasible: whether δ ≥ 0, i.e. the forecast demand fits the budget.
        prefill_demand: aᴾ in instances.  decode_demand: aᴰ in instances.
        spare_gpus: budget left after the two counts.
    """

    n_prefill: int
    n_decode: int
    delta: float
    feasible: bool
    prefill_demand: float
    decode_demand: float
    spare_gpus: int


def instance_demands(demand: Demand, cap: Capacity) -> tuple[float, float]:
    """aᴾ = Ŵᴾ/(S·θᴾ) and aᴰ = max((Kᴰ+K̂ᴰ)/C_KVᴰ, step-time demand): each role's demand in instances."""
    a_p = demand.prefill_tokens / (demand.horizon_s * cap.prefill_tokens_per_s)
    a_d = max(demand.decode_kv_tokens / cap.decode_kv_tokens, demand.decode_instances)
    return a_p, a_d


def role_ratios(n_prefill: float, n_decode: float, a_p: float, a_d: float, cap: float) -> tuple[float, float]:
    """Capacity-to-demand ratios of both roles, each capped at ``cap`` (no demand: ``cap``)."""
    r_p = cap if a_p <= 0 else min(cap, n_prefill / a_p)
    r_d = cap if a_d <= 0 else min(cap, n_decode / a_d)
    return r_p, r_d


def solve(demand: Demand, cap: Capacity, max_delta: float = 100.0) -> Allocation:
    """The allocation that maximises δ within the budget (or, if none reaches δ = 0, the one
    minimising the larger demand-to-capacity ratio). At least one instance per role.

    ``max_delta`` caps the reported δ (with no demand at all it would be infinite).
    """
    a_p, a_d = instance_demands(demand, cap)
    m_p, m_d, g = cap.gpus_prefill, cap.gpus_decode, cap.gpu_budget
    n_p = np.arange(1, (g - m_d) // m_p + 1, dtype=np.int64)
    n_d = (g - m_p * n_p) // m_d  # the most decode instances each nᴾ leaves room for
    ok = n_d >= 1
    n_p, n_d = n_p[ok], n_d[ok]
    big = 1.0 + max_delta
    r_p = np.full(n_p.shape, big) if a_p <= 0 else np.minimum(n_p / a_p, big)
    r_d = np.full(n_d.shape, big) if a_d <= 0 else np.minimum(n_d / a_d, big)
    best = float(np.max(np.minimum(r_p, r_d)))
    delta = best - 1.0
    # The smallest counts that still support the optimal δ (the paper's ceilings).
    p = 1 if a_p <= 0 else max(1, math.ceil(a_p * best - _EPS))
    d = 1 if a_d <= 0 else max(1, math.ceil(a_d * best - _EPS))
    if m_p * p + m_d * d > g:  # only float noise can get here; fall back to the argmax pair
        i = int(np.argmax(np.minimum(r_p, r_d)))
        p, d = int(n_p[i]), int(n_d[i])
    return Allocation(
        n_prefill=p,
        n_decode=d,
        delta=delta,
        feasible=delta >= -_EPS,
        prefill_demand=a_p,
        decode_demand=a_d,
        spare_gpus=g - m_p * p - m_d * d,
    )
