"""The envelope of every contract event (docs/contract.md, version 1): the common fields,
the id, token and role types, and the base model (frozen, strict, unknown fields kept).
The event types are in :mod:`prorsa_schemas.events`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

CONTRACT_VERSION = 1

MAX_TOKENS = 10_000_000
"""Upper bound of every token count (EVENTS.md: integers >= 0 and <= 10,000,000)."""

# Ids: 1..128 printable characters. "Printable" excludes C0/C1 control characters and
# DEL; everything else (including non-ASCII letters) is allowed.
PRINTABLE = r"^[^\x00-\x1f\x7f-\x9f]+$"

Id = Annotated[str, Field(min_length=1, max_length=128, pattern=PRINTABLE)]
RunId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.-]+$")]
Tokens = Annotated[int, Field(ge=0, le=MAX_TOKENS)]
Role = Literal["prefill", "decode", "mixed"]
SwitchRole = Literal["prefill", "decode"]
SwitchMode = Literal["in_place", "restart"]


class ContractModel(BaseModel):
    """The base of every contract model: frozen, strict, unknown fields kept."""


    model_config = ConfigDict(frozen=True, strict=True, extra="allow", allow_inf_nan=False)


class Event(ContractModel):
    """The envelope every event carries."""

    v: Literal[1] = Field(1, description="contract version, 1 (required on the wire)")
    id: Id = Field(description="unique per event; the JetStream Nats-Msg-Id used for de-duplication")
    type: str = Field(description="the event type")
    ts: float = Field(ge=0.0, description="event time in seconds (epoch seconds in production; any origin "
                                          "within one run). Finite, >= 0")
    run: RunId = Field(description="the RL job this event belongs to")
    # ts (and every float) is finite: the model config's allow_inf_nan=False rejects NaN and
    # +-inf in pydantic-core, with no Python call per event.


class TrajectoryEvent(Event):
    """A rollout event about one trajectory."""

    traj: Id = Field(description="the trajectory id")
