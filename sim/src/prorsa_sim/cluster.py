"""Engine stepping and routing: the cluster half of the simulator (role switches and the
weight-update abort are :mod:`prorsa_sim.switching`).

``ClusterSim`` owns the virtual clock (a heap of callbacks), the engines and the router.
The rollout half (:mod:`prorsa_sim.trajectories`) subclasses it and supplies the hooks
``_on_prefill_started``, ``_on_prefill_finished``, ``_on_decode_finished`` and
``_on_aborted``.

One engine step: every attention DP rank either runs one prefill chunk (a rank with
admissible queued prompts runs prefill first and pauses its decode batch, as SGLang's
scheduler does without mixed chunks) or one decode step of its batch; the step lasts as
long as the slowest rank (the MoE all-to-all synchronises them), and the other ranks'
GPUs wait. Stretches where every rank only decodes run as one macro-step of k steps,
cut short (at a step boundary) when new work arrives.
"""

from __future__ import annotations

import heapq

from prorsa_emulated import smg
from prorsa_emulated.costmodel import RESERVED_DECODE_TOKENS, ModelProfile

from .engines import Engine, Rank, Req
from .switching import DRAIN_DEADLINE_S, Interruptions

MAX_MACRO_STEPS = 512
DP_ROUTING = ("prefix", "load")
"""How a request's attention-DP rank is chosen. ``prefix``: the router sees every rank and
keeps a trajectory on the rank holding its prefix (sglang-router's cache-aware policy with
``--dp-aware``). ``load``: the router picks the engine by prefix, and the engine's
data-parallel controller then picks the rank by load (SGLang's default
``--load-balance-method``), so a prefix is reused only when that rank holds it."""


ROUTER_POLICIES = ("queue", "smg")
"""The router's rule between a prefix's holder and a less loaded worker. ``queue``: stay
on the rank holding the trajectory's prefix unless its queue, less the cached part,
exceeds the least-loaded rank's queue (tokens). ``smg``: SGLang Model Gateway's
``cache_aware`` policy with its defaults (:mod:`prorsa_emulated.smg`)."""


