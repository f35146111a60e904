"""deploy/nats/server.conf (+ accounts.conf) against a real nats-server: each user may do what
its service needs and nothing else.

The rollout user (the RL framework's credentials, the least trusted) tries every attack it
could make with the permissions this file used to grant: a stream update with a subject
transform that turns its publishes into engine commands, taking and acknowledging the
engine agent's commands, reading control traffic, deleting the agent's durable consumer,
purging, cutting, sealing and deleting the stream, publishing engine.command. The server
refuses each one (a permissions violation comes back) and the stream, the agent's consumer
and its pending command are as before. The other services' users are refused what belongs
to another service. The whole stack under this config is run by tests/test_up_e2e.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NATS
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from prorsa_runtime.bus import (
    BusAuthError,
    Credentials,
    StreamMissing,
    connect,
    ensure_stream,
    open_stream,
    publish_event,
)
from prorsa_cli.stack import NATS_USERS
from prorsa_runtime.natsserver import NatsServer
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import DEFAULT, EngineCommand, encode_event
from prorsa_schemas.events import ENGINE_TYPES, ROLLOUT_TYPES
from prorsa_sdk import Emitter

ROOT = Path(__file__).resolve().parents[1]
SERVER_CONF = ROOT / "deploy" / "nats" / "server.conf"
ACCOUNTS = ROOT / "deploy" / "nats" / "accounts.conf"
VARS = NATS_USERS  # user of deploy/nats/accounts.conf -> the variable holding its password
PASSWORDS = {var: f"pw{user.replace('-', '')}secret" for user, var in VARS.items()}
AGENT_DURABLE = "prorsa-engine-agent-node0"
S = DEFAULT.stream


def creds(user: str) -> Credentials:
    return Credentials(user, PASSWORDS[VARS[user]])


def _command(i: int) -> EngineCommand:
    return EngineCommand(id=f"cmd-{i}", ts=1.0, run="r", cmd=f"c{i}", engine="e0", action="switch_role",
                         to_role="decode", deadline=100.0)


@pytest.fixture
def secured(tmp_path: Path) -> NatsServer:
    server = NatsServer(tmp_path / "js", port=0, config_file=SERVER_CONF, monitor_port=0, environ=PASSWORDS).start()
    yield server
    server.stop()


@pytest.fixture
async def admin(secured: NatsServer) -> AsyncIterator[NATS]:
    """The admin step done (the stream exists); the admin's connection, to inspect state."""
    nc = await connect(secured.url, "admin", credentials=creds("admin"), timeout=10)
    await ensure_stream(nc.jetstream(), DEFAULT)
    yield nc
    await nc.close()


class Login:
    """A plain nats-py client logged in as one user, collecting the server's error notices
    (a permissions violation arrives as an asynchronous -ERR)."""

    def __init__(self, nc: NATS, errors: list[str]):
        self.nc, self.errors = nc, errors

    @classmethod
    async def as_user(cls, server: NatsServer, user: str) -> "Login":
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        nc = await nats.connect(server.url, user=user, password=PASSWORDS[VARS[user]], error_cb=on_error,
                                allow_reconnect=False, inbox_prefix=f"_INBOX.{user}")
        return cls(nc, errors)

    async def refused_publish(self, subject: str, payload: bytes = b"{}") -> None:
        """Publish (with a reply inbox, as an API request would) and wait for the refusal."""
        await self.nc.publish(subject, payload, reply=self.nc.new_inbox())
        await self._violation(f'permissions violation for publish to "{subject.lower()}"')

    async def refused_subscribe(self, subject: str) -> None:
        await self.nc.subscribe(subject)
        await self._violation(f'permissions violation for subscription to "{subject.lower()}"')

    async def _violation(self, text: str) -> None:
        await self.nc.flush()
        await async_wait_until(lambda: any(text in e for e in self.errors), timeout=10, what=text)


