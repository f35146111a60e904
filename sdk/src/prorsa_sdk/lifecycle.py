"""One trajectory's lifecycle as the contract wants it: the pure core behind the
trajectory handles (no I/O, no clock: every method takes the time it happened).

Each method returns the emitter calls to make, in order (:class:`Call`: an emitter
method name and its arguments); the async and sync handles run them. The core keeps:

* turn numbers and request ids (``<traj>:<n>``, one per ``request.queued``);
* a request that failed before the engine served it (HTTP 5xx, a refused connection, an
  abort while still waiting): it stays queued, and the next request of the trajectory
  re-sends it under the same id without a second ``request.queued`` (the contract has no
  queued -> queued move);
* an answer whose finish the engine cannot tell (``/generate`` does not know whether the
  text is a tool call): its ``decode.finished`` is held, with the answer's time, until
  the next step says which it was: another request or a tool -> ``tool``; a reward, a
  drop or the end of the trajectory -> the engine's ``stop``/``length``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .outcome import Outcome


@dataclass(frozen=True)
class Call:
    """One emitter call: ``getattr(emitter, method)(*args, **kwargs)``."""

    method: str
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


class LifecycleError(RuntimeError):
    """A trajectory handle used out of order (e.g. a reward before any request finished)."""


Phase = Literal["new", "ready", "queued", "decode", "answered", "tool", "reward", "done", "dropped"]


MAX_TOKENS = 10_000_000  # the contract's bound on a token count


def _tokens(n: object, name: str) -> int:
    """A token count the contract accepts, checked before any state changes."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOKENS:
        raise ValueError(f"{name} must be an int in [0, {MAX_TOKENS}], got {n!r}")
    return n


@dataclass
class _Held:
    req: str
    output_tokens: int
    finish: Literal["stop", "length"]
    ts: float


