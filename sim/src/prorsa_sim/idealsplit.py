"""The per-window ideal P:D split of a run: how many engines prefill and decode need.

For every window of ``S`` seconds (the simulator's ``window_s``, [P] Appendix B: 10 s):

* **prefill, by throughput**: ``W (1 - h) / (S x theta)`` engines, where ``W`` is the window's
  prefill demand (full prompt tokens of the requests queued in it, EVENTS.md's
  ``request.queued``), ``h`` the prefix-cache hit ratio of the prefills finished in it
  (cached / prompt tokens; the last observed value stands in a window with none, as the
  ``engine.stats`` gauge does) and ``theta`` one engine's computed-token prefill throughput
  in full chunks (:meth:`ModelProfile.prefill_time` at ``chunk_size`` new tokens, attending
  to the mean cached prefix of the window's prefills) -- the same full-prompt convention as
  the paper's §4.2 / Appendix B.1: the hit ratio is folded into the speed, not the demand;
* **decode, by KV capacity**: the KV tokens of the sequences decoding when the window closes
  (plus those transferred and waiting for KV space) over one engine's KV capacity
  (:attr:`ModelProfile.kv_capacity_tokens`);
* **decode, by step time**: the sequences decoding over the sequences one engine decodes
  while a step stays within :data:`STEP_TIME_SLACK` of an unloaded step at the same context
  (:meth:`ModelProfile.decode_step_time`);
* decode needs the larger of the two; the **ideal split** of the ``n``-engine budget gives
  prefill ``round(n x p / (p + d))`` engines (at least 1 and at most ``n - 1``), the rest
  decode. Windows with no demand at all (the weight-update pause, an idle tail) have none.

:func:`movement` reports, per rollout step, how far the ideal split moves (max - min
prefill engines over the step's windows, and the 10th-90th percentile range, which one
window alone cannot set): the paper's §3.3 (Fig. 3b/c) within-step swing.
"""

from __future__ import annotations

from prorsa_emulated.costmodel import ModelProfile


STEP_TIME_SLACK = 0.25
"""CHOICE: a decode engine is "full" by step time when its step is 25% slower than an
unloaded one at the same context: past that, more sequences per rank still raise its
throughput but stretch every trajectory's decode (the latency the paper's §3.2 names as
PD's third benefit). The allocator's optional TPOT slack plays the same role."""

_MAX_BATCH = 1 << 16


def prefill_rate_per_engine(profile: ModelProfile, context_tokens: float = 0.0) -> float:
    """Computed (uncached) prefill tokens/s of one engine running full chunks that attend
    to ``context_tokens`` earlier tokens: every attention-DP rank runs one chunk a step."""
    c = profile.chunk_size
    return profile.attn_dp * c / profile.prefill_time(c, int(context_tokens))


def decode_batch_limit(profile: ModelProfile, context_tokens: float, slack: float = STEP_TIME_SLACK) -> int:
    """Largest per-rank batch whose decode step, each sequence holding ``context_tokens``
    KV tokens, is within ``slack`` of a one-sequence step (binary search; >= 1)."""
    ctx = max(1.0, context_tokens)
    limit = (1 + slack) * profile.decode_step_time(1, int(ctx))
    lo, hi = 1, _MAX_BATCH
    if profile.decode_step_time(hi, int(hi * ctx)) <= limit:
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if profile.decode_step_time(mid, int(mid * ctx)) <= limit:
            lo = mid
        else:
            hi = mid
    return lo


def ideal_windows(timeline: list[dict], profile: ModelProfile, n_engines: int, window_s: float,
                  slack: float = STEP_TIME_SLACK) -> list[dict]:
    """Per window of ``timeline`` (the summary's rows): the engines each role needs and the
    ideal split. Rows: t, step, prefill_need, decode_need_kv, decode_need_step,
    decode_need, ideal_prefill (None when the window had no demand)."""
    out = []
    hit = 0.0
    ctx = 0.0
    kv_cap = profile.kv_capacity_tokens
    for w in timeline:
        if w.get("prefills_done"):
            hit = min(1.0, w["prefill_cached_done"] / max(1, w["prefill_prompt_done"]))
            ctx = w["prefill_cached_done"] / w["prefills_done"]
        theta = prefill_rate_per_engine(profile, ctx)
        p = w["prefill_demand"] * (1.0 - hit) / (window_s * theta)
        kv, seqs = w.get("decode_kv_tokens", 0), w.get("decode_seqs", 0)
        d_kv = kv / kv_cap
        d_step = 0.0
        if seqs:
            d_step = seqs / (decode_batch_limit(profile, kv / seqs, slack) * profile.attn_dp)
        d = max(d_kv, d_step)
        ideal = None
        if p + d > 0 and n_engines >= 2:
            ideal = min(n_engines - 1, max(1, round(n_engines * p / (p + d))))
        out.append({
            "t": w["t"], "step": w.get("step", 0), "prefill_need": round(p, 4),
            "decode_need_kv": round(d_kv, 4), "decode_need_step": round(d_step, 4),
            "decode_need": round(d, 4), "ideal_prefill": ideal,
        })
    return out


def movement(rows: list[dict]) -> list[dict]:
    """Per rollout step (rows grouped by ``step``): min, max and max - min of the ideal
    prefill engines over its windows with demand, and the range of the raw needs."""
    steps: dict[int, list[dict]] = {}
    for r in rows:
        if r["ideal_prefill"] is not None:
            steps.setdefault(r["step"], []).append(r)
    out = []
    for s in sorted(steps):
        rs = steps[s]
        ideal = [r["ideal_prefill"] for r in rs]
        p = [r["prefill_need"] for r in rs]
        d = [r["decode_need"] for r in rs]
        lo, hi = _quantile(ideal, 0.1), _quantile(ideal, 0.9)
        out.append({
            "step": s, "windows": len(rs), "ideal_prefill_min": min(ideal), "ideal_prefill_max": max(ideal),
            "moves": max(ideal) - min(ideal),
            # Robust to a single window (e.g. the re-prefill burst right after an update):
            # the 10th-90th percentile range of the ideal prefill engines.
            "moves_p10_p90": hi - lo,
            "prefill_need_max": round(max(p), 3), "decode_need_max": round(max(d), 3),
            "prefill_need_range": round(max(p) - min(p), 3), "decode_need_range": round(max(d) - min(d), 3),
        })
    return out


def _quantile(xs: list[int], q: float) -> int:
    """Nearest-rank quantile (deterministic, no interpolation)."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summarize(rows: list[dict], n_engines: int, slack: float = STEP_TIME_SLACK) -> dict:
    """The summary's ``ideal_split``: per-step movement and its maximum over the measured
    steps (those after the warm-up step when there are any, else all)."""
    per = movement(rows)
    measured = [m for m in per if m["step"] >= 1] or per
    return {
        "budget_engines": n_engines,
        "step_time_slack": slack,
        "per_step": per,
        "moves_max": max((m["moves"] for m in measured), default=0),
        "moves_min": min((m["moves"] for m in measured), default=0),
        "moves_p10_p90_max": max((m["moves_p10_p90"] for m in measured), default=0),
    }
