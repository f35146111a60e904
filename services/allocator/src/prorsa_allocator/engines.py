"""The live engine table: the engine registry (:mod:`prorsa_schemas.registry`) and the
commands the allocator sent.

``EngineTable.apply(event)`` is the only way state changes, so the service rebuilds the
table after a restart by replaying the stream's engine and control events. The registry
folds the engine events (role, registration, load figures); this module adds what they
mean for the allocator: when an engine took its role (the minimum dwell), the command in
flight and its outcome, the failure cooldown and the switch times learned.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from prorsa_schemas import (
    EngineCommand,
    EngineDeregistered,
    EngineRegistered,
    EngineStats,
    EngineSwitched,
    EngineSwitchFailed,
    Event,
)
from prorsa_schemas.fold import Mutators
from prorsa_schemas.registry import EngineRecord, EngineRegistry, RegistryChange

PD_ROLES = ("prefill", "decode")


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
class EngineView(EngineRecord):
    """What the allocator knows about one engine: the registry's entry (role, registration,
    last load report: :class:`~prorsa_schemas.registry.EngineRecord`) and the allocator's
    own state for it.

    ``switching_to`` is where the engine is committed to go: set by the engine's
    ``engine.switching`` and by the allocator's own command (before the agent has started it).
    """

    since_ts: float = 0.0
    """Event time the engine took its current role (registration or last switch)."""
    switched: bool = False
    """Whether the engine has changed role since it registered: the minimum dwell guards
    against bouncing an engine back, so it applies to switched engines, not to the role an
    engine registered with (nothing was decided for that one)."""
    command: Command | None = None
    cooldown_until: float = -math.inf
    cannot_switch: bool = False
    """The engine registered with an empty ``switch_modes``: it can neither flip in place nor
    be restarted in the other role (an engine its agent did not launch, whose flags rule the
    in-place flip out), so its agent refuses every switch and it is never chosen. An engine
    whose registration does not say (no ``switch_modes``) may be."""

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
    """Registered engines by id (the engine registry, :mod:`prorsa_schemas.registry`, with
    :class:`EngineView` entries), plus the commands in flight by cmd id."""

    failure_cooldown_s: float = 120.0
    registry: EngineRegistry = field(
        default_factory=lambda: EngineRegistry(keep_unregistered=False, entry_type=EngineView))
    commands: dict[str, Command] = field(default_factory=dict)
    closed: set[str] = field(default_factory=set)
    """Ids of commands that ended (switched, failed, abandoned): a late echo cannot reopen one."""
    switch_seconds: list[tuple[str | None, float]] = field(default_factory=list)
    """(mode, seconds net of the expected drain) of every engine.switched seen since the
    last ``take_switch_times``."""

    @property
    def engines(self) -> dict[str, EngineView]:
        return self.registry.engines  # type: ignore[return-value]

    def apply(self, event: Event) -> str | None:
        """Fold one event in. Returns a short note when the event could not be applied
        (an unknown engine, a stale command echo), None otherwise. Never raises on a
        well-formed event: an engine event about an unknown engine is reported, not fatal."""
        if event.type == "engine.command":
            return self._command(event)  # type: ignore[arg-type]
        change = self.registry.apply(event)
        if change is None:
            return None
        if change.record is None and change.previous is None:
            return f"{event.type} for unregistered engine {event.engine!r}"  # type: ignore[attr-defined]
        _mutate(self, event, change)
        return None

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

    def close(self, view: EngineView, cmd_id: str) -> None:
        """A command ended (switched or failed): it is no longer in flight."""
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


# What each engine event means for the allocator, after the registry has applied it
# (``change.record`` is the engine's view; the registry has set its role and figures).
_mutate: Mutators[Callable[[EngineTable, Event, RegistryChange], None]] = Mutators()


@_mutate.on("engine.registered")
def _registered(table: EngineTable, ev: EngineRegistered, change: RegistryChange) -> None:
    view, old = change.record, change.previous
    assert isinstance(view, EngineView)
    view.since_ts = ev.ts
    view.cannot_switch = ev.switch_modes is not None and not ev.switch_modes
    if isinstance(old, EngineView):
        if old.role == ev.role:
            view.since_ts = old.since_ts  # a re-registration is not a role change
            view.switched = old.switched
            view.cooldown_until = old.cooldown_until
        if old.command is not None:
            # An agent re-registers after a restart: its command, if any, is over.
            table.commands.pop(old.command.cmd, None)


@_mutate.on("engine.stats")
def _stats(table: EngineTable, ev: EngineStats, change: RegistryChange) -> None:
    view = change.record
    assert isinstance(view, EngineView)
    if view.switching_to is None and change.role_before != view.role:
        # The engine says otherwise: it is the authority on its own role.
        view.since_ts, view.switched = ev.ts, True


@_mutate.on("engine.switched")
def _switched(table: EngineTable, ev: EngineSwitched, change: RegistryChange) -> None:
    view = change.record
    assert isinstance(view, EngineView)
    view.since_ts, view.switched = ev.ts, True
    drain = view.command.expected_drain_s if view.command is not None else 0.0
    table.switch_seconds.append((ev.mode, max(0.0, ev.seconds - drain)))
    table.close(view, ev.cmd)


@_mutate.on("engine.switch_failed")
def _switch_failed(table: EngineTable, ev: EngineSwitchFailed, change: RegistryChange) -> None:
    view = change.record
    assert isinstance(view, EngineView)
    table.close(view, ev.cmd)
    view.cooldown_until = ev.ts + table.failure_cooldown_s


@_mutate.on("engine.deregistered")
def _deregistered(table: EngineTable, ev: EngineDeregistered, change: RegistryChange) -> None:
    old = change.previous
    if isinstance(old, EngineView) and old.command is not None:
        table.commands.pop(old.command.cmd, None)
