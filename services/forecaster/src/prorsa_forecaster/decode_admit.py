"""Decode admissions A-hat^D and K-hat^D by prefill queue simulation (Appendix B.7).

Every in-flight and queued request, and the predicted arrivals of the window, go through
the prefill instances' FIFO queues, ``b_j = max(u_j, v_m(j)) + g(x_j)``; the prompt
tokens of the requests whose completion b_j falls before t+S are A^D, and kappa^D of
them is K^D.

What the physics asks beyond the paper's one-queue-per-instance recursion:

* An instance serves ``c`` data-parallel queues at once (SGLang attention DP ranks: each
  rank chunk-prefills its own requests). Each instance is therefore split into ``c``
  servers. In-flight requests hold the servers (the ``c`` latest to finish); queued ones
  are dealt to the instance's servers in arrival order, round-robin starting from the
  earliest free, then each server is a FIFO max-plus scan
  (:func:`~prorsa_forecaster.prefill_queue.simulate_queues`). Round-robin is what keeps it
  vectorised; with a backlog it keeps every server busy, as earliest-free dispatch does.
* g depends on the computed tokens (prompt minus the expected cached prefix) and on the
  attention context they see, not on the full prompt (see ``PrefillTimeModel``).
* After a weight update prefill pauses (``Snapshot.prefill_pause``): no server is free
  before it resumes. An update that may still land inside the window makes the
  admissions a mixture over when it lands (:class:`PendingUpdate`, :func:`_update_mixture`).
* The known requests' part of the queue (:class:`KnownQueue`) does not depend on the
  arrivals, which queue behind it: it is computed once per window and also tells the
  forecast when each queued request's next turn can start.
* Predicted arrivals are aggregated per sub-step and per service-time class, and spread
  evenly over all servers. Their work queues like a fluid on each server (which gives
  when the server gets to them), but each request then takes its OWN prefill time: a 50k
  token cold prompt arriving at an idle instance still takes seconds on its rank. A
  purely fluid split would admit it at once and over-predict admissions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import ForecastConfig
from .guards import BIG, clean, finite_sum
from .prefill_queue import simulate_queues
from .snapshot import Snapshot

MAX_SERVERS = 4096  # per instance; far beyond any data-parallel size
# Service-time classes of predicted requests (upper edges, seconds; the last is open).
CLASS_EDGES = np.geomspace(0.02, 60.0, 15)
N_CLASSES = len(CLASS_EDGES) + 1
GH_NODES = 8  # Gauss-Hermite nodes of the arrivals' average over the queue's spread
_P_MIN = 1e-4  # a sub-step less likely than this to see the weight update is left out


def pooled_cost(snap: Snapshot) -> np.ndarray:
    """``(a, b, d)`` of g averaged over the instances, weighted by their servers."""
    a = np.clip(clean(snap.instance_overhead), 0.0, 1e4)
    b = np.clip(clean(snap.instance_per_token), 0.0, 1.0)
    d = np.clip(clean(snap.column("instance_per_pair", "instance_overhead")), 0.0, 1e-3)
    w = np.clip(clean(snap.column("instance_servers", "instance_overhead", 1.0)), 1.0, MAX_SERVERS)
    return np.array([np.average(a, weights=w), np.average(b, weights=w), np.average(d, weights=w)])


def service_class(load: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """The service-time class of each request row (:func:`request_rows`; a row may be
    weighted by its probability: its count column, so the time is per request)."""
    g = cost[0] * load[:, 0] + cost[1] * load[:, 2] + cost[2] * load[:, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        per = np.where(load[:, 0] > 0, g / load[:, 0], 0.0)
    return np.searchsorted(CLASS_EDGES, np.nan_to_num(per, nan=0.0, posinf=0.0))


def class_sums(load: np.ndarray, cls: np.ndarray) -> np.ndarray:
    """``(4, N_CLASSES)`` loads summed per class."""
    return np.stack([np.bincount(cls, weights=load[:, j], minlength=N_CLASSES)[:N_CLASSES] for j in range(4)])


def _definite(x: np.ndarray, cached: np.ndarray) -> np.ndarray:
    """Load rows of requests with a known cached prefix (inputs already cleaned)."""
    c = np.minimum(cached, x)
    new = x - c
    out = np.empty((len(x), 4))
    out[:, 0] = 1.0
    out[:, 1] = x
    out[:, 2] = new
    out[:, 3] = new * (c + 0.5 * new)
    return out


def request_rows(x, prefix=0.0, hit=1.0, cold: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """The two outcomes of each request's prefix-cache lookup, as load rows.

    A request whose trajectory's previous prompt (``prefix`` tokens) is cached finds it
    with probability ``hit`` (else it misses entirely: a cache is flushed, evicted, or the
    request was routed elsewhere); either way a share ``cold`` of the prompt may be found
    cached (e.g. a shared system prompt). Returns ``(hit_rows, miss_rows)``, each ``(n, 4)``
    ([1, prompt, computed tokens, attention pairs]), already weighted by their probability.
    Hit and miss are kept apart because prefill time is far from linear in them.
    """
    x = clean(np.atleast_1d(np.asarray(x, dtype=float)))
    p = np.broadcast_to(clean(prefix), x.shape)
    hit = np.clip(np.nan_to_num(np.broadcast_to(np.asarray(hit, dtype=float), x.shape), nan=1.0), 0.0, 1.0)[:, None]
    cold = float(np.clip(np.nan_to_num(cold, nan=0.0), 0.0, 1.0))
    base = cold * x
    return hit * _definite(x, np.maximum(p, base)), (1.0 - hit) * _definite(x, base)


def request_loads(x, prefix=0.0, hit: float = 1.0, cold: float = 0.0) -> np.ndarray:
    """``(n, 4)`` expected load columns of requests: [1, prompt, computed tokens, attention
    pairs] (computed = prompt - cached prefix; pairs = computed x its mean context),
    averaged over the cache lookup's outcomes (see :func:`request_rows`)."""
    h, m = request_rows(x, prefix, hit, cold)
    return h + m


