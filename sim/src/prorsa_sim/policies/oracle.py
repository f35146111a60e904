"""The ``oracle`` policy: the same allocator, fed the TRUE demand of the next window (the
simulator runs a copy of itself ahead). The limit of what forecasting can buy."""

from __future__ import annotations

from dataclasses import dataclass

from prorsa_emulated.costmodel import ModelProfile

from ..policy import Observation, SwitchRequest
from .prorsa import AllocatorDriver, forecast_event


@dataclass
class OraclePolicy:
    name: str = "oracle"
    wants_future: bool = True
    switch_mode: str | None = None
    driver: AllocatorDriver | None = None

    def __post_init__(self) -> None:
        self.driver = self.driver or AllocatorDriver(switch_mode=self.switch_mode)

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        return self.driver.initial_roles(profile, n_engines)

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        self.driver.observe(obs)
        if obs.future is None:
            return []
        true = obs.future(obs.window_s)
        kv_now = float(sum(v.kv_used_tokens for v in obs.engines if v.role == "decode"))
        # KV of admissions ~ their prompt tokens (κᴰ is the identity at token granularity).
        fc = forecast_event(obs, true.prefill_tokens, true.decode_admit_tokens, true.decode_admit_tokens, kv_now)
        return self.driver.decide(obs, fc)

    def on_update(self, obs: Observation) -> list[SwitchRequest]:
        return self.driver.on_update(obs)
