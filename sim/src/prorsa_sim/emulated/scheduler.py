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
(prealloc queue), waits for the peer's prefill and the transfer (transfer queue), then
decodes; it keeps no prefix cache (SGLang's decode radix cache is off by default).

Pure bookkeeping here; the asyncio loop that sleeps lives in ``engine.py``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

from ..costmodel import ModelProfile
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
        self.running: list[Req] = []
        self.prealloc: deque[Req] = deque()
        self.transfer: list[Req] = []
        self.inflight: list[Req] = []
        self.retracted: deque[Req] = deque()
        self.retractions = 0
        self.prompt_tokens_total = 0
        self.cached_tokens_total = 0
        self.prefill_tokens_total = 0
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
        return out + ([self.chunked] if self.chunked else [])

    def idle(self) -> bool:
        return not self.requests()

    def load(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.prealloc) + len(self.transfer)

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
        for lst in (self.running, self.transfer, self.inflight):
            if req in lst:
                lst.remove(req)
        if self.chunked is req:
            self.chunked = None
        self.release(req)

    # -- planning -----------------------------------------------------------------------
    def plan(self, profile: ModelProfile, chunk: int, mode: str, now: float,
             quantum_s: float) -> Plan | None:
        """This rank's work for the next step (mutates queues: admission and retraction)."""
        if mode == "decode":
            self._admit_decode()
        else:
            p = self._plan_prefill(profile, chunk, mode, now)
            if p is not None:
                return p
        return self._plan_decode(profile, mode, quantum_s)

    def _admit_decode(self) -> None:
        while self.retracted and self.reserve(self.retracted[0], self.retracted[0].prompt_tokens
                                              + self.retracted[0].completion):
            req = self.retracted.popleft()
            req.phase = "running"
            self.running.append(req)
        while self.prealloc and len(self.running) + len(self.transfer) < self.max_running:
            req = self.prealloc[0]
            if not self.reserve(req, req.prompt_tokens):
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
            req.phase, req.started_at = "prefill", now
            n = min(budget, req.remaining_prefill)
            batch.append((req, n))
            budget -= n
        if not batch:
            return None
        secs = profile.prefill_fixed_s + sum(
            profile.prefill_time(n, r.cached_tokens + r.prefilled) - profile.prefill_fixed_s
            for r, n in batch if n > 0)
        last, n_last = batch[-1]
        self.chunked = last if n_last < last.remaining_prefill else None
        return Plan("prefill", secs, prefill=batch)

    def _plan_decode(self, profile: ModelProfile, mode: str, quantum_s: float) -> Plan | None:
        while self.running and not self.fits(len(self.running)):
            self._retract(self.running.pop(), mode)
        if not self.running:
            return None
        b = len(self.running)
        kv = sum(r.prompt_tokens + r.completion for r in self.running)
        one = profile.decode_step_time(b, kv)
        # Several steps at once when nothing else can happen before a request finishes and
        # the wall time stays under the quantum (new arrivals wait at most that long).
        steps = 1
        if not (self.waiting or self.prealloc or self.retracted or self.chunked) and quantum_s > one:
            left = min(r.max_new - r.completion for r in self.running)
            steps = max(1, min(left, int(quantum_s / one)))
            while steps > 1 and not self.fits(steps * b):
                steps //= 2
        secs = steps * profile.decode_step_time(b, kv + b * (steps - 1) // 2)
        self.cache.evict(max(0, steps * b - self.free()))
        self.private += steps * b  # reserved now, handed to each request when applied
        return Plan("decode", secs, decode=list(self.running), steps=steps)

    def _retract(self, req: Req, mode: str) -> None:
        self.retractions += 1
        self.release(req)
        if mode == "decode":
            req.phase = "retracted"
            self.retracted.appendleft(req)
        else:  # re-prefill prompt + output later, first in line
            req.phase, req.prefilled = "waiting", 0
            self.waiting.appendleft(req)
