"""Tool execution (Appendix B.5): requests of trajectories coming back from a tool.

A trajectory in Tool returns with the tool-duration hazard on its elapsed time and a
prompt of its context plus its EMA of prompt growth per tool turn (alpha 0.1), or plus
the known result size once ``tool.finished`` said it. Beyond the paper's one pass per
horizon (B.1), the next turns of trajectories decoding, queued or in prefill at t come
back too (:func:`next_turn`): their decode ends (or the queue model finishes their
prefill first), they call a tool with their turn's learnt share, unless a pending weight
update cuts the decode, and the tool returns.
"""

from __future__ import annotations

import numpy as np

from ..config import ForecastConfig
from ..frailty import THETA_MAX
from ..guards import BIG, clean
from ..history import History
from ..snapshot import Snapshot
from ..survival import compress
from .common import N_CLASSES, by_step, kernel, rows, scaled_kernels, service_class, spread
from .known_queue import KnownQueue
from .update import ends_normally, not_interrupted


def returns(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray, comes: np.ndarray) -> np.ndarray:
    """Expected next requests of trajectories in Tool: loads (4, N_CLASSES, steps).
    ``comes``: per open call, the probability that it returns at all (a chat's user may
    not write again; ``survival.DurationModel.returning``)."""
    steps = cfg.steps
    if len(snap.tool_elapsed) == 0:
        return np.zeros((4, N_CLASSES, steps))
    result = np.nan_to_num(np.asarray(snap.tool_result, dtype=float), nan=-1.0)
    growth = np.where(result >= 0, result + hist.tool_overhead.value, clean(snap.tool_growth))
    x = np.clip(clean(snap.tool_context) + np.clip(growth, 0.0, None), 0.0, BIG)
    cached = snap.column("tool_cached", "tool_elapsed")
    elapsed = clean(snap.tool_elapsed)
    known = effects(snap, "tool_theta")
    if known is None:
        return spread(hist.tool, elapsed, x, cached, snap, cost, cfg, comes)
    # The group's and the trajectory's own speed (frailty.py): the baseline at the call's
    # effect with the weight rho, the pooled distribution with the rest.
    theta, rho = known
    w = np.tile(open_weight(hist, elapsed, theta, rho), 2)[:, None]
    load = rows(snap, x, cached, comes)
    cls = service_class(load, cost)
    e, th = np.concatenate((elapsed, elapsed)), np.concatenate((theta, theta))
    return (hist.tool_base.weighted_steps(e, load * w, cfg.horizon, cfg.steps, cls, N_CLASSES, theta=th)
            + hist.tool.weighted_steps(e, load * (1.0 - w), cfg.horizon, cfg.steps, cls, N_CLASSES))


def open_weight(hist: History, elapsed: np.ndarray, theta: np.ndarray, rho: np.ndarray) -> np.ndarray:
    """The baseline's weight in the mixture of a call open for ``elapsed``: rho, times its
    survival to that age, over the mixture's (a call open long is likelier the slow
    kind; where both survivals vanish, rho)."""
    at_base = rho * (1.0 - hist.tool_base.cdf(elapsed * np.exp(-theta)))
    at_pool = (1.0 - rho) * (1.0 - hist.tool.cdf(elapsed))
    total = at_base + at_pool
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(np.where(total > 1e-12, at_base / total, rho), 0.0, 1.0)


