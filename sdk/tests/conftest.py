"""Fixtures of the SDK tests: a real tracker on the test's namespace (SQLite), an emulated
PD cluster behind the emulated router, and a scripted engine: a real HTTP server that
answers in SGLang's and OpenAI's shapes (whole or streamed) with the timings a test sets,
for what the emulated engines do not serve (streaming, the OpenAI API, the
``--enable-metrics`` timestamps, failures on demand)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from sqlalchemy import select

from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import Namespace, decode_event
from prorsa_tracker.db import make_engine
from prorsa_tracker.models import AnomalyRow, EventRow, TrajectoryRow
from prorsa_tracker.service import Tracker
from prorsa_tracker.settings import TrackerSettings


class TrackerHandle:
    """A running tracker and what its database holds."""

    def __init__(self, tracker: Tracker, db: str):
        self.tracker, self.db = tracker, db

    async def wait_events(self, n: int, timeout: float = 60.0) -> None:
        try:
            await async_wait_until(lambda: self.tracker.event_rows >= n, timeout=timeout,
                                   what=f"the tracker to store {n} events")
        except AssertionError as exc:
            stored = [(e.type, getattr(e, "traj", None)) for e in self.events()]
            raise AssertionError(f"{exc}; it holds {len(stored)}: {stored}") from None

    def _rows(self, model):
        eng = make_engine(self.db)
        try:
            with eng.connect() as c:
                return list(c.execute(select(model)))
        finally:
            eng.dispose()

    def events(self) -> list:
        return [decode_event(r.raw) for r in sorted(self._rows(EventRow), key=lambda r: r.pos)]

    def anomalies(self) -> list[str]:
        return [f"{r.type} {r.traj}: {r.reason}" for r in self._rows(AnomalyRow)]

    def states(self) -> dict[str, str]:
        return {r.traj: r.state for r in self._rows(TrajectoryRow)}


@pytest.fixture
async def tracker(nats_url: str, ns: Namespace, tmp_path) -> AsyncIterator[TrackerHandle]:
    db = f"sqlite:///{tmp_path}/tracker.db"
    t = Tracker(TrackerSettings(nats_url=nats_url, subject_prefix=ns.prefix, stream=ns.stream, db_url=db,
                                clock="event", batch_max=200))
    stop = asyncio.Event()
    task = asyncio.create_task(t.run(stop))
    await asyncio.wait_for(t.ready.wait(), 30)
    yield TrackerHandle(t, db)
    stop.set()
    await asyncio.wait_for(task, 30)


@pytest.fixture(scope="module")
def emulated_pd() -> Iterator[str]:
    """One prefill and one decode emulated engine behind the router: its URL. The router is
    the real one, sglang-router 0.3.2 in PD mode (``EmulatedCluster``'s default; the
    cluster runs 20x faster than real time)."""
    from prorsa_emulated import EmulatedCluster

    cluster = EmulatedCluster(["prefill", "decode"], speed=20.0).start(register=True)
    try:
        url = cluster.router.url  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        while True:  # registration is asynchronous (202): wait until both are listed
            stats = httpx.get(f"{url}/workers", timeout=2.0).json()["stats"]
            if stats["prefill_count"] >= 1 and stats["decode_count"] >= 1:
                break
            assert time.monotonic() < deadline, f"router never listed both workers: {stats}"
            time.sleep(0.05)
        yield url
    finally:
        cluster.stop()


@dataclass
class Script:
    """How the scripted engine answers the next requests (a test changes it between calls)."""

    prefill_s: float = 0.0  # before the first token
    decode_s: float = 0.0  # from the first token to the end
    tokens: int = 8
    finish: str = "stop"  # SGLang finish type, or OpenAI finish_reason
    fail: list[int] = field(default_factory=list)  # HTTP statuses to answer the next requests with
    metrics: bool = False  # add the --enable-metrics meta_info timestamps
    clock_offset: float = 0.0  # the engine host's clock minus the caller's
    seen: list[dict] = field(default_factory=list)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    script: Script

    def log_message(self, *a: object) -> None:
        pass

    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", ctype)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # noqa: N802
        s = self.script
        now = lambda: time.time() + s.clock_offset  # noqa: E731
        received = now()
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        s.seen.append(body)
        if s.fail:
            self._send(s.fail.pop(0), b'{"error": {"message": "scripted failure"}}')
            return
        sglang = self.path == "/generate"
        n = 0 if s.finish == "abort" else s.tokens
        prompt = len(body.get("input_ids") or []) or 5
        time.sleep(s.prefill_s)  # the engine's prefill
        first = now()
        if body.get("stream"):
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            # The body ends when the connection closes (no length, not chunked): HTTP/1.1
            # needs "connection: close" for that, or the client keeps the connection for
            # its next request and, under load, sends one into the closed socket.
            self.send_header("connection", "close")
            self.end_headers()
            self._chunk(self._answer(sglang, body, prompt, 1, None, received, first, first))
            time.sleep(s.decode_s)
            # SGLang streams cumulative text (its default); OpenAI streams deltas.
            self._chunk(self._answer(sglang, body, prompt, n, s.finish, received, first, now(),
                                     text_n=n if sglang else max(0, n - 1)))
            if not sglang and body.get("stream_options", {}).get("include_usage"):
                self._chunk({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True
            return
        time.sleep(s.decode_s)
        self._send(200, json.dumps(self._answer(sglang, body, prompt, n, s.finish, received, first, now())).encode())

    def _chunk(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
        self.wfile.flush()

    def _answer(self, sglang: bool, body: dict, prompt: int, n: int, finish: str | None, received: float,
                first: float, done: float, text_n: int | None = None) -> dict:
        text_n = n if text_n is None else text_n
        if sglang:
            meta = {"id": body.get("rid"), "prompt_tokens": prompt, "completion_tokens": n, "cached_tokens": 2,
                    "finish_reason": {"type": finish, "message": "scripted abort"} if finish else None,
                    "e2e_latency": done - received}
            if self.script.metrics and finish:
                meta.update(request_received_ts=received, request_finished_ts=done,
                            decode_throughput=(n / (done - first)) if done > first else None)
            return {"text": " tok" * n, "output_ids": list(range(n)), "meta_info": meta}
        choice = {"index": 0, "finish_reason": finish}
        if self.path.endswith("/chat/completions"):
            choice["delta" if body.get("stream") else "message"] = {"role": "assistant", "content": "x" * text_n}
        else:
            choice["text"] = "x" * text_n
        out = {"id": "cmpl-1", "choices": [choice]}
        if not body.get("stream"):
            out["usage"] = {"prompt_tokens": prompt, "completion_tokens": n}
        return out


@pytest.fixture
def scripted_engine() -> Iterator[tuple[str, Script]]:
    script = Script()
    handler = type("Handler", (_Handler,), {"script": script})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
