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
* **Memory is bounded**: done/dropped trajectories leave ``live``; samples, admissions,
  seen ids and finished keys are bounded ring buffers.

Run, engine and control events never yield transitions; engine events update
``state.registry`` (see :mod:`prorsa_tracker.engines`).
"""

from __future__ import annotations

from collections.abc import Callable

from prorsa_schemas import Event
from prorsa_schemas.fold import Mutators

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

class S:
    """TrajState's members as plain class attributes: on Python 3.11 ``TrajState.X`` goes
    through the enum's descriptor (a Python call), and the fold reads a few per event."""

    DISPATCHED = TrajState.DISPATCHED
    SANDBOX = TrajState.SANDBOX
    READY = TrajState.READY
    QUEUED = TrajState.QUEUED
    PREFILL = TrajState.PREFILL
    DECODE = TrajState.DECODE
    TOOL = TrajState.TOOL
    REWARD = TrajState.REWARD
    DONE = TrajState.DONE
    DROPPED = TrajState.DROPPED
TOOL_EMA_ALPHA = 0.1  # Appendix B.5

Result = tuple[list[Transition], list[Anomaly]]
_NONE: Result = ([], [])

Handler = Callable[[TrackerState, RunState, Event], Result]
mutate: Mutators[Handler] = Mutators()
"""The fold's handler of each run and trajectory event type, ``handler(state, run_state, event)``."""


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


# --- helpers ---------------------------------------------------------------------------


def _anomaly(ev: Event, reason: str, state: TrajState | None = None) -> Anomaly:
    return Anomaly(
        run=ev.run,
        traj=getattr(ev, "traj", None),
        event_id=ev.id,
        event_type=ev.type,
        ts=ev.ts,
        reason=reason,
        state=state,
    )


def _transition(
    ev: Event,
    tr: Trajectory,
    from_state: TrajState | None,
    request: RequestRecord | None = None,
    span: Span | None = None,
    req: Request | None = None,
) -> Transition:
    req = req if req is not None else tr.request
    # Positional, in Transition's field order: this runs once per applied event.
    if req is None:
        return Transition(tr.run, tr.traj, ev.id, ev.type, ev.ts, from_state, tr.state, tr.context_tokens, tr.turns,
                          tr.group, tr.policy_version, tr.sandbox_mode, None, None, None, None, request, span, None)
    return Transition(tr.run, tr.traj, ev.id, ev.type, ev.ts, from_state, tr.state, tr.context_tokens, tr.turns,
                      tr.group, tr.policy_version, tr.sandbox_mode, req.req, req.prompt_tokens, req.engine,
                      req.decode_engine, request, span, None)


def _move(rs: RunState, tr: Trajectory, new: TrajState, ts: float) -> None:
    rs.by_state[tr.state].discard(tr.traj)
    tr.state = new
    tr.state_ts = ts
    if new is not S.DONE and new is not S.DROPPED:  # new.live, without the property call
        rs.by_state[new].add(tr.traj)


def _finish(state: TrackerState, rs: RunState, tr: Trajectory) -> None:
    del rs.live[tr.traj]
    fin = state.finished
    fin[(tr.run, tr.traj)] = tr.state
    if len(fin) > state.finished_capacity:
        fin.popitem(last=False)


def _dur(start: float | None, end: float) -> float:
    return max(0.0, end - start) if start is not None else 0.0


def _close_request(tr: Trajectory, finish: str, ts: float, output_tokens: int | None = None) -> RequestRecord:
    r = tr.request
    assert r is not None
    tr.request = None
    return RequestRecord(
        run=tr.run,
        traj=tr.traj,
        req=r.req,
        turn=r.turn,
        prompt_tokens=r.prompt_tokens,
        queued_ts=r.queued_ts,
        prefill_started_ts=r.prefill_started_ts,
        prefill_finished_ts=r.prefill_finished_ts,
        decode_finished_ts=ts if finish in ("tool", "stop", "length", "abort") else None,
        output_tokens=output_tokens,
        cached_tokens=r.cached_tokens,
        finish=finish,
        engine=r.engine,
        decode_engine=r.decode_engine,
    )


