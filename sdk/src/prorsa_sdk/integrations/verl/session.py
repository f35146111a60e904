"""What the verl adapter keeps per process and per trajectory. No verl import here: this
runs in verl's agent-loop workers (Ray actors) and in its trainer.

* :class:`Session`: where requests go (the SGLang router) and where events go (an emitter,
  made on first use from ``PRORSA_NATS_URL`` and the run name); one model client per event
  loop. Picklable: verl ships its LLM client to each agent-loop worker, which then makes
  its own emitter and HTTP connections.
* :class:`LiveTrajectory`: one verl agent-loop run, the trajectory it publishes. It is
  dispatched when its prompt's length is known (the agent loop built its first prompt, or
  its first request leaves), and :func:`current_trajectory` finds it from any code the agent
  loop awaits (a ``ContextVar``: the server client, tools, a custom agent loop's sandbox).
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from prorsa_schemas import Namespace

from ...client import RewardSpan, RolloutClient, ToolSpan, Trajectory
from ...emitter import SyncEmitter

ENV_ROUTER = "PRORSA_ROUTER_URL"
ENV_RUN = "PRORSA_RUN"
ENV_PREFIX = "PRORSA_SUBJECT_PREFIX"
ENV_STREAM = "PRORSA_STREAM"


class Session:
    """The router's URL and the emitter of one process (see the module docstring).

    ``router_url``: the SGLang router in PD mode (else ``$PRORSA_ROUTER_URL``). ``run``: the
    run name of the events (else ``$PRORSA_RUN``, else ``default_run``). ``emitter``: a
    :class:`~prorsa_sdk.SyncEmitter` to use in this process (not carried to other processes);
    without it one is made on first use on ``nats_url`` (else ``$PRORSA_NATS_URL``)."""

    def __init__(self, router_url: str | None = None, *, run: str | None = None, default_run: str = "verl",
                 nats_url: str | None = None, namespace: Namespace | None = None, emitter: Any = None):
        url = router_url or os.environ.get(ENV_ROUTER)
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"router_url must be an http(s) URL, got {url!r}")
        self.router_url = url.rstrip("/") if url else None
        self.run = run or os.environ.get(ENV_RUN) or default_run
        self.nats_url = nats_url
        prefix, stream = os.environ.get(ENV_PREFIX), os.environ.get(ENV_STREAM)
        self.namespace = namespace or (Namespace(prefix=prefix or "prorsa", stream=stream or "PRORSA")
                                       if prefix or stream else None)
        self._emitter = emitter
        self._clients: dict[int, RolloutClient] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_emitter"], state["_clients"] = None, {}
        return state

    @property
    def emitter(self) -> Any:
        if self._emitter is None:
            kw = {"namespace": self.namespace} if self.namespace is not None else {}
            self._emitter = SyncEmitter(self.run, self.nats_url, name="prorsa-verl", **kw)
        return self._emitter

    def client(self) -> RolloutClient:
        """The model client of the running event loop (httpx connections belong to one loop)."""
        if self.router_url is None:
            raise ValueError(f"the SGLang router's URL is needed: pass router_url= or set ${ENV_ROUTER} "
                             "(e.g. http://router:30000)")
        loop = asyncio.get_running_loop()
        c = self._clients.get(id(loop))
        if c is None:
            c = self._clients[id(loop)] = RolloutClient(self.emitter, self.router_url)
        return c

    async def flush(self, timeout: float = 30.0) -> None:
        """Wait until every event published so far is stored (without blocking the loop)."""
        if self._emitter is not None:
            await asyncio.to_thread(self._emitter.flush, timeout)

    async def aclose(self) -> None:
        """Close this loop's model client (the emitter stays: it may serve other loops)."""
        c = self._clients.pop(id(asyncio.get_running_loop()), None)
        if c is not None:
            await c.aclose()


def config_get(config: Any, *path: str) -> Any:
    """``config.a.b`` of a verl config (an OmegaConf ``DictConfig`` or a dataclass); None if missing."""
    for key in path:
        if config is None:
            return None
        config = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    return config


