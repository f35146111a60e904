"""The §4.2 optimisation: feasible and infeasible budgets, unequal GPU sizes, rounding."""

from __future__ import annotations

import itertools
import math

import pytest

from prorsa_allocator.optimize import Capacity, Demand, solve


def cap(budget: int, m_p: int = 1, m_d: int = 1, theta: float = 1000.0, kv: float = 1000.0) -> Capacity:
    return Capacity(theta, kv, m_p, m_d, budget)


def demand(a_p: float, a_d: float, horizon: float = 10.0, theta: float = 1000.0, kv: float = 1000.0) -> Demand:
    """A demand of a_p prefill instances and a_d decode instances."""
    return Demand(a_p * horizon * theta, horizon, a_d * kv)


def brute_force(a_p: float, a_d: float, m_p: int, m_d: int, g: int) -> float:
    best = -math.inf
    for p, d in itertools.product(range(1, g + 1), repeat=2):
        if m_p * p + m_d * d <= g:
            best = max(best, min(p / a_p if a_p else math.inf, d / a_d if a_d else math.inf))
    return best


def test_feasible_budget_maximises_headroom_and_uses_paper_ceilings() -> None:
    # 3 prefill and 5 decode instances of demand on 16 GPUs: δ = 1.0 is the best both roles
    # can get (6 + 10 = 16), and the counts are ⌈a·(1+δ)⌉.
    a = solve(demand(3.0, 5.0), cap(16))
    assert a.feasible
    assert a.delta == pytest.approx(1.0)
    assert (a.n_prefill, a.n_decode) == (6, 10)
    assert a.spare_gpus == 0


def test_infeasible_budget_minimises_the_larger_demand_to_capacity_ratio() -> None:
    # Demand of 10 + 30 instances on 8 GPUs: the best split equalises shortfall (2:6).
    a = solve(demand(10.0, 30.0), cap(8))
    assert not a.feasible
    assert (a.n_prefill, a.n_decode) == (2, 6)
    # The larger demand/capacity ratio is max(10/2, 30/6) = 5: no other split does better.
    assert a.delta == pytest.approx(1 / 5 - 1)
    assert max(10 / a.n_prefill, 30 / a.n_decode) == pytest.approx(5.0)


def test_unequal_gpus_per_instance() -> None:
    # Decode instances take 4 GPUs, prefill 2: with 32 GPUs and demand 2 + 2 instances,
    # 5 prefill (10 GPUs) + 5 decode (20 GPUs) gives δ = 1.5; a sixth decode would need 4
    # more GPUs than the 2 left, so 2 GPUs stay spare.
    a = solve(demand(2.0, 2.0), cap(32, m_p=2, m_d=4))
    assert a.feasible
    assert (a.n_prefill, a.n_decode) == (5, 5)
    assert a.delta == pytest.approx(1.5)
    assert a.spare_gpus == 2
    # Swapping the sizes moves the spare GPUs, not the counts' balance.
    b = solve(demand(2.0, 2.0), cap(32, m_p=4, m_d=2))
    assert (b.n_prefill, b.n_decode) == (5, 5)
    # An equal-GPU split would be wrong here: 4 GPU decode instances are scarcer.
    c = solve(demand(1.0, 3.0), cap(24, m_p=2, m_d=4))
    assert 2 * c.n_prefill + 4 * c.n_decode <= 24
    assert c.delta + 1 == pytest.approx(brute_force(1.0, 3.0, 2, 4, 24))


@pytest.mark.parametrize(
    ("a_p", "a_d", "m_p", "m_d", "g"),
    [(1.3, 2.7, 1, 1, 9), (0.2, 7.9, 2, 3, 31), (5.5, 0.4, 3, 2, 20), (12.0, 12.0, 1, 2, 20), (0.9, 0.9, 4, 4, 8)],
)
def test_matches_brute_force(a_p: float, a_d: float, m_p: int, m_d: int, g: int) -> None:
    a = solve(demand(a_p, a_d), cap(g, m_p, m_d))
    assert a.delta + 1 == pytest.approx(brute_force(a_p, a_d, m_p, m_d, g))
    assert m_p * a.n_prefill + m_d * a.n_decode <= g
    assert a.n_prefill >= 1 and a.n_decode >= 1
    # The counts really support the reported δ.
    assert min(a.n_prefill / a_p, a.n_decode / a_d) >= a.delta + 1 - 1e-9


def test_integer_rounding_does_not_ask_for_an_instance_at_an_exact_boundary() -> None:
    # Exactly 2.0 prefill instances of demand at δ=0 must be 2, not 3 (float noise in Ŵᴾ).
    d = Demand(2.0 * 10.0 * 1000.0 * (1 + 1e-13), 10.0, 1000.0 * 2.0)
    a = solve(d, cap(4))
    assert (a.n_prefill, a.n_decode) == (2, 2)
    assert a.feasible and a.delta == pytest.approx(0.0, abs=1e-9)


def test_rounding_up_fractional_demand() -> None:
    # 1.1 + 1.1 instances on 10 GPUs: δ* makes both 5; the ceilings of 1.1·(1+δ).
    a = solve(demand(1.1, 1.1), cap(10))
    assert (a.n_prefill, a.n_decode) == (5, 5)
    assert a.delta == pytest.approx(5 / 1.1 - 1)


def test_at_least_one_instance_per_role_with_no_demand() -> None:
    a = solve(demand(0.0, 4.0), cap(8))
    assert a.n_prefill == 1 and a.n_decode == 7
    idle = solve(demand(0.0, 0.0), cap(8), max_delta=10.0)
    assert (idle.n_prefill, idle.n_decode) == (1, 1)
    assert idle.feasible and idle.delta == pytest.approx(10.0)
    assert idle.spare_gpus == 6


def test_bad_inputs_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="prefill_tokens"):
        Demand(float("nan"), 10.0, 1.0)
    with pytest.raises(ValueError, match="horizon_s"):
        Demand(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="cannot hold one prefill"):
        Capacity(1.0, 1.0, 4, 4, 7)
    with pytest.raises(ValueError, match="prefill_tokens_per_s"):
        Capacity(0.0, 1.0, 1, 1, 2)
