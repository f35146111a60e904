"""DurationModel: conditional completion probabilities on hand-computed cases."""

import math

import numpy as np
import pytest

from prorsa_forecaster.survival import CURE_PRIOR_CALLS, DurationModel


def test_prior_alone_is_memoryless_exponential():
    m = DurationModel("x", prior_mean=10.0)
    p = m.conditional(np.array([0.0, 5.0, 30.0]), 10.0)
    # Exponential(mean 10): Pr(T < e + 10 | T > e) = 1 - e^-1 whatever e is (grid error < 2%).
    assert p == pytest.approx([1 - math.exp(-1)] * 3, abs=0.02)


def test_empirical_conditional_matches_counting():
    m = DurationModel("x", prior_mean=1.0, prior_weight=0.0)
    for d in (1.0, 2.0, 3.0, 4.0):
        m.observe(d)
    # Survivors past 1.5 are {2, 3, 4}; of those, only 2 ends before 2.5.
    assert m.conditional(np.array([1.5]), 1.0)[0] == pytest.approx(1 / 3, abs=0.01)
    # Everything ends within 10 s of the start; nothing past 4.5 remains empirically.
    assert m.conditional(np.array([0.0]), 10.0)[0] == pytest.approx(1.0)
    assert m.count == 4 and m.observed_mean == 2.5


def test_steps_partition_the_window():
    m = DurationModel("x", prior_mean=1.0, prior_weight=0.0)
    for d in (0.5, 1.5, 2.5, 3.5):
        m.observe(d)
    steps = m.conditional_steps(np.array([0.0]), 4.0, 4)[0]
    assert steps == pytest.approx([0.25, 0.25, 0.25, 0.25], abs=0.01)


def test_elapsed_past_all_history_falls_back_to_a_finite_tail():
    m = DurationModel("x", prior_mean=1.0, prior_weight=0.0)
    m.observe(2.0)
    p = m.conditional(np.array([100.0, np.nan, np.inf, -5.0]), 10.0)
    assert np.all(np.isfinite(p)) and np.all((p >= 0) & (p <= 1))
    # Tail: exponential with mean max(e, S) = 100 -> 1 - e^-0.1.
    assert p[0] == pytest.approx(1 - math.exp(-0.1), abs=1e-6)


def test_bad_observations_are_ignored_and_bad_priors_refused():
    m = DurationModel("x", prior_mean=1.0)
    for bad in (-1.0, math.nan, math.inf):
        m.observe(bad)
    assert m.count == 0
    with pytest.raises(ValueError, match="prior_mean"):
        DurationModel("x", prior_mean=0.0)
    with pytest.raises(ValueError, match="half_life"):
        DurationModel("x", prior_mean=1.0, half_life=0)


def test_forgetting_follows_a_drifting_workload():
    m = DurationModel("x", prior_mean=1.0, prior_weight=0.0, half_life=50)
    for _ in range(500):
        m.observe(100.0)
    for _ in range(500):
        m.observe(1.0)
    # After 10 half-lives the old long durations weigh ~0.1%.
    assert m.conditional(np.array([0.0]), 5.0)[0] > 0.99


def test_prior_fades_as_observations_come_in():
    # A duration seen once per step (training): the prior's tail must not hold back mass
    # the observations put inside the horizon.
    m = DurationModel("train", prior_mean=30.0, prior_weight=3.0)
    for _ in range(7):
        m.observe(30.0)
    w = 3.0 / (1 + 7)  # the prior now stands in for 3/8 of an observation
    tail, within = math.exp(-27.7 / 30.0), math.exp(-27.7 / 30.0) - math.exp(-37.7 / 30.0)
    assert m.conditional(np.array([27.7]), 10.0)[0] == pytest.approx((7 + w * within) / (7 + w * tail), rel=1e-2)
    assert m.count == 7


