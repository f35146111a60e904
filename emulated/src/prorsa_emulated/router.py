"""The emulated router (sglang-router 0.3.2 / SMG): worker registry and PD routing.

Shapes follow SMG's ``/workers`` API: ``POST /workers`` queues an asynchronous job and
answers 202 ``{status: "accepted", worker_id, url, location, message}`` with a
``Location`` header; the job health-checks the worker and then adds it. ``GET /workers``
lists ``{workers: [WorkerInfo], total, stats}``; ``GET /workers/{id}`` is one worker or its
pending job; ``DELETE /workers/{id}`` answers 202 and removes it without draining.
``POST /generate`` sends a request to a prefill + decode pair (bootstrap fields added,
as the PD router does) or to a regular worker.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional
from urllib.parse import urlparse

import aiohttp
from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse, Response, StreamingResponse

from . import smg
from .prefix_cache import parse_emulated_prompt
from .server import SSE_DONE, sse

WORKER_TYPES = ("regular", "prefill", "decode")

log = logging.getLogger("prorsa.emulated.router")


@dataclass
class Worker:
    id: str
    url: str
    worker_type: str
    bootstrap_port: Optional[int]
    model_id: str = "unknown"
    priority: int = 50
    cost: float = 1.0
    is_healthy: bool = True
    load: int = 0
    picks: int = 0
    tree: int = 0
    """Tokens of prompt text the router has sent it: the size of its prefix tree."""
    labels: dict = field(default_factory=dict)

    def info(self) -> dict:
        out = {
            "id": self.id, "url": self.url, "model_id": self.model_id, "priority": self.priority,
            "cost": self.cost, "worker_type": self.worker_type, "is_healthy": self.is_healthy,
            "load": self.load, "connection_mode": "Http", "runtime_type": "sglang",
        }
        if self.worker_type == "prefill":
            out["bootstrap_port"] = self.bootstrap_port
        if self.labels:
            out["metadata"] = dict(self.labels)
        return out


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# POST /workers's optional fields and what each must hold (sglang-router's WorkerConfigRequest:
# null is the field left out). A wrong type is refused at once, not found later by a job that
# never ends or by a GET /workers that fails for every caller.
_FIELDS: dict[str, tuple[str, object]] = {
    "worker_type": ("a string", lambda v: isinstance(v, str)),
    "model_id": ("a string", lambda v: isinstance(v, str)),
    "bootstrap_port": ("an integer from 1 to 65535", lambda v: _is_int(v) and 1 <= v <= 65535),
    "priority": ("a non-negative integer", lambda v: _is_int(v) and v >= 0),
    "cost": ("a finite non-negative number", lambda v: (_is_int(v) or isinstance(v, float)) and 0 <= v < float("inf")),
    "health_check_timeout_secs": ("a non-negative integer", lambda v: _is_int(v) and v >= 0),
    "labels": ("a map of strings to strings",
               lambda v: isinstance(v, dict) and all(isinstance(x, str) for kv in v.items() for x in kv)),
}


def _bad_field(body: dict) -> str | None:
    """What is wrong with ``body``'s optional fields (None: nothing)."""
    for name, (want, ok) in _FIELDS.items():
        v = body.get(name)
        if v is not None and not ok(v):  # type: ignore[operator]
            return f"{name}: invalid value {v!r}, expected {want}"
    return None


def _error(status: int, message: str, code: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status)


