"""The prefill queues of the requests known at t (queued or in prefill): the part of the
decode-admission queue model (:mod:`.decode_admit`, Appendix B.7) that does not depend on
the window's arrivals, which queue behind it. Computed once per window; it also tells the
tool term when each queued request's next turn can start.

An instance with ``c`` attention data-parallel ranks is ``c`` FIFO servers. In-flight
requests hold the servers; queued ones wait on the rank the router named
(``request.queued.dp_rank``) or are dealt round-robin in arrival order from the earliest
free server; each server is a max-plus scan (:func:`.prefill_queue.simulate_queues`). A
queued request's start varies with the cache flips (hit or miss) of those ahead of it;
it is admitted with Pr(start + g < t + S) under a normal of that spread.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..guards import BIG, clean
from ..snapshot import Snapshot
from .common import MAX_SERVERS, definite
from .prefill_queue import fifo_order, simulate_queues, stable_by


def normal_below(margin: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Pr(N(0, sd^2) < margin) (sd 0: the indicator margin > 0); Abramowitz-Stegun
    7.1.26 for erf, error below 1.5e-7."""
    margin, sd = np.broadcast_arrays(np.asarray(margin, dtype=float), np.asarray(sd, dtype=float))
    out = (margin > 0).astype(float)  # sd 0 (or not a number): the indicator
    spread = sd > 0
    if not spread.any():  # a queue whose cache outcomes are all alike: no spread at all
        return out
    whole = bool(spread.all())
    m, s = (margin, sd) if whole else (margin[spread], sd[spread])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = m / (np.sqrt(2.0) * s)
    # Past |z| = 6 (about 8.5 sd) erf is 1 to double precision: only the rest is computed.
    p = np.where(z > 0, 1.0, 0.0)
    near = np.abs(z) < 6.0
    p[np.isnan(z)] = 0.5
    if near.any():
        zn = z[near]
        x = np.abs(zn)
        t = 1.0 / (1.0 + 0.3275911 * x)
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        p[near] = 0.5 * (1.0 + np.sign(zn) * (1.0 - poly * np.exp(-x * x)))
    if whole:
        return p
    out[spread] = p
    return out


