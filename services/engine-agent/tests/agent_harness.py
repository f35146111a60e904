"""Fixtures: a router (sglang-router, a real process), an engine agent (real process) whose
emulated engines it launches itself, and a collector of the namespace's engine events."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from prorsa_runtime.bus import connect, ensure_stream, publish_event
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import EngineCommand, Namespace, decode_event
from prorsa_emulated.cluster import EmulatedProcess, free_port, router_command, sglang_router_command


class Events:
    """Every engine.* event of a namespace, read from the stream (nothing is missed)."""

    def __init__(self) -> None:
        self.items: list = []

    def of(self, type_: str, **match) -> list:
        return [e for e in self.items if e.type == type_ and all(getattr(e, k) == v for k, v in match.items())]

    async def wait(self, type_: str, timeout: float = 30.0, **match):
        await async_wait_until(lambda: self.of(type_, **match), timeout=timeout,
                               what=f"{type_} {match}; have {[e.type for e in self.items][-20:]}")
        return self.of(type_, **match)[-1]


@pytest.fixture
def router() -> Iterator[EmulatedProcess]:
    """The real router, sglang-router 0.3.2 in PD mode (PRORSA_TEST_ROUTER=emulated: the
    emulated one)."""
    port = free_port()
    if os.environ.get("PRORSA_TEST_ROUTER", "sglang") == "emulated":
        cmd = router_command(port, health_interval=0.2)
    else:
        cmd = sglang_router_command(port)
    p = EmulatedProcess("router", cmd, f"http://127.0.0.1:{port}").start()
    p.wait_healthy(30)
    yield p
    p.stop()


class Agent:
    """The agent as a real process, with its config file and state folder."""

    def __init__(self, tmp: Path, nats_url: str, ns: Namespace, router_url: str, instances: list[dict],
                 **settings: object):
        self.dir = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.config = tmp / "agent.toml"
        self.log = tmp / "agent.log"
        self.proc: subprocess.Popen | None = None
        lines = [
            f'server = "{settings.pop("server", "node-a")}"',
            f'router_url = "{router_url}"',
            f'nats_url = "{nats_url}"',
            f'subject_prefix = "{ns.prefix}"',
            f'stream = "{ns.stream}"',
            f'state_dir = "{tmp / "state"}"',
            'log_level = "INFO"',
        ]
        defaults = {"stats_interval_s": 0.2, "poll_s": 0.02, "unknown_engine_grace_s": 0.2,
                    "health_timeout_s": 20.0, "restart_timeout_s": 30.0, "router_timeout_s": 10.0,
                    "abort_grace_s": 2.0}
        for k, v in {**defaults, **settings}.items():
            lines.append(f"{k} = {v!r}" if not isinstance(v, str) else f'{k} = "{v}"')
        for inst in instances:
            lines.append("[[instances]]")
            for k, v in inst.items():
                if isinstance(v, str):
                    lines.append(f'{k} = "{v}"')
                elif isinstance(v, bool):
                    lines.append(f"{k} = {'true' if v else 'false'}")
                elif isinstance(v, list):
                    lines.append(f"{k} = [" + ", ".join(f'"{x}"' for x in v) + "]")
                else:
                    lines.append(f"{k} = {v}")
        self.config.write_text("\n".join(lines) + "\n")
        self.instances = instances

    def start(self) -> "Agent":
        out = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prorsa_cli.main", "engine-agent", "run", "--config", str(self.config)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def engine_pids(self) -> dict[str, int]:
        import json

        path = self.dir / "state" / "journal.json"
        return json.loads(path.read_text()).get("pids", {}) if path.exists() else {}

    def kill_engines(self) -> None:
        for pid in self.engine_pids().values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    def tail(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


def emulated_instance(engine: str, role: str, *, speed: float = 50.0, switch_seconds: float = 1.0,
                      extra: list[str] | None = None, **kw: object) -> dict:
    return {"engine": engine, "role": role, "launch": "emulated", "port": free_port(),
            "bootstrap_port": free_port(),
            "extra_args": ["--speed", str(speed), "--switch-seconds", str(switch_seconds), *(extra or [])],
            **kw}


@pytest.fixture
def agent_factory(tmp_path: Path, nats_url: str, ns: Namespace, router: EmulatedProcess):
    agents: list[Agent] = []

    def make(instances: list[dict], **settings: object) -> Agent:
        a = Agent(tmp_path / f"agent{len(agents)}", nats_url, ns, router.url, instances, **settings)
        a.dir.mkdir(parents=True, exist_ok=True)
        agents.append(a)
        return a

    yield make
    for a in agents:
        a.kill()
        a.kill_engines()


@pytest.fixture
async def events(nats_url: str, ns: Namespace):
    from nats.js.api import ConsumerConfig, DeliverPolicy

    nc = await connect(nats_url, "test-events")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    ev = Events()

    async def on_msg(msg) -> None:
        ev.items.append(decode_event(msg.data))

    await js.subscribe(ns.engine_all(), cb=on_msg, ordered_consumer=True,
                       config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL))
    ev.js = js  # type: ignore[attr-defined]
    ev.nats_url = nats_url  # type: ignore[attr-defined]
    yield ev
    await nc.close()


async def send_command(js, ns: Namespace, engine: str, to_role: str, *, cmd: str | None = None,
                       deadline_s: float = 60.0, run: str = "test") -> str:
    import time

    cmd = cmd or f"c-{uuid.uuid4().hex[:8]}"
    now = time.time()
    await publish_event(js, ns, EngineCommand(id=f"{cmd}/cmd-{uuid.uuid4().hex[:6]}", ts=now, run=run, cmd=cmd,
                                              engine=engine, action="switch_role", to_role=to_role,
                                              deadline=now + deadline_s))
    return cmd


async def router_workers(url: str) -> dict[str, str]:
    async with httpx.AsyncClient() as c:
        ws = (await c.get(f"{url}/workers")).json()["workers"]
    return {w["url"]: w["worker_type"] for w in ws}


async def listed_as(router_url: str, url: str, role: str | None) -> bool:
    """The router lists ``url`` as a ``role`` worker (None: does not list it)."""
    return (await router_workers(router_url)).get(url) == role


def running(url: str) -> bool:
    """The engine reports a request running."""
    loads = httpx.get(f"{url}/v1/loads?include=core").json()["loads"]
    return sum(load["num_running_reqs"] for load in loads) > 0


async def engine_role(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return (await c.get(f"{url}/model_info")).json()["disaggregation_mode"]