def turn_kernels(hist: History, horizon: float, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernels of the rest of a turn: a response ending in sub-step k that calls a tool
    is back in sub-step j; and the same from a decode start (decode, then tool). Whether
    it calls one at all is the caller's weight on each request (its turn's tool share,
    :meth:`Snapshot.tool_share`)."""
    back = kernel(hist.tool, horizon, steps)
    return back, kernel(hist.decode, horizon, steps) @ back


def next_turn(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray, kq: KnownQueue, update: np.ndarray,
              returning: float) -> np.ndarray:
    """Requests after a tool call from trajectories now queued, in prefill or decoding.

    Beyond the paper's simplification (B.1: no second pass within a horizon), which
    misses whole turns when decode + tool take less than S: a decoding trajectory finishes
    with Pr(T_dec < e + S | T_dec > e), calls a tool with its turn's tool share, and
    returns after a fresh tool duration. A queued one is prefilled first, when the queue
    model says (``kq``: its place in its server's queue, the pause after a weight update,
    the caches it flushed). ``update``: Pr(a pending weight update lands in sub-step k)
    (:func:`.update.update_steps`): a decode it cuts short calls no tool. ``returning``:
    the share of tool calls that return at all (:meth:`DurationModel.returning`).
    """
    steps, S = cfg.steps, cfg.horizon
    out = np.zeros((4, N_CLASSES, steps))
    extra = max(hist.output.value, 0.0)
    # A new call returns at all with the learnt share; a decode that a weight update cuts
    # short does not end in a tool call (see not_interrupted): the decode ends are
    # weighted before the tool kernel. With the group and trajectory effects
    # (frailty.py) each level of them has its own tool kernel.
    cut = returning * not_interrupted(update, cfg, hist.cut_share)[:, None]
    tool_k = cut * kernel(hist.tool, S, steps)
    pooled = hist.tool_fraction
    if len(snap.decode_elapsed):
        # The current prompt will be cached by then: it is the next request's prefix.
        p = clean(snap.decode_prompt)
        x = p + extra + clean(snap.decode_growth)
        calls = snap.tool_share("decode_turn", "decode_elapsed", pooled) * ends_normally(snap, hist)
        elapsed = clean(snap.decode_elapsed)
        known = effects(snap, "decode_theta")
        if known is None:
            out += spread(hist.decode, elapsed, x, p, snap, cost, cfg, calls) @ tool_k
        else:
            lv = _Levels(hist, S, steps, cut, tool_k, known)
            load = rows(snap, x, p, calls)
            cls = service_class(load, cost)
            by = hist.decode.weighted_steps(np.concatenate((elapsed, elapsed)), load, S, steps,
                                            lv.groups(cls), lv.count * N_CLASSES)
            out += lv.apply(by, lv.kernels)
    since = np.concatenate((np.asarray(snap.ready_since, float), np.asarray(snap.inflight_since, float)))
    if len(since):
        p = np.concatenate((clean(snap.ready_prompt), clean(snap.inflight_prompt)))
        x = p + extra + np.concatenate((clean(snap.ready_growth), clean(snap.inflight_growth)))
        calls = np.concatenate((snap.tool_share("ready_turn", "ready_prompt", pooled), snap.tool_share("inflight_turn", "inflight_prompt", pooled)))
        decode_k = kernel(hist.decode, S, steps)
        pmf_in, pmf_rd = kq.finish_steps(S, steps)
        pmf = np.concatenate((pmf_rd, pmf_in))  # the order of ``since``: ready, then in flight
        some = np.flatnonzero(pmf.sum(axis=1) > 0)  # deep in a queue: not prefilled in the window
        if len(some):
            load = rows(snap, x[some], p[some], calls[some])
            cls = service_class(load, cost)
            known = effects(snap, "ready_theta", "inflight_theta")
            if known is None:
                out += by_step(load, cls, np.concatenate((pmf[some], pmf[some]))) @ (decode_k @ tool_k)
            else:
                # Each request's prefill ends, then its decode, then its tool call on its
                # level's kernel: pushed through per level, then summed per class.
                lv = _Levels(hist, S, steps, cut, tool_k, (known[0][some], known[1][some]))
                back = lv.through(pmf[some], decode_k[None, :, :] @ lv.kernels)
                out += by_step(load, cls, np.concatenate((back, back)))
    return clean(out)


def effects(snap: Snapshot, *names: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(theta, rho)``: the group and trajectory effects (frailty.py) of the rows of
    these columns, one after the other, and the share of the effects' variance each
    estimate resolved; None when the snapshot does not carry them (the pooled duration
    model then applies)."""
    if not snap.effects:
        return None
    cols = [np.asarray(getattr(snap, name), dtype=float).reshape(-1, 2) for name in names]
    both = np.concatenate(cols) if cols else np.zeros((0, 2))
    theta = np.clip(np.nan_to_num(both[:, 0]), -THETA_MAX, THETA_MAX)
    return theta, np.clip(np.nan_to_num(both[:, 1], nan=0.0, posinf=0.0), 0.0, 1.0)


