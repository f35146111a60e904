"""Sandbox start-up (Appendix B.3): the first requests of launched trajectories.

q_k = Pr(T_start < e_k + S | T_start > e_k, mode(k)) per start-up mode (prewarm, cold,
dispatched without sandbox events, sandbox ready), times the dispatched prompt plus the
learnt first-request overhead. Each mode's duration is its start (``sandbox.started``,
or the dispatch) to the first ``request.queued``.
"""

from __future__ import annotations

import numpy as np

from ..config import ForecastConfig
from ..guards import clean
from ..history import History
from ..snapshot import START_MODES, Snapshot
from .common import N_CLASSES, spread


def term(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray) -> np.ndarray:
    """Expected first requests of launched trajectories: loads (4, N_CLASSES, steps)."""
    steps = cfg.steps
    out = np.zeros((4, N_CLASSES, steps))
    if len(snap.start_elapsed) == 0:
        return out
    elapsed = clean(snap.start_elapsed)
    prompt = clean(snap.start_prompt) + max(hist.first_overhead.value, -1e12)
    prompt = np.clip(prompt, 0.0, None)
    mode = np.asarray(snap.start_mode)
    for m in range(START_MODES):
        sel = mode == m
        if not sel.any():
            continue
        out += spread(hist.start[m], elapsed[sel], prompt[sel], 0.0, snap, cost, cfg)
    return out
