"""The live engine table: a fold over engine events and the commands the allocator sent.

``EngineTable.apply(event)`` is the only way state changes, so the service rebuilds the
table after a restart by replaying the stream's engine and control events.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from prorsa_schemas import (
    EngineCommand,
    EngineDeregistered,
    EngineRegistered,
    EngineStats,
    EngineSwitched,
    EngineSwitchFailed,
    EngineSwitching,
    Event,
)

PD_ROLES = ("prefill", "decode")
ENGINE_EVENT_TYPES = frozenset(
    {"engine.registered", "engine.stats", "engine.switching", "engine.switched",
     "engine.switch_failed", "engine.deregistered"}
)


@dataclass(slots=True)
class Command:
    """A switch command in flight, tracked until engine.switched, switch_failed or expiry."""

    cmd: str
    engine: str
    to_role: str
    deadline: float
    issued_ts: float
    attempts: int = 1
    run: str = ""
    event_ids: set[str] = field(default_factory=set)
    """Ids of the engine.command events sent for it (the first and each retry): an echo of
    one already applied (our own publish read back from the stream) changes nothing."""
    expected_drain_s: float = 0.0
    """The drain the allocator expected when it chose this engine (set by the planner): the
    agent's ``seconds`` covers command to switched, drain included, so the switch time
    learned from it is net of this (else the gain test would count the drain twice)."""


@dataclass(slots=True)
class EngineView:
    """What the allocator knows about one engine."""

    engine: str
    server: str
    role: str
    gpus: int
    kv_capacity_tokens: int
    switch_modes: tuple[str, ...] = ()
    running_reqs: int = 0
    queued_reqs: int = 0
    kv_used_tokens: int = 0
    since_ts: float = 0.0
    """Event time the engine took its current role (registration or last switch)."""
    switched: bool = False
    """Whether the engine has changed role since it registered: the minimum dwell guards
    against bouncing an engine back, so it applies to switched engines, not to the role an
    engine registered with (nothing was decided for that one)."""
    switching_to: str | None = None
    """Set while a switch is under way (our command, or an engine.switching we observed)."""
    command: Command | None = None
    cooldown_until: float = -math.inf
    prefill_tokens_per_s: float | None = None
    """Computed (uncached) prefill tokens/s of the last engine.stats (prefill engines)."""
    cache_hit_rate: float | None = None
    """Prefix-cache hit ratio of the last engine.stats (prefill engines): with the rate,
    what a flip to decode would make its trajectories recompute (switching.py)."""

    @property
    def busy(self) -> bool:
        return self.running_reqs > 0 or self.queued_reqs > 0

    @property
    def committed_role(self) -> str:
        """The role to count this engine in: where it is going if a switch is under way."""
        return self.switching_to or self.role

    def load_key(self) -> tuple[int, int, str]:
        """Least loaded first: fewest requests, then least KV in use; the id breaks ties."""
        return (self.running_reqs + self.queued_reqs, self.kv_used_tokens, self.engine)


@dataclass
class EngineTable:
    """Registered engines by id, plus the commands in flight by cmd id."""

    failure_cooldown_s: float = 120.0
    engines: dict[str, EngineView] = field(default_factory=dict)
    commands: dict[str, Command] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    """Ids of commands that ended (switched, failed, abandoned): a late echo cannot reopen one."""
    switch_seconds: list[tuple[str | None, float]] = field(default_factory=list)
    """(mode, seconds net of the expected drain) of every engine.switched seen since the
    last ``take_switch_times``."""

    def apply(self, event: Event) -> str | None:
        """Fold one event in. Returns a short note when the event could not be applied
        (an unknown engine, a stale command echo), None otherwise. Never raises on a
        well-formed event: an engine event about an unknown engine is reported, not fatal."""
        if isinstance(event, EngineRegistered):
            self._register(event)
            return None
        if isinstance(event, EngineCommand):
            return self._command(event)
        engine_id = getattr(event, "engine", None)
        if engine_id is None:
            return None
        view = self.engines.get(engine_id)
        if view is None:
            return f"{event.type} for unregistered engine {engine_id!r}"
        if isinstance(event, EngineStats):
            view.running_reqs, view.queued_reqs = event.running_reqs, event.queued_reqs
            view.kv_used_tokens = event.kv_used_tokens
            if event.prefill_tokens_per_s is not None:
                view.prefill_tokens_per_s = event.prefill_tokens_per_s
            if event.cache_hit_rate is not None:
                view.cache_hit_rate = event.cache_hit_rate
            if event.kv_capacity_tokens > 0:
                view.kv_capacity_tokens = event.kv_capacity_tokens
            if view.switching_to is None and event.role != view.role:
                # The engine says otherwise: it is the authority on its own role.
                view.role, view.since_ts, view.switched = event.role, event.ts, True
        elif isinstance(event, EngineSwitching):
            view.switching_to = event.to_role
        elif isinstance(event, EngineSwitched):
            view.role, view.since_ts, view.switching_to = event.to_role, event.ts, None
            view.switched = True
            drain = view.command.expected_drain_s if view.command is not None else 0.0
            self.switch_seconds.append((event.mode, max(0.0, event.seconds - drain)))
            self._close(view, event.cmd)
        elif isinstance(event, EngineSwitchFailed):
            view.role, view.switching_to = event.role, None
            self._close(view, event.cmd)
            view.cooldown_until = event.ts + self.failure_cooldown_s
        elif isinstance(event, EngineDeregistered):
            if view.command is not None:
                self.commands.pop(view.command.cmd, None)
            del self.engines[engine_id]
        return None

    def _register(self, event: EngineRegistered) -> None:
        old = self.engines.get(event.engine)
        view = EngineView(
            engine=event.engine,
            server=event.server,
            role=event.role,
            gpus=event.gpus,
            kv_capacity_tokens=event.kv_capacity_tokens,
            switch_modes=tuple(event.switch_modes or ()),
            since_ts=event.ts,
        )
        if old is not None and old.role == event.role:
            view.since_ts = old.since_ts  # a re-registration is not a role change
            view.switched = old.switched
            view.cooldown_until = old.cooldown_until
        if old is not None and old.command is not None:
            # An agent re-registers after a restart: its command, if any, is over.
            self.commands.pop(old.command.cmd, None)
        self.engines[event.engine] = view

    def _command(self, event: EngineCommand) -> str | None:
        view = self.engines.get(event.engine)
        cmd = self.commands.get(event.cmd)
        if cmd is not None:  # a retry of a command in flight: same cmd id, new deadline
            if event.id not in cmd.event_ids:
                cmd.event_ids.add(event.id)
                cmd.attempts += 1
                cmd.deadline, cmd.issued_ts = max(cmd.deadline, event.deadline), event.ts
            return None
        if event.cmd in self.closed:
            return None
        if view is None:
            return f"engine.command {event.cmd!r} for unregistered engine {event.engine!r}"
        cmd = Command(event.cmd, event.engine, event.to_role, event.deadline, event.ts, 1, event.run, {event.id})
        self.commands[event.cmd] = cmd
        view.command, view.switching_to = cmd, event.to_role
        return None

    def _close(self, view: EngineView, cmd_id: str) -> None:
        self.commands.pop(cmd_id, None)
        self.closed.add(cmd_id)
        if view.command is None or view.command.cmd == cmd_id:
            view.command = None
        else:
            # The echo of another command (one we abandoned, or someone else's): our own
            # command for this engine is still in flight.
            view.switching_to = view.command.to_role

    def abandon(self, cmd_id: str, now: float) -> Command | None:
        """Stop tracking a command that missed its deadline too often; the engine is left
        alone for the failure cooldown and counted in the role it last reported."""
        cmd = self.commands.pop(cmd_id, None)
        if cmd is None:
            return None
        self.closed.add(cmd_id)
        view = self.engines.get(cmd.engine)
        if view is not None and view.command is cmd:
            view.command, view.switching_to = None, None
            view.cooldown_until = now + self.failure_cooldown_s
        return cmd

    def pd_engines(self) -> list[EngineView]:
        """Engines in (or switching between) the prefill and decode roles."""
        return [v for v in self.engines.values() if v.committed_role in PD_ROLES]

    def take_switch_times(self) -> list[tuple[str | None, float]]:
        out, self.switch_seconds = self.switch_seconds, []
        return out
