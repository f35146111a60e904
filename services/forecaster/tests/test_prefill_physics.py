"""Decode admissions under the prefill physics the forecaster models, on hand-computed
cases: data-parallel queues, computed (uncached) tokens and attention, cache hit/miss,
each predicted request's own prefill time, the weight-sync pause; and how the fold
learns them from events."""

import copy
import math

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.terms.common import N_CLASSES, request_loads, request_rows
from prorsa_forecaster.terms.decode_admit import PendingUpdate, decode_admissions, decode_admissions_split
from prorsa_forecaster.terms.known_queue import known_queue
from prorsa_forecaster.history import AgeBinnedRatio, Ratio, SizeBinnedRatio
from prorsa_forecaster.terms.prefill_queue import PrefillTimeModel
from prorsa_forecaster.snapshot import RunInfo, Snapshot
from prorsa_forecaster.state import QUEUED, LiveState
from prorsa_schemas import EVENT_TYPES

CFG = ForecastConfig(horizon=10.0, steps=10, bias_half_life=0)
NONE = np.zeros((4, N_CLASSES, 10))


def ready(*prompts: float, **extra) -> dict:
    n = len(prompts)
    return dict(
        ready_prompt=np.array(prompts, float), ready_since=np.linspace(-1.0, -0.1, n),
        ready_instance=np.zeros(n, int), ready_growth=np.zeros(n), **extra,
    )


def one_instance(servers: int = 1, per_token: float = 0.001, per_pair: float = 0.0) -> dict:
    return dict(
        instance_overhead=np.array([0.0]), instance_per_token=np.array([per_token]),
        instance_per_pair=np.array([per_pair]), instance_servers=np.array([servers]),
    )


def test_data_parallel_queues_serve_at_once():
    # Two 6000-token prompts at 1 ms/token: 6 s each. One queue: 6 s and 12 s; two
    # data-parallel queues: both at 6 s.
    one, _ = decode_admissions(Snapshot(t=0.0, **ready(6000, 6000), **one_instance(1)), CFG, NONE)
    two, _ = decode_admissions(Snapshot(t=0.0, **ready(6000, 6000), **one_instance(2)), CFG, NONE)
    assert one == pytest.approx(6000) and two == pytest.approx(12000)


def test_only_uncached_tokens_are_computed_and_attention_counts():
    # 20000-token prompt, 18000 cached (hit certain): 2000 new tokens x 1 ms = 2 s, plus
    # attention 2000 x (18000 + 1000) pairs x 1e-7 s = 3.8 s: 5.8 s < 10 s.
    base = dict(**ready(20000, ready_cached=np.array([18000.0])), cache_hit=1.0)
    f, _ = decode_admissions(Snapshot(t=0.0, **base, **one_instance(1, 0.001, 1e-7)), CFG, NONE)
    assert f == pytest.approx(20000)
    # Without the cache the same prompt takes 20 s + 20 s of attention: not admitted.
    cold, _ = decode_admissions(Snapshot(t=0.0, **ready(20000), **one_instance(1, 0.001, 1e-7)), CFG, NONE)
    assert cold == 0.0


def test_a_cache_miss_may_miss_the_window():
    # Hit: 1000 new tokens, 1 s; miss: 20000 tokens, 20 s. Hit probability 0.25.
    snap = Snapshot(t=0.0, **ready(20000, ready_cached=np.array([19000.0])), cache_hit=0.25, **one_instance(1))
    f, _ = decode_admissions(snap, CFG, NONE)
    assert f == pytest.approx(0.25 * 20000)


def test_in_flight_past_its_hit_time_has_missed():
    # Started 3 s ago; a hit would have taken 1 s, so it missed: 20 s in all, 17 s left.
    snap = Snapshot(
        t=10.0, inflight_prompt=np.array([20000.0]), inflight_started=np.array([7.0]),
        inflight_instance=np.array([0]), inflight_since=np.array([6.0]), inflight_growth=np.zeros(1),
        inflight_cached=np.array([19000.0]), cache_hit=0.9, **one_instance(1),
    )
    f, _ = decode_admissions(snap, CFG, NONE)
    assert f == 0.0


