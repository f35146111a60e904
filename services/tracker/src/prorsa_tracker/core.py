"""The tracker's pure core: the EVENTS.md state machine as a fold. No I/O, no wall clock.

API (what the service, the forecaster, ``forecast-eval``, replay and the simulator use)::

    from prorsa_tracker.core import apply, new_state, TrajState, Transition, Anomaly

    state = new_state()
    for event in events:                       # prorsa_schemas events, in stream/log order
        state, transitions, anomalies = apply(state, event)

``apply(state, event) -> (state, list[Transition], list[Anomaly])`` mutates ``state`` in
place and returns the same object (tens of microseconds per event). It is deterministic:
the same events in the same order give the same state and outputs.

* **Idempotency lives in the core.** An event whose ``id`` was applied before (within the
  newest ``state.seen_capacity`` ids, default 200k) is ignored: ``apply`` returns empty
  lists and counts it in ``state.duplicates``. ``state.is_duplicate(id)`` asks first.
* **Transitions.** Every accepted trajectory event yields one :class:`Transition`
  (``from_state == to_state`` for ``tool.started`` / ``reward.started``). A transition
  that closes a model request carries its :class:`RequestRecord` (queued, prefill, decode
  times and lengths) in ``.request``; one that closes a sandbox/tool/reward span carries the
  :class:`Span` in ``.span``. Those records are not kept in memory: the SQL projection
  stores them.
* **Anomalies.** An event that is not a legal transition yields an :class:`Anomaly` with a
  reason and leaves the trajectory untouched. An event whose ``ts`` runs backwards within
  its trajectory is applied (durations clamp at 0) and also reported as an anomaly.
* **State** (:class:`TrackerState`): ``runs[run]`` is a :class:`RunState` with ``config``
  (run.started, or the defaults: async, injection "replace", group_size 1),
  ``policy_version``, counters (``dispatched``, ``rewarded``, ``admitted``, ``done``,
  ``dropped``), ``admissions`` (ring of ``(ts, admitted)``), ``samples[kind]`` (ring
  buffers of durations, kinds in :data:`SAMPLE_KINDS`), ``live[traj]`` (a
  :class:`Trajectory`: ``state``, ``state_ts``, ``context_tokens``, ``turns``, ``group``,
  ``policy_version``, ``sandbox_mode``, ``sandbox_started_ts``, ``request`` (a
  :class:`Request`: ``req``, ``prompt_tokens``, ``queued_ts``, ``prefill_started_ts``,
  ``engine``, ``decode_engine``...), ``tool_entered_ts``, ``tool_started_ts``, ``tool_ema``)
  and ``by_state[TrajState]`` (set of traj ids: gather Reward / Sandbox / Tool / Queued /
  Prefill trajectories without scanning; ``state.in_state(run, *states)``).
  ``registry`` is the engine registry (:mod:`prorsa_schemas.registry`); ``engines[engine]``
  is its :class:`~prorsa_schemas.registry.EngineRecord` (role, registration, switching, stats).
  ``watermark`` is the largest event ``ts`` applied.
* **Where it lives**: this module is the entry point; :mod:`prorsa_tracker.transitions`
  holds the handler of each run and trajectory event type (``mutate``), and
  :mod:`prorsa_tracker.lifecycle` what they share (moving a trajectory between states,
  closing its request and spans, naming anomalies).
* **Memory is bounded**: done/dropped trajectories leave ``live``; samples, admissions,
  seen ids and finished keys are bounded ring buffers.

Run, engine and control events never yield transitions; engine events update
``state.registry`` (see :mod:`prorsa_tracker.engines`).
"""

from __future__ import annotations

from prorsa_schemas import Event

from .engines import apply_engine_event
from .state import (
    LIVE_STATES,
    SAMPLE_KINDS,
    Anomaly,
    Request,
    RequestRecord,
    RunConfig,
    RunState,
    Span,
    TrackerState,
    Trajectory,
    TrajState,
    Transition,
)
from .transitions import mutate

__all__ = [
    "LIVE_STATES",
    "SAMPLE_KINDS",
    "Anomaly",
    "Request",
    "RequestRecord",
    "RunConfig",
    "RunState",
    "Span",
    "TrackerState",
    "Trajectory",
    "TrajState",
    "Transition",
    "apply",
    "apply_all",
    "new_state",
]


def new_state(seen_capacity: int | None = None) -> TrackerState:
    """An empty tracker state."""
    st = TrackerState()
    if seen_capacity is not None:
        st.seen_capacity = seen_capacity
    return st


def apply(state: TrackerState, event: Event) -> tuple[TrackerState, list[Transition], list[Anomaly]]:
    """Fold one validated event into ``state`` (in place); see the module docstring."""
    seen = state.seen_ids
    if event.id in seen:
        state.duplicates += 1
        return state, [], []
    seen[event.id] = None
    if len(seen) > state.seen_capacity:
        seen.popitem(last=False)
    state.applied += 1
    ts = event.ts
    if state.watermark is None or ts > state.watermark:
        state.watermark = ts
    handler = mutate.get(event.type)
    if handler is None:
        if event.type.startswith("engine."):
            anomalies = apply_engine_event(state, event)
            state.anomalies += len(anomalies)
            return state, [], anomalies
        return state, [], []  # control events: logged by the service, no state here
    rs = state.run_state(event.run)
    if rs.first_ts is None or ts < rs.first_ts:
        rs.first_ts = ts
    if rs.last_ts is None or ts > rs.last_ts:
        rs.last_ts = ts
    transitions, anomalies = handler(state, rs, event)
    state.anomalies += len(anomalies)
    return state, transitions, anomalies


def apply_all(state: TrackerState, events) -> tuple[TrackerState, list[Transition], list[Anomaly]]:
    """Fold many events; returns all their transitions and anomalies (for tests and tools)."""
    ts_out: list[Transition] = []
    an_out: list[Anomaly] = []
    for ev in events:
        _, t, a = apply(state, ev)
        ts_out.extend(t)
        an_out.extend(a)
    return state, ts_out, an_out
