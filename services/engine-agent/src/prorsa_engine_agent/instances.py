"""The agent's instances: each engine's state, bringing it up (adopt or launch), keeping it
registered with the router, its ``engine.stats`` loop and its recovery when it dies
outside a switch. Mixed into :class:`~prorsa_engine_agent.agent.EngineAgent`."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path

from prorsa_schemas import EngineDeregistered, EngineRegistered, EngineStats, Event, Parallel

from .clients import CounterRate, EngineClient, EngineHTTPError, RouterClient
from .config import AgentSettings, InstanceConfig
from .journal import Journal
from .launch import launch_command, launch_env
from .metrics import AgentMetrics
from .process import Processes
from .weights import Policy, Weights

log = logging.getLogger("prorsa.engine_agent")


@dataclass
class EngineState:
    inst: InstanceConfig
    client: EngineClient
    role: str = ""
    pid: int | None = None
    up: bool = False
    registered: bool = False
    kv_capacity: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    prefill_rate: CounterRate = field(default_factory=CounterRate)


class Instances:
    """The instance side of the agent: what the switch procedure (:mod:`.procedure`) and
    the router reconciliation (:mod:`.reconcile`) work with. The attributes are the
    agent's (set by :class:`~prorsa_engine_agent.agent.EngineAgent`)."""

    settings: AgentSettings
    journal: Journal
    processes: Processes
    router: RouterClient
    engines: dict[str, EngineState]
    announced: set[str]  # engines this process published engine.registered for
    log_dir: Path
    policy: Policy | None  # the latest policy.updated read (:mod:`.watchers`)
    metrics: AgentMetrics
    publish: Callable[..., Event]
    spawn: Callable[[Coroutine], asyncio.Task]

    def _registered_event(self, st: EngineState) -> None:
        i = st.inst
        self.publish(EngineRegistered, engine=i.engine, server=self.settings.server, role=st.role,
                     gpus=i.gpu_count, kv_capacity_tokens=st.kv_capacity, url=i.url,
                     parallel=Parallel(tp=i.tp, dp=i.dp, ep=i.ep, attn_dp=i.attn_dp),
                     switch_modes=i.switch_modes())
        self.announced.add(i.engine)

    # -- instances --------------------------------------------------------------------------
    def launched_weights(self, st: EngineState) -> Weights:
        """The weights the engine was launched (or adopted) with."""
        return self.journal.weights.get(st.inst.engine) or Weights(st.inst.model, st.inst.weight_version)

    async def launch(self, st: EngineState, role: str, weights: Weights | None = None) -> None:
        """Launch in ``role`` on ``weights`` (default: the weights it was launched with last)."""
        w = weights or self.journal.weights.get(st.inst.engine) or Weights(
            st.inst.model, st.inst.weight_version, time.time())
        cmd = launch_command(st.inst, role, self.settings.python, w)
        st.pid = self.processes.launch(st.inst.engine, cmd, launch_env(st.inst))
        self.journal.pids[st.inst.engine] = st.pid
        self.journal.roles[st.inst.engine] = role
        self.journal.weights[st.inst.engine] = w
        self.journal.save()
        log.info("launched %s as %s (pid %d): %s", st.inst.engine, role, st.pid, " ".join(cmd))

    async def wait_healthy(self, st: EngineState, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if await st.client.healthy():
                return True
            if st.inst.can_restart and st.pid and self.processes.exited(st.inst.engine, st.pid):
                return False
            await asyncio.sleep(self.settings.poll_s)
        return False

    async def bring_up(self, st: EngineState) -> None:
        """Adopt a running instance (ours from the journal, or external) or launch it."""
        inst = st.inst
        st.pid = self.journal.pids.get(inst.engine)
        ours_alive = st.pid is not None and not self.processes.exited(inst.engine, st.pid)
        if not ours_alive:
            st.pid = None
        if not ours_alive and not await st.client.healthy():
            if inst.can_restart:
                await self.launch(st, self.journal.roles.get(inst.engine, inst.role))
        if not await self.wait_healthy(st, self.settings.restart_timeout_s):
            st.up = False
            exited = bool(st.pid) and self.processes.exited(inst.engine, st.pid)
            log.error("%s not healthy at %s after startup (%s); %s:\n%s", inst.engine, inst.url,
                      "its process exited" if exited else f"{self.settings.restart_timeout_s:.0f}s",
                      self.processes.log_path(inst.engine), self.processes.tail(inst.engine))
            self.publish(EngineDeregistered, engine=inst.engine,
                         reason=f"not healthy at {inst.url} after startup (logs: {self.log_dir})")
            return
        st.role = await st.client.role()
        st.kv_capacity = (await st.client.loads()).capacity_tokens
        if inst.engine not in self.journal.weights:  # adopted: what it serves now
            info = await st.client.model_info()
            self.journal.weights[inst.engine] = Weights(
                str(info.get("model_path") or inst.model), str(info.get("weight_version") or "default"),
                time.time())
        st.up = True
        log.info("%s up at %s as %s (%s)", inst.engine, inst.url, st.role,
                 "adopted" if ours_alive or not inst.can_restart else "launched")

    async def ensure_registered(self, st: EngineState, role: str, announce: bool = True) -> None:
        """The router lists this instance with ``worker_type == role`` (idempotent); then
        ``engine.registered`` goes out (``announce``)."""
        url = st.inst.url
        w = await self.router.find(url)
        if w is not None and w.get("worker_type") != role:
            await self.router.remove(w["id"])
            await self._wait_router(lambda w: w is None, url, "old registration removed")
            w = None
        if w is None:
            await self.router.add(url, role, st.inst.bootstrap_port)
            await self._wait_router(lambda w: w is not None and w.get("worker_type") == role,
                                    url, f"registered as {role}")
        st.registered = True
        self.journal.roles[st.inst.engine] = role
        st.kv_capacity = (await st.client.loads()).capacity_tokens or st.kv_capacity
        if announce:
            self._registered_event(st)

    async def _wait_router(self, cond, url: str, what: str) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.router_timeout_s
        while not cond(await self.router.find(url)):
            if loop.time() > deadline:
                raise EngineHTTPError(f"router {self.router.url}: {url} not {what} within "
                                      f"{self.settings.router_timeout_s:.0f}s")
            await asyncio.sleep(self.settings.poll_s)

    async def decode_graph_gb(self, st: EngineState) -> float | None:
        """Decode CUDA-graph memory for a flip to decode: configured, or read from a decode peer."""
        if st.inst.decode_cuda_graph_memory_gb is not None:
            return st.inst.decode_cuda_graph_memory_gb
        for peer in self.engines.values():
            if peer is not st and peer.up and peer.role == "decode":
                try:
                    gb = await peer.client.decode_graph_gb()
                except EngineHTTPError:
                    continue
                if gb is not None:
                    return gb
        return None

    # -- loops ------------------------------------------------------------------------------------
    async def _stats_loop(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for st in list(self.engines.values()):
                if st.lock.locked():
                    continue  # a switch owns the engine; it reports its own outcome
                if st.up and st.inst.can_restart and st.pid and self.processes.exited(st.inst.engine, st.pid):
                    self.spawn(self._recover(st))
                    continue
                if not st.up:
                    continue
                try:
                    load = await st.client.loads()
                except (EngineHTTPError, ValueError) as exc:
                    log.warning("stats for %s: %s", st.inst.engine, exc)
                    continue
                # Prompt tokens computed per wall second since the last poll (SGLang's
                # cumulative counter; None on the first poll and after a restart).
                prefill_rate = st.prefill_rate.rate(load.prefill_computed_total,
                                                    asyncio.get_running_loop().time(), st.role)
                self.publish(
                    EngineStats, engine=st.inst.engine, role=st.role or "mixed",
                    running_reqs=load.running, queued_reqs=load.queued,
                    kv_used_tokens=load.used_tokens, kv_capacity_tokens=load.capacity_tokens,
                    prefill_tokens_per_s=prefill_rate if st.role != "decode" else None,
                    decode_tokens_per_s=load.gen_throughput if st.role != "prefill" else None,
                    cache_hit_rate=load.cache_hit_rate,
                )
            try:
                await asyncio.wait_for(stop.wait(), self.settings.stats_interval_s)
            except asyncio.TimeoutError:
                pass

    async def _recover(self, st: EngineState) -> None:
        """A launched engine died outside a switch: say so, relaunch it, re-register it."""
        async with st.lock:
            if not self.processes.exited(st.inst.engine, st.pid):
                return
            st.up = False
            self.publish(EngineDeregistered, engine=st.inst.engine, reason="process exited; relaunching")
            try:
                w = await self.router.find(st.inst.url)
                if w is not None:
                    await self.router.remove(w["id"])
                await self.launch(st, st.role if st.role in ("prefill", "decode") else st.inst.role)
                if await self.wait_healthy(st, self.settings.restart_timeout_s):
                    st.role, st.up = await st.client.role(), True
                    await self.ensure_registered(st, st.role)
            except EngineHTTPError as exc:
                log.error("recovering %s failed: %s", st.inst.engine, exc)

    async def stop_engines(self) -> None:
        """Stop every engine this agent launched (``--stop-engines-on-exit``)."""
        # All at once: one engine slow to exit must not hold the others past the agent's
        # own stop deadline (its supervisor would kill it and leave them running).
        await asyncio.gather(*(self.processes.stop(st.inst.engine, st.pid)
                               for st in self.engines.values() if st.inst.can_restart))
        self.journal.pids.clear()
        self.journal.save()
