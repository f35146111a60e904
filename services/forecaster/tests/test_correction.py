"""The robust layer: the lifecycle forecast blended with the naive predictors by their
cumulative errors (terms/correction.py), on hand-computed cases."""

import math

import numpy as np
import pytest

from prorsa_forecaster.terms.correction import HEAD_START, Blend, NewArrivals, SeriesBlend, WapeScale


def test_before_any_window_the_lifecycle_forecast_is_all_there_is():
    b = Blend(("lifecycle", "a", "b"))
    assert b.weights().tolist() == [1.0, 0.0, 0.0]
    assert SeriesBlend().combine(1234.0) == 1234.0


def _weights(log_w):
    w = np.exp(np.asarray(log_w) - max(log_w))
    return w / w.sum()


def test_three_predictors_by_hand():
    # Hedge on cumulative errors L_i with eta = sqrt(8 ln N / V), V the sum over windows of
    # the squared range of that window's errors; the prior gives the two naive ones -2 nats.
    b = Blend(("lifecycle", "a", "b"))
    gain = math.sqrt(8 * math.log(3))  # 2.9646

    # Window 1: every predictor exact. Nothing tells them apart: the prior alone.
    b.update([10.0, 10.0, 10.0], 10.0)
    assert b.spread == 0.0
    assert b.weights() == pytest.approx(_weights([0.0, -2.0, -2.0]))  # 0.787, 0.1065, 0.1065

    # Window 2: errors 10, 0, 10 (range 10): L = [10, 0, 10], V = 100, eta = gain / 10.
    b.update([0.0, 10.0, 20.0], 10.0)
    assert b.err.tolist() == [10.0, 0.0, 10.0] and b.spread == 100.0
    lw = [-gain, -2.0, -2.0 - gain]  # -2.965, -2, -4.965: exp 0.0516, 0.1353, 0.0070
    assert b.log_weights() == pytest.approx(lw)
    w = b.weights()
    assert w == pytest.approx([0.2660, 0.6980, 0.0360], abs=1e-4)
    # The published forecast of the next window is the weighted average of the three:
    # 0.266 x 30 + 0.698 x 20 + 0.036 x 10 = 22.30.
    assert float(w @ [30.0, 20.0, 10.0]) == pytest.approx(22.30, abs=0.01)

    # Window 3: errors 0, 20, 0 (range 20): L = [10, 20, 10], V = 500.
    b.update([10.0, 30.0, 10.0], 10.0)
    lw = [0.0, -2.0 - gain * 10 / math.sqrt(500), -2.0]  # 0, -3.326, -2: exp 1, 0.0359, 0.1353
    assert b.log_weights() == pytest.approx(lw)
    assert b.weights() == pytest.approx([0.8538, 0.0307, 0.1155], abs=1e-4)
    assert sum(b.named().values()) == pytest.approx(1.0)


def test_the_weights_do_not_depend_on_the_unit():
    # Tokens cancel: the same windows in thousands of tokens give the same weights.
    small, large = Blend(("lifecycle", "a", "b")), Blend(("lifecycle", "a", "b"))
    for f, a in (([5.0, 7.0, 1.0], 6.0), ([2.0, 4.0, 9.0], 3.0), ([8.0, 8.0, 2.0], 7.5)):
        small.update(f, a)
        large.update([1000 * x for x in f], 1000 * a)
    assert small.weights() == pytest.approx(large.weights())


def test_small_errors_on_a_large_demand_still_tell_the_predictors_apart():
    # A backlog of a million tokens every predictor knows; the lifecycle forecast is 2,000
    # tokens off each window, the naive one 1,000 (running WAPE 0.2% against 0.1%). After 10
    # windows: L = 20,000 and 10,000, V = 10 x 1,000^2, so the lifecycle forecast is
    # sqrt(8 ln 2) x 10,000 / (1,000 sqrt(10)) = 7.45 nats behind, 5.45 after the prior.
    b = Blend(("lifecycle", "naive"))
    for _ in range(10):
        b.update([1_002_000.0, 1_001_000.0], 1_000_000.0)
    behind = math.sqrt(8 * math.log(2)) * math.sqrt(10) - HEAD_START
    assert b.weights() == pytest.approx(_weights([-behind, 0.0]))
    assert b.weights()[0] == pytest.approx(0.0043, abs=1e-4)


