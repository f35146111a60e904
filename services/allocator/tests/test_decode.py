"""The decode-throughput term: step model, TPOT sizing, online fit, and its effect on the plan."""

from __future__ import annotations

import math
import random

import pytest

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.decode import DecodeStep, DecodeStepFit, decode_instances_for_tpot
from prorsa_allocator.optimize import Capacity, Demand, solve
from prorsa_allocator.planner import Allocator
from prorsa_allocator.testing import KV, THETA, forecast, registered, stats

STEP = DecodeStep(fixed_s=0.030, per_seq_s=5e-5, per_kv_token_s=2e-9)


def test_tpot_sizing_matches_the_step_model() -> None:
    seqs, kv = 500, 6e6
    n = decode_instances_for_tpot(seqs, kv, STEP, tpot_target_s=0.033)
    # load = 0.025 + 0.012 = 0.037 s of step per engine-equivalent; room 3 ms -> 12.33 engines
    assert n == pytest.approx(0.037 / 0.003)
    # At ceil(n) engines the step meets the target; one fewer misses it.
    assert STEP.step_s(seqs, kv, math.ceil(n)) <= 0.033 < STEP.step_s(seqs, kv, math.ceil(n) - 1)
    assert decode_instances_for_tpot(0, 0, STEP, 0.033) == 0.0
    assert decode_instances_for_tpot(seqs, kv, STEP, 0.030) == math.inf  # no engine count meets it
    with pytest.raises(ValueError):
        decode_instances_for_tpot(-1, kv, STEP, 0.05)
    with pytest.raises(ValueError):
        DecodeStep(fixed_s=float("nan"), per_seq_s=0, per_kv_token_s=0)


def test_decode_throughput_term_takes_an_engine_from_prefill_headroom() -> None:
    # Prefill needs 4.5 engines' worth, decode KV half an engine: the KV-only formula gives
    # 7:1 (min(7/4.5, 1/0.5) = 1.56 beats 6:2's min(6/4.5, 2/0.5) = 1.33).
    cap = Capacity(THETA, KV, 8, 8, 64)
    kv_only = solve(Demand(4.5 * 10 * THETA, 10.0, 0.5 * KV), cap)
    assert (kv_only.n_prefill, kv_only.n_decode) == (7, 1)
    # With the step-time term needing 1.4 decode engines, 6:2 is the max-min optimum.
    both = solve(Demand(4.5 * 10 * THETA, 10.0, 0.5 * KV, decode_instances=1.4), cap)
    assert (both.n_prefill, both.n_decode) == (6, 2)
    assert both.decode_demand == pytest.approx(1.4)


def test_step_model_is_learned_from_decode_stats() -> None:
    fit = DecodeStepFit(prior=None, min_samples=8)
    rnd = random.Random(3)
    for _ in range(30):
        b = rnd.randint(20, 1500)
        kv = b * rnd.randint(2_000, 20_000)
        assert fit.observe("decode", b, kv, b / STEP.step_s(b, kv))
    got = fit.value
    assert got is not None
    assert got.fixed_s == pytest.approx(STEP.fixed_s, rel=1e-6)
    assert got.per_seq_s == pytest.approx(STEP.per_seq_s, rel=1e-6)
    assert got.per_kv_token_s == pytest.approx(STEP.per_kv_token_s, rel=1e-6)
    # Prefill samples, idle engines and missing rates do not count.
    assert not fit.observe("prefill", 10, 1000, 100.0)
    assert not fit.observe("decode", 0, 0, 100.0)
    assert not fit.observe("decode", 10, 1000, None)


def test_one_load_only_keeps_the_prior() -> None:
    fit = DecodeStepFit(prior=STEP)
    for _ in range(20):
        fit.observe("decode", 100, 1_000_000, 100 / 0.04)
    assert fit.value == STEP  # the slope is unknowable from one load


def test_planner_sizes_decode_by_step_time_when_a_target_is_set() -> None:
    def run(cfg: AllocatorConfig) -> tuple[int, int]:
        alloc = Allocator(cfg)
        for i in range(7):
            alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered("d0", "decode"))
        # One decode engine holds 600 sequences: per the model its step is ~60 ms, far over
        # the 36 ms target (1.2 x the 30 ms empty step).
        alloc.handle(stats("d0", "decode", ts=5.0, running=600, kv_used=int(0.375 * KV)))
        alloc.handle(forecast(t=10.0, prefill_engines=4.5, decode_engines=0.5))
        a = alloc.last_decision.allocation
        return a.n_prefill, a.n_decode

    prior = dict(decode_step_fixed_s=STEP.fixed_s, decode_step_per_seq_s=STEP.per_seq_s,
                 decode_step_per_kv_token_s=STEP.per_kv_token_s)
    assert run(AllocatorConfig(prefill_tokens_per_s=THETA, **prior))[1] == 1  # no target: KV only
    n_p, n_d = run(AllocatorConfig(prefill_tokens_per_s=THETA, decode_tpot_slack=0.2, **prior))
    assert n_d >= 2 and n_p + n_d <= 8


