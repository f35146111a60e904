"""The forecaster's input: a columnar snapshot of the rollout at time t (Appendix B.1).

One numpy array per field and per source, so a forecast over 100k live trajectories is a
handful of vectorised operations. Times inside a snapshot are absolute event times;
elapsed times are ``t - entered``. A snapshot is built by
:meth:`prorsa_forecaster.state.LiveState.snapshot` (from events, or tracker transitions),
or by hand in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

# Start-up modes of a launched trajectory whose first request has not yet been queued.
START_PREWARM = 0
START_COLD = 1
START_DISPATCHED = 2  # dispatched, no sandbox event (yet, or ever)
START_READY = 3  # sandbox ready, first request not queued yet
START_MODES = 4

_F = np.float64
_I = np.int64


def _f(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=_F)


def _i(n: int = 0) -> np.ndarray:
    return np.zeros(n, dtype=_I)


def size_bin(size) -> np.ndarray:
    """The log2 bin of each size: bin ``b`` holds [2^b, 2^(b+1)) (sizes below 1, and
    NaN, fall in bin 0)."""
    s = np.nan_to_num(np.asarray(size, dtype=float), nan=1.0, posinf=2.0**62)
    return np.clip(np.floor(np.log2(np.maximum(s, 1.0))), 0, 62).astype(np.int64)


TURN_BINS = 19


def turn_bin(turn) -> np.ndarray:
    """The bin of each turn index: turns 0-15 have one bin each, then [16, 32), [32, 64)
    and 64 on (negative and NaN turns fall in bin 0)."""
    k = np.maximum(np.nan_to_num(np.asarray(turn, dtype=float), nan=0.0, posinf=1e9), 0.0)
    octave = 16 + np.floor(np.log2(np.maximum(k, 16.0) / 16.0))
    return np.clip(np.where(k < 16, np.floor(k), octave), 0, TURN_BINS - 1).astype(np.int64)


@dataclass(frozen=True)
class RunInfo:
    """What ``run.started`` says about the sampler (defaults: async, replace)."""

    mode: Literal["sync", "async"] = "async"
    batch_size: int | None = None
    group_size: int = 1
    injection: Literal["replace", "group"] = "replace"
    max_staleness: int | None = None
    prompt_tokens_mean: int | None = None


@dataclass(frozen=True)
class Snapshot:
    """Everything the pure core needs at window start ``t``.

    Per source (arrays of equal length within a source):

    * reward phase: ``reward_elapsed``; ``reward_cohort`` is the injection cohort a
      trajectory belongs to (its GRPO group under ``injection="group"``, -1 otherwise).
    * start-up (launched, first request not queued): ``start_elapsed``, ``start_mode``
      (START_*), ``start_prompt`` (the dispatched prompt length).
    * ready queue: ``ready_prompt``, ``ready_since`` (queue entry time), ``ready_instance``
      (prefill instance index, -1 when unknown).
    * tool execution: ``tool_elapsed``, ``tool_context`` (last prompt + its output),
      ``tool_growth`` (the trajectory's EMA of prompt growth per tool turn),
      ``tool_result`` (result tokens when the tool already returned, else -1).
    * in-flight prefill: ``inflight_prompt``, ``inflight_started``, ``inflight_instance``,
      ``inflight_since`` (queue entry time).
    * ``*_growth``: each queued / in-flight / decoding trajectory's EMA of prompt growth
      per tool turn (for the request after its next tool call).
    * decode: ``decode_elapsed``, ``decode_prompt`` per decoding trajectory;
      ``decode_kv_now`` (K^D, tokens).
    * prefill instances: ``instance_overhead``, ``instance_per_token`` and
      ``instance_per_pair`` (g = a + b n + d n ctx for n computed tokens of mean attention
      context ctx, see :class:`~prorsa_forecaster.prefill_queue.PrefillTimeModel`), and
      ``instance_servers`` (data-parallel prefill queues of the instance); at least one
      entry (a pooled instance when none is known).
    * ``*_cached``: the prefix of each queued / in-flight request, and of the next
      request of each trajectory in Tool, that a prefix-cache hit would find (its
      trajectory's previous prompt, if no weight update flushed it since; else 0);
      ``cache_hit`` is the probability of that hit and ``cache_cold`` the share of any
      prompt found cached regardless (prefill computes only the rest).
    * ``prefill_pause``: seconds after t before prefill resumes (a weight-sync pause).

    Optional columns (``*_cached``, ``instance_per_pair``, ``instance_servers``) may be
    left empty: they then mean zero cached tokens, no attention term, one queue.
    * cohorts (a sync batch, or GRPO groups under ``injection="group"``):
      ``cohort_pending[c]`` = live members of cohort ``c`` NOT in the reward phase; a
      cohort launches its successor only once all its members have finished.
    """

    t: float
    run: RunInfo = field(default_factory=RunInfo)
    reward_elapsed: np.ndarray = field(default_factory=_f)
    reward_cohort: np.ndarray = field(default_factory=_i)
    start_elapsed: np.ndarray = field(default_factory=_f)
    start_mode: np.ndarray = field(default_factory=_i)
    start_prompt: np.ndarray = field(default_factory=_f)
    ready_prompt: np.ndarray = field(default_factory=_f)
    ready_since: np.ndarray = field(default_factory=_f)
    ready_instance: np.ndarray = field(default_factory=_i)
    tool_elapsed: np.ndarray = field(default_factory=_f)
    tool_context: np.ndarray = field(default_factory=_f)
    tool_growth: np.ndarray = field(default_factory=_f)
    tool_result: np.ndarray = field(default_factory=_f)
    inflight_prompt: np.ndarray = field(default_factory=_f)
    inflight_started: np.ndarray = field(default_factory=_f)
    inflight_instance: np.ndarray = field(default_factory=_i)
    inflight_since: np.ndarray = field(default_factory=_f)
    ready_growth: np.ndarray = field(default_factory=_f)
    inflight_growth: np.ndarray = field(default_factory=_f)
    decode_elapsed: np.ndarray = field(default_factory=_f)
    decode_prompt: np.ndarray = field(default_factory=_f)
    decode_growth: np.ndarray = field(default_factory=_f)
    cohort_pending: np.ndarray = field(default_factory=_f)
    aborted_elapsed: np.ndarray = field(default_factory=_f)
    """Trajectories whose request was aborted mid-decode (a weight update's pause, a
    drain) and not yet re-queued: seconds since the abort; ``aborted_context`` is the
    prompt plus the output made before it (what a re-queued request re-prefills), and
    ``aborted_cached`` (optional) the prefix a cache hit would find."""
    aborted_context: np.ndarray = field(default_factory=_f)
    aborted_cached: np.ndarray = field(default_factory=_f)
    decode_kv_now: float = 0.0
    update_elapsed: float = float("nan")
    """Seconds since the pending weight update was triggered (one batch of admitted
    samples since the last update, async only); NaN when none is pending."""
    since_update: float = float("nan")
    """Seconds since the last weight update landed (``policy.updated``); NaN before any."""
    decode_live: int = 0
    instance_overhead: np.ndarray = field(default_factory=lambda: np.array([0.0165]))
    instance_per_token: np.ndarray = field(default_factory=lambda: np.array([1.86e-5]))
    live: int = 0
    ready_cached: np.ndarray = field(default_factory=_f)
    inflight_cached: np.ndarray = field(default_factory=_f)
    tool_cached: np.ndarray = field(default_factory=_f)
    ready_unrouted: np.ndarray = field(default_factory=_f)
    """1.0 for a queued request whose engine is not known yet but whose prefix is cached
    on a known engine: it hits like a future request (``cache_hit_unrouted``)."""
    inflight_unrouted: np.ndarray = field(default_factory=_f)
    instance_per_pair: np.ndarray = field(default_factory=_f)
    instance_servers: np.ndarray = field(default_factory=_i)
    prefill_pause: float = 0.0
    cache_hit: float = 1.0
    cache_hit_unrouted: float = float("nan")
    """Hit probability of a request not routed yet (a future arrival): ``cache_hit`` times
    the share of requests routed back to the engine that caches them; NaN: ``cache_hit``."""
    cache_same_table: np.ndarray = field(default_factory=_f)
    """Optional: the share routed back by the size of the cached prefix, per log2 bin
    (:func:`size_bin`); a future request then hits with ``cache_hit`` times its bin's
    share instead of ``cache_hit_unrouted``. Empty: one share for every size."""
    decode_turn: np.ndarray = field(default_factory=_i)
    """Optional: the turn index (``request.queued.turn``) of each decoding trajectory's
    request; likewise ``ready_turn``, ``inflight_turn`` and ``tool_turn`` (the turn
    whose response called the tool)."""
    ready_turn: np.ndarray = field(default_factory=_i)
    inflight_turn: np.ndarray = field(default_factory=_i)
    tool_turn: np.ndarray = field(default_factory=_i)
    effects: bool = False
    """Whether tool durations carry group and trajectory effects
    (:mod:`~prorsa_forecaster.frailty`): ``tool_theta`` then holds, per open call, its
    estimated effect theta (log units) and rho, the share of the effects' variance the
    estimate has resolved, ``(n, 2)``: the call follows ``History.tool_base`` on a time
    scale of exp(theta) with weight rho and ``History.tool`` (the pooled distribution)
    with the rest (``terms/tool.py``: :func:`open_weight` for an open call, ``_Levels`` for a next call). ``decode_theta``, ``ready_theta``
    and ``inflight_theta`` are those of the trajectories decoding, queued and in
    prefill, whose next call they shape. False: every call follows ``History.tool``."""
    tool_theta: np.ndarray = field(default_factory=_f)
    decode_theta: np.ndarray = field(default_factory=_f)
    ready_theta: np.ndarray = field(default_factory=_f)
    inflight_theta: np.ndarray = field(default_factory=_f)
    ready_rank: np.ndarray = field(default_factory=_i)
    """Optional: the attention data-parallel rank of its instance that each queued
    request was placed on (``request.queued.dp_rank``), -1 where not said; likewise
    ``inflight_rank``. Empty: every request is dealt over the ranks in arrival order."""
    inflight_rank: np.ndarray = field(default_factory=_i)
    tool_turn_table: np.ndarray = field(default_factory=_f)
    """Optional: the share of responses that call a tool per turn bin
    (:func:`turn_bin`). Empty, or a source's turn column
    empty: the pooled share (``History.tool_fraction``) for every turn."""
    cache_cold: float = 0.0
    next_batch_elapsed: float = float("nan")
    """Sync runs: seconds since the policy update after which the next batch is due
    (NaN when none is due: a batch is out, or the run is async)."""

    def unrouted_hit(self, prefix) -> np.ndarray:
        """Hit probability of each request not routed yet whose cached prefix would be
        ``prefix`` tokens (see ``cache_hit_unrouted`` and ``cache_same_table``)."""
        p = np.atleast_1d(np.asarray(prefix, dtype=float))
        table = np.asarray(self.cache_same_table, dtype=float)
        if np.isnan(self.cache_hit_unrouted):
            return np.full(p.shape, self.cache_hit)
        if len(table) == 0:
            return np.full(p.shape, self.cache_hit_unrouted)
        return self.cache_hit * table[np.minimum(size_bin(p), len(table) - 1)]

    def tool_share(self, turn_column: str, like: str, pooled: float, later: int = 0) -> np.ndarray:
        """Per row of source ``like``: the probability that the response of its turn
        (``turn_column``, plus ``later``) calls a tool, from ``tool_turn_table``;
        ``pooled`` where either is empty."""
        n = len(getattr(self, like))
        turns = np.asarray(getattr(self, turn_column))
        table = np.asarray(self.tool_turn_table, dtype=float)
        if len(table) == 0 or len(turns) != n:
            return np.full(n, float(pooled))
        share = table[np.minimum(turn_bin(turns + later), len(table) - 1)]
        return np.clip(np.nan_to_num(share, nan=pooled), 0.0, 1.0)

    def column(self, name: str, like: str, fill: float = 0.0) -> np.ndarray:
        """An optional column, or ``fill`` repeated to the length of ``like`` when empty."""
        v = getattr(self, name)
        n = len(getattr(self, like))
        return np.asarray(v, dtype=float) if len(v) == n else np.full(n, fill)

    def __post_init__(self) -> None:
        groups = {
            "reward": ("reward_elapsed", "reward_cohort"),
            "start": ("start_elapsed", "start_mode", "start_prompt"),
            "ready": ("ready_prompt", "ready_since", "ready_instance", "ready_growth"),
            "ready (optional)": ("ready_prompt", "ready_cached"),
            "inflight (optional)": ("inflight_prompt", "inflight_cached"),
            "ready (unrouted)": ("ready_prompt", "ready_unrouted"),
            "inflight (unrouted)": ("inflight_prompt", "inflight_unrouted"),
            "tool (optional)": ("tool_elapsed", "tool_cached"),
            "aborted": ("aborted_elapsed", "aborted_context"),
            "aborted (optional)": ("aborted_elapsed", "aborted_cached"),
            "instances (optional)": ("instance_overhead", "instance_per_pair"),
            "instances (servers)": ("instance_overhead", "instance_servers"),
            "decode": ("decode_elapsed", "decode_prompt", "decode_growth"),
            "decode (turn)": ("decode_elapsed", "decode_turn"),
            "ready (turn)": ("ready_prompt", "ready_turn"),
            "inflight (turn)": ("inflight_prompt", "inflight_turn"),
            "tool (turn)": ("tool_elapsed", "tool_turn"),
            "tool (frailty)": ("tool_elapsed", "tool_theta"),
            "ready (rank)": ("ready_prompt", "ready_rank"),
            "inflight (rank)": ("inflight_prompt", "inflight_rank"),
            "tool": ("tool_elapsed", "tool_context", "tool_growth", "tool_result"),
            "inflight": ("inflight_prompt", "inflight_started", "inflight_instance", "inflight_since", "inflight_growth"),
            "instances": ("instance_overhead", "instance_per_token"),
        }
        for source, names in groups.items():
            sizes = {len(getattr(self, n)) for n in names}
            if "(" in source and len(getattr(self, names[1])) == 0:
                continue  # an optional column left empty
            if len(sizes) > 1:
                raise ValueError(f"snapshot: the {source} arrays differ in length: {sizes}")
        if self.effects:
            for source, like in (("tool", "tool_elapsed"), ("decode", "decode_elapsed"), ("ready", "ready_prompt"),
                                 ("inflight", "inflight_prompt")):
                if len(getattr(self, f"{source}_theta")) != len(getattr(self, like)):
                    raise ValueError(f"snapshot: {source}_theta differs in length from {like}")
        if len(self.instance_overhead) == 0:
            raise ValueError("snapshot: at least one prefill instance (or the pool) is needed")
        if not np.isfinite(self.t):
            raise ValueError(f"snapshot: t must be finite, got {self.t!r}")
