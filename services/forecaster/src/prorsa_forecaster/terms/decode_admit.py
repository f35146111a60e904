"""Decode admissions (Appendix B.7): A-hat^D and K-hat^D by prefill queue simulation.

Every in-flight and queued request (:mod:`.known_queue`) and the predicted arrivals of the
window go through the prefill instances' FIFO queues, ``b_j = max(u_j, v_m(j)) + g(x_j)``;
the prompt tokens of the requests whose completion b_j falls before t+S are A^D, and
kappa^D of them is K^D.

* Predicted arrivals are aggregated per sub-step and per service-time class, and spread
  evenly over all servers. Their work queues like a fluid on each server (which gives
  when the server gets to them), but each request then takes its OWN prefill time: a
  50k-token cold prompt arriving at an idle instance still takes seconds on its rank.
  Their admitted share is averaged over the spread of when each server gets to them (the
  cache flips of everything queued on it: Gauss-Hermite nodes).
* g depends on the computed tokens (prompt minus the expected cached prefix) and on the
  attention context they see (:class:`.prefill_queue.PrefillTimeModel`).
* A weight update that may land inside the window makes the admissions a mixture over
  when it lands (:class:`PendingUpdate`, :func:`_update_mixture`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import ForecastConfig
from ..guards import BIG, clean, finite_sum
from ..snapshot import Snapshot
from .common import N_CLASSES, definite, pooled_cost
from .known_queue import KnownQueue, known_queue
from .prefill_queue import simulate_queues


GH_NODES = 8  # Gauss-Hermite nodes of the arrivals' average over the queue's spread


_P_MIN = 1e-4  # a sub-step less likely than this to see the weight update is left out


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

    When it lands (at u) the decoding requests it aborts are re-queued, prefill stops for
    the weight sync (``pause`` seconds) and the caches it flushes are lost: what was not
    prefilled by u starts again at u + pause, behind nothing, cold where its cache was
    flushed, and the re-prefills queue behind it."""

    p: np.ndarray
    """Pr(the update lands in sub-step k), k = 0..steps-1 (sums to at most 1)."""
    pause: float
    """Seconds from the update until prefill resumes (learnt)."""
    reprefill: np.ndarray
    """``(4,)`` the re-prefills' loads if it lands (count, prompt, computed, pairs; cold)."""
    flush: float = 1.0
    """The share of the prefix caches it flushes: 1 for a framework that aborts the
    requests in flight, whose engines are then empty and flushed; 0 where the engines
    pause in place or retract them (SGLang refuses to flush an engine that holds a
    request; ``History.update_flushes``)."""