def test_predicted_requests_take_their_own_prefill_time():
    # One predicted request of 12000 uncached tokens (12 s) arriving in the first
    # sub-step on an idle 8-queue instance: it cannot finish in the window, however
    # idle the other queues are.
    fut = np.zeros((4, N_CLASSES, 10))
    load = request_loads(np.array([12000.0]))[0]
    fut[:, N_CLASSES - 1, 0] = load
    f, _ = decode_admissions(Snapshot(t=0.0, **one_instance(8)), CFG, fut)
    assert f == 0.0
    # A 2000-token one (2 s) arriving at 0.5 s does.
    fut = np.zeros((4, N_CLASSES, 10))
    fut[:, 5, 0] = request_loads(np.array([2000.0]))[0]
    f, _ = decode_admissions(Snapshot(t=0.0, **one_instance(8)), CFG, fut)
    assert f == pytest.approx(2000)


def test_weight_sync_pause_delays_prefill():
    # 3 s of prefill; with an 8 s pause first it ends at 11 s.
    f, _ = decode_admissions(Snapshot(t=0.0, **ready(3000), **one_instance(1)), CFG, NONE)
    paused, _ = decode_admissions(Snapshot(t=0.0, **ready(3000), prefill_pause=8.0, **one_instance(1)), CFG, NONE)
    assert f == pytest.approx(3000) and paused == 0.0


def test_prefill_time_model_learns_computed_tokens_and_attention():
    m = PrefillTimeModel(prior_weight=1.0, half_life=1e9)
    rng = np.random.default_rng(0)
    for _ in range(600):
        x = float(rng.uniform(1000, 60000))
        c = float(rng.uniform(0, x - 500)) if rng.random() < 0.7 else 0.0
        n = x - c
        m.observe(x, 0.02 + 2e-4 * n + 2e-9 * n * (c + n / 2), cached=c)
    a, b, d = m.coefficients3()
    assert a == pytest.approx(0.02, abs=0.01)
    assert b == pytest.approx(2e-4, rel=0.02) and d == pytest.approx(2e-9, rel=0.02)


def _ev(type_, ts, **f):
    _ev.k = getattr(_ev, "k", 0) + 1
    return EVENT_TYPES[type_](id=f"p{_ev.k}", ts=ts, run="r", **f)


