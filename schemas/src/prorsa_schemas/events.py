"""Pydantic v2 models of every event type in the contract (docs/contract.md, version 1).

Every model is frozen and strict: a wrong JSON type (``"12"`` for an int, ``1`` for a bool)
is a violation, not something to coerce. A field an event type does not name is accepted
and kept (``model_extra``: the contract's forward compatibility); ``decode_event(...,
strict_fields=True)`` reports it. Optional fields default to ``None`` so that an encoded
event carries exactly the fields its producer set. ``v`` defaults to 1 for events built in
Python; on the wire it is required (:func:`prorsa_schemas.decode_event` checks it). The
class docstrings and field descriptions are the ``description`` of the JSON Schemas
(``prorsa schema``, docs/schema/). The envelope (common fields, types, the base model) is
:mod:`prorsa_schemas.envelope`.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field

from .envelope import ContractModel, Event, Id, Role, SwitchMode, SwitchRole, Tokens, TrajectoryEvent

# --- rollout events (published by the RL framework through the SDK) -----------------


class RunStarted(Event):
    """Describes the sampler, so forecasts and replays are self-contained."""

    type: Literal["run.started"] = "run.started"
    mode: Literal["sync", "async"]
    batch_size: int = Field(ge=1)
    max_staleness: int | None = Field(default=None, ge=0)
    group_size: int | None = Field(default=None, ge=1)
    injection: Literal["replace", "group"] | None = None
    prompt_tokens_mean: Tokens | None = None


class TrajectoryDispatched(TrajectoryEvent):
    """The data sampler launched a trajectory."""

    type: Literal["trajectory.dispatched"] = "trajectory.dispatched"
    prompt_tokens: Tokens
    group: Id | None = None
    policy_version: int | None = None


class SandboxStarted(TrajectoryEvent):
    """The trajectory's sandbox began starting (a prewarm-pool hit or a cold start)."""

    type: Literal["sandbox.started"] = "sandbox.started"
    mode: Literal["prewarm", "cold"]


class SandboxReady(TrajectoryEvent):
    """The sandbox is ready; the first model request follows."""

    type: Literal["sandbox.ready"] = "sandbox.ready"


class RequestQueued(TrajectoryEvent):
    """A model request joined the ready queue: a prefill arrival. prompt_tokens is the FULL
    prompt length, cached prefix included."""

    type: Literal["request.queued"] = "request.queued"
    req: Id
    turn: int = Field(ge=0)
    prompt_tokens: Tokens
    engine: Id | None = None
    # Added (optional, not in EVENTS.md v1): the attention data-parallel rank of
    # ``engine`` that the router placed the request on (SGLang's ``data_parallel_rank``),
    # 0-based. Absent when the router does not say.
    dp_rank: int | None = Field(default=None, ge=0, le=4095, description=(
        "added optional field: the attention data-parallel rank of engine that the router placed the "
        "request on (SGLang's data_parallel_rank), 0-based"))


class PrefillStarted(TrajectoryEvent):
    """A prefill instance began serving the request (optional: not every deployment can observe it)."""

    type: Literal["prefill.started"] = "prefill.started"
    req: Id
    engine: Id | None = None


class PrefillFinished(TrajectoryEvent):
    """Prefill done, first token out: a decode admission."""

    type: Literal["prefill.finished"] = "prefill.finished"
    req: Id
    engine: Id | None = None
    cached_tokens: Tokens | None = None
    decode_engine: Id | None = None


class DecodeFinished(TrajectoryEvent):
    """The response is complete."""

    type: Literal["decode.finished"] = "decode.finished"
    req: Id
    output_tokens: Tokens
    finish: Literal["tool", "stop", "length", "abort"]


class ToolStarted(TrajectoryEvent):
    """The trajectory is executing a tool call."""

    type: Literal["tool.started"] = "tool.started"
    tool: Id | None = None
    calls: int | None = Field(default=None, ge=1)


class ToolFinished(TrajectoryEvent):
    """The tool returned; a new request.queued for this trajectory follows."""

    type: Literal["tool.finished"] = "tool.finished"
    result_tokens: Tokens
    ok: bool | None = None


class RewardStarted(TrajectoryEvent):
    """Reward computation began."""

    type: Literal["reward.started"] = "reward.started"


class RewardFinished(TrajectoryEvent):
    """Reward done; admitted says whether the sample met the training-admission criteria."""

    type: Literal["reward.finished"] = "reward.finished"
    admitted: bool
    reward: float | None = None


