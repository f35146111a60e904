"""deploy/nats/accounts.conf against a real nats-server: each service publishes only its own
subjects (the allocator alone may command engines), and wrong credentials are refused with
the reason."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from prorsa_runtime.bus import BusAuthError, Credentials, connect, ensure_stream, publish_event
from prorsa_runtime.natsserver import NatsServer
from prorsa_schemas import DEFAULT, EngineCommand

ROOT = Path(__file__).resolve().parents[1]
ACCOUNTS = ROOT / "deploy" / "nats" / "accounts.conf"
PASSWORDS = {
    "PRORSA_ROLLOUT_NATS_PASSWORD": "rollout-pw",
    "PRORSA_TRACKER_NATS_PASSWORD": "tracker-pw",
    "PRORSA_FORECASTER_NATS_PASSWORD": "forecaster-pw",
    "PRORSA_ALLOCATOR_NATS_PASSWORD": "allocator-pw",
    "PRORSA_AGENT_NATS_PASSWORD": "agent-pw",
}


@pytest.fixture
def secured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for k, v in PASSWORDS.items():
        monkeypatch.setenv(k, v)
    server = NatsServer(tmp_path / "js", port=0, config_file=ACCOUNTS).start()
    yield server
    server.stop()


def _command(i: int) -> EngineCommand:
    return EngineCommand(id=f"cmd-{i}", ts=1.0, run="r", cmd=f"c{i}", engine="e0", action="switch_role",
                         to_role="decode", deadline=100.0)


def test_missing_password_variable_stops_the_server_with_its_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for k in PASSWORDS:
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(Exception) as exc:
        NatsServer(tmp_path / "js", port=0, config_file=ACCOUNTS).start(timeout=10)
    assert "PRORSA_ROLLOUT_NATS_PASSWORD" in str(exc.value)


async def test_only_the_allocator_may_command_engines(secured: NatsServer):
    alloc = await connect(secured.url, "allocator", credentials=Credentials("allocator", "allocator-pw"), timeout=10)
    js = alloc.jetstream()
    await ensure_stream(js, DEFAULT)  # the JetStream API subjects the services need are allowed
    assert await publish_event(js, DEFAULT, _command(1)) >= 1
    await alloc.close()

    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    for user in ("tracker", "forecaster", "engine-agent", "rollout"):
        pw = PASSWORDS[f"PRORSA_{'AGENT' if user == 'engine-agent' else user.upper()}_NATS_PASSWORD"]
        nc = await nats.connect(secured.url, user=user, password=pw, error_cb=on_error, allow_reconnect=False)
        before = len(errors)
        with pytest.raises(Exception):
            await nc.jetstream().publish(DEFAULT.commands(), b"{}", timeout=1.0)
        await nc.flush()
        for _ in range(100):  # the violation notice arrives asynchronously
            if len(errors) > before:
                break
            await asyncio.sleep(0.02)
        assert any("permissions violation for publish" in e.lower() and DEFAULT.commands() in e for e in errors[before:]), (user, errors)
        await nc.close()


async def test_the_tracker_publishes_its_own_subjects(secured: NatsServer):
    nc = await connect(secured.url, "tracker", credentials=Credentials("tracker", "tracker-pw"), timeout=10)
    js = nc.jetstream()
    await ensure_stream(js, DEFAULT)
    ack = await js.publish(DEFAULT.watermark(), b'{"ts": 1.0}', timeout=5.0)
    assert ack.seq >= 1
    await nc.close()


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