def normal_below(margin: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Pr(N(0, sd^2) < margin) (sd 0: the indicator margin > 0); Abramowitz-Stegun
    7.1.26 for erf, error below 1.5e-7."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        z = np.where(sd > 0, margin / (np.sqrt(2.0) * sd), np.where(margin > 0, np.inf, -np.inf))
    # Past |z| = 6 (about 8.5 sd) erf is 1 to double precision: only the rest is computed.
    out = np.where(z > 0, 1.0, 0.0)
    near = np.abs(z) < 6.0
    out[np.isnan(z)] = 0.5
    if near.any():
        zn = z[near]
        x = np.abs(zn)
        t = 1.0 / (1.0 + 0.3275911 * x)
        poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
        out[near] = 0.5 * (1.0 + np.sign(zn) * (1.0 - poly * np.exp(-x * x)))
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


def decode_admissions(snap: Snapshot, cfg: ForecastConfig, future: np.ndarray) -> tuple[float, float]:
    """A^D and K^D: see :func:`decode_admissions_split`."""
    known, arriving, kv, _ = decode_admissions_split(snap, cfg, future)
    return known + arriving, kv


@dataclass(frozen=True)
class AdmitDetail:
    """What the decode noise floor needs (``uncertainty.decode_sd``)."""

    alpha: tuple[float, ...] = ()
    """Per sub-step: the share of the predicted arrivals' tokens in it admitted by t + S."""
    known_var: float = 0.0
    """sum w (1 - w) x^2 over the known requests, w their probability of admission."""
    arrival_tokens: tuple[float, ...] = ()
    """Per sub-step: the predicted arrivals' prompt tokens (what ``alpha`` is a share of)."""


@dataclass(frozen=True)
class PendingUpdate:
    """A weight update that may land inside the window.

    When it lands (at u) every decoding request is aborted and re-queued, prefill stops
    for the weight sync (``pause`` seconds) and every cache is flushed: what was not
    prefilled by u starts again, cold, at u + pause, behind nothing, and the re-prefills
    queue behind it."""

    p: np.ndarray
    """Pr(the update lands in sub-step k), k = 0..steps-1 (sums to at most 1)."""
    pause: float
    """Seconds from the update until prefill resumes (learnt)."""
    reprefill: np.ndarray
    """``(4,)`` the re-prefills' loads if it lands (count, prompt, computed, pairs; cold)."""


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
    start's spread (0 without ``queue_spread``)."""
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


def known_queue(snap: Snapshot, spread: bool = True) -> KnownQueue:
    """The known requests' queue (:class:`KnownQueue`); ``spread``: ``queue_spread``."""
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
        return g(inst, _definite(x, np.maximum(clean(prefix), base))), g(inst, _definite(x, base))

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
    if len(x_rd):
        # A request the router placed on a named rank (request.queued.dp_rank) waits in
        # that rank's queue; the others are dealt among themselves.
        ranked = _rank_of(snap.ready_rank, i_rd, c)
        srv_rd = np.where(ranked >= 0, offset[i_rd] + ranked, 0)
        unk = np.flatnonzero(ranked < 0)
        srv_order = np.lexsort((free, srv_inst))  # grouped by instance, earliest free first
        order = unk[np.lexsort((unk, u_rd[unk], i_rd[unk]))]
        inst_s = i_rd[order]
        pos = _run_rank(inst_s)
        srv_rd[order] = srv_order[offset[inst_s] + pos % c[inst_s]]

    hit_rd = hit_of(snap.column("ready_unrouted", "ready_prompt", 0.0), snap.column("ready_cached", "ready_prompt"))
    svc_rd = hit_rd * gh_rd + (1.0 - hit_rd) * gm_rd  # a server is held for the expected time
    # ...around which each queued request's cache flip (hit or miss) varies.
    var_rd = np.broadcast_to(hit_rd * (1.0 - hit_rd) * np.square(gh_rd - gm_rd), x_rd.shape)
    b_rd = simulate_queues(srv_rd, u_rd, svc_rd, free)
    end = free.copy()  # when each server is through its known queue
    np.maximum.at(end, srv_rd, b_rd)

    # A known request is admitted in the window with the probability of the cache
    # outcomes that finish it in time (a long cold prompt may not, its hit would).
    s_rd = b_rd - svc_rd
    sd = np.zeros(len(x_rd))
    if spread and len(x_rd):
        # When a queued request starts is its server's free time plus the service of
        # those dealt before it there, each a cache flip (hit or miss) around the expected
        # time the queue used. Their variances add up; the admission of each outcome is
        # then Pr(start + g < S) under a normal of that spread. A hard cut at the mean
        # start treats the sum as certain, which is not the model's own expectation:
        # the chance that the request finishes in time is not the indicator at the mean.
        o = np.lexsort((np.arange(len(x_rd)), u_rd, srv_rd))  # each server's FIFO order
        srv_s = srv_rd[o]
        cum = np.cumsum(var_rd[o])
        first = np.searchsorted(srv_s, srv_s, side="left")
        ahead = np.zeros(len(x_rd))
        ahead[o] = cum - var_rd[o] - np.concatenate(([0.0], cum))[first]
        sd = np.sqrt(np.clip(ahead + free_var[srv_rd], 0.0, None))

    return KnownQueue(
        a=a, b=b, d=d, c=c, V=V, srv_inst=srv_inst,
        x_in=x_in, i_in=i_in, started=started, gh_in=gh_in, gm_in=gm_in, p_in=p_in,
        x_rd=x_rd, i_rd=i_rd, u_rd=u_rd, gh_rd=gh_rd, gm_rd=gm_rd, hit_rd=hit_rd, svc_rd=svc_rd, var_rd=var_rd,
        srv_rd=srv_rd, b_rd=b_rd, s_rd=s_rd, sd=sd, free=free, free_var=free_var, pause=pause, end=end,
    )


def decode_admissions_split(
    snap: Snapshot,
    cfg: ForecastConfig,
    future: np.ndarray,
    update: PendingUpdate | None = None,
    known: KnownQueue | None = None,
) -> tuple[float, float, float, AdmitDetail]:
    """``(known, arriving, K-hat^D, detail)`` for the window at ``snap.t``: A-hat^D is
    ``known + arriving``, the admissions of requests queued or in prefill at t and of the
    predicted arrivals.

    Args:
        snap: the snapshot (times in it are absolute; the simulation runs relative to t).
        cfg: horizon S, sub-steps and KV page size.
        future: ``(4, N_CLASSES, steps)`` predicted arrival loads per service class and
            sub-step (count, prompt tokens, computed tokens, attention pairs; see
            :func:`request_loads`).
        update: a weight update that may land in the window: the admissions are then a
            mixture over when it lands (see :func:`_update_mixture`); the re-prefills'
            admissions count with the known requests (they are requests decoding at t).
        known: :func:`known_queue` of this snapshot, if the caller has it already.
    """
    S, steps = cfg.horizon, cfg.steps
    kq = known if known is not None else known_queue(snap, cfg.queue_spread)
    a, b, d, V, srv_inst, g = kq.a, kq.b, kq.d, kq.V, kq.srv_inst, kq.g
    x_in, x_rd, srv_rd = kq.x_in, kq.x_rd, kq.srv_rd
    var_rd, free_var, pause = kq.var_rd, kq.free_var, kq.pause

    # Predicted arrivals: per sub-step, split evenly over every server; the server's
    # queue is open to them from the sub-step's start (they arrive through it), behind
    # the known requests.
    h = S / steps
    k = np.repeat(np.arange(steps), V)
    v = np.tile(np.arange(V), steps)
    fut = clean(np.asarray(future, dtype=float).reshape(4, N_CLASSES, steps))
    load_f = (fut.sum(axis=1)[:, k] / V).T
    u_f = k * h
    svc_f = g(srv_inst[v], load_f)
    b_f = simulate_queues(v, u_f, svc_f, kq.end)

    c_in, c_rd = kq.edges(S, steps)
    w_in, w_rd = c_in[:, -1], c_rd[:, -1]
    known = finite_sum(x_in * w_in) + finite_sum(x_rd * w_rd)
    # Predicted requests arrive evenly through their sub-step [kh, kh + h] and start as
    # their server's fluid queue reaches them: the request at position phi of the
    # sub-step's work starts at max(start + phi svc_f, kh + phi h) (the queue ahead of
    # it, or its own arrival) and finishes after its own class's mean prefill time g.
    # Both terms grow with phi, so the admitted share is the phi where either reaches
    # S - g.
    used = fut[0].sum(axis=1) > 0  # service classes with any predicted request
    cols = fut[:, used, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_req = cols[0] > 0
        inst_f = srv_inst[v]
        g_cls = (
            a[inst_f][:, None] * (cols[0].T[k] > 0)
            + b[inst_f][:, None] * np.where(per_req, cols[2] / cols[0], 0.0).T[k]
            + d[inst_f][:, None] * np.where(per_req, cols[3] / cols[0], 0.0).T[k]
        )
        spread = svc_f[:, None]

    def admitted_share(b_arr: np.ndarray, end: float = S, rows=slice(None)) -> np.ndarray:
        """Per scenario of when the servers get to the arrivals (``b_arr``: one row of
        completion times each), (server, sub-step) row and used class: the admitted share
        before ``end``."""
        with np.errstate(divide="ignore", invalid="ignore"):
            sp, gc = spread[rows], g_cls[rows]
            begin = (b_arr[:, rows] - svc_f[rows])[..., None] + gc
            share = np.where(sp > 0, (end - begin) / sp, (begin < end).astype(float))
            cap = (end - u_f[rows][:, None] - gc) / h
            out = np.clip(np.minimum(share, cap), 0.0, 1.0)
        return np.where(np.isnan(out), 0.0, out)

    # When each server gets to the arrivals: one scenario, or the spread's nodes below.
    b_nodes, w_nodes = b_f[None, :], np.ones(1)
    if cfg.arrival_spread and len(x_rd):
        # The queued requests' cache flips move when each server gets to the arrivals
        # too: average the arrivals' admission over that spread (Gauss-Hermite nodes of
        # a normal shift of the server's end of queue; the arrivals' fluid is re-run).
        sd_v = np.sqrt(np.clip(np.bincount(srv_rd, weights=var_rd, minlength=V) + free_var, 0.0, None))
        if np.any(sd_v > 0):
            end = kq.end
            nodes, weights = np.polynomial.hermite_e.hermegauss(GH_NODES)
            weights = weights / weights.sum()
            # All nodes in one scan: node i's copy of server v is server i V + v.
            shifted = np.maximum(end[None, :] + sd_v[None, :] * nodes[:, None], pause).ravel()
            copies = (np.arange(GH_NODES)[:, None] * V + v[None, :]).ravel()
            b_all = simulate_queues(copies, np.tile(u_f, GH_NODES), np.tile(svc_f, GH_NODES), shifted).reshape(GH_NODES, -1)
            b_nodes, w_nodes = b_all, weights

    def arrivals_by(end: float = S, rows=slice(None)) -> np.ndarray:
        """The arrivals' admitted share before ``end``, per (server, sub-step) row (those
        of ``rows``) and used class, averaged over the scenarios (all in one pass)."""
        return np.tensordot(w_nodes, admitted_share(b_nodes, end, rows), axes=1)

    frac = arrivals_by(S)
    tok = cols[1].T[k] / V
    admit_f = finite_sum(tok * frac)
    page = cfg.kv_page_tokens
    kv = finite_sum(np.ceil(x_in / page) * page * w_in) + finite_sum(np.ceil(x_rd / page) * page * w_rd)
    kv += admit_f  # aggregated tokens: page rounding averages out
    per_step = np.bincount(k, weights=tok.sum(axis=1), minlength=steps)
    got = np.bincount(k, weights=(tok * frac).sum(axis=1), minlength=steps)
    if update is not None and np.any(update.p > _P_MIN):
        # Cold prefill time of the arrivals per sub-step (the update flushed every cache:
        # all of the prompt is computed).
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_x = np.where(fut[0] > 0, fut[1] / fut[0], 0.0)
        pc = pooled_cost(snap)
        cold_f = (pc[0] * fut[0] + pc[1] * fut[1] + pc[2] * fut[0] * 0.5 * np.square(mean_x)).sum(axis=0)
        arrivals = (tok, k, per_step, cold_f)
        known_mix, got_mix = _update_mixture(update, kq, S, pc, arrivals_by, arrivals, known, got)
        total = known + admit_f
        known, got = known_mix, got_mix
        admit_f = float(got.sum())
        kv = kv * (known + admit_f) / total if total > 0 else known + admit_f
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = np.clip(np.nan_to_num(np.where(per_step > 0, got / per_step, 0.0)), 0.0, 1.0)
    known_var = finite_sum(np.square(x_in) * w_in * (1.0 - w_in)) + finite_sum(np.square(x_rd) * w_rd * (1.0 - w_rd))
    return known, admit_f, kv, AdmitDetail(tuple(float(a) for a in alpha), known_var, tuple(float(x) for x in per_step))


def _update_mixture(
    update: PendingUpdate,
    kq: KnownQueue,
    S: float,
    pc: np.ndarray,
    arrivals_by,
    arrivals: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    known_full: float,
    got_full: np.ndarray,
) -> tuple[float, np.ndarray]:
    """Admissions as a mixture over when a pending weight update lands.

    With probability 1 - sum(p) it does not land in the window (the plain forecast,
    ``known_full`` and ``got_full``). If it lands at u (mid-sub-step k), what finished
    before u is admitted as the queue model says (the tests cut at u, not S); prefill
    then stops for the pause and every cache is flushed, so from u + pause on the
    servers work through, first come first served and cold: the known requests not
    finished by u, the arrivals of earlier sub-steps not admitted by u, the re-prefills
    (queued at u), then the later arrivals. That line is a fluid over all V servers:
    each part is admitted in the share of it that the servers' remaining time
    V (S - u - pause) covers after the parts ahead of it.

    ``arrivals_by(end)`` is the arrivals' admitted share before ``end`` per (server,
    sub-step) row; ``arrivals`` is ``(tokens per row and class, the rows' sub-steps,
    tokens per sub-step, cold service seconds per sub-step)``; ``pc`` the pooled g.
    Returns ``(known, got)``: the known requests' admitted tokens (the re-prefills
    included: they are requests decoding at t) and the arrivals' per sub-step.
    """
    tok, k, per_step, cold_f = arrivals
    x_in, x_rd, V = kq.x_in, kq.x_rd, kq.V
    cold_in = kq.g(kq.i_in, _definite(x_in, 0.0 * x_in))  # cold: the update flushed every cache
    cold_rd = kq.g(kq.i_rd, _definite(x_rd, 0.0 * x_rd))
    p = np.clip(np.nan_to_num(np.asarray(update.p, dtype=float)), 0.0, 1.0)
    stay = max(1.0 - float(p.sum()), 0.0)
    known, got = stay * known_full, stay * np.asarray(got_full, dtype=float)
    pause = max(float(np.nan_to_num(update.pause)), 0.0)
    re = np.clip(np.nan_to_num(np.asarray(update.reprefill, dtype=float)), 0.0, BIG)
    re_svc = pc[0] * re[0] + pc[1] * re[2] + pc[2] * re[3]
    steps = len(p)
    h = S / steps
    tok_step = np.asarray(per_step, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        svc_per_tok = np.where(tok_step > 0, cold_f / tok_step, 0.0)  # cold seconds per arrival token
    c_in, c_rd = kq.edges(S, steps)
    for j in np.flatnonzero(p > _P_MIN):
        u = (j + 0.5) * h
        # Finished before the middle of sub-step j: between the edges on either side.
        w_in, w_rd = 0.5 * (c_in[:, j] + c_in[:, j + 1]), 0.5 * (c_rd[:, j] + c_rd[:, j + 1])
        rows = np.flatnonzero(k <= j)  # later sub-steps' arrivals come after u
        frac = arrivals_by(u, rows)
        got_u = np.bincount(k[rows], weights=(tok[rows] * frac).sum(axis=1), minlength=steps)
        known_u = finite_sum(x_in * w_in) + finite_sum(x_rd * w_rd)
        cap = V * max(S - u - pause, 0.0)  # server-seconds left after the pause
        if cap > 0:
            late = tok_step - got_u  # arrivals not prefilled by u, per sub-step
            # The line, first come first served: (tokens, cold service seconds, where).
            parts = [
                (finite_sum(x_in * (1 - w_in)) + finite_sum(x_rd * (1 - w_rd)),
                 finite_sum(cold_in * (1 - w_in)) + finite_sum(cold_rd * (1 - w_rd)), "known"),
                *((late[i], late[i] * svc_per_tok[i], i) for i in range(j + 1)),
                (re[1], re_svc, "re"),
                *((late[i], late[i] * svc_per_tok[i], i) for i in range(j + 1, steps)),
            ]
            # An update only delays (a pause, cold caches, re-prefills ahead): no part is
            # admitted more than without it, which also keeps an arrival that comes late in
            # the window (the fluid ignores when it arrives) to what the plain model admits.
            room = np.maximum(np.asarray(got_full, dtype=float) - got_u, 0.0)
            for tokens, svc, where in parts:
                if tokens <= 0:
                    continue
                share = 1.0 if svc <= cap else cap / svc
                cap -= min(svc, cap)
                if where == "known":
                    known_u += min(tokens * share, max(known_full - known_u, 0.0))
                elif where == "re":
                    known_u += tokens * share
                else:
                    got_u[where] += min(tokens * share, room[where])
                if cap <= 0:
                    break
        known += p[j] * known_u
        got += p[j] * got_u
    return float(known), got