class _Levels:
    """Rows grouped by their group and trajectory effect (frailty.py), each group with
    its tool kernel: rho times the baseline's on a time scale of exp(theta) plus 1 - rho
    times the pooled distribution's, theta quantised to ``KERNEL_STEP`` and rho to
    ``RHO_STEP``."""

    KERNEL_STEP = 0.1
    """Log units (CHOICE: a 10% step in time scale; a kernel is a (steps, steps) matrix,
    and a trajectory's next call is a fresh draw whose spread, sigma_W, is ten times it)."""
    RHO_STEP = 0.1
    """The mixture's weight in steps of a tenth (CHOICE: the share resolved moves by more
    than that from one call to the next early in a trajectory, and little later)."""

    def __init__(self, hist: History, horizon: float, steps: int, cut: np.ndarray, pooled: np.ndarray,
                 known: tuple[np.ndarray, np.ndarray]) -> None:
        theta, rho = known
        half = int(round(THETA_MAX / self.KERNEL_STEP))
        per = int(round(1 / self.RHO_STEP)) + 1
        q = np.clip(np.rint(theta / self.KERNEL_STEP), -half, half).astype(np.int64) + half
        r = np.rint(np.clip(rho, 0.0, 1.0) / self.RHO_STEP).astype(np.int64)
        used, self.level = compress(q * per + r, (2 * half + 1) * per)
        q_used, r_used = np.divmod(used, per)
        if len(used):
            ks, at = np.unique(q_used, return_inverse=True)
            scaled = cut * scaled_kernels(hist.tool_base, (ks - half) * self.KERNEL_STEP, horizon, steps)
            share = (r_used * self.RHO_STEP)[:, None, None]
            self.kernels = share * scaled[at] + (1.0 - share) * pooled[None]
        else:
            self.kernels = pooled[None]
        self.count = len(self.kernels)

    def groups(self, cls: np.ndarray) -> np.ndarray:
        """The (level, service class) group of each load row (a request's two cache
        outcomes, one after the other)."""
        level = np.concatenate((self.level, self.level))
        return level * N_CLASSES + cls

    def through(self, pmf: np.ndarray, kernels: np.ndarray) -> np.ndarray:
        """``(rows, steps)``: each row's sub-step weights through its level's kernel."""
        out = np.empty_like(pmf)
        order = np.argsort(self.level.astype(np.int16), kind="stable")  # at most 451 levels: a radix sort
        lv = self.level[order]
        edges = np.flatnonzero(np.concatenate(([True], lv[1:] != lv[:-1], [True])))
        for a, b in zip(edges[:-1], edges[1:]):
            rows_ = order[a:b]
            out[rows_] = pmf[rows_] @ kernels[lv[a]]
        return out

    def apply(self, by: np.ndarray, kernels: np.ndarray) -> np.ndarray:
        """``(4, N_CLASSES, steps)``: loads per (level, class) and sub-step, ``(4, levels x
        N_CLASSES, steps)``, each level through its ``(steps, steps)`` kernel."""
        by = by.reshape(by.shape[0], self.count, N_CLASSES, by.shape[-1])
        return np.einsum("klcs,lst->kct", by, kernels)


def term(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray, kq: KnownQueue, update: np.ndarray) -> np.ndarray:
    """The tool term: returns of trajectories in Tool, and the next turns of those
    decoding, queued or in prefill: loads ``(4, N_CLASSES, steps)``."""
    returning, comes = hist.tool.returning(clean(snap.tool_elapsed), now=snap.t)
    return returns(snap, hist, cfg, cost, comes) + next_turn(snap, hist, cfg, cost, kq, update, returning)
