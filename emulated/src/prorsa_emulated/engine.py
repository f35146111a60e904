"""The state of one emulated SGLang instance: role, scheduler, KV, switch and health.

It mirrors the behaviour the engine agent depends on (SGLang 0.5.23): ``/health`` answers
503 while starting; ``/pd_role_switch`` (:mod:`.roleswitch`) refuses and fails as SGLang
does, and a failed teardown/rebuild leaves the instance unhealthy ("restart required").

Requests are served by a batched scheduler (``scheduler.py``) whose step times come from
the cost-model profile named by ``--emulated-model`` (``profiles.py``). Time: every
duration is in *emulated* seconds and is divided by ``speed`` before the server sleeps, so
a test can run an engine 100x faster than real time.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import aiohttp

from .options import EngineOptions, Mode
from .pd import BootstrapServer, PdLink, RoomBoard
from .prefix_cache import PAGE
from .profiles import emulated_profile, prefill_seconds
from .scheduler import EngineStep, Rank, Req, plan_step, steps_done

MAX_LAG_WALL_S = 0.05
"""CHOICE: how far (wall seconds) a step may start in the past to make up for the loop's own
CPU time (the next step starts where the last one ended, not when the loop got round to
it); beyond that the engine is behind (CPU-starved) and restarts its clock from now."""


log = logging.getLogger("prorsa.emulated")


def _log_crash(task: asyncio.Task) -> None:
    # A scheduler bug must be loud: the next request restarts the loop.
    if not task.cancelled() and task.exception() is not None:
        log.error("emulated scheduler loop crashed", exc_info=task.exception())



# SGLang's floor of the requests one data-parallel worker may run when
# --max-running-requests is not given: sglang/srt/model_executor/model_runner.py
# (resolve_max_num_reqs) takes token_capacity / context_len * 512 clamped to
# [2048, 4096], then at most token_capacity // 2. The profiles carry no context length, so
# the floor of that clamp is taken: at these capacities the cap is a KV budget, not a
# request count.
SGLANG_MIN_MAX_RUNNING = 2048


def max_running_per_rank(requested: int | None, capacity_per_rank: int, ranks: int) -> int:
    """Requests one attention-DP rank may run, as SGLang resolves it: ``requested`` (the
    engine's --max-running-requests) split over the ranks, else SGLang's default; never
    more than half the rank's KV tokens."""
    want = SGLANG_MIN_MAX_RUNNING if requested is None else requested // max(ranks, 1)
    return max(1, min(want, capacity_per_rank // 2))

class NotAccepted(Exception):
    """The instance cannot take a generate request now (starting, switching, unhealthy)."""


class EmulatedEngine:
    """One emulated instance. All methods run on the server's event loop."""

    def __init__(self, options: EngineOptions):
        self.opt = options
        self.profile = emulated_profile(options.emulated_model)
        if options.switch_seconds is None:
            options.switch_seconds = self.profile.in_place_switch_s
        self.mode: Mode = options.disaggregation_mode
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._ready_at = self._t0 + options.startup_seconds / options.speed
        self.switch_in_progress = False
        self.unhealthy = False
        self.switches = 0
        n = self.profile.attn_dp
        total = options.max_total_num_tokens or self.profile.kv_capacity_tokens
        self.chunk = options.chunked_prefill_size or self.profile.chunk_size
        per_rank = max_running_per_rank(options.max_running_requests, total // n, n)
        self.ranks = [Rank(i, total // n, per_rank) for i in range(n)]
        self.generated_tokens = 0
        self.busy_s = 0.0
        """Emulated seconds the engine spent stepping (any rank busy)."""
        self.prefill_steps = 0
        self.steps = 0
        self.behind_s = 0.0
        """Emulated seconds the loop fell behind the cost model (a starved CPU) and dropped:
        the engine ran that much slower than its profile says."""
        self.rooms = RoomBoard()
        self.bootstrap = BootstrapServer(self.rooms, options.host, options.disaggregation_bootstrap_port)
        self._wake = asyncio.Event()
        self.paused: str | None = None
        """The mode of the ``pause_generation`` in force (None: generating)."""
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._halted = asyncio.Event()
        """Set while paused and the scheduler loop stands still (at a step boundary)."""
        self._loop_task: asyncio.Task | None = None
        self._client: aiohttp.ClientSession | None = None

    # -- status ------------------------------------------------------------------
    @property
    def starting(self) -> bool:
        return time.monotonic() < self._ready_at

    def healthy(self) -> bool:
        return not self.starting and not self.unhealthy

    def now(self) -> float:
        """Emulated seconds since start."""
        return (time.monotonic() - self._t0) * self.opt.speed

    @property
    def capacity_tokens(self) -> int:
        return sum(r.capacity for r in self.ranks)

    @property
    def max_input_tokens(self) -> int:
        """The longest prompt a request may have: one DP rank's KV pool less one token
        (SGLang's ``max_req_input_len`` when the context length is not the smaller)."""
        return min(r.capacity for r in self.ranks) - 1

    def kv_used(self) -> int:
        return sum(r.used_tokens() for r in self.ranks)

    def is_fully_idle(self) -> bool:
        return all(r.idle() for r in self.ranks)

    async def serve_bootstrap(self) -> None:
        """Start the bootstrap server if this instance is (now) a prefill one; it keeps
        answering for its rooms after a switch to decode."""
        if self.opt.serve_bootstrap and self.mode == "prefill":
            await self.bootstrap.start()

    async def aclose(self) -> None:
        """Close the bootstrap server and the PD long-poll session (server shutdown)."""
        await self.bootstrap.stop()
        if self._client is not None:
            await self._client.close()
            self._client = None

    async def sleep(self, emulated_seconds: float) -> None:
        await asyncio.sleep(max(0.0, emulated_seconds) / self.opt.speed)

    # -- generate -----------------------------------------------------------------
    async def generate(self, rid: str | None, keys: list[int], out_keys, prompt_tokens: int,
                       max_new_tokens: int, *, pinned: bool = False, pd: PdLink | None = None,
                       first: asyncio.Future | None = None) -> dict:
        """Serve one request in the current role; returns SGLang's non-streaming shape.
        ``keys``/``out_keys``: page keys of the prompt, and of prompt + n outputs. ``first``
        (for a streamed answer) is resolved when the first output token exists, with the
        meta_info of a first streamed chunk."""
        if not self.healthy() or self.switch_in_progress:
            if pd is not None and self.mode == "prefill":  # its decode peer must not wait
                self.rooms.done(pd.room, {"ok": False, "message": "prefill refused the request"})
            raise NotAccepted("server is not ready" if self.starting else "server is unavailable")
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._loop())
            self._loop_task.add_done_callback(_log_crash)
        fut = asyncio.get_running_loop().create_future()
        req = Req(rid or uuid.uuid4().hex, keys, out_keys, prompt_tokens, max_new_tokens, fut,
                  pinned=pinned, queued_at=self.now(), first=first)
        rank = self._pick_rank(keys)
        req.rank = rank.index
        if self.mode == "decode":
            req.phase = "prealloc"
            rank.prealloc.append(req)
            req.pd = pd
            # Reserve KV and start waiting for the peer at once, not at the loop's next
            # plan: SGLang's scheduler polls every GPU step (milliseconds), while this
            # loop may be sleeping through a run of decode steps.
            rank._admit_decode()
            self._start_transfers(rank)
        else:
            rank.waiting.append(req)
            if self.mode == "prefill" and pd is not None:
                req.room = pd.room
        self._wake.set()
        try:
            finish = await asyncio.shield(fut)
        except asyncio.CancelledError:  # the client went away: SGLang aborts the request
            self._abort_req(req)
            raise
        return self._response(req, finish)

    def _pick_rank(self, keys: list[int]) -> Rank:
        """Attention DP rank, as the simulator routes (``engines.route_prefill``): the least
        loaded; in ``prefix`` routing, the rank holding the longest cached prefix instead
        when it is no more loaded once the cached tokens are counted off."""
        best = min(self.ranks, key=lambda r: (r.load(), r.index))
        if self.mode == "decode" or self.opt.emulated_dp_routing != "prefix":
            return best
        sticky = max(self.ranks, key=lambda r: (r.cache.match_len(keys), -r.index))
        hit = sticky.cache.match_len(keys) * PAGE
        if sticky is not best and hit and sticky.load() - hit <= best.load():
            return sticky
        return best

    def _response(self, req: Req, finish: dict) -> dict:
        now = self.now()
        started = req.started_at if req.started_at is not None else now
        return {
            "text": " tok" * req.completion,
            "output_ids": list(range(req.completion)),
            "meta_info": {
                "id": req.rid,
                "finish_reason": finish,
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": req.completion,
                "cached_tokens": req.cached_tokens,
                "queue_time": max(0.0, started - req.queued_at),
                "e2e_latency": now - req.queued_at,
            },
        }

    # -- the scheduler loop ------------------------------------------------------------
    async def _loop(self) -> None:
        end: float | None = None  # emulated time the last step ended (None after idling)
        while True:
            if self.paused is not None:
                # SGLang's event loop takes requests in but runs no batch while paused.
                self._halted.set()
                self._wake.clear()
                await self._wake.wait()
                end = None
                continue
            now = self.now()
            step = plan_step(self.ranks, self.profile, self.chunk, self.mode, now)
            for rank in self.ranks:
                self._start_transfers(rank)
            if step is None:
                self._wake.clear()
                await self._wake.wait()
                end = None
                continue
            t0 = now
            if end is not None:
                t0 = max(end, now - MAX_LAG_WALL_S * self.opt.speed)
                self.behind_s += t0 - end  # time the model lost to a CPU-starved loop
            self._wake.clear()
            done = step.k
            if step.k > 1:  # a run of decode steps: new work cuts it at a step boundary
                timeout = (t0 + step.k * step.dt - self.now()) / self.opt.speed
                try:
                    await asyncio.wait_for(self._wake.wait(), max(0.0, timeout))
                    done = steps_done(step, self.now() - t0)
                except asyncio.TimeoutError:
                    pass
            end = t0 + done * step.dt
            await self.sleep(end - self.now())
            self._apply(step, done)

    def _start_transfers(self, rank: Rank) -> None:
        for req in rank.transfer:
            if req.task is None:
                req.task = asyncio.create_task(self._receive_kv(rank, req))

    def _apply(self, step: EngineStep, done: int) -> None:
        """Settle a step: ``done`` of its ``k`` steps happened."""
        secs = done * step.dt
        self.busy_s += secs
        self.steps += done
        if step.any_prefill:
            self.prefill_steps += 1
        for rank, plan in step.plans:
            if plan.prefill:
                rank.prefill_busy_s += secs
            for req, n in plan.prefill:
                if req.phase != "prefill":
                    continue  # aborted during the step
                req.prefilled += n
                rank.prefill_tokens_total += n
                if req.remaining_prefill == 0:
                    if rank.chunked is req:
                        rank.chunked = None
                    rank.prefilling.remove(req)
                    self._prefill_done(rank, req)
            if plan.kind != "decode":
                continue
            rank.private -= plan.steps * len(plan.decode)  # the run's reservation goes back ...
            made = 0
            for req in plan.decode:
                if req.phase != "running":
                    continue  # aborted or retracted meanwhile: its KV was released
                rank.private += done  # ... and each request keeps what it generated
                req.private += done
                req.completion += done
                made += done
                if req.completion >= req.max_new:
                    self._finish(rank, req)
            self.generated_tokens += made
            rank.last_gen_throughput = made / secs if secs > 0 else 0.0

    @staticmethod
    def _first_token(req: Req) -> None:
        """The request's first output token exists: a streamed answer sends its first chunk."""
        if req.first is not None and not req.first.done():
            req.first.set_result({"id": req.rid, "finish_reason": None, "prompt_tokens": req.prompt_tokens,
                                  "completion_tokens": max(req.completion, 1), "cached_tokens": req.cached_tokens})

    def _prefill_done(self, rank: Rank, req: Req) -> None:
        if self.mode == "prefill":
            req.completion, req.phase = 1, "inflight"
            self._first_token(req)
            rank.inflight.append(req)
            if req.room is not None:
                self.rooms.done(req.room, {"ok": True, "cached_tokens": req.cached_tokens})
            req.task = asyncio.create_task(self._send_kv(rank, req))
            return
        if req.completion == 0:  # the prefill forward samples the first token
            req.completion = 1
            rank.private += 1
            req.private += 1
        self._first_token(req)
        if req.completion >= req.max_new:
            self._finish(rank, req)
        else:
            req.phase = "running"
            rank.running.append(req)

    def _finish(self, rank: Rank, req: Req, finish: dict | None = None) -> None:
        if finish is None and self.mode != "decode":
            rank.cache.insert(req.out_keys(req.completion))
        req.phase = "done"
        rank.remove(req)
        if req.first is not None and not req.first.done():
            req.first.set_result(None)  # no first chunk before the answer (an abort, a refusal)
        if not req.future.done():
            req.future.set_result(finish or {"type": "length", "length": req.completion})
        self._wake.set()

    async def _send_kv(self, rank: Rank, req: Req) -> None:
        """Prefill side: hold the KV while it is sent, then cache the prompt."""
        await self.sleep(self.profile.kv_transfer_time(req.prompt_tokens))
        if req.phase == "inflight":
            self._finish(rank, req)

    async def _receive_kv(self, rank: Rank, req: Req) -> None:
        """Decode side: wait for the peer's prefill, then the transfer, then decode."""
        link: PdLink | None = req.pd  # type: ignore[assignment]
        try:
            if link is not None and link.kv_url:
                if self._client is None:
                    # No pool limit: every request in transfer holds one long poll. aiohttp,
                    # not httpx, whose pool slows down with hundreds of requests in flight.
                    self._client = aiohttp.ClientSession(
                        connector=aiohttp.TCPConnector(limit=0),
                        timeout=aiohttp.ClientTimeout(total=None, connect=5.0))
                async with self._client.get(link.kv_url) as r:
                    got = await r.json(content_type=None) if r.status == 200 else {"ok": False}
            else:  # no peer to ask: assume its prefill ran alone
                await self.sleep(prefill_seconds(self.profile, req.prompt_tokens))
                got = {"ok": True, "cached_tokens": 0}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            got = {"ok": False}
        if not isinstance(got, dict):
            got = {"ok": False}
        if req.phase != "transfer":
            return
        if not got.get("ok"):
            self._finish(rank, req, {"type": "abort", "message": "KV transfer failed: prefill peer aborted"})
            return
        req.cached_tokens = int(got.get("cached_tokens") or 0)
        await self.sleep(self.profile.kv_transfer_time(req.prompt_tokens))
        if req.phase != "transfer":
            return
        # A paused scheduler does not poll its transfer queue: the request joins the
        # running batch (and its first token goes out) once generation continues.
        await self._resumed.wait()
        if req.phase != "transfer":
            return
        rank.transfer.remove(req)
        req.completion = max(req.completion, 1)
        req.started_at = self.now()
        self._first_token(req)
        if req.completion >= req.max_new:
            self._finish(rank, req)
        else:
            req.phase = "running"
            rank.running.append(req)
            self._wake.set()

    # -- control ----------------------------------------------------------------------
    def _abort_req(self, req: Req) -> None:
        if req.phase == "done":
            return
        rank = self.ranks[req.rank]
        if req.room is not None:
            self.rooms.done(req.room, {"ok": False})
        if req.task is not None and not req.task.done():
            req.task.cancel()
        self._finish(rank, req, {"type": "abort", "message": "Abort request"})

    def abort(self, rid: str | None, abort_all: bool) -> int:
        """Abort one request or all; pinned (stuck) requests ignore it. Returns how many."""
        n = 0
        for rank in self.ranks:
            for req in rank.requests():
                if req.pinned or not (abort_all or req.rid == rid):
                    continue
                self._abort_req(req)
                n += 1
        return n

    def pause(self, mode: str) -> int:
        """``POST /pause_generation {mode}`` as SGLang's scheduler takes it: no batch runs
        until :meth:`resume`; ``abort`` aborts every request, ``retract`` frees the KV of
        every request being prefilled or decoded (a mixed or prefill rank re-prefills it,
        its prefix from the cache where it is still there; a PD decode rank parks it and
        takes its KV back before decoding on), ``in_place`` keeps everything as it is (a
        decode step under way ends first). Returns the requests aborted or retracted."""
        n = 0
        if mode == "abort":
            n = self.abort(None, True)
        elif mode == "retract":
            for rank in self.ranks:
                n += rank.retract_all(self.mode)
        self.paused = mode
        self._resumed.clear()
        self._wake.set()  # a run of decode steps stops at the next step boundary
        return n

    async def halted(self) -> None:
        """Once paused, the scheduler loop stands still: the step under way has ended (SGLang
        takes ``pause_generation`` in its event loop between batches, and answers then).
        Returns at once if generation continued meanwhile, or if the loop does not run
        (it starts with the first request)."""
        while (self.paused is not None and not self._halted.is_set()
               and self._loop_task is not None and not self._loop_task.done()):
            waits = [asyncio.ensure_future(self._halted.wait()), asyncio.ensure_future(self._resumed.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()

    def resume(self) -> None:
        """``POST /continue_generation``."""
        self.paused = None
        self._halted.clear()
        self._resumed.set()
        self._wake.set()

    def flush_cache(self) -> bool:
        if not self.is_fully_idle():
            return False
        for r in self.ranks:
            r.cache.clear()
        return True
