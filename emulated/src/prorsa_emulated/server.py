"""The emulated SGLang HTTP server (FastAPI): the endpoints the engine agent uses, with the
request and response shapes of SGLang 0.5.23 (``sglang/srt/entrypoints/http_server.py``,
``entrypoints/v1_loads.py``, ``managers/load_snapshot.py``, ``managers/io_struct.py``).

Endpoints under ``/_emu/`` are test controls that SGLang does not have.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import datetime, timezone
from typing import Any, Literal, Optional

from fastapi import Body, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .engine import EmulatedEngine, NotAccepted
from .options import EngineOptions
from .roleswitch import role_switch
from .pd import MAX_WAIT_S, PdLink
from .weights import add_weight_routes
from .prefix_cache import page_keys, parse_emulated_prompt, synthetic_keys

VERSION = "0.5.23"
VALID_SECTIONS = {"core", "memory", "spec", "lora", "disagg", "queues", "all"}


class GenerateReq(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: Optional[Any] = None
    input_ids: Optional[list[int]] = None
    sampling_params: Optional[dict] = None
    rid: Optional[str] = None
    stream: bool = False
    bootstrap_host: Optional[str] = None
    bootstrap_port: Optional[int] = None
    bootstrap_room: Optional[int] = None


class PdRoleSwitchReq(BaseModel):
    new_role: Literal["prefill", "decode", ""] = ""
    decode_cuda_graph_bs: Optional[list[int]] = None
    decode_cuda_graph_memory_gb: Optional[float] = None
    prepare_only: bool = False
    rid: Optional[str] = None


class EmuConfigReq(BaseModel):
    """``POST /_emu/config`` (not SGLang: the emulation's run-time knobs)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    switch_seconds: Optional[float] = Field(default=None, ge=0)
    fail_switch: Optional[bool] = None
    speed: Optional[float] = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _not_null(self) -> "EmuConfigReq":
        if any(getattr(self, k) is None for k in self.model_fields_set):
            raise ValueError(f"a knob cannot be null: {sorted(self.model_fields_set)}")
        return self


class AbortReq(BaseModel):
    rid: Optional[str] = ""
    abort_all: bool = False


def _too_long(n: int, max_input: int) -> HTTPException:
    # SGLang's scheduler answers an input no DP rank's KV pool can hold in the same words
    # (max_req_input_len: the pool's token capacity less one).
    return HTTPException(400, f"Input length ({n} tokens) exceeds the maximum allowed length ({max_input} tokens). "
                              "Use a shorter input or enable --allow-auto-truncate.")


def _prompt(req: GenerateReq, max_input: int) -> tuple[int, list[int], object]:
    """(prompt tokens, page keys, keys of prompt + n outputs) of a generate request.

    Tokens are ``input_ids``, or the words of ``text``; a prompt known only by length has
    synthetic tokens named by its conversation (turns of one conversation share them): a
    ``text`` made by ``emulated_prompt_text`` (what the driver sends; it passes any router),
    or the fields ``prompt_tokens`` and ``emulated_prefix_id`` (without it, by ``rid``).

    A prompt longer than ``max_input`` tokens (what one DP rank's KV pool holds, less one) is
    refused with 400 before any key is built: queued, it would wait at the head of its
    rank's queue for room that never comes, and every request behind it with it."""
    extra = req.model_extra or {}
    emulated = parse_emulated_prompt(req.text)
    if emulated is not None:
        pid, n = emulated
        if n > max_input:
            raise _too_long(n, max_input)
        return n, synthetic_keys(pid, n), lambda k: synthetic_keys(pid, n + k)
    if req.input_ids is not None or isinstance(req.text, str):
        tokens: list = list(req.input_ids) if req.input_ids is not None else req.text.split()
        if not tokens:
            tokens = [""]
        if len(tokens) > max_input:
            raise _too_long(len(tokens), max_input)
        return len(tokens), page_keys(tokens), lambda n: page_keys(tokens + list(range(n)))
    n = extra.get("prompt_tokens")
    if isinstance(n, int) and not isinstance(n, bool) and n >= 1:
        if n > max_input:
            raise _too_long(n, max_input)
        pid = str(extra.get("emulated_prefix_id") or req.rid or uuid.uuid4().hex)
        return n, synthetic_keys(pid, n), lambda k: synthetic_keys(pid, n + k)
    raise HTTPException(400, "Either text or input_ids should be provided.")


SSE_DONE = b"data: [DONE]\n\n"
"""The last server-sent event of a streamed SGLang answer."""


def sse(obj: object) -> bytes:
    """One server-sent event of a streamed SGLang answer: ``data: {json}``."""
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


async def _stream(first: asyncio.Future, task: asyncio.Task):
    """The chunks of a streamed answer (see ``generate``); a client that leaves cancels it."""
    try:
        await asyncio.wait({first, task}, return_when=asyncio.FIRST_COMPLETED)
        meta = first.result() if first.done() else None
        if meta is not None and not task.done():
            yield sse({"text": " tok", "output_ids": [0], "meta_info": meta})
        try:
            yield sse(await task)
        except NotAccepted as exc:
            yield sse({"error": {"message": str(exc)}})
        yield SSE_DONE
    finally:
        if not task.done():
            task.cancel()  # the client went away: the engine aborts the request


def create_engine_app(options: EngineOptions, engine: EmulatedEngine | None = None) -> FastAPI:
    """The FastAPI app of one emulated SGLang instance."""
    eng = engine or EmulatedEngine(options)
    capacity = eng.capacity_tokens
    app = FastAPI(title="emulated sglang", version=VERSION)
    app.state.engine = eng

    @app.on_event("startup")
    async def _bootstrap() -> None:
        await eng.serve_bootstrap()  # a taken bootstrap port fails the start, as in SGLang

    @app.on_event("shutdown")
    async def _close() -> None:
        await eng.aclose()

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200 if eng.healthy() else 503)

    @app.get("/model_info")
    @app.get("/get_model_info")
    async def model_info() -> dict:
        return {
            "model_path": options.model_path,
            "served_model_name": options.model_path,
            "tokenizer_path": options.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": options.weight_version,
            "load_format": "auto",
            "reasoning_parser": None,
            "tool_call_parser": None,
            "disaggregation_mode": eng.mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "emulated",
            "architectures": ["EmulatedForCausalLM"],
        }

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict:
        graph = {"decode": options.decode_cuda_graph_memory_gb if eng.mode == "decode" else 0.0}
        return {
            "model_path": options.model_path,
            "host": options.host,
            "port": options.port,
            "tp_size": options.tp_size,
            "dp_size": options.dp_size,
            "ep_size": options.ep_size,
            "pp_size": options.pp_size,
            "disaggregation_mode": options.disaggregation_mode,
            "disaggregation_transfer_backend": options.disaggregation_transfer_backend,
            "disaggregation_bootstrap_port": options.disaggregation_bootstrap_port,
            "enable_pd_role_switch": options.enable_pd_role_switch,
            "max_total_num_tokens": capacity,
            "chunked_prefill_size": eng.chunk,
            "emulated_model": eng.profile.name,
            "max_running_requests": sum(r.max_running for r in eng.ranks),
            "startup_time": eng.started_at,
            "internal_states": [
                {
                    "world_size": options.tp_size * options.pp_size,
                    "last_gen_throughput": 0.0,
                    "memory_usage": {
                        "weight": 10.0, "kvcache": 20.0, "startup_available": 40.0,
                        "token_capacity": capacity,
                        "token_capacity_swa": None, "graph": graph,
                    },
                    "disaggregation_mode": eng.mode,
                    "decode_cuda_graph_bs": [1, 2, 4, 8] if eng.mode == "decode" else [],
                    "decode_cuda_graph_memory_gb": graph["decode"],
                }
            ],
            "version": VERSION,
            "frontend": "python",
        }

    @app.get("/v1/loads")
    async def loads(
        include: Optional[str] = None, dp_rank: Optional[int] = None, format: Optional[str] = None
    ) -> Any:
        sections = {s.strip() for s in include.split(",")} if include else None
        if sections is not None and not sections <= VALID_SECTIONS:
            raise HTTPException(
                400,
                f"Invalid include sections: {sections - VALID_SECTIONS}. "
                f"Valid options: {sorted(VALID_SECTIONS)}",
            )
        if dp_rank is not None and not 0 <= dp_rank < len(eng.ranks):
            raise HTTPException(400, f"dp_rank {dp_rank} out of range")
        disagg = sections is None or "all" in sections or "disagg" in sections
        loads = [_rank_load(eng, r, disagg) for r in eng.ranks if dp_rank in (None, r.index)]
        return {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "version": VERSION,
            "accelerator": "Emulated GPU",
            "num_accelerators": options.tp_size * options.pp_size,
            "loads": loads,
        }

    @app.post("/generate")
    @app.put("/generate")
    async def generate(req: GenerateReq) -> Any:
        n_prompt, keys, out_keys = _prompt(req, eng.max_input_tokens)
        params = req.sampling_params or {}
        max_new = params.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or isinstance(max_new, bool) or max_new < 0:
            return JSONResponse({"error": {"message": "max_new_tokens must be a non-negative int"}}, 400)
        extra = req.model_extra or {}
        pd = None
        if req.bootstrap_room is not None:
            pd = PdLink(req.bootstrap_room, req.bootstrap_host, req.bootstrap_port)
        pinned = bool(extra.get("emulated_pinned", False))
        if not req.stream:
            try:
                return await eng.generate(req.rid, keys, out_keys, n_prompt, max_new, pinned=pinned, pd=pd)
            except NotAccepted as exc:
                return JSONResponse({"error": {"message": str(exc)}}, 503)
        # Streamed (SGLang's `stream: true`): server-sent events, `data: {chunk}` with the
        # text so far, a chunk when the first output token exists (after the prefill, or on
        # a decode engine after the KV transfer) and the full answer at the end, then
        # `data: [DONE]`; an error after the stream began is a `data: {"error": ...}` chunk.
        # The headers go out at once (a PD router waits for them from both halves); a refusal
        # known now is a status, one found later an error chunk.
        first: asyncio.Future = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(eng.generate(req.rid, keys, out_keys, n_prompt, max_new, pinned=pinned,
                                                pd=pd, first=first))
        await asyncio.sleep(0)  # let it start: a refusal is raised before its first await
        if task.done() and isinstance(task.exception(), NotAccepted):
            return JSONResponse({"error": {"message": str(task.exception())}}, 503)
        return StreamingResponse(_stream(first, task), media_type="text/event-stream")

    add_weight_routes(app, options, eng)  # /update_weights_from_disk, /ready, pause (weights.py)

    @app.post("/abort_request")
    async def abort_request(obj: AbortReq = Body(...)) -> Response:
        eng.abort(obj.rid, obj.abort_all)
        return Response(status_code=200)

    @app.api_route("/flush_cache", methods=["GET", "POST"])
    async def flush_cache(timeout: float = Query(0.0, ge=0.0)) -> Response:
        if eng.flush_cache():
            return Response("Cache flushed.\nPlease check backend logs for more details. "
                            "(When there are running or waiting requests, the operation will "
                            "not be performed.)\n", 200)
        return Response("Flush cache failed.\n", 400)

    @app.post("/pd_role_switch")
    async def pd_role_switch(obj: PdRoleSwitchReq = Body(...)) -> JSONResponse:
        status, body = await role_switch(eng, obj.new_role, obj.decode_cuda_graph_memory_gb)
        return JSONResponse(body, status)

    # -- test controls and PD pairing (not SGLang) ------------------------------------------
    @app.get("/_emu/kv/{room}")
    async def emu_kv(room: int, timeout: float = Query(600.0, gt=0.0, le=MAX_WAIT_S)) -> dict:
        """Answers when this prefill engine's request of ``room`` is prefilled (see pd.py)."""
        return await eng.rooms.wait(room, timeout)

    @app.get("/_emu/stats")
    async def emu_stats() -> dict:
        """Emulation health: engine steps, emulated seconds spent stepping, and the emulated
        seconds the loop fell behind its cost model (a CPU-starved host; 0 when it kept up)."""
        return {"now_s": round(eng.now(), 3), "steps": eng.steps, "prefill_steps": eng.prefill_steps,
                "busy_s": round(eng.busy_s, 3), "behind_s": round(eng.behind_s, 3),
                "emulated_model": eng.profile.name, "speed": options.speed}

    @app.post("/_emu/config")
    async def emu_config(body: EmuConfigReq = Body(...)) -> dict:
        """Change emulation knobs at run time: switch_seconds, fail_switch, speed (a knob
        of the wrong type, out of range or unknown: 422, nothing changed)."""
        for key, value in body.model_dump(exclude_unset=True).items():
            setattr(options, key, value)
        return {"switch_seconds": options.switch_seconds, "fail_switch": options.fail_switch,
                "speed": options.speed}

    return app


