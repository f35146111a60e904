"""The ``prorsa`` policy: the real forecaster and allocator cores, fed only what the live
system would see (the window's events and the engine table)."""

from __future__ import annotations

from dataclasses import dataclass

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.planner import Allocator
from prorsa_emulated.costmodel import ModelProfile
from prorsa_schemas import EngineCommand, EngineRegistered, ForecastComponents, ForecastWindow

from ..policy import EngineView, Observation, SwitchRequest


def prefill_rate_computed(profile: ModelProfile) -> float:
    """Computed (uncached) prefill tokens/s of one engine: every attention-DP rank runs a
    full chunk per ``prefill_time(chunk)`` (the profile's own cost model)."""
    chunk = profile.chunk_size
    return profile.attn_dp * chunk / profile.prefill_time(chunk)


def decode_step_prior(profile: ModelProfile) -> dict[str, float]:
    """The per-ENGINE decode step model (t0, per sequence, per KV token) an operator would
    configure from the profile: sequences and KV spread evenly over the attention-DP ranks,
    which step together. It is the prior until the allocator's fit from the decode
    engines' engine.stats decode_tokens_per_s is usable, as live."""
    ranks = profile.attn_dp
    per_kv_rank = profile.kv_read_bytes_per_token / (profile.gpu.hbm_effective * profile.gpus_per_rank)
    return dict(
        decode_step_fixed_s=profile.decode_fixed_s,
        decode_step_per_seq_s=profile.decode_s_per_seq / ranks,
        decode_step_per_kv_token_s=per_kv_rank / ranks,
    )


# AllocatorConfig fields of each rule a policy spec names.
_RULES = {
    "priced": {"rule": "priced"},
    "paper": {"rule": "paper"},
    "latency": {"rule": "priced", "objective": "turn_latency"},
    "capacity": {"rule": "priced", "objective": "capacity"},
}