def test_fold_learns_cache_hits_servers_and_the_pause():
    st = LiveState(ForecastConfig())
    st.apply(_ev("engine.registered", 0.0, engine="p0", server="s", role="prefill", gpus=16,
                 kv_capacity_tokens=10**6, parallel={"attn_dp": 16}))
    for i in range(4):
        t = f"t{i}"
        st.apply(_ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", 1.0, traj=t, req=f"{t}a", turn=0, prompt_tokens=1000, engine="p0"))
        st.apply(_ev("prefill.finished", 2.0, traj=t, req=f"{t}a", engine="p0", cached_tokens=0))
        st.apply(_ev("decode.finished", 3.0, traj=t, req=f"{t}a", output_tokens=100, finish="tool"))
        # Second turn: half of them find the previous prompt cached.
        st.apply(_ev("request.queued", 4.0, traj=t, req=f"{t}b", turn=1, prompt_tokens=1500, engine="p0"))
        st.apply(_ev("prefill.finished", 5.0, traj=t, req=f"{t}b", engine="p0", cached_tokens=1000 if i % 2 else 0))
    h = st.history
    assert st.servers("p0") == 16
    # Two hits of 1000 over 4 x 1000 cacheable tokens, after a prior of 0 over 1000.
    assert h.cache_warm.value == pytest.approx(2000 / (1000 + 4000), rel=0.01)
    assert h.cache_cold.value == 0.0
    snap = st.snapshot(6.0)
    assert list(snap.instance_servers) == [16]
    # Queue one request, start its prefill, then a weight update: it starts over after
    # the pause (learnt from the first prefill progress afterwards), and nothing is cached.
    st.apply(_ev("decode.finished", 6.0, traj="t1", req="t1b", output_tokens=10, finish="tool"))
    st.apply(_ev("request.queued", 7.0, traj="t1", req="t1c", turn=2, prompt_tokens=2000, engine="p0"))
    assert st.snapshot(7.5).ready_cached[0] == 1500.0
    st.apply(_ev("prefill.started", 7.5, traj="t1", req="t1c", engine="p0"))
    st.apply(_ev("policy.updated", 8.0, version=1))
    assert st.state[st.slot("r", "t1")] == QUEUED
    snap = st.snapshot(9.0)
    assert snap.ready_cached[0] == 0.0 and len(snap.inflight_prompt) == 0
    st.apply(_ev("prefill.started", 13.0, traj="t1", req="t1c", engine="p0"))
    assert h.update_pause.value == pytest.approx(5.0)
    assert st.snapshot(20.0).prefill_pause == 0.0 and st.snapshot(10.0).prefill_pause == pytest.approx(3.0)


def test_an_update_that_lets_the_requests_in_flight_go_on_keeps_the_caches():
    """SGLang refuses to flush an engine that holds a request, so where the framework
    pauses in place or retracts (few decodes under way at an update end in an abort)
    the caches outlive the update; where it aborts them (the prior) they do not."""
    for cut, kept in (((1.0, 1.0), False), ((1.0, 11.0), True)):
        st = LiveState(ForecastConfig())
        st.history.cut, st.history.cut_ends = cut
        st.apply(_ev("trajectory.dispatched", 0.0, traj="t", prompt_tokens=1000))
        st.apply(_ev("request.queued", 1.0, traj="t", req="a", turn=0, prompt_tokens=1000))
        st.apply(_ev("prefill.finished", 2.0, traj="t", req="a", cached_tokens=0))
        st.apply(_ev("decode.finished", 3.0, traj="t", req="a", output_tokens=100, finish="tool"))
        st.apply(_ev("request.queued", 4.0, traj="t", req="b", turn=1, prompt_tokens=1500))
        assert st.snapshot(4.5).ready_cached[0] == 1000.0
        st.apply(_ev("policy.updated", 5.0, version=1))
        assert st.snapshot(6.0).ready_cached[0] == (1000.0 if kept else 0.0)
        # Its prefill after the update is learnt as a warm request's (of the cache the
        # trajectory held) or as a cold one's (of its whole prompt).
        st.apply(_ev("prefill.finished", 7.0, traj="t", req="b", cached_tokens=1000))
        h = st.history
        assert (h.cache_warm.value > 0.0, h.cache_cold.value > 0.0) == (kept, not kept)


def test_the_pause_is_not_ended_by_a_prefill_that_finishes_before_the_engines_stop():
    """A framework that publishes policy.updated and then pauses its engines: a request in
    prefill at the update may finish before they stop (no prefill.started in the log).
    The pause ends with the first prefill of a request queued after the update (an
    aborted decode re-queued), not with those, less that prefill's own time: the engines
    resumed that long before it finished."""
    st = LiveState(ForecastConfig())
    for t, q in (("a", 1.0), ("b", 1.0)):
        st.apply(_ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", q, traj=t, req=f"{t}1", turn=0, prompt_tokens=1000))
    st.apply(_ev("prefill.finished", 2.0, traj="b", req="b1", cached_tokens=0))
    st.apply(_ev("policy.updated", 10.0, version=1))
    st.apply(_ev("prefill.finished", 10.05, traj="a", req="a1", cached_tokens=0))  # before the engines stop
    st.apply(_ev("decode.finished", 10.1, traj="b", req="b1", output_tokens=50, finish="abort"))
    st.apply(_ev("request.queued", 10.12, traj="b", req="b2", turn=0, prompt_tokens=1050))
    assert st.history.update_pause.n == 0
    g = float(st.history.prefill_model(None).g(np.array([1050.0]), 0.0)[0])  # b2's prefill time
    st.apply(_ev("prefill.finished", 11.7, traj="b", req="b2", cached_tokens=0))
    assert 0.0 < g < 1.7
    assert st.history.update_pause.n == 1 and st.history.update_pause.value == pytest.approx(1.7 - g)


def test_a_prefill_with_no_start_is_timed_from_the_pause_end():
    """Behind a router the log has no prefill.started. The decodes a weight update aborts
    are re-queued at once and wait through the weight sync; that wait is not prefill time.
    The pause ends at the first prefill after the update less its own prefill time, and
    the next one's prefill is timed from there at the earliest, not from its queueing."""
    st = LiveState(ForecastConfig())
    st.apply(_ev("engine.registered", 0.0, engine="p0", server="s", role="prefill", gpus=16,
                 kv_capacity_tokens=10**6, parallel={"attn_dp": 16}))
    for t in ("a", "b"):
        st.apply(_ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", 1.0, traj=t, req=f"{t}1", turn=0, prompt_tokens=1000))
        st.apply(_ev("prefill.finished", 2.0, traj=t, req=f"{t}1", engine="p0", cached_tokens=0))
    st.apply(_ev("policy.updated", 10.0, version=1))
    for t, x in (("a", 1050), ("b", 1200)):
        st.apply(_ev("decode.finished", 10.1, traj=t, req=f"{t}1", output_tokens=50, finish="abort"))
        st.apply(_ev("request.queued", 10.12, traj=t, req=f"{t}2", turn=0, prompt_tokens=x))
    model = st.history.prefill_model("p0")
    g_a = float(model.g(np.array([1050.0]), 0.0)[0])
    st.apply(_ev("prefill.finished", 11.7, traj="a", req="a2", engine="p0", cached_tokens=0))
    assert st.resumed_ts == pytest.approx(11.7 - g_a) and 10.12 < st.resumed_ts < 11.7
    # b's prefill: 12.4 - (11.7 - g_a) seconds, not 12.4 - 10.12 (16 ranks: no earlier
    # departure holds its queue).
    ref, through_pause = copy.deepcopy(model), copy.deepcopy(model)
    ref.observe(1200.0, 12.4 - st.resumed_ts, 0.0)
    through_pause.observe(1200.0, 12.4 - 10.12, 0.0)
    st.apply(_ev("prefill.finished", 12.4, traj="b", req="b2", engine="p0", cached_tokens=0))
    assert model.coefficients3() == pytest.approx(ref.coefficients3())
    assert model.g(np.array([1200.0]), 0.0)[0] < through_pause.g(np.array([1200.0]), 0.0)[0]


def test_sync_run_predicts_the_next_batch_after_an_update():
    from prorsa_forecaster.core import forecast

    st = LiveState(ForecastConfig())
    st.apply(_ev("run.started", 0.0, mode="sync", batch_size=4, prompt_tokens_mean=1000))
    for i in range(4):
        t = f"b{i}"
        st.apply(_ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", 1.0, traj=t, req=f"{t}a", turn=0, prompt_tokens=1000))
        st.apply(_ev("prefill.finished", 2.0, traj=t, req=f"{t}a"))
        st.apply(_ev("decode.finished", 3.0, traj=t, req=f"{t}a", output_tokens=10, finish="stop"))
        st.apply(_ev("reward.finished", 4.0, traj=t, admitted=True))
    assert forecast(st.snapshot(40.0), st.history).components["sampler"] == 0.0
    st.apply(_ev("policy.updated", 40.0, version=1))
    snap = st.snapshot(41.0)
    assert snap.next_batch_elapsed == pytest.approx(1.0) and snap.run == RunInfo(mode="sync", batch_size=4, prompt_tokens_mean=1000)
    f = forecast(snap, st.history)
    assert 0 < f.components["sampler"] <= 4 * 1000
    # Once the batch is out, the start-up component takes over.
    st.apply(_ev("trajectory.dispatched", 44.0, traj="n0", prompt_tokens=1000))
    assert np.isnan(st.snapshot(45.0).next_batch_elapsed)


def test_prefix_cache_lives_on_one_engine():
    st = LiveState(ForecastConfig())
    for e in ("p0", "p1"):
        st.apply(_ev("engine.registered", 0.0, engine=e, server=e, role="prefill", gpus=8, kv_capacity_tokens=10**6))
    # Eight trajectories, two turns each; the second turn goes back to the first turn's
    # engine for half of them (and finds the prefix: 1000 cached), elsewhere for the rest
    # (nothing cached there).
    for i in range(8):
        t, first = f"t{i}", ("p0", "p1")[i % 2]
        back = i < 4
        second = first if back else ("p1", "p0")[i % 2]
        st.apply(_ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", 1.0, traj=t, req=f"{t}a", turn=0, prompt_tokens=1000, engine=first))
        st.apply(_ev("prefill.finished", 2.0, traj=t, req=f"{t}a", engine=first, cached_tokens=0))
        st.apply(_ev("decode.finished", 3.0, traj=t, req=f"{t}a", output_tokens=100, finish="tool"))
        st.apply(_ev("request.queued", 4.0, traj=t, req=f"{t}b", turn=1, prompt_tokens=1500, engine=second))
        st.apply(_ev("prefill.finished", 5.0, traj=t, req=f"{t}b", engine=second, cached_tokens=1000 if back else 0))
    h = st.history
    # Learnt on the routed-back requests alone: every one of them hit (prior 0 over 1000).
    assert h.cache_warm.value == pytest.approx(4000 / (1000 + 4000), rel=0.01)
    assert h.cache_same.value == pytest.approx((1 + 4) / (1 + 8), rel=0.01)
    # A third turn queued at the engine that caches the prefix is warm; at the other, cold;
    # with no engine named, warm but hitting only with P(routed back).
    for i, engine in ((0, "p0"), (2, "p1"), (4, None)):
        t = f"t{i}"
        st.apply(_ev("decode.finished", 6.0, traj=t, req=f"{t}b", output_tokens=10, finish="tool"))
        st.apply(_ev("request.queued", 7.0, traj=t, req=f"{t}c", turn=2, prompt_tokens=2000,
                     **({"engine": engine} if engine else {})))
    snap = st.snapshot(8.0)
    order = [st._req[st.slot("r", f"t{i}")] for i in (0, 2, 4)]
    assert order == ["t0c", "t2c", "t4c"]
    assert list(snap.ready_cached) == [1500.0, 0.0, 1500.0]
    assert list(snap.ready_unrouted) == [0.0, 0.0, 1.0]
    assert snap.cache_hit_unrouted == pytest.approx(h.cache_warm.value * h.cache_same.value)
    # By size: all eight warm requests had a 1000-token prefix (bin 9, [512, 1024)): 4 of
    # 8 went back there, shrunk towards the pooled share by 20 pseudo-observations; a bin
    # never seen answers the pooled share.
    pooled = (1 + 4) / (1 + 8)
    assert snap.cache_same_table[9] == pytest.approx((4 + 20 * pooled) / (8 + 20), rel=0.01)
    assert snap.cache_same_table[14] == pytest.approx(pooled, rel=0.01)


def test_a_request_without_an_engine_hits_like_a_future_one():
    # Hit: 1000 new tokens, 1 s; miss: 20000 tokens, 20 s. Routed back: hit certain; a
    # request whose engine is unknown is routed back with probability 0.4.
    base = dict(**ready(20000, ready_cached=np.array([19000.0])), cache_hit=1.0, cache_hit_unrouted=0.4,
                **one_instance(1))
    known, _ = decode_admissions(Snapshot(t=0.0, **base, ready_unrouted=np.array([0.0])), CFG, NONE)
    unknown, _ = decode_admissions(Snapshot(t=0.0, **base, ready_unrouted=np.array([1.0])), CFG, NONE)
    assert known == pytest.approx(20000) and unknown == pytest.approx(0.4 * 20000)


def test_predicted_requests_arrive_through_their_sub_step():
    # One window, one sub-step: a 4000-token request (4 s) expected in [0, 10) on an idle
    # queue arrives uniformly through it, so it is admitted if it arrives before 6 s:
    # 60% of its tokens (placed at the sub-step's middle, 5 s, it would always be).
    cfg = ForecastConfig(horizon=10.0, steps=1, bias_half_life=0)
    fut = np.zeros((4, N_CLASSES, 1))
    fut[:, 8, 0] = request_loads(np.array([4000.0]))[0]
    f, _ = decode_admissions(Snapshot(t=0.0, **one_instance(1)), cfg, fut)
    assert f == pytest.approx(0.6 * 4000)
    # Two of them: 8 s of work arriving at 0.8 s per second, which the queue keeps up
    # with; the request at position phi of the work starts at max(8 phi, 10 phi), its
    # arrival binds: still 60%.
    fut[:, 8, 0] = request_loads(np.array([4000.0, 4000.0])).sum(axis=0)
    f, _ = decode_admissions(Snapshot(t=0.0, **one_instance(1)), cfg, fut)
    assert f == pytest.approx(0.6 * 8000)
    # Four of them (16 s of work): the queue binds, 16 phi + 4 <= 10: phi <= 0.375 (the
    # fluid smears each request over its share of the work).
    fut[:, 8, 0] = request_loads(np.full(4, 4000.0)).sum(axis=0)
    f, _ = decode_admissions(Snapshot(t=0.0, **one_instance(1)), cfg, fut)
    assert f == pytest.approx(0.375 * 16000)


def test_routed_back_share_by_prefix_size():
    # Hit rate 0.9 once routed back; routed back 50% overall, 80% for prefixes in
    # [1024, 2048) and 20% in [16384, 32768).
    table = np.full(20, 0.5)
    table[10], table[14] = 0.8, 0.2
    snap = Snapshot(t=0.0, cache_hit=0.9, cache_hit_unrouted=0.45, cache_same_table=table)
    assert snap.unrouted_hit([1500.0, 20000.0, 300.0]) == pytest.approx([0.72, 0.18, 0.45])
    # Without the table: one share for every size; without engines: the plain hit rate.
    assert Snapshot(t=0.0, cache_hit=0.9, cache_hit_unrouted=0.45).unrouted_hit([1500.0]) == pytest.approx([0.45])
    assert Snapshot(t=0.0, cache_hit=0.9, cache_same_table=table).unrouted_hit([1500.0]) == pytest.approx([0.9])
    # A future request's cache outcome uses its own prefix's share: the 1500-token
    # prefix of a 2000-token prompt (500 new tokens, 0.5 s) hits with 0.72, else misses
    # (2 s): both finish in the window; its load rows split 0.72 / 0.28.
    hit_rows, miss_rows = request_rows(np.array([2000.0]), np.array([1500.0]), snap.unrouted_hit([1500.0]))
    assert hit_rows[0, 0] == pytest.approx(0.72) and miss_rows[0, 0] == pytest.approx(0.28)
    assert hit_rows[0, 2] == pytest.approx(0.72 * 500) and miss_rows[0, 2] == pytest.approx(0.28 * 2000)


def test_size_binned_ratio_shrinks_each_bin_towards_the_pooled_share():
    pooled = Ratio(1.0, 1.0, half_life=math.inf)
    r = SizeBinnedRatio(pooled, pseudo=20.0, half_life=math.inf)
    for _ in range(10):
        r.observe(20.0, 0.0, 1.0)  # bin 4: [16, 32)
        r.observe(1500.0, 1.0, 1.0)  # bin 10
    p = (1 + 10) / (1 + 20)
    table = r.table()
    assert pooled.value == pytest.approx(p)
    assert table[4] == pytest.approx((0 + 20 * p) / (10 + 20))
    assert table[10] == pytest.approx((10 + 20 * p) / (10 + 20))
    assert table[20] == pytest.approx(p)
    # inf pseudo-observations: the pooled share everywhere; bad input is ignored.
    r.observe(float("nan"), 1.0, 1.0)
    r.observe(20.0, float("inf"), 1.0)
    assert SizeBinnedRatio(pooled, pseudo=math.inf).table() == pytest.approx(np.full(SizeBinnedRatio.BINS, pooled.value))


def test_age_binned_ratio_shrinks_each_age_bin_towards_the_pooled_share():
    # Two bins a doubling: 5 s is bin floor(2 log2 5) = 4, 100 s bin 13, under 2 s bin 0.
    assert [AgeBinnedRatio.bin_of(a) for a in (0.0, 1.9, 5.0, 100.0, 1e9)] == [0, 1, 4, 13, AgeBinnedRatio.BINS - 1]
    pooled = Ratio(0.0, 1000.0, half_life=math.inf)
    r = AgeBinnedRatio(pooled, pseudo=20.0, half_life=math.inf)
    for _ in range(4):
        r.observe(5.0, 0.0, 1000.0)  # young caches: nothing found
        r.observe(100.0, 1000.0, 1000.0)  # settled: all of it
    r.observe(math.inf, 1000.0, 1000.0)  # before any update: the pooled ratio alone
    p = 5000 / 10000
    assert pooled.value == pytest.approx(p)
    assert r.value(5.5) == pytest.approx((4 * 0.0 + 20 * p) / (4 + 20))
    assert r.value(100.0) == pytest.approx((4 * 1.0 + 20 * p) / (4 + 20))
    assert r.value(30.0) == pytest.approx(p)  # a bin never seen
    assert r.value(math.inf) == pytest.approx(p) and r.value(math.nan) == pytest.approx(p)
    # inf pseudo-observations: one ratio at every age. An age that is not a number feeds
    # the pooled ratio alone, and a bad ratio nothing.
    assert AgeBinnedRatio(pooled, pseudo=math.inf).value(5.0) == pytest.approx(p)
    r.observe(math.nan, 0.0, 1000.0)
    r.observe(5.0, math.inf, 1000.0)
    p = 5000 / 11000
    assert pooled.value == pytest.approx(p)
    assert r.value(5.5) == pytest.approx((4 * 0.0 + 20 * p) / (4 + 20))


def test_the_warm_hit_is_learnt_by_the_caches_age():
    # Update at 10 s flushes every cache. Each trajectory re-prefills cold at 12 s; its
    # next turn is warm: four finish prefill 5 s after the update and find nothing of
    # their 1000-token prefix, four finish 100 s after it and find all of it.
    st = LiveState(ForecastConfig())
    st.apply(_ev("policy.updated", 10.0, version=1))
    for i in range(8):
        t, end = f"t{i}", (15.0 if i < 4 else 110.0)
        st.apply(_ev("trajectory.dispatched", 11.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", 11.0, traj=t, req=f"{t}a", turn=0, prompt_tokens=1000))
        st.apply(_ev("prefill.finished", 12.0, traj=t, req=f"{t}a", cached_tokens=0))
        st.apply(_ev("decode.finished", 13.0, traj=t, req=f"{t}a", output_tokens=100, finish="tool"))
        st.apply(_ev("request.queued", end - 1.0, traj=t, req=f"{t}b", turn=1, prompt_tokens=1500))
        st.apply(_ev("prefill.finished", end, traj=t, req=f"{t}b", cached_tokens=0 if i < 4 else 1000))
    h = st.history
    p = h.cache_warm.value  # prior 0 over 1000 tokens, then 4 x 0 and 4 x 1000 of 1000
    assert p == pytest.approx(4000 / 9000, rel=0.01)
    # A forecast reads the bin of the caches' age in the middle of its window (S = 10 s):
    # 5 s after the next update, and 100 s after it.
    st.apply(_ev("policy.updated", 200.0, version=2))
    young, settled = st.snapshot(200.0), st.snapshot(295.0)
    assert young.cache_hit == pytest.approx((4 * 0.0 + 20 * p) / 24, rel=0.01)
    assert settled.cache_hit == pytest.approx((4 * 1.0 + 20 * p) / 24, rel=0.01)
    assert settled.cache_hit_unrouted == pytest.approx(settled.cache_hit * h.cache_same.value)


def test_an_update_in_the_window_pauses_prefill_and_restarts_it_cold():
    # Two queued 2000-token prompts at 1 ms/token on one server: done at 2 s and 4 s.
    # An update at 3.5 s (sub-step 3) admits the first; prefill resumes at 3.5 + 4 =
    # 7.5 s, cold, with 2.5 s left: the second (2 s) again, and the 3000-token
    # re-prefill (3 s) is still in prefill at 10 s, so none of it is admitted.
    snap = Snapshot(t=0.0, **ready(2000, 2000), **one_instance(1))
    plain, _ = decode_admissions(snap, CFG, NONE)
    assert plain == pytest.approx(4000)
    p = np.zeros(10)
    p[3] = 1.0
    reprefill = np.array([1.0, 3000.0, 3000.0, 0.0])
    known, arriving, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 4.0, reprefill))
    assert known == pytest.approx(2000 + 2000) and arriving == 0.0
    # Landing in the window with probability 1/2: the mixture of the two, here the same.
    half, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p / 2, 4.0, reprefill))
    assert half == pytest.approx(0.5 * 4000 + 0.5 * 4000)
    # With a 1 s pause it ends at 9.5 s: admitted whole.
    short, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 1.0, reprefill))
    assert short == pytest.approx(2000 + 2000 + 3000)
    # A pause past the window's end: only what finished before the update.
    long, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 7.0, reprefill))
    assert long == pytest.approx(2000)


