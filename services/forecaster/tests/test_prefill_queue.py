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
