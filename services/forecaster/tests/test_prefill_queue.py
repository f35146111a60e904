"""Per-instance FIFO queue simulation and the prefill time model."""

import numpy as np
import pytest

from prorsa_forecaster.terms.known_queue import normal_below
from prorsa_forecaster.terms.prefill_queue import PrefillTimeModel, fifo_order, simulate_queues


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


def test_fifo_order_by_hand_ties_in_position_order():
    inst = np.array([1, 0, 1, 0, 0, 1])
    arrival = np.array([2.0, 1.0, 2.0, 1.0, -0.0, 0.0])
    # Instance 0: position 4 (arrival 0), then 1 and 3 (arrival 1, position order);
    # instance 1: 5 (arrival 0), then 0 and 2 (arrival 2).
    assert fifo_order(inst, arrival).tolist() == [4, 1, 3, 5, 0, 2]


def test_fifo_order_is_the_lexsort_it_replaces():
    rng = np.random.default_rng(3)
    for servers in (3, 40_000):  # the int16 radix path and the wide-key path
        inst = rng.integers(0, servers, 5_000)
        arrival = np.round(rng.random(5_000) * 4) / 2  # many ties
        arrival[::7] = np.nan
        want = np.lexsort((np.arange(5_000), arrival, inst))
        assert np.array_equal(fifo_order(inst, arrival), want)
        # Given the arrival order, and through the queue simulation.
        assert np.array_equal(fifo_order(inst, arrival, np.argsort(arrival, kind="stable")), want)
        service = rng.random(5_000)
        free = rng.random(servers)
        arrival = np.nan_to_num(arrival)
        assert np.array_equal(simulate_queues(inst, arrival, service, free),
                              simulate_queues(inst, arrival, service, free, fifo_order(inst, arrival)))


def test_normal_below_by_hand():
    from math import erf, sqrt

    margin = np.array([[1.0, -1.0, 0.0], [1.0, -1.0, np.nan], [3.0, -2.0, 0.5]])
    sd = np.array([[0.0], [np.nan], [2.0]])  # no spread, an undefined one, a normal
    got = normal_below(margin, sd)
    assert got[0].tolist() == [1.0, 0.0, 0.0] and got[1].tolist() == [1.0, 0.0, 0.0]
    want = [0.5 * (1 + erf(m / (sqrt(2) * 2.0))) for m in (3.0, -2.0, 0.5)]
    assert got[2] == pytest.approx(want, abs=2e-7)
    # Every row with a spread, and an undefined margin within it: one half.
    assert normal_below(np.array([np.nan, 0.0, 20.0, -20.0]), np.array(1.0)).tolist() == [0.5, 0.5, 1.0, 0.0]
    assert normal_below(np.array([1.0, -1.0]), np.zeros(2)).tolist() == [1.0, 0.0]


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
