"""The queries behind the web console: per-window demand against the forecast, engines per
role over time, role switches with their reason and duration, trajectories by state, one
trajectory's events.

Pure cores (``demand_windows``, ``role_steps``, ``switch_rows``) take plain rows; the thin
functions around them read the tracker's tables. Definitions follow EVENTS.md ("What a
forecast is measured against").
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections.abc import Iterable

from sqlalchemy import Engine, and_, func, select

from prorsa_schemas import event_from_dict
from prorsa_schemas.registry import EngineRegistry

from .models import EventRow, RequestRow, RunRow, TrajectoryRow
from .queries import QueryError

ENGINE_ROLE_TYPES = ("engine.registered", "engine.switching", "engine.switched", "engine.switch_failed",
                     "engine.deregistered")
SWITCH_TYPES = ("engine.command", "engine.switching", "engine.switched", "engine.switch_failed")
ROLES = ("prefill", "decode", "mixed", "switching")
MAX_WINDOWS = 5000


def _run_row(conn, run: str) -> dict:
    row = conn.execute(select(*RunRow.__table__.c).where(RunRow.run == run)).first()
    if row is None:
        raise QueryError(f"no run {run!r}")
    return dict(row._mapping)


def _typed(conn, types: Iterable[str], run: str | None = None, until: float | None = None) -> list[dict]:
    """Events of ``types`` (of ``run``, or of every run), in ts order (ties in stream order),
    as their JSON objects."""
    q = select(EventRow.raw).where(EventRow.type.in_(list(types)))
    if run is not None:
        q = q.where(EventRow.run == run)
    if until is not None:
        q = q.where(EventRow.ts <= until)
    return [json.loads(bytes(r)) for r in conn.execute(q.order_by(EventRow.ts, EventRow.pos)).scalars()]


def overview(engine: Engine, run: str) -> dict:
    """The run's row and its trajectories counted by state."""
    with engine.connect() as conn:
        head = _run_row(conn, run)
        rows = conn.execute(select(TrajectoryRow.state, func.count()).where(TrajectoryRow.run == run)
                            .group_by(TrajectoryRow.state)).all()
    return {"run": head, "states": {s: int(n) for s, n in sorted(rows)}}


# --- demand and forecast per window ------------------------------------------------------