async def _agent_with_a_pending_command(secured: NatsServer) -> tuple[NATS, object]:
    """The engine agent's durable command consumer, and one command from the allocator in it."""
    agent = await connect(secured.url, "engine-agent-node0-cmd", credentials=creds("engine-agent"), timeout=10)
    sub = await agent.jetstream().pull_subscribe(
        DEFAULT.commands(), durable=AGENT_DURABLE, stream=S,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.NEW, ack_wait=30.0),
    )
    alloc = await connect(secured.url, "prorsa-allocator", credentials=creds("allocator"), timeout=10)
    assert await publish_event(alloc.jetstream(), DEFAULT, _command(1)) >= 1
    await alloc.close()
    return agent, sub


async def test_the_rollout_user_publishes_rollout_events_through_the_sdk(secured: NatsServer, admin: NATS):
    async with Emitter(run="r", nats_url=secured.url, credentials=creds("rollout")) as em:
        await em.run_started("sync", 4)
        await em.dispatched("t1", prompt_tokens=10)
        await em.flush(10)
    info = await admin.jetstream().stream_info(S)
    assert info.state.messages == 2


async def test_rollout_attacks_are_refused_and_change_nothing(secured: NatsServer, admin: NATS):
    agent, sub = await _agent_with_a_pending_command(secured)
    ajs = admin.jetstream()
    before = await ajs.stream_info(S)
    rollout = await Login.as_user(secured, "rollout")

    # 1. A stream update adding a subject transform (rollout publishes -> engine.command).
    cfg = before.config.as_dict()
    transformed = {**cfg, "subject_transform": {"src": "prorsa.rollout.>", "dest": DEFAULT.commands()}}
    await rollout.refused_publish(f"$JS.API.STREAM.UPDATE.{S}", json.dumps(transformed).encode())
    # 2. Taking and acknowledging the agent's commands.
    await rollout.refused_publish(f"$JS.API.CONSUMER.MSG.NEXT.{S}.{AGENT_DURABLE}", b'{"batch": 1}')
    seq = before.state.last_seq
    await rollout.refused_publish(f"$JS.ACK.{S}.{AGENT_DURABLE}.1.{seq}.1.0.0", b"+ACK")
    # 3. Reading control traffic: live, through another user's inbox, through a consumer of
    #    its own, or by message reads.
    for subject in (DEFAULT.control_all(), DEFAULT.commands(), "_INBOX.>", "_INBOX.allocator.>", ">"):
        await rollout.refused_subscribe(subject)
    for subject in (f"$JS.API.CONSUMER.CREATE.{S}", f"$JS.API.CONSUMER.CREATE.{S}.spy.{DEFAULT.control_all()}",
                    f"$JS.API.CONSUMER.DURABLE.CREATE.{S}.spy", f"$JS.API.STREAM.MSG.GET.{S}",
                    f"$JS.API.DIRECT.GET.{S}.{DEFAULT.commands()}", f"$JS.API.DIRECT.GET.{S}",
                    f"$JS.API.CONSUMER.INFO.{S}.{AGENT_DURABLE}", f"$JS.API.CONSUMER.LIST.{S}"):
        await rollout.refused_publish(subject)
    # 4. Deleting the agent's durable consumer.
    await rollout.refused_publish(f"$JS.API.CONSUMER.DELETE.{S}.{AGENT_DURABLE}")
    # 5. Purging, cutting to one message, sealing and deleting the stream (or a message).
    await rollout.refused_publish(f"$JS.API.STREAM.PURGE.{S}")
    await rollout.refused_publish(f"$JS.API.STREAM.UPDATE.{S}", json.dumps({**cfg, "max_msgs": 1}).encode())
    await rollout.refused_publish(f"$JS.API.STREAM.UPDATE.{S}", json.dumps({**cfg, "sealed": True}).encode())
    await rollout.refused_publish(f"$JS.API.STREAM.DELETE.{S}")
    await rollout.refused_publish(f"$JS.API.STREAM.MSG.DELETE.{S}", json.dumps({"seq": seq}).encode())
    await rollout.refused_publish(f"$JS.API.STREAM.CREATE.{S}", json.dumps(cfg).encode())
    # 6. Publishing an engine command, on its subject or disguised under a rollout or engine one.
    forged = encode_event(_command(2))
    for subject in (DEFAULT.commands(), f"{DEFAULT.prefix}.rollout.engine.command", DEFAULT.invalid(),
                    DEFAULT.subject_for_type("engine.switched"), DEFAULT.watermark()):
        await rollout.refused_publish(subject, forged)
    # ... while a rollout event still goes through (and is not turned into anything else).
    ack = await rollout.nc.jetstream().publish(DEFAULT.subject_for_type("trajectory.dispatched"),
                                               b'{"v":1}', timeout=5)
    await rollout.nc.close()

    after = await ajs.stream_info(S)
    assert after.config.subject_transform is None and not after.config.sealed
    assert after.config.max_msgs == before.config.max_msgs and after.config.subjects == before.config.subjects
    assert after.state.messages == before.state.messages + 1 == ack.seq
    assert [c.name for c in await ajs.consumers_info(S)] == [AGENT_DURABLE]
    # The agent's command is still there for the agent, and it was the only one.
    info = await ajs.consumer_info(S, AGENT_DURABLE)
    assert info.num_pending + info.num_ack_pending == 1 and info.ack_floor.stream_seq == 0
    msgs = await sub.fetch(10, timeout=5)
    assert [json.loads(m.data)["cmd"] for m in msgs] == ["c1"]
    await msgs[0].ack_sync()
    await agent.close()