@dataclass
class AllocatorDriver:
    """Drives :class:`Allocator` from simulator observations (shared by prorsa and oracle)."""

    config: AllocatorConfig | None = None
    """None: the defaults, with the switch-cost priors an operator would set for this model
    (the profile's in-place and restart times; both are then learned from engine.switched)."""
    switch_mode: str | None = None
    """``in_place`` / ``restart``; None: in place when the profile allows it."""
    tpot_slack: float | None = None
    """The allocator's ``decode_tpot_slack`` (decode sized by step time too); None: off."""
    rule: str = "priced"
    """The allocator's gain test: ``priced`` (default: its objective by the run's mode),
    ``paper`` (``prorsa:paper``), ``latency`` (``prorsa:latency``: ``priced`` with the
    ``turn_latency`` objective) or ``capacity`` (``prorsa:capacity``: ``priced`` with the
    ``capacity`` objective)."""
    overrides: dict | None = None
    """AllocatorConfig fields set over the defaults and the profile's priors (an ablation:
    ``benchmarks/allocator_trace.py --set``); ignored when ``config`` is given."""
    allocator: Allocator | None = None
    _window: int = 0
    _folded: int = 0
    """How many of the current window's events ``on_update`` has folded in already."""

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        n_p = max(1, n_engines // 2)
        return ["prefill"] * n_p + ["decode"] * (n_engines - n_p)

    def observe(self, obs: Observation) -> None:
        """Fold the window's engine events in (θᴾ from engine.stats, switch costs from
        engine.switched); sync the engine table."""
        if self.allocator is None:
            prof = obs.profile
            # Priors an operator would configure for this model; θᴾ is then learned from the
            # backlogged prefill engines' engine.stats, switch costs from engine.switched.
            fields = dict(
                prefill_tokens_per_s=prefill_rate_computed(prof),
                in_place_switch_s=prof.in_place_switch_s, restart_switch_s=prof.restart_switch_s,
                decode_tpot_slack=self.tpot_slack, **decode_step_prior(prof),
                **_RULES[self.rule],
            )
            cfg = self.config or AllocatorConfig(**{**fields, **(self.overrides or {})})
            self.allocator = Allocator(cfg)
        self._fold(obs)
        self._folded = 0  # the next window's events are a new list

    def _fold(self, obs: Observation) -> None:
        alloc = self.allocator
        assert alloc is not None
        for ev in obs.events[self._folded:]:
            # The simulator's switch ids are its own: our commands are tracked by _sync.
            # policy.updated opens the weight-update pause (switches then need no drain);
            # run.started's mode decides the 'auto' objective.
            if ((ev.type.startswith("engine.") and ev.type != "engine.command")
                    or ev.type in ("policy.updated", "run.started")):
                alloc.handle(ev, act=False)
        self._folded = len(obs.events)
        alloc.now = max(alloc.now, obs.t)
        self._sync(obs.engines, obs)

    def on_update(self, obs: Observation) -> list[SwitchRequest]:
        """A weight update, the engines paused and empty: the window's events so far are
        folded in (the update among them) and the allocator's pause decision is taken
        (:meth:`Allocator.on_pause`), as the service takes it at ``policy.updated``."""
        if self.allocator is None:
            return []
        self._fold(obs)
        decision = self.allocator.on_pause()
        if decision is None:
            return []
        mode = self.mode(obs)
        return [SwitchRequest(e.engine, e.to_role, mode) for e in decision.events if isinstance(e, EngineCommand)]

    def mode(self, obs: Observation) -> str:
        """The switch mode this policy uses (checked against what the profile supports)."""
        modes = obs.profile.switch_modes
        mode = self.switch_mode or ("in_place" if "in_place" in modes else "restart")
        if mode not in modes:
            raise ValueError(f"{obs.profile.name} does not support {mode!r} switches (only {', '.join(modes)})")
        return mode

    def _sync(self, engines: list[EngineView], obs: Observation) -> None:
        """The simulator's engine table is authoritative: its switch ids are its own."""
        table = self.allocator.table  # type: ignore[union-attr]
        # What the engines advertise decides the switch cost the allocator prices in.
        modes = (self.mode(obs),)
        for v in engines:
            view = table.engines.get(v.engine)
            if view is None:
                table.apply(EngineRegistered(
                    id=f"reg-{v.engine}", ts=obs.t, run="sim", engine=v.engine, server=v.engine, role=v.role,
                    gpus=v.gpus, kv_capacity_tokens=v.kv_capacity_tokens,
                    switch_modes=list(obs.profile.switch_modes),
                ))
                view = table.engines[v.engine]
            view.switch_modes = modes
            if view.role != v.role:
                view.role, view.since_ts, view.switched = v.role, obs.t, True
            view.running_reqs, view.queued_reqs, view.kv_used_tokens = v.running_reqs, v.queued_reqs, v.kv_used_tokens
            if v.switching:
                view.switching_to = v.to_role
            elif view.command is not None and view.role == view.command.to_role:
                table.commands.pop(view.command.cmd, None)
                view.command, view.switching_to = None, None
            elif view.command is None:
                view.switching_to = None

    def decide(self, obs: Observation, fc: ForecastWindow) -> list[SwitchRequest]:
        self._window += 1
        out = self.allocator.handle(fc)  # type: ignore[union-attr]
        mode = self.mode(obs)
        return [SwitchRequest(e.engine, e.to_role, mode) for e in out if isinstance(e, EngineCommand)]


def forecast_event(obs: Observation, prefill: float, admit: float, kv_hat: float, kv_now: float,
                   components: ForecastComponents | None = None) -> ForecastWindow:
    """The ``forecast.window`` the forecaster service would publish for this window
    (``components``: :meth:`~prorsa_forecaster.core.Forecast.contract_components`, as the
    service fills them)."""
    return ForecastWindow(
        id=f"fc-{obs.t:.3f}", ts=obs.t, run="sim", t=obs.t, horizon=obs.window_s,
        prefill_tokens=max(0.0, prefill), decode_admit_tokens=max(0.0, admit),
        decode_kv_tokens=max(0.0, kv_hat), decode_kv_now=max(0.0, kv_now), components=components,
    )


@dataclass
class ProrsaPolicy:
    """Forecast (Appendix B, the forecaster's WindowLoop) -> allocation (§4.2) -> switches."""

    name: str = "prorsa"
    wants_future: bool = False
    switch_mode: str | None = None
    driver: AllocatorDriver | None = None
    _loop: object | None = None
    _latest: object | None = None

    def __post_init__(self) -> None:
        self.driver = self.driver or AllocatorDriver(switch_mode=self.switch_mode)

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        return self.driver.initial_roles(profile, n_engines)

    def _latest_forecast(self, loop):
        """The newest forecast the loop opened, through its public ``opened`` queue (the one
        the forecaster service drains), not its private ``_current``."""
        opened = loop.opened
        while opened:
            self._latest = opened.popleft()
        return self._latest

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        from prorsa_forecaster.config import ForecastConfig
        from prorsa_forecaster.windows import WindowLoop

        if self._loop is None:
            self._loop = WindowLoop(ForecastConfig(horizon=obs.window_s))
        loop = self._loop
        for ev in obs.events:
            loop.feed(ev)  # type: ignore[attr-defined]
        loop.advance(obs.t)  # type: ignore[attr-defined]
        self.driver.observe(obs)
        f = self._latest_forecast(loop)  # the forecast for [t, t+S)
        if f is None:
            return []
        fc = forecast_event(obs, f.prefill_tokens, f.decode_admit_tokens, f.decode_kv_tokens, f.decode_kv_now,
                            f.contract_components())
        return self.driver.decide(obs, fc)

    def on_update(self, obs: Observation) -> list[SwitchRequest]:
        return self.driver.on_update(obs)