def demand_windows(requests: list[tuple], forecasts: list[dict], horizon: float, start: float | None = None) -> dict:
    """Actual demand per window ``[t, t+S)`` next to the forecast published for it.

    ``requests``: ``(queued_ts, prefill_finished_ts, decode_finished_ts, prompt_tokens)``.
    Actual prefill demand = prompts queued in the window + those waiting or in prefill at
    ``t``; decode admissions = prompts whose prefill finished in the window; decode KV =
    prompts in decode at ``t`` (prefill finished, decode not). Forecast fields are those of
    the ``forecast.window`` whose ``t`` is the window's start (None where none was published).
    """
    S = float(forecasts[0]["horizon"]) if forecasts else float(horizon)
    if not S > 0:
        raise QueryError("horizon must be > 0")
    times = [r[0] for r in requests] + [f["t"] for f in forecasts]
    if not times:
        return {"horizon": S, "windows": []}
    lo = min(times) if start is None else start
    t0 = math.floor(lo / S) * S
    end = max([t for r in requests for t in r[:3] if t is not None] + [f["t"] for f in forecasts])
    n = int((end - t0) // S) + 1
    if n > MAX_WINDOWS:
        raise QueryError(f"{n} windows of {S:g} s: at most {MAX_WINDOWS}; pass a larger horizon")
    idx = lambda t: min(n - 1, max(0, int((t - t0) // S)))  # noqa: E731  the window holding t
    first_at = lambda t: max(0, math.ceil((t - t0) / S))  # noqa: E731  first window starting at or after t
    prefill, admit, kv = [0.0] * (n + 1), [0.0] * n, [0.0] * (n + 1)
    for q, pf, df, prompt in requests:
        w0 = idx(q)
        stop = pf if pf is not None else df  # out of the prefill queue (None: still waiting)
        w1 = n if stop is None else max(w0 + 1, min(n, first_at(stop)))
        prefill[w0] += prompt
        prefill[w1] -= prompt
        if pf is not None:
            admit[idx(pf)] += prompt
            k0, k1 = first_at(pf), n if df is None else min(n, first_at(df))
            if k0 < k1:
                kv[k0] += prompt
                kv[k1] -= prompt
    by_t = {round((f["t"] - t0) / S): f for f in forecasts}
    out, p, k = [], 0.0, 0.0
    for w in range(n):
        p += prefill[w]
        k += kv[w]
        f = by_t.get(w)
        out.append({
            "t": t0 + w * S, "prefill_tokens": p, "decode_admit_tokens": admit[w], "decode_kv_tokens": k,
            "forecast": None if f is None else {key: f.get(key) for key in (
                "prefill_tokens", "decode_admit_tokens", "decode_kv_tokens", "decode_kv_now")},
        })
    return {"horizon": S, "windows": out}


def windows(engine: Engine, run: str, horizon: float = 10.0) -> dict:
    """:func:`demand_windows` of the run's requests and ``forecast.window`` events (their
    horizon wins over ``horizon``)."""
    with engine.connect() as conn:
        _run_row(conn, run)
        reqs = conn.execute(select(RequestRow.queued_ts, RequestRow.prefill_finished_ts,
                                   RequestRow.decode_finished_ts, RequestRow.prompt_tokens)
                            .where(RequestRow.run == run)).all()
        fcs = _typed(conn, ["forecast.window"], run)
    return demand_windows([tuple(r) for r in reqs], fcs, horizon)


# --- engines per role over time ----------------------------------------------------------


def role_steps(events: list[dict], start: float | None = None) -> list[dict]:
    """Engines per role after each engine event (``ROLES``; an engine between
    ``engine.switching`` and its outcome counts as ``switching``), folded by the engine
    registry; steps before ``start`` fold into one at ``start``."""
    registry = EngineRegistry()
    steps: list[dict] = []
    for obj in events:
        ev = event_from_dict(obj)
        registry.apply(ev)
        ts = ev.ts if start is None else max(ev.ts, start)
        step = {"ts": ts, **{r: 0 for r in ROLES}}
        for rec in registry.engines.values():
            r = "switching" if rec.switching_cmd is not None else rec.role
            step[r] = step.get(r, 0) + 1
        if steps and steps[-1]["ts"] == ts:
            steps[-1] = step
        else:
            steps.append(step)
    return steps


def engine_roles(engine: Engine, run: str) -> dict:
    """Engines per role over the run: every engine's registrations, switches and
    deregistrations up to the run's last event (engine agents publish under their own run
    label, switches under the commanding run's)."""
    with engine.connect() as conn:
        head = _run_row(conn, run)
        evs = _typed(conn, ENGINE_ROLE_TYPES, until=head["last_ts"])
    return {"first_ts": head["first_ts"], "last_ts": head["last_ts"], "steps": role_steps(evs, head["first_ts"])}


# --- switches ----------------------------------------------------------------------------


def _when(t: float) -> str:
    """Epoch seconds as UTC time of day; event time from another origin as seconds."""
    return time.strftime("%H:%M:%S", time.gmtime(t)) + " UTC" if t > 1e9 else f"{t:.1f} s"


def _plan_reason(plan: dict | None, engine_id: str) -> str:
    if plan is None:
        return "no allocation.plan before the command"
    listed = any(s.get("engine") == engine_id for s in plan.get("switches") or [])
    return (f"plan of the window at {_when(plan['t'])}: target {plan['n_prefill']}P:{plan['n_decode']}D, delta {plan['delta']:+.2f}"
            f"{'' if plan['feasible'] else ' (infeasible)'}{', lists this engine' if listed else ''}")


def advised_rows(commands: list[dict], plans: list[dict]) -> list[dict]:
    """The switches plans listed and no command carried out (an allocator in advisory mode):
    one row per run of consecutive plans advising the same move, from the first of them.
    A plan's switch counts as commanded when a command for that engine and role comes at
    or after the plan and before the next plan of a later ``ts``: an allocator can publish
    two plans at one event time (the weight-update pause's own, with its commands, and the
    window's that arrived in the same instant), and the commands then share it."""
    plans = sorted(plans, key=lambda p: p["ts"])
    plan_ts = [p["ts"] for p in plans]
    cmds = sorted(commands, key=lambda c: c["ts"])
    cmd_ts = [c["ts"] for c in cmds]
    rows: list[dict] = []
    open_: dict[tuple[str, str], dict] = {}
    for i, p in enumerate(plans):
        later = bisect.bisect_right(plan_ts, p["ts"])
        end = plan_ts[later] if later < len(plans) else math.inf
        done = {(c["engine"], c["to_role"])
                for c in cmds[bisect.bisect_left(cmd_ts, p["ts"]):bisect.bisect_left(cmd_ts, end)]}
        listed = [(s.get("engine"), s.get("to_role")) for s in p.get("switches") or []]
        advised = [k for k in listed if k not in done]
        for key in [k for k in open_ if k not in advised]:
            rows.append(open_.pop(key))
        for engine_id, to_role in advised:
            row = open_.get((engine_id, to_role))
            if row is None:
                open_[(engine_id, to_role)] = row = {
                    "cmd": None, "engine": engine_id, "ts": p["ts"], "deadline": None,
                    "from_role": {"prefill": "decode", "decode": "prefill"}.get(to_role), "to_role": to_role,
                    "reason": _plan_reason(p, engine_id), "outcome": "advised, not commanded", "seconds": None,
                    "elapsed_s": None, "mode": None, "plans": 0, "last_ts": p["ts"]}
            row["plans"] += 1
            row["last_ts"] = p["ts"]
    rows.extend(open_.values())
    for r in rows:
        if r["plans"] > 1:
            r["outcome"] = f"advised in {r['plans']} plans until {_when(r['last_ts'])}, not commanded"
    return sorted(rows, key=lambda r: (r["ts"], str(r["engine"]), str(r["to_role"])))


def switch_rows(commands: list[dict], outcomes: list[dict], plans: list[dict], now: float | None = None) -> list[dict]:
    """One row per commanded switch (and per switch no command of the run explains, and
    per run of plans advising a switch nobody commanded: :func:`advised_rows`): engine,
    from -> to, the reason (a ``reason`` field of the command if a producer added one, else
    the plan it followed), the outcome and its duration."""
    by_cmd: dict[str, dict] = {}
    for o in outcomes:
        by_cmd.setdefault(o["cmd"], {})[o["type"]] = o
    plans = sorted(plans, key=lambda p: p["ts"])
    rows = []
    for c in commands:
        got = by_cmd.pop(c["cmd"], {})
        plan = None
        for p in plans:
            if p["ts"] <= c["ts"]:
                plan = p
        done = got.get("engine.switched")
        failed = got.get("engine.switch_failed")
        started = got.get("engine.switching")
        if done:
            outcome, end = "switched", done["ts"]
        elif failed:
            outcome, end = f"failed: {failed['error']}", failed["ts"]
        elif now is not None and now > c["deadline"]:
            outcome, end = "no outcome by the deadline", None
        else:
            outcome, end = ("switching" if started else "commanded"), None
        rows.append({
            "cmd": c["cmd"], "engine": c["engine"], "ts": c["ts"], "deadline": c["deadline"],
            "from_role": (done or started or {}).get("from_role"), "to_role": c["to_role"],
            "reason": c.get("reason") or _plan_reason(plan, c["engine"]), "outcome": outcome,
            "seconds": done["seconds"] if done else None, "elapsed_s": None if end is None else round(end - c["ts"], 6),
            "mode": (done or started or {}).get("mode"),
        })
    for cmd, got in by_cmd.items():  # switches of the run whose command is not in its log
        ev = got.get("engine.switched") or got.get("engine.switch_failed") or got["engine.switching"]
        rows.append({
            "cmd": cmd, "engine": ev["engine"], "ts": ev["ts"], "deadline": None, "from_role": ev.get("from_role"),
            "to_role": ev.get("to_role", ev.get("role")), "reason": "no engine.command of this run",
            "outcome": "switched" if "engine.switched" in got else ("failed" if "engine.switch_failed" in got else "switching"),
            "seconds": got["engine.switched"]["seconds"] if "engine.switched" in got else None, "elapsed_s": None,
            "mode": ev.get("mode"),
        })
    rows.extend(advised_rows(commands, plans))
    return sorted(rows, key=lambda r: r["ts"])


def switches(engine: Engine, run: str) -> list[dict]:
    """:func:`switch_rows` of the run's commands, plans and switch events."""
    with engine.connect() as conn:
        head = _run_row(conn, run)
        evs = _typed(conn, SWITCH_TYPES + ("allocation.plan",), run)
    cmds = [e for e in evs if e["type"] == "engine.command"]
    plans = [e for e in evs if e["type"] == "allocation.plan"]
    outs = [e for e in evs if e["type"] in SWITCH_TYPES[1:]]
    return switch_rows(cmds, outs, plans, head["last_ts"])


def trajectory_events(engine: Engine, run: str, traj: str) -> list[dict]:
    """The trajectory's events in the order applied, as their JSON objects."""
    with engine.connect() as conn:
        raws = conn.execute(select(EventRow.raw).where(and_(EventRow.run == run, EventRow.traj == traj))
                            .order_by(EventRow.pos)).scalars().all()
    return [json.loads(bytes(r)) for r in raws]
