"""The WAPE difference against another predictor and its standard error
(:func:`prorsa_forecaster.evaluate.wape_excess`), on hand-computed cases."""

import math

import pytest

from prorsa_forecaster.evaluate import wape_excess


def test_excess_and_batch_means_standard_error_by_hand():
    # 4 windows, actual 10 each (total 40). Errors: forecast |12-10|, |10-10|, |7-10|,
    # |10-10| = 2, 0, 3, 0; other 1, 1, 1, 1. d = 1, -1, 2, -1: excess 1 / 40.
    # Blocks: isqrt(4) = 2 of 2 windows, sums 0 and 1, mean 0.5, sample variance 0.5;
    # Var(sum d) ~ 2 x 0.5 = 1: se = 1 / 40.
    gap = wape_excess([12, 10, 7, 10], [11, 9, 11, 9], [10, 10, 10, 10])
    assert gap[0] == pytest.approx(1 / 40) and gap[1] == pytest.approx(1 / 40)


def test_a_forecast_better_in_every_block_has_a_negative_excess():
    actual = [100.0] * 9
    gap = wape_excess([101.0, 99.0, 102.0] * 3, [110.0, 90.0, 115.0] * 3, actual)
    # |errors| 1, 1, 2 against 10, 10, 15 per block of 3: d = -31 per block, 3 blocks.
    assert gap[0] == pytest.approx(-93 / 900)
    assert gap[1] == pytest.approx(0.0)  # every block the same: no spread


def test_too_few_windows_or_no_actual_volume():
    assert wape_excess([1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) is None
    assert wape_excess([1.0] * 5, [2.0] * 5, [0.0] * 5) is None
    assert math.isfinite(wape_excess([1.0] * 5, [2.0] * 5, [1.0] * 5)[0])
