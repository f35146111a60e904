"""The state of one emulated SGLang instance: role, requests, KV, switch and health.

It mirrors the behaviour the engine agent depends on (SGLang 0.5.23):

* ``/pd_role_switch`` is refused unless ``--enable-pd-role-switch`` is set, the instance
  runs in PD mode, the transfer backend supports it (mooncake, mori), no switch is in
  progress, no earlier switch failed, and the instance is fully idle;
  ``safe_to_restore`` follows ``disaggregation/role_switch.py``.
* a failed teardown/rebuild leaves the instance unhealthy ("restart required").
* ``/health`` answers 503 while starting.

Time: every duration is in *emulated* seconds and is divided by ``speed`` before the
server sleeps, so a test can run an engine 100x faster than real time. Requests run as
independent tasks (not a batched scheduler); a decode step's time depends on the KV
utilisation when it runs, which is what the cost model needs.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal

from .timing import Timing, default_timing

Mode = Literal["null", "prefill", "decode"]
SWITCH_BACKENDS = ("mooncake", "mori")


@dataclass
class EngineOptions:
    """Launch options, named like SGLang's flags."""

    model_path: str = "emulated/model"
    host: str = "127.0.0.1"
    port: int = 30000
    disaggregation_mode: Mode = "null"
    disaggregation_transfer_backend: str = "mooncake"
    disaggregation_bootstrap_port: int = 8998
    enable_pd_role_switch: bool = False
    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    pp_size: int = 1
    max_total_num_tokens: int = 200_000
    max_running_requests: int = 256
    # emulation knobs (not SGLang flags)
    speed: float = 1.0
    startup_seconds: float = 0.0
    switch_seconds: float = 2.0
    decode_cuda_graph_memory_gb: float = 1.5
    fail_switch: bool = False


@dataclass
class Request:
    rid: str
    prompt_tokens: int
    max_new_tokens: int
    cached_tokens: int = 0
    completion_tokens: int = 0
    pinned: bool = False  # ignores abort (a stuck request)
    task: asyncio.Task | None = None
    aborted: bool = False
    created: float = field(default_factory=time.monotonic)


class NotAccepted(Exception):
    """The instance cannot take a generate request now (starting, switching, unhealthy)."""


