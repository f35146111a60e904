"""The engine registry: the engine events folded into a table of engines and their roles.

Pure, and the one fold of ``engine.registered`` / ``engine.stats`` / ``engine.switching`` /
``engine.switched`` / ``engine.switch_failed`` / ``engine.deregistered`` in the project: the
tracker's engine table, the allocator's, the forecaster's engine roles and the console's
engines per role all read it. An engine is keyed by its ``engine`` id (engines serve the
whole cluster, not one run).

What an engine agent reports is taken as true now, even when it does not follow from what
came before: a report about an engine that never registered, a switch that starts while
another is in flight, a switch from a role the engine is not in. Such an event is applied
and its problem returned (the tracker records them as anomalies); the newest report wins.

* ``engine.registered`` replaces the engine's entry (a re-registration starts afresh).
* ``engine.stats`` sets the role and the load figures of the last report; an optional rate
  it leaves out (``prefill_tokens_per_s``, ``decode_tokens_per_s``, ``cache_hit_rate``) and a
  ``kv_capacity_tokens`` of 0 (not known to the agent) keep the last value reported.
* ``engine.switching`` marks the switch in flight (cmd, target role, since when).
* ``engine.switched`` sets the new role; ``engine.switch_failed`` the role the engine is in.
* ``engine.deregistered`` removes the entry.

A report about an unregistered engine makes an entry with ``registered=False`` (role from
the event) when the registry keeps them (``keep_unregistered``, the default), and nothing
otherwise (the allocator plans only with engines that registered).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from .events import (
    EngineDeregistered,
    EngineRegistered,
    EngineStats,
    EngineSwitched,
    EngineSwitchFailed,
    EngineSwitching,
    Event,
    Parallel,
)
from .fold import Mutators

REGISTRY_TYPES = frozenset({"engine.registered", "engine.stats", "engine.switching", "engine.switched",
                            "engine.switch_failed", "engine.deregistered"})
"""The event types the registry folds (``engine.command`` is the allocator's, not an engine's report)."""


@dataclass(slots=True)
class EngineRecord:
    """One engine as its agent last reported it."""

    engine: str
    role: str
    registered: bool = False
    """False: known only from a later report (no ``engine.registered`` seen for it)."""
    server: str | None = None
    gpus: int | None = None
    kv_capacity_tokens: int | None = None
    url: str | None = None
    parallel: Parallel | None = None
    switch_modes: tuple[str, ...] = ()
    switching_cmd: str | None = None
    switching_to: str | None = None
    switching_since: float | None = None
    running_reqs: int = 0
    queued_reqs: int = 0
    kv_used_tokens: int = 0
    prefill_tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    cache_hit_rate: float | None = None
    stats_ts: float | None = None
    updated_ts: float = 0.0


@dataclass(slots=True)
class RegistryChange:
    """What one event did to the registry."""

    record: EngineRecord | None
    """The engine's entry after the event; None when it was removed or not kept."""
    known: bool
    """Whether the engine was registered before the event."""
    role_before: str | None
    """Its role before the event (None: no entry)."""
    previous: EngineRecord | None = None
    """The entry that ``engine.registered`` replaced or ``engine.deregistered`` removed."""
    problems: list[str] = field(default_factory=list)
    """What did not follow from the registry's state (applied all the same)."""


@dataclass
class EngineRegistry:
    """Engines by id; :meth:`apply` is the only way the table changes."""

    keep_unregistered: bool = True
    entry_type: type[EngineRecord] = EngineRecord
    """The class of an entry: a consumer may extend :class:`EngineRecord` with its own state."""
    engines: dict[str, EngineRecord] = field(default_factory=dict)

    def apply(self, ev: Event) -> RegistryChange | None:
        """Fold one event in; None for an event type the registry does not fold."""
        handler = _mutate.get(ev.type)
        if handler is None:
            return None
        engine = ev.engine  # type: ignore[attr-defined]
        rec = self.engines.get(engine)
        change = RegistryChange(rec, rec is not None and rec.registered, rec.role if rec is not None else None)
        if ev.type != "engine.registered":
            if rec is None or not rec.registered:
                change.problems.append(f"{ev.type} for engine {engine!r}, which is not registered")
                if rec is None and ev.type != "engine.deregistered":
                    if not self.keep_unregistered:
                        return change
                    role = getattr(ev, "role", None) or getattr(ev, "from_role", None) or "mixed"
                    rec = change.record = self.engines[engine] = self.entry_type(engine=engine, role=role)
            if rec is not None:
                rec.updated_ts = max(rec.updated_ts, ev.ts)
        handler(self, ev, change)
        return change

    def roles(self) -> dict[str, str]:
        """Engine id -> role, for every entry."""
        return {e: r.role for e, r in self.engines.items()}


