"""The engine agent's I/O shell: instances up, commands in, events out.

One per GPU server. It launches (or adopts) its SGLang instances, registers them with the
router and publishes ``engine.registered``; publishes ``engine.stats`` every
``stats_interval_s`` from ``/v1/loads``; and executes ``engine.command`` role switches
(see :mod:`.core` for the procedure, :mod:`.procedure` for its phases).

A command message it cannot handle (not a valid event, not an ``engine.command``, or on a
subject its type does not belong to) is dead-lettered (:mod:`prorsa_runtime.deadletter`: a
log line with subject, stream sequence, reason, size and hash;
``prorsa_agent_dead_letters_total{kind}``) and acknowledged; a malformed command that
names a usable ``cmd`` and one of its engines is also answered with ``engine.switch_failed``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import httpx

from prorsa_runtime.bus import connect, open_stream
from prorsa_runtime.reader import DurableFigures, OrderedReader
from prorsa_runtime.deadletter import DeadLetters
from prorsa_runtime.publisher import ReliablePublisher
from prorsa_schemas import (
    EngineCommand,
    EngineDeregistered,
    EngineRegistered,
    EngineStats,
    EngineSwitched,
    EngineSwitchFailed,
    EngineSwitching,
    EventError,
    Parallel,
    SubjectMismatch,
    decode_event,
    decode_message,
)
from prorsa_schemas.events import Event

from .clients import EngineClient, EngineHTTPError, RouterClient
from .config import AgentConfig, InstanceConfig
from .core import FINAL, Phase, Switch, Verdict, begin, decide, event_id, resume
from .journal import Journal
from .metrics import AgentMetrics
from .launch import launch_command, launch_env
from .process import Processes
from .procedure import run_switch
from .reconcile import reconcile_loop
from .watchers import BusWatchers, command_consumer, stream_seq
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



class EngineAgent(BusWatchers):
    """Run with ``await EngineAgent(config).run(stack, stop)`` (see :mod:`.service`)."""

    def __init__(self, config: AgentConfig):
        self.config = config
        self.settings = config.settings
        self.ns = self.settings.namespace()
        self.log_dir = self.settings.state_dir / "logs"
        self.journal = Journal.load(self.settings.state_dir / "journal.json")
        self.processes = Processes(self.log_dir)
        self.engines: dict[str, EngineState] = {}
        self.elsewhere: dict[str, str] = {}  # engine -> server, learnt from engine.registered
        self.pub: ReliablePublisher | None = None
        self.router: RouterClient
        self._tasks: set[asyncio.Task] = set()
        self.metrics = AgentMetrics()  # Prometheus view (served when metrics_port is set)
        self.metrics.agent = self
        self.dead_letters = DeadLetters("agent", log)
        self.ready = asyncio.Event()
        self.registry_reader: OrderedReader | None = None
        self.policy_reader: OrderedReader | None = None
        self.policy: Policy | None = None  # the latest policy.updated read
        self.announced: set[str] = set()  # engines this process published engine.registered for
        self.command_figures = DurableFigures(command_consumer(self.ns, self.settings.server))

    # -- events --------------------------------------------------------------------------
    def publish(self, cls: type[Event], event_id_: str | None = None, run: str | None = None, **fields) -> Event:
        ev = cls(id=event_id_ or uuid.uuid4().hex, ts=time.time(), run=run or self.settings.run, **fields)
        assert self.pub is not None
        self.pub.submit(ev)
        return ev

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

    # -- switches -------------------------------------------------------------------------------
    async def execute(self, st: EngineState, sw: Switch, announce: bool = True) -> None:
        """Run the switch; ``engine.switching`` goes out once PRECHECK has passed (a refusal
        there is only an ``engine.switch_failed``)."""
        def started(s: Switch) -> None:
            self.publish(EngineSwitching, event_id(s.cmd, "switching"), run=s.run, engine=s.engine,
                         cmd=s.cmd, from_role=s.from_role, to_role=s.to_role, mode=s.mode)

        async with st.lock:
            try:
                sw = await run_switch(self, st, sw, started if announce else None)
            except Exception as exc:  # a bug must not leave the command without an outcome
                log.exception("switch %s crashed", sw.cmd)
                from dataclasses import replace

                sw = replace(sw, phase=Phase.FAILED, error=f"agent error: {exc!r}")
            self.finish(st, sw)

    def finish(self, st: EngineState, sw: Switch) -> None:
        # aborted_reqs (optional, docs/contract.md): requests the switch aborted, for the
        # framework to retry; absent when it aborted none.
        extra = {"aborted_reqs": sw.aborted or None}
        if sw.phase is Phase.DONE:
            self.publish(EngineSwitched, event_id(sw.cmd, "switched"), run=sw.run, engine=sw.engine,
                         cmd=sw.cmd, from_role=sw.from_role, to_role=sw.to_role,
                         seconds=max(0.0, time.time() - sw.started), mode=sw.mode, **extra)
            outcome = "switched"
        else:
            role = st.role or sw.from_role
            self.publish(EngineSwitchFailed, event_id(sw.cmd, "failed"), run=sw.run, engine=sw.engine,
                         cmd=sw.cmd, role=role, error=(sw.error or "failed")[:4096], **extra)
            outcome = "failed"
            if sw.phase is Phase.DOWN:
                st.up = False
                self.publish(EngineDeregistered, engine=sw.engine,
                             reason=f"down after failed switch {sw.cmd}: {sw.error}"[:4096])
        self.journal.inflight.pop(sw.cmd, None)
        self.journal.done[sw.cmd] = outcome
        self.metrics.record(outcome, max(0.0, time.time() - sw.started) if outcome == "switched" else None)
        self.journal.save()
        log.info("%s %s: %s %s", sw.engine, sw.cmd, outcome, sw.error)

    def refuse(self, cmd: str, engine: str, run: str, reason: str, role: str) -> None:
        log.warning("refused command %s for %s: %s", cmd, engine, reason)
        self.publish(EngineSwitchFailed, event_id(cmd, "failed"), run=run, engine=engine, cmd=cmd,
                     role=role, error=reason[:4096])

    async def handle(self, data: bytes, subject: str | None = None, seq: int | None = None) -> None:
        """One message from the command subject: validate, decide, start a switch.

        With ``subject``, the event's type must belong on it; a message that is no valid
        command is dead-lettered (and refused when it names a usable cmd and engine).
        """
        try:
            event = decode_event(data) if subject is None else decode_message(data, subject, self.ns)
            if not isinstance(event, EngineCommand):
                raise EventError.single(f"expected an engine.command, got {event.type!r}", "type")
        except SubjectMismatch as exc:
            self.dead_letters.record("subject", subject, seq, data, exc.reason)
            return
        except EventError as exc:
            self.dead_letters.record("invalid", subject, seq, data, exc.reason)
            self._refuse_malformed(data, exc.reason)
            return
        cmd = event
        st = self.engines.get(cmd.engine)
        if st is None and cmd.engine not in self.elsewhere and self.settings.unknown_engine_grace_s:
            # Another agent may own it and its registration may not have reached us yet.
            loop = asyncio.get_running_loop()
            deadline = loop.time() + self.settings.unknown_engine_grace_s
            while cmd.engine not in self.elsewhere and loop.time() < deadline:
                await asyncio.sleep(0.05)
        role = st.role if st is not None and st.up else None
        modes = [m for m in (st.inst.switch_modes() if st else []) if m != "in_place" or st.role != "mixed"]
        d = decide(cmd, now=time.time(), role=role if st is not None else None, modes=modes,
                   seen=self.journal.seen(cmd.cmd), busy_with=self.journal.busy_with(cmd.engine),
                   elsewhere=cmd.engine in self.elsewhere, blockers=st.inst.in_place_blockers() if st else [])
        if st is not None and not st.up and d.verdict is not Verdict.DUPLICATE:
            self.refuse(cmd.cmd, cmd.engine, cmd.run, f"engine {cmd.engine} is down", st.role or "mixed")
            self.journal.done[cmd.cmd] = "refused"
            self.journal.save()
            return
        if d.verdict is Verdict.DUPLICATE:
            log.info("duplicate command %s ignored", cmd.cmd)
        elif d.verdict is Verdict.IGNORE:
            pass
        elif d.verdict is Verdict.REFUSE:
            # An unknown engine has no role; "mixed" is the contract's only neutral value.
            self.refuse(cmd.cmd, cmd.engine, cmd.run, d.reason, st.role if st else "mixed")
            self.journal.done[cmd.cmd] = "refused"
            self.journal.save()
        elif d.verdict is Verdict.ALREADY:
            assert st is not None
            self.publish(EngineSwitched, event_id(cmd.cmd, "switched"), run=cmd.run, engine=cmd.engine,
                         cmd=cmd.cmd, from_role=st.role, to_role=cmd.to_role, seconds=0.0)
            self.journal.done[cmd.cmd] = "switched"
            self.journal.save()
        else:
            assert st is not None
            sw = begin(cmd, st.role, d.mode, time.time())
            # Journal before acknowledging the message: a crash from here on is resumed.
            self.journal.inflight[sw.cmd] = sw
            self.journal.save()
            self.spawn(self.execute(st, sw))

    def _refuse_malformed(self, data: bytes, reason: str) -> None:
        log.error("malformed command: %s", reason)
        try:
            obj = json.loads(data)
        except Exception:  # noqa: BLE001 - not JSON, or JSON no parser takes (nested too deep)
            obj = None
        obj = obj if isinstance(obj, dict) else {}
        cmd, engine, run = obj.get("cmd"), obj.get("engine"), obj.get("run")
        ok_id = lambda v: isinstance(v, str) and 0 < len(v) <= 128 and v.isprintable()  # noqa: E731
        if not (ok_id(cmd) and ok_id(engine)):
            log.error("malformed command has no usable cmd/engine ids; nothing to answer")
            return
        st = self.engines.get(engine)
        if st is None and engine in self.elsewhere:
            return  # the owning agent answers
        run_ok = isinstance(run, str) and run and all(c.isalnum() or c in "_.-" for c in run) and len(run) <= 128
        self.refuse(cmd, engine, run if run_ok else self.settings.run,
                    f"malformed command: {reason}", st.role if st and st.role else "mixed")

    def spawn(self, coro) -> asyncio.Task:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

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
                self.publish(
                    EngineStats, engine=st.inst.engine, role=st.role or "mixed",
                    running_reqs=load.running, queued_reqs=load.waiting + load.pd_queued,
                    kv_used_tokens=load.used_tokens, kv_capacity_tokens=load.capacity_tokens,
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

    async def run(self, stack: AsyncExitStack, stop: asyncio.Event) -> None:
        """Bring the instances up, resume journaled switches, then serve commands until ``stop``."""
        from nats.errors import TimeoutError as NatsTimeout

        s = self.settings
        creds = s.credentials()
        self.pub = await ReliablePublisher(s.nats_url, f"engine-agent-{s.server}", self.ns,
                                           credentials=creds).start()
        stack.push_async_callback(self.pub.close)
        nc = await connect(s.nats_url, f"engine-agent-{s.server}-cmd", credentials=creds)
        stack.push_async_callback(nc.close)
        js = nc.jetstream()
        await open_stream(js, self.ns, s.nats_url, creds)
        self.registry_reader = await self._watch_registrations(js)
        stack.push_async_callback(self.registry_reader.stop)
        self.policy_reader = await self._watch_policy(js)
        stack.push_async_callback(self.policy_reader.stop)
        # The durable consumer exists before any engine.registered goes out, so a command
        # sent in reaction to a registration waits for us instead of being missed.
        sub = await self._command_subscription(js)
        http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0))
        stack.push_async_callback(http.aclose)
        self.router = RouterClient(http, s.router_url)
        for inst in self.config.instances:
            self.engines[inst.engine] = EngineState(inst, EngineClient(http, inst.url))
        await asyncio.gather(*(self.bring_up(st) for st in self.engines.values()))
        resuming = {sw.engine for sw in self.journal.inflight.values()}
        for sw in list(self.journal.inflight.values()):
            st = self.engines.get(sw.engine)
            if st is None:  # the engine left the config while a switch was journaled
                self.journal.inflight.pop(sw.cmd)
                continue
            log.info("resuming switch %s of %s at %s", sw.cmd, sw.engine, sw.phase.value)
            self.spawn(self.execute(st, resume(sw), announce=False))
        for st in self.engines.values():
            if st.up and st.inst.engine not in resuming:
                try:
                    await self.ensure_registered(st, st.role)
                except EngineHTTPError as exc:
                    log.error("registering %s: %s", st.inst.engine, exc)
        self.journal.save()
        stats = self.spawn(self._stats_loop(stop))
        backlog = self.spawn(self._read_command_backlog(js, stop))
        self.spawn(reconcile_loop(self, stop))  # a restarted router gets our engines back
        self.ready.set()
        log.info("engine agent %s ready: %d engines, router %s", s.server, len(self.engines), s.router_url)
        try:
            while not stop.is_set():
                try:
                    msgs = await sub.fetch(16, timeout=0.5)
                except (NatsTimeout, asyncio.TimeoutError):
                    continue
                except Exception as exc:  # the bus is reconnecting, or the consumer is gone
                    log.warning("command fetch: %r", exc)
                    if await self._command_lost(js):
                        # Unacknowledged commands come back from the stream (DeliverPolicy.NEW
                        # from now: older ones were answered or are past their deadline).
                        log.warning("command consumer %s is gone; creating it again", self.command_figures.name)
                        try:
                            sub = await self._command_subscription(js)
                            self.command_figures.resets += 1
                        except Exception as exc2:  # noqa: BLE001 - try again on the next failure
                            log.warning("re-creating the command consumer: %r", exc2)
                    await asyncio.sleep(0.2)
                    continue
                for msg in msgs:
                    seq = stream_seq(msg)
                    try:
                        if self._for_us(msg.data):
                            await self.handle(msg.data, msg.subject, seq)  # journals before the ack below
                        else:
                            # Unknown here: waiting for another agent's registration must
                            # not hold up the commands behind it.
                            self.spawn(self._handle_safely(msg.data, msg.subject, seq))
                    except Exception as exc:  # never let one command take the agent down
                        log.exception("handling a command failed")
                        self.dead_letters.record("handler", msg.subject, seq, msg.data,
                                                 f"the agent failed on it: {exc!r}")
                    await msg.ack()
        finally:
            stats.cancel()
            backlog.cancel()
            for t in list(self._tasks):
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _for_us(self, data: bytes) -> bool:
        try:
            obj = json.loads(data)
        except Exception:  # noqa: BLE001 - unreadable: handled (dead-lettered) right here
            return True
        engine = obj.get("engine") if isinstance(obj, dict) else None
        return not isinstance(engine, str) or engine in self.engines  # not an engine id: handled here

    async def _handle_safely(self, data: bytes, subject: str | None = None, seq: int | None = None) -> None:
        try:
            await self.handle(data, subject, seq)
        except Exception as exc:
            log.exception("handling a command failed")
            self.dead_letters.record("handler", subject, seq, data, f"the agent failed on it: {exc!r}")

    async def stop_engines(self) -> None:
        """Stop every engine this agent launched (``--stop-engines-on-exit``)."""
        # All at once: one engine slow to exit must not hold the others past the agent's
        # own stop deadline (its supervisor would kill it and leave them running).
        await asyncio.gather(*(self.processes.stop(st.inst.engine, st.pid)
                               for st in self.engines.values() if st.inst.can_restart))
        self.journal.pids.clear()
        self.journal.save()