_CURRENT: ContextVar["LiveTrajectory | None"] = ContextVar("prorsa_verl_trajectory", default=None)


def current_trajectory() -> "LiveTrajectory | None":
    """The trajectory of the agent-loop run this code serves (None outside one)."""
    return _CURRENT.get()


def trajectory_id(step: object, sample_index: object, rollout_n: object, validate: bool) -> str:
    """``<step>-<sample index>-<rollout n>-<6 hex>`` (``val-`` first for a validation run):
    readable, and unique even where the batch has no ``index`` column."""
    return f"{'val-' if validate else ''}{step}-{sample_index}-{rollout_n}-{uuid.uuid4().hex[:6]}"


class LiveTrajectory:
    """One agent-loop run's trajectory (see the module docstring)."""

    def __init__(self, session: Session, traj: str, *, group: str | None = None):
        self.session, self.traj, self.group = session, traj, group
        self.handle: Trajectory | None = None
        self.rewarded = False

    def enter(self) -> object:
        """Make this the current trajectory of the running task; returns the token for :meth:`leave`."""
        return _CURRENT.set(self)

    @staticmethod
    def leave(token: object) -> None:
        _CURRENT.reset(token)  # type: ignore[arg-type]

    @property
    def phase(self) -> str:
        return "new" if self.handle is None else self.handle.core.phase

    async def dispatch(self, prompt_tokens: int) -> Trajectory:
        """``trajectory.dispatched`` (once): the prompt's length is known."""
        if self.handle is None:
            handle = self.session.client().trajectory(self.traj, prompt_tokens, group=self.group)
            await handle.start()
            self.handle = handle
        return self.handle

    def _need(self) -> Trajectory:
        if self.handle is None:
            raise RuntimeError(f"trajectory {self.traj} is not dispatched yet: its first prompt is built "
                               "(ct_build_initial_tokens) before a sandbox, tool or reward")
        return self.handle

    @asynccontextmanager
    async def sandbox(self, mode: str = "cold") -> AsyncIterator[None]:
        """``sandbox.started`` ... ``sandbox.ready`` around your agent loop's sandbox start."""
        async with self._need().sandbox(mode):
            yield

    @asynccontextmanager
    async def tool(self, name: str | None = None, calls: int | None = None) -> AsyncIterator[ToolSpan]:
        """``tool.started`` ... ``tool.finished`` (set ``span.result_tokens``)."""
        async with self._need().tool(name, calls) as span:
            yield span

    @property
    def rewardable(self) -> bool:
        """The last model answer is in (the contract's reward follows an answer, not a tool)."""
        return self.handle is not None and self.handle.core.phase in ("answered", "reward")

    @asynccontextmanager
    async def reward(self) -> AsyncIterator[RewardSpan]:
        """``reward.started`` ... ``reward.finished`` (set ``span.reward``, ``span.admitted``)."""
        async with self._need().reward() as span:
            yield span
        self.rewarded = True

    async def finish(self, reward: float | None) -> None:
        """The agent loop and its post-processing are done. A reward known here (the agent loop
        set it) is published if no reward was; without one the held answer is published with
        the engine's finish and the trajectory waits for its reward from the trainer. A run
        that ended on a tool result (verl drops a result past ``response_length``) has no
        answer to reward: it is published as dropped (``aborted``)."""
        h = self.handle
        if h is None or not h.core.live or self.rewarded:
            return
        if not self.rewardable:
            await h.drop("aborted")
        elif reward is not None:
            await h.rewarded(True, reward)
            self.rewarded = True
        else:
            await h.__aexit__(None, None, None)

    async def fail(self, exc: BaseException) -> None:
        """The run raised: ``trajectory.dropped`` (``aborted`` when cancelled, else ``error``)."""
        h = self.handle
        if h is not None and h.core.live:
            await h.drop("aborted" if isinstance(exc, asyncio.CancelledError) else "error")


__all__ = ["LiveTrajectory", "Session", "config_get", "current_trajectory", "trajectory_id"]
