"""The forecaster's tunables (one frozen object, validated once)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from prorsa_schemas.events import DEFAULT_WINDOW_S

MIN_WINDOW_S = 0.1
"""The shortest window S (CHOICE): a tenth of the live demo's shortest (1 s of wall time at
10x). Each window is a forecast (about 2 ms on a simulator log); at S = 1e-6 s one second
of a log is a million of them, and the forecaster never catches up."""


@dataclass(frozen=True)
class ForecastConfig:
    """Parameters of the Appendix-B predictor.

    Attributes:
        horizon: S, the window length in seconds (paper default 10 s).
        steps: sub-steps per window used to place predicted arrivals in time (for the
            decode-admission queue simulation and the launch-delay convolution).
        tool_ema_alpha: alpha of the per-trajectory EMA of the prompt growth after a tool
            call (paper: 0.1).
        bias_half_life: windows over which forecast residuals are averaged for the online
            bias correction (0 turns the correction off).
        bias_clip: the correction factor is kept within [1/bias_clip, bias_clip]; 4
            by default, the outlier threshold (a window beyond 4x is a miss, not a bias,
            so above 4 the clip changes nothing): a bias of 2-4x seen window after window
            is corrected, less the prior's shrinkage (docs/forecaster.md, "Online
            correction").
        bias_prior_windows: the prefill corrections count this many windows of average
            volume at ratio 1 (shrinking a factor learnt from a few noisy windows towards
            1). The decode correction instead keeps the part of its ratio that stands
            out of its own noise (see ``BiasCorrector``).
        cache_same_pseudo: the share of requests routed back to the engine that caches
            their prefix is learnt per log2 bin of the prefix's size, each bin shrunk
            towards the pooled share by this many observations of it (inf: one share
            for every size).
        cache_age_pseudo: the share of a warm request's cached prefix found cached is
            learnt per half-octave bin of the caches' age (seconds since the weight update
            that flushed them), each bin shrunk towards the pooled share by this many
            observations of it (inf: one share at every age).
        tool_turn_pseudo: the share of responses that call a tool (the rest end the
            trajectory) is learnt per turn index (bins 0-15, then octaves), each bin
            shrunk towards the pooled share by this many observations of it (inf: one
            share for every turn).
        share_half_life: windows over which the admitted share of predicted arrivals is
            corrected: each closed window compares the requests that arrived in it and
            were prefilled before its end with what the queue model's per-sub-step
            admitted share makes of the window's actual arrivals (0: no correction).
        use_dp_rank: a queued or in-flight request whose ``request.queued`` names the
            attention data-parallel rank it was placed on (the optional ``dp_rank``) is
            served by that rank's queue; False: the requests of an instance are dealt
            over its ranks in arrival order (for a router whose named rank is not the one
            that serves the request; a log without the field is served that way).
        kv_page_tokens: kappa^D rounds a prompt up to whole KV pages of this many tokens.
        duration_half_life: observations over which old durations are forgotten.
        returning_memory: the share of tool calls that return at all (the cure rate; a
            chat's user may not write again) is estimated from recent calls: each call
            weighs exp(-age / tau) with tau this many times the tool durations' q90
            (0: every call since the start weighs the same). 1 by default (CHOICE: the
            shortest memory over which most of the calls that return have returned).
        frailty_min_calls: tool calls finished before the group and trajectory effects on
            tool durations are estimated (frailty.py); until then, and whenever the
            durations do not cluster by group or trajectory, every call follows the pooled
            distribution. 200 by default (CHOICE: the ANOVA's variance estimates settle
            over a few dozen groups of a few calls each).
        prior_reward_s, prior_sandbox_prewarm_s, prior_sandbox_cold_s, prior_start_s,
        prior_tool_s, prior_launch_s: prior means (seconds) used before any history.
        prior_sync_start_s: prior mean of the announcement of a sync batch (run.started,
            or policy.updated after the last batch drained) -> its first dispatch: at once
            (a trainer dispatches the next batch when the weights are loaded).
        prior_prompt_tokens: initial prompt length assumed before any is observed (a
            ``run.started.prompt_tokens_mean`` overrides it).
    """

    horizon: float = DEFAULT_WINDOW_S
    steps: int = 10
    tool_ema_alpha: float = 0.1
    bias_half_life: float = 6.0
    bias_clip: float = 4.0
    bias_prior_windows: float = 2.0
    cache_same_pseudo: float = 20.0
    cache_age_pseudo: float = 20.0
    tool_turn_pseudo: float = 20.0
    share_half_life: float = 6.0
    use_dp_rank: bool = True
    kv_page_tokens: int = 1
    duration_half_life: float | None = 5000.0
    returning_memory: float = 1.0
    frailty_min_calls: int = 200
    prior_reward_s: float = 5.0
    prior_sandbox_prewarm_s: float = 1.0
    prior_sandbox_cold_s: float = 20.0
    prior_start_s: float = 2.0
    prior_tool_s: float = 5.0
    prior_launch_s: float = 1.0
    prior_sync_start_s: float = 1.0
    prior_prompt_tokens: int = 2048

    def __post_init__(self) -> None:
        for f in fields(self):  # no knob is NaN (it passes every comparison below)
            v = getattr(self, f.name)
            if isinstance(v, float) and math.isnan(v):
                raise ValueError(f"{f.name} must be a number, got nan")
        if not (math.isfinite(self.horizon) and self.horizon >= MIN_WINDOW_S):
            raise ValueError(f"horizon must be a number of seconds >= {MIN_WINDOW_S:g}, got {self.horizon!r}")
        if not (1 <= self.steps <= 1000):
            raise ValueError(f"steps must be in 1..1000, got {self.steps!r}")
        if not (0 < self.tool_ema_alpha <= 1):
            raise ValueError(f"tool_ema_alpha must be in (0, 1], got {self.tool_ema_alpha!r}")
        if not (self.bias_half_life >= 0 and math.isfinite(self.bias_half_life)):
            raise ValueError(f"bias_half_life must be >= 0, got {self.bias_half_life!r}")
        if not self.bias_clip >= 1:
            raise ValueError(f"bias_clip must be >= 1, got {self.bias_clip!r}")
        if not self.cache_same_pseudo >= 0:  # inf allowed; NaN refused
            raise ValueError(f"cache_same_pseudo must be >= 0 (inf: no size bins), got {self.cache_same_pseudo!r}")
        if not self.cache_age_pseudo >= 0:  # inf allowed; NaN refused
            raise ValueError(f"cache_age_pseudo must be >= 0 (inf: one share at every age), got {self.cache_age_pseudo!r}")
        if not self.tool_turn_pseudo >= 0:  # inf allowed; NaN refused
            raise ValueError(f"tool_turn_pseudo must be >= 0 (inf: one share for every turn), got {self.tool_turn_pseudo!r}")
        if not (self.share_half_life >= 0 and math.isfinite(self.share_half_life)):
            raise ValueError(f"share_half_life must be >= 0 (0: off), got {self.share_half_life!r}")
        if self.duration_half_life is not None and not (math.isfinite(self.duration_half_life)
                                                         and self.duration_half_life > 0):
            raise ValueError(f"duration_half_life must be > 0 observations (None: never forget), "
                             f"got {self.duration_half_life!r}")
        if not (math.isfinite(self.returning_memory) and self.returning_memory >= 0):
            raise ValueError(f"returning_memory must be >= 0 (multiples of the tool durations' q90), "
                             f"got {self.returning_memory!r}")
        if not (self.bias_prior_windows >= 0 and math.isfinite(self.bias_prior_windows)):
            raise ValueError(f"bias_prior_windows must be >= 0, got {self.bias_prior_windows!r}")
        if self.frailty_min_calls < 1:
            raise ValueError(f"frailty_min_calls must be >= 1, got {self.frailty_min_calls!r}")
        if self.kv_page_tokens < 1:
            raise ValueError(f"kv_page_tokens must be >= 1, got {self.kv_page_tokens!r}")
        for name in (
            "prior_reward_s",
            "prior_sandbox_prewarm_s",
            "prior_sandbox_cold_s",
            "prior_start_s",
            "prior_tool_s",
            "prior_launch_s",
            "prior_sync_start_s",
        ):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
        if self.prior_prompt_tokens < 0:
            raise ValueError(f"prior_prompt_tokens must be >= 0, got {self.prior_prompt_tokens!r}")

    def time_scaled(self, speed: float) -> "ForecastConfig":
        """This config for a cluster whose time runs ``speed`` times faster than the clock
        its events are stamped with (the emulated cluster of ``prorsa up --speed``): every
        prior duration (``prior_*_s``) divided by ``speed``. The horizon is left alone: it
        is set in the events' seconds already. Every other knob counts windows,
        observations or tokens."""
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError(f"speed must be a positive number, got {speed!r}")
        return replace(self, **{f.name: getattr(self, f.name) / speed for f in fields(self)
                                if f.name.startswith("prior_") and f.name.endswith("_s")})
