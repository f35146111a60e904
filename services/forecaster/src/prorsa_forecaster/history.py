"""What the forecaster has learnt so far: duration statistics, rates, prompt sizes, and
the corrections learnt from closed windows.

The pure core (:func:`prorsa_forecaster.core.forecast`) only reads a :class:`History`;
:class:`~prorsa_forecaster.state.LiveState` writes it as events arrive, and the window
loop hands each closed window to ``correction.learn`` (terms/correction.py).
"""

from __future__ import annotations

import math

import numpy as np

from .config import ForecastConfig
from .terms.correction import Correction
from .terms.prefill_queue import PrefillTimeModel
from .snapshot import START_COLD, START_DISPATCHED, START_MODES, START_PREWARM, START_READY, TURN_BINS, size_bin, turn_bin
from .frailty import Frailty
from .survival import DurationModel


class RunningMean:
    """Exponentially weighted mean with a prior value (answers ``prior`` until observed)."""

    __slots__ = ("value", "alpha", "n")

    def __init__(self, prior: float, alpha: float = 0.02) -> None:
        self.value = float(prior)
        self.alpha = alpha
        self.n = 0

    def observe(self, x: float) -> None:
        if not math.isfinite(x):
            return
        self.n += 1
        # The first observations count fully (1/n), later ones with the EMA's alpha.
        a = max(self.alpha, 1.0 / self.n)
        self.value += a * (float(x) - self.value)


class Ratio:
    """A decayed ratio of sums, sum(num) / sum(den), starting from ``prior`` worth
    ``prior_den`` of denominator (e.g. cached / cacheable prompt tokens)."""

    __slots__ = ("_num", "_den", "_keep", "n")

    def __init__(self, prior: float, prior_den: float, half_life: float = 2000.0) -> None:
        self._num = prior * prior_den
        self._den = prior_den
        self._keep = 0.5 ** (1.0 / half_life)
        self.n = 0

    def observe(self, num: float, den: float) -> None:
        if not (math.isfinite(num) and math.isfinite(den) and den > 0 and num >= 0):
            return
        self._num = self._num * self._keep + min(num, den)
        self._den = self._den * self._keep + den
        self.n += 1

    @property
    def value(self) -> float:
        return self._num / self._den if self._den > 0 else 0.0

    @property
    def sums(self) -> tuple[float, float]:
        """The decayed ``(sum num, sum den)``, prior included."""
        return self._num, self._den


class SizeBinnedRatio:
    """A :class:`Ratio` per log2 bin of a size (bin ``b`` holds sizes in [2^b, 2^(b+1))),
    each shrunk towards the pooled ratio by ``pseudo`` observations' worth of it:
    ``(num_b + pseudo * pooled) / (den_b + pseudo)``. A bin seen rarely answers the
    pooled value; a bin seen often, its own."""

    BINS = 40  # 2^40 tokens: beyond any context

    __slots__ = ("pooled", "_bins", "pseudo")

    def __init__(self, pooled: Ratio | None, pseudo: float = 20.0, half_life: float = 2000.0) -> None:
        self.pooled = pooled
        self.pseudo = float(pseudo)
        self._bins = [Ratio(0.0, 0.0, half_life) for _ in range(self.BINS)]

    @staticmethod
    def bin_of(size) -> np.ndarray:
        return size_bin(size)

    def observe(self, size: float, num: float, den: float) -> None:
        """One observation of the ratio (and of the pooled one, if it has one) at ``size``."""
        if self.pooled is not None:
            self.pooled.observe(num, den)
        if math.isfinite(size):
            self._bins[min(int(self.bin_of(size)), self.BINS - 1)].observe(num, den)

    def table(self, pooled: float | None = None) -> np.ndarray:
        """The shrunk ratio of every bin (towards ``pooled``, default the pooled ratio)."""
        if pooled is None and self.pooled is None:
            raise ValueError("table(): no pooled ratio to shrink towards")
        p = self.pooled.value if pooled is None else float(pooled)
        if not math.isfinite(self.pseudo):
            return np.full(self.BINS, p)
        num, den = np.array([b.sums for b in self._bins]).T
        with np.errstate(invalid="ignore", divide="ignore"):
            out = (num + self.pseudo * p) / (den + self.pseudo)
        return np.where(den + self.pseudo > 0, out, p)


