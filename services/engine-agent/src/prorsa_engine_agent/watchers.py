"""The agent's reading side of the bus: its durable command consumer, other agents'
registrations and the policy updates (which weights the engines serve)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prorsa_runtime.clock import ahead_of_clock
from prorsa_runtime.reader import OrderedReader
from prorsa_schemas import EngineRegistered, Event, EventError, Namespace, PolicyUpdated, decode_message
from prorsa_schemas.fold import Mutators

from .config import AgentSettings
from .weights import Policy

log = logging.getLogger("prorsa.engine_agent")

BACKLOG_EVERY_S = 5.0
"""How often the command consumer's backlog is read from the server."""


class BusWatchers:
    """Mixed into :class:`~prorsa_engine_agent.agent.EngineAgent` (uses its ``ns``,
    ``settings``, ``elsewhere``, ``policy`` and ``command_figures``)."""

    settings: AgentSettings
    elsewhere: dict[str, str]
    policy: Policy | None

    async def _watch_registrations(self, js) -> OrderedReader:
        def on_msg(msg, seq: int) -> None:
            reader.release()
            try:
                ev = decode_message(msg.data, msg.subject, self.ns)
            except EventError:
                return  # the tracker records it; here it only must not count as a registration
            _mutate(self, ev)

        reader = OrderedReader(js, self.ns, registry_consumer(self.ns, self.settings.server),
                               [self.ns.subject_for_type("engine.registered")], on_msg, max_pending=1000)
        return await reader.start()

    async def _command_subscription(self, js):
        """The durable pull consumer of this agent's commands (created if missing, else bound)."""
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        return await js.pull_subscribe(
            self.ns.commands(), durable=self.command_figures.name, stream=self.ns.stream,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW,
                                  ack_wait=30.0, max_ack_pending=1000),
        )

    async def _command_lost(self, js) -> bool:
        """True when the command consumer no longer exists (deleted, or lost with a server)."""
        from nats.js.errors import NotFoundError

        try:
            await js.consumer_info(self.ns.stream, self.command_figures.name, timeout=2.0)
        except NotFoundError:
            return True
        except Exception as exc:  # noqa: BLE001 - the bus is away: fetch again later
            log.debug("command consumer info: %r", exc)
        return False

    async def _read_command_backlog(self, js, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.command_figures.read(js, self.ns.stream)
            try:
                await asyncio.wait_for(stop.wait(), BACKLOG_EVERY_S)
            except asyncio.TimeoutError:
                pass

    async def _watch_policy(self, js) -> OrderedReader:
        """Every ``policy.updated`` from the start of the stream: the latest is which weights
        the engines should serve (see :mod:`.weights`)."""
        def on_msg(msg, seq: int) -> None:
            reader.release()
            try:
                ev = decode_message(msg.data, msg.subject, self.ns)
            except EventError:
                return  # the tracker records it
            future = ahead_of_clock(ev.ts, time.time(), self.settings.max_clock_ahead_s)
            if future is not None:
                # The newest update by ts wins: one from the future would pin the weights.
                log.warning("policy.updated %s ignored: %s", ev.id, future)
                return
            _mutate(self, ev)

        reader = OrderedReader(js, self.ns, policy_consumer(self.ns, self.settings.server),
                               [self.ns.subject_for_type("policy.updated")], on_msg, max_pending=1000)
        return await reader.start()


# What the agent learns from the events it reads: ``handler(agent, event)``.
_mutate: Mutators[Callable[[BusWatchers, Event], None]] = Mutators()


@_mutate.on("engine.registered")
def _registered(agent: BusWatchers, ev: EngineRegistered) -> None:
    """Another agent's engine: commands for it are that agent's to answer."""
    if ev.server != agent.settings.server:
        agent.elsewhere[ev.engine] = ev.server


@_mutate.on("policy.updated")
def _policy_updated(agent: BusWatchers, ev: PolicyUpdated) -> None:
    """The latest policy (by event time) is which weights the engines should serve."""
    if agent.policy is None or ev.ts >= agent.policy.ts:
        path = ev.model_path
        agent.policy = Policy(ev.version, ev.ts, path or None)
        log.info("policy version %d (ts %.3f%s)", ev.version, ev.ts,
                 f", model_path {path}" if agent.policy.model_path else "")


def stream_seq(msg) -> int | None:
    """The JetStream stream sequence of a delivered message (None: not a JetStream delivery)."""
    try:
        return msg.metadata.sequence.stream
    except Exception:  # noqa: BLE001 - not a JetStream delivery
        return None


def _token(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:64]


def command_consumer(ns: Namespace, server: str) -> str:
    """The agent's durable pull consumer of ``engine.command`` (``prorsa-engine-agent-<server>``)."""
    return ns.durable("engine-agent", _token(server))


def policy_consumer(ns: Namespace, server: str) -> str:
    """The agent's ordered consumer of ``policy.updated`` (``prorsa-agent-policy-<server>``)."""
    return ns.durable("agent-policy", _token(server))


def registry_consumer(ns: Namespace, server: str) -> str:
    """The agent's ordered consumer of ``engine.registered`` (``prorsa-agent-registry-<server>``):
    which engines other agents hold."""
    return ns.durable("agent-registry", _token(server))
