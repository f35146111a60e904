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


def test_a_closed_window_teaches_each_correction_its_own_part():
    from types import SimpleNamespace

    from prorsa_forecaster.config import ForecastConfig
    from prorsa_forecaster.terms.correction import Correction

    corr = Correction(ForecastConfig(bias_half_life=1e9, bias_prior_windows=0, share_half_life=1e9))
    f = SimpleNamespace(
        components={"sampler": 0.0, "sandbox": 100.0, "tool": 1000.0, "reprefill": 0.0},
        raw_alpha=(1.0, 0.5), raw_decode=800.0, model_prefill=1600.0, model_decode=800.0, new_model=0.0,
    )
    for _ in range(2):  # a factor needs two windows
        corr.learn(f, prefill=2000.0, decode=900.0, decode_known=300.0,
                   sources={"sandbox": 50.0, "tool": 1500.0, "other": 200.0}, arrivals_by_step=[400.0, 400.0])
    factors = corr.factors()
    assert factors["tool"] == pytest.approx(1.5) and factors["sandbox"] == pytest.approx(0.5)
    assert factors["sampler"] == 1.0  # nothing predicted: nothing learnt
    # The admitted share: the arrivals admitted (900 - 300) against what the queue model's
    # shares make of the arrivals that came (1 x 400 + 0.5 x 400): 1.0 exactly, no change.
    assert corr.share.factor == pytest.approx(1.0)
    # The never-announced trajectories' 200 tokens feed the new-arrivals series.
    assert corr.new.naive[0].predict() == 200.0
    assert corr.prefill_blend.naive[0].predict() == 2000.0 and corr.decode_blend.naive[0].predict() == 900.0


def test_the_admitted_share_correction_keeps_each_sub_step_at_most_one():
    from prorsa_forecaster.config import ForecastConfig
    from prorsa_forecaster.terms.correction import Correction

    corr = Correction(ForecastConfig(share_half_life=1e9))
    for _ in range(10):
        corr.share.update(predicted=1000.0, realised=1500.0)
    k = corr.share.factor
    assert k == pytest.approx(1.5, rel=1e-6)  # steady: it stands out of its (zero) noise
    admitted, alpha = corr.admitted_share((0.8, 0.4), (1000.0, 1000.0), 1200.0)
    assert alpha.tolist() == pytest.approx([1.0, 0.6])
    assert admitted == pytest.approx(1000.0 + 600.0)


def test_the_scaled_lifecycle_forecast_shrinks_only_what_was_not_known_at_t():
    sb = SeriesBlend()
    # Five windows: 1000 tokens of backlog (known at t) and 500 predicted, of which 250
    # came: the predicted part is worth half of itself.
    for _ in range(5):
        sb.close(1500.0, 1250.0, known=1000.0)
    assert sb.scale.factor == pytest.approx(0.5, rel=0.02)
    lifecycle, scaled, *_ = sb.forecasts(1500.0, known=1000.0)
    assert lifecycle == 1500.0 and scaled == pytest.approx(1250.0, rel=0.01)


def test_errors_far_above_a_tiny_average_window_keep_the_weights_defined():
    # Windows of 1e-300 tokens against errors of 1e10: the scores overflow a float; the
    # weights are still finite, sum to one, and no warning escapes.
    b = Blend(("lifecycle", "last_value"))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.update([1e10, 2e10], 1e-300)
        w = b.weights()
    assert np.all(np.isfinite(w)) and math.isclose(w.sum(), 1.0)
    assert w[0] >= w[1]  # the smaller error keeps at least the larger weight
