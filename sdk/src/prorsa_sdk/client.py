"""A model client for any RL framework (asyncio): SGLang ``/generate`` and OpenAI-compatible
calls over httpx that publish each request's lifecycle events, and a trajectory handle
that numbers turns and requests and wraps sandboxes, tools and rewards.

    async with Emitter(run="grpo-7") as em, RolloutClient(em, "http://router:30000") as llm:
        async with llm.trajectory("t1", prompt_tokens=len(ids)) as traj:
            out = await traj.generate(input_ids=ids, sampling_params={"max_new_tokens": 512})
            async with traj.tool("search") as t:
                t.result_tokens = len(result_ids)
            ...
            async with traj.reward() as r:
                r.reward, r.admitted = 1.0, True

The emitter may be an :class:`~prorsa_sdk.Emitter` or a :class:`~prorsa_sdk.SyncEmitter`.
Event times are the times things happened (see :mod:`prorsa_sdk.outcome` for the first token).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from .lifecycle import Call, TrajectoryCore
from .outcome import Outcome, ResponseError, is_first_token_chunk, sse_data
from .wire import (
    CHAT, COMPLETIONS, GENERATE, Api, EngineAborted, EngineError, Generation, TokenCounter, error_text,
    openai_stream_body, prompt_length, response_json, streamed_generation, whole_generation,
)

DEFAULT_TIMEOUT = httpx.Timeout(3600.0, connect=10.0)


@dataclass
class ToolSpan:
    """Set ``result_tokens`` (the tokens the tool's result adds to the context) and, if you
    like, ``ok``; an exception in the block reports ``ok=False``."""

    result_tokens: int = 0
    ok: bool | None = None


@dataclass
class RewardSpan:
    """Set ``reward`` and ``admitted`` (whether the sample meets the training-admission criteria)."""

    reward: float | None = None
    admitted: bool = True


class ClientBase:
    """What the async and the blocking client share: where requests go, how prompts are
    counted, the event clock, the HTTP client (made and owned here unless one is given),
    and the trajectories made so far. ``_http_class`` and ``_handle`` are the twin's own."""

    _http_class: type = httpx.AsyncClient
    _handle: type

    def __init__(self, emitter: Any, base_url: str | None = None, *, http: Any = None,
                 headers: dict[str, str] | None = None, count_tokens: TokenCounter | None = None,
                 clock: Callable[[], float] = time.time):
        self.emitter = emitter
        self.base_url = base_url.rstrip("/") if base_url else None
        self.count_tokens = count_tokens
        self.clock = clock
        self._own = http is None and base_url is not None
        self.http = http
        if self._own:
            self.http = self._http_class(timeout=DEFAULT_TIMEOUT, headers=headers,
                                         limits=httpx.Limits(max_connections=None))
        self._live: dict[str, Any] = {}

    def trajectory(self, traj: str, prompt_tokens: int, *, group: str | None = None,
                   policy_version: int | None = None) -> Any:
        """A handle for trajectory ``traj``; enter it (``with`` / ``async with``) to dispatch it."""
        t = self._handle(self, traj, prompt_tokens, group=group, policy_version=policy_version)
        self._live[traj] = t
        return t

    def get(self, traj: str) -> Any:
        """The handle of a trajectory made by this client (e.g. to report its reward later)."""
        return self._live[traj]


class RolloutClient(ClientBase):
    """Model requests to one SGLang server or router (``base_url``), with lifecycle events.

    ``count_tokens(body) -> int`` gives the prompt length of a text or chat request (the
    length of ``input_ids`` is used when they are sent, or pass ``prompt_tokens=``).
    ``http``: your own ``httpx.AsyncClient`` (else one is made and closed by :meth:`aclose`).
    """

    _http_class = httpx.AsyncClient

    async def emit(self, calls: list[Call]) -> None:
        for c in calls:
            r = getattr(self.emitter, c.method)(*c.args, **c.kwargs)
            if inspect.isawaitable(r):
                await r

    async def aclose(self) -> None:
        if self._own:
            await self.http.aclose()

    async def __aenter__(self) -> "RolloutClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class Trajectory:
    """One trajectory's lifecycle (see :class:`~prorsa_sdk.lifecycle.TrajectoryCore`).

    Leaving ``async with`` on an exception publishes ``trajectory.dropped`` (``error``;
    ``aborted`` when cancelled) and re-raises; leaving it normally publishes a held answer,
    and the trajectory waits for its reward (:meth:`rewarded`, possibly from elsewhere)."""

    def __init__(self, client: RolloutClient, traj: str, prompt_tokens: int, *, group: str | None = None,
                 policy_version: int | None = None):
        self.client = client
        self.core = TrajectoryCore(traj)
        self._dispatch = {"prompt_tokens": prompt_tokens, "group": group, "policy_version": policy_version}

    @property
    def traj(self) -> str:
        return self.core.traj

    @property
    def turn(self) -> int:
        return self.core.turn

    def _now(self) -> float:
        return self.client.clock()

    async def _do(self, step: Callable[[], list[Call]]) -> None:
        snap = self.core.snapshot()
        await self._publish(step(), snap)

    async def _publish(self, calls: list[Call], snap: dict[str, Any]) -> None:
        for i, c in enumerate(calls):
            try:
                await self.client.emit([c])
            except BaseException:
                if i == 0:  # refused before anything was published: the step did not happen
                    self.core.restore(snap)
                raise

    async def start(self) -> "Trajectory":
        """Publish ``trajectory.dispatched``."""
        d = self._dispatch
        kw = {k: v for k, v in (("group", d["group"]), ("policy_version", d["policy_version"])) if v is not None}
        await self._do(lambda: self.core.dispatched(d["prompt_tokens"], self._now(), **kw))
        return self

    async def __aenter__(self) -> "Trajectory":
        return await self.start()

    async def __aexit__(self, et: type | None, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            await self._do(lambda: self.core.ended())
        else:
            reason = "aborted" if isinstance(exc, asyncio.CancelledError) else "error"
            await self._do(lambda: self.core.dropped(reason, self._now()))
        if not self.core.live:
            self.client._live.pop(self.traj, None)

    # -- sandbox, tools, reward ------------------------------------------------------------
    @asynccontextmanager
    async def sandbox(self, mode: str = "cold") -> AsyncIterator[None]:
        """``sandbox.started`` (``prewarm`` or ``cold``) on entry, ``sandbox.ready`` on a normal exit."""
        await self._do(lambda: self.core.sandbox_started(mode, self._now()))
        yield
        await self._do(lambda: self.core.sandbox_ready(self._now()))

    @asynccontextmanager
    async def tool(self, name: str | None = None, calls: int | None = None) -> AsyncIterator[ToolSpan]:
        """``tool.started`` on entry, ``tool.finished`` on exit (``ok=False`` on an exception,
        which is re-raised)."""
        await self._do(lambda: self.core.tool_started(self._now(), tool=name, calls=calls))
        span = ToolSpan()
        try:
            yield span
        except BaseException:
            await self._do(lambda: self.core.tool_finished(span.result_tokens, self._now(), ok=False))
            raise
        await self._do(lambda: self.core.tool_finished(span.result_tokens, self._now(), ok=span.ok))

    @asynccontextmanager
    async def reward(self) -> AsyncIterator[RewardSpan]:
        """``reward.started`` on entry, ``reward.finished`` on a normal exit."""
        await self._do(lambda: self.core.reward_started(self._now()))
        span = RewardSpan()
        yield span
        await self._do(lambda: self.core.reward_finished(span.admitted, self._now(), reward=span.reward))

    async def rewarded(self, admitted: bool, reward: float | None = None) -> None:
        """``reward.finished`` for a reward computed elsewhere; the trajectory is done."""
        await self._do(lambda: self.core.reward_finished(admitted, self._now(), reward=reward))
        self.client._live.pop(self.traj, None)

    async def drop(self, reason: str = "error") -> None:
        """``trajectory.dropped`` (``stale``, ``error`` or ``aborted``)."""
        await self._do(lambda: self.core.dropped(reason, self._now()))
        self.client._live.pop(self.traj, None)

    # -- model requests ----------------------------------------------------------------------
    async def generate(self, body: dict[str, Any] | None = None, *, prompt_tokens: int | None = None,
                       stream: bool = False, tool_call: bool | None = None, **fields: Any) -> Generation:
        """SGLang ``POST /generate`` (``input_ids``/``text``, ``sampling_params``, ...: as a
        ``body`` dict or keywords). ``tool_call``: whether the output is a tool call, when you
        know it already (else the next step tells). Raises :class:`EngineError` or
        :class:`EngineAborted` after publishing what the contract allows."""
        return await self._call(GENERATE, "sglang", {**(body or {}), **fields}, prompt_tokens, stream, tool_call)

    async def chat(self, body: dict[str, Any] | None = None, *, prompt_tokens: int | None = None,
                   stream: bool = False, tool_call: bool | None = None, **fields: Any) -> Generation:
        """OpenAI-compatible ``POST /v1/chat/completions`` (``model``, ``messages``, ...)."""
        return await self._call(CHAT, "openai", {**(body or {}), **fields}, prompt_tokens, stream, tool_call)

    async def completion(self, body: dict[str, Any] | None = None, *, prompt_tokens: int | None = None,
                         stream: bool = False, tool_call: bool | None = None, **fields: Any) -> Generation:
        """OpenAI-compatible ``POST /v1/completions`` (``model``, ``prompt``, ...)."""
        return await self._call(COMPLETIONS, "openai", {**(body or {}), **fields}, prompt_tokens, stream, tool_call)

    @asynccontextmanager
    async def request(self, prompt_tokens: int, *, engine: str | None = None) -> AsyncIterator["RequestSpan"]:
        """A model request made by some other client (your framework's engine):
        ``request.queued`` on entry; call ``span.first_token()`` when it comes (if you can
        see it) and ``span.done(...)`` with the answer. An exception in the block is an
        engine failure: the request stays queued (a retry re-sends it) and it is re-raised."""
        snap = self.core.snapshot()
        req, turn, calls = self.core.queue(prompt_tokens, self._now(), engine=engine)
        await self._publish(calls, snap)
        span = RequestSpan(self, req, turn, self._now())
        try:
            yield span
        except BaseException:
            await self._do(lambda: self.core.failed(req, self._now()))
            raise
        if not span.answered:
            raise RuntimeError(f"request {req}: the block ended without span.done(...)")

    async def _call(self, path: str, api: Api, body: dict[str, Any], prompt_tokens: int | None, stream: bool,
                    tool_call: bool | None) -> Generation:
        if self.client.http is None or self.client.base_url is None:
            raise RuntimeError("this client has no base_url: use trajectory.request() around your own engine calls")
        n = prompt_length(body, prompt_tokens, self.client.count_tokens)
        snap = self.core.snapshot()
        req, turn, calls = self.core.queue(n, self._now())
        await self._publish(calls, snap)
        if api == "sglang":
            body.setdefault("rid", req)
        if stream:
            body = openai_stream_body(body) if api == "openai" else {**body, "stream": True}
        sent = self._now()
        try:
            result = await self._send(path, api, body, req, turn, sent, stream)
        except (EngineError, ResponseError, httpx.HTTPError) as exc:
            await self._do(lambda: self.core.failed(req, self._now()))
            if isinstance(exc, EngineError):
                raise
            raise EngineError(f"request {req} to {path} failed: {exc!r}") from exc
        except BaseException:  # cancelled, interrupted: the request is no longer out
            await self._do(lambda: self.core.failed(req, self._now()))
            raise
        received = self._now()
        await self._do(lambda: self.core.answered(req, result.outcome, received, tool_call))
        if result.outcome.finish == "abort":
            raise EngineAborted(f"request {req} aborted by the engine: {result.outcome.message or ''}",
                                result.outcome, result)
        return result

    async def _send(self, path: str, api: Api, body: dict, req: str, turn: int, sent: float,
                    stream: bool) -> Generation:
        http, url = self.client.http, f"{self.client.base_url}{path}"
        assert http is not None
        if not stream:
            resp = await http.post(url, json=body)
            if resp.status_code >= 400:
                raise EngineError(error_text(resp.status_code, resp.text), resp.status_code, resp.text)
            return whole_generation(api, req, turn, response_json(resp), sent, self._now())
        async with http.stream("POST", url, json=body) as resp:
            if resp.status_code >= 400:
                text = (await resp.aread()).decode(errors="replace")
                raise EngineError(error_text(resp.status_code, text), resp.status_code, text)
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                await resp.aread()  # the server answered whole (it does not stream)
                return whole_generation(api, req, turn, response_json(resp), sent, self._now())
            chunks: list[dict] = []
            first: float | None = None
            async for line in resp.aiter_lines():
                chunk = sse_data(line)
                if chunk is None:
                    continue
                chunks.append(chunk)
                if first is None and is_first_token_chunk(chunk, api):
                    first = self._now()
                    meta = chunk.get("meta_info") or {}
                    cached = meta.get("cached_tokens") if isinstance(meta.get("cached_tokens"), int) else None
                    await self._do(lambda: self.core.first_token(req, first, cached_tokens=cached))
        return streamed_generation(api, req, turn, chunks, sent, self._now(), first)


class RequestSpan:
    """One model request made by another client, inside :meth:`Trajectory.request`."""

    def __init__(self, traj: Trajectory, req: str, turn: int, sent: float):
        self.traj, self.req, self.turn, self.sent = traj, req, turn, sent
        self.answered = False

    async def first_token(self, ts: float | None = None, *, cached_tokens: int | None = None) -> None:
        """The first output token came out (now, or at ``ts``): ``prefill.finished``."""
        t = self.traj
        await t._do(lambda: t.core.first_token(self.req, t._now() if ts is None else ts, cached_tokens=cached_tokens))

    async def done(self, output_tokens: int, finish: str = "stop", *, cached_tokens: int | None = None,
                   ttft: float | None = None, tool_call: bool | None = None) -> None:
        """The answer is in. ``finish``: ``stop``, ``length``, ``abort`` or ``tool``
        (OpenAI's ``tool_calls``); ``ttft``: seconds from sending to the first token, if known."""
        t = self.traj
        now = t._now()
        first = None if ttft is None or not math.isfinite(ttft) else min(now, self.sent + max(0.0, ttft))
        kind = "tool" if finish in ("tool", "tool_calls") else finish
        out = Outcome(output_tokens=output_tokens, finish=kind, cached_tokens=cached_tokens,  # type: ignore[arg-type]
                      first_token_ts=first)
        self.answered = True
        await t._do(lambda: t.core.answered(self.req, out, now, tool_call))


RolloutClient._handle = Trajectory