class EmulatedEngine:
    """One emulated instance. All methods run on the server's event loop."""

    def __init__(self, options: EngineOptions, timing: Timing | None = None):
        self.opt = options
        self.timing = timing or default_timing()
        self.mode: Mode = options.disaggregation_mode
        self.started_at = time.time()
        self._ready_at = time.monotonic() + options.startup_seconds / options.speed
        self.switch_in_progress = False
        self.unhealthy = False
        self.running: dict[str, Request] = {}
        self.waiting: list[Request] = []
        self.generated_tokens = 0
        self.prefill_tokens_total = 0
        self.switches = 0
        self._slot = asyncio.Condition()

    # -- status ------------------------------------------------------------------
    @property
    def starting(self) -> bool:
        return time.monotonic() < self._ready_at

    def healthy(self) -> bool:
        return not self.starting and not self.unhealthy

    def kv_used(self) -> int:
        return sum(r.prompt_tokens + r.completion_tokens for r in self.running.values())

    def token_usage(self) -> float:
        return self.kv_used() / max(1, self.opt.max_total_num_tokens)

    def is_fully_idle(self) -> bool:
        return not self.running and not self.waiting

    async def sleep(self, emulated_seconds: float) -> None:
        await asyncio.sleep(max(0.0, emulated_seconds) / self.opt.speed)

    # -- generate -----------------------------------------------------------------
    async def generate(
        self, rid: str | None, prompt_tokens: int, max_new_tokens: int, *, pinned: bool = False,
        prefill_wait_tokens: int | None = None,
    ) -> dict:
        """Serve one request in the current role; returns SGLang's non-streaming shape."""
        if not self.healthy() or self.switch_in_progress:
            raise NotAccepted("server is not ready" if self.starting else "server is unavailable")
        req = Request(rid or uuid.uuid4().hex, prompt_tokens, max_new_tokens, pinned=pinned)
        self.waiting.append(req)
        t0 = time.monotonic()
        # The work runs in its own task so that an abort cancels it, not the HTTP handler.
        req.task = asyncio.create_task(self._run(req, prefill_wait_tokens))
        try:
            await asyncio.wait({req.task})
        except asyncio.CancelledError:  # the client went away
            req.task.cancel()
            raise
        if req.task.cancelled():
            finish = {"type": "abort", "message": "Abort request"}
        else:
            req.task.result()
            finish = {"type": "length", "length": req.completion_tokens}
        return self._response(req, finish, time.monotonic() - t0)

    async def _run(self, req: Request, prefill_wait_tokens: int | None) -> None:
        try:
            async with self._slot:
                await self._slot.wait_for(lambda: len(self.running) < self.opt.max_running_requests)
                self.waiting.remove(req)
                self.running[req.rid] = req
            await self._serve(req, prefill_wait_tokens)
        finally:
            if req in self.waiting:
                self.waiting.remove(req)
            self.running.pop(req.rid, None)
            async with self._slot:
                self._slot.notify_all()

    async def _serve(self, req: Request, prefill_wait_tokens: int | None) -> None:
        if self.mode == "prefill":
            # A prefill instance emits the first token; the decode peer does the rest.
            await self.sleep(self.timing.prefill_seconds(req.prompt_tokens))
            self.prefill_tokens_total += req.prompt_tokens
            req.completion_tokens = 1
            return
        if self.mode == "decode":
            # Wait for the peer's prefill and the KV transfer, then decode.
            waited = prefill_wait_tokens if prefill_wait_tokens is not None else req.prompt_tokens
            await self.sleep(self.timing.prefill_seconds(waited) + self.timing.kv_transfer_seconds(waited))
        else:
            await self.sleep(self.timing.prefill_seconds(req.prompt_tokens))
            self.prefill_tokens_total += req.prompt_tokens
        while req.completion_tokens < req.max_new_tokens:
            await self.sleep(self.timing.decode_step_seconds(self.token_usage()))
            req.completion_tokens += 1
            self.generated_tokens += 1

    def _response(self, req: Request, finish: dict, seconds: float) -> dict:
        return {
            "text": " tok" * req.completion_tokens,
            "output_ids": list(range(req.completion_tokens)),
            "meta_info": {
                "id": req.rid,
                "finish_reason": finish,
                "prompt_tokens": req.prompt_tokens,
                "completion_tokens": req.completion_tokens,
                "cached_tokens": req.cached_tokens,
                "e2e_latency": seconds * self.opt.speed,
            },
        }

    # -- control ----------------------------------------------------------------------
    def abort(self, rid: str | None, abort_all: bool) -> int:
        """Abort one request or all; pinned (stuck) requests ignore it. Returns how many."""
        n = 0
        for req in list(self.running.values()) + list(self.waiting):
            if req.pinned or not (abort_all or req.rid == rid):
                continue
            if req.task is not None and not req.task.done():
                req.aborted = True
                req.task.cancel()
                n += 1
        return n

    def flush_cache(self) -> bool:
        return self.is_fully_idle()

    async def role_switch(self, new_role: str, graph_gb: float | None) -> tuple[int, dict]:
        """``POST /pd_role_switch``: (HTTP status, body) as SGLang 0.5.23 answers."""
        old = self.mode

        def out(success: bool, message: str, safe: bool = False) -> tuple[int, dict]:
            body = {
                "rid": None, "http_worker_ipc": None, "success": success, "message": message,
                "old_role": old, "new_role": new_role, "safe_to_restore": safe,
            }
            return (200 if success else 400), body

        if not self.opt.enable_pd_role_switch:
            return out(False, "--enable-pd-role-switch is not set on this server", True)
        if self.unhealthy:
            return out(False, "instance is unhealthy after a failed role switch; restart required")
        if self.switch_in_progress:
            return out(False, "another role switch is already in progress")
        if new_role not in ("prefill", "decode"):
            return out(False, f"invalid new_role={new_role!r}", True)
        if self.mode == "null":
            return out(False, "instance is not running in PD disaggregation mode", True)
        if self.opt.disaggregation_transfer_backend not in SWITCH_BACKENDS:
            return out(False, f"transfer backend {self.opt.disaggregation_transfer_backend!r} "
                       "does not support runtime role switch", True)
        if new_role == old:
            return out(True, "already in target role")
        if not self.is_fully_idle():
            return out(False, "instance is not idle; drain all requests before switching", True)
        if graph_gb is not None and graph_gb < 0:
            return out(False, "decode_cuda_graph_memory_gb must be non-negative", True)
        self.switch_in_progress = True
        try:
            await self.sleep(self.opt.switch_seconds)
            if self.opt.fail_switch:
                self.unhealthy = True
                return out(False, "role switch failed; instance unhealthy, restart required: "
                           "emulated teardown failure")
            self.mode = new_role  # type: ignore[assignment]
            self.switches += 1
            return out(True, "ok")
        finally:
            self.switch_in_progress = False
