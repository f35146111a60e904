"""The EVENTS.md trajectory state machine: the tracker fold's handler of each run and
trajectory event type, registered on ``mutate`` (``handler(state, run_state, event)``
returns the event's transitions and anomalies; see :mod:`prorsa_tracker.core`)."""

from __future__ import annotations

from collections.abc import Callable

from prorsa_schemas import Event
from prorsa_schemas.fold import Mutators

from .lifecycle import (
    NO_CHANGE,
    Result,
    S,
    anomaly,
    close_request,
    close_tool,
    dur,
    enter,
    finish,
    move,
    transition,
)
from .state import Request, RunConfig, RunState, Span, TrackerState, Trajectory

Handler = Callable[[TrackerState, RunState, Event], Result]
mutate: Mutators[Handler] = Mutators()
"""The fold's handler of each run and trajectory event type."""


# --- run events ------------------------------------------------------------------------


@mutate.on("run.started")
def _run_started(state: TrackerState, rs: RunState, ev) -> Result:
    anomalies = []
    if rs.config.declared:
        anomalies.append(anomaly(ev, f"run {ev.run!r} was already started; the new config replaces the old one"))
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
    return NO_CHANGE


# --- trajectory events -----------------------------------------------------------------


@mutate.on("trajectory.dispatched")
def _dispatched(state: TrackerState, rs: RunState, ev) -> Result:
    cur = rs.live.get(ev.traj)
    if cur is not None:
        return [], [anomaly(ev, f"trajectory {ev.traj!r} is already live (state {cur.state.value})", cur.state)]
    ended = state.finished.get((ev.run, ev.traj))
    if ended is not None:
        return [], [anomaly(ev, f"trajectory {ev.traj!r} already ended ({ended.value})", ended)]
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
    return [transition(ev, tr, None)], []


@mutate.on("sandbox.started")
def _sandbox_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.DISPATCHED})
    if refused:
        return refused
    tr.sandbox_mode = ev.mode
    tr.sandbox_started_ts = ev.ts
    move(rs, tr, S.SANDBOX, ev.ts)
    return [transition(ev, tr, S.DISPATCHED)], back


@mutate.on("sandbox.ready")
def _sandbox_ready(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.SANDBOX})
    if refused:
        return refused
    d = dur(tr.sandbox_started_ts, ev.ts)
    rs.samples[f"sandbox_{tr.sandbox_mode}"].append(d)
    span = Span(
        run=tr.run, traj=tr.traj, kind="sandbox", start_ts=tr.sandbox_started_ts, end_ts=ev.ts,
        mode=tr.sandbox_mode, ok=None, tokens=None, reward=None,
    )
    move(rs, tr, S.READY, ev.ts)
    return [transition(ev, tr, S.SANDBOX, span=span)], back


_QUEUE_FROM = frozenset({S.DISPATCHED, S.READY, S.TOOL, S.DECODE})


@mutate.on("request.queued")
def _request_queued(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, _QUEUE_FROM)
    if refused:
        return refused
    src = tr.state
    ts = ev.ts
    record = span = None
    if src is S.DECODE:  # re-prefill: the request in decode is abandoned
        record = close_request(tr, "superseded", ts)
    elif src is S.TOOL:  # no tool.finished was published: the tool span ends here
        span = close_tool(rs, tr, ts, ok=None, tokens=None)
    if tr.tool_entered_ts is not None:
        rs.samples["tool_to_request"].append(dur(tr.tool_entered_ts, ts))
        tr.tool_entered_ts = None
    if tr.first_request_ts is None:
        tr.first_request_ts = ts
        rs.samples["dispatch_to_request"].append(dur(tr.dispatched_ts, ts))
        if tr.sandbox_started_ts is not None:
            rs.samples[f"startup_to_request_{tr.sandbox_mode}"].append(dur(tr.sandbox_started_ts, ts))
    tr.turns += 1
    tr.context_tokens = ev.prompt_tokens  # the observed full prompt is the truth
    tr.request = Request(req=ev.req, turn=ev.turn, prompt_tokens=ev.prompt_tokens, queued_ts=ts, engine=ev.engine)
    move(rs, tr, S.QUEUED, ts)
    return [transition(ev, tr, src, request=record, span=span)], back