def _rank_load(eng: EmulatedEngine, r, disagg: bool) -> dict:
    """One DP rank's entry of ``/v1/loads`` (SGLang's LoadSnapshot keys)."""
    # SGLang answers between forward passes, where a request this forward prefills is in the
    # running batch, the inflight queue or the chunked slot; here a reading can fall inside a
    # forward, so the requests it prefills (the chunked one among them) count as running.
    running = len(r.running) + len(r.inflight) + len(r.prefilling)
    load = {
        "timestamp": datetime.now(timezone.utc).timestamp(),
        "dp_rank": r.index,
        "num_running_reqs": running,
        "num_waiting_reqs": len(r.waiting),
        "num_waiting_uncached_tokens": sum(q.prompt_tokens + q.completion for q in r.waiting),
        "num_used_tokens": r.used_tokens(),
        "num_total_tokens": r.private + r.cache.tokens,
        "num_active_tokens": sum(q.prompt_tokens + q.completion for q in r.running),
        "num_prealloc_ready_tokens": 0,
        "max_total_num_tokens": r.capacity,
        "max_running_requests": r.max_running,
        "token_usage": round(r.used_tokens() / max(1, r.capacity), 4),
        # Per wall second, as a client reads any rate off this server: the engine runs
        # ``speed`` emulated seconds per wall second.
        "gen_throughput": round(r.last_gen_throughput * eng.opt.speed, 3),
        "cache_hit_rate": round(r.cached_tokens_total / r.prompt_tokens_total, 4)
        if r.prompt_tokens_total else 0.0,
        "utilization": min(1.0, running / max(1, r.max_running)),
        "total_prefill_uncached_tokens": r.prefill_tokens_total,
        # Wall microseconds, as every rate a client derives from this server is per wall second.
        "total_prefill_busy_us": int(r.prefill_busy_s / eng.opt.speed * 1e6),
        "decode_moments": None,
    }
    if disagg:
        load["disaggregation"] = {
            "mode": eng.mode, "prefill_bootstrap_queue_reqs": 0,
            "prefill_inflight_queue_reqs": len(r.inflight),
            "decode_prealloc_queue_reqs": len(r.prealloc),
            "decode_transfer_queue_reqs": len(r.transfer),
            "decode_retracted_queue_reqs": len(r.retracted),
            "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0,
        }
    return load