def _rank_of(rank_column, inst: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The named data-parallel rank of each request on its instance, -1 where none is
    named (or it is not one of the instance's ``c`` servers)."""
    r = np.asarray(rank_column)
    if len(r) != len(inst):
        return np.full(len(inst), -1, dtype=np.int64)
    r = np.nan_to_num(r.astype(float), nan=-1.0, posinf=-1.0, neginf=-1.0)
    return np.where((r >= 0) & (r < c[inst]), r, -1).astype(np.int64)


def _run_rank(sorted_keys: np.ndarray) -> np.ndarray:
    """Position of each element within its run of equal keys (keys sorted)."""
    n = len(sorted_keys)
    return np.arange(n) - np.searchsorted(sorted_keys, sorted_keys, side="left")


@dataclass(frozen=True)
class KnownQueue:
    """The requests queued or in prefill at t through the instances' queues: when each
    is expected to finish, and the spread of that (see :func:`known_queue`). Predicted
    arrivals queue behind them (FIFO), so this part does not depend on the arrivals and
    is computed once per window for both the next turns' chain and the admissions."""

    a: np.ndarray
    b: np.ndarray
    d: np.ndarray
    """Per-instance g = a + b n + d n ctx (seconds; per computed token; per attention pair)."""
    c: np.ndarray
    """Servers (data-parallel queues) per instance."""
    V: int
    srv_inst: np.ndarray
    """The instance of each of the V servers."""
    x_in: np.ndarray
    i_in: np.ndarray
    started: np.ndarray
    gh_in: np.ndarray
    gm_in: np.ndarray
    p_in: np.ndarray
    """In flight: prompt, instance, start (s after t, <= 0), prefill time on a hit and a
    miss, Pr(hit) given how long it has run."""
    x_rd: np.ndarray
    i_rd: np.ndarray
    u_rd: np.ndarray
    gh_rd: np.ndarray
    gm_rd: np.ndarray
    hit_rd: np.ndarray | float
    svc_rd: np.ndarray
    var_rd: np.ndarray
    srv_rd: np.ndarray
    b_rd: np.ndarray
    s_rd: np.ndarray
    sd: np.ndarray
    """Queued: prompt, instance, queue time, prefill time on a hit and a miss, Pr(hit),
    the expected service, its variance, server, expected finish and start, and the
    start's spread."""
    free: np.ndarray
    free_var: np.ndarray
    pause: float
    end: np.ndarray
    """Per server: when it frees from its in-flight holder (and the weight-sync pause),
    that time's variance, the pause, and when it is through its known queue."""
    cache: dict = field(default_factory=dict, compare=False, repr=False)
    """:meth:`edges` per (horizon, steps)."""

    def g(self, inst: np.ndarray, load: np.ndarray) -> np.ndarray:
        """Prefill seconds of load rows on their instances: g = a + b n + d n ctx."""
        return self.a[inst] * load[:, 0] + self.b[inst] * load[:, 2] + self.d[inst] * load[:, 3]

    def admitted_by(self, end) -> tuple[np.ndarray, np.ndarray]:
        """Each in-flight and each queued request's probability of finishing before
        ``end`` (seconds after t), over its cache outcomes and its start's spread. With an
        array of ends: ``(n, len(end))`` each."""
        e = np.asarray(end, dtype=float)
        col = (slice(None), None) if e.ndim else (slice(None),)
        w_in = self.p_in[col] * (self.started[col] + self.gh_in[col] < e)
        w_in = w_in + (1.0 - self.p_in[col]) * (self.started[col] + self.gm_in[col] < e)
        hit = np.broadcast_to(np.asarray(self.hit_rd, dtype=float), self.x_rd.shape)[col]
        s, sd = self.s_rd[col], self.sd[col]
        w_rd = hit * normal_below(e - self.gh_rd[col] - s, sd) + (1.0 - hit) * normal_below(e - self.gm_rd[col] - s, sd)
        return w_in, w_rd

    def edges(self, horizon: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`admitted_by` at the sub-step edges 0, h, ..., S: ``(n, steps + 1)``
        each, computed once per (horizon, steps)."""
        key = (float(horizon), int(steps))
        if key not in self.cache:
            self.cache[key] = self.admitted_by(np.linspace(0.0, horizon, steps + 1))
        return self.cache[key]

    def finish_steps(self, horizon: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
        """Pr(finishing in sub-step k) of each in-flight and each queued request,
        ``(n, steps)`` each (what is overdue finishes in the first)."""
        return tuple(np.clip(np.diff(c[:, 1:], axis=1, prepend=0.0), 0.0, 1.0) for c in self.edges(horizon, steps))


def known_queue(snap: Snapshot) -> KnownQueue:
    """The known requests' queue (:class:`KnownQueue`)."""
    # Per-instance g = a + b n + d n ctx, bounded so that no product overflows.
    a = np.clip(clean(snap.instance_overhead), 0.0, 1e4)
    b = np.clip(clean(snap.instance_per_token), 0.0, 1.0)
    d = np.clip(clean(snap.column("instance_per_pair", "instance_overhead")), 0.0, 1e-3)
    c = np.clip(np.rint(clean(snap.column("instance_servers", "instance_overhead", 1.0))), 1, MAX_SERVERS).astype(np.int64)
    M = len(a)
    V = int(c.sum())
    offset = np.concatenate(([0], np.cumsum(c)[:-1]))
    srv_inst = np.repeat(np.arange(M), c)  # the instance of each server

    def inst_of(idx: np.ndarray) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        # Unknown assignment: spread round-robin (the router balances).
        fallback = np.arange(len(idx)) % M
        return np.where((idx >= 0) & (idx < M), idx, fallback)

    def g(inst: np.ndarray, load: np.ndarray) -> np.ndarray:
        return a[inst] * load[:, 0] + b[inst] * load[:, 2] + d[inst] * load[:, 3]

    hit = float(np.clip(np.nan_to_num(snap.cache_hit, nan=1.0), 0.0, 1.0))

    def hit_of(flags, prefix) -> np.ndarray | float:
        """Queued / in-flight requests whose engine is not known yet (request.queued
        without ``engine``) hit like a future request: routed back to their cache with
        the learnt share (``Snapshot.unrouted_hit``). Known engine: the plain hit rate."""
        f = np.asarray(flags, dtype=bool)
        if not f.any():
            return hit
        far = np.clip(np.nan_to_num(snap.unrouted_hit(clean(prefix)), nan=1.0), 0.0, 1.0)
        return np.where(f, far, hit)

    cold = float(np.clip(np.nan_to_num(snap.cache_cold, nan=0.0), 0.0, 1.0))

    def outcomes(x, prefix, inst):
        """Prefill time on a cache hit and on a miss (see request_rows)."""
        base = cold * x
        return g(inst, definite(x, np.maximum(clean(prefix), base))), g(inst, definite(x, base))

    # In flight: its own start time plus g (the runtime progress before t), never earlier
    # than t. The c latest to finish on an instance hold its servers until then. One
    # still running after the hit's prefill time has missed the cache.
    x_in = clean(snap.inflight_prompt)
    i_in = inst_of(snap.inflight_instance)
    started = np.clip(np.nan_to_num(np.asarray(snap.inflight_started, dtype=float) - snap.t, nan=0.0), -BIG, 0.0)
    gh_in, gm_in = outcomes(x_in, snap.column("inflight_cached", "inflight_prompt"), i_in)
    hit_in = hit_of(snap.column("inflight_unrouted", "inflight_prompt", 0.0), snap.column("inflight_cached", "inflight_prompt"))
    p_in = np.where(-started >= gh_in, 0.0, hit_in) * (gh_in < gm_in) + (gh_in >= gm_in)
    b_in = np.maximum(started + p_in * gh_in + (1.0 - p_in) * gm_in, 0.0)
    free = np.zeros(V)
    free_var = np.zeros(V)  # the variance of when a server frees (its holder's cache flip)
    if len(b_in):
        var_in = p_in * (1.0 - p_in) * np.square(gh_in - gm_in)
        ranked = _rank_of(snap.inflight_rank, i_in, c)
        unk = ranked < 0
        order = np.flatnonzero(unk)[np.lexsort((-b_in[unk], i_in[unk]))]
        inst_s = i_in[order]
        r = _run_rank(inst_s)
        hold = r < c[inst_s]
        free[offset[inst_s[hold]] + r[hold]] = b_in[order][hold]
        free_var[offset[inst_s[hold]] + r[hold]] = var_in[order][hold]
        if (~unk).any():
            # On a named rank: the one of its requests that finishes last holds it.
            known = np.flatnonzero(~unk)
            srv = offset[i_in[known]] + ranked[known]
            o = np.lexsort((b_in[known], srv))
            last = np.flatnonzero(np.concatenate((srv[o][1:] != srv[o][:-1], [True])))
            pick, s_pick = known[o][last], srv[o][last]
            later = b_in[pick] > free[s_pick]
            free[s_pick[later]] = b_in[pick][later]
            free_var[s_pick[later]] = var_in[pick][later]
    pause = float(np.clip(np.nan_to_num(snap.prefill_pause, nan=0.0, posinf=0.0), 0.0, BIG))
    free_var = np.where(free > pause, free_var, 0.0)  # a pause that ends later is certain
    free = np.maximum(free, pause)

    # Queued: in arrival order per instance, dealt round-robin over its servers from the
    # earliest free one.
    x_rd = clean(snap.ready_prompt)
    i_rd = inst_of(snap.ready_instance)
    u_rd = np.clip(np.nan_to_num(np.asarray(snap.ready_since, dtype=float) - snap.t, nan=0.0), -BIG, 0.0)
    gh_rd, gm_rd = outcomes(x_rd, snap.column("ready_cached", "ready_prompt"), i_rd)
    srv_rd = np.zeros(len(x_rd), dtype=np.int64)
    by_u = np.argsort(u_rd, kind="stable")  # queue time, ties in the snapshot's order
    if len(x_rd):
        # A request the router placed on a named rank (request.queued.dp_rank) waits in
        # that rank's queue; the others are dealt among themselves.
        ranked = _rank_of(snap.ready_rank, i_rd, c)
        srv_rd = np.where(ranked >= 0, offset[i_rd] + ranked, 0)
        srv_order = np.lexsort((free, srv_inst))  # grouped by instance, earliest free first
        order = stable_by(i_rd, by_u[(ranked < 0)[by_u]])  # per instance, by queue time
        inst_s = i_rd[order]
        pos = _run_rank(inst_s)
        srv_rd[order] = srv_order[offset[inst_s] + pos % c[inst_s]]

    hit_rd = hit_of(snap.column("ready_unrouted", "ready_prompt", 0.0), snap.column("ready_cached", "ready_prompt"))
    svc_rd = hit_rd * gh_rd + (1.0 - hit_rd) * gm_rd  # a server is held for the expected time
    # ...around which each queued request's cache flip (hit or miss) varies.
    var_rd = np.broadcast_to(hit_rd * (1.0 - hit_rd) * np.square(gh_rd - gm_rd), x_rd.shape)
    fifo = fifo_order(srv_rd, u_rd, by_u)  # each server's FIFO order
    b_rd = simulate_queues(srv_rd, u_rd, svc_rd, free, fifo)
    end = free.copy()  # when each server is through its known queue
    np.maximum.at(end, srv_rd, b_rd)

    # A known request is admitted in the window with the probability of the cache
    # outcomes that finish it in time (a long cold prompt may not, its hit would).
    s_rd = b_rd - svc_rd
    sd = np.zeros(len(x_rd))
    if len(x_rd):
        # When a queued request starts is its server's free time plus the service of
        # those dealt before it there, each a cache flip (hit or miss) around the expected
        # time the queue used. Their variances add up; the admission of each outcome is
        # then Pr(start + g < S) under a normal of that spread. A hard cut at the mean
        # start treats the sum as certain, which is not the model's own expectation:
        # the chance that the request finishes in time is not the indicator at the mean.
        srv_s = srv_rd[fifo]
        cum = np.cumsum(var_rd[fifo])
        first = np.searchsorted(srv_s, srv_s, side="left")
        ahead = np.zeros(len(x_rd))
        ahead[fifo] = cum - var_rd[fifo] - np.concatenate(([0.0], cum))[first]
        sd = np.sqrt(np.clip(ahead + free_var[srv_rd], 0.0, None))

    return KnownQueue(
        a=a, b=b, d=d, c=c, V=V, srv_inst=srv_inst,
        x_in=x_in, i_in=i_in, started=started, gh_in=gh_in, gm_in=gm_in, p_in=p_in,
        x_rd=x_rd, i_rd=i_rd, u_rd=u_rd, gh_rd=gh_rd, gm_rd=gm_rd, hit_rd=hit_rd, svc_rd=svc_rd, var_rd=var_rd,
        srv_rd=srv_rd, b_rd=b_rd, s_rd=s_rd, sd=sd, free=free, free_var=free_var, pause=pause, end=end,
    )
