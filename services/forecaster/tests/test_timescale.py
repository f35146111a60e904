"""The forecaster's priors for a cluster running ``speed`` times faster than the clock its
events carry (``prorsa up --emulated-cluster``): every prior duration divided by the speed."""

from __future__ import annotations

from dataclasses import fields

import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.service import Forecaster
from prorsa_forecaster.settings import ForecasterSettings


def test_prior_durations_divide_and_nothing_else_moves():
    cfg = ForecastConfig(horizon=1.0, prior_tool_s=5.0, prior_sandbox_cold_s=20.0)
    fast = cfg.time_scaled(10.0)
    assert fast.prior_tool_s == pytest.approx(0.5)
    assert fast.prior_sandbox_cold_s == pytest.approx(2.0)
    assert fast.prior_sync_start_s == pytest.approx(cfg.prior_sync_start_s / 10.0)
    for f in fields(cfg):
        if not (f.name.startswith("prior_") and f.name.endswith("_s")):
            assert getattr(fast, f.name) == getattr(cfg, f.name), f.name  # horizon, tokens, half-lives
    assert cfg.time_scaled(1.0) == cfg


@pytest.mark.parametrize("speed", [0.0, -2.0, float("nan"), float("inf")])
def test_bad_speed_is_refused(speed):
    with pytest.raises(ValueError, match="speed must be a positive number"):
        ForecastConfig().time_scaled(speed)


def test_the_service_reads_it_from_its_environment(monkeypatch):
    monkeypatch.setenv("PRORSA_FORECASTER_TIME_SCALE", "10")
    monkeypatch.setenv("PRORSA_FORECASTER_HORIZON", "1")
    svc = Forecaster(ForecasterSettings())
    assert svc.config.horizon == 1.0
    assert svc.config.prior_reward_s == pytest.approx(ForecastConfig().prior_reward_s / 10.0)
    monkeypatch.setenv("PRORSA_FORECASTER_TIME_SCALE", "0")
    with pytest.raises(ValueError, match="time_scale"):
        ForecasterSettings()