def _live(state: TrackerState, rs: RunState, ev: Event) -> tuple[Trajectory | None, Anomaly | None]:
    tr = rs.live.get(ev.traj)  # type: ignore[attr-defined]
    if tr is not None:
        return tr, None
    ended = state.finished.get((ev.run, ev.traj))  # type: ignore[attr-defined]
    if ended is not None:
        return None, _anomaly(ev, f"{ev.type} for trajectory {ev.traj!r}, which already ended ({ended.value})", ended)  # type: ignore[attr-defined]
    return None, _anomaly(ev, f"{ev.type} for trajectory {ev.traj!r}, which was never dispatched")  # type: ignore[attr-defined]


def _illegal(ev: Event, tr: Trajectory) -> Result:
    return [], [_anomaly(ev, f"{ev.type} is not a legal transition from state {tr.state.value}", tr.state)]


def _backwards(ev: Event, tr: Trajectory) -> list[Anomaly]:
    if ev.ts < tr.state_ts:
        return [
            _anomaly(
                ev,
                f"ts {ev.ts} is earlier than the trajectory's previous event ({tr.state_ts}); "
                "applied with durations clamped at 0",
                tr.state,
            )
        ]
    return []


def _wrong_req(ev: Event, tr: Trajectory) -> Result | None:
    cur = tr.request.req if tr.request else None
    if ev.req != cur:  # type: ignore[attr-defined]
        return [], [
            _anomaly(ev, f"{ev.type} for request {ev.req!r}, but the trajectory's current request is {cur!r}", tr.state)  # type: ignore[attr-defined]
        ]
    return None


# --- run events ------------------------------------------------------------------------


@mutate.on("run.started")
def _run_started(state: TrackerState, rs: RunState, ev) -> Result:
    anomalies = []
    if rs.config.declared:
        anomalies.append(_anomaly(ev, f"run {ev.run!r} was already started; the new config replaces the old one"))
    rs.config = RunConfig(
        mode=ev.mode,
        batch_size=ev.batch_size,
        max_staleness=ev.max_staleness,
        group_size=ev.group_size if ev.group_size is not None else 1,
        injection=ev.injection if ev.injection is not None else "replace",
        prompt_tokens_mean=ev.prompt_tokens_mean,
        declared=True,
    )
    return [], anomalies


@mutate.on("policy.updated")
def _policy_updated(state: TrackerState, rs: RunState, ev) -> Result:
    rs.policy_version = ev.version
    return _NONE


# --- trajectory events -----------------------------------------------------------------


@mutate.on("trajectory.dispatched")
def _dispatched(state: TrackerState, rs: RunState, ev) -> Result:
    cur = rs.live.get(ev.traj)
    if cur is not None:
        return [], [_anomaly(ev, f"trajectory {ev.traj!r} is already live (state {cur.state.value})", cur.state)]
    ended = state.finished.get((ev.run, ev.traj))
    if ended is not None:
        return [], [_anomaly(ev, f"trajectory {ev.traj!r} already ended ({ended.value})", ended)]
    tr = Trajectory(
        run=ev.run,
        traj=ev.traj,
        state=S.DISPATCHED,
        state_ts=ev.ts,
        dispatched_ts=ev.ts,
        context_tokens=ev.prompt_tokens,
        prompt_tokens=ev.prompt_tokens,
        group=ev.group,
        policy_version=ev.policy_version if ev.policy_version is not None else rs.policy_version,
    )
    rs.live[ev.traj] = tr
    rs.by_state[S.DISPATCHED].add(ev.traj)
    rs.dispatched += 1
    return [_transition(ev, tr, None)], []


@mutate.on("sandbox.started")
def _sandbox_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.DISPATCHED:
        return _illegal(ev, tr)
    back = _backwards(ev, tr)
    tr.sandbox_mode = ev.mode
    tr.sandbox_started_ts = ev.ts
    _move(rs, tr, S.SANDBOX, ev.ts)
    return [_transition(ev, tr, S.DISPATCHED)], back