class TrajectoryCore:
    """The lifecycle of trajectory ``traj``; see the module docstring."""

    def __init__(self, traj: str):
        self.traj = traj
        self.phase: Phase = "new"
        self.turn = 0
        self.requests = 0
        self.req: str | None = None  # the request in flight or held
        self.prompt_tokens = 0
        self._held: _Held | None = None
        self.sending = False  # a request is out and not yet answered or failed

    # -- helpers ----------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The state before a step; :meth:`restore` it when the step's first event is refused
        (a value the contract forbids), so nothing the bus never saw is assumed."""
        return dict(self.__dict__)

    def restore(self, snap: dict[str, Any]) -> None:
        self.__dict__.update(snap)

    @property
    def live(self) -> bool:
        return self.phase not in ("done", "dropped")

    def _need_live(self, what: str) -> None:
        if not self.live:
            raise LifecycleError(f"trajectory {self.traj} is {self.phase}: cannot {what}")

    def _release(self, as_tool: bool) -> list[Call]:
        """Publish the held decode.finished, as ``tool`` or as the engine's finish."""
        h, self._held = self._held, None
        if h is None:
            return []
        finish = "tool" if as_tool else h.finish
        self.phase = "tool" if as_tool else "reward"
        if as_tool:
            self.turn += 1
        return [Call("decode_finished", (self.traj, h.req, h.output_tokens, finish), {"ts": h.ts})]

    # -- the steps ----------------------------------------------------------------------
    def dispatched(self, prompt_tokens: int, ts: float, **kw: Any) -> list[Call]:
        if self.phase != "new":
            raise LifecycleError(f"trajectory {self.traj} was dispatched already")
        _tokens(prompt_tokens, "prompt_tokens")
        self.phase = "ready"
        self.prompt_tokens = prompt_tokens
        return [Call("dispatched", (self.traj, prompt_tokens), {"ts": ts, **kw})]

    def sandbox_started(self, mode: str, ts: float) -> list[Call]:
        self._need_live("start a sandbox")
        return [Call("sandbox_started", (self.traj, mode), {"ts": ts})]

    def sandbox_ready(self, ts: float) -> list[Call]:
        self._need_live("report a sandbox ready")
        return [Call("sandbox_ready", (self.traj,), {"ts": ts})]

    def queue(self, prompt_tokens: int, ts: float, engine: str | None = None,
              dp_rank: int | None = None) -> tuple[str, int, list[Call]]:
        """A model request is about to be sent: ``(req, turn, calls)``. A request still queued
        (its last send failed) is re-sent under its id, with no new event."""
        self._need_live("send a model request")
        _tokens(prompt_tokens, "prompt_tokens")
        if self.sending:
            raise LifecycleError(f"trajectory {self.traj}: request {self.req} is still being answered")
        self.sending = True
        if self.phase == "queued":
            assert self.req is not None
            return self.req, self.turn, []
        if self.phase == "decode":
            raise LifecycleError(f"trajectory {self.traj}: request {self.req} is still being answered")
        calls = self._release(as_tool=True)
        self.requests += 1
        self.req = f"{self.traj}:{self.requests}"
        self.prompt_tokens = prompt_tokens
        self.phase = "queued"
        kw: dict[str, Any] = {"ts": ts}
        if engine is not None:
            kw["engine"] = engine
        if dp_rank is not None:
            kw["dp_rank"] = dp_rank
        calls.append(Call("request_queued", (self.traj, self.req, self.turn, prompt_tokens), kw))
        return self.req, self.turn, calls

    def first_token(self, req: str, ts: float, *, cached_tokens: int | None = None, engine: str | None = None,
                    decode_engine: str | None = None) -> list[Call]:
        """The first output token of ``req`` came out: prefill.finished (once)."""
        if self.phase != "queued" or req != self.req:
            return []
        self.phase = "decode"
        kw: dict[str, Any] = {"ts": ts}
        for k, v in (("cached_tokens", cached_tokens), ("engine", engine), ("decode_engine", decode_engine)):
            if v is not None:
                kw[k] = v
        return [Call("prefill_finished", (self.traj, req), kw)]

    def answered(self, req: str, out: Outcome, ts: float, tool_call: bool | None = None) -> list[Call]:
        """The engine answered ``req`` at ``ts``. ``tool_call``: whether the output is a tool call
        (None: unknown yet, unless the engine said tool_calls)."""
        if req != self.req or self.phase not in ("queued", "decode"):
            raise LifecycleError(f"trajectory {self.traj}: no request {req} waiting for an answer")
        self.sending = False
        if out.finish == "abort" and self.phase == "queued" and out.output_tokens == 0 and out.first_token_ts is None:
            return []  # aborted while waiting: nothing was served, the request stays queued
        calls = self.first_token(req, out.first_token_ts if out.first_token_ts is not None else ts,
                                 cached_tokens=out.cached_tokens)
        if out.finish == "abort":
            self.phase = "ready"  # the contract's decode -> ready; the next request re-prefills
            return calls + [Call("decode_finished", (self.traj, req, out.output_tokens, "abort"), {"ts": ts})]
        if tool_call is None and out.finish == "tool":
            tool_call = True
        finish = "length" if out.finish == "length" else "stop"
        self._held = _Held(req, out.output_tokens, finish, ts)
        self.phase = "answered"
        if tool_call is None:
            return calls
        return calls + self._release(as_tool=tool_call)

    def failed(self, req: str, ts: float) -> list[Call]:
        """The send of ``req`` failed before a whole answer came: a request not yet served stays
        queued (a retry re-sends it); one whose first token was out is an abort."""
        if req != self.req or self.phase not in ("queued", "decode"):
            return []
        self.sending = False
        if self.phase == "decode":
            # The first token was out, then the connection broke: the request is lost
            # mid-decode, which the contract calls an abort.
            self.phase = "ready"
            return [Call("decode_finished", (self.traj, req, 0, "abort"), {"ts": ts})]
        return []

    def tool_started(self, ts: float, tool: str | None = None, calls: int | None = None) -> list[Call]:
        self._need_live("start a tool")
        out = self._release(as_tool=True)
        if self.phase != "tool":
            raise LifecycleError(f"trajectory {self.traj} is {self.phase}: a tool follows a model answer")
        kw: dict[str, Any] = {"ts": ts}
        if tool is not None:
            kw["tool"] = tool
        if calls is not None:
            kw["calls"] = calls
        return out + [Call("tool_started", (self.traj,), kw)]

    def tool_finished(self, result_tokens: int, ts: float, ok: bool | None = None) -> list[Call]:
        if self.phase != "tool":
            raise LifecycleError(f"trajectory {self.traj} is {self.phase}: no tool is running")
        _tokens(result_tokens, "result_tokens")
        self.phase = "ready"
        kw: dict[str, Any] = {"ts": ts}
        if ok is not None:
            kw["ok"] = ok
        return [Call("tool_finished", (self.traj, result_tokens), kw)]

    def reward_started(self, ts: float) -> list[Call]:
        self._need_live("start a reward")
        out = self._release(as_tool=False)
        if self.phase != "reward":
            raise LifecycleError(f"trajectory {self.traj} is {self.phase}: a reward follows the last answer")
        return out + [Call("reward_started", (self.traj,), {"ts": ts})]

    def reward_finished(self, admitted: bool, ts: float, reward: float | None = None) -> list[Call]:
        self._need_live("finish a reward")
        if not isinstance(admitted, bool) or (reward is not None and not math.isfinite(reward)):
            raise ValueError(f"admitted must be a bool and reward finite, got {admitted!r}, {reward!r}")
        out = self._release(as_tool=False)
        if self.phase != "reward":
            raise LifecycleError(f"trajectory {self.traj} is {self.phase}: a reward follows the last answer")
        self.phase = "done"
        kw: dict[str, Any] = {"ts": ts}
        if reward is not None:
            kw["reward"] = reward
        return out + [Call("reward_finished", (self.traj, admitted), kw)]

    def dropped(self, reason: str, ts: float) -> list[Call]:
        if not self.live or self.phase == "new":
            return []
        out = self._release(as_tool=False)
        self.phase = "dropped"
        return out + [Call("dropped", (self.traj, reason), {"ts": ts})]

    def ended(self) -> list[Call]:
        """The code driving the trajectory is done with it (its reward may come later):
        a held answer is published with the engine's finish."""
        return self._release(as_tool=False)
