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
from ..frailty import THETA_MAX, Scaled, nodes
from ..guards import BIG, clean
from ..history import History
from ..snapshot import Snapshot
from .common import N_CLASSES, by_step, kernel, rows, service_class, spread
from .known_queue import KnownQueue
from .update import not_interrupted


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
    if known is not None:
        # The group's and the trajectory's own speed (frailty.py), each call over the
        # error of its effect's estimate.
        r, theta, w = nodes(*known)
        return spread(hist.tool_base, elapsed[r], x[r], cached[r], snap, cost, cfg, np.asarray(comes)[r] * w, theta=theta)
    return spread(hist.tool, elapsed, x, cached, snap, cost, cfg, comes)


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
    cut = returning * not_interrupted(update, cfg)[:, None]
    levels = _Levels(hist, S, steps, cut)
    pooled = hist.tool_fraction
    if len(snap.decode_elapsed):
        # The current prompt will be cached by then: it is the next request's prefix.
        p = clean(snap.decode_prompt)
        x = p + extra + clean(snap.decode_growth)
        calls = snap.tool_share("decode_turn", "decode_elapsed", pooled)
        elapsed = clean(snap.decode_elapsed)
        r, theta, w = levels.rows(effects(snap, "decode_theta"), len(elapsed))
        for sel, tool_k in levels.split(theta, np.ones(len(r), bool)):
            rs = r[sel]
            out += spread(hist.decode, elapsed[rs], x[rs], p[rs], snap, cost, cfg, calls[rs] * w[sel]) @ tool_k
    since = np.concatenate((np.asarray(snap.ready_since, float), np.asarray(snap.inflight_since, float)))
    if len(since):
        p = np.concatenate((clean(snap.ready_prompt), clean(snap.inflight_prompt)))
        x = p + extra + np.concatenate((clean(snap.ready_growth), clean(snap.inflight_growth)))
        calls = np.concatenate((snap.tool_share("ready_turn", "ready_prompt", pooled), snap.tool_share("inflight_turn", "inflight_prompt", pooled)))
        r, theta, w = levels.rows(effects(snap, "ready_theta", "inflight_theta"), len(since))
        decode_k = kernel(hist.decode, S, steps)
        pmf_in, pmf_rd = kq.finish_steps(S, steps)
        pmf = np.concatenate((pmf_rd, pmf_in))[r]  # the order of ``since``: ready, then in flight
        some = pmf.sum(axis=1) > 0  # deep in a queue: not prefilled in the window
        for sel, tool_k in levels.split(theta, some):
            rs = r[sel]
            load = rows(snap, x[rs], p[rs], calls[rs] * w[sel])
            out += by_step(load, service_class(load, cost), np.concatenate((pmf[sel], pmf[sel]))) @ (decode_k @ tool_k)
    return clean(out)


def effects(snap: Snapshot, *names: str) -> tuple[np.ndarray, np.ndarray] | None:
    """``(theta, variance)``: the group and trajectory effects (frailty.py) of the rows
    of these columns, one after the other, and the variance of their error; None when
    the snapshot does not carry them (the pooled duration model then applies)."""
    if not snap.effects:
        return None
    cols = [np.asarray(getattr(snap, name), dtype=float).reshape(-1, 2) for name in names]
    both = np.concatenate(cols) if cols else np.zeros((0, 2))
    theta = np.clip(np.nan_to_num(both[:, 0]), -THETA_MAX, THETA_MAX)
    return theta, np.clip(np.nan_to_num(both[:, 1], nan=0.0, posinf=0.0), 0.0, THETA_MAX ** 2)


class _Levels:
    """The tool kernel per level of the group and trajectory effect (frailty.py): the
    pooled duration model's where the snapshot carries no effects, else the baseline's on
    a time scale of exp(theta), theta quantised to ``KERNEL_STEP``."""

    KERNEL_STEP = 0.1
    """Log units (CHOICE: a 10% step in time scale; a kernel is a (steps, steps) matrix,
    and a trajectory's next call is a fresh draw whose spread, sigma_W, is ten times it)."""

    def __init__(self, hist: History, horizon: float, steps: int, cut: np.ndarray) -> None:
        self.hist, self.horizon, self.steps, self.cut = hist, horizon, steps, cut
        self._k: dict[int, np.ndarray] = {}

    def kernel(self, level: int | None) -> np.ndarray:
        if level not in self._k:
            if level is None:
                model = self.hist.tool
            else:
                model = Scaled(self.hist.tool_base, level * self.KERNEL_STEP)
            self._k[level] = self.cut * kernel(model, self.horizon, self.steps)
        return self._k[level]

    @staticmethod
    def rows(effects: tuple[np.ndarray, np.ndarray] | None, n: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        """``(row, theta, weight)``: the ``n`` rows over their effects' error
        (:func:`~prorsa_forecaster.frailty.nodes`), or each once with no theta."""
        if effects is None:
            return np.arange(n), None, np.ones(n)
        return nodes(*effects)

    def split(self, theta: np.ndarray | None, among: np.ndarray):
        """``(rows, tool kernel)`` per level of ``theta`` over the rows ``among`` (all of
        them at the pooled model's when ``theta`` is None: no effects)."""
        if not among.any():
            return
        if theta is None:
            yield among, self.kernel(None)
            return
        half = int(round(THETA_MAX / self.KERNEL_STEP))
        q = np.clip(np.rint(np.nan_to_num(theta) / self.KERNEL_STEP), -half, half).astype(np.int64)
        for level in np.unique(q[among]):
            yield among & (q == level), self.kernel(int(level))


def term(snap: Snapshot, hist: History, cfg: ForecastConfig, cost: np.ndarray, kq: KnownQueue, update: np.ndarray) -> np.ndarray:
    """The tool term: returns of trajectories in Tool, and the next turns of those
    decoding, queued or in prefill: loads ``(4, N_CLASSES, steps)``."""
    returning, comes = hist.tool.returning(clean(snap.tool_elapsed), now=snap.t)
    return returns(snap, hist, cfg, cost, comes) + next_turn(snap, hist, cfg, cost, kq, update, returning)
