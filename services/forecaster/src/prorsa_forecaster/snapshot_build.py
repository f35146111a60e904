"""Build a :class:`~prorsa_forecaster.snapshot.Snapshot` from a
:class:`~prorsa_forecaster.state.LiveState` (its public slot arrays and accessors).

Vectorised: one mask per source over the slot arrays.
"""

from __future__ import annotations

import numpy as np

from .snapshot import START_DISPATCHED, Snapshot
from .trajstate import ABORTED, DECODE, PREFILL, QUEUED, REWARD, START, TOOL


def _instance_costs(state, names: list[str | None]) -> list[tuple[float, float, float]]:
    """g = a + b n + d n ctx of each prefill instance: its own model once it has measured
    some prefills, else the pool's (service times measured without engine names), else
    the best-measured engine's (same model, same hardware, in practice), else the prior."""
    h = state.history
    coefs = [h.prefill_model(name).coefficients3() for name in names]
    if names == [None]:
        return coefs
    measured = [h.prefill_model(nm).n > 0 for nm in names]
    if h.pool_prefill.n > 0:
        coefs = [c if m else h.pool_prefill.coefficients3() for c, m in zip(coefs, measured)]
    learnt = [h.prefill_model(nm) for nm, m in zip(names, measured) if m]
    if learnt:
        best = max(learnt, key=lambda model: model.n).coefficients3()
        coefs = [c if m else best for c, m in zip(coefs, measured)]
    return coefs


def build_snapshot(state, t: float) -> Snapshot:
    """The snapshot of ``state`` (a LiveState) at ``t``."""
    n = state.n
    st = state.state[:n]
    h = state.history

    names = state.prefill_instances()
    lookup = state.engine_index(names)  # engine code -> instance index (-1: not a prefill instance)
    coefs = _instance_costs(state, names)

    def inst(mask: np.ndarray) -> np.ndarray:
        codes = state.engine[:n][mask]
        return lookup[np.where(codes >= 0, codes, len(lookup) - 1)]

    reward = st == REWARD
    start = st == START
    ready = st == QUEUED
    tool = st == TOOL
    inflight = st == PREFILL
    decode = st == DECODE
    aborted = st == ABORTED

    cohort = state.cohort[:n]
    pending_mask = (st != 0) & ~reward & (cohort >= 0)
    cohort_pending = np.bincount(cohort[pending_mask], minlength=state.cohorts).astype(float)

    all_growth = np.where(np.isnan(state.growth[:n]), h.tool_growth.value, state.growth[:n])
    growth = all_growth[tool]

    # Expected cached prefixes (the prefill instance keeps a trajectory's last prompt
    # until a weight update flushes it).
    warm = state.cache_ts[:n] > state.last_flush_ts
    cache_prompt = state.cache_prompt[:n]
    prompt = state.prompt[:n]

    # A queued or in-flight request whose engine is known finds its prefix only on the
    # engine that caches it; a future request's engine is not known yet.
    eng, held = state.engine[:n], state.cache_engine[:n]
    routed_back = (eng < 0) | (held < 0) | (eng == held)
    unrouted = ((eng < 0) & (held >= 0)).astype(float)

    def cached(mask: np.ndarray, x: np.ndarray | None = None, routed: bool = True) -> np.ndarray:
        xs = prompt[mask] if x is None else x
        ok = warm[mask] & routed_back[mask] if routed else warm[mask]
        return np.where(ok, np.minimum(cache_prompt[mask], xs), 0.0)

    tool_x = state.context[:n][tool] + np.clip(growth, 0.0, None)
    # The warm hit at the caches' age in the middle of the window (learnt by age).
    age = t + 0.5 * h.config.horizon - state.last_flush_ts
    hit = h.cache_warm_age.value(age)
    pause = max(state.last_update_ts + h.update_pause.value - t, 0.0) if h.update_pause.n else 0.0
    ranks = h.config.use_dp_rank
    effects = h.frailty.active

    def theta(mask: np.ndarray) -> np.ndarray:
        """The effects of the masked slots and the share of their variance resolved, as
        ``(rows, 2)``."""
        if not effects:
            return np.zeros((0, 2))
        th, var = h.frailty.effects(state.tool_calls[:n][mask], state.tool_logsum[:n][mask], state.group[:n][mask])
        return np.stack((th, h.frailty.resolved(var)), axis=1)

    return Snapshot(
        t=t,
        run=state.run,
        reward_elapsed=t - state.entered[:n][reward],
        reward_cohort=cohort[reward].copy(),
        start_elapsed=t - np.where(state.mode[:n][start] == START_DISPATCHED, state.dispatched_at[:n][start], state.mode_at[:n][start]),
        start_mode=state.mode[:n][start].copy(),
        start_prompt=state.dprompt[:n][start].copy(),
        ready_prompt=state.prompt[:n][ready].copy(),
        ready_since=state.queued_at[:n][ready].copy(),
        ready_instance=inst(ready),
        tool_elapsed=t - state.entered[:n][tool],
        tool_context=state.context[:n][tool].copy(),
        tool_growth=growth,
        tool_result=state.result[:n][tool].copy(),
        inflight_prompt=state.prompt[:n][inflight].copy(),
        inflight_started=state.in_flight_begins(inflight),
        inflight_instance=inst(inflight),
        inflight_since=state.queued_at[:n][inflight].copy(),
        ready_growth=all_growth[ready],
        inflight_growth=all_growth[inflight],
        decode_elapsed=t - state.entered[:n][decode],
        decode_prompt=state.prompt[:n][decode].copy(),
        decode_growth=all_growth[decode],
        cohort_pending=cohort_pending,
        aborted_elapsed=t - state.entered[:n][aborted],
        aborted_context=state.context[:n][aborted].copy(),
        aborted_cached=cached(aborted, state.context[:n][aborted], routed=False),
        decode_kv_now=state.decode_kv(),
        decode_live=int(np.count_nonzero(decode)),
        instance_overhead=np.array([c[0] for c in coefs]),
        instance_per_token=np.array([c[1] for c in coefs]),
        instance_per_pair=np.array([c[2] for c in coefs]),
        instance_servers=np.array([state.servers(nm) for nm in names], dtype=np.int64),
        ready_cached=cached(ready),
        inflight_cached=cached(inflight),
        tool_cached=cached(tool, tool_x, routed=False),
        ready_unrouted=unrouted[ready],
        inflight_unrouted=unrouted[inflight],
        prefill_pause=pause if np.isfinite(pause) else 0.0,
        cache_hit=hit,
        cache_hit_unrouted=hit * h.cache_same.value,
        cache_same_table=h.cache_same_size.table(),
        decode_turn=state.turn[:n][decode].copy(),
        ready_turn=state.turn[:n][ready].copy(),
        inflight_turn=state.turn[:n][inflight].copy(),
        tool_turn=state.turn[:n][tool].copy(),
        effects=effects,
        tool_theta=theta(tool),
        decode_theta=theta(decode),
        ready_theta=theta(ready),
        inflight_theta=theta(inflight),
        ready_rank=state.rank[:n][ready].copy() if ranks else np.zeros(0, np.int64),
        inflight_rank=state.rank[:n][inflight].copy() if ranks else np.zeros(0, np.int64),
        tool_turn_table=h.tool_turn_table(),
        next_batch_elapsed=t - state.sync_wait if state.sync_wait is not None else float("nan"),
        cache_cold=h.cache_cold.value,
        live=state.live,
        update_elapsed=t - state.update_trigger if state.update_trigger is not None else float("nan"),
        since_update=t - state.last_update_ts if np.isfinite(state.last_update_ts) else float("nan"),
    )