def test_an_update_that_flushes_no_cache_restarts_the_prefills_warm():
    # Two queued 8000-token prompts, 6000 of each cached (a sure hit), at 1 ms/token on
    # one server: 2 s each warm, 8 s cold. An update in sub-step 0 (at its middle, 0.5 s,
    # nothing done yet) with a 4 s pause: prefill resumes at 4.5 s with 5.5 s left.
    # Paused in place (the engines hold requests, so SGLang flushes no cache) the line
    # restarts warm, 4 s: both admitted. Flushed (a framework that aborts what runs) it
    # restarts cold, 16 s: of the 5.5 s, the 4 s the length-biased request in service
    # has had on average (E[s^2] / 2 E[s] = 2 x 64 / 32) are not admitted, so 1.5 s of
    # the 16 s line is: 1500 tokens.
    p = np.zeros(10)
    p[0] = 1.0
    snap = Snapshot(t=0.0, **ready(8000, 8000, ready_cached=np.array([6000.0, 6000.0])), cache_hit=1.0,
                    **one_instance(1))
    assert decode_admissions(snap, CFG, NONE)[0] == pytest.approx(16000)
    warm, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 4.0, np.zeros(4), flush=0.0))
    assert warm == pytest.approx(16000)
    cold, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 4.0, np.zeros(4), flush=1.0))
    assert cold == pytest.approx(1500)