class ClusterSim(Interruptions):
    """Virtual clock + engines + router. Deterministic: ties break by insertion order.
    Interrupting engines (the weight-update abort, role switches) is :class:`~.switching.Interruptions`."""

    def __init__(self, profile: ModelProfile, roles: list[str], dp_routing: str = "prefix",
                 router_policy: str = "queue"):
        if dp_routing not in DP_ROUTING:
            raise ValueError(f"dp_routing must be one of {', '.join(DP_ROUTING)}, not {dp_routing!r}")
        if router_policy not in ROUTER_POLICIES:
            raise ValueError(f"router_policy must be one of {', '.join(ROUTER_POLICIES)}, not {router_policy!r}")
        self.dp_routing = dp_routing
        self.router_policy = router_policy
        self.profile = profile
        self.now = 0.0
        self._heap: list = []
        self._seq = 0
        self.engines = [Engine.build(profile, i, r) for i, r in enumerate(roles)]
        self.unrouted: list[Req] = []
        self.orphans: list[Req] = []
        self.epoch = 0
        self.preemptions = 0
        self.switches = 0
        self.switch_log: list[dict] = []
        # Role-switch mechanics (docs/simulator.md, "Role switches").
        self.drain_deadline_s = DRAIN_DEADLINE_S
        self.paused = False
        """True during the weight-update pause (every engine stopped; empty unless the
        pause keeps what they hold)."""
        self.pause_keeps = False
        """The weight-update pause keeps the engines' requests (SGLang's ``in_place`` and
        ``retract`` modes) rather than aborting them."""
        self.pause_retracts = False
        """The weight-update pause takes back the KV of what prefill and mixed engines
        run, which re-prefills after it (SGLang's ``retract`` mode)."""
        self._inflight: dict[Req, Rank] = {}
        """KV transfers under way: request -> the decode rank it is bound for."""
        self.drain_aborts = 0
        self.drain_deadline_aborts = 0
        self.drain_rerouted_reqs = 0
        self.drain_requeued_tokens = 0
        self.drain_aborted_decode_tokens = 0
        self.cache_lost_tokens = 0
        self.cache_flushed_at_update_tokens = 0
        self.update_retractions = 0
        """Decoding requests a ``retract`` pause took the KV of (they re-prefill)."""
        self.empty_engine_s = 0.0
        self._last_empty_t = [0.0] * len(self.engines)
        self._tree: dict[tuple[int, int], int] = {}
        """SMG routing: tokens in the router's prefix tree of each worker (engine index,
        rank index or -1)."""
        self._tree_gen: dict[int, int] = {}
        """SMG routing: how many times each engine (by index) has left the router. A
        prefix recorded under an older generation matches nothing: the gateway dropped
        that worker's tree when it left."""
        self._shared_gen: dict = {}
        """SMG routing: the generation of the engine each GRPO group's prefix went to."""
        self.shared_rank: dict = {}
        """GRPO group prefix key -> the rank its first member was routed to."""

    # --- clock -------------------------------------------------------------------------

    def at(self, t: float, fn, *args) -> None:
        """Schedule ``fn(*args)`` at virtual time ``t``."""
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, fn, args))

    def run_until(self, stop) -> None:
        """Process callbacks in time order until ``stop()`` is true or nothing is left."""
        heap = self._heap
        while heap and not stop():
            t, _, fn, args = heapq.heappop(heap)
            self.now = t
            fn(*args)

    # --- routing ------------------------------------------------------------------------

    def route_prefill(self, req: Req) -> Engine | None:
        """Place a new request on a prefill-capable rank (cache-aware, then least loaded)."""
        if self.router_policy == "smg":
            return self._route_smg(req)
        traj = req.traj
        best = None
        best_key = None
        sticky = traj.last_rank
        for eng in self.engines:
            if eng.role == "decode" or not eng.routable:
                continue
            for rank in eng.ranks:
                key = (rank.waiting_tokens + 256 * len(rank.running), eng.index, rank.idx)
                if best_key is None or key < best_key:
                    best, best_key = rank, key
        if best is None:
            self.unrouted.append(req)
            return None
        # A trajectory's first turn shares its GRPO group's prompt: follow the rank that
        # holds the group's prefix.
        shared_key = getattr(traj, "shared_key", None)
        if sticky is None and shared_key is not None:
            sticky = self.shared_rank.get(shared_key)
        # Cache-aware routing (what SGLang's router approximates): stay on the rank that
        # holds this trajectory's prefix when its queue plus the uncached part is less work
        # than the least-loaded rank's queue plus the whole prompt.
        if sticky is not None and sticky is not best and sticky.engine.role != "decode" and sticky.engine.routable:
            hit = max(sticky.cache_peek(traj.tid), self._shared_hit(sticky, traj))
            if hit and sticky.waiting_tokens + 256 * len(sticky.running) - hit <= best_key[0]:
                best = sticky
        if self.dp_routing == "load" and len(best.engine.ranks) > 1:
            # The router picks the engine; inside it SGLang's data-parallel controller picks
            # the attention-DP rank by load (``--load-balance-method`` round_robin /
            # shortest_queue), not by prefix: the prefix is reused only if that rank has it.
            best = self._least_loaded_rank(best.engine)
        if shared_key is not None and traj.last_rank is None:
            self.shared_rank[shared_key] = best
        self.enqueue(best, req)
        return best.engine

    @staticmethod
    def _least_loaded_rank(eng: Engine) -> Rank:
        """The rank SGLang's data-parallel controller gives a request: the least loaded."""
        return min(eng.ranks, key=lambda r: (r.waiting_tokens + 256 * len(r.running), r.idx))

    def _route_smg(self, req: Req) -> Engine | None:
        """SMG's ``cache_aware`` policy (:func:`prorsa_emulated.smg.choose`). Its workers
        are the engines, or with ``prefix`` DP routing (the gateway's ``--dp-aware``) every
        attention-DP rank. A worker's load is its requests in flight (queued, prefilling,
        decoding, waiting for KV). The request's prefix matches the worker that served the
        trajectory's previous request (the tree holds the text the router sent; it does not
        know what the engine has evicted since), or for a first turn the one that served its
        GRPO group's first member, for the tokens of that request; a worker that has left
        the router since (a role switch: :meth:`router_forget`) matches nothing. The
        router's trees are its record of the text it sent each worker (a request adds what
        its worker's tree did not match), dropped when the worker leaves and otherwise never
        evicted here (the gateway evicts a tree past 2^26 characters). Without DP awareness
        the engine's data-parallel controller then picks the rank by load."""
        traj = req.traj
        shared_key = getattr(traj, "shared_key", None)
        engines = [e for e in self.engines if e.role != "decode" and e.routable]
        if not engines:
            self.unrouted.append(req)
            return None
        aware = self.dp_routing == "prefix"
        workers = [r for e in engines for r in e.ranks] if aware else engines

        def ranks(w):
            return (w,) if aware else w.ranks

        def key(w) -> tuple[int, int]:
            return (w.engine.index, w.idx) if aware else (w.index, -1)

        loads = [sum(len(r.waiting) + len(r.running) + len(r.pending) for r in ranks(w)) for w in workers]
        trees = [self._tree.get(key(w), 0) for w in workers]
        prev, matched, gen = traj.last_rank, traj.router_prefix, traj.router_gen
        if prev is None and shared_key is not None:
            prev, matched = self.shared_rank.get(shared_key), traj.shared_tokens
            gen = self._shared_gen.get(shared_key, 0)
        match = None
        if prev is not None and gen == self._tree_gen.get(prev.engine.index, 0):
            held = prev if aware else prev.engine
            match = next((i for i, w in enumerate(workers) if w is held), None)
        i = smg.choose(loads, trees, match, matched if match is not None else 0, req.prompt)
        chosen = workers[i]
        new_text = max(req.prompt - matched, 0) if i == match else req.prompt
        self._tree[key(chosen)] = trees[i] + new_text
        best = chosen if aware else self._least_loaded_rank(chosen)
        if shared_key is not None and traj.last_rank is None:
            self.shared_rank[shared_key] = best
            self._shared_gen[shared_key] = self._tree_gen.get(best.engine.index, 0)
        self.enqueue(best, req)
        return best.engine

    def router_forget(self, eng: Engine) -> None:
        """``eng`` leaves the router (a role switch begins): the gateway removes the
        worker, and its prefix trees (the engine's, and each rank's under DP awareness)
        with it; when it registers again it starts with empty ones."""
        self._tree_gen[eng.index] = self._tree_gen.get(eng.index, 0) + 1
        self._tree.pop((eng.index, -1), None)
        for rank in eng.ranks:
            self._tree.pop((eng.index, rank.idx), None)

    @staticmethod
    def _shared_hit(rank: Rank, traj) -> int:
        """Tokens of ``traj``'s group-shared prompt cached on ``rank`` (0 if none)."""
        key = getattr(traj, "shared_key", None)
        if key is None:
            return 0
        return min(rank.cache_peek(key), traj.shared_tokens)

    def enqueue(self, rank: Rank, req: Req) -> None:
        req.rank = rank
        req.started = False
        rank.waiting.append(req)
        rank.waiting_tokens += req.prompt
        req.traj.last_rank = rank
        req.traj.router_prefix = req.prompt
        req.traj.router_gen = self._tree_gen.get(rank.engine.index, 0)
        self.kick(rank.engine)

    def route_decode(self) -> Rank | None:
        """The decode rank with the most free KV (PD mode)."""
        best, best_key = None, None
        for eng in self.engines:
            if eng.role != "decode" or not eng.routable:
                continue
            for rank in eng.ranks:
                key = ((rank.kv_used + rank.waiting_tokens) / rank.capacity, eng.index, rank.idx)
                if best_key is None or key < best_key:
                    best, best_key = rank, key
        return best

    # --- stepping -----------------------------------------------------------------------

    def kick(self, eng: Engine) -> None:
        """New work may be available on ``eng``: plan a step now or shorten a macro-step."""
        if not eng.available:
            return
        if eng.stepping:
            if eng.seg_kind == "decode" and eng.seg_k > 1:
                done = int((self.now - eng.seg_t0) / eng.seg_dt) + 1
                if done < eng.seg_k:
                    eng.seg_k = done
                    eng.version += 1
                    self.at(eng.seg_t0 + done * eng.seg_dt, self._step_end, eng, eng.version)
            return
        self._plan(eng)

    def _plan(self, eng: Engine) -> None:
        prof = self.profile
        plan = []
        any_prefill = False
        for rank in eng.ranks:
            action = None
            if eng.role != "decode" and rank.waiting:
                action = self._build_chunk(rank)
                if action is not None:
                    any_prefill = True
            if action is None and eng.role != "prefill":
                if rank.pending:
                    self._admit_pending(rank)
                if rank.running:
                    self._make_room(rank)
                if rank.running:
                    action = ("d", 0.0)
            plan.append(action)
        if not any(plan):
            eng.stepping = False
            self._maybe_switch(eng)
            return
        k = 1
        if not any_prefill:
            k = MAX_MACRO_STEPS
            for rank, action in zip(eng.ranks, plan):
                if action is not None:
                    free = rank.capacity - rank.kv_used
                    k = min(k, max(1, rank.steps_to_next_finish()), max(1, free // len(rank.running)))
        for i, (rank, action) in enumerate(zip(eng.ranks, plan)):
            if action is not None and action[0] == "d":
                n = len(rank.running)
                # Mid-segment KV (it grows by one token per sequence per step). While any
                # rank prefills, decoding ranks run the extend step's eager, normal-mode
                # all-to-all path (costmodel [SGL-DPA]).
                plan[i] = ("d", prof.decode_step_time(n, rank.kv_used + n * (k // 2), extend=any_prefill))
        dt = prof.engine_step_time([a[1] for a in plan if a is not None])
        eng.stepping = True
        eng.seg_t0 = self.now
        eng.seg_dt = dt
        eng.seg_k = k
        eng.seg_kind = "prefill" if any_prefill else "decode"
        eng.seg_plan = plan
        eng.version += 1
        self.at(self.now + k * dt, self._step_end, eng, eng.version)

    def _build_chunk(self, rank: Rank):
        prof = self.profile
        budget = prof.chunk_size
        pieces = []
        t = prof.prefill_fixed_s
        for req in rank.waiting:
            if not req.started:
                if not self._admit_prefill(rank, req):
                    break
            n = min(budget, req.pf_left)
            t += prof.prefill_time(n, req.pf_ctx) - prof.prefill_fixed_s
            pieces.append((req, n))
            budget -= n
            if budget <= 0:
                break
        if not pieces:
            return None
        return ("p", t, pieces)

    def _admit_prefill(self, rank: Rank, req: Req) -> bool:
        own = rank.cache_take(req.traj.tid)
        # The group's shared prompt stays in the radix cache for the other members (peek).
        cached = max(own, self._shared_hit(rank, req.traj))
        rank.inuse_prefill += req.prompt
        rank._evict(0)
        if rank.kv_used + rank.cache_tokens > rank.capacity:
            rank.inuse_prefill -= req.prompt
            if own:
                rank.cache_put(req.traj.tid, own)
            return False
        req.started = True
        req.cached = min(cached, req.prompt - 1)
        req.pf_left = req.prompt - req.cached
        req.pf_ctx = req.cached
        rank.waiting_tokens -= req.cached
        self._on_prefill_started(rank.engine, req)
        return True

    def _admit_pending(self, rank: Rank) -> None:
        """Admit the requests waiting for KV space on a decode rank, first in line first:
        each needs its KV plus ``RESERVED_DECODE_TOKENS`` free for every request the rank
        would then hold (SGLang's decode prealloc); an empty rank takes any that fits."""
        if rank.engine.draining:
            return  # a draining engine takes no new request (its pending ones were re-queued)
        while rank.pending:
            req = rank.pending[0]
            n = len(rank.running)
            reserve = RESERVED_DECODE_TOKENS * (n + 1) if n else 1
            if rank.kv_used + req.prompt + reserve > rank.capacity:
                break
            rank.pending.popleft()
            rank.waiting_tokens -= req.prompt
            rank.admit_running(req, req.prompt)

    def _make_room(self, rank: Rank) -> None:
        """Before a decode step: evict cache, then retract the newest requests (SGLang's
        retraction) until the step's new tokens fit. A mixed rank re-prefills them later;
        a PD decode rank offloads their KV to host memory and resumes them first, once
        they fit again (``disaggregation/decode.py``: ``resume_retracted_reqs``): they wait
        at the head of its pending queue, with no event."""
        n = len(rank.running)
        if rank.kv_used + n <= rank.capacity:
            return
        rank._evict(n)
        while rank.running and rank.kv_used + len(rank.running) > rank.capacity:
            req = next(reversed(rank.running))
            gen = rank.generated(req)
            rank.remove_running(req)
            self.preemptions += 1
            req.alive = True
            req.out_done += gen
            req.out_target -= gen
            req.prompt += gen
            if rank.engine.role == "decode":
                if rank.engine.draining:
                    # A draining engine takes nothing back: re-queued for prefill now.
                    self._on_aborted(req, gen_total=req.out_done, requeue=True)
                else:
                    rank.pending.appendleft(req)
                    rank.waiting_tokens += req.prompt
            else:
                req.started = False
                req.resumed = True
                rank.waiting.appendleft(req)
                rank.waiting_tokens += req.prompt

    def _step_end(self, eng: Engine, version: int) -> None:
        if version != eng.version:
            return
        k, dt = eng.seg_k, eng.seg_dt
        gpr = self.profile.gpus_per_rank
        made = 0
        for rank, action in zip(eng.ranks, eng.seg_plan):
            if action is None:
                eng.empty_rank_s += dt * k * gpr
                continue
            eng.busy_s += action[1] * k * gpr
            eng.wait_s += (dt - action[1]) * k * gpr
            if action[0] == "p":
                for req, n in action[2]:
                    req.pf_left -= n
                    req.pf_ctx += n
                    rank.waiting_tokens -= n
                    eng.prefill_tokens_done += n
                    if req.pf_left <= 0 and rank.waiting and rank.waiting[0] is req:
                        rank.waiting.popleft()
                        rank.inuse_prefill -= req.prompt
                        self._prefill_done(eng, rank, req)
            else:
                made += k * len(rank.running)
                eng.decode_tokens_done += k * len(rank.running)
                rank.counter += k
                for req in rank.pop_finished():
                    kv = rank.remove_running(req)
                    if eng.role == "mixed":
                        rank.cache_put(req.traj.tid, kv)
                    self._on_decode_finished(req, req.out_done + req.out_target)
        if made and dt > 0:
            eng.gen_throughput = made / (k * dt)
        eng.stepping = False
        self._plan(eng)

    def _prefill_done(self, eng: Engine, rank: Rank, req: Req) -> None:
        key = getattr(req.traj, "shared_key", None)
        if key is not None and not rank.cache_peek(key):
            # The group's first prompt is now in this rank's radix cache.
            rank.cache_put(key, req.traj.shared_tokens)
        if req.resumed:
            # Recompute after a retraction (mixed engine): back to decoding, no new event.
            req.resumed = False
            rank.admit_running(req, req.prompt)
            return
        req.out_done += 1
        req.out_target -= 1
        if eng.role == "mixed":
            self._on_prefill_finished(req, eng, eng)
            if req.out_target <= 0:
                rank.cache_put(req.traj.tid, req.prompt + 1)
                self._on_decode_finished(req, req.out_done)
            else:
                rank.admit_running(req, req.prompt)
            return
        # Prefill engine: the prompt's KV stays cached here; ship it to a decode rank.
        rank.cache_put(req.traj.tid, req.prompt)
        target = self.route_decode()
        self._on_prefill_finished(req, eng, target.engine if target else None)
        if target is None:
            self.orphans.append(req)
            return
        self._ship(req, target)

    def _ship(self, req: Req, target: Rank) -> None:
        target.waiting_tokens += req.prompt
        req.rank = target
        self._inflight[req] = target
        self.at(self.now + self.profile.kv_transfer_time(req.prompt), self._arrive, req, target, self.epoch)

    def _arrive(self, req: Req, rank: Rank, epoch: int) -> None:
        if self._inflight.pop(req, None) is None:
            return  # aborted in flight by a drain (its tokens were released then)
        if not req.alive:
            rank.waiting_tokens -= req.prompt
            return
        # Paused in place (or by retraction), a decode engine takes in what reaches it (it
        # decodes it once the pause is over); paused by aborts, a transfer of the old
        # weights is aborted.
        held = self.pause_keeps and self.paused and rank.engine.switch is None
        if ((epoch != self.epoch and not self.pause_keeps) or not (rank.engine.routable or held)
                or rank.engine.role != "decode"):
            rank.waiting_tokens -= req.prompt
            self._on_aborted(req, gen_total=req.out_done, requeue=True)
            return
        if req.out_target <= 0:
            rank.waiting_tokens -= req.prompt
            self._on_decode_finished(req, req.out_done)
            return
        rank.pending.append(req)
        self.kick(rank.engine)

    # --- hooks (the rollout side) ---------------------------------------------------------

    def _on_prefill_started(self, eng: Engine, req: Req) -> None: ...

    def _on_prefill_finished(self, req: Req, eng: Engine, decode_eng: Engine | None) -> None: ...

    def _on_decode_finished(self, req: Req, output_tokens: int) -> None: ...

    def _on_aborted(self, req: Req, gen_total: int, requeue: bool) -> None: ...

    def _on_switching(self, eng: Engine) -> None: ...

    def _on_switched(self, eng: Engine, sw: dict) -> None: ...