# -- the latency-balance term (decode_instances_for_latency) ---------------------------------

def test_latency_balance_hand_computed() -> None:
    from prorsa_allocator.decode import decode_instances_for_latency

    step = DecodeStep(fixed_s=0.03, per_seq_s=1e-5, per_kv_token_s=1e-8)
    # c = 1e-5*1000 + 1e-8*1e6 = 0.02 s per step-engine; t(now) on 1 engine = 0.05 s;
    # Kᴰ/Âᴰ = 1 (one window per turn): B'/S = 1 * 0.02 / 0.05 = 0.4; aᴰ = sqrt(2*8*0.4).
    got = decode_instances_for_latency(8.0, 1e6, 1e6, 1000, 1e6, 1, step)
    assert got == pytest.approx(math.sqrt(6.4))
    # The same load seen on 2 engines: t(now) = 0.04, so o = L_D/t is larger: B'/S = 0.5.
    assert decode_instances_for_latency(8.0, 1e6, 1e6, 1000, 1e6, 2, step) == pytest.approx(math.sqrt(8.0))
    # It is the square-root rule: with the two roles' latency terms A = aᴾS/2 and B', the
    # max-min optimum nᴾ/nᴰ = aᴾ/aᴰ equals sqrt(A/B').
    a_p, S = 8.0, 10.0
    assert a_p / got == pytest.approx(math.sqrt((a_p * S / 2) / (0.4 * S)))


def test_latency_balance_is_off_without_decode_work_and_rejects_bad_input() -> None:
    from prorsa_allocator.decode import decode_instances_for_latency

    step = DecodeStep(fixed_s=0.03, per_seq_s=1e-5, per_kv_token_s=1e-8)
    assert decode_instances_for_latency(8.0, 1e6, 0.0, 1000, 1e6, 1, step) == 0.0  # nothing admitted
    assert decode_instances_for_latency(8.0, 0.0, 1e6, 0, 0, 1, step) == 0.0  # nothing decoding
    assert decode_instances_for_latency(0.0, 1e6, 1e6, 1000, 1e6, 1, step) == 0.0  # no prefill demand
    for bad in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError):
            decode_instances_for_latency(bad, 1e6, 1e6, 1000, 1e6, 1, step)


def _latency_cluster(a_p: float, room_cap: bool = True) -> tuple[int, int]:
    step = DecodeStep(fixed_s=0.03, per_seq_s=1e-4, per_kv_token_s=2e-8)
    cfg = AllocatorConfig(prefill_tokens_per_s=THETA, decode_step_fixed_s=step.fixed_s,
                          decode_step_per_seq_s=step.per_seq_s, decode_step_per_kv_token_s=step.per_kv_token_s,
                          decode_latency_room_cap=room_cap)
    alloc = Allocator(cfg)
    for i in range(7):
        alloc.handle(registered(f"p{i}", "prefill"))
    alloc.handle(registered("d0", "decode"))
    # One decode engine holds 500 sequences and 60k KV tokens: step 0.03 + 0.05 + 0.0012 s.
    alloc.handle(stats("d0", "decode", ts=5.0, running=500, kv_used=60_000))
    fc = forecast(t=10.0, prefill_engines=a_p, decode_engines=0.4)
    # Kᴰ = 30k (forecast helper), admitted 15k per window: a decode turn takes 2 windows.
    fc = fc.model_copy(update={"decode_admit_tokens": 15_000.0})
    alloc.handle(fc)
    a = alloc.last_decision.allocation
    return a.n_prefill, a.n_decode


def test_planner_gives_decode_what_prefill_can_spare_for_latency() -> None:
    # aᴾ = 5: prefill needs 5 engines, 3 are spare; the latency term asks for more than the
    # single engine KV needs (aᴰ = sqrt(2*5*2*0.0512/0.0812) = 3.55, capped at the 3 spare).
    n_p, n_d = _latency_cluster(5.0)
    assert n_d >= 2 and n_p >= 5 and n_p + n_d <= 8


