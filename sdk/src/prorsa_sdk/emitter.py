"""The client SDK an RL framework imports to publish trajectory lifecycle events.

Two front ends over one publisher:

* :class:`Emitter` for asyncio agent loops (``await em.request_queued(...)``);
* :class:`SyncEmitter` for threaded code: thread-safe, runs the bus in a background thread.

Each method builds and validates the contract event (a bad argument raises
:class:`prorsa_schemas.EventError` in the caller, at once), stamps ``ts`` from the clock
(or takes yours), gives it a unique ``id``, and buffers it. Buffered events are sent with
``Nats-Msg-Id = id``; while the bus is down they wait, and on reconnect they are re-sent
without duplicates. Events of one trajectory reach the stream in the order you emitted them.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import Literal

from pydantic import ValidationError

from prorsa_runtime.bus import Credentials
from prorsa_runtime.publisher import BufferFull, ReliablePublisher
from prorsa_schemas import (
    DEFAULT,
    DecodeFinished,
    Event,
    EventError,
    Namespace,
    PolicyUpdated,
    PrefillFinished,
    PrefillStarted,
    RequestQueued,
    RewardFinished,
    RewardStarted,
    RunStarted,
    SandboxReady,
    SandboxStarted,
    ToolFinished,
    ToolStarted,
    TrajectoryDispatched,
    TrajectoryDropped,
)

Clock = Callable[[], float]


def _default_url() -> str:
    return os.environ.get("PRORSA_NATS_URL", "nats://127.0.0.1:4222")


class _Builder:
    """Builds validated events; shared by the async and the sync emitter."""

    def __init__(self, run: str, clock: Clock):
        self.run = run
        self.clock = clock
        self._prefix = uuid.uuid4().hex[:12]
        self._counter = itertools.count(1)  # next() on a count is atomic under the GIL
        # Validate the run id once, up front, with the contract's own rule.
        try:
            PolicyUpdated(id="probe", ts=0.0, run=run, version=0)
        except ValidationError as exc:
            raise EventError.from_validation(exc) from None

    def new_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def make(self, cls: type[Event], ts: float | None, **fields: object) -> Event:
        """Build and validate; a bad argument raises EventError naming the field."""
        try:
            return cls(id=self.new_id(), ts=self.clock() if ts is None else ts, run=self.run, **fields)
        except ValidationError as exc:
            raise EventError.from_validation(exc) from None


class _Methods:
    """One method per rollout event. Subclasses define ``_emit(event, key)``."""

    _b: _Builder

    def _emit(self, event: Event, key: str | None):  # pragma: no cover - abstract
        raise NotImplementedError

    def run_started(
        self,
        mode: Literal["sync", "async"],
        batch_size: int,
        *,
        max_staleness: int | None = None,
        group_size: int | None = None,
        injection: Literal["replace", "group"] | None = None,
        prompt_tokens_mean: int | None = None,
        ts: float | None = None,
    ):
        """Describe the sampler (sync/async, batch, staleness, groups, injection)."""
        return self._emit(
            self._b.make(RunStarted, ts, mode=mode, batch_size=batch_size, max_staleness=max_staleness,
                group_size=group_size, injection=injection, prompt_tokens_mean=prompt_tokens_mean,
            ),
            None,
        )

    def dispatched(
        self, traj: str, prompt_tokens: int, *, group: str | None = None,
        policy_version: int | None = None, ts: float | None = None,
    ):
        """The data sampler launched trajectory ``traj``."""
        return self._emit(
            self._b.make(TrajectoryDispatched, ts, traj=traj, prompt_tokens=prompt_tokens, group=group,
                policy_version=policy_version,
            ),
            traj,
        )

    def sandbox_started(self, traj: str, mode: Literal["prewarm", "cold"], *, ts: float | None = None):
        return self._emit(self._b.make(SandboxStarted, ts, traj=traj, mode=mode), traj)

    def sandbox_ready(self, traj: str, *, ts: float | None = None):
        return self._emit(self._b.make(SandboxReady, ts, traj=traj), traj)

    def request_queued(
        self, traj: str, req: str, turn: int, prompt_tokens: int, *,
        engine: str | None = None, dp_rank: int | None = None, ts: float | None = None,
    ):
        """A model request joined the ready queue (a prefill arrival; FULL prompt length).
        ``dp_rank``: the attention data-parallel rank of ``engine`` it was routed to
        (SGLang's ``data_parallel_rank``), when the router says."""
        return self._emit(
            self._b.make(RequestQueued, ts, traj=traj, req=req, turn=turn, prompt_tokens=prompt_tokens,
                engine=engine, dp_rank=dp_rank,
            ),
            traj,
        )

    def prefill_started(self, traj: str, req: str, *, engine: str | None = None, ts: float | None = None):
        return self._emit(self._b.make(PrefillStarted, ts, traj=traj, req=req, engine=engine), traj)

    def prefill_finished(
        self, traj: str, req: str, *, engine: str | None = None, cached_tokens: int | None = None,
        decode_engine: str | None = None, ts: float | None = None,
    ):
        """Prefill done, first token out (a decode admission)."""
        return self._emit(
            self._b.make(PrefillFinished, ts, traj=traj, req=req, engine=engine, cached_tokens=cached_tokens,
                decode_engine=decode_engine,
            ),
            traj,
        )

    def decode_finished(
        self, traj: str, req: str, output_tokens: int,
        finish: Literal["tool", "stop", "length", "abort"], *, ts: float | None = None,
    ):
        return self._emit(
            self._b.make(DecodeFinished, ts, traj=traj, req=req, output_tokens=output_tokens, finish=finish
            ),
            traj,
        )

    def tool_started(
        self, traj: str, *, tool: str | None = None, calls: int | None = None, ts: float | None = None
    ):
        return self._emit(self._b.make(ToolStarted, ts, traj=traj, tool=tool, calls=calls), traj)

    def tool_finished(
        self, traj: str, result_tokens: int, *, ok: bool | None = None, ts: float | None = None
    ):
        return self._emit(
            self._b.make(ToolFinished, ts, traj=traj, result_tokens=result_tokens, ok=ok), traj
        )

    def reward_started(self, traj: str, *, ts: float | None = None):
        return self._emit(self._b.make(RewardStarted, ts, traj=traj), traj)

    def reward_finished(
        self, traj: str, admitted: bool, *, reward: float | None = None, ts: float | None = None
    ):
        return self._emit(
            self._b.make(RewardFinished, ts, traj=traj, admitted=admitted, reward=reward), traj
        )

    def dropped(
        self, traj: str, reason: Literal["stale", "error", "aborted"], *, ts: float | None = None
    ):
        return self._emit(self._b.make(TrajectoryDropped, ts, traj=traj, reason=reason), traj)

    def policy_updated(self, version: int, *, ts: float | None = None):
        """New weights reached the rollout engines."""
        return self._emit(self._b.make(PolicyUpdated, ts, version=version), None)


class Emitter(_Methods):
    """Async emitter. Every event method is a coroutine returning the event it queued.

    Example::

        async with Emitter(run="grpo-7", nats_url="nats://bus:4222") as em:
            await em.dispatched("t1", prompt_tokens=812)
            ...

    Without ``credentials`` it logs in with ``PRORSA_NATS_USER`` / ``PRORSA_NATS_PASSWORD``
    (or ``_TOKEN`` / ``_CREDS``) from the environment when they are set, else as given in
    the URL (``nats://rollout:PASSWORD@bus:4222``), else without auth.
    """

    def __init__(
        self,
        run: str,
        nats_url: str | None = None,
        *,
        namespace: Namespace = DEFAULT,
        credentials: Credentials | None = None,
        clock: Clock = time.time,
        max_buffer: int = 1_000_000,
        ack_timeout: float = 5.0,
        max_inflight: int = 2048,
        name: str = "prorsa-sdk",
    ):
        self._b = _Builder(run, clock)
        self.publisher = ReliablePublisher(
            nats_url or _default_url(), name, namespace,
            credentials=credentials if credentials is not None else Credentials.from_env(),
            max_buffer=max_buffer, ack_timeout=ack_timeout, max_inflight=max_inflight,
        )

    @property
    def run(self) -> str:
        return self._b.run

    @property
    def pending(self) -> int:
        """Events emitted but not yet durably stored by the stream."""
        return self.publisher.pending

    async def start(self) -> "Emitter":
        """Start the background sender. The bus need not be up yet: events wait for it."""
        await self.publisher.start()
        return self

    async def _emit_async(self, event: Event, key: str | None) -> Event:
        self.publisher.submit(event, key)
        return event

    def _emit(self, event: Event, key: str | None):
        return self._emit_async(event, key)

    async def emit(self, event: Event) -> Event:
        """Queue an event you built yourself (any contract type)."""
        key = getattr(event, "traj", None) or getattr(event, "engine", None)
        self.publisher.submit(event, key)
        return event

    async def flush(self, timeout: float | None = 30.0) -> None:
        """Wait until every emitted event is stored by the stream."""
        await self.publisher.flush(timeout)

    async def close(self, timeout: float | None = 30.0) -> None:
        """Flush (up to ``timeout``) and disconnect."""
        await self.publisher.close(timeout)

    async def __aenter__(self) -> "Emitter":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class SyncEmitter(_Methods):
    """Thread-safe, blocking-free emitter for synchronous code.

    The bus runs on a private event loop in a daemon thread. Event methods validate in the
    calling thread and return the event immediately; :meth:`flush` blocks until stored.
    """

    def __init__(self, run: str, nats_url: str | None = None, **kwargs):
        clock = kwargs.pop("clock", time.time)
        self._b = _Builder(run, clock)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="prorsa-sdk")
        self._thread.start()
        kwargs.setdefault("name", "prorsa-sdk-sync")

        async def make() -> Emitter:
            em = Emitter(run, nats_url, clock=clock, **kwargs)
            return await em.start()

        self._async = asyncio.run_coroutine_threadsafe(make(), self._loop).result()
        self._closed = False

    def _emit(self, event: Event, key: str | None) -> Event:
        if self._closed:
            raise RuntimeError("SyncEmitter is closed")
        pub = self._async.publisher
        if pub.pending >= pub.max_buffer:
            raise BufferFull(f"{pub.pending} events waiting for the bus (max_buffer={pub.max_buffer})")
        self._loop.call_soon_threadsafe(pub.submit, event, key)
        return event

    def emit(self, event: Event) -> Event:
        key = getattr(event, "traj", None) or getattr(event, "engine", None)
        return self._emit(event, key)

    @property
    def pending(self) -> int:
        return self._async.pending

    def flush(self, timeout: float | None = 30.0) -> None:
        fut: Future = asyncio.run_coroutine_threadsafe(self._async.flush(timeout), self._loop)
        fut.result()

    def close(self, timeout: float | None = 30.0) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            asyncio.run_coroutine_threadsafe(self._async.close(timeout), self._loop).result()
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    def __enter__(self) -> "SyncEmitter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["Emitter", "SyncEmitter"]