Mutate = Callable[[EngineRegistry, Event, RegistryChange], None]
_mutate: Mutators[Mutate] = Mutators()


@_mutate.on("engine.registered")
def _registered(reg: EngineRegistry, ev: EngineRegistered, change: RegistryChange) -> None:
    change.previous = change.record
    change.record = reg.engines[ev.engine] = reg.entry_type(
        engine=ev.engine,
        role=ev.role,
        registered=True,
        server=ev.server,
        gpus=ev.gpus,
        kv_capacity_tokens=ev.kv_capacity_tokens,
        url=ev.url,
        parallel=ev.parallel,
        switch_modes=tuple(ev.switch_modes or ()),
        updated_ts=ev.ts,
    )


@_mutate.on("engine.stats")
def _stats(reg: EngineRegistry, ev: EngineStats, change: RegistryChange) -> None:
    rec = change.record
    assert rec is not None
    rec.role = ev.role
    rec.running_reqs = ev.running_reqs
    rec.queued_reqs = ev.queued_reqs
    rec.kv_used_tokens = ev.kv_used_tokens
    # Gauges: a figure the report leaves out keeps its last value.
    if ev.kv_capacity_tokens > 0 or rec.kv_capacity_tokens is None:
        rec.kv_capacity_tokens = ev.kv_capacity_tokens
    if ev.prefill_tokens_per_s is not None:
        rec.prefill_tokens_per_s = ev.prefill_tokens_per_s
    if ev.decode_tokens_per_s is not None:
        rec.decode_tokens_per_s = ev.decode_tokens_per_s
    if ev.cache_hit_rate is not None:
        rec.cache_hit_rate = ev.cache_hit_rate
    rec.stats_ts = ev.ts


@_mutate.on("engine.switching")
def _switching(reg: EngineRegistry, ev: EngineSwitching, change: RegistryChange) -> None:
    rec = change.record
    assert rec is not None
    if rec.switching_cmd is not None and rec.switching_cmd != ev.cmd:
        change.problems.append(f"engine {ev.engine!r} starts switch {ev.cmd!r} while {rec.switching_cmd!r} is in flight")
    if ev.from_role != rec.role:
        change.problems.append(f"engine {ev.engine!r} switches from {ev.from_role} but its role is {rec.role}")
    rec.switching_cmd = ev.cmd
    rec.switching_to = ev.to_role
    rec.switching_since = ev.ts


@_mutate.on("engine.switched")
def _switched(reg: EngineRegistry, ev: EngineSwitched, change: RegistryChange) -> None:
    rec = change.record
    assert rec is not None
    if rec.switching_cmd is not None and rec.switching_cmd != ev.cmd:
        change.problems.append(f"engine {ev.engine!r} finished switch {ev.cmd!r} but {rec.switching_cmd!r} was in flight")
    rec.role = ev.to_role
    rec.switching_cmd = rec.switching_to = rec.switching_since = None


@_mutate.on("engine.switch_failed")
def _switch_failed(reg: EngineRegistry, ev: EngineSwitchFailed, change: RegistryChange) -> None:
    rec = change.record
    assert rec is not None
    rec.role = ev.role
    rec.switching_cmd = rec.switching_to = rec.switching_since = None


@_mutate.on("engine.deregistered")
def _deregistered(reg: EngineRegistry, ev: EngineDeregistered, change: RegistryChange) -> None:
    change.previous = reg.engines.pop(ev.engine, None)
    change.record = None