@pytest.mark.parametrize("user, subject", [
    # No stream changes for anyone but admin.
    ("tracker", f"$JS.API.STREAM.UPDATE.{S}"), ("tracker", f"$JS.API.STREAM.CREATE.{S}"),
    ("allocator", f"$JS.API.STREAM.PURGE.{S}"), ("engine-agent", f"$JS.API.STREAM.DELETE.{S}"),
    ("forecaster", f"$JS.API.STREAM.UPDATE.{S}"),
    # Message reads: the forecaster reads the last forecast only.
    ("forecaster", f"$JS.API.STREAM.MSG.GET.{S}"), ("forecaster", f"$JS.API.DIRECT.GET.{S}.{DEFAULT.commands()}"),
    ("forecaster", f"$JS.API.DIRECT.GET.{S}"),
    # Other services' consumers, by name or by a spy of one's own.
    ("allocator", f"$JS.API.CONSUMER.DELETE.{S}.prorsa-tracker"),
    ("forecaster", f"$JS.API.CONSUMER.CREATE.{S}.prorsa-allocator"),
    ("tracker", f"$JS.API.CONSUMER.CREATE.{S}"),
    ("engine-agent", f"$JS.API.CONSUMER.DELETE.{S}.prorsa-tracker"),
    ("engine-agent", f"$JS.API.CONSUMER.CREATE.{S}.prorsa-forecaster.{DEFAULT.commands()}"),
    ("engine-agent", f"$JS.API.CONSUMER.CREATE.{S}.spy.{DEFAULT.control_all()}"),
    ("engine-agent", f"$JS.API.CONSUMER.CREATE.{S}.spy"),
    # The agent reads one rollout subject (policy.updated), no other.
    ("engine-agent", f"$JS.API.CONSUMER.CREATE.{S}.prorsa-agent-policy-n.{DEFAULT.subject_for_type('request.queued')}"),
    ("engine-agent", f"$JS.API.CONSUMER.CREATE.{S}.prorsa-agent-policy-n.{DEFAULT.rollout_all()}"),
    ("engine-agent", f"$JS.API.CONSUMER.MSG.NEXT.{S}.prorsa-allocator"),
    ("engine-agent", f"$JS.ACK.{S}.prorsa-tracker.1.1.1.0.0"),
    # Subjects: only the allocator commands engines; each publishes its own events.
    ("tracker", DEFAULT.commands()), ("forecaster", DEFAULT.commands()), ("engine-agent", DEFAULT.commands()),
    ("allocator", DEFAULT.forecasts()), ("forecaster", DEFAULT.watermark()),
    ("engine-agent", DEFAULT.subject_for_type("request.queued")), ("tracker", DEFAULT.subject_for_type("engine.stats")),
])
async def test_a_service_user_is_refused_what_is_not_its_own(secured: NatsServer, user: str, subject: str):
    client = await Login.as_user(secured, user)
    await client.refused_publish(subject)
    await client.nc.close()