def test_returning_a_share_of_calls_that_never_end():
    m = DurationModel("tool", prior_mean=5.0)
    # Nothing open: every call returns.
    p, pi = m.returning(np.array([]))
    assert p == 1.0 and pi.shape == (0,)
    for _ in range(100):
        m.observe(10.0)
    # Open calls younger than the learnt durations: no evidence that any never returns.
    p, pi = m.returning(np.full(50, 0.5))
    assert p == pytest.approx(1.0, abs=1e-4) and np.all(pi > 0.999)
    # 300 calls open for 10,000 s, far past every return (all at 10 s): their survival if
    # they will return is the Lindy floor, 0.1 x q90 / e = 1e-4, so nearly all are taken to
    # never return, and p is the ended ones' share: (100 + 3 prior) / (103 + 300).
    p, pi = m.returning(np.full(300, 1e4))
    q90 = m.quantile(0.9)
    assert q90 == pytest.approx(10.0, rel=0.02)
    s = 0.1 * q90 / 1e4
    assert p == pytest.approx(103 / 403, abs=2e-3)
    # (ages on the bucket grid, ~2% wide)
    assert pi == pytest.approx(np.full(300, p * s / (p * s + 1 - p)), rel=0.02)
    # The estimate is the EM's fixed point: p = (ended + sum over open of Pr(returns)) / all.
    ages = np.concatenate((np.full(40, 2.0), np.full(60, 400.0)))
    p, pi = m.returning(ages)
    assert p == pytest.approx((103 + pi.sum()) / (103 + 100), rel=1e-4)
    assert pi[:40].min() > pi[40:].max() and np.all((pi >= 0) & (pi <= 1))


def _fixed_point(ended: float, opened: float, s: float, m: float = 0.0, p0: float = 1.0) -> float:
    """p = (E + m p0 + O p s / (p s + 1 - p)) / (E + m + O), solved as the quadratic it
    is, with E' = E + m p0 and T = E + m + O: T (s - 1) p^2 + (T - E' (s - 1) - O s) p -
    E' = 0. With m = 0 its roots are 1 (every call returns, a fixed point the EM leaves
    from p = 0.5) and the MLE, the smaller; the smaller root is the one in any case."""
    e1, t = ended + m * p0, ended + m + opened
    a = t * (s - 1.0)
    b = t - e1 * (s - 1.0) - opened * s
    return (-b + math.sqrt(b * b + 4 * a * e1)) / (2 * a)


def test_returning_with_a_memory_weighs_recent_calls():
    # 20,000 calls started at t = 0 and returned after 10 s; 2,000 started at t = 960 and
    # returned after 10 s (at 970); 2,000 started at 960 are still open at t = 1000 (age
    # 40 s). Every call that returned took 10 s: q90 = 10 s, tau = 1 x q90 = 10 s.
    def model(memory: float) -> DurationModel:
        m = DurationModel("tool", prior_mean=5.0, prior_weight=0.0, cure_memory=memory)
        for _ in range(20_000):
            m.observe(10.0, at=10.0)
        for _ in range(2_000):
            m.observe(10.0, at=970.0)
        return m

    opened = np.full(2_000, 40.0)
    s = 0.1 * 10.0 / 40.0  # the Lindy floor: 40 s is past every learnt duration
    # The whole run's share: E = 22,000, O = 2,000 (no memory, or no `now`).
    p_all = _fixed_point(22_000.0, 2_000.0, s)
    assert p_all > 0.9
    for m, now in ((model(0.0), 1000.0), (model(1.0), None)):
        assert m.returning(opened, now=now)[0] == pytest.approx(p_all, rel=1e-3)
    with_memory = model(1.0)
    assert with_memory.quantile(0.9) == pytest.approx(10.0, rel=0.02)
    p, pi = with_memory.returning(opened, now=1000.0)
    # The calls of t = 0 weigh e^-100; the recent ones, returned and open, started at 960
    # and weigh e^-4 each: E = O = 2,000 e^-4 = 36.6, with 20 pseudo calls at p_all.
    w = 2_000 * math.exp(-4.0)
    expected = _fixed_point(w, w, s, m=CURE_PRIOR_CALLS, p0=p_all)
    # (The open ages and their weights are taken on the bucket grid, ~2% wide.)
    assert p == pytest.approx(expected, rel=2e-2)
    assert 0.55 < p < 0.65  # against 0.51 for the recent calls alone, 0.92 for the run
    assert pi == pytest.approx(np.full(2_000, p * s / (p * s + 1 - p)), rel=0.03)


