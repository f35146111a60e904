"""Engine state for the simulator: attention DP ranks with chunked prefill, continuous
decode batching, KV accounting, prefix cache and preemption.

Decode progress is lazy: each rank counts its decode steps, and a running request only
remembers the count at which it joined and the count at which it will finish (a heap).
So a decode step costs O(1) per rank, not per token or per request.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from prorsa_emulated.costmodel import ModelProfile


@dataclass(eq=False, slots=True)
class Req:
    """One model request (one turn of a trajectory)."""

    traj: "object"
    rid: str
    prompt: int
    """Full prompt tokens (cached prefix included)."""
    out_target: int
    """Output tokens still to produce in this request (first token included)."""
    pf_left: int = 0
    pf_ctx: int = 0
    cached: int = 0
    started: bool = False
    alive: bool = True
    start_count: int = 0
    finish_count: int = 0
    out_done: int = 0
    """Tokens produced before the current decode residency (e.g. before a retraction)."""
    rank: "Rank | None" = None
    resumed: bool = False
    """Retracted after its prefill; its next prefill is a recompute, not a new event."""
    announced: bool = False
    """prefill.started was emitted (only once per request, even if prefill restarts)."""


@dataclass(eq=False, slots=True)
class Rank:
    """One attention data-parallel rank of an engine."""

    engine: "Engine"
    idx: int
    capacity: int
    waiting: deque = field(default_factory=deque)
    waiting_tokens: int = 0
    pending: deque = field(default_factory=deque)
    """PD decode side: transferred requests waiting for KV space."""
    running: dict = field(default_factory=dict)
    heap: list = field(default_factory=list)
    counter: int = 0
    kv_base: int = 0
    inuse_prefill: int = 0
    cache: OrderedDict = field(default_factory=OrderedDict)
    cache_tokens: int = 0

    @property
    def n_run(self) -> int:
        return len(self.running)

    @property
    def kv_used(self) -> int:
        """KV tokens held by running and prefilling requests (cache excluded)."""
        return self.kv_base + len(self.running) * self.counter + self.inuse_prefill

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pending)

    # --- prefix cache ----------------------------------------------------------------

    def cache_put(self, traj_key: str, tokens: int) -> None:
        """Keep a finished turn's KV (radix cache), evicting least recently used ones."""
        old = self.cache.pop(traj_key, 0)
        self.cache_tokens -= old
        self.cache[traj_key] = tokens
        self.cache_tokens += tokens
        self._evict(0)

    def cache_take(self, traj_key: str) -> int:
        tokens = self.cache.pop(traj_key, 0)
        self.cache_tokens -= tokens
        return tokens

    def cache_peek(self, traj_key: str) -> int:
        return self.cache.get(traj_key, 0)

    def _evict(self, need: int) -> None:
        while self.cache and self.kv_used + self.cache_tokens + need > self.capacity:
            _, tokens = self.cache.popitem(last=False)
            self.cache_tokens -= tokens

    def flush_cache(self) -> None:
        self.cache.clear()
        self.cache_tokens = 0

    # --- running set -----------------------------------------------------------------

    def admit_running(self, req: Req, kv_tokens: int) -> None:
        """Start decoding ``req`` holding ``kv_tokens`` of KV."""
        req.start_count = self.counter
        req.finish_count = self.counter + req.out_target
        req.rank = self
        self.running[req] = None
        self.kv_base += kv_tokens - self.counter
        heapq.heappush(self.heap, (req.finish_count, _seq(), req))

    def remove_running(self, req: Req) -> int:
        """Remove ``req`` from the running set; return its current KV tokens."""
        del self.running[req]
        kv = self.kv_base_of(req)
        self.kv_base -= kv - self.counter
        req.alive = False
        return kv

    def kv_base_of(self, req: Req) -> int:
        return req.prompt + (self.counter - req.start_count)

    def generated(self, req: Req) -> int:
        return self.counter - req.start_count

    def steps_to_next_finish(self) -> int:
        heap = self.heap
        # Lazy deletion: an entry is live only if its request still runs here with the
        # same finish count (a retracted and re-admitted request has a newer entry).
        while heap and (heap[0][2] not in self.running or heap[0][0] != heap[0][2].finish_count):
            heapq.heappop(heap)
        if not heap:
            return 1 << 30
        return max(0, heap[0][0] - self.counter)

    def pop_finished(self) -> list[Req]:
        """Requests whose last token was produced by the steps so far."""
        done = []
        heap = self.heap
        while heap:
            fin, _, req = heap[0]
            # A request retracted and re-admitted at the same step count has two live
            # entries with the same finish count: the second is stale.
            if req not in self.running or fin != req.finish_count or (done and req in done):
                heapq.heappop(heap)
                continue
            if fin > self.counter:
                break
            heapq.heappop(heap)
            done.append(req)
        return done


_SEQ = [0]


def _seq() -> int:
    _SEQ[0] += 1
    return _SEQ[0]


@dataclass(eq=False, slots=True)
class Engine:
    """One SGLang server: ``attn_dp`` ranks sharing one MoE step."""

    name: str
    server: str
    index: int
    profile: ModelProfile
    role: str
    ranks: list[Rank] = field(default_factory=list)
    busy_until: float = 0.0
    stepping: bool = False
    version: int = 0
    seg_t0: float = 0.0
    seg_dt: float = 0.0
    seg_k: int = 0
    seg_kind: str = ""
    seg_plan: list = field(default_factory=list)
    draining: bool = False
    switch: "object | None" = None
    available: bool = True
    """False while switching (not routable, does no work)."""
    # accounting, GPU-seconds
    busy_s: float = 0.0
    wait_s: float = 0.0
    empty_rank_s: float = 0.0
    prefill_tokens_done: int = 0
    decode_tokens_done: int = 0
    gen_throughput: float = 0.0
    """Decode tokens per second of the last step that decoded (all ranks together): the sum
    over ranks of SGLang's per-rank ``gen_throughput`` gauge, held while the engine idles."""

    @classmethod
    def build(cls, profile: ModelProfile, index: int, role: str) -> "Engine":
        servers = max(1, profile.gpus_per_engine // 8)
        eng = cls(
            name=f"e{index:03d}",
            server=f"s{(index * servers * 8) // 8:02d}" if profile.gpus_per_engine >= 8 else f"s{(index * profile.gpus_per_engine) // 8:02d}",
            index=index,
            profile=profile,
            role=role,
        )
        eng.ranks = [Rank(eng, r, profile.kv_capacity_per_rank) for r in range(profile.attn_dp)]
        return eng

    @property
    def routable(self) -> bool:
        return self.available and not self.draining

    def has_work(self) -> bool:
        return any(r.has_work() for r in self.ranks)

    def running_reqs(self) -> int:
        """Decoding requests plus those whose prefill has begun (SGLang's running batch:
        a chunked prefill in progress counts as running, not waiting)."""
        return sum(len(r.running) + sum(1 for q in r.waiting if q.started) for r in self.ranks)

    def queued_reqs(self) -> int:
        """Requests waiting for a prefill to start, plus (PD decode side) transferred ones
        waiting for KV space."""
        return sum(sum(1 for q in r.waiting if not q.started) + len(r.pending) for r in self.ranks)

    def kv_used(self) -> int:
        return sum(r.kv_used for r in self.ranks)

    def kv_capacity(self) -> int:
        return sum(r.capacity for r in self.ranks)
