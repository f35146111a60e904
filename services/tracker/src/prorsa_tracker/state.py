"""The tracker's in-memory state and the records the fold emits.

Plain slotted dataclasses for what the fold mutates (fast, small: ~100k live trajectories
fit in tens of MB) and for what it emits (``Transition``, ``Anomaly``, ``RequestRecord``,
``Span``: records that cross the bus and the SQL projection; treat them as read-only). See :mod:`prorsa_tracker.core` for the API overview.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from enum import Enum
from typing import Literal

from pydantic import TypeAdapter

from prorsa_schemas.registry import EngineRecord, EngineRegistry

SAMPLE_CAPACITY = 4096
"""Duration samples kept per kind (a ring buffer: the newest ones, bounded memory)."""

SEEN_IDS_CAPACITY = 200_000
"""Event ids the core remembers for de-duplication (the newest ones). For the pure core (the
forecaster, ``forecast-eval``, the simulator) this window is the de-duplication; the
tracker service uses it only as a fast path and asks its ``events`` table (unique event
ids) about every id the window does not hold, so there an event is never applied twice,
however old."""


def content_digest(raw: bytes) -> int:
    """A cheap digest of an event's bytes, kept with its id in ``seen_ids``: a re-sent id whose
    bytes differ is told apart from a plain duplicate without keeping the bytes in memory."""
    return zlib.crc32(raw)

FINISHED_CAPACITY = 100_000
"""Finished trajectory keys remembered, so a late event gets a precise anomaly reason."""


class TrajState(str, Enum):
    """Trajectory states of the EVENTS.md state machine."""

    DISPATCHED = "dispatched"
    SANDBOX = "sandbox"
    READY = "ready"
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    TOOL = "tool"
    REWARD = "reward"
    DONE = "done"
    DROPPED = "dropped"

    @property
    def live(self) -> bool:
        return self not in (TrajState.DONE, TrajState.DROPPED)


LIVE_STATES: tuple[TrajState, ...] = tuple(s for s in TrajState if s.live)

SampleKind = Literal[
    "sandbox_prewarm",
    "sandbox_cold",
    "startup_to_request_prewarm",
    "startup_to_request_cold",
    "dispatch_to_request",
    "tool",
    "tool_to_request",
    "tool_exec",
    "reward",
]
SAMPLE_KINDS: tuple[str, ...] = SampleKind.__args__  # type: ignore[attr-defined]
"""Duration sample kinds (seconds of event time):