def test_planner_never_takes_saturated_prefill_engines_for_decode_latency() -> None:
    # aᴾ = 7.5 > 7: prefill is the bottleneck of the closed loop, so the latency term gets
    # no room and decode is sized by KV alone: 7:1, as the KV-only formula gives.
    assert _latency_cluster(7.5) == (7, 1)
    # Without the cap (the default) the term is the square-root rule's whatever prefill
    # needs: aᴰ = sqrt(2*7.5*2*0.0512/0.0812) = 4.35 against aᴾ = 7.5 over 8 engines.
    assert _latency_cluster(7.5, room_cap=False) == (5, 3)


def test_theta_ignores_a_queue_that_just_formed_and_is_a_high_quantile() -> None:
    alloc = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA))
    alloc.handle(registered("p0", "prefill"))
    for i in range(6):
        alloc.handle(stats("p0", "prefill", ts=1.0 + i, running=1, queued=4, prefill_tokens_per_s=80_000.0))
    # Idle for most of the window, two requests just arrived: queued, nothing running yet.
    alloc.handle(stats("p0", "prefill", ts=10.0, running=0, queued=2, prefill_tokens_per_s=569.0))
    assert alloc.theta.value == pytest.approx(80_000.0) and alloc.theta.samples == 6
    # Even one that slips through (running too) does not move a high quantile.
    alloc.handle(stats("p0", "prefill", ts=11.0, running=1, queued=2, prefill_tokens_per_s=569.0))
    assert alloc.theta.value == pytest.approx(80_000.0) and alloc.theta.samples == 7
    # A lasting change of capacity moves it within the window of samples.
    for i in range(64):
        alloc.handle(stats("p0", "prefill", ts=20.0 + i, running=1, queued=4, prefill_tokens_per_s=30_000.0))
    assert alloc.theta.value == pytest.approx(30_000.0)


def test_theta_prior_pseudo_samples_outweigh_one_early_sample() -> None:
    alloc = Allocator(AllocatorConfig(prefill_tokens_per_s=80_000.0))
    alloc.handle(registered("p0", "prefill"))
    # The first sample: one request running and one queued, the engine idle most of the window.
    alloc.handle(stats("p0", "prefill", ts=10.0, running=1, queued=1, prefill_tokens_per_s=569.0))
    assert alloc.theta.samples == 1 and alloc.theta.value == pytest.approx(80_000.0)
    no_prior = Allocator(AllocatorConfig(prefill_tokens_per_s=80_000.0, theta_prior_samples=0))
    no_prior.handle(registered("p0", "prefill"))
    no_prior.handle(stats("p0", "prefill", ts=10.0, running=1, queued=1, prefill_tokens_per_s=569.0))
    assert no_prior.theta.value == pytest.approx(569.0)


def test_decode_drain_follows_littles_law_with_the_prior_as_floor() -> None:
    from prorsa_allocator.switching import drain_estimate

    alloc = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA))
    alloc.handle(registered("d0", "decode"))
    alloc.handle(stats("d0", "decode", ts=1.0, running=50, kv_used=50_000))
    view = alloc.table.engines["d0"]
    # A long-generation workload: Kᴰ = 75k held, 1.5k admitted per 10 s window -> 500 s a turn.
    fc = forecast(t=10.0, prefill_engines=0.1, decode_engines=1.0)
    alloc.handle(fc.model_copy(update={"decode_admit_tokens": 1_500.0}))
    assert alloc.decode_turn_s == pytest.approx(500.0)
    assert drain_estimate(view, alloc.config, alloc.decode_turn_s) == pytest.approx(500.0)
    # Short agentic turns: the mean turn is under the prior; the prior (the last sequence
    # finishes well after the mean) is the floor.
    assert drain_estimate(view, alloc.config, 3.0) == alloc.config.drain_decode_s


# -- the spread cap: no engine past one sequence a DP rank (decode_spread_cap) ---------------

def test_decode_load_counts_the_ranks_and_the_spread() -> None:
    from prorsa_allocator.decode import DecodeLoad, decode_load
    from prorsa_allocator.engines import EngineView
    from prorsa_schemas.events import Parallel

    def engine(name: str, role: str, running: int, attn_dp: int | None) -> EngineView:
        return EngineView(engine=name, role=role, running_reqs=running, queued_reqs=1, kv_used_tokens=1_000,
                          parallel=None if attn_dp is None else Parallel(attn_dp=attn_dp))

    load = decode_load([engine("d0", "decode", 11, 16), engine("d1", "decode", 11, 16), engine("p0", "prefill", 50, 16)])
    assert load == DecodeLoad(seqs=24, kv_tokens=2_000, engines=2, ranks=32)
    assert load.spread() == pytest.approx(24 / 16)  # 24 sequences, one a rank, 16 ranks an engine
    # An engine that registered no parallel layout counts as one rank.
    assert decode_load([engine("d0", "decode", 11, None)]).spread() == 12
    assert DecodeLoad(0, 0, 0, 0).spread() == math.inf  # no decode engine: nothing to cap by


