"""The forecaster service's settings (environment prefix ``PRORSA_FORECASTER_``)."""

from __future__ import annotations

from pydantic import Field

from prorsa_runtime.settings import ServiceSettings, settings_for
from prorsa_schemas.events import DEFAULT_WINDOW_S

from .config import MIN_WINDOW_S


class _ForecasterFields(ServiceSettings):
    horizon: float = Field(default=DEFAULT_WINDOW_S, ge=MIN_WINDOW_S, le=3600,
                           description="window length S in seconds")
    max_catch_up_windows: int = Field(
        default=360, ge=1, le=1_000_000,
        description="most windows one event or watermark closes one by one; a longer jump (a bus quiet for an hour "
        "at S = 10 s, a stream whose clocks disagree) closes the current window and reopens at the new time, "
        "without forecasts for the windows between (none would be fresh enough to act on)",
    )
    steps: int = Field(default=10, ge=1, le=1000, description="sub-steps per window")
    time_scale: float = Field(
        default=1.0, gt=0, le=1000,
        description="seconds of the cluster's time per second of the events' clock (an emulated cluster run "
        "faster than the wall clock): the prior durations used before any history are divided by it",
    )
    tracker_gate: bool = Field(
        default=True, description="pass events through the tracker core (drop duplicates and illegal transitions)"
    )
    max_pending: int = Field(
        default=20_000, ge=100, le=10_000_000,
        description="most stream messages requested from the server or received and not yet folded in (bounded "
        "memory; the server holds the rest)",
    )
    run_label: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_.-]{1,128}$",
        description="the `run` of published forecasts (default: the first trajectory event's run)",
    )


ForecasterSettings = settings_for("PRORSA_FORECASTER_", _ForecasterFields)
