"""Ready queue (Appendix B.4): the requests queued at t count with their full prompts.

W^{P,ready} = sum x_j over the ready queue, whatever their predicted start: prefill
demand is prompt-token volume, not the work left (B.1). When they finish is the decode
admissions' question (:mod:`.known_queue`).
"""

from __future__ import annotations

from ..guards import clean, finite_sum
from ..snapshot import Snapshot


def term(snap: Snapshot) -> float:
    """W^{P,ready}: the prompt tokens of the requests queued at t."""
    return finite_sum(clean(snap.ready_prompt))
