"""The engine side of the tracker's fold: engine events go to the engine registry
(:mod:`prorsa_schemas.registry`, ``state.registry``) and what did not follow from its state
comes back as anomalies. An engine is keyed by its ``engine`` id (engines serve the whole
cluster, not one run); out-of-order reports are kept (the newest wins) and reported, so
the table never refuses what an agent says is true now.
"""

from __future__ import annotations

from prorsa_schemas import Event

from .state import Anomaly, TrackerState


def apply_engine_event(state: TrackerState, ev: Event) -> list[Anomaly]:
    """Fold one ``engine.*`` event into ``state.registry``; returns its anomalies."""
    change = state.registry.apply(ev)
    if change is None:
        return []
    return [Anomaly(run=ev.run, traj=None, event_id=ev.id, event_type=ev.type, ts=ev.ts, reason=reason)
            for reason in change.problems]
