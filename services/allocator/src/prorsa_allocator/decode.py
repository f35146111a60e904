"""Decode throughput: how many decode instances keep a decode step within a TPOT target.

The §4.2 formula sizes decode by KV alone: nᴰ ≥ (Kᴰ + K̂ᴰ)/C_KVᴰ. But a decode step reads
the weights once plus every running sequence's KV, so its time grows with what one
engine holds: t(b, kv) = t₀ + s·b + r·kv for b sequences holding kv tokens. One engine can
hold all the KV of a rollout and still decode slower than two, which occupancy alone never
shows. Spreading B sequences and K KV tokens over n engines gives a step of
t₀ + (s·B + r·K)/n; keeping it within a TPOT target τ needs

    n ≥ (s·B + r·K) / (τ − t₀),

the decode analogue of Ŵᴾ/(S·θᴾ) (throughput at a target latency, as Dynamo's SLA
planner sizes decode replicas by an inter-token-latency target). The planner takes the
larger of this and the KV term as the decode demand in instances.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from .config import AllocatorConfig
from .optimize import Capacity


@dataclass(frozen=True, slots=True)
class DecodeStep:
    """Per-ENGINE decode step model t = fixed_s + per_seq_s·b + per_kv_token_s·kv.

    Attributes:
        fixed_s: t₀, the step of an almost empty engine (weights read, communication).
        per_seq_s: s, seconds added per running sequence.
        per_kv_token_s: r, seconds added per KV token held.
    """

    fixed_s: float
    per_seq_s: float
    per_kv_token_s: float

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_seq_s", "per_kv_token_s"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def load(self, seqs: float, kv_tokens: float) -> float:
        """c = s·b + r·kv: the engine-seconds per step of ``seqs`` sequences holding
        ``kv_tokens`` KV, above the fixed part (spread over n engines: t = t₀ + c/n)."""
        return self.per_seq_s * seqs + self.per_kv_token_s * kv_tokens

    def step_s(self, seqs: float, kv_tokens: float, n_engines: float = 1.0) -> float:
        """Step time when ``seqs`` sequences and ``kv_tokens`` KV are spread over ``n_engines``."""
        return self.fixed_s + self.load(seqs, kv_tokens) / n_engines


def decode_instances_for_tpot(seqs: float, kv_tokens: float, step: DecodeStep, tpot_target_s: float) -> float:
    """Decode instances (fractional) that keep the step within ``tpot_target_s``.

    Infinite when the target is at or below the empty-engine step (no number of engines
    meets it); 0 with nothing to decode.
    """
    if seqs < 0 or kv_tokens < 0:
        raise ValueError("seqs and kv_tokens must be >= 0")
    load = step.load(seqs, kv_tokens)
    if load <= 0:
        return 0.0
    room = tpot_target_s - step.fixed_s
    return math.inf if room <= 0 else load / room


@dataclass
class DecodeStepFit:
    """The per-engine decode step model, learned online from decode engines' engine.stats.

    A sample is (b = running_reqs, kv = kv_used_tokens, t = running_reqs /
    decode_tokens_per_s): one token per running sequence per step. The model is the least
    squares fit of t on (1, b, kv) over exponentially weighted sums (``alpha`` per sample),
    used once ``min_samples`` samples spread over at least two loads have arrived and every
    coefficient comes out >= 0; until then (and whenever the fit is degenerate) the prior.
    """

    prior: DecodeStep | None
    alpha: float = 0.05
    min_samples: int = 8
    samples: int = 0
    _xtx: list[list[float]] | None = None
    _xty: list[float] | None = None
    _fit: DecodeStep | None = None

    def observe(self, role: str, running_reqs: int, kv_used_tokens: int, decode_tokens_per_s: float | None) -> bool:
        """Fold in one stats sample; returns whether it counted."""
        if role != "decode" or running_reqs <= 0 or not decode_tokens_per_s or decode_tokens_per_s <= 0:
            return False
        if not math.isfinite(decode_tokens_per_s):
            return False
        t = running_reqs / decode_tokens_per_s
        x = (1.0, float(running_reqs), float(kv_used_tokens))
        keep = 1.0 - self.alpha if self.samples else 0.0
        xtx = self._xtx or [[0.0] * 3 for _ in range(3)]
        xty = self._xty or [0.0] * 3
        for i in range(3):
            xty[i] = keep * xty[i] + x[i] * t
            for j in range(3):
                xtx[i][j] = keep * xtx[i][j] + x[i] * x[j]
        self._xtx, self._xty = xtx, xty
        self.samples += 1
        self._fit = self._solve() if self.samples >= self.min_samples else None
        return True

    def _solve(self) -> DecodeStep | None:
        import numpy as np

        a, y = np.array(self._xtx), np.array(self._xty)
        # Scale the columns (b ~ 1e2, kv ~ 1e6) so the conditioning test means something.
        scale = np.sqrt(np.maximum(np.diag(a), 1e-30))
        a_s = a / np.outer(scale, scale)
        if np.linalg.cond(a_s) > 1e8:  # every sample at one load: the slope is unknown
            return None
        c = np.linalg.solve(a_s, y / scale) / scale
        if not np.all(np.isfinite(c)) or np.any(c < 0) or c[0] <= 0:
            return None
        return DecodeStep(float(c[0]), float(c[1]), float(c[2]))

    @property
    def value(self) -> DecodeStep | None:
        """The fitted model, else the prior (None: no model, the decode term is off)."""
        return self._fit or self.prior


def decode_instances_for_latency(
    prefill_instances: float,
    kv_now: float,
    admit_tokens: float,
    seqs: float,
    kv_tokens: float,
    n_decode_now: float,
    step: DecodeStep,
) -> float:
    """Decode demand in instances that balances the two roles' marginal per-turn latency.

    A turn waits in prefill and then decodes. With the window's prefill work spread over
    nᴾ engines, a request waits on average half the time the window's work takes to drain:
    L_P = Ŵᴾ/(2·θᴾ·nᴾ) = A/nᴾ with A = aᴾ·S/2 (aᴾ = Ŵᴾ/(S·θᴾ), the paper's prefill
    demand in instances). Decoding o tokens costs L_D = o·(t₀ + c/nᴰ), c = s·B + r·K the
    per-engine step load (``DecodeStep``); only B' = o·c depends on nᴰ. Minimising
    A/nᴾ + B'/nᴰ over nᴾ + nᴰ = N gives nᴾ/nᴰ = √(A/B') (the square-root capacity rule of
    open queueing networks), which the max-min of ``optimize.solve`` reproduces when the
    decode demand in instances is

        aᴰ = aᴾ·√(B'/A) = √(2·aᴾ·B'/S).

    o is not in the forecast; Little's law gives the per-turn decode time from it:
    L_D = S·Kᴰ/Âᴰ (KV held in decode over KV admitted per window; prompts dominate the KV of
    agentic turns), and o = L_D / t(now). So B'/S = (Kᴰ/Âᴰ)·c/t(now), and nothing here needs
    the output lengths. Returns 0 (term off) when nothing is decoding or admitted.
    """
    vals = (prefill_instances, kv_now, admit_tokens, seqs, kv_tokens, n_decode_now)
    if any(not math.isfinite(v) or v < 0 for v in vals):
        raise ValueError(f"inputs must be finite and >= 0, got {vals!r}")
    if prefill_instances <= 0 or kv_now <= 0 or admit_tokens <= 0 or n_decode_now <= 0:
        return 0.0
    load = step.load(seqs, kv_tokens)  # c, engine-seconds per step
    t_now = step.fixed_s + load / n_decode_now
    if load <= 0 or t_now <= 0:
        return 0.0
    b_over_s = (kv_now / admit_tokens) * load / t_now
    return math.sqrt(2.0 * prefill_instances * b_over_s)


# -- the planner's decode demand beyond KV ---------------------------------------------------


class DecodeLoad(NamedTuple):
    """What the decode engines hold now (:func:`decode_load`)."""

    seqs: int
    """Sequences running or queued on the decode engines."""
    kv_tokens: int
    """KV tokens in use on them."""
    engines: int
    """Decode engines."""
    ranks: int
    """Their attention-DP ranks in all (``parallel.attn_dp`` of each; 1 when absent)."""

    def spread(self, seqs: float | None = None) -> float:
        """Decode engines ``seqs`` sequences (default: those held now) can spread over, at
        one sequence a rank: seqs / (ranks an engine). A decode step is as slow as its
        slowest rank (the ranks step in lock-step, ending each step in the MoE all-to-all),
        so past this many engines another one shortens no step. Infinite with no decode
        engine to learn the ranks from."""
        if self.engines <= 0:
            return math.inf
        per_engine = self.ranks / self.engines
        return (self.seqs if seqs is None else seqs) / max(per_engine, 1.0)


def decode_load(engines: list) -> DecodeLoad:
    """(sequences, KV tokens, engines, attention-DP ranks) of the decode engines: one pass
    per decision."""
    seqs = kv = n = ranks = 0
    for v in engines:
        if v.role == "decode":
            seqs += v.running_reqs + v.queued_reqs
            kv += v.kv_used_tokens
            n += 1
            par = getattr(v, "parallel", None)
            ranks += (par.attn_dp if par is not None and par.attn_dp else 1)
    return DecodeLoad(seqs, kv, n, ranks)


def expected_seqs(load: DecodeLoad, kv_tokens: float) -> float:
    """The decode sequences over the horizon: those held now, scaled by the KV the forecast
    expects (Kᴰ + K̂ᴰ, ``kv_tokens``) over the KV they hold (admissions add sequences of the
    current mean size)."""
    return load.seqs * kv_tokens / load.kv_tokens if load.kv_tokens > 0 else float(load.seqs)


def decode_room(config: AllocatorConfig, prefill_instances: float, cap: Capacity) -> float:
    """Decode instances the budget leaves once prefill has the whole instances its
    demand needs: the latency-balance term may only take engines prefill can spare.
    In a closed rollout loop a saturated prefill role is THE throughput bottleneck, and
    a faster decode step then only moves turns into the prefill queue sooner."""
    if not config.decode_latency_room_cap:
        return math.inf
    need = max(1, math.ceil(prefill_instances - 1e-9)) if prefill_instances > 0 else 1
    return max(0.0, (cap.gpu_budget - cap.gpus_prefill * need) / cap.gpus_decode)


def decode_step_demand(
    cfg: AllocatorConfig, step: DecodeStep | None, load: DecodeLoad, kv_tokens: float,
    prefill_instances: float, kv_now_fc: float, admit_tokens: float, room: float, capped: bool = True,
) -> float:
    """Decode demand in instances beyond KV (0: no such term): the larger of the TPOT
    term (engines that keep a decode step within the target, opt-in) and the latency
    balance term (``decode_instances_for_latency``, on by default).

    ``load`` is :func:`decode_load` of the engines. The sequences are those the decode
    engines hold now; for the TPOT term they are scaled by the KV the forecast expects
    (Kᴰ + K̂ᴰ) over the KV they hold now (:func:`expected_seqs`). With ``decode_spread_cap``
    both terms are capped at the engines the sequences held now can spread over
    (:meth:`DecodeLoad.spread`): past one sequence a rank, no engine shortens a step. (Held
    now, not scaled by the admissions: in a turn cycle the admitted turns replace the
    finished ones, and the scaled count, which adds the admissions and takes nothing away,
    reads 2-3 times the sequences at a sync step's tail.) ``capped=False``: the terms before
    the cap (:func:`spread_capped` applies it)."""
    if step is None:
        return 0.0
    seqs, kv_now, n_dec = load.seqs, load.kv_tokens, load.engines
    out = 0.0
    if cfg.decode_latency_balance and n_dec:
        out = min(room, decode_instances_for_latency(
            max(prefill_instances, 0.0), kv_now_fc, admit_tokens, seqs, kv_now, n_dec, step))
    if cfg.decode_tpot_target_s is not None or cfg.decode_tpot_slack is not None:
        targets = [t for t in (cfg.decode_tpot_target_s,) if t is not None]
        if cfg.decode_tpot_slack is not None:
            targets.append((1.0 + cfg.decode_tpot_slack) * step.fixed_s)
        n = decode_instances_for_tpot(expected_seqs(load, kv_tokens), kv_tokens, step, min(targets))
        # A target at or below the empty step cannot be met by any count: KV sizing only.
        out = max(out, n if math.isfinite(n) else 0.0)
    return spread_capped(cfg, load, out) if capped else out


def spread_capped(cfg: AllocatorConfig, load: DecodeLoad, instances: float) -> float:
    """``instances`` of decode demand beyond KV, capped at :meth:`DecodeLoad.spread` with
    ``decode_spread_cap``."""
    return min(instances, load.spread()) if cfg.decode_spread_cap else instances