def create_router_app(health_timeout_s: float = 30.0, health_interval_s: float = 1.0) -> FastAPI:
    """The FastAPI app of an emulated router."""
    app = FastAPI(title="emulated sglang router")
    workers: dict[str, Worker] = {}
    jobs: dict[str, dict] = {}
    # aiohttp, not httpx: a router holds hundreds of requests open at once (two per request
    # in PD), and httpx's pool re-scans every pending request on each one (its latency grew
    # to seconds with 128 in flight); aiohttp's connector does not. No pool limit: a request
    # holds its worker connection until it is answered.
    state: dict[str, aiohttp.ClientSession] = {}
    app.state.workers = workers

    def client() -> aiohttp.ClientSession:
        if "session" not in state:  # made on the server's loop, at first use
            state["session"] = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=5.0))
        return state["session"]

    async def healthy(url: str) -> bool:
        try:
            async with client().get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def add_job(wid: str, body: dict) -> None:
        try:
            await _add(wid, body)
        except Exception as exc:  # noqa: BLE001 - a job never stays "processing" for good
            log.exception("add worker %s failed", body.get("url"))
            jobs[wid] = dict(jobs.get(wid, {}), status="failed", message=f"Adding worker failed: {exc!r}")

    async def _add(wid: str, body: dict) -> None:
        url = body["url"]
        jobs[wid] = {"job_type": "AddWorker", "worker_url": url, "status": "processing",
                     "message": None, "timestamp": int(time.time())}
        deadline = time.monotonic() + float(body.get("health_check_timeout_secs") or health_timeout_s)
        while not await healthy(url):
            if time.monotonic() > deadline:
                jobs[wid].update(status="failed", message=f"Worker {url} did not become healthy")
                return
            await asyncio.sleep(0.05)
        model_id = "unknown"
        try:
            async with client().get(f"{url}/model_info", timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                model_id = (await r.json(content_type=None)).get("model_path", model_id)
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, AttributeError):
            pass
        if any(w.url == url for w in workers.values()):
            jobs[wid].update(status="failed", message=f"Worker {url} already exists")
            return
        workers[wid] = Worker(
            wid, url, body.get("worker_type") or "regular", body.get("bootstrap_port"),
            model_id=body.get("model_id") or model_id, priority=body.get("priority") or 50,
            cost=body.get("cost") or 1.0, labels=body.get("labels") or {},
        )
        jobs.pop(wid, None)

    async def health_loop() -> None:
        while True:
            await asyncio.sleep(health_interval_s)
            for w in list(workers.values()):
                w.is_healthy = await healthy(w.url)

    @app.on_event("startup")
    async def _start() -> None:
        app.state.health_task = asyncio.create_task(health_loop())

    @app.on_event("shutdown")
    async def _stop() -> None:
        app.state.health_task.cancel()
        if "session" in state:
            await state["session"].close()

    @app.get("/health")
    @app.get("/liveness")
    async def health() -> Response:
        return Response("OK", 200)

    @app.get("/readiness")
    async def readiness() -> Response:
        ok = any(w.is_healthy for w in workers.values())
        return Response(status_code=200 if ok else 503)

    @app.post("/workers")
    async def create_worker(body: Any = Body(...)) -> JSONResponse:
        if not isinstance(body, dict) or not isinstance(body.get("url"), str):
            # As sglang-router 0.3.2: a body that does not deserialise is a plain-text 422.
            return Response("Failed to deserialize the JSON body into the target type: missing field `url`",
                            422, media_type="text/plain")
        bad = _bad_field(body)
        if bad is not None:
            # sglang-router deserialises the body into typed fields (serde): a wrong type is
            # a plain-text 422 naming the field, as a missing url is.
            return Response(f"Failed to deserialize the JSON body into the target type: {bad}", 422,
                            media_type="text/plain")
        url = body["url"].rstrip("/")
        try:
            parsed = urlparse(url)
            parsed.port  # noqa: B018 - raises ValueError for a port outside 0-65535
        except ValueError:
            return _error(400, f"Invalid worker URL: {url}", "BAD_REQUEST")
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            return _error(400, f"Invalid worker URL: {url}", "BAD_REQUEST")
        wtype = body.get("worker_type") or "regular"
        if wtype not in WORKER_TYPES:
            return _error(400, f"Invalid worker_type: {wtype}", "BAD_REQUEST")
        if any(w.url == url for w in workers.values()):
            return _error(409, f"Worker {url} already exists", "WORKER_ALREADY_EXISTS")
        wid = str(uuid.uuid4())
        body = dict(body, url=url, worker_type=wtype)
        jobs[wid] = {"job_type": "AddWorker", "worker_url": url, "status": "pending",
                     "message": None, "timestamp": int(time.time())}
        asyncio.create_task(add_job(wid, body))
        location = f"/workers/{wid}"
        return JSONResponse(
            {"status": "accepted", "worker_id": wid, "url": url, "location": location,
             "message": "Worker addition queued for background processing"},
            202, headers={"Location": location},
        )

    @app.get("/workers")
    async def list_workers() -> dict:
        infos = [w.info() for w in workers.values()]
        count = lambda t: sum(1 for w in workers.values() if w.worker_type == t)  # noqa: E731
        return {
            "workers": infos, "total": len(infos),
            "stats": {"prefill_count": count("prefill"), "decode_count": count("decode"),
                      "regular_count": count("regular")},
        }

    @app.get("/workers/{wid}")
    async def get_worker(wid: str) -> JSONResponse:
        if wid in workers:
            return JSONResponse(workers[wid].info())
        if wid in jobs:
            return JSONResponse({"id": wid, "job_status": jobs[wid]})
        return _error(404, f"Worker {wid} not found", "WORKER_NOT_FOUND")

    @app.delete("/workers/{wid}")
    async def delete_worker(wid: str) -> JSONResponse:
        if wid not in workers:
            return _error(404, f"Worker {wid} not found", "WORKER_NOT_FOUND")
        # Removal is queued; it takes effect on the next loop turn and does not drain.
        asyncio.get_running_loop().call_soon(workers.pop, wid, None)
        return JSONResponse(
            {"status": "accepted", "worker_id": wid,
             "message": "Worker removal queued for background processing"}, 202)

    # Cache-aware routing, after SMG's ``cache_aware`` policy (``smg.choose``; its
    # defaults: cache threshold 0.3, balance thresholds 64 requests absolute and 1.5x
    # relative): when the loads are balanced, a request goes to the worker that holds its
    # prefix if the prefix is more than 0.3 of its prompt, else to the worker with the
    # smallest tree (the least text sent to it); with imbalanced loads, to the least
    # loaded. SMG matches a radix tree of the text; here the prefix is named by the
    # conversation of an emulated prompt (``emulated_prompt_text``, or
    # ``emulated_prefix_id``: the emulated engines' synthetic tokens), and what matches is
    # the conversation's previous prompt on the worker it was sent to. A worker that
    # leaves takes its tree with it (the gateway removes the worker's tenant), and one
    # that registers starts with an empty tree.
    affinity: dict[str, tuple[str, int]] = {}  # prefix id -> (worker id, its last prompt's tokens)

    def pick(kind: str, prefix: str | None = None, tokens: int = 1) -> Worker | None:
        pool = [w for w in workers.values() if w.worker_type == kind and w.is_healthy]
        if not pool:
            return None
        # Ties broken by load, then by how often each was picked, then registration
        # order: deterministic for a given arrival order (a seeded run routes alike run
        # after run).
        ranked = sorted(pool, key=lambda w: (w.load, w.picks))
        wid, last = affinity.get(prefix, ("", 0)) if prefix is not None else ("", 0)
        held = workers.get(wid)
        match = ranked.index(held) if held in ranked else None
        matched = min(last, tokens) if match is not None else 0
        w = ranked[smg.choose([x.load for x in ranked], [x.tree for x in ranked], match, matched, tokens)]
        w.picks += 1
        if prefix is not None:
            w.tree += max(tokens - matched, 0) if w is held else tokens
            affinity[prefix] = (w.id, tokens)
        return w

    async def forward(w: Worker, body: dict) -> tuple[int, bytes]:
        """(status, body) of the worker's answer."""
        w.load += 1
        try:
            async with client().post(f"{w.url}/generate", json=body) as r:
                return r.status, await r.read()
        finally:
            w.load -= 1

    background: set[asyncio.Task] = set()  # prefill halves of streamed PD requests in flight

    def _settled(task: asyncio.Task) -> None:
        background.discard(task)
        if not task.cancelled():
            task.exception()  # read here; the relay turns a failure into an error chunk

    def _peer_failed(peer: asyncio.Task | None) -> str | None:
        """Why the prefill half failed (an error or a non-200 answer), or None."""
        if peer is None or not peer.done():
            return None
        if peer.cancelled():
            return "prefill request cancelled"
        if peer.exception() is not None:
            return f"prefill request failed: {peer.exception()!r}"
        status, content = peer.result()
        return None if status == 200 else f"prefill answered HTTP {status}: {content[:200]!r}"

    async def forward_stream(w: Worker, body: dict, peer: asyncio.Task | None = None) -> Response:
        """The worker's streamed answer relayed as it comes (an error status: its body). With
        ``peer`` (the prefill half of a PD request): if it fails before the stream ends, the
        stream ends with an error chunk and the decode request is dropped (the decode
        engine aborts it), as the PD router answers a failed prefill with an error instead
        of leaving its decode half waiting for KV that never comes."""
        w.load += 1
        try:
            resp = await client().post(f"{w.url}/generate", json=body)
        except BaseException:
            w.load -= 1
            raise
        if resp.status != 200:
            try:
                return Response(await resp.read(), resp.status, media_type="application/json")
            finally:
                resp.release()
                w.load -= 1

        async def relay():
            chunks = resp.content.iter_any().__aiter__()
            nxt: asyncio.Future | None = None
            try:
                while True:
                    why = _peer_failed(peer)
                    if why is not None:
                        yield sse({"error": {"message": why}})
                        yield SSE_DONE
                        return
                    if nxt is None:
                        nxt = asyncio.ensure_future(chunks.__anext__())
                    waiting = {nxt} if peer is None or peer.done() else {nxt, peer}
                    await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                    if not nxt.done():
                        continue  # the prefill half answered: look at how, above
                    try:
                        chunk = nxt.result()
                    except StopAsyncIteration:
                        return
                    nxt = None
                    yield chunk
            finally:
                if nxt is not None and not nxt.done():
                    nxt.cancel()
                    resp.close()  # the decode engine sees its client leave and aborts the request
                else:
                    resp.release()
                w.load -= 1
        return StreamingResponse(relay(), media_type="text/event-stream")

    @app.post("/generate")
    async def generate(body: Any = Body(...)) -> Response:
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object", "BAD_REQUEST")
        prefix = body.get("emulated_prefix_id")
        parsed = parse_emulated_prompt(body.get("text"))
        prefix = prefix if isinstance(prefix, str) else parsed[0] if parsed else None
        tokens = parsed[1] if parsed else body.get("prompt_tokens")
        tokens = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else 1
        prefill, decode = pick("prefill", prefix, tokens), pick("decode")
        try:
            if prefill is not None and decode is not None:
                host = urlparse(prefill.url).hostname
                # The decode engine waits for this prefill at bootstrap_host:bootstrap_port.
                pd_body = dict(body, bootstrap_host=host, bootstrap_port=prefill.bootstrap_port,
                               bootstrap_room=random.getrandbits(63))
                if body.get("stream"):
                    # The decode engine's stream is the answer (its first chunk comes once
                    # the prefill's KV and first token arrived); the prefill's own answer
                    # is read and dropped, as the PD router does without logprobs.
                    p_task = asyncio.create_task(forward(prefill, dict(pd_body, stream=False)))
                    # Held until done: the loop keeps only a weak reference to a task, and a
                    # prefill half collected before it is sent leaves its decode peer
                    # waiting for a room nobody prefills.
                    background.add(p_task)
                    p_task.add_done_callback(_settled)
                    return await forward_stream(decode, pd_body, peer=p_task)
                (p_status, p_body), (d_status, d_body) = await asyncio.gather(
                    forward(prefill, pd_body), forward(decode, pd_body))
                if p_status != 200:
                    return Response(p_body, p_status, media_type="application/json")
                return Response(d_body, d_status, media_type="application/json")
            regular = pick("regular", prefix, tokens)
            if regular is None:
                return _error(503, "No available workers", "NO_AVAILABLE_WORKERS")
            if body.get("stream"):
                return await forward_stream(regular, body)
            status, content = await forward(regular, body)
            return Response(content, status, media_type="application/json")
        except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
            return _error(502, f"worker request failed: {exc!r}", "WORKER_ERROR")

    return app
