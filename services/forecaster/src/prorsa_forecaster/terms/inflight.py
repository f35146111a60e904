"""In-flight prefill (Appendix B.6): the requests in prefill at t count with their full
prompts.

W^{P,inflight} = sum x_j over Q^P_t, whatever their progress: prefill demand is
prompt-token volume (B.1). Their finish times (their start plus g, never before t) are
the decode admissions' (:mod:`.known_queue`).
"""

from __future__ import annotations

from ..guards import clean, finite_sum
from ..snapshot import Snapshot


def term(snap: Snapshot) -> float:
    """W^{P,inflight}: the prompt tokens of the requests in prefill at t."""
    return finite_sum(clean(snap.inflight_prompt))
