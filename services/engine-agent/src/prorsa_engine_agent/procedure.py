"""The shell around the switch state machine: carries out each phase against SGLang, the
router and the process table, journaling the phase before it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from .clients import EngineHTTPError
from .core import FINAL, Phase, Switch, advance

if TYPE_CHECKING:
    from .agent import EngineAgent, EngineState

log = logging.getLogger("prorsa.engine_agent.switch")


class PhaseFailed(Exception):
    def __init__(self, detail: str, safe_to_restore: bool = True):
        super().__init__(detail)
        self.detail = detail
        self.safe_to_restore = safe_to_restore


async def run_switch(agent: "EngineAgent", st: "EngineState", sw: Switch) -> Switch:
    """Drive ``sw`` to a final phase; every phase is journaled before it runs."""
    while sw.phase not in FINAL:
        agent.journal.inflight[sw.cmd] = sw
        agent.journal.save()
        log.info("%s %s: %s", sw.engine, sw.cmd, sw.phase.value)
        try:
            await _PHASES[sw.phase](agent, st, sw)
            ok, detail, safe = True, "", True
        except PhaseFailed as exc:
            ok, detail, safe = False, exc.detail, exc.safe_to_restore
        except EngineHTTPError as exc:
            ok, detail, safe = False, str(exc), sw.phase is not Phase.SWITCH
        sw = advance(sw, ok, detail, safe_to_restore=safe, can_restart=st.inst.can_restart)
        if sw.role_now:
            st.role = sw.role_now
    return sw


async def _until(agent: "EngineAgent", cond, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = ""
    while True:
        try:
            if await cond():
                return
        except EngineHTTPError as exc:
            last = f" (last error: {exc})"
        if loop.time() > deadline:
            raise PhaseFailed(f"{what} not reached within {timeout:.1f}s{last}")
        await asyncio.sleep(agent.settings.poll_s)


async def deregister(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    w = await agent.router.find(st.inst.url)
    if w is not None:
        await agent.router.remove(w["id"])

    async def gone() -> bool:
        return await agent.router.find(st.inst.url) is None

    await _until(agent, gone, agent.settings.router_timeout_s, "removal from the router")
    st.registered = False


async def drain(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    # Wait for idle until the command's deadline (bounded by drain_max_s); the router no
    # longer sends new requests, so running ones finish.
    budget = min(sw.deadline - time.time(), agent.settings.drain_max_s)

    async def idle() -> bool:
        return (await st.client.loads()).idle

    await _until(agent, idle, max(0.0, budget), "idle")


async def abort(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    # Like slime: abort everything, repeatedly, until the scheduler reports idle.
    async def idle_after_abort() -> bool:
        load = await st.client.loads()
        if load.idle:
            return True
        await st.client.abort_all()
        return False

    try:
        await _until(agent, idle_after_abort, agent.settings.abort_grace_s, "idle after abort_all")
    except PhaseFailed:
        load = await st.client.loads()
        raise PhaseFailed(f"{load.running} running, {load.waiting} waiting, {load.pd_queued} in PD "
                          f"queues {agent.settings.abort_grace_s:.1f}s after abort_all") from None


async def switch_in_place(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    graph = await agent.decode_graph_gb(st) if sw.to_role == "decode" else None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + agent.settings.switch_timeout_s
    while True:
        out = await st.client.role_switch(sw.to_role, graph, agent.settings.switch_timeout_s)
        msg = str(out.get("message", ""))
        if out.get("success"):
            return
        # A resumed switch may find the engine still busy with the first call.
        if "already in progress" in msg and loop.time() < deadline:
            await asyncio.sleep(agent.settings.poll_s)
            continue
        raise PhaseFailed(msg or "no message", bool(out.get("safe_to_restore", False)))


async def _relaunch(agent: "EngineAgent", st: "EngineState", role: str) -> None:
    await agent.processes.stop(st.inst.engine, st.pid)
    await agent.launch(st, role)

    async def up() -> bool:
        if agent.processes.exited(st.inst.engine, st.pid):
            raise PhaseFailed(f"process exited during startup (see {agent.log_dir})")
        return await st.client.healthy()

    await _until(agent, up, agent.settings.restart_timeout_s, f"healthy after relaunch as {role}")


async def restart(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    await _relaunch(agent, st, sw.to_role)


async def health(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    async def ok() -> bool:
        return await st.client.healthy() and await st.client.role() == sw.to_role

    await _until(agent, ok, agent.settings.health_timeout_s, f"healthy in role {sw.to_role}")


async def register(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    await agent.ensure_registered(st, sw.to_role)


async def restore_restart(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    await _relaunch(agent, st, sw.from_role)


async def restore_register(agent: "EngineAgent", st: "EngineState", sw: Switch) -> None:
    async def up() -> bool:
        return await st.client.healthy()

    await _until(agent, up, agent.settings.health_timeout_s, "healthy before re-registration")
    role = await st.client.role()
    st.role = role
    await agent.ensure_registered(st, role)


_PHASES = {
    Phase.DEREGISTER: deregister,
    Phase.DRAIN: drain,
    Phase.ABORT: abort,
    Phase.SWITCH: switch_in_place,
    Phase.RESTART: restart,
    Phase.HEALTH: health,
    Phase.REGISTER: register,
    Phase.RESTORE_RESTART: restore_restart,
    Phase.RESTORE_REGISTER: restore_register,
}