@mutate.on("prefill.started")
def _prefill_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.QUEUED}, same_req=True)
    if refused:
        return refused
    r = tr.request
    r.prefill_started_ts = ev.ts  # type: ignore[union-attr]
    if ev.engine is not None:
        r.engine = ev.engine  # type: ignore[union-attr]
    move(rs, tr, S.PREFILL, ev.ts)
    return [transition(ev, tr, S.QUEUED)], back


@mutate.on("prefill.finished")
def _prefill_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.QUEUED, S.PREFILL}, same_req=True)
    if refused:
        return refused
    src = tr.state
    r = tr.request
    assert r is not None
    r.prefill_finished_ts = ev.ts
    if ev.engine is not None:
        r.engine = ev.engine
    r.cached_tokens = ev.cached_tokens
    r.decode_engine = ev.decode_engine
    move(rs, tr, S.DECODE, ev.ts)
    return [transition(ev, tr, src)], back


_AFTER_DECODE = {"tool": S.TOOL, "abort": S.READY, "stop": S.REWARD, "length": S.REWARD}


@mutate.on("decode.finished")
def _decode_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.DECODE}, same_req=True)
    if refused:
        return refused
    req = tr.request
    record = close_request(tr, ev.finish, ev.ts, ev.output_tokens)
    tr.context_tokens += ev.output_tokens
    new = _AFTER_DECODE[ev.finish]
    if new is S.TOOL:
        tr.tool_entered_ts = ev.ts
        tr.tool_started_ts = None
        tr.tool_name = None
    elif new is S.REWARD:
        tr.reward_started_ts = None
    move(rs, tr, new, ev.ts)
    # The closing request's identity stays on the transition (the forecaster joins on it).
    return [transition(ev, tr, S.DECODE, request=record, req=req)], back


@mutate.on("tool.started")
def _tool_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.TOOL})
    if refused:
        return refused
    if tr.tool_started_ts is not None:
        return [], [anomaly(ev, "tool.started twice in one tool call", tr.state)]
    tr.tool_started_ts = ev.ts
    tr.tool_name = ev.tool
    return [transition(ev, tr, S.TOOL)], back


@mutate.on("tool.finished")
def _tool_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.TOOL})
    if refused:
        return refused
    span = close_tool(rs, tr, ev.ts, ok=ev.ok, tokens=ev.result_tokens)
    tr.context_tokens += ev.result_tokens
    move(rs, tr, S.READY, ev.ts)
    return [transition(ev, tr, S.TOOL, span=span)], back


@mutate.on("reward.started")
def _reward_started(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.REWARD})
    if refused:
        return refused
    if tr.reward_started_ts is not None:
        return [], [anomaly(ev, "reward.started twice", tr.state)]
    tr.reward_started_ts = ev.ts
    return [transition(ev, tr, S.REWARD)], back


@mutate.on("reward.finished")
def _reward_finished(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev, {S.REWARD})
    if refused:
        return refused
    rs.samples["reward"].append(dur(tr.state_ts, ev.ts))
    rs.admissions.append((ev.ts, ev.admitted))
    rs.rewarded += 1
    rs.admitted += 1 if ev.admitted else 0
    rs.done += 1
    start = tr.reward_started_ts if tr.reward_started_ts is not None else tr.state_ts
    span = Span(
        run=tr.run, traj=tr.traj, kind="reward", start_ts=start, end_ts=ev.ts, mode=None,
        ok=ev.admitted, tokens=None, reward=ev.reward,
    )
    move(rs, tr, S.DONE, ev.ts)
    finish(state, rs, tr)
    return [transition(ev, tr, S.REWARD, span=span)], back


@mutate.on("trajectory.dropped")
def _dropped(state: TrackerState, rs: RunState, ev) -> Result:
    tr, back, refused = enter(state, rs, ev)
    if refused:
        return refused
    src = tr.state
    record = close_request(tr, "dropped", ev.ts) if tr.request is not None else None
    rs.dropped += 1
    move(rs, tr, S.DROPPED, ev.ts)
    finish(state, rs, tr)
    return [transition(ev, tr, src, request=record)], back