@pytest.mark.parametrize("user, subject", [
    ("tracker", "_INBOX.>"), ("forecaster", DEFAULT.control_all()), ("allocator", DEFAULT.rollout_all()),
    ("engine-agent", DEFAULT.commands()), ("engine-agent", "_INBOX.allocator.>"),
])
async def test_a_service_user_reads_only_through_its_own_consumers_and_inbox(secured: NatsServer, user: str,
                                                                               subject: str):
    client = await Login.as_user(secured, user)
    await client.refused_subscribe(subject)
    await client.nc.close()


def test_the_config_grants_exactly_the_contract_subjects():
    text = ACCOUNTS.read_text()

    def grants(user: str) -> str:
        start = text.index(f"{{ user: {user},")
        return text[start:text.index("} }", start)]

    rollout, agent = grants("rollout"), grants("engine-agent")
    for t in ROLLOUT_TYPES:
        assert f'"{DEFAULT.subject_for_type(t)}"' in rollout, t
    for t in ENGINE_TYPES:
        assert f'"{DEFAULT.subject_for_type(t)}"' in agent, t
    assert ">" not in rollout.replace("_INBOX.rollout.>", "") and "CONSUMER" not in rollout
    for user in ("rollout", "tracker", "forecaster", "allocator", "engine-agent"):
        block = grants(user)
        for call in ("STREAM.CREATE", "STREAM.UPDATE", "STREAM.DELETE", "STREAM.PURGE", "STREAM.MSG", "$JS.API.>",
                     "STREAM.NAMES", "STREAM.LIST", "CONSUMER.LIST", "CONSUMER.DURABLE"):
            assert call not in block, (user, call)


async def test_the_agent_reads_policy_updates_and_nothing_else_of_the_rollout(secured: NatsServer, admin: NATS):
    from prorsa_schemas import PolicyUpdated

    from prorsa_engine_agent.watchers import policy_consumer

    await publish_event(admin.jetstream(), DEFAULT, PolicyUpdated(id="pu-1", ts=1.0, run="r", version=3))
    nc = await connect(secured.url, "engine-agent-node0", credentials=creds("engine-agent"), timeout=10)
    seen: list[int] = []
    # The agent's own way: an ordered pull consumer named for its server, one filter subject.
    from prorsa_runtime.reader import OrderedReader

    reader = OrderedReader(nc.jetstream(), DEFAULT, policy_consumer(DEFAULT, "node0"),
                           [DEFAULT.subject_for_type("policy.updated")],
                           lambda msg, seq: (seen.append(json.loads(msg.data)["version"]), reader.release()))
    await reader.start()
    await async_wait_until(lambda: seen == [3], timeout=10, what="policy.updated read by the agent's user")
    await reader.stop()
    await nc.close()


async def test_a_restricted_service_checks_the_stream_and_says_what_to_run(secured: NatsServer):
    nc = await connect(secured.url, "prorsa-tracker", credentials=creds("tracker"), timeout=10)
    with pytest.raises(StreamMissing, match="prorsa nats setup"):
        await open_stream(nc.jetstream(), DEFAULT, secured.url, creds("tracker"))
    await nc.close()
    # As a service process: one clear line, exit status 1, no traceback.
    env = {k: v for k, v in os.environ.items() if k not in PASSWORDS}
    env.update({"PRORSA_NATS_URL": secured.url, "PRORSA_NATS_USER": "allocator",
                "PRORSA_ALLOCATOR_NATS_PASSWORD": PASSWORDS[VARS["allocator"]]})
    proc = subprocess.run([sys.executable, "-m", "prorsa_cli.main", "allocator", "run"], env=env,
                          capture_output=True, text=True, timeout=120)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "stream PRORSA does not exist" in text and "prorsa nats setup" in text and "Traceback" not in text, text


