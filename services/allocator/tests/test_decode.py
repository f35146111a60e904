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
