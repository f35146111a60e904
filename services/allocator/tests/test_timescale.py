"""The allocator's settings for a cluster running ``speed`` times faster than the wall clock
(``prorsa up --emulated-cluster``): durations divided by the speed, rates multiplied."""

from __future__ import annotations

import pytest

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.settings import AllocatorSettings
from prorsa_allocator.timescale import RATES, time_scaled, time_scaled_env


def test_durations_divide_and_rates_multiply():
    cfg = AllocatorConfig(min_dwell_s=30.0, prefill_tokens_per_s=40_000.0, served_ramp_s=None,
                          decode_step_fixed_s=0.02)
    out = time_scaled(10.0, cfg)
    assert out["min_dwell_s"] == pytest.approx(3.0)
    assert out["drain_deadline_s"] == pytest.approx(cfg.drain_deadline_s / 10.0)
    assert out["decode_step_fixed_s"] == pytest.approx(0.002)
    assert out["prefill_tokens_per_s"] == pytest.approx(400_000.0)
    assert "served_ramp_s" not in out  # unset stays unset
    assert "decode_tpot_target_s" not in out
    assert "hysteresis" not in out and "lookahead_windows" not in out  # not durations


def test_speed_one_is_identity():
    cfg = AllocatorConfig()
    for name, value in time_scaled(1.0, cfg).items():
        assert value == pytest.approx(getattr(cfg, name))


def test_every_seconds_field_is_a_duration_or_a_listed_rate():
    # A new *_s field is scaled as a duration unless RATES says otherwise: its description
    # must not call it a rate (tokens per second) while RATES misses it.
    for name, field in AllocatorConfig.model_fields.items():
        if name.endswith("_s") and name not in RATES:
            assert "per second" not in (field.description or "").lower(), name
            assert "tokens/s" not in (field.description or ""), name
    assert set(RATES) <= set(AllocatorConfig.model_fields)


def test_env_round_trips_through_the_settings(monkeypatch):
    env = time_scaled_env(10.0)
    assert env["PRORSA_ALLOCATOR_MIN_DWELL_S"] == "3"
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = AllocatorSettings().allocator_config()
    assert cfg.min_dwell_s == pytest.approx(AllocatorConfig().min_dwell_s / 10.0)
    assert cfg.weight_sync_s == pytest.approx(AllocatorConfig().weight_sync_s / 10.0)


@pytest.mark.parametrize("speed", [0.0, -1.0, float("nan")])
def test_bad_speed_is_refused(speed):
    with pytest.raises(ValueError, match="speed must be > 0"):
        time_scaled(speed)