class TurnBinnedRatio(SizeBinnedRatio):
    """The same shrunk ratio per bin of a trajectory's turn index (:func:`turn_bin`):
    the share of responses that call a tool, which falls as a trajectory gets older
    (a task needs a few tool calls at least, and each later turn is likelier its last)."""

    BINS = TURN_BINS
    __slots__ = ()

    @staticmethod
    def bin_of(size) -> np.ndarray:
        return turn_bin(size)


class AgeBinnedRatio:
    """A token-weighted :class:`Ratio` per half-octave bin of an age in seconds (bin ``b``
    holds ages in [2^(b/2), 2^((b+1)/2)), ages under 1.41 s in bin 0), each shrunk towards
    the pooled ratio by ``pseudo`` observations: ``(n_b * r_b + pseudo * pooled) / (n_b + pseudo)`` with
    ``n_b`` the bin's decayed count. An infinite age (no weight update yet) feeds the
    pooled ratio alone and reads it."""

    BINS = 32  # two a doubling: 2^16 s, 18 hours
    __slots__ = ("pooled", "pseudo", "_bins", "_n", "_keep")

    def __init__(self, pooled: Ratio, pseudo: float = 20.0, half_life: float = 2000.0) -> None:
        self.pooled = pooled
        self.pseudo = float(pseudo)
        self._bins = [Ratio(0.0, 0.0, half_life) for _ in range(self.BINS)]
        self._n = [0.0] * self.BINS
        self._keep = 0.5 ** (1.0 / half_life)

    @classmethod
    def bin_of(cls, age: float) -> int:
        return min(max(int(math.floor(2.0 * math.log2(max(age, 1.0)))), 0), cls.BINS - 1)

    def observe(self, age: float, num: float, den: float) -> None:
        self.pooled.observe(num, den)
        if not (math.isfinite(age) and math.isfinite(num) and math.isfinite(den) and den > 0 and num >= 0):
            return
        b = self.bin_of(age)
        self._bins[b].observe(num, den)
        self._n[b] = self._n[b] * self._keep + 1.0

    def value(self, age: float) -> float:
        """The shrunk ratio at ``age`` seconds (the pooled one where the age is not finite)."""
        p = self.pooled.value
        if not math.isfinite(age) or not math.isfinite(self.pseudo):
            return p
        b = self.bin_of(age)
        n = self._n[b]
        return (n * self._bins[b].value + self.pseudo * p) / (n + self.pseudo) if n + self.pseudo > 0 else p


