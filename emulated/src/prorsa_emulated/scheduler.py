"""The emulated engine's scheduler: SGLang's loop, loosely but honestly.

One :class:`Rank` per attention DP rank, each with its own KV pool (tokens), prefix cache,
prefill queue and running batch. Every engine step, each rank plans either a prefill batch
(up to ``chunk_size`` new tokens; a longer prompt is chunked over several steps) or one
decode step of its whole running batch (continuous batching). Prefill goes first when a
waiting request fits (SGLang without ``--enable-mixed-chunk``). The step lasts as long as the
slowest rank (the MoE all-to-all synchronises them); its time comes from the cost model:
``prefill_time(new, context)`` per request plus one fixed overhead, and
``decode_step_time(batch, kv_tokens)``. Requests wait when the KV pool is full; when a decode
step does not fit, the newest running request is retracted (re-prefilled later on a mixed
engine; parked in the retracted queue of a PD decode engine).

PD roles: a ``prefill`` rank holds a prefilled request's KV while it is sent
(``kv_transfer_time``), then caches the prompt. A ``decode`` rank reserves the prompt's KV
(prealloc queue) when it fits with ``RESERVED_DECODE_TOKENS`` kept free for each request it
holds, waits for the peer's prefill and the transfer (transfer queue), then decodes; it
keeps no prefix cache (SGLang's decode radix cache is off by default). A request it
retracts resumes, under the same rule, before any new one is admitted.

Pure bookkeeping here; the asyncio loop that sleeps lives in ``engine.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from .costmodel import RESERVED_DECODE_TOKENS, ModelProfile
from .prefix_cache import PAGE, PrefixCache


@dataclass(eq=False)
class Req:
    """One generate request inside the engine."""

    rid: str
    keys: list[int]
    """Page keys of the prompt (prefix cache)."""
    out_keys: object
    """Callable ``n -> keys`` of prompt plus ``n`` output tokens (what a finish caches)."""
    prompt_tokens: int
    max_new: int
    future: asyncio.Future
    pinned: bool = False
    queued_at: float = 0.0
    started_at: float | None = None
    phase: str = "waiting"
    rank: int = 0
    locked: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    target: int = 0
    """Tokens the current prefill must have in KV when done (prompt + output on a re-prefill)."""
    prefilled: int = 0
    completion: int = 0
    private: int = 0
    """KV tokens this request holds outside the prefix cache."""
    task: asyncio.Task | None = None
    room: int | None = None
    """PD bootstrap room (prefill side: announced when the prefill is done)."""
    pd: object = None
    """PD link (decode side): where to wait for the peer's prefill."""
    first: asyncio.Future | None = None
    """Resolved (with what a first streamed chunk says) when the first output token exists:
    the prefill sampled it, or (decode side) its KV and token arrived; also at the finish."""

    @property
    def remaining_prefill(self) -> int:
        return max(0, self.target - self.cached_tokens - self.prefilled)


@dataclass
class Plan:
    """What one rank does in one engine step."""

    kind: str  # "prefill" | "decode"
    seconds: float
    prefill: list[tuple[Req, int]] = field(default_factory=list)
    decode: list[Req] = field(default_factory=list)
    steps: int = 1


