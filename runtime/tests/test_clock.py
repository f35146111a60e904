"""The future bound every live consumer applies (prorsa_runtime.clock), on hand-made cases."""

import math

from prorsa_runtime.clock import DEFAULT_MAX_CLOCK_AHEAD_S, ahead_of_clock
from prorsa_runtime.settings import ServiceSettings


def test_an_event_within_the_bound_passes_and_one_past_it_is_refused_with_the_figures():
    now = 1_000_000.0
    assert ahead_of_clock(now - 3600, now, 300) is None  # the past: a replay, a late producer
    assert ahead_of_clock(now + 300, now, 300) is None  # at the bound
    why = ahead_of_clock(now + 301, now, 300)
    assert why is not None and "301 s ahead" in why and "max_clock_ahead_s = 300" in why
    year = ahead_of_clock(now + 365 * 86400, now, 300)
    assert year is not None and "31,536,000 s ahead" in year


def test_zero_or_none_turns_it_off_and_non_finite_ts_is_left_to_the_schema():
    assert ahead_of_clock(1e12, 0.0, 0) is None
    assert ahead_of_clock(1e12, 0.0, None) is None
    assert ahead_of_clock(math.inf, 0.0, 300) is None  # the codec refuses it before this


def test_every_service_has_the_bound_by_default(monkeypatch):
    assert ServiceSettings().max_clock_ahead_s == DEFAULT_MAX_CLOCK_AHEAD_S == 300.0
    monkeypatch.setenv("PRORSA_MAX_CLOCK_AHEAD_S", "60")
    assert ServiceSettings().max_clock_ahead_s == 60.0
