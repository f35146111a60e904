"""The rollout driver's settings (validated; every bad value is refused with its name)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from prorsa_emulated.weights import PauseMode
from prorsa_runtime.settings import check_http_url, check_nats_url


class DriverConfig(BaseModel):
    """What the driver runs and where it sends it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    router_url: str = Field(description="router base URL, e.g. http://127.0.0.1:30080")
    nats_url: str = Field(default="nats://127.0.0.1:4222", description="the bus")
    run: str = Field(default="demo", pattern=r"^[A-Za-z0-9_.-]{1,128}$", description="run id of every event")
    workload: str = Field(default="general", description="simulator workload: math, coding or general")
    batch_size: int = Field(default=16, ge=1, le=100_000, description="trajectories per step (sync rollout)")
    steps: int = Field(default=2, ge=1, le=1000, description="rollout steps (policy updates in between)")
    max_turns: int = Field(default=6, ge=1, le=1000, description="cap on a trajectory's turns (keeps the demo short)")
    max_output: int = Field(default=512, ge=1, le=1_000_000, description="cap on output tokens per turn")
    speed: float = Field(default=10.0, gt=0, le=10_000, description="simulated seconds per wall second")
    train_s: float = Field(default=10.0, ge=0, description="simulated trainer time between steps")
    staleness: int = Field(default=0, ge=0, le=1000, description=(
        "0: synchronous steps; N > 0: asynchronous rollout, a trajectory used at most N policy "
        "versions after it was dispatched (AReaL-style launch budget, stale ones dropped)"))
    over_dispatch: float | None = Field(default=None, ge=1.0, le=100.0, description=(
        "async: trajectories live at once, in batches (default 1 + staleness / 4, as the simulator)"))
    weight_sync_s: float = Field(default=5.0, ge=0, description=(
        "simulated seconds the engines stay paused while new weights load, at every policy "
        "update (sync: between two steps; async: while rollout goes on)"))
    pause_mode: PauseMode = Field(default="abort", description=(
        "how the weight sync pauses the engines (SGLang's pause_generation mode): abort (every "
        "request in flight is aborted and re-sent with its context, as slime and AReaL do by "
        "default), retract (their KV is freed and they re-prefill inside the engine, unseen by "
        "the framework) or in_place (they wait, KV kept, and go on with the new weights)"))
    seed: int = Field(default=0, ge=0)
    prefix: str = Field(default="prorsa", description="subject prefix")
    stream: str = Field(default="PRORSA", description="JetStream stream")
    out: Path | None = Field(default=None, description="write the result JSON here at the end")
    progress: Path | None = Field(default=None, description="rewrite a small progress JSON here as it runs")
    ready_timeout_s: float = Field(default=120.0, gt=0, description="wait this long for router workers")
    flush_timeout_s: float = Field(default=300.0, gt=0, description="wait this long for the last acks")

    @field_validator("router_url")
    @classmethod
    def _http(cls, v: str) -> str:
        return check_http_url(v)

    @field_validator("nats_url")
    @classmethod
    def _nats(cls, v: str) -> str:
        return check_nats_url(v)

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: str) -> str:
        from prorsa_sim.workloads import get_workload

        get_workload(v)  # raises ValueError naming the valid workloads
        return v
