"""Property: whatever the snapshot holds (NaN, inf, negatives, huge), a forecast is finite
and never negative."""

import dataclasses
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.core import forecast
from prorsa_forecaster.history import History
from prorsa_forecaster.snapshot import RunInfo, Snapshot

anyf = st.floats(allow_nan=True, allow_infinity=True, width=64)
sizes = st.integers(0, 6)


def arr(draw, n, elements=anyf):
    return np.array(draw(st.lists(elements, min_size=n, max_size=n)), dtype=float)


def turns(draw, n):
    """A turn (or DP rank) column: present (any value, negative and huge included) or
    left empty."""
    if not draw(st.booleans()):
        return np.zeros(0, int)
    return np.array(draw(st.lists(st.integers(-5, 10**9), min_size=n, max_size=n)), dtype=int)


@st.composite
def snapshots(draw):
    t = draw(st.floats(0, 1e9))
    n = [draw(sizes) for _ in range(6)]
    m = draw(st.integers(1, 3))
    ints = st.integers(-2, 4)
    return Snapshot(
        t=t,
        run=RunInfo(injection=draw(st.sampled_from(["replace", "group"])), mode=draw(st.sampled_from(["sync", "async"]))),
        reward_elapsed=arr(draw, n[0]), reward_cohort=np.array(draw(st.lists(ints, min_size=n[0], max_size=n[0])), dtype=int),
        start_elapsed=arr(draw, n[1]), start_mode=np.array(draw(st.lists(st.integers(0, 3), min_size=n[1], max_size=n[1])), dtype=int),
        start_prompt=arr(draw, n[1]),
        ready_prompt=arr(draw, n[2]), ready_since=arr(draw, n[2]),
        ready_instance=np.array(draw(st.lists(ints, min_size=n[2], max_size=n[2])), dtype=int), ready_growth=arr(draw, n[2]),
        tool_elapsed=arr(draw, n[3]), tool_context=arr(draw, n[3]), tool_growth=arr(draw, n[3]), tool_result=arr(draw, n[3]),
        inflight_prompt=arr(draw, n[4]), inflight_started=arr(draw, n[4]),
        inflight_instance=np.array(draw(st.lists(ints, min_size=n[4], max_size=n[4])), dtype=int),
        inflight_since=arr(draw, n[4]), inflight_growth=arr(draw, n[4]),
        decode_elapsed=arr(draw, n[5]), decode_prompt=arr(draw, n[5]), decode_growth=arr(draw, n[5]),
        cohort_pending=arr(draw, draw(st.integers(0, 4)), st.floats(0, 5)),
        decode_kv_now=draw(anyf),
        instance_overhead=arr(draw, m), instance_per_token=arr(draw, m),
        # The optional columns: present (any values) or left empty.
        ready_cached=arr(draw, n[2] if draw(st.booleans()) else 0),
        inflight_cached=arr(draw, n[4] if draw(st.booleans()) else 0),
        tool_cached=arr(draw, n[3] if draw(st.booleans()) else 0),
        instance_per_pair=arr(draw, m if draw(st.booleans()) else 0),
        instance_servers=np.array(draw(st.lists(st.integers(-3, 40), min_size=m, max_size=m)), dtype=int)
        if draw(st.booleans()) else np.zeros(0, int),
        ready_unrouted=arr(draw, n[2] if draw(st.booleans()) else 0),
        inflight_unrouted=arr(draw, n[4] if draw(st.booleans()) else 0),
        cache_hit_unrouted=draw(anyf), cache_same_table=arr(draw, draw(st.integers(0, 40))),
        prefill_pause=draw(anyf), cache_hit=draw(anyf), cache_cold=draw(anyf), next_batch_elapsed=draw(anyf),
        update_elapsed=draw(anyf),
        decode_turn=turns(draw, n[5]), ready_turn=turns(draw, n[2]), inflight_turn=turns(draw, n[4]),
        tool_turn=turns(draw, n[3]), tool_turn_table=arr(draw, draw(st.integers(0, 25))),
        ready_rank=turns(draw, n[2]), inflight_rank=turns(draw, n[4]),
        # The group and trajectory effects (frailty.py): carried (any values) or not.
        **({"effects": True, "tool_theta": arr(draw, 2 * n[3]).reshape(-1, 2),
            "decode_theta": arr(draw, 2 * n[5]).reshape(-1, 2), "ready_theta": arr(draw, 2 * n[2]).reshape(-1, 2),
            "inflight_theta": arr(draw, 2 * n[4]).reshape(-1, 2)} if draw(st.booleans()) else {}),
    )


closed = st.lists(st.tuples(anyf, anyf, anyf), max_size=8)


@settings(max_examples=300, deadline=None)
@given(snapshots(), st.floats(0.5, 60), st.one_of(st.none(), st.tuples(st.floats(0, 1e4), anyf, st.floats(0, 1))), closed)
def test_forecast_is_finite_and_non_negative(snap, horizon, update, windows):
    cfg = ForecastConfig(horizon=horizon)
    hist = History(cfg)
    for f_, a, b in windows:
        # Closed windows of any values: the blends' weights, scales and naive predictors.
        hist.correction.prefill_blend.close(f_, a)
        hist.correction.decode_blend.close(b, a)
        hist.correction.new.close(f_, b)
    if update is not None:
        # A trigger -> update delay and a weight-sync pause seen once, and an update
        # pending that lands inside the window: the re-prefill, the cut turns and the
        # update mixture all run.
        delay, pause, where = update
        hist.train.observe(delay)
        hist.update_pause.observe(pause)
        snap = dataclasses.replace(snap, update_elapsed=max(delay - where * horizon, 0.0))
    f = forecast(snap, hist, cfg)
    values = [f.prefill_tokens, f.decode_admit_tokens, f.decode_kv_tokens, f.decode_kv_now, *f.components.values(),
              f.model_prefill, f.model_decode, *(w for ws in f.weights.values() for w in ws.values())]
    assert all(math.isfinite(v) and v >= 0 for v in values), f
    assert math.isfinite(f.bias)
