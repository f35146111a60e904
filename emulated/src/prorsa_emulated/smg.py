"""SGLang Model Gateway's ``cache_aware`` routing policy: its default thresholds, shared by
the emulated router (:mod:`prorsa_emulated.router`) and the simulator's ``smg`` router
rule (``prorsa_sim.cluster``).

The loads (requests in flight per worker) count as imbalanced when the most loaded
worker has more than ``BALANCE_ABS`` requests over the least loaded and more than
``BALANCE_REL`` times its load; a request then goes to the least loaded worker whatever
it caches. With balanced loads it goes to the worker whose prefix tree matches the
largest part of its text if that part exceeds ``CACHE_THRESHOLD`` of it, else to the
worker with the smallest tree. Source: the gateway's ``balance_abs_threshold`` (64),
``balance_rel_threshold`` (1.5) and ``cache_threshold`` (0.3) defaults.
"""

BALANCE_ABS = 64
BALANCE_REL = 1.5
CACHE_THRESHOLD = 0.3


def imbalanced(low: float, high: float) -> bool:
    """True when the least and most loaded workers' loads trip both thresholds."""
    return high - low > BALANCE_ABS and high > BALANCE_REL * low


def choose(loads, trees, match: int | None, matched: float, prompt: float) -> int:
    """The worker ``cache_aware`` sends a request to, as an index into ``loads`` (each
    worker's requests in flight) and ``trees`` (the size of the text the router has sent
    it: its prefix tree). ``match`` is the worker whose tree matches the request's
    prefix, ``matched`` of its ``prompt`` (None: no tree does). Imbalanced loads: the
    least loaded; else the match if it covers more than ``CACHE_THRESHOLD`` of the
    prompt; else the smallest tree. Ties go to the first."""
    if not len(loads) or len(loads) != len(trees):
        raise ValueError("one load and one tree size per worker, and at least one worker")
    low, high = min(loads), max(loads)
    if imbalanced(low, high):
        return list(loads).index(low)
    if match is not None and 0 <= match < len(loads) and matched > CACHE_THRESHOLD * prompt:
        return match
    return list(trees).index(min(trees))