class History:
    """Learnt statistics the predictor conditions on (see the module docstring)."""

    def __init__(self, config: ForecastConfig | None = None) -> None:
        cfg = config or ForecastConfig()
        self.config = cfg
        hl = cfg.duration_half_life
        self.reward = DurationModel("reward", cfg.prior_reward_s, half_life=hl)
        priors = {
            START_PREWARM: cfg.prior_sandbox_prewarm_s,
            START_COLD: cfg.prior_sandbox_cold_s,
            START_DISPATCHED: cfg.prior_start_s,
            START_READY: 0.05,
        }
        self.start = [DurationModel(f"start[{m}]", priors[m], half_life=hl) for m in range(START_MODES)]
        self.tool = DurationModel("tool", cfg.prior_tool_s, half_life=hl, cure_memory=cfg.returning_memory)
        # The group's and the trajectory's own speed (frailty.py): the tool durations
        # with those effects taken out, and the effects.
        self.tool_base = DurationModel("tool_base", cfg.prior_tool_s, half_life=hl)
        self.frailty = Frailty(cfg.frailty_min_calls)
        # Beyond the paper (B.1 ignores a second pass within a horizon): trajectories now
        # queued, in prefill or decoding may call a tool and return within the window.
        self.decode = DurationModel("decode", 10.0, half_life=hl)
        self.decode_tool = 1.0  # decode.finished with finish=tool (prior 1 of 2)
        self.decode_done = 2.0
        # The same fraction by turn index (tool_turn_pseudo), each bin shrunk towards the
        # pooled one above (tool_turn_table) and forgetting like the size bins: a policy
        # in training changes how many tool calls it makes.
        self.tool_by_turn = TurnBinnedRatio(None, cfg.tool_turn_pseudo)
        self.output = RunningMean(300.0)
        # A request aborted mid-decode (a weight update's pause, a drain) is re-queued with
        # its context by the framework, or its trajectory is dropped: the abort -> next
        # request.queued delay (prior 1 s worth one observation, CHOICE: about a weight
        # sync, for a framework that re-sends once generation continues) and the share
        # re-queued (prior 1 of 1: the contract's carried-over trajectories re-prefill).
        self.requeue = DurationModel("requeue", 1.0, prior_weight=1.0, half_life=hl)
        self.requeued = 1.0
        self.abort_ends = 1.0
        # Of the decodes under way when an update lands, the share that end in an abort
        # (prior 1 of 1: the update aborts them; a framework that lets them finish on the
        # new weights teaches it otherwise).
        self.cut = 1.0
        self.cut_ends = 1.0
        # Admitted reward completion -> first request of the trajectory launched for it.
        self.launch = DurationModel("launch", cfg.prior_launch_s + cfg.prior_sandbox_prewarm_s, half_life=hl)
        # A cohort's last completion (sync batch, GRPO group) -> first request of the next.
        self.cohort_launch = DurationModel("cohort_launch", 30.0, half_life=hl)
        # Sync runs: policy.updated -> the next batch's first dispatch.
        # A duration seen once per step (this one, the training pause below) takes a
        # prior worth one observation (CHOICE): one step's measurement then outweighs it.
        self.sync_start = DurationModel("sync_start", cfg.prior_sync_start_s, prior_weight=1.0, half_life=hl)
        # Admission: Beta(1, 1)-like prior on the admitted fraction.
        self.admitted = 1.0
        self.completed = 2.0
        # Launches per admitted completion under injection="replace" (prior 1 per 1).
        self.launched = 2.0
        self.admitted_for_launch = 2.0
        self.cohort_size = RunningMean(0.0, alpha=0.3)
        # Async weight updates: trigger (one batch of admitted samples) -> policy.updated.
        self.train = DurationModel("train", 30.0, prior_weight=1.0, half_life=hl)
        self.first_prompt = RunningMean(float(cfg.prior_prompt_tokens))
        self.first_overhead = RunningMean(0.0)
        self.tool_growth = RunningMean(512.0)
        self.tool_overhead = RunningMean(0.0)
        self.pool_prefill = PrefillTimeModel()
        # Prefix-cache hits, learnt from prefill.finished.cached_tokens: the fraction of a
        # trajectory's previous prompt found cached when its next request is prefilled
        # ("warm": no weight update in between) and the fraction of a prompt found cached
        # otherwise ("cold": a first request, or after the cache was flushed by an update).
        # Priors 0: without cached_tokens in the log every token counts as computed.
        self.cache_warm = Ratio(0.0, 1000.0)
        self.cache_cold = Ratio(0.0, 1000.0)
        # The warm hit by the caches' age (seconds since the weight update that flushed
        # them, when the prefill ends): caches refill after a flush, and a prefix shared
        # with other trajectories (a GRPO group's prompt) is found on more ranks the longer
        # they have run. Each bin shrunk towards cache_warm (cache_age_pseudo).
        self.cache_warm_age = AgeBinnedRatio(self.cache_warm, cfg.cache_age_pseudo)
        # When request.queued and prefill.finished name engines: the share of warm
        # requests routed back to the engine that caches their prefix (cache_warm is then
        # learnt on those alone, and a request queued at another engine is cold). Prior 1:
        # until engines are seen, every warm request counts as routed back.
        self.cache_same = Ratio(1.0, 1.0)
        # The same share by the size of the cached prefix: a cache-aware router weighs
        # the prefix it would reuse against the queue it would wait in, so how often a
        # request goes back depends on how much it has cached (and on eviction, which
        # favours some sizes). Each bin is shrunk towards cache_same.
        self.cache_same_size = SizeBinnedRatio(self.cache_same, cfg.cache_same_pseudo)
        # Seconds from policy.updated until prefill resumes (the weight-sync pause).
        self.update_pause = RunningMean(0.0, alpha=0.2)
        self.prefill: dict[str, PrefillTimeModel] = {}
        # reward.finished events seen: launches after completed rewards are forecast only
        # in a log that has shown some (a serving trace's requests end without one).
        self.completions = 0
        # What is learnt from closed windows: the bias factors and the blend with the
        # naive predictors (terms/correction.py).
        self.correction = Correction(cfg)

    def learn_tool(self, duration: float, ts: float, calls: int, logsum: float, group: int) -> tuple[int, float]:
        """A tool call ended after ``duration`` seconds, its trajectory's ``calls``-th
        (whose earlier ones' log durations sum to ``logsum``) in group ``group`` (-1:
        none): the pooled model, the effects (frailty.py) and the baseline with them
        taken out, each call scaled by the effects estimated before it (what a forecast
        made just before it ended used). Returns the trajectory's new ``(calls, logsum)``."""
        self.tool.observe(duration, at=ts)
        theta, _ = self.frailty.effect(calls, logsum, group)
        self.tool_base.observe(max(duration, 0.0) * math.exp(-theta), at=ts)
        y = self.frailty.log_duration(duration)
        self.frailty.observe(y, calls, logsum, group)
        return calls + 1, logsum + y

    def learn_requeue(self, delay: float | None) -> None:
        """An aborted trajectory's request was re-queued ``delay`` seconds after its abort,
        or (None) the trajectory was dropped instead."""
        self.abort_ends += 1.0
        if delay is not None:
            self.requeued += 1.0
            self.requeue.observe(max(delay, 0.0))

    @property
    def requeue_share(self) -> float:
        """The share of aborted trajectories that re-queue their request."""
        return self.requeued / self.abort_ends

    @property
    def cut_share(self) -> float:
        """The share of the decodes under way at a weight update that it aborts."""
        return self.cut / self.cut_ends

    @property
    def update_flushes(self) -> bool:
        """Whether a weight update flushes the engines' prefix caches. SGLang refuses to
        flush an engine that holds a request, so the caches go only where the framework
        aborts the requests in flight (``abort`` pause mode: most decodes under way at an
        update end in an abort); engines paused in place or by retraction keep theirs."""
        return self.cut_share >= 0.5

    @property
    def admit_rate(self) -> float:
        """p-hat: the fraction of reward completions admitted to training."""
        return self.admitted / self.completed

    @property
    def tool_fraction(self) -> float:
        """Fraction of finished responses that call a tool."""
        return self.decode_tool / self.decode_done

    def tool_turn_table(self) -> np.ndarray:
        """The fraction of responses that call a tool per turn bin (:func:`turn_bin`),
        each bin shrunk towards :attr:`tool_fraction`."""
        return self.tool_by_turn.table(self.tool_fraction)

    @property
    def launches_per_admitted(self) -> float:
        """The slope of the injection function f under ``replace``."""
        return self.launched / self.admitted_for_launch

    def prefill_model(self, engine: str | None) -> PrefillTimeModel:
        if engine is None:
            return self.pool_prefill
        model = self.prefill.get(engine)
        if model is None:
            model = self.prefill[engine] = PrefillTimeModel()
        return model
