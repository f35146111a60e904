"""The runtime against real processes: nats-server resolver/runner, stream set-up, settings."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import nats
import pytest
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError as StreamNotFound

from prorsa_runtime import (
    BusUnavailable,
    NatsServer,
    NatsServerError,
    NatsServerNotFound,
    connect,
    ensure_stream,
    find_nats_server,
    publish_event,
)
from prorsa_runtime.settings import ServiceSettings, settings_for
from prorsa_schemas import Namespace, PolicyUpdated


def test_resolver_finds_the_wheel_binary() -> None:
    path = find_nats_server()
    assert path.name == "nats-server" and os.access(path, os.X_OK)


def test_resolver_env_var_must_point_at_an_executable(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PRORSA_NATS_SERVER", str(tmp_path / "missing"))
    with pytest.raises(NatsServerNotFound, match="PRORSA_NATS_SERVER"):
        find_nats_server()
    exe = tmp_path / "nats-server"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PRORSA_NATS_SERVER", str(exe))
    assert find_nats_server() == exe


def test_resolver_fails_loudly_when_nothing_is_found(monkeypatch, tmp_path: Path) -> None:
    import prorsa_runtime.natsserver as mod

    monkeypatch.delenv("PRORSA_NATS_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(mod.sysconfig, "get_path", lambda name: str(tmp_path))
    monkeypatch.setattr(mod.sys, "executable", str(tmp_path / "python"))
    with pytest.raises(NatsServerNotFound, match="no nats-server binary found"):
        find_nats_server()


def test_port_in_use_is_a_clear_error(nats_server: NatsServer, tmp_path: Path) -> None:
    with pytest.raises(NatsServerError, match="already in use"):
        NatsServer(tmp_path / "x", port=nats_server.port).start()


def test_server_that_cannot_start_reports_its_output(tmp_path: Path) -> None:
    with pytest.raises(NatsServerError, match="did not become ready"):
        NatsServer(tmp_path, extra_args=["--no-such-flag"]).start(timeout=10)


async def test_connect_times_out_with_a_clear_message(tmp_path: Path) -> None:
    from prorsa_runtime.natsserver import free_port

    with pytest.raises(BusUnavailable, match="could not connect"):
        await connect(f"nats://127.0.0.1:{free_port()}", "t", timeout=0.5)


async def test_ensure_stream_creates_verifies_and_repairs(nats_url: str, ns: Namespace) -> None:
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    try:
        cfg = await ensure_stream(js, ns)
        assert cfg.storage == StorageType.FILE and cfg.subjects == ns.stream_subjects()
        assert (cfg.duplicate_window or 0) >= 600
        # idempotent
        assert (await ensure_stream(js, ns)).name == ns.stream
        # a drifted subject set is repaired in place
        await js.update_stream(StreamConfig(name=ns.stream, subjects=[f"{ns.prefix}.rollout.>"],
                                            storage=StorageType.FILE))
        cfg = await ensure_stream(js, ns)
        assert cfg.subjects == ns.stream_subjects()
        # publishing twice with the same event id stores it once
        ev = PolicyUpdated(id="same", ts=1.0, run="r", version=1)
        s1 = await publish_event(js, ns, ev)
        s2 = await publish_event(js, ns, ev)
        assert s1 == s2
        assert (await js.stream_info(ns.stream)).state.messages == 1
    finally:
        await nc.close()


async def test_a_restricted_connection_only_verifies_and_the_admin_step_repairs(nats_url: str, ns: Namespace) -> None:
    from nats.js.api import SubjectTransform

    from prorsa_runtime import Credentials, StreamMissing, open_stream, verify_stream

    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    user = Credentials(user="tracker", password="x")
    try:
        # With a user, nothing is created: the message names the admin step.
        with pytest.raises(StreamMissing, match="does not exist.*prorsa nats setup"):
            await open_stream(js, ns, nats_url, user)
        with pytest.raises(StreamNotFound):
            await js.stream_info(ns.stream)
        # Without one (a server without auth), the service sets the stream up itself.
        await open_stream(js, ns, nats_url, Credentials())
        assert (await verify_stream(js, ns)).config.allow_direct
        # A stream with a subject transform and direct gets off is refused, then repaired.
        cfg = (await js.stream_info(ns.stream)).config
        cfg.allow_direct = False
        cfg.subject_transform = SubjectTransform(src=f"{ns.prefix}.rollout.>", dest=f"{ns.prefix}.control.x.>")
        await js.update_stream(cfg)
        with pytest.raises(StreamMissing, match="direct gets off; a subject transform"):
            await open_stream(js, ns, f"nats://tracker:pw@{nats_url.removeprefix('nats://')}", Credentials())
        fixed = await ensure_stream(js, ns)
        assert fixed.subject_transform is None and fixed.allow_direct
        assert (await js.stream_info(ns.stream)).config.subject_transform is None
    finally:
        await nc.close()


def test_credentials_name_their_login_and_reply_inbox() -> None:
    from prorsa_runtime import Credentials

    assert Credentials(user="engine-agent").inbox("nats://h:4222") == "_INBOX.engine-agent"
    assert Credentials().inbox("nats://rollout:pw@h:4222") == "_INBOX.rollout"
    assert Credentials().inbox("nats://h:4222") == "_INBOX" and not Credentials().restricted("nats://h:4222")
    assert Credentials(token="t").restricted("nats://h:4222") is False
    assert Credentials(creds_file="/x.creds", inbox_prefix="_INBOX.gpu7").inbox("nats://h") == "_INBOX.gpu7"
    env = {"PRORSA_NATS_USER": "rollout", "PRORSA_NATS_PASSWORD": "pw"}
    assert Credentials.from_env(env) == Credentials(user="rollout", password="pw")


async def test_memory_stream_is_refused(nats_url: str, ns: Namespace) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await js.add_stream(StreamConfig(name=ns.stream, subjects=ns.stream_subjects(), storage=StorageType.MEMORY))
        with pytest.raises(RuntimeError, match="file storage"):
            await ensure_stream(js, ns)
    finally:
        await js.delete_stream(ns.stream)
        await nc.close()


def test_settings_prefixes_and_validation(monkeypatch) -> None:
    Tracker = settings_for("PRORSA_TRACKER_")
    monkeypatch.setenv("PRORSA_NATS_URL", "nats://common:4222")
    assert Tracker().nats_url == "nats://common:4222"
    monkeypatch.setenv("PRORSA_TRACKER_NATS_URL", "nats://own:4222")
    assert Tracker().nats_url == "nats://own:4222"
    monkeypatch.setenv("PRORSA_TRACKER_NATS_URL", "http://wrong")
    with pytest.raises(Exception, match="nats://"):
        Tracker()
    monkeypatch.delenv("PRORSA_TRACKER_NATS_URL")
    monkeypatch.setenv("PRORSA_LOG_LEVEL", "debug")
    assert ServiceSettings().log_level == "DEBUG"
    monkeypatch.setenv("PRORSA_STREAM", "bad stream!")
    with pytest.raises(ValueError):
        ServiceSettings().namespace()


def test_free_port_never_gives_one_process_the_same_port_twice(monkeypatch):
    # The OS may offer the port it just offered while nobody has bound it yet; two
    # engines of one agent config once got the same port that way. Make it do so.
    import socket

    from prorsa_runtime import natsserver

    offers = iter([41001, 41001, 41001, 41002, 41001, 41003])
    real = socket.socket

    class Offering(real):
        def getsockname(self):
            return ("127.0.0.1", next(offers))

    monkeypatch.setattr(natsserver, "_HANDED_OUT", set())
    monkeypatch.setattr(natsserver.socket, "socket", Offering)
    assert [natsserver.free_port() for _ in range(3)] == [41001, 41002, 41003]


def test_stop_signals_set_a_flag_without_a_lock() -> None:
    # The handler only sets a flag: a signal that lands while the loop is in wait() (or
    # anywhere else in the main thread) is seen at the loop's next check.
    import os
    import signal

    from prorsa_runtime.cli import StopSignals

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            stop = StopSignals()
            assert stop.wait(0.0) is False
            os.kill(os.getpid(), sig)
            assert stop.wait(0.0) is True and stop.stopped
            assert signal.getsignal(sig) == stop._on_signal
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