class Rank:
    """One attention DP rank: KV pool, prefix cache, queues."""

    def __init__(self, index: int, capacity: int, max_running: int):
        self.index = index
        self.capacity = capacity
        self.max_running = max(1, max_running)
        self.cache = PrefixCache()
        self.private = 0
        self.waiting: deque[Req] = deque()
        self.chunked: Req | None = None
        self.prefilling: list[Req] = []
        """Admitted requests whose prefill is under way (the chunked one included)."""
        self.running: list[Req] = []
        self.prealloc: deque[Req] = deque()
        self.transfer: list[Req] = []
        self.inflight: list[Req] = []
        self.retracted: deque[Req] = deque()
        self.retractions = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.prefill_tokens_total = 0
        self.prefill_busy_s = 0.0  # emulated seconds of the steps this rank prefilled in
        self.last_gen_throughput = 0.0

    # -- KV -----------------------------------------------------------------------------
    def free(self) -> int:
        return self.capacity - self.cache.tokens - self.private

    def fits(self, n: int) -> bool:
        """Whether ``n`` more tokens fit once unlocked cache pages are evicted."""
        return self.free() + self.cache.evictable_tokens >= n

    def reserve(self, req: Req, n: int) -> bool:
        """Give ``req`` ``n`` more tokens of KV, evicting cache if needed."""
        if self.free() < n:
            self.cache.evict(n - self.free())
        if self.free() < n:
            return False
        self.private += n
        req.private += n
        return True

    def release(self, req: Req) -> None:
        self.private -= req.private
        req.private = 0
        self.cache.unlock(req.locked)
        req.locked = []

    def used_tokens(self) -> int:
        """SGLang's ``num_used_tokens``: KV held by requests (not the evictable cache)."""
        return self.private + self.cache.tokens - self.cache.evictable_tokens

    def requests(self) -> list[Req]:
        out = list(self.waiting) + self.running + list(self.prealloc) + self.transfer
        out += self.inflight + list(self.retracted)
        return out + self.prefilling

    def idle(self) -> bool:
        return not self.requests()

    def load(self) -> int:
        """The simulator's routing key (``engines.route_prefill``): prompt tokens still to
        prefill here, plus 256 per request decoding or bound to decode here."""
        todo = sum(r.prompt_tokens + r.completion - r.private for r in self.waiting)
        todo += sum(r.remaining_prefill for r in self.prefilling)
        return todo + 256 * (len(self.running) + len(self.prealloc) + len(self.transfer)
                             + len(self.retracted))

    # -- admission ----------------------------------------------------------------------
    def admit(self, req: Req, use_cache: bool) -> bool:
        """Match the prefix and reserve KV for the rest of the prefill; False if it does not fit."""
        locked = self.cache.match_and_lock(req.keys) if use_cache else []
        # SGLang always computes at least the last prompt token.
        cached = min(len(locked) * PAGE, max(0, req.prompt_tokens - 1))
        req.target = req.prompt_tokens + req.completion
        need = req.target - cached - req.private
        if not self.reserve(req, max(0, need)):
            self.cache.unlock(locked)
            return False
        req.locked, req.cached_tokens, req.prefilled = locked, cached, 0
        self.prompt_tokens_total += req.prompt_tokens
        self.cached_tokens_total += cached
        return True

    def remove(self, req: Req) -> None:
        """Take ``req`` out of every queue and free its KV (abort)."""
        for q in (self.waiting, self.prealloc, self.retracted):
            if req in q:
                q.remove(req)
        for lst in (self.running, self.transfer, self.inflight, self.prefilling):
            if req in lst:
                lst.remove(req)
        if self.chunked is req:
            self.chunked = None
        self.release(req)

    # -- planning -----------------------------------------------------------------------
    def plan(self, profile: ModelProfile, chunk: int, mode: str, now: float) -> Plan | None:
        """This rank's work for the next step (mutates queues: admission and retraction).
        A decode plan's ``seconds`` and ``steps`` are set by :func:`plan_step`, which sees
        every rank."""
        if mode == "decode":
            self._admit_decode()
        else:
            p = self._plan_prefill(profile, chunk, mode, now)
            if p is not None:
                return p
        if mode == "prefill":
            return None
        return self._plan_decode(mode)

    def _room_for(self, n: int) -> bool:
        """SGLang's decode prealloc: ``n`` tokens fit with ``RESERVED_DECODE_TOKENS`` kept
        free for each request held, the new one included (an empty rank takes any that
        fits)."""
        held = len(self.running) + len(self.transfer)
        return self.fits(n + (RESERVED_DECODE_TOKENS * (held + 1) if held else 0))

    def _admit_decode(self) -> None:
        while self.retracted and self._room_for(self.retracted[0].prompt_tokens + self.retracted[0].completion):
            req = self.retracted[0]
            if not self.reserve(req, req.prompt_tokens + req.completion):
                break
            self.retracted.popleft()
            req.phase = "running"
            self.running.append(req)
        while self.prealloc and len(self.running) + len(self.transfer) < self.max_running:
            req = self.prealloc[0]
            if not self._room_for(req.prompt_tokens) or not self.reserve(req, req.prompt_tokens):
                break
            self.prealloc.popleft()
            req.phase = "transfer"
            self.transfer.append(req)

    def _plan_prefill(self, profile: ModelProfile, chunk: int, mode: str, now: float) -> Plan | None:
        budget, batch = chunk, []
        if self.chunked is not None:
            n = min(budget, self.chunked.remaining_prefill)
            batch.append((self.chunked, n))
            budget -= n
        while budget > 0 and self.waiting and (
                len(self.running) + len(self.inflight) + len(batch) < self.max_running):
            req = self.waiting[0]
            if not self.admit(req, use_cache=True):
                break  # FIFO: the head waits for KV
            self.waiting.popleft()
            self.prefilling.append(req)
            req.phase, req.started_at = "prefill", now
            n = min(budget, req.remaining_prefill)
            batch.append((req, n))
            budget -= n
        if not batch:
            return None
        # As the simulator's ``_build_chunk``: one fixed overhead per forward, plus each
        # piece's tokens and attention over its context.
        secs = profile.prefill_fixed_s + sum(
            profile.prefill_time(n, r.cached_tokens + r.prefilled) - profile.prefill_fixed_s
            for r, n in batch if n > 0)
        last, n_last = batch[-1]
        self.chunked = last if n_last < last.remaining_prefill else None
        return Plan("prefill", secs, prefill=batch)

    def _plan_decode(self, mode: str) -> Plan | None:
        # SGLang retracts before a decode step that does not fit (newest first).
        while self.running and not self.fits(len(self.running)):
            self._retract(self.running.pop(), mode)
        if not self.running:
            return None
        return Plan("decode", 0.0, decode=list(self.running))

    def headroom(self) -> int:
        """KV tokens free once unlocked cache pages are evicted."""
        return self.free() + self.cache.evictable_tokens

    def kv_of_running(self) -> int:
        return sum(r.prompt_tokens + r.completion for r in self.running)

    def retract_all(self, mode: str) -> int:
        """``pause_generation`` in ``retract`` mode: every request being prefilled or
        decoded gives its KV back, as :meth:`_retract` does one under KV pressure (the
        oldest stays first in line). What SGLang had put in its radix tree stays cached:
        the chunks a prefill made (``cache_unfinished_req``) and, on a mixed rank, a
        decoding request's prompt (inserted once prefilled; the output's KV is freed), so
        the re-prefill computes the rest (as the simulator's ``retract_engine``). Returns
        how many."""
        n = 0
        if mode != "decode":
            for req in reversed(self.prefilling):
                self.cache.insert(req.keys[:(req.cached_tokens + req.prefilled) // PAGE])
                self.release(req)
                req.phase, req.prefilled = "waiting", 0
                self.waiting.appendleft(req)
                n += 1
            self.prefilling.clear()
            self.chunked = None
        while self.running:
            req = self.running.pop()
            if mode != "decode":
                self.cache.insert(req.keys)
            self._retract(req, mode)
            n += 1
        return n

    def _retract(self, req: Req, mode: str) -> None:
        self.retractions += 1
        self.release(req)
        if mode == "decode":
            req.phase = "retracted"
            self.retracted.appendleft(req)
        else:  # re-prefill prompt + output later, first in line
            req.phase, req.prefilled = "waiting", 0
            self.waiting.appendleft(req)


MAX_MACRO_STEPS = 512
"""As the simulator's ``engines.MAX_MACRO_STEPS``: the longest run of decode-only steps
planned at once (a new arrival cuts it short at the next step boundary)."""


@dataclass
class EngineStep:
    """One engine step of every rank in lock-step, or a run of ``k`` decode-only steps."""

    plans: list[tuple[Rank, Plan]]
    dt: float
    """Seconds of one step: the slowest rank's (``ModelProfile.engine_step_time``)."""
    k: int
    any_prefill: bool


def plan_step(ranks: list[Rank], profile: ModelProfile, chunk: int, mode: str, now: float,
              max_k: int = MAX_MACRO_STEPS) -> EngineStep | None:
    """The next engine step, as the simulator plans it (``engines.ClusterSim._plan``).

    Every rank either runs one prefill chunk (prefill first, when an admissible request is
    waiting) or one decode step of its running batch. The ranks run in lock-step: the step
    lasts as long as the slowest one, and while any rank prefills, the decoding ranks pay
    the extend step's penalty (``decode_step_time(..., extend=True)``). With no prefill
    anywhere, ``k`` decode steps are planned at once: up to the first request to finish or
    the KV that is free, at the mid-run KV (it grows one token per sequence per step).
    Reserves the decode run's KV (``k`` tokens per sequence); :func:`settle` hands it back.
    """
    plans: list[tuple[Rank, Plan]] = []
    for rank in ranks:
        p = rank.plan(profile, chunk, mode, now)
        if p is not None:
            plans.append((rank, p))
    if not plans:
        return None
    any_prefill = any(p.kind == "prefill" for _, p in plans)
    k = 1
    if not any_prefill:
        k = max_k
        for rank, p in plans:
            b = len(p.decode)
            left = min(r.max_new - r.completion for r in p.decode)
            k = min(k, max(1, left), max(1, rank.headroom() // b))
    times = []
    for rank, p in plans:
        if p.kind == "decode":
            b = len(p.decode)
            kv = sum(r.prompt_tokens + r.completion for r in p.decode)
            p.seconds = profile.decode_step_time(b, kv + b * (k // 2), extend=any_prefill)
            p.steps = k
            rank.cache.evict(max(0, k * b - rank.free()))
            rank.private += k * b  # reserved now, handed to each request when settled
        times.append(p.seconds)
    return EngineStep(plans, profile.engine_step_time(times), k, any_prefill)


def steps_done(step: EngineStep, elapsed: float) -> int:
    """Decode steps of a ``k``-step run that are done or under way after ``elapsed``
    seconds: where a new arrival cuts the run short (at the end of the step under way)."""
    if step.k <= 1 or step.dt <= 0:
        return step.k
    return max(1, min(step.k, int(elapsed / step.dt) + 1))
