"""The robust layer: the lifecycle forecast blended with the naive predictors by their
running WAPE (blend.py), on hand-computed cases."""

import math

import numpy as np
import pytest

from prorsa_forecaster.terms.correction import ETA, HEAD_START, Blend, NewArrivals, SeriesBlend, WapeScale


def test_before_any_window_the_lifecycle_forecast_is_all_there_is():
    b = Blend(("lifecycle", "a", "b"))
    assert b.weights().tolist() == [1.0, 0.0, 0.0]
    assert SeriesBlend().combine(1234.0) == 1234.0


def test_weights_follow_the_running_wape_in_units_of_an_average_window():
    b = Blend(("lifecycle", "naive"))
    b.update([100.0, 90.0], 100.0)  # errors 0 and 10
    b.update([50.0, 100.0], 100.0)  # errors 50 and 0
    # Mean actual 100: scores 50/100 + 0 and 10/100 + HEAD_START.
    s = np.array([0.5, 0.1 + HEAD_START])
    assert b.scores() == pytest.approx(s)
    w = np.exp(-ETA * (s - s.min()))
    assert b.weights() == pytest.approx(w / w.sum())
    assert sum(b.named().values()) == pytest.approx(1.0)


def test_the_wape_scale_is_the_weighted_median_of_actual_over_forecast():
    s = WapeScale()
    for f, a in ((100.0, 50.0), (100.0, 50.0), (300.0, 0.0), (100.0, 100.0)):
        s.update(f, a)
    assert s.factor == 1.0  # fewer than MIN_WINDOWS windows: no scale
    s.update(100.0, 300.0)
    # Ratios 0 (weight 300), 0.5 (200), 1 (100), 3 (100): the weight passes half of 700
    # in the 0.5 bin (within the grid's 1.7%).
    assert s.factor == pytest.approx(0.5, rel=0.02)
    s.update(200.0, 0.0)
    # 0 now weighs 500 of 900: the median is 0 (the forecast is best left out).
    assert s.factor == 0.0
    s2 = WapeScale()
    for _ in range(5):
        s2.update(100.0, 150.0)
    assert s2.factor == 1.0  # it only shrinks


def test_on_a_steady_series_a_useless_lifecycle_forecast_hands_over_to_the_naive_ones():
    sb = SeriesBlend()
    rng = np.random.default_rng(0)
    err = {"blend": 0.0, "last_value": 0.0, "ema": 0.0, "kalman": 0.0}
    total = 0.0
    for _ in range(200):
        a = 1000.0 + 50.0 * rng.standard_normal()
        f = sb.combine(0.0)  # the lifecycle view explains none of it
        err["blend"] += abs(f - a)
        for b in sb.naive:
            err[b.name] += abs(b.predict() - a)
        total += a
        sb.close(0.0, a)
    best = min(v for k, v in err.items() if k != "blend")
    # The first window (lifecycle alone, 100% error) and a few while the weights move.
    assert err["blend"] / total < best / total + 0.03
    assert sb.blend.named()["lifecycle"] < 1e-3


def test_a_good_lifecycle_forecast_keeps_the_weight():
    sb = SeriesBlend()
    rng = np.random.default_rng(1)
    for k in range(100):
        a = 1000.0 * (1 + (k % 7 == 0) * 3)  # bursts the naive predictors cannot see coming
        sb.close(a * (1 + 0.01 * rng.standard_normal()), a)
    w = sb.blend.named()
    assert w["lifecycle"] + w["lifecycle_scaled"] > 0.99


def test_new_arrivals_split_the_sampler_term_from_the_naive_level():
    n = NewArrivals()
    assert n.split() == (1.0, 0.0)
    for _ in range(30):
        n.close(0.0, 500.0)  # the sampler term says nothing; 500 tokens arrive every window
    w, level = n.split()
    assert w < 1e-6 and level == pytest.approx(500.0, rel=1e-3)


def test_garbage_in_gives_finite_non_negative_out():
    sb = SeriesBlend()
    for f, a in ((math.nan, 10.0), (math.inf, 5.0), (-3.0, 1.0), (1e300, 0.0), (5.0, math.nan), (5.0, -1.0)):
        sb.close(f, a)
        out = sb.combine(f)
        assert math.isfinite(out) and out >= 0.0