def test_after_an_update_the_requests_still_in_prefill_at_the_end_are_not_admitted():
    # Eight servers, sixty queued cold 1000-token prompts at 1 ms/token (1 s each), an
    # update at 0.5 s (sub-step 0, nothing done yet) with a 4 s pause: the servers work
    # the line from 4.5 s on, 5.5 s each, 44 server-seconds for 60 s of work. Each
    # server then holds a request half done at 10 s: min(E[s^2] / 2 E[s] = 0.5 s, the
    # 5.5 s each has left) = 0.5 s of its 5.5 is not admitted, so 40 prompts are (five
    # whole ones a server, as it is); the fluid alone would count 44.
    p = np.zeros(10)
    p[0] = 1.0
    snap = Snapshot(t=0.0, **ready(*([1000.0] * 60)), **one_instance(8))
    known, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 4.0, np.zeros(4)))
    assert known == pytest.approx(40 * 1000.0)
    # A line that ends inside the window leaves nothing in service: all of 40 prompts
    # are admitted (40 of the 44 server-seconds).
    snap = Snapshot(t=0.0, **ready(*([1000.0] * 40)), **one_instance(8))
    known, _, _, _ = decode_admissions_split(snap, CFG, NONE, PendingUpdate(p, 4.0, np.zeros(4)))
    assert known == pytest.approx(40 * 1000.0)


