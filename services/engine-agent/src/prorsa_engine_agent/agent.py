"""The engine agent's I/O shell: instances up, commands in, events out.

One per GPU server. It launches (or adopts) its SGLang instances, registers them with the
router and publishes ``engine.registered``; publishes ``engine.stats`` every
``stats_interval_s`` from ``/v1/loads`` (:mod:`.instances`); and executes
``engine.command`` role switches (:mod:`.commands`; :mod:`.core` for the procedure,
:mod:`.procedure` for its phases). :mod:`.watchers` reads the other agents' registrations
and the policy updates.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from contextlib import AsyncExitStack

import httpx

from prorsa_runtime.bus import connect, open_stream
from prorsa_runtime.deadletter import DeadLetters
from prorsa_runtime.publisher import ReliablePublisher
from prorsa_runtime.consumers import DurableFigures
from prorsa_runtime.reader import OrderedReader
from prorsa_schemas.events import Event

from .clients import EngineClient, EngineHTTPError, RouterClient
from .commands import Commands
from .config import AgentConfig
from .core import resume
from .instances import EngineState
from .journal import Journal
from .metrics import AgentMetrics
from .process import Processes
from .reconcile import reconcile_loop
from .watchers import BusWatchers, command_consumer, stream_seq
from .weights import Policy

log = logging.getLogger("prorsa.engine_agent")


class EngineAgent(Commands, BusWatchers):
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

    def spawn(self, coro) -> asyncio.Task:
        t = asyncio.create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)
        return t

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
        log.info("engine agent %s ready: %d of %d engines up, router %s", s.server,
                 sum(st.up for st in self.engines.values()), len(self.engines), s.router_url)
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

