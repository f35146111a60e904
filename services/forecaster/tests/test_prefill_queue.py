"""Per-instance FIFO queue simulation and the prefill time model."""

import numpy as np
import pytest

from prorsa_forecaster.terms.prefill_queue import PrefillTimeModel, simulate_queues


def test_single_instance_recursion_by_hand():
    # b_j = max(u_j, v) + g_j: 0+2=2, max(0,2)+3=5, max(5,5)+1=6
    b = simulate_queues(np.array([0, 0, 0]), np.array([0.0, 0.0, 5.0]), np.array([2.0, 3.0, 1.0]), np.array([0.0]))
    assert b == pytest.approx([2.0, 5.0, 6.0])


def test_instance_busy_until_v0_and_idle_gaps():
    b = simulate_queues(np.array([0, 0, 0]), np.array([0.0, 0.0, 20.0]), np.array([2.0, 3.0, 1.0]), np.array([4.0]))
    assert b == pytest.approx([6.0, 9.0, 21.0])


def test_two_instances_are_independent_and_order_is_by_arrival():
    inst = np.array([1, 0, 1, 0])
    arrival = np.array([3.0, 1.0, 0.0, 0.0])
    service = np.array([1.0, 1.0, 2.0, 5.0])
    b = simulate_queues(inst, arrival, service, np.array([0.0, 10.0]))
    # instance 0 (free at 0): arrivals 0 (5 s) then 1 (1 s) -> 5, 6.
    # instance 1 (free at 10): arrivals 0 (2 s) then 3 (1 s) -> 12, 13.
    assert b == pytest.approx([13.0, 6.0, 12.0, 5.0])


def test_empty_queue():
    assert len(simulate_queues(np.zeros(0, int), np.zeros(0), np.zeros(0), np.array([0.0]))) == 0


def test_prefill_time_model_learns_the_line():
    m = PrefillTimeModel(prior_weight=1.0, half_life=1e9)
    for x in np.linspace(500, 30000, 400):
        m.observe(x, 0.1 + 1e-4 * x)
    a, b = m.coefficients()
    assert a == pytest.approx(0.1, rel=0.05) and b == pytest.approx(1e-4, rel=0.02)
    assert m.g(np.array([10000.0]))[0] == pytest.approx(1.1, rel=0.02)


def test_prefill_time_model_prior_and_bad_input():
    m = PrefillTimeModel()
    m.observe(float("nan"), 1.0)
    m.observe(100.0, -1.0)
    assert m.n == 0
    a, b = m.coefficients()
    assert a >= 0 and b > 0


def test_the_prior_of_an_engine_of_several_ranks_is_per_rank():
    # The profile is one engine serving one request at a time; each of 16 attention-DP
    # ranks serves its own at 1/16 of the engine's rate: 16x the per-token and per-pair
    # costs, the same fixed cost.
    one, ranks = PrefillTimeModel(), PrefillTimeModel(servers=16)
    a1, b1, d1 = one.coefficients3()
    a16, b16, d16 = ranks.coefficients3()
    assert (one.servers, ranks.servers) == (1, 16)
    assert a16 == pytest.approx(a1, rel=1e-3)
    assert b16 == pytest.approx(16 * b1, rel=1e-3) and d16 == pytest.approx(16 * d1, rel=1e-3)
    assert PrefillTimeModel(servers=0).servers == 1


def test_prefills_of_one_size_leave_the_slope_to_the_prior():
    # A math step: every prompt 250 tokens, each holding its rank 0.06 s. The data pin
    # g(250) and nothing else, so a 10k-token re-prefill is priced by the prior's slope:
    # the per-rank one on a 16-rank engine, 16x the single-instance one.
    g = {}
    for servers in (1, 16):
        m = PrefillTimeModel(servers=servers)
        for _ in range(500):
            m.observe(250.0, 0.06)
        assert m.g(np.array([250.0]))[0] == pytest.approx(0.06, rel=0.02)
        g[servers] = float(m.g(np.array([10000.0]))[0])
    a, b, d = PrefillTimeModel().coefficients3()
    profile_slope = b + d * 10000 / 2  # per token of an uncached 10k prompt, about
    assert g[1] == pytest.approx(0.06 + 9750 * profile_slope, rel=0.15)
    assert g[16] == pytest.approx(0.06 + 16 * 9750 * profile_slope, rel=0.15)