class TrajectoryDropped(TrajectoryEvent):
    """The trajectory ends without a reward (e.g. past the staleness bound)."""

    type: Literal["trajectory.dropped"] = "trajectory.dropped"
    reason: Literal["stale", "error", "aborted"]


class PolicyUpdated(Event):
    """New weights reached the rollout engines; carried-over trajectories re-prefill (they
    send new request.queued events)."""

    type: Literal["policy.updated"] = "policy.updated"
    version: int
    # Added (optional, not in EVENTS.md v1): where the weights of ``version`` were loaded
    # from; the engine agent relaunches an engine on them in a restart-mode switch.
    model_path: str | None = Field(default=None, min_length=1, max_length=4096, description=(
        "added optional field: where the weights of version were loaded from (a path or model id, as "
        "SGLang's --model-path takes it); the engine agent relaunches an engine on these weights in a "
        "restart-mode switch"))


# --- engine events (published by engine agents) --------------------------------------


class Parallel(ContractModel):
    tp: int | None = Field(default=None, ge=1)
    dp: int | None = Field(default=None, ge=1)
    ep: int | None = Field(default=None, ge=1)
    attn_dp: int | None = Field(default=None, ge=1)


class EngineRegistered(Event):
    """An engine agent registered an engine (published by engine agents)."""

    type: Literal["engine.registered"] = "engine.registered"
    engine: Id
    server: Id
    role: Role
    gpus: int = Field(ge=1)
    kv_capacity_tokens: int = Field(ge=0)
    url: str | None = Field(default=None, max_length=2048)
    parallel: Parallel | None = None
    switch_modes: list[SwitchMode] | None = None


class EngineStats(Event):
    """An engine's periodic load and KV-cache figures (published by engine agents)."""

    type: Literal["engine.stats"] = "engine.stats"
    engine: Id
    role: Role
    running_reqs: int = Field(ge=0)
    queued_reqs: int = Field(ge=0)
    kv_used_tokens: int = Field(ge=0)
    kv_capacity_tokens: int = Field(ge=0)
    prefill_tokens_per_s: float | None = Field(default=None, ge=0.0)
    decode_tokens_per_s: float | None = Field(default=None, ge=0.0)
    cache_hit_rate: float | None = Field(default=None, ge=0.0, le=1.0)


class EngineSwitching(Event):
    """An engine began a role switch for a command (published by engine agents)."""

    type: Literal["engine.switching"] = "engine.switching"
    engine: Id
    cmd: Id
    from_role: Role
    to_role: Role
    mode: SwitchMode | None = None


class EngineSwitched(Event):
    """An engine finished a role switch (published by engine agents)."""

    type: Literal["engine.switched"] = "engine.switched"
    engine: Id
    cmd: Id
    from_role: Role
    to_role: Role
    seconds: float = Field(ge=0.0)
    mode: SwitchMode | None = None
    # Added (optional, not in EVENTS.md v1): the requests the switch aborted to reach idle
    # (running or waiting at the first abort_all), for the framework to re-queue. Absent
    # when none was aborted.
    aborted_reqs: int | None = Field(default=None, ge=1, description=(
        "added optional field: the requests the switch aborted to reach idle (running or waiting when "
        "the agent first sent abort_all); SGLang answers each with finish_reason abort and the framework "
        "re-queues them. Absent when none was aborted"))


class EngineSwitchFailed(Event):
    """A role switch failed; role is the role the engine is in now (published by engine agents)."""

    type: Literal["engine.switch_failed"] = "engine.switch_failed"
    engine: Id
    cmd: Id
    role: Role
    error: str = Field(min_length=1, max_length=4096)
    # Added (optional, not in EVENTS.md v1): the requests the switch aborted to reach idle
    # (running or waiting at the first abort_all), for the framework to re-queue. Absent
    # when none was aborted.
    aborted_reqs: int | None = Field(default=None, ge=1, description=(
        "added optional field: the requests the switch aborted to reach idle (running or waiting when "
        "the agent first sent abort_all); SGLang answers each with finish_reason abort and the framework "
        "re-queues them. Absent when none was aborted"))


class EngineDeregistered(Event):
    """An engine left the pool (published by engine agents)."""

    type: Literal["engine.deregistered"] = "engine.deregistered"
    engine: Id
    reason: str = Field(min_length=1, max_length=4096)


# --- control events (published by the services) --------------------------------------


