"""The shell around the switch state machine: carries out each phase against SGLang, the
router and the process table, journaling the phase before it runs."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace

from .clients import EngineHTTPError
from .core import FINAL, MAX_REDRAINS, Phase, Switch, advance
from .instances import EngineState, Instances
from .inplace import graph_memory_refusal, server_blockers
from .weights import Reported, Weights, resolve, update_in_progress

log = logging.getLogger("prorsa.engine_agent.switch")


class PhaseFailed(Exception):
    def __init__(self, detail: str, safe_to_restore: bool = True, busy: bool = False):
        super().__init__(detail)
        self.detail = detail
        self.safe_to_restore = safe_to_restore
        self.busy = busy  # the flip or the restart found the engine not idle: drain again


async def run_switch(agent: Instances, st: EngineState, sw: Switch, on_start=None) -> Switch:
    """Drive ``sw`` to a final phase; every phase is journaled before it runs. ``on_start(sw)``
    is called once PRECHECK has passed (the engine is about to be touched)."""
    while sw.phase not in FINAL:
        agent.journal.inflight[sw.cmd] = sw
        agent.journal.save()
        log.info("%s %s: %s", sw.engine, sw.cmd, sw.phase.value)
        try:
            out = await _PHASES[sw.phase](agent, st, sw)
            sw = out if isinstance(out, Switch) else sw  # a phase may record what it found
            ok, detail, safe, busy = True, "", True, False
        except PhaseFailed as exc:
            ok, detail, safe, busy = False, exc.detail, exc.safe_to_restore, exc.busy
        except EngineHTTPError as exc:
            ok, detail, safe, busy = False, str(exc), sw.phase not in (Phase.SWITCH, Phase.RESTART), False
        was = sw.phase
        sw = advance(sw, ok, detail, safe_to_restore=safe, can_restart=st.inst.can_restart, busy=busy)
        if was in (Phase.SWITCH, Phase.RESTART) and sw.phase is Phase.DRAIN:
            log.warning("%s %s: the engine is busy again (%s); draining again (%d of %d)",
                        sw.engine, sw.cmd, detail, sw.redrains, MAX_REDRAINS)
        if was is Phase.PRECHECK and sw.phase is Phase.DEREGISTER and on_start is not None:
            on_start(sw)
        if sw.role_now:
            st.role = sw.role_now
    return sw


async def _until(agent: Instances, cond, timeout: float, what: str) -> None:
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


async def _reported(st: EngineState) -> Reported | None:
    try:
        info = await st.client.model_info()
    except EngineHTTPError:
        return None
    path, version = info.get("model_path"), info.get("weight_version")
    if not isinstance(path, str) or not path:
        return None
    return Reported(path, str(version) if version is not None else "default")


async def _no_update(agent: Instances, st: EngineState, sw: Switch) -> Reported | None:
    """Wait while a weight update is in progress on the engine (up to ``update_wait_s``, and
    not past the command's deadline); PhaseFailed if it still is. Returns what the engine
    reports about its weights."""
    loop = asyncio.get_running_loop()
    wait = max(0.0, min(agent.settings.update_wait_s, sw.deadline - time.time()))
    until = loop.time() + wait
    while True:
        reported = await _reported(st)
        why = update_in_progress(reported, await st.client.ready(), agent.policy)
        if not why:
            return reported
        if loop.time() >= until:
            raise PhaseFailed(f"weight update in progress on {st.inst.engine}: {why} (waited {wait:.1f}s; "
                              "no switch overlaps a weight update)")
        await asyncio.sleep(agent.settings.poll_s)


def _weights(agent: Instances, st: EngineState, reported: Reported | None) -> Weights:
    launched = agent.launched_weights(st)
    got = resolve(launched, reported, agent.policy, st.inst.weights_path, time.time())
    if got.weights is None:
        raise PhaseFailed(f"cannot relaunch {st.inst.engine} on its current weights: {got.reason}")
    return got.weights


async def precheck(agent: Instances, st: EngineState, sw: Switch) -> Switch:
    """What SGLang and the weights need, checked before the engine is touched.

    A restart needs the weights the engine will have, so it waits out a weight update in
    progress here. An in-place switch does not: DEREGISTER takes the engine off the router
    at once, so that the batch dispatched after the update does not land on it, and then
    waits for the update to end; the flip that follows needs no drain."""
    if sw.mode == "restart":
        w = _weights(agent, st, await _no_update(agent, st, sw))
        return replace(sw, model_path=w.model_path, weight_version=w.weight_version)
    info = await st.client.server_info()
    blockers = server_blockers(info or {})
    if blockers:
        raise PhaseFailed(f"SGLang refuses an in-place switch of this engine: {', '.join(blockers)}")
    refusal = graph_memory_refusal(sw.to_role, await agent.decode_graph_gb(st), info)
    if refusal:
        raise PhaseFailed(refusal)
    return sw


async def deregister(agent: Instances, st: EngineState, sw: Switch) -> None:
    w = await agent.router.find(st.inst.url)
    if w is not None:
        await agent.router.remove(w["id"])

    async def gone() -> bool:
        return await agent.router.find(st.inst.url) is None

    await _until(agent, gone, agent.settings.router_timeout_s, "removal from the router")
    st.registered = False
    # A weight update in progress (commanded in the pause, or begun by a framework that saw
    # the engine in the router before the removal): wait for it to end, else put the engine
    # back (RESTORE_REGISTER). The framework reaches the engine off the router
    # (prorsa_sdk.coordination.engine_urls) to update and resume it.
    await _no_update(agent, st, sw)


async def drain(agent: Instances, st: EngineState, sw: Switch) -> None:
    # Wait for idle until the command's deadline (bounded by drain_max_s); the router no
    # longer sends new requests, so running ones finish.
    budget = min(sw.deadline - time.time(), agent.settings.drain_max_s)

    async def idle() -> bool:
        return (await st.client.loads()).idle

    await _until(agent, idle, max(0.0, budget), "idle")


async def abort(agent: Instances, st: EngineState, sw: Switch) -> Switch:
    # Like slime: abort everything, repeatedly, until the scheduler reports idle. What was
    # running or waiting at the first abort_all is reported with the outcome (aborted_reqs),
    # so the framework knows to retry (SGLang answers each with finish_reason abort).
    first = await st.client.loads()
    sw = replace(sw, aborted=sw.aborted or first.running + first.waiting + first.pd_queued)
    agent.journal.inflight[sw.cmd] = sw

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
    return sw


async def switch_in_place(agent: Instances, st: EngineState, sw: Switch) -> None:
    # Checked again before the flip, as restart does before the stop: a framework that reaches
    # engines off the router (prorsa_sdk.coordination.engine_urls) may be updating this one.
    # A refusal here leaves the engine in its old role (safe to re-register).
    await _no_update(agent, st, sw)
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
        # Work that reached the engine after the drain's reading: drain again (core.advance).
        raise PhaseFailed(msg or "no message", bool(out.get("safe_to_restore", False)),
                          busy="not idle" in msg)


async def _relaunch(agent: Instances, st: EngineState, role: str, weights: Weights | None = None) -> None:
    await agent.processes.stop(st.inst.engine, st.pid)
    await agent.launch(st, role, weights)

    async def up() -> bool:
        if agent.processes.exited(st.inst.engine, st.pid):
            raise PhaseFailed(f"process exited during startup (see {agent.log_dir})")
        return await st.client.healthy()

    await _until(agent, up, agent.settings.restart_timeout_s, f"healthy after relaunch as {role}")


async def restart(agent: Instances, st: EngineState, sw: Switch) -> Switch:
    # Checked again just before the stop: an update may have begun or finished on the
    # drained engine since PRECHECK. A refusal here leaves the engine running (safe).
    if not agent.processes.exited(st.inst.engine, st.pid) and await st.client.healthy():
        w = _weights(agent, st, await _no_update(agent, st, sw))
        sw = replace(sw, model_path=w.model_path, weight_version=w.weight_version)
        # Work that reached the engine after the drain's reading would die with the process:
        # drain again instead (core.advance), as an in-place flip SGLang refuses does.
        load = await st.client.loads()
        if not load.idle:
            raise PhaseFailed(f"{load.running} running, {load.waiting} waiting, {load.pd_queued} in PD queues "
                              "just before the stop", busy=True)
    elif sw.model_path:  # resumed with the engine already stopped: what PRECHECK found
        w = Weights(sw.model_path, sw.weight_version or "default", time.time())
    else:
        w = _weights(agent, st, None)
    agent.journal.inflight[sw.cmd] = sw
    try:
        await _relaunch(agent, st, sw.to_role, w)
    except PhaseFailed as exc:  # the engine was stopped: not safe to just re-register
        raise PhaseFailed(exc.detail, safe_to_restore=False) from None
    return sw


async def health(agent: Instances, st: EngineState, sw: Switch) -> None:
    async def ok() -> bool:
        return await st.client.healthy() and await st.client.role() == sw.to_role

    await _until(agent, ok, agent.settings.health_timeout_s, f"healthy in role {sw.to_role}")


async def register(agent: Instances, st: EngineState, sw: Switch) -> None:
    await agent.ensure_registered(st, sw.to_role)


async def restore_restart(agent: Instances, st: EngineState, sw: Switch) -> None:
    # The last weights known: what PRECHECK found for a restart, else what it was launched with.
    w = Weights(sw.model_path, sw.weight_version or "default", time.time()) if sw.model_path else None
    await _relaunch(agent, st, sw.from_role, w)


async def restore_register(agent: Instances, st: EngineState, sw: Switch) -> None:
    async def up() -> bool:
        return await st.client.healthy()

    await _until(agent, up, agent.settings.health_timeout_s, "healthy before re-registration")
    role = await st.client.role()
    st.role = role
    await agent.ensure_registered(st, role)


_PHASES = {
    Phase.PRECHECK: precheck,
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
