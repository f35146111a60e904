"""What the handlers of the tracker's trajectory fold share: moving a trajectory between
states, closing its model request and its sandbox/tool spans, and the anomalies that name
an event the state machine does not allow (see :mod:`prorsa_tracker.core`)."""

from __future__ import annotations

from collections.abc import Collection

from prorsa_schemas import Event

from .state import Anomaly, Request, RequestRecord, RunState, Span, TrackerState, Trajectory, TrajState, Transition


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
"""What a handler returns: the transitions and the anomalies of one event."""
NO_CHANGE: Result = ([], [])

def anomaly(ev: Event, reason: str, state: TrajState | None = None) -> Anomaly:
    return Anomaly(
        run=ev.run,
        traj=getattr(ev, "traj", None),
        event_id=ev.id,
        event_type=ev.type,
        ts=ev.ts,
        reason=reason,
        state=state,
    )


def transition(
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


def move(rs: RunState, tr: Trajectory, new: TrajState, ts: float) -> None:
    rs.by_state[tr.state].discard(tr.traj)
    tr.state = new
    tr.state_ts = ts
    if new is not S.DONE and new is not S.DROPPED:  # new.live, without the property call
        rs.by_state[new].add(tr.traj)


def finish(state: TrackerState, rs: RunState, tr: Trajectory) -> None:
    del rs.live[tr.traj]
    fin = state.finished
    fin[(tr.run, tr.traj)] = tr.state
    if len(fin) > state.finished_capacity:
        fin.popitem(last=False)


def dur(start: float | None, end: float) -> float:
    return max(0.0, end - start) if start is not None else 0.0


def close_request(tr: Trajectory, finish: str, ts: float, output_tokens: int | None = None) -> RequestRecord:
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


def live(state: TrackerState, rs: RunState, ev: Event) -> tuple[Trajectory | None, Anomaly | None]:
    tr = rs.live.get(ev.traj)  # type: ignore[attr-defined]
    if tr is not None:
        return tr, None
    ended = state.finished.get((ev.run, ev.traj))  # type: ignore[attr-defined]
    if ended is not None:
        return None, anomaly(ev, f"{ev.type} for trajectory {ev.traj!r}, which already ended ({ended.value})", ended)  # type: ignore[attr-defined]
    return None, anomaly(ev, f"{ev.type} for trajectory {ev.traj!r}, which was never dispatched")  # type: ignore[attr-defined]


def illegal(ev: Event, tr: Trajectory) -> Result:
    return [], [anomaly(ev, f"{ev.type} is not a legal transition from state {tr.state.value}", tr.state)]


def backwards(ev: Event, tr: Trajectory) -> list[Anomaly]:
    if ev.ts < tr.state_ts:
        return [
            anomaly(
                ev,
                f"ts {ev.ts} is earlier than the trajectory's previous event ({tr.state_ts}); "
                "applied with durations clamped at 0",
                tr.state,
            )
        ]
    return []


def wrong_req(ev: Event, tr: Trajectory) -> Result | None:
    cur = tr.request.req if tr.request else None
    if ev.req != cur:  # type: ignore[attr-defined]
        return [], [
            anomaly(ev, f"{ev.type} for request {ev.req!r}, but the trajectory's current request is {cur!r}", tr.state)  # type: ignore[attr-defined]
        ]
    return None


def enter(state: TrackerState, rs: RunState, ev: Event, allowed: Collection[TrajState] | None = None,
          same_req: bool = False) -> tuple[Trajectory, list[Anomaly], None] | tuple[None, list[Anomaly], Result]:
    """The checks every trajectory event passes before it is applied: the trajectory is live,
    its state is one of ``allowed`` (any, when None), and with ``same_req`` the event names its
    current request. Returns ``(trajectory, backwards-ts anomalies, None)`` to apply the event,
    or ``(None, [], result)`` with the result that refuses it."""
    tr, bad = live(state, rs, ev)
    if tr is None:
        return None, [], ([], [bad])  # type: ignore[list-item]
    if allowed is not None and tr.state not in allowed:
        return None, [], illegal(ev, tr)
    if same_req:
        wrong = wrong_req(ev, tr)
        if wrong:
            return None, [], wrong
    return tr, backwards(ev, tr), None


def close_tool(rs: RunState, tr: Trajectory, ts: float, ok: bool | None, tokens: int | None) -> Span:
    entered = tr.tool_entered_ts if tr.tool_entered_ts is not None else tr.state_ts
    d = dur(entered, ts)
    rs.samples["tool"].append(d)
    tr.tool_ema = d if tr.tool_ema is None else (1 - TOOL_EMA_ALPHA) * tr.tool_ema + TOOL_EMA_ALPHA * d
    if tr.tool_started_ts is not None and tokens is not None:
        rs.samples["tool_exec"].append(dur(tr.tool_started_ts, ts))
    start = tr.tool_started_ts if tr.tool_started_ts is not None else entered
    return Span(
        run=tr.run, traj=tr.traj, kind="tool", start_ts=start, end_ts=ts, mode=tr.tool_name,
        ok=ok, tokens=tokens, reward=None,
    )
