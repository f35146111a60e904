"""The engine table: what engine agents reported (registration, role, switches, stats).

Pure: part of the tracker's fold. An engine is keyed by its ``engine`` id (engines serve
the whole cluster, not one run). Out-of-order reports are kept (the newest wins) and
reported as anomalies, so the table never refuses what an agent says is true now.
"""

from __future__ import annotations

from prorsa_schemas import Event

from .state import Anomaly, EngineState, TrackerState


def _anomaly(ev: Event, reason: str) -> Anomaly:
    return Anomaly(run=ev.run, traj=None, event_id=ev.id, event_type=ev.type, ts=ev.ts, reason=reason)


def apply_engine_event(state: TrackerState, ev) -> list[Anomaly]:
    """Fold one ``engine.*`` event into ``state.engines``; returns its anomalies."""
    engines = state.engines
    eng = engines.get(ev.engine)
    t = ev.type
    out: list[Anomaly] = []
    if t == "engine.registered":
        engines[ev.engine] = EngineState(
            engine=ev.engine,
            role=ev.role,
            registered=True,
            server=ev.server,
            gpus=ev.gpus,
            kv_capacity_tokens=ev.kv_capacity_tokens,
            url=ev.url,
            switch_modes=tuple(ev.switch_modes or ()),
            updated_ts=ev.ts,
        )
        return out
    if eng is None or not eng.registered:
        out.append(_anomaly(ev, f"{t} for engine {ev.engine!r}, which is not registered"))
        if t == "engine.deregistered":
            return out
        if eng is None:
            role = getattr(ev, "role", None) or getattr(ev, "from_role", None) or "mixed"
            eng = engines[ev.engine] = EngineState(engine=ev.engine, role=role)
    eng.updated_ts = max(eng.updated_ts, ev.ts)
    if t == "engine.stats":
        eng.role = ev.role
        eng.running_reqs = ev.running_reqs
        eng.queued_reqs = ev.queued_reqs
        eng.kv_used_tokens = ev.kv_used_tokens
        eng.kv_capacity_tokens = ev.kv_capacity_tokens
        eng.prefill_tokens_per_s = ev.prefill_tokens_per_s
        eng.decode_tokens_per_s = ev.decode_tokens_per_s
        eng.cache_hit_rate = ev.cache_hit_rate
        eng.stats_ts = ev.ts
    elif t == "engine.switching":
        if eng.switching_cmd is not None and eng.switching_cmd != ev.cmd:
            out.append(_anomaly(ev, f"engine {ev.engine!r} starts switch {ev.cmd!r} while {eng.switching_cmd!r} is in flight"))
        if ev.from_role != eng.role:
            out.append(_anomaly(ev, f"engine {ev.engine!r} switches from {ev.from_role} but its role is {eng.role}"))
        eng.switching_cmd = ev.cmd
        eng.switching_to = ev.to_role
        eng.switching_since = ev.ts
    elif t == "engine.switched":
        if eng.switching_cmd is not None and eng.switching_cmd != ev.cmd:
            out.append(_anomaly(ev, f"engine {ev.engine!r} finished switch {ev.cmd!r} but {eng.switching_cmd!r} was in flight"))
        eng.role = ev.to_role
        eng.switching_cmd = eng.switching_to = eng.switching_since = None
    elif t == "engine.switch_failed":
        eng.role = ev.role
        eng.switching_cmd = eng.switching_to = eng.switching_since = None
    elif t == "engine.deregistered":
        del engines[ev.engine]
    return out
