"""Router reconciliation: the router lists every engine that should be routed.

A router keeps no state on disk, so a restarted one lists no workers; the agent registers
its engines when it starts and after a switch, and in between, every ``router_reconcile_s``,
reads ``GET /workers`` and registers again each of its engines that should be listed and is
missing (or listed with another ``worker_type``).

An engine should be listed when it is up and healthy, in a serving role (prefill or decode)
and no switch owns it: neither a journaled switch nor the engine's lock (held for the whole
switch procedure, including DEREGISTER and DRAIN, and while a dead engine is relaunched).
An engine a switch has taken off the router is never put back here; the switch registers it
when it is done. The check is repeated under the engine's lock just before registering.

A re-registration is logged and counted (``prorsa_agent_router_reregistrations_total``).
It publishes no ``engine.registered`` when this agent announced the engine already (its
role did not change, the router only forgot it); an engine never announced (the router was
unreachable when the agent started) is announced now.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from .clients import EngineHTTPError
from .instances import EngineState, Instances

log = logging.getLogger("prorsa.engine_agent")

SERVING = ("prefill", "decode")


@dataclass(frozen=True)
class Expected:
    """An engine the router should list: at ``url`` with ``worker_type == role``."""

    engine: str
    url: str
    role: str


def to_register(expected: Iterable[Expected], workers: list[dict]) -> list[Expected]:
    """The engines of ``expected`` that ``workers`` (``GET /workers``) does not list in
    their role: missing, or listed with another ``worker_type``."""
    listed: dict[str, object] = {}
    for w in workers:
        if isinstance(w, dict):
            listed[str(w.get("url", "")).rstrip("/")] = w.get("worker_type")
    return [e for e in expected if listed.get(e.url) != e.role]


def should_be_listed(agent: Instances, st: EngineState, holding_lock: bool = False) -> bool:
    """Up, in a serving role, and no switch (or relaunch) owns the engine (``holding_lock``:
    the caller holds the engine's lock itself)."""
    return (st.up and st.role in SERVING and (holding_lock or not st.lock.locked())
            and agent.journal.busy_with(st.inst.engine) is None)


def expected(agent: Instances) -> list[Expected]:
    return [Expected(st.inst.engine, st.inst.url, st.role)
            for st in agent.engines.values() if should_be_listed(agent, st)]


async def reconcile_once(agent: Instances) -> int:
    """Register every engine that should be listed and is not; returns how many were.

    Raises:
        EngineHTTPError: the router's worker list could not be read.
    """
    workers = await agent.router.workers()
    done = 0
    for e in to_register(expected(agent), workers):
        st = agent.engines[e.engine]
        if st.lock.locked():
            continue  # a switch began since the list was read; it owns the registration
        async with st.lock:
            if not should_be_listed(agent, st, holding_lock=True) or st.role != e.role:
                continue
            try:
                if not await st.client.healthy():
                    log.warning("%s is not in the router's worker list but not healthy at %s; "
                                "not registering it", e.engine, e.url)
                    continue
                w = await agent.router.find(e.url)
                if w is not None and w.get("worker_type") == st.role:
                    continue  # listed meanwhile
                log.warning("%s is missing from the router %s (%s); registering it again as %s",
                            e.engine, agent.router.url,
                            "not listed" if w is None else f"listed as {w.get('worker_type')!r}", st.role)
                await agent.ensure_registered(st, st.role, announce=e.engine not in agent.announced)
            except EngineHTTPError as exc:
                log.error("registering %s again: %s", e.engine, exc)
                continue
            agent.metrics.reregistrations += 1
            done += 1
    return done


async def reconcile_loop(agent: Instances, stop: asyncio.Event) -> None:
    """Every ``router_reconcile_s`` (0: never), :func:`reconcile_once`; a router that cannot
    be reached is logged once per outage and tried again on the next round."""
    every = agent.settings.router_reconcile_s
    if every <= 0:
        return
    unreachable = False
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except asyncio.TimeoutError:
            pass
        try:
            n = await reconcile_once(agent)
        except EngineHTTPError as exc:
            if not unreachable:
                log.warning("router reconciliation: cannot read the worker list: %s", exc)
            unreachable = True
            continue
        if unreachable:
            log.info("router reconciliation: the router %s answers again", agent.router.url)
        unreachable = False
        if n:
            log.info("router reconciliation: registered %d engine(s) again", n)
