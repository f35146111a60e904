"""The emulated SGLang HTTP server (FastAPI): the endpoints the engine agent uses, with the
request and response shapes of SGLang 0.5.23 (``sglang/srt/entrypoints/http_server.py``,
``entrypoints/v1_loads.py``, ``managers/load_snapshot.py``, ``managers/io_struct.py``).

Endpoints under ``/_emu/`` are test controls that SGLang does not have.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Literal, Optional

from fastapi import Body, FastAPI, HTTPException, Query
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict

from .engine import EmulatedEngine, EngineOptions, NotAccepted

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


class AbortReq(BaseModel):
    rid: Optional[str] = ""
    abort_all: bool = False


def _prompt_tokens(req: GenerateReq) -> int:
    if req.input_ids is not None:
        return len(req.input_ids)
    if isinstance(req.text, str):
        return max(1, len(req.text.split()))
    # Emulation convenience: an explicit length without real text.
    extra = req.model_extra or {}
    n = extra.get("prompt_tokens")
    if isinstance(n, int) and n >= 0:
        return n
    raise HTTPException(400, "Either text or input_ids should be provided.")


def create_engine_app(options: EngineOptions, engine: EmulatedEngine | None = None) -> FastAPI:
    """The FastAPI app of one emulated SGLang instance."""
    eng = engine or EmulatedEngine(options)
    app = FastAPI(title="emulated sglang", version=VERSION)
    app.state.engine = eng

    @app.get("/health")
    @app.get("/health_generate")
    async def health() -> Response:
        return Response(status_code=200 if eng.healthy() else 503)

    @app.get("/model_info")
    async def model_info() -> dict:
        return {
            "model_path": options.model_path,
            "served_model_name": options.model_path,
            "tokenizer_path": options.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
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
            "max_total_num_tokens": options.max_total_num_tokens,
            "max_running_requests": options.max_running_requests,
            "startup_time": eng.started_at,
            "internal_states": [
                {
                    "world_size": options.tp_size * options.pp_size,
                    "last_gen_throughput": 0.0,
                    "memory_usage": {
                        "weight": 10.0, "kvcache": 20.0, "startup_available": 40.0,
                        "token_capacity": options.max_total_num_tokens,
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
        load = {
            "timestamp": datetime.now(timezone.utc).timestamp(),
            "dp_rank": 0,
            "num_running_reqs": len(eng.running),
            "num_waiting_reqs": len(eng.waiting),
            "num_waiting_uncached_tokens": sum(r.prompt_tokens for r in eng.waiting),
            "num_used_tokens": eng.kv_used(),
            "num_total_tokens": eng.kv_used(),
            "num_active_tokens": eng.kv_used(),
            "num_prealloc_ready_tokens": 0,
            "max_total_num_tokens": options.max_total_num_tokens,
            "max_running_requests": options.max_running_requests,
            "token_usage": round(eng.token_usage(), 4),
            "gen_throughput": 0.0,
            "cache_hit_rate": 0.0,
            "utilization": min(1.0, len(eng.running) / max(1, options.max_running_requests)),
            "total_prefill_uncached_tokens": eng.prefill_tokens_total,
            "total_prefill_busy_us": 0,
            "decode_moments": None,
        }
        if sections is None or "all" in sections or "disagg" in sections:
            load["disaggregation"] = {
                "mode": eng.mode, "prefill_bootstrap_queue_reqs": 0,
                "prefill_inflight_queue_reqs": 0, "decode_prealloc_queue_reqs": 0,
                "decode_transfer_queue_reqs": 0, "decode_retracted_queue_reqs": 0,
                "kv_transfer_speed_gb_s": 0.0, "kv_transfer_latency_ms": 0.0,
            }
        if dp_rank not in (None, 0):
            raise HTTPException(400, f"dp_rank {dp_rank} out of range")
        return {
            "timestamp": datetime.now(timezone.utc).isoformat(),
            "version": VERSION,
            "accelerator": "Emulated GPU",
            "num_accelerators": options.tp_size * options.pp_size,
            "loads": [load],
        }

    @app.post("/generate")
    @app.put("/generate")
    async def generate(req: GenerateReq) -> Any:
        n_prompt = _prompt_tokens(req)
        params = req.sampling_params or {}
        max_new = params.get("max_new_tokens", 128)
        if not isinstance(max_new, int) or max_new < 0:
            return JSONResponse({"error": {"message": "max_new_tokens must be a non-negative int"}}, 400)
        extra = req.model_extra or {}
        try:
            return await eng.generate(
                req.rid, n_prompt, max_new, pinned=bool(extra.get("emulated_pinned", False))
            )
        except NotAccepted as exc:
            return JSONResponse({"error": {"message": str(exc)}}, 503)

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
        status, body = await eng.role_switch(obj.new_role, obj.decode_cuda_graph_memory_gb)
        return JSONResponse(body, status)

    # -- test controls (not SGLang) --------------------------------------------------
    @app.post("/_emu/config")
    async def emu_config(body: dict = Body(...)) -> dict:
        """Change emulation knobs at run time: switch_seconds, fail_switch, speed."""
        for key in ("switch_seconds", "fail_switch", "speed"):
            if key in body:
                setattr(options, key, body[key])
        return {"switch_seconds": options.switch_seconds, "fail_switch": options.fail_switch,
                "speed": options.speed}

    return app
