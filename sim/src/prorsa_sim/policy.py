"""The policy interface and the two baselines (colocation, static PD).

At t = 0 a policy names every engine's role (:meth:`Policy.initial_roles`). Then at every
window boundary (every ``window_s`` seconds of event time) the simulator calls
:meth:`Policy.on_window` with an :class:`Observation` -- what the live system would see:
the rollout and engine events emitted since the previous window (fold them with
``prorsa_tracker.core.apply`` for the tracker's view) and the engine table (role, load,
KV use, whether it is switching). The policy returns :class:`SwitchRequest` s; the
simulator drains each engine (the router stops sending it work; what is left is aborted
after 60 s), then switches it (in place: seconds, restart: minutes, per model profile).

Oracle hook: ``Observation.future(horizon_s)`` runs a copy of the simulation ahead under
the current allocation and returns the TRUE demand of the next window
(:class:`FutureDemand`). It is expensive; only policies with ``wants_future = True`` get it.

A policy that defines ``on_update(obs)`` is asked at each weight update as well, once the
engines are paused and empty (the allocator's decision in the pause, which the service
makes at ``policy.updated``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from prorsa_emulated.costmodel import ModelProfile


@dataclass(frozen=True)
class EngineView:
    """One row of the engine table, as ``engine.stats`` reports it."""

    engine: str
    role: str
    switching: bool
    to_role: str | None
    gpus: int
    running_reqs: int
    queued_reqs: int
    kv_used_tokens: int
    kv_capacity_tokens: int


@dataclass(frozen=True)
class FutureDemand:
    """True demand of ``[t, t + horizon)`` (what the forecast is measured against)."""

    t: float
    horizon: float
    prefill_tokens: int
    """prompt_tokens of requests queued in the window plus backlog at ``t`` (EVENTS.md)."""
    decode_admit_tokens: int
    """prompt_tokens of requests whose prefill finished in the window."""
    arrival_tokens: int = 0
    """prompt_tokens of requests queued in the window only (no backlog)."""


@dataclass
class Observation:
    """What a policy sees at a window boundary."""

    t: float
    window_s: float
    events: list
    """prorsa_schemas events emitted in ``(t - window_s, t]`` (rollout + engine)."""
    engines: list[EngineView]
    profile: ModelProfile
    total_gpus: int
    future: Callable[[float], FutureDemand] | None = None


@dataclass(frozen=True)
class SwitchRequest:
    """Ask one engine to take another role."""

    engine: str
    to_role: str
    mode: str = "in_place"


class Policy(Protocol):
    """What the simulator calls. Implementations must be deterministic."""

    name: str
    wants_future: bool

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]: ...

    def on_window(self, obs: Observation) -> list[SwitchRequest]: ...

    # Optional: ``on_update(obs) -> list[SwitchRequest]``, asked at each weight update
    # once every engine is paused and empty (``obs.events``: this window's events so far,
    # which the next ``on_window`` hands on again).


@dataclass
class Colocation:
    """Every engine serves prefill and decode (SGLang without disaggregation)."""

    name: str = "colocation"
    wants_future: bool = False

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        return ["mixed"] * n_engines

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        return []


@dataclass
class StaticPD:
    """A fixed P:D ratio for the whole run."""

    n_prefill: int
    n_decode: int
    name: str = field(default="")
    wants_future: bool = False

    def __post_init__(self) -> None:
        if self.n_prefill < 1 or self.n_decode < 1:
            raise ValueError("static PD needs at least one prefill and one decode engine")
        self.name = self.name or f"static:{self.n_prefill}:{self.n_decode}"

    def initial_roles(self, profile: ModelProfile, n_engines: int) -> list[str]:
        if self.n_prefill + self.n_decode != n_engines:
            raise ValueError(
                f"{self.name}: P + D must equal the {n_engines} engines of {profile.name} "
                f"({profile.gpus_per_engine} GPUs each)"
            )
        return ["prefill"] * self.n_prefill + ["decode"] * self.n_decode

    def on_window(self, obs: Observation) -> list[SwitchRequest]:
        return []


def static_sweep_ratios(n_engines: int, max_points: int = 7) -> list[tuple[int, int]]:
    """P:D ratios the ``static`` sweep tries: all of them for small clusters, else
    ``max_points`` evenly spaced ones (a 32-engine sweep of 31 runs is too slow)."""
    all_p = list(range(1, n_engines))
    if len(all_p) <= max_points:
        chosen = all_p
    else:
        chosen = sorted({round(1 + i * (n_engines - 2) / (max_points - 1)) for i in range(max_points)})
    return [(p, n_engines - p) for p in chosen]