class ForecastComponents(ContractModel):
    """Per-source terms of a prefill forecast (Appendix B.8) and the bias applied."""

    sampler: float | None = Field(default=None, ge=0.0)
    sandbox: float | None = Field(default=None, ge=0.0)
    ready: float | None = Field(default=None, ge=0.0)
    tool: float | None = Field(default=None, ge=0.0)
    inflight: float | None = Field(default=None, ge=0.0)
    bias: float | None = None


BlendWeight = Annotated[float, Field(ge=0.0, le=1.0)]
PredictorName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]


class ForecastBlend(ContractModel):
    """What a forecast is made of: per series, the weight (0..1) of each predictor in the
    published value (added optional field of forecast.window)."""

    prefill: dict[PredictorName, BlendWeight] | None = Field(default=None, description=(
        "weights of the predictors of prefill_tokens: lifecycle (the Appendix-B forecast) and the naive "
        "predictors last_value, ema, kalman"))
    decode: dict[PredictorName, BlendWeight] | None = Field(default=None, description=(
        "the same for decode_admit_tokens"))
    new: dict[PredictorName, BlendWeight] | None = Field(default=None, description=(
        "inside the lifecycle forecast, the arrivals of trajectories not live at t: lifecycle (the sampler "
        "term: launches after rewards, an announced sync batch) and the naive predictors of that series"))


DEFAULT_WINDOW_S = 10.0
"""S, the forecast window length in seconds (the paper's default): the one default every
service, the simulator and the tools share."""


class ForecastWindow(Event):
    """One forecast per window [t, t+horizon) (published by the forecaster)."""

    type: Literal["forecast.window"] = "forecast.window"
    t: float = Field(ge=0.0)
    horizon: float = Field(gt=0.0)
    prefill_tokens: float = Field(ge=0.0)
    decode_admit_tokens: float = Field(ge=0.0)
    decode_kv_tokens: float = Field(ge=0.0)
    decode_kv_now: float = Field(ge=0.0)
    components: ForecastComponents | None = None
    # Added (optional, not in EVENTS.md v1): which predictors the forecast used.
    blend: ForecastBlend | None = Field(default=None, description=(
        "added optional field: the weight of each predictor in the published values, per series "
        "(the lifecycle forecast beside the naive ones; docs/forecaster.md)"))


class PlannedSwitch(ContractModel):
    engine: Id
    to_role: SwitchRole


class AllocationPlan(Event):
    """The target PD ratio (published by the allocator)."""

    type: Literal["allocation.plan"] = "allocation.plan"
    t: float = Field(ge=0.0)
    n_prefill: int = Field(ge=0)
    n_decode: int = Field(ge=0)
    delta: float
    feasible: bool
    switches: list[PlannedSwitch] | None = None


class EngineCommand(Event):
    """A command to one engine agent (published by the allocator)."""

    type: Literal["engine.command"] = "engine.command"
    cmd: Id
    engine: Id
    action: Literal["switch_role"]
    to_role: SwitchRole
    deadline: float = Field(ge=0.0)


AnyEvent = Annotated[
    Union[
        RunStarted,
        TrajectoryDispatched,
        SandboxStarted,
        SandboxReady,
        RequestQueued,
        PrefillStarted,
        PrefillFinished,
        DecodeFinished,
        ToolStarted,
        ToolFinished,
        RewardStarted,
        RewardFinished,
        TrajectoryDropped,
        PolicyUpdated,
        EngineRegistered,
        EngineStats,
        EngineSwitching,
        EngineSwitched,
        EngineSwitchFailed,
        EngineDeregistered,
        ForecastWindow,
        AllocationPlan,
        EngineCommand,
    ],
    Field(discriminator="type"),
]

EVENT_TYPES: dict[str, type[Event]] = {
    cls.model_fields["type"].default: cls
    for cls in AnyEvent.__origin__.__args__  # type: ignore[attr-defined]
}
"""Every contract event type, by its ``type`` string."""

ROLLOUT_TYPES = frozenset({
    "run.started", "trajectory.dispatched", "sandbox.started", "sandbox.ready", "request.queued", "prefill.started",
    "prefill.finished", "decode.finished", "tool.started", "tool.finished", "reward.started", "reward.finished",
    "trajectory.dropped", "policy.updated",
})
ENGINE_TYPES = frozenset({
    "engine.registered", "engine.stats", "engine.switching", "engine.switched", "engine.switch_failed",
    "engine.deregistered",
})
CONTROL_TYPES = frozenset({"forecast.window", "allocation.plan", "engine.command"})

assert ROLLOUT_TYPES | ENGINE_TYPES | CONTROL_TYPES == set(EVENT_TYPES)