* ``sandbox_<mode>``: sandbox.started -> sandbox.ready;
* ``startup_to_request_<mode>``: sandbox.started -> the trajectory's first request.queued;
* ``dispatch_to_request``: trajectory.dispatched -> first request.queued (every trajectory);
* ``tool``: entering Tool (decode.finished finish=tool) -> leaving it;
* ``tool_to_request``: entering Tool -> the next request.queued;
* ``tool_exec``: tool.started -> tool.finished (when both are published);
* ``reward``: entering Reward (decode.finished stop|length) -> reward.finished.
"""


# --- emitted records (read-only by convention: they cross the bus and the SQL projection) --
# Slotted dataclasses rather than pydantic models: the fold builds one or more per event,
# and pydantic's model_construct costs ~20 us each. Not ``frozen``: a frozen dataclass's
# __init__ sets each field through object.__setattr__, 4.7 us against 1 us for a
# Transition, which was a tenth of the tracker's ingest time. JSON goes through pydantic's
# TypeAdapter (``to_json`` / ``from_json``), which validates on the way in.


class _Record:
    __slots__ = ()

    def as_dict(self) -> dict:
        """A shallow dict of the fields (nested records stay objects)."""
        return {f: getattr(self, f) for f in self.__dataclass_fields__}  # type: ignore[attr-defined]

    def to_json(self) -> bytes:
        """Compact JSON of every field (None included: ``from_state`` None is meaningful)."""
        return _adapter(type(self)).dump_json(self)

    @classmethod
    def from_json(cls, data: bytes | str):
        """Parse and validate JSON made by :meth:`to_json` (e.g. from ``ns.transitions()``)."""
        return _adapter(cls).validate_json(data)


_ADAPTERS: dict[type, TypeAdapter] = {}


def _adapter(cls: type) -> TypeAdapter:
    a = _ADAPTERS.get(cls)
    if a is None:
        a = _ADAPTERS[cls] = TypeAdapter(cls)
    return a


@dataclass(slots=True)
class RequestRecord(_Record):
    """One model request, emitted once when it closes (decode.finished, superseded, dropped)."""

    run: str
    traj: str
    req: str
    turn: int
    prompt_tokens: int
    queued_ts: float
    finish: Literal["tool", "stop", "length", "abort", "superseded", "dropped"]
    prefill_started_ts: float | None = None
    prefill_finished_ts: float | None = None
    decode_finished_ts: float | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    engine: str | None = None
    decode_engine: str | None = None


@dataclass(slots=True)
class Span(_Record):
    """A closed sandbox, tool or reward span of one trajectory."""

    run: str
    traj: str
    kind: Literal["sandbox", "tool", "reward"]
    start_ts: float
    end_ts: float
    mode: str | None = None  # sandbox: prewarm|cold; tool: the tool name
    ok: bool | None = None  # tool: ok flag; reward: admitted
    tokens: int | None = None  # tool: result_tokens
    reward: float | None = None


@dataclass(slots=True)
class Transition(_Record):
    """One applied trajectory event: the canonical output the forecaster consumes.

    Every accepted trajectory event yields exactly one transition; ``from_state ==
    to_state`` for events that do not move the machine (``tool.started`` in Tool,
    ``reward.started`` in Reward). ``from_state`` is None for ``trajectory.dispatched``.
    """

    run: str
    traj: str
    event_id: str
    event_type: str
    ts: float
    from_state: TrajState | None
    to_state: TrajState
    context_tokens: int
    turn: int
    group: str | None = None
    policy_version: int | None = None
    sandbox_mode: str | None = None
    req: str | None = None
    prompt_tokens: int | None = None  # of the current/closing request
    engine: str | None = None
    decode_engine: str | None = None
    request: RequestRecord | None = None  # set when a request closes
    span: Span | None = None  # set when a span closes
    seq: int | None = None  # stream sequence, filled in by the service


@dataclass(slots=True)
class Anomaly(_Record):
    """A valid event the state machine refused (or an invalid one, with ``event_id`` None)."""

    run: str | None
    traj: str | None
    event_id: str | None
    event_type: str | None
    ts: float | None
    reason: str
    state: TrajState | None = None


_TRANSITIONS: TypeAdapter | None = None


def _transitions_adapter() -> TypeAdapter:
    global _TRANSITIONS
    if _TRANSITIONS is None:
        _TRANSITIONS = TypeAdapter(list[Transition])
    return _TRANSITIONS


def encode_transitions(transitions: list[Transition]) -> bytes:
    """A JSON array of transitions: the payload of one message on ``ns.transitions()``."""
    return _transitions_adapter().dump_json(transitions)


def decode_transitions(data: bytes | str) -> list[Transition]:
    """Parse and validate one ``ns.transitions()`` message (a JSON array, in stream order)."""
    return _transitions_adapter().validate_json(data)


# --- mutable state (the fold mutates these in place) -----------------------------------


@dataclass(slots=True)
class Request:
    """The trajectory's current model request."""

    req: str
    turn: int
    prompt_tokens: int
    queued_ts: float
    engine: str | None = None
    prefill_started_ts: float | None = None
    prefill_finished_ts: float | None = None
    cached_tokens: int | None = None
    decode_engine: str | None = None