def decode_admissions(snap: Snapshot, cfg: ForecastConfig, future: np.ndarray) -> tuple[float, float]:
    """A^D and K^D: see :func:`decode_admissions_split`."""
    known, arriving, kv, _ = decode_admissions_split(snap, cfg, future)
    return known + arriving, kv


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
    kq = known if known is not None else known_queue(snap)
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
    if len(x_rd):
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
        # Prefill time of the arrivals per sub-step after the update: cold where it
        # flushed the cache (all of the prompt is computed), else as forecast.
        with np.errstate(divide="ignore", invalid="ignore"):
            mean_x = np.where(fut[0] > 0, fut[1] / fut[0], 0.0)
            mean_c = np.where(fut[0] > 0, fut[2] / fut[0], 0.0)
            mean_p = np.where(fut[0] > 0, fut[3] / fut[0], 0.0)
        pc = pooled_cost(snap)
        f = _share(update.flush)
        one = pc[0] + pc[1] * mean_x + pc[2] * 0.5 * np.square(mean_x)  # a request's cold seconds, per class
        one = f * one + (1.0 - f) * (pc[0] + pc[1] * mean_c + pc[2] * mean_p)
        svc_after = (fut[0] * one).sum(axis=0)
        svc_sq_after = (fut[0] * np.square(one)).sum(axis=0)
        arrivals = (tok, k, per_step, svc_after, svc_sq_after)
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
    then stops for the pause and the share ``update.flush`` of the caches is flushed, so
    from u + pause on the servers work through, first come first served and cold where
    flushed: the known requests not
    finished by u, the arrivals of earlier sub-steps not admitted by u, the re-prefills
    (queued at u), then the later arrivals. That line is a fluid over all V servers:
    each part is admitted in the share of it that the servers' remaining time
    V (S - u - pause) covers after the parts ahead of it, less the requests the servers
    are still prefilling at S. A request is admitted only when its prefill ends, so when
    the line outlasts the window every server holds one request part-done, whose done
    part the fluid would count: the request in service at a random time is
    length-biased, and it has had E[s^2] / (2 E[s]) seconds on average, s the service
    times of its part of the line (renewal theory). That much of each server's time is
    taken off before the line is admitted (:func:`_in_service`).

    ``arrivals_by(end)`` is the arrivals' admitted share before ``end`` per (server,
    sub-step) row; ``arrivals`` is ``(tokens per row and class, the rows' sub-steps,
    tokens per sub-step, service seconds after the update per sub-step, the sum of the
    squared such seconds of its requests per sub-step)``; ``pc`` the pooled g.
    Returns ``(known, got)``: the known requests' admitted tokens (the re-prefills
    included: they are requests decoding at t) and the arrivals' per sub-step.
    """
    tok, k, per_step, svc_after, svc_sq_after = arrivals
    x_in, x_rd, V = kq.x_in, kq.x_rd, kq.V
    # The known requests' service seconds after the update: cold where it flushed the
    # cache; else the expected prefill time, over the request's cache outcomes.
    f = _share(update.flush)
    hit_rd = np.broadcast_to(np.asarray(kq.hit_rd, dtype=float), x_rd.shape)
    svc_in = (f * kq.g(kq.i_in, definite(x_in, 0.0 * x_in))
               + (1.0 - f) * (kq.p_in * kq.gh_in + (1.0 - kq.p_in) * kq.gm_in))
    svc_rd = f * kq.g(kq.i_rd, definite(x_rd, 0.0 * x_rd)) + (1.0 - f) * (hit_rd * kq.gh_rd + (1.0 - hit_rd) * kq.gm_rd)
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
        svc_per_tok = np.where(tok_step > 0, svc_after / tok_step, 0.0)  # seconds per arrival token after it
        sq_per_tok = np.where(tok_step > 0, np.asarray(svc_sq_after, dtype=float) / tok_step, 0.0)  # squared, likewise
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
            # The line, first come first served: (tokens, service seconds, where, the
            # sum of its requests' squared service seconds, for the ones in service at S).
            parts = [
                (finite_sum(x_in * (1 - w_in)) + finite_sum(x_rd * (1 - w_rd)),
                 finite_sum(svc_in * (1 - w_in)) + finite_sum(svc_rd * (1 - w_rd)), "known",
                 finite_sum(np.square(svc_in) * (1 - w_in)) + finite_sum(np.square(svc_rd) * (1 - w_rd))),
                *((late[i], late[i] * svc_per_tok[i], i, late[i] * sq_per_tok[i]) for i in range(j + 1)),
                (re[1], re_svc, "re", re_svc * re_svc / re[0] if re[0] > 0 else 0.0),
                *((late[i], late[i] * svc_per_tok[i], i, late[i] * sq_per_tok[i]) for i in range(j + 1, steps)),
            ]
            cap = max(cap - V * _in_service(parts, cap, V), 0.0)
            # An update only delays (a pause, cold caches, re-prefills ahead): no part is
            # admitted more than without it, which also keeps an arrival that comes late in
            # the window (the fluid ignores when it arrives) to what the plain model admits.
            room = np.maximum(np.asarray(got_full, dtype=float) - got_u, 0.0)
            for tokens, svc, where, _ in parts:
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


def _share(x: float) -> float:
    return float(np.clip(np.nan_to_num(x, nan=1.0), 0.0, 1.0))


def _in_service(parts, cap: float, V: int) -> float:
    """Seconds each of the ``V`` servers has had, at S, on the request it is still
    prefilling: 0 when the line ``parts`` (``(tokens, service seconds, where, the sum of
    its requests' squared service seconds)`` each, first come first served) ends within
    ``cap`` server-seconds; else E[s^2] / (2 E[s]) over the requests of the part the line
    is in at S (the length-biased request in service, half done on average), and at most
    the time each server has left when the line reaches that part."""
    left = cap
    for tokens, svc, _, sq in parts:
        if tokens <= 0 or svc <= 0:
            continue
        if svc < left:
            left -= svc
            continue
        return min(0.5 * sq / svc if sq > 0 else 0.0, left / max(V, 1))
    return 0.0