def test_near_ties_keep_comparable_weights_and_the_average_beats_both():
    # Two predictors with errors of the same size, independent: neither stands out of the
    # noise, so the weights stay mixed, and the average's error (convexity) is below both.
    rng = np.random.default_rng(3)
    b = Blend(("lifecycle", "naive"), head_start=0.0)
    err = np.zeros(3)
    total = 0.0
    for _ in range(500):
        a = 1000.0
        f = a + 100.0 * rng.standard_normal(2)
        pub = float(b.weights() @ f)
        err += np.abs([pub, *f] - np.array(a))
        total += a
        b.update(f, a)
    assert 0.2 < b.weights()[0] < 0.8
    assert err[0] < 0.85 * min(err[1], err[2])


def test_the_published_wape_converges_to_the_best_predictors():
    # Three predictors of a noisy series: the lifecycle one biased by 5%, two unbiased with
    # noise of different sizes. The excess of the published running WAPE over the best
    # predictor's shrinks as windows close (O(1/sqrt(n))), and the biased one loses its weight.
    rng = np.random.default_rng(4)
    b = Blend(("lifecycle", "a", "b"))
    err, total, excess = np.zeros(4), 0.0, {}
    for n in range(1, 2001):
        a = 1000.0 * (1 + 0.3 * rng.standard_normal()) ** 2
        noise = rng.standard_normal(3)
        f = np.array([1.05 * a + 30 * noise[0], a + 40 * noise[1], a + 80 * noise[2]])
        pub = float(b.weights() @ f)
        err += np.abs(np.array([pub, *f]) - a)
        total += a
        b.update(f, a)
        if n in (50, 2000):
            excess[n] = (err[0] - err[1:].min()) / total
    assert excess[2000] < 0.0005
    assert excess[2000] < excess[50] / 3
    assert b.weights()[0] < 1e-3


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
    # The sampler term 500 tokens off in each of 29 windows (the first: all 0): it is
    # sqrt(8 ln 4 x 29) = 10.0 nats behind the naive ones, 8.0 after their 2-nat prior.
    behind = math.sqrt(8 * math.log(4) * 29) - HEAD_START
    w, level = n.split()
    assert w == pytest.approx(math.exp(-behind) / (math.exp(-behind) + 3))
    assert w < 2e-4 and level == pytest.approx(500.0 * (1 - w))


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
    # Decode: 200 tokens forecast from the requests known at t, and 300 from the arrivals
    # forecast (fewer than came: 400 + 400 tokens, of which the shares admit 1 x 400 +
    # 0.5 x 400 = 600).
    f = SimpleNamespace(
        components={"sampler": 0.0, "sandbox": 100.0, "tool": 1000.0, "reprefill": 0.0},
        raw_alpha=(1.0, 0.5), raw_decode=500.0, raw_decode_known=200.0,
        admit_detail=SimpleNamespace(alpha=(1.0, 0.5)),
        model_prefill=1600.0, model_decode=800.0, new_model=0.0, around_update=False,
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
    # The decode factor: 900 admitted against what the queue model makes of the arrivals
    # that came (200 + 600 = 800), not against its forecast of 500: the arrival forecast's
    # miss is the source factors' and the blend's to correct, not decode's a second time.
    assert corr.decode.factor == pytest.approx(900.0 / 800.0)
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


def test_windows_near_a_weight_update_learn_their_own_blend():
    from prorsa_forecaster.terms.correction import SeriesBlend

    sb = SeriesBlend()
    # A steady series that the naive predictors copy, and a lifecycle forecast 20% off
    # (its scaled copy, 0.83 of it, is right).
    for _ in range(30):
        sb.close(lifecycle=1200.0, actual=1000.0)
    steady = sb.blend.named()
    assert steady["lifecycle"] < 0.01 and sb.around_update.windows == 0
    # Nothing learnt yet near an update: the lifecycle forecast alone, which knows of it.
    assert sb.combine(lifecycle=300.0, around=True) == pytest.approx(300.0)
    assert sb.combine(lifecycle=300.0) > 600.0  # the steady blend leans on the naive ones
    # The update's windows: the level drops to 300, the lifecycle forecast says so and
    # last value does not. They teach the window's blend, not the steady one's.
    sb.close(lifecycle=300.0, actual=300.0, around=True)
    assert sb.around_update.windows == 1 and sb.blend.named() == steady
    assert sb.around_update.named()["lifecycle"] > 0.5
