"""Weight updates and generation pause on the emulated SGLang server (SGLang 0.5.23 shapes:
``http_server.py``, ``managers/io_struct.py``).

* ``POST /update_weights_from_disk {model_path, weight_version?, abort_all_requests?, ...}``
  → ``{success, message, num_paused_requests}``: ``/model_info`` then reports the new
  ``model_path`` and (when given) ``weight_version``, as SGLang's tokenizer manager does.
  Nothing is loaded; the weights are a name.
* ``POST /update_weight_version {new_version, abort_all_requests?}``.
* ``POST /pause_generation {mode}`` / ``POST /continue_generation``; ``GET /ready`` answers
  503 while paused (SGLang's ``is_ready``: not paused and healthy), 200 otherwise. While
  paused no batch runs (requests sent meanwhile wait in their queues), as SGLang's
  scheduler does (``scheduler.py: pause_generation``); mode ``abort`` (the default) aborts
  every request, ``retract`` frees the KV of every request being prefilled or decoded
  (re-prefilled when generation continues; parked and reloaded on a PD decode engine), and
  ``in_place`` keeps every request and its KV as they are. Another mode is refused (422).
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field


class UpdateFromDiskReq(BaseModel):
    model_config = ConfigDict(extra="allow")
    model_path: str = Field(min_length=1)
    load_format: Optional[str] = None
    abort_all_requests: bool = False
    weight_version: Optional[str] = None


class UpdateVersionReq(BaseModel):
    model_config = ConfigDict(extra="allow")
    new_version: str = Field(min_length=1)
    abort_all_requests: bool = True


PauseMode = Literal["abort", "retract", "in_place"]
"""SGLang's ``PauseGenerationReqInput.mode``."""


class PauseReq(BaseModel):
    model_config = ConfigDict(extra="allow")
    mode: PauseMode = "abort"


def add_weight_routes(app: FastAPI, options: Any, eng: Any) -> None:
    """Mount the weight-update and pause endpoints; ``options.model_path`` and
    ``options.weight_version`` are what ``/model_info`` reports."""
    @app.get("/ready")
    async def ready() -> Response:
        return Response(status_code=200 if eng.healthy() and eng.paused is None else 503)

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(obj: UpdateFromDiskReq = Body(...)) -> JSONResponse:
        if obj.abort_all_requests:
            eng.abort(None, True)
        options.model_path = obj.model_path
        message = "Succeeded to update model weights."
        if obj.weight_version is not None:
            options.weight_version = obj.weight_version
            message += f" Weight version updated to {obj.weight_version}."
        return JSONResponse({"success": True, "message": message, "num_paused_requests": 0})

    @app.post("/update_weight_version")
    async def update_weight_version(obj: UpdateVersionReq = Body(...)) -> JSONResponse:
        if obj.abort_all_requests:
            eng.abort(None, True)
        options.weight_version = obj.new_version
        return JSONResponse({"success": True, "message": f"Weight version updated to {obj.new_version}",
                             "new_version": obj.new_version})

    @app.post("/pause_generation")
    async def pause_generation(obj: PauseReq = Body(...)) -> JSONResponse:
        eng.pause(obj.mode)
        await eng.halted()  # answered once the step under way has ended, as SGLang does
        return JSONResponse({"message": "Generation paused successfully.", "status": "ok"})

    @app.post("/continue_generation")
    async def continue_generation(body: dict = Body(default_factory=dict)) -> JSONResponse:
        eng.resume()
        return JSONResponse({"message": "Generation continued successfully.", "status": "ok"})