def test_arrivals_after_an_update_queue_behind_the_restarted_work():
    # 1000 tokens predicted in sub-step 6 (1 s of prefill); the server is idle. An update
    # at 0.5 s with a 2 s pause and a 3000-token re-prefill: resumes at 2.5 s, the
    # re-prefill takes until 5.5 s, the arrivals (cold: 1 s) are admitted by 10 s.
    fut = NONE.copy()
    fut[:, 0, 6] = [1.0, 1000.0, 1000.0, 0.0]
    snap = Snapshot(t=0.0, **one_instance(1))
    p = np.zeros(10)
    p[0] = 1.0
    known, arriving, _, detail = decode_admissions_split(snap, CFG, fut, PendingUpdate(p, 2.0, np.array([1.0, 3000.0, 3000.0, 0.0])))
    assert known == pytest.approx(3000) and arriving == pytest.approx(1000)
    assert detail.alpha[6] == pytest.approx(1.0)
    # With 8.5 s of pause nothing is prefilled after it.
    known, arriving, _, _ = decode_admissions_split(snap, CFG, fut, PendingUpdate(p, 9.5, np.array([1.0, 3000.0, 3000.0, 0.0])))
    assert known == 0.0 and arriving == 0.0


def test_known_finish_steps_add_up_to_the_admissions():
    # Three warm queued prompts with a cache flip each (hit: 1 s, miss: 4 s): the
    # per-sub-step finish probabilities add up to each one's admission by t + S, and
    # the first (nothing ahead of it) finishes in sub-step 1 or 4.
    snap = Snapshot(
        t=0.0, **ready(4000, 4000, 4000, ready_cached=np.array([3000.0, 3000.0, 3000.0])), cache_hit=0.5,
        **one_instance(1),
    )
    kq = known_queue(snap)
    _, pmf = kq.finish_steps(10.0, 10)
    _, w = kq.admitted_by(10.0)
    assert pmf.sum(axis=1) == pytest.approx(w)
    assert pmf[0, 1] == pytest.approx(0.5) and pmf[0, 4] == pytest.approx(0.5)
    assert (pmf >= 0).all() and w[2] < w[1] < w[0] == pytest.approx(1.0)


