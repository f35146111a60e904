"""Launch emulated engines and a router as local processes (real HTTP servers).

Used by ``prorsa emulated up``, ``scripts/emulated-cluster`` and the tests. Readiness is
awaited by polling ``/health`` with a timeout, never by sleeping a fixed time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import httpx

# free_port: a port that was free a moment ago and that this process was not given before
# (until somebody binds it the OS may offer the same port again, and an engine's HTTP and
# bootstrap ports, asked for one after the other, would then be equal).
from prorsa_runtime.natsserver import free_port


def engine_command(port: int, role: str = "prefill", *, host: str = "127.0.0.1",
                   bootstrap_port: int | None = None, switch: bool = True, speed: float = 1.0,
                   extra: list[str] | None = None) -> list[str]:
    """The command line of one emulated engine (a free bootstrap port unless one is given:
    a prefill engine listens on it)."""
    cmd = [sys.executable, "-m", "prorsa_emulated", "engine", "--host", host,
           "--port", str(port), "--disaggregation-mode", role, "--speed", str(speed),
           "--disaggregation-bootstrap-port", str(bootstrap_port or free_port(host))]
    if switch:
        cmd.append("--enable-pd-role-switch")
    return cmd + list(extra or [])


def router_command(port: int, host: str = "127.0.0.1", health_interval: float = 1.0) -> list[str]:
    """The command line of the emulated router."""
    return [sys.executable, "-m", "prorsa_emulated", "router", "--host", host,
            "--port", str(port), "--health-interval", str(health_interval)]


SGLANG_ROUTER_VERSION = "0.3.2"
RouterKind = Literal["sglang", "emulated"]
ROUTER_KINDS: tuple[str, ...] = ("sglang", "emulated")


def sglang_router_command(port: int, host: str = "127.0.0.1", *, pd: bool = True,
                          prometheus_port: int | None = None, extra: list[str] | None = None) -> list[str]:
    """The command line of the real router (sglang-router, a Rust binary behind a Python
    launcher), with no workers: the engine agents add them through ``POST /workers``.

    ``pd``: PD mode (prefill and decode workers); otherwise regular workers (colocation).
    ``prometheus_port``: its metrics listener (default 29000: two routers on one host need
    two). Workers are checked for startup every second, not every 30 s, so one added right
    after it came up is routable at once."""
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port),
           "--prometheus-host", host, "--prometheus-port", str(prometheus_port or free_port(host)),
           "--worker-startup-check-interval", "1", "--log-level", "warn"]
    if pd:
        cmd.append("--pd-disaggregation")
    return cmd + list(extra or [])


@dataclass
class EmulatedProcess:
    """One emulated server process."""

    name: str
    cmd: list[str]
    url: str
    log: Path | None = None
    proc: subprocess.Popen | None = None

    def start(self) -> "EmulatedProcess":
        out = open(self.log, "ab") if self.log else subprocess.DEVNULL
        # Own session: killing a test's agent must not take its engines with it.
        self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_healthy(self, timeout: float = 60.0) -> "EmulatedProcess":
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} at {self.url} not healthy after {timeout}s")
            time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.running():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        if not self.running():
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()


@dataclass
class EmulatedCluster:
    """N emulated engines (roles given in order) and one router, on free local ports."""

    roles: list[str]
    speed: float = 1.0
    switch: bool = True
    host: str = "127.0.0.1"
    log_dir: Path | None = None
    engine_extra: list[str] = field(default_factory=list)
    router_kind: RouterKind = "sglang"
    """``sglang``: the real router (sglang-router); ``emulated``: prorsa_emulated's own (router.py)."""
    router: EmulatedProcess | None = None
    engines: list[EmulatedProcess] = field(default_factory=list)

    def start(self, timeout: float = 60.0, register: bool = False) -> "EmulatedCluster":
        if self.log_dir:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        rport = free_port(self.host)
        if self.router_kind == "sglang":
            pd = any(r in ("prefill", "decode") for r in self.roles)
            cmd = sglang_router_command(rport, self.host, pd=pd)
        elif self.router_kind == "emulated":
            cmd = router_command(rport, self.host, health_interval=0.5)
        else:
            raise ValueError(f"router_kind {self.router_kind!r}: choose one of {', '.join(ROUTER_KINDS)}")
        self.router = EmulatedProcess("router", cmd, f"http://{self.host}:{rport}", self._log("router")).start()
        for i, role in enumerate(self.roles):
            port, bport = free_port(self.host), free_port(self.host)
            self.engines.append(EmulatedProcess(
                f"engine-{i}", engine_command(port, role, host=self.host, bootstrap_port=bport,
                                              switch=self.switch, speed=self.speed,
                                              extra=self.engine_extra),
                f"http://{self.host}:{port}", self._log(f"engine-{i}")).start())
        for p in [self.router, *self.engines]:
            p.wait_healthy(timeout)
        if register:
            for p, role in zip(self.engines, self.roles):
                body = {"url": p.url, "worker_type": role if role != "null" else "regular"}
                if role == "prefill":
                    body["bootstrap_port"] = int(p.cmd[p.cmd.index("--disaggregation-bootstrap-port") + 1])
                httpx.post(f"{self.router.url}/workers", json=body, timeout=5.0).raise_for_status()
        return self

    def _log(self, name: str) -> Path | None:
        return self.log_dir / f"{name}.log" if self.log_dir else None

    def stop(self) -> None:
        for p in [*self.engines, *( [self.router] if self.router else [])]:
            p.stop()

    def __enter__(self) -> "EmulatedCluster":
        return self if self.router is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
