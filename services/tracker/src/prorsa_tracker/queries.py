"""Read-only queries of the trajectory log, shared by the CLI and the HTTP API."""

from __future__ import annotations

from sqlalchemy import Engine, and_, func, or_, select

from prorsa_schemas import decode_event

from .core import apply, new_state
from .models import AnomalyRow, EventRow, RequestRow, RunRow, SpanRow, TrajectoryRow
from .state import LIVE_STATES, TrajState

STATES = [s.value for s in TrajState]


class QueryError(ValueError):
    """A query parameter is out of range or names something that does not exist."""


def _row(obj) -> dict:
    return {c.key: getattr(obj, c.key) for c in obj.__mapper__.column_attrs}


def runs(engine: Engine) -> list[dict]:
    """Every run with its config and counters."""
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(RunRow.__table__).order_by(RunRow.run))]


def trajectories(
    engine: Engine, run: str, state: str | None = None, since: float | None = None, until: float | None = None,
    limit: int = 100, offset: int = 0,
) -> list[dict]:
    """Trajectories of ``run``; ``state`` filters (``live`` = any live state); ``since``/``until``
    keep those alive at some time in ``[since, until]`` (dispatched <= until, ended >= since)."""
    if state is not None and state not in STATES and state != "live":
        raise QueryError(f"unknown state {state!r}; one of {', '.join(STATES)} or 'live'")
    if since is not None and until is not None and since > until:
        raise QueryError(f"since ({since}) is after until ({until})")
    if limit < 1 or limit > 10_000 or offset < 0:
        raise QueryError("limit must be 1..10000 and offset >= 0")
    t = TrajectoryRow
    q = select(t).where(t.run == run)
    if state == "live":
        q = q.where(t.state.in_([s.value for s in LIVE_STATES]))
    elif state is not None:
        q = q.where(t.state == state)
    if until is not None:
        q = q.where(t.dispatched_ts <= until)
    if since is not None:
        q = q.where(or_(t.ended_ts.is_(None), t.ended_ts >= since))
    q = q.order_by(t.dispatched_ts, t.traj).limit(limit).offset(offset)
    with engine.connect() as conn:
        rows = [_traj(dict(r._mapping)) for r in conn.execute(q.with_only_columns(*t.__table__.c))]
        if not rows and conn.execute(select(RunRow.run).where(RunRow.run == run)).first() is None:
            raise QueryError(f"no run {run!r}")  # (a run with no trajectory matching: an empty page)
        return rows


def _traj(d: dict) -> dict:
    d["group"] = d.pop("grp", None)
    return d


def history(engine: Engine, run: str, traj: str) -> dict:
    """A trajectory's full timeline: its states (the core re-folds its events), requests
    with token counts and latencies, and its sandbox, tool and reward spans."""
    with engine.connect() as conn:
        head = conn.execute(
            select(*TrajectoryRow.__table__.c).where(and_(TrajectoryRow.run == run, TrajectoryRow.traj == traj))
        ).first()
        if head is None:
            raise QueryError(f"no trajectory {traj!r} in run {run!r}")
        raws = conn.execute(
            select(EventRow.raw).where(and_(EventRow.run == run, EventRow.traj == traj)).order_by(EventRow.pos)
        ).scalars().all()
        reqs = conn.execute(select(*RequestRow.__table__.c).where(and_(RequestRow.run == run, RequestRow.traj == traj)).order_by(RequestRow.queued_ts, RequestRow.id)).all()
        spans = conn.execute(select(*SpanRow.__table__.c).where(and_(SpanRow.run == run, SpanRow.traj == traj)).order_by(SpanRow.start_ts, SpanRow.id)).all()
        anomalies = conn.execute(select(AnomalyRow.event_id, AnomalyRow.type, AnomalyRow.ts, AnomalyRow.reason).where(and_(AnomalyRow.run == run, AnomalyRow.traj == traj)).order_by(AnomalyRow.id)).all()
    state = new_state()
    timeline = []
    for raw in raws:
        ev = decode_event(bytes(raw))
        _, trans, _ = apply(state, ev)
        for t in trans:
            timeline.append({"ts": t.ts, "event": t.event_type, "from": t.from_state.value if t.from_state else None,
                             "to": t.to_state.value, "context_tokens": t.context_tokens, "req": t.req})
    requests = []
    for r in reqs:
        d = dict(r._mapping)
        d.pop("id")
        d["queue_s"] = _sub(d["prefill_started_ts"] or d["prefill_finished_ts"], d["queued_ts"])
        d["ttft_s"] = _sub(d["prefill_finished_ts"], d["queued_ts"])
        d["decode_s"] = _sub(d["decode_finished_ts"], d["prefill_finished_ts"])
        requests.append(d)
    return {
        "trajectory": _traj(dict(head._mapping)),
        "timeline": timeline,
        "requests": requests,
        "spans": [{k: v for k, v in dict(s._mapping).items() if k != "id"} for s in spans],
        "anomalies": [dict(a._mapping) for a in anomalies],
    }


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 6)


def anomalies(engine: Engine, run: str | None = None, limit: int = 100, offset: int = 0) -> list[dict]:
    """Anomaly records (raw bytes as text, replacement characters where not UTF-8)."""
    if limit < 1 or limit > 10_000 or offset < 0:
        raise QueryError("limit must be 1..10000 and offset >= 0")
    q = select(*AnomalyRow.__table__.c).order_by(AnomalyRow.id).limit(limit).offset(offset)
    if run is not None:
        q = q.where(AnomalyRow.run == run)
    with engine.connect() as conn:
        out = []
        for r in conn.execute(q):
            d = dict(r._mapping)
            d["raw"] = bytes(d["raw"]).decode("utf-8", "replace") if d["raw"] is not None else None
            out.append(d)
        return out


def count_events(engine: Engine, run: str | None = None) -> int:
    q = select(func.count()).select_from(EventRow)
    if run is not None:
        q = q.where(EventRow.run == run)
    with engine.connect() as conn:
        return int(conn.execute(q).scalar() or 0)


def iter_raw_events(engine: Engine, run: str, chunk: int = 10_000, by_ts: bool = False):
    """The run's events, exact bytes, in the order applied (stream order), or by ``ts``
    with ties in stream order when ``by_ts`` (the order of a contract log file)."""
    order = (EventRow.ts, EventRow.pos) if by_ts else (EventRow.pos,)
    with engine.connect() as conn:
        res = conn.execution_options(yield_per=chunk).execute(select(EventRow.raw).where(EventRow.run == run).order_by(*order))
        for (raw,) in res:
            yield bytes(raw)