def test_the_fold_learns_requeues_and_the_share_of_decodes_an_update_cuts():
    st = LiveState(ForecastConfig())
    h = st.history
    for t in ("a", "b", "c"):
        st.apply(_ev("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000))
        st.apply(_ev("request.queued", 1.0, traj=t, req=f"{t}1", turn=0, prompt_tokens=1000))
        st.apply(_ev("prefill.finished", 2.0, traj=t, req=f"{t}1", cached_tokens=0))
    st.apply(_ev("policy.updated", 5.0, version=1))
    # Of the three decodes under way at the update two are aborted, one ends as a turn.
    st.apply(_ev("decode.finished", 5.1, traj="a", req="a1", output_tokens=40, finish="abort"))
    st.apply(_ev("decode.finished", 5.1, traj="b", req="b1", output_tokens=60, finish="abort"))
    st.apply(_ev("decode.finished", 5.3, traj="c", req="c1", output_tokens=80, finish="tool"))
    assert h.cut_share == pytest.approx((1 + 2) / (1 + 3))
    snap = st.snapshot(5.2)
    assert sorted(snap.aborted_context) == [1040.0, 1060.0]
    assert list(snap.aborted_elapsed) == pytest.approx([0.1, 0.1])
    # One re-queued 0.4 s after its abort, the other dropped.
    st.apply(_ev("request.queued", 5.5, traj="a", req="a2", turn=0, prompt_tokens=1040))
    st.apply(_ev("trajectory.dropped", 5.6, traj="b", reason="stale"))
    assert h.requeue.count == 1 and h.requeue.observed_mean == pytest.approx(0.4)
    assert h.requeue_share == pytest.approx((1 + 1) / (1 + 2))
    assert len(st.snapshot(6.0).aborted_elapsed) == 0