def test_prorsa_nats_setup_is_the_admin_step(secured: NatsServer):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("PRORSA_")},
           "PRORSA_NATS_URL": secured.url, "PRORSA_NATS_USER": "admin",
           "PRORSA_NATS_PASSWORD": PASSWORDS[VARS["admin"]]}
    cmd = [sys.executable, "-m", "prorsa_cli.main", "nats", "setup"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0 and "created stream PRORSA" in first.stdout, first.stdout + first.stderr
    assert "direct get on" in first.stdout
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "stream PRORSA on" in again.stdout and "is set up" in again.stdout, again.stdout


def test_monitoring_listens_on_loopback_only(secured: NatsServer):
    lines = b"".join(secured._tail).decode()
    assert "Starting http monitor on 127.0.0.1:" in lines, lines


def test_missing_password_variable_stops_the_server_with_its_name(tmp_path: Path):
    env = {**PASSWORDS}
    env.pop("PRORSA_TRACKER_NATS_PASSWORD")
    with pytest.raises(Exception) as exc:
        NatsServer(tmp_path / "js", port=0, config_file=SERVER_CONF, environ=env).start(timeout=10)
    assert "PRORSA_TRACKER_NATS_PASSWORD" in str(exc.value)


async def test_wrong_password_is_refused_by_connect(secured: NatsServer):
    with pytest.raises(BusAuthError) as exc:
        await connect(secured.url, "tracker", credentials=Credentials("tracker", "nope"), timeout=5)
    assert "refused" in str(exc.value) and "Authorization Violation" in str(exc.value)


def test_a_service_with_wrong_credentials_exits_and_says_why(secured: NatsServer, tmp_path: Path):
    # Not the server's password variables: PRORSA_ALLOCATOR_NATS_PASSWORD is also the allocator's own.
    env = {k: v for k, v in os.environ.items() if k not in PASSWORDS}
    env.update({"PRORSA_NATS_URL": secured.url, "PRORSA_NATS_USER": "allocator",
                "PRORSA_NATS_PASSWORD": "wrong-password"})
    proc = subprocess.run([sys.executable, "-m", "prorsa_cli.main", "allocator", "run"], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    assert "refused" in text and "Authorization Violation" in text, text


async def test_a_service_cannot_deliver_its_consumer_into_a_stream_subject(secured: NatsServer, admin: NATS):
    # The body of a create request is not restricted by the permissions: the server itself
    # refuses a deliver subject the stream captures (a forged command through a consumer).
    nc = await connect(secured.url, "prorsa-tracker", credentials=creds("tracker"), timeout=10)
    req = {"stream_name": S, "config": {"name": "prorsa-tracker", "deliver_subject": DEFAULT.commands(),
                                        "ack_policy": "none", "filter_subject": DEFAULT.rollout_all()}}
    reply = await nc.request(f"$JS.API.CONSUMER.CREATE.{S}.prorsa-tracker", json.dumps(req).encode(), timeout=5)
    assert "forms a cycle" in json.loads(reply.data)["error"]["description"]
    await nc.close()
    assert await admin.jetstream().consumers_info(S) == []


async def test_reading_the_engine_announcements_as_rollout_is_a_clear_error(secured: NatsServer, admin: NATS):
    # prorsa_sdk.coordination reads engine.registered from the stream: admin may, the rollout
    # user (which reads nothing) gets a CoordinationError naming it, not a hang.
    from prorsa_sdk.coordination import CoordinationError, announced_engines
    from prorsa_schemas import EngineRegistered

    await publish_event(admin.jetstream(), DEFAULT, EngineRegistered(
        id="reg-coord", ts=1.0, run="r", engine="e0", server="s", role="prefill", gpus=8, kv_capacity_tokens=10,
        url="http://h:1"))
    assert await announced_engines(secured.url, credentials=creds("admin"), timeout=5) == {"e0": "http://h:1"}
    with pytest.raises(CoordinationError, match="as user 'rollout'.*rollout user reads nothing"):
        await announced_engines(secured.url, credentials=creds("rollout"), timeout=2)
