"""The blocking twin of :mod:`prorsa_sdk.client` for threaded code: httpx.Client and a
:class:`~prorsa_sdk.SyncEmitter`. Same events, same rules.

    with SyncEmitter(run="grpo-7") as em, SyncRolloutClient(em, "http://router:30000") as llm:
        with llm.trajectory("t1", prompt_tokens=len(ids)) as traj:
            out = traj.generate(input_ids=ids, sampling_params={"max_new_tokens": 512})
            with traj.tool("search") as t:
                t.result_tokens = len(result_ids)
            with traj.reward() as r:
                r.reward = 1.0
"""

from __future__ import annotations

import inspect
import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from .client import DEFAULT_TIMEOUT, RewardSpan, ToolSpan, ClientBase
from .lifecycle import Call, TrajectoryCore
from .outcome import Outcome, ResponseError, is_first_token_chunk, sse_data
from .wire import (
    CHAT, COMPLETIONS, GENERATE, Api, EngineAborted, EngineError, Generation, TokenCounter, error_text,
    openai_stream_body, prompt_length, response_json, streamed_generation, whole_generation,
)


class SyncRolloutClient(ClientBase):
    """Blocking model requests with lifecycle events; thread-safe (one lock per trajectory)."""

    _http_class = httpx.Client

    def emit(self, calls: list[Call]) -> None:
        for c in calls:
            r = getattr(self.emitter, c.method)(*c.args, **c.kwargs)
            if inspect.isawaitable(r):
                r.close()  # type: ignore[attr-defined]
                raise TypeError("SyncRolloutClient needs a SyncEmitter (an async Emitter goes with RolloutClient)")

    def close(self) -> None:
        if self._own:
            self.http.close()

    def __enter__(self) -> "SyncRolloutClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncTrajectory:
    """Blocking :class:`~prorsa_sdk.client.Trajectory`."""

    def __init__(self, client: SyncRolloutClient, traj: str, prompt_tokens: int, *, group: str | None = None,
                 policy_version: int | None = None):
        self.client = client
        self.core = TrajectoryCore(traj)
        self._lock = threading.RLock()
        self._dispatch = {"prompt_tokens": prompt_tokens, "group": group, "policy_version": policy_version}

    @property
    def traj(self) -> str:
        return self.core.traj

    @property
    def turn(self) -> int:
        return self.core.turn

    def _now(self) -> float:
        return self.client.clock()

    def _do(self, step: Callable[[], list[Call]]) -> None:
        with self._lock:
            snap = self.core.snapshot()
            self._publish(step(), snap)

    def _publish(self, calls: list[Call], snap: dict[str, Any]) -> None:
        for i, c in enumerate(calls):
            try:
                self.client.emit([c])
            except BaseException:
                if i == 0:  # refused before anything was published: the step did not happen
                    self.core.restore(snap)
                raise

    def start(self) -> "SyncTrajectory":
        d = self._dispatch
        kw = {k: v for k, v in (("group", d["group"]), ("policy_version", d["policy_version"])) if v is not None}
        self._do(lambda: self.core.dispatched(d["prompt_tokens"], self._now(), **kw))
        return self

    def __enter__(self) -> "SyncTrajectory":
        return self.start()

    def __exit__(self, et: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self._do(self.core.ended)
        else:
            reason = "aborted" if isinstance(exc, KeyboardInterrupt) else "error"
            self._do(lambda: self.core.dropped(reason, self._now()))
        if not self.core.live:
            self.client._live.pop(self.traj, None)

    @contextmanager
    def sandbox(self, mode: str = "cold") -> Iterator[None]:
        self._do(lambda: self.core.sandbox_started(mode, self._now()))
        yield
        self._do(lambda: self.core.sandbox_ready(self._now()))

    @contextmanager
    def tool(self, name: str | None = None, calls: int | None = None) -> Iterator[ToolSpan]:
        self._do(lambda: self.core.tool_started(self._now(), tool=name, calls=calls))
        span = ToolSpan()
        try:
            yield span
        except BaseException:
            self._do(lambda: self.core.tool_finished(span.result_tokens, self._now(), ok=False))
            raise
        self._do(lambda: self.core.tool_finished(span.result_tokens, self._now(), ok=span.ok))

    @contextmanager
    def reward(self) -> Iterator[RewardSpan]:
        self._do(lambda: self.core.reward_started(self._now()))
        span = RewardSpan()
        yield span
        self._do(lambda: self.core.reward_finished(span.admitted, self._now(), reward=span.reward))

    def rewarded(self, admitted: bool, reward: float | None = None) -> None:
        self._do(lambda: self.core.reward_finished(admitted, self._now(), reward=reward))
        self.client._live.pop(self.traj, None)

    def drop(self, reason: str = "error") -> None:
        self._do(lambda: self.core.dropped(reason, self._now()))
        self.client._live.pop(self.traj, None)

    def generate(self, body: dict[str, Any] | None = None, *, prompt_tokens: int | None = None,
                 stream: bool = False, tool_call: bool | None = None, **fields: Any) -> Generation:
        return self._call(GENERATE, "sglang", {**(body or {}), **fields}, prompt_tokens, stream, tool_call)

    def chat(self, body: dict[str, Any] | None = None, *, prompt_tokens: int | None = None,
             stream: bool = False, tool_call: bool | None = None, **fields: Any) -> Generation:
        return self._call(CHAT, "openai", {**(body or {}), **fields}, prompt_tokens, stream, tool_call)

    def completion(self, body: dict[str, Any] | None = None, *, prompt_tokens: int | None = None,
                   stream: bool = False, tool_call: bool | None = None, **fields: Any) -> Generation:
        return self._call(COMPLETIONS, "openai", {**(body or {}), **fields}, prompt_tokens, stream, tool_call)

    @contextmanager
    def request(self, prompt_tokens: int, *, engine: str | None = None) -> Iterator["SyncRequestSpan"]:
        with self._lock:
            snap = self.core.snapshot()
            req, turn, calls = self.core.queue(prompt_tokens, self._now(), engine=engine)
            self._publish(calls, snap)
        span = SyncRequestSpan(self, req, turn, self._now())
        try:
            yield span
        except BaseException:
            self._do(lambda: self.core.failed(req, self._now()))
            raise
        if not span.answered:
            raise RuntimeError(f"request {req}: the block ended without span.done(...)")

    def _call(self, path: str, api: Api, body: dict[str, Any], prompt_tokens: int | None, stream: bool,
              tool_call: bool | None) -> Generation:
        if self.client.http is None or self.client.base_url is None:
            raise RuntimeError("this client has no base_url: use trajectory.request() around your own engine calls")
        n = prompt_length(body, prompt_tokens, self.client.count_tokens)
        with self._lock:
            snap = self.core.snapshot()
            req, turn, calls = self.core.queue(n, self._now())
            self._publish(calls, snap)
        if api == "sglang":
            body.setdefault("rid", req)
        if stream:
            body = openai_stream_body(body) if api == "openai" else {**body, "stream": True}
        sent = self._now()
        try:
            result = self._send(path, api, body, req, turn, sent, stream)
        except (EngineError, ResponseError, httpx.HTTPError) as exc:
            self._do(lambda: self.core.failed(req, self._now()))
            if isinstance(exc, EngineError):
                raise
            raise EngineError(f"request {req} to {path} failed: {exc!r}") from exc
        except BaseException:  # cancelled, interrupted: the request is no longer out
            self._do(lambda: self.core.failed(req, self._now()))
            raise
        received = self._now()
        self._do(lambda: self.core.answered(req, result.outcome, received, tool_call))
        if result.outcome.finish == "abort":
            raise EngineAborted(f"request {req} aborted by the engine: {result.outcome.message or ''}",
                                result.outcome, result)
        return result

    def _send(self, path: str, api: Api, body: dict, req: str, turn: int, sent: float, stream: bool) -> Generation:
        http, url = self.client.http, f"{self.client.base_url}{path}"
        assert http is not None
        if not stream:
            resp = http.post(url, json=body)
            if resp.status_code >= 400:
                raise EngineError(error_text(resp.status_code, resp.text), resp.status_code, resp.text)
            return whole_generation(api, req, turn, response_json(resp), sent, self._now())
        with http.stream("POST", url, json=body) as resp:
            if resp.status_code >= 400:
                text = resp.read().decode(errors="replace")
                raise EngineError(error_text(resp.status_code, text), resp.status_code, text)
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                resp.read()
                return whole_generation(api, req, turn, response_json(resp), sent, self._now())
            chunks: list[dict] = []
            first: float | None = None
            for line in resp.iter_lines():
                chunk = sse_data(line)
                if chunk is None:
                    continue
                chunks.append(chunk)
                if first is None and is_first_token_chunk(chunk, api):
                    first = self._now()
                    meta = chunk.get("meta_info") or {}
                    cached = meta.get("cached_tokens") if isinstance(meta.get("cached_tokens"), int) else None
                    t = first
                    self._do(lambda: self.core.first_token(req, t, cached_tokens=cached))
        return streamed_generation(api, req, turn, chunks, sent, self._now(), first)


class SyncRequestSpan:
    """Blocking :class:`~prorsa_sdk.client.RequestSpan`."""

    def __init__(self, traj: SyncTrajectory, req: str, turn: int, sent: float):
        self.traj, self.req, self.turn, self.sent = traj, req, turn, sent
        self.answered = False

    def first_token(self, ts: float | None = None, *, cached_tokens: int | None = None) -> None:
        t = self.traj
        at = t._now() if ts is None else ts
        t._do(lambda: t.core.first_token(self.req, at, cached_tokens=cached_tokens))

    def done(self, output_tokens: int, finish: str = "stop", *, cached_tokens: int | None = None,
             ttft: float | None = None, tool_call: bool | None = None) -> None:
        t = self.traj
        now = t._now()
        first = None if ttft is None or not math.isfinite(ttft) else min(now, self.sent + max(0.0, ttft))
        kind = "tool" if finish in ("tool", "tool_calls") else finish
        out = Outcome(output_tokens=output_tokens, finish=kind, cached_tokens=cached_tokens,  # type: ignore[arg-type]
                      first_token_ts=first)
        self.answered = True
        t._do(lambda: t.core.answered(self.req, out, now, tool_call))


SyncRolloutClient._handle = SyncTrajectory