def test_the_latency_term_is_capped_at_the_engines_its_sequences_can_spread_over() -> None:
    from prorsa_allocator.decode import DecodeLoad, decode_step_demand

    step = DecodeStep(fixed_s=0.03, per_seq_s=1e-5, per_kv_token_s=1e-8)
    # 24 sequences holding 1M tokens on 2 decode engines: c = 1e-5*24 + 1e-8*1e6 = 0.01024 s,
    # t(now) = 0.03 + 0.01024/2 = 0.03512 s, Kᴰ/Âᴰ = 1: B'/S = 0.01024/0.03512; with aᴾ = 20
    # the latency term is sqrt(2*20*B'/S) = 3.415 engines.
    term = math.sqrt(2 * 20 * 0.01024 / 0.03512)
    wide = DecodeLoad(seqs=24, kv_tokens=1_000_000, engines=2, ranks=32)  # 16 ranks an engine
    narrow = DecodeLoad(seqs=24, kv_tokens=1_000_000, engines=2, ranks=2)

    def demand(load: DecodeLoad, cap: bool) -> float:
        cfg = AllocatorConfig(prefill_tokens_per_s=THETA, decode_spread_cap=cap)
        return decode_step_demand(cfg, step, load, 1e6, 20.0, 1e6, 1e6, math.inf)

    assert demand(wide, False) == pytest.approx(term)
    assert demand(wide, True) == pytest.approx(24 / 16)  # one sequence a rank: 1.5 engines
    assert demand(narrow, True) == pytest.approx(term)  # 24 engines of room: the cap does not bind


def _tail(cap: bool, attn_dp: int) -> tuple[float, str, bool]:
    """A sync step's tail: 6:2, 10 sequences on each decode engine, prefill demand 3 engines,
    a heavy step (t0 = 30 ms, 2 ms a sequence) and a decode turn of two windows."""
    from prorsa_allocator.testing import RUN
    from prorsa_schemas import ForecastWindow

    cfg = AllocatorConfig(prefill_tokens_per_s=THETA, served_evidence_first=False, settle_s=0.0,
                          closed_loop_coupling=0.0, decode_spread_cap=cap, decode_step_fixed_s=0.03,
                          decode_step_per_seq_s=2e-3, decode_step_per_kv_token_s=0.0)
    alloc = Allocator(cfg)
    for i in range(6):
        alloc.handle(registered(f"p{i}", "prefill", attn_dp=attn_dp))
    for i in range(2):
        alloc.handle(registered(f"d{i}", "decode", attn_dp=attn_dp))
        alloc.handle(stats(f"d{i}", "decode", ts=90.0, running=10, kv_used=KV // 20))
    alloc.handle(ForecastWindow(id=f"fc-tail-{cap}-{attn_dp}", ts=100.0, run=RUN, t=100.0, horizon=10.0,
                                prefill_tokens=3.0 * 10.0 * THETA, decode_admit_tokens=0.05 * KV,
                                decode_kv_tokens=0.05 * KV, decode_kv_now=0.1 * KV))
    d = alloc.last_decision
    return d.allocation.decode_demand, d.selection.reason, d.spread_binds


def test_a_tail_of_fewer_sequences_than_ranks_moves_no_engine_to_decode() -> None:
    # c = 2e-3 x 20 = 0.04 s, t(now) = 0.03 + 0.04/2 = 0.05 s, Kᴰ/Âᴰ = 2: the latency term
    # asks for sqrt(2 x 3 x 2 x 0.04/0.05) = 3.10 engines, and 6:2 -> 4:4 reads as a gain.
    uncapped = math.sqrt(2 * 3 * 2 * 0.04 / 0.05)
    demand, reason, binds = _tail(False, 16)
    assert demand == pytest.approx(uncapped) and "engine(s) to decode" in reason and not binds
    # 20 sequences on engines of 16 ranks fill 1.25 engines: the two decode engines already
    # step at one sequence a rank, and no move pays.
    demand, reason, binds = _tail(True, 16)
    assert demand == pytest.approx(20 / 16) and "below the hysteresis" in reason and binds
    # Without attention DP (one rank an engine) 20 sequences spread over 20 engines: the
    # cap does not bind, and the move is made as before.
    demand, reason, binds = _tail(True, 1)
    assert demand == pytest.approx(uncapped) and "engine(s) to decode" in reason and not binds