@mutate.on("sandbox.ready")
def _sandbox_ready(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.SANDBOX:
        return _illegal(ev, tr)
    back = _backwards(ev, tr)
    d = _dur(tr.sandbox_started_ts, ev.ts)
    rs.samples[f"sandbox_{tr.sandbox_mode}"].append(d)
    span = Span(
        run=tr.run, traj=tr.traj, kind="sandbox", start_ts=tr.sandbox_started_ts, end_ts=ev.ts,
        mode=tr.sandbox_mode, ok=None, tokens=None, reward=None,
    )
    _move(rs, tr, S.READY, ev.ts)
    return [_transition(ev, tr, S.SANDBOX, span=span)], back


_QUEUE_FROM = frozenset({S.DISPATCHED, S.READY, S.TOOL, S.DECODE})


@mutate.on("request.queued")
def _request_queued(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    src = tr.state
    if src not in _QUEUE_FROM:
        return _illegal(ev, tr)
    back = _backwards(ev, tr)
    ts = ev.ts
    record = span = None
    if src is S.DECODE:  # re-prefill: the request in decode is abandoned
        record = _close_request(tr, "superseded", ts)
    elif src is S.TOOL:  # no tool.finished was published: the tool span ends here
        span = _close_tool(rs, tr, ts, ok=None, tokens=None)
    if tr.tool_entered_ts is not None:
        rs.samples["tool_to_request"].append(_dur(tr.tool_entered_ts, ts))
        tr.tool_entered_ts = None
    if tr.first_request_ts is None:
        tr.first_request_ts = ts
        rs.samples["dispatch_to_request"].append(_dur(tr.dispatched_ts, ts))
        if tr.sandbox_started_ts is not None:
            rs.samples[f"startup_to_request_{tr.sandbox_mode}"].append(_dur(tr.sandbox_started_ts, ts))
    tr.turns += 1
    tr.context_tokens = ev.prompt_tokens  # the observed full prompt is the truth
    tr.request = Request(req=ev.req, turn=ev.turn, prompt_tokens=ev.prompt_tokens, queued_ts=ts, engine=ev.engine)
    _move(rs, tr, S.QUEUED, ts)
    return [_transition(ev, tr, src, request=record, span=span)], back


@mutate.on("prefill.started")
def _prefill_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.QUEUED:
        return _illegal(ev, tr)
    wrong = _wrong_req(ev, tr)
    if wrong:
        return wrong
    back = _backwards(ev, tr)
    r = tr.request
    r.prefill_started_ts = ev.ts  # type: ignore[union-attr]
    if ev.engine is not None:
        r.engine = ev.engine  # type: ignore[union-attr]
    _move(rs, tr, S.PREFILL, ev.ts)
    return [_transition(ev, tr, S.QUEUED)], back


@mutate.on("prefill.finished")
def _prefill_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    src = tr.state
    if src is not S.QUEUED and src is not S.PREFILL:
        return _illegal(ev, tr)
    wrong = _wrong_req(ev, tr)
    if wrong:
        return wrong
    back = _backwards(ev, tr)
    r = tr.request
    assert r is not None
    r.prefill_finished_ts = ev.ts
    if ev.engine is not None:
        r.engine = ev.engine
    r.cached_tokens = ev.cached_tokens
    r.decode_engine = ev.decode_engine
    _move(rs, tr, S.DECODE, ev.ts)
    return [_transition(ev, tr, src)], back


_AFTER_DECODE = {"tool": S.TOOL, "abort": S.READY, "stop": S.REWARD, "length": S.REWARD}


@mutate.on("decode.finished")
def _decode_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.DECODE:
        return _illegal(ev, tr)
    wrong = _wrong_req(ev, tr)
    if wrong:
        return wrong
    back = _backwards(ev, tr)
    req = tr.request
    record = _close_request(tr, ev.finish, ev.ts, ev.output_tokens)
    tr.context_tokens += ev.output_tokens
    new = _AFTER_DECODE[ev.finish]
    if new is S.TOOL:
        tr.tool_entered_ts = ev.ts
        tr.tool_started_ts = None
        tr.tool_name = None
    elif new is S.REWARD:
        tr.reward_started_ts = None
    _move(rs, tr, new, ev.ts)
    # The closing request's identity stays on the transition (the forecaster joins on it).
    return [_transition(ev, tr, S.DECODE, request=record, req=req)], back


def _close_tool(rs: RunState, tr: Trajectory, ts: float, ok: bool | None, tokens: int | None) -> Span:
    entered = tr.tool_entered_ts if tr.tool_entered_ts is not None else tr.state_ts
    d = _dur(entered, ts)
    rs.samples["tool"].append(d)
    tr.tool_ema = d if tr.tool_ema is None else (1 - TOOL_EMA_ALPHA) * tr.tool_ema + TOOL_EMA_ALPHA * d
    if tr.tool_started_ts is not None and tokens is not None:
        rs.samples["tool_exec"].append(_dur(tr.tool_started_ts, ts))
    start = tr.tool_started_ts if tr.tool_started_ts is not None else entered
    return Span(
        run=tr.run, traj=tr.traj, kind="tool", start_ts=start, end_ts=ts, mode=tr.tool_name,
        ok=ok, tokens=tokens, reward=None,
    )


@mutate.on("tool.started")
def _tool_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.TOOL:
        return _illegal(ev, tr)
    if tr.tool_started_ts is not None:
        return [], [_anomaly(ev, "tool.started twice in one tool call", tr.state)]
    back = _backwards(ev, tr)
    tr.tool_started_ts = ev.ts
    tr.tool_name = ev.tool
    return [_transition(ev, tr, S.TOOL)], back


@mutate.on("tool.finished")
def _tool_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.TOOL:
        return _illegal(ev, tr)
    back = _backwards(ev, tr)
    span = _close_tool(rs, tr, ev.ts, ok=ev.ok, tokens=ev.result_tokens)
    tr.context_tokens += ev.result_tokens
    _move(rs, tr, S.READY, ev.ts)
    return [_transition(ev, tr, S.TOOL, span=span)], back


@mutate.on("reward.started")
def _reward_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.REWARD:
        return _illegal(ev, tr)
    if tr.reward_started_ts is not None:
        return [], [_anomaly(ev, "reward.started twice", tr.state)]
    back = _backwards(ev, tr)
    tr.reward_started_ts = ev.ts
    return [_transition(ev, tr, S.REWARD)], back


@mutate.on("reward.finished")
def _reward_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    if tr.state is not S.REWARD:
        return _illegal(ev, tr)
    back = _backwards(ev, tr)
    rs.samples["reward"].append(_dur(tr.state_ts, ev.ts))
    rs.admissions.append((ev.ts, ev.admitted))
    rs.rewarded += 1
    rs.admitted += 1 if ev.admitted else 0
    rs.done += 1
    start = tr.reward_started_ts if tr.reward_started_ts is not None else tr.state_ts
    span = Span(
        run=tr.run, traj=tr.traj, kind="reward", start_ts=start, end_ts=ev.ts, mode=None,
        ok=ev.admitted, tokens=None, reward=ev.reward,
    )
    _move(rs, tr, S.DONE, ev.ts)
    _finish(state, rs, tr)
    return [_transition(ev, tr, S.REWARD, span=span)], back


@mutate.on("trajectory.dropped")
def _dropped(state: TrackerState, rs: RunState, ev) -> Result:
    tr, bad = _live(state, rs, ev)
    if tr is None:
        return [], [bad]  # type: ignore[list-item]
    src = tr.state
    back = _backwards(ev, tr)
    record = _close_request(tr, "dropped", ev.ts) if tr.request is not None else None
    rs.dropped += 1
    _move(rs, tr, S.DROPPED, ev.ts)
    _finish(state, rs, tr)
    return [_transition(ev, tr, src, request=record)], back