@dataclass(slots=True)
class Trajectory:
    """One live trajectory."""

    run: str
    traj: str
    state: TrajState
    state_ts: float  # event time it entered ``state``
    dispatched_ts: float
    context_tokens: int
    prompt_tokens: int  # of the dispatch (the initial prompt)
    group: str | None = None
    policy_version: int | None = None
    turns: int = 0  # requests queued so far
    sandbox_mode: str | None = None
    sandbox_started_ts: float | None = None
    first_request_ts: float | None = None
    request: Request | None = None
    tool_entered_ts: float | None = None
    tool_started_ts: float | None = None
    tool_name: str | None = None
    tool_ema: float | None = None  # per-trajectory EMA of time in Tool (Appendix B.5)
    reward_started_ts: float | None = None


@dataclass(slots=True)
class RunConfig:
    """The sampler config of run.started, or the contract's defaults when it is absent."""

    mode: str = "async"
    batch_size: int | None = None
    max_staleness: int | None = None
    group_size: int = 1
    injection: str = "replace"
    prompt_tokens_mean: int | None = None
    declared: bool = False  # True once a run.started was seen


def _by_state() -> dict[TrajState, set[str]]:
    return {s: set() for s in LIVE_STATES}


def _samples() -> dict[str, deque[float]]:
    return {k: deque(maxlen=SAMPLE_CAPACITY) for k in SAMPLE_KINDS}


@dataclass(slots=True)
class RunState:
    """Everything the tracker knows about one run."""

    run: str
    config: RunConfig = field(default_factory=RunConfig)
    policy_version: int | None = None
    live: dict[str, Trajectory] = field(default_factory=dict)
    by_state: dict[TrajState, set[str]] = field(default_factory=_by_state)
    samples: dict[str, deque[float]] = field(default_factory=_samples)
    admissions: deque[tuple[float, bool]] = field(
        default_factory=lambda: deque(maxlen=SAMPLE_CAPACITY)
    )  # (ts, admitted) of each reward.finished
    dispatched: int = 0
    rewarded: int = 0  # reward.finished count
    admitted: int = 0  # reward.finished with admitted=true
    done: int = 0
    dropped: int = 0
    first_ts: float | None = None
    last_ts: float | None = None


@dataclass(slots=True)
class TrackerState:
    """The whole fold state: runs, engines, de-duplication and counters."""

    runs: dict[str, RunState] = field(default_factory=dict)
    registry: EngineRegistry = field(default_factory=EngineRegistry)  # engines, as their agents report them
    watermark: float | None = None  # the largest event ts applied
    applied: int = 0  # events applied (duplicates excluded)
    duplicates: int = 0
    anomalies: int = 0
    seen_ids: OrderedDict[str, int | None] = field(default_factory=OrderedDict)  # id -> content digest
    seen_capacity: int = SEEN_IDS_CAPACITY
    finished: OrderedDict[tuple[str, str], TrajState] = field(default_factory=OrderedDict)
    finished_capacity: int = FINISHED_CAPACITY

    @property
    def engines(self) -> dict[str, EngineRecord]:
        """The registry's engines by id (see :mod:`prorsa_schemas.registry`)."""
        return self.registry.engines

    def run_state(self, run: str) -> RunState:
        """The run's state, created with the contract defaults on first sight."""
        rs = self.runs.get(run)
        if rs is None:
            rs = self.runs[run] = RunState(run)
        return rs

    def is_duplicate(self, event_id: str) -> bool:
        """True when an event with this id was applied recently (within ``seen_capacity``)."""
        return event_id in self.seen_ids

    def trajectory(self, run: str, traj: str) -> Trajectory | None:
        rs = self.runs.get(run)
        return rs.live.get(traj) if rs else None

    def in_state(self, run: str, *states: TrajState) -> list[Trajectory]:
        """The live trajectories of ``run`` in any of ``states``, via the per-state index."""
        rs = self.runs.get(run)
        if rs is None:
            return []
        return [rs.live[t] for s in states for t in rs.by_state[s]]

    def live_count(self) -> int:
        return sum(len(rs.live) for rs in self.runs.values())