def test_the_memory_drops_starts_that_no_longer_weigh():
    m = DurationModel("tool", prior_mean=5.0, prior_weight=0.0, cure_memory=1.0)
    for k in range(3000):
        m.observe(10.0, at=10.0 + k * 1e-3)
    for _ in range(50):
        m.observe(10.0, at=970.0)
    before = len(m._starts)
    p, _ = m.returning(np.full(50, 40.0), now=1000.0)
    # The 3,000 calls of t = 0 weigh e^-100 < 1e-12 and outnumber those kept: dropped.
    assert before == 3050 and len(m._starts) == 50
    assert m.returning(np.full(50, 40.0), now=1000.0)[0] == pytest.approx(p, rel=1e-12)


def test_cure_memory_is_checked():
    with pytest.raises(ValueError, match="cure_memory"):
        DurationModel("tool", prior_mean=5.0, cure_memory=-1.0)
    with pytest.raises(ValueError, match="cure_memory"):
        DurationModel("tool", prior_mean=5.0, cure_memory=float("nan"))


def test_the_memory_is_kept_small_without_a_query():
    # A run whose windows never find a call open never asks for the cure rate: the
    # observations themselves drop the starts that no longer weigh, at each power of two.
    m = DurationModel("tool", prior_mean=5.0, prior_weight=0.0, cure_memory=1.0)
    for _ in range(4095):
        m.observe(10.0, at=10.0)
    assert len(m._starts) == 4095
    m.observe(10.0, at=2000.0)  # the 4,096th: the first 4,095 started 1,990 s = 199 tau earlier
    assert len(m._starts) == 1
    # Without a memory nothing is kept at all.
    off = DurationModel("tool", prior_mean=5.0)
    off.observe(10.0, at=10.0)
    assert len(off._starts) == 0


def test_the_closed_form_interpolation_is_numpys():
    from prorsa_forecaster import survival

    rng = np.random.default_rng(0)
    values = np.sort(rng.random(len(survival._EDGES)))
    # Large (closed form) and small (np.interp) arrays; every edge, off the grid, NaN, inf.
    big = np.concatenate((np.exp(rng.normal(0.0, 4.0, 20_000)), survival._EDGES,
                          [0.0, -1.0, 5e-4, 1e9, np.inf, -np.inf, np.nan]))
    for x in (big, big[:50]):
        got, want = survival.interp_edges(x, values), np.interp(x, survival._EDGES, values)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.nanmax(np.abs(got - want)) < 1e-12


def test_compress_is_unique_with_its_inverse():
    from prorsa_forecaster.survival import compress

    cells = np.array([7, 3, 7, 0, 9, 3, 3])
    used, inv = compress(cells, 10)
    want_used, want_inv = np.unique(cells, return_inverse=True)
    assert used.tolist() == want_used.tolist() == [0, 3, 7, 9]
    assert inv.tolist() == want_inv.tolist() and (used[inv] == cells).all()
    assert [a.tolist() for a in compress(np.zeros(0, np.int64), 5)] == [[], []]


def test_weighted_steps_sums_apart_per_group_on_both_paths():
    m = DurationModel("x", prior_mean=1.0, prior_weight=0.0)
    for d in (1.0, 2.0, 3.0, 4.0, 8.0):
        m.observe(d)
    elapsed = np.array([0.0, 1.5, 0.0, 2.5, 1.5])
    w = np.array([[1.0, 2.0], [3.0, 0.5], [2.0, 1.0], [1.0, 1.0], [0.0, 4.0]])
    table = m.bucket_table(elapsed, 4.0, 4)  # (rows, steps), row by row
    groups = np.array([0, 1, 1, 0, 5])
    for ngroups in (6, 40):  # the dense sum over (bucket, group), and the sparse one of many groups
        got = m.weighted_steps(elapsed, w, 4.0, 4, groups, ngroups)
        assert got.shape == (2, ngroups, 4)
        for g in range(ngroups):
            rows_ = groups == g
            assert got[:, g, :] == pytest.approx(w[rows_].T @ table[rows_], abs=1e-12)
    # The same with a time scale per row (theta 0 everywhere: the same numbers).
    got = m.weighted_steps(elapsed, w, 4.0, 4, groups, 6, theta=np.zeros(5))
    assert got == pytest.approx(m.weighted_steps(elapsed, w, 4.0, 4, groups, 6), abs=1e-12)
