"""A small process supervisor for `prorsa up`: one child process per service.

Each child runs in its own session (so a terminal's Ctrl-C reaches only `prorsa up`, which
then stops the children in order), writes to its own log file, and is restarted with
exponential back-off when it exits unexpectedly. A child that keeps exiting soon after each
start (more than ``max_restarts`` times in a row) is given up: it stays down and its name is in
:attr:`Supervisor.given_up`, so that the caller can stop everything and report a failure
instead of restarting it forever. Stopping is SIGTERM to every child (in reverse start order),
a grace period, then SIGKILL for what is left; the children marked ``infrastructure`` (the
bus, the router, emulated engines) get their SIGTERM only once the others have exited, so
that a service's last publishes and deregistrations on its way out reach them.

The supervisor keeps a JSON state file (pids, restarts, logs) that operators and the
end-to-end tests read, e.g. to kill one service on purpose.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from prorsa_runtime.logs import tail_lines


@dataclass
class ProcSpec:
    """One supervised process."""

    name: str
    cmd: list[str]
    env: dict[str, str] = field(default_factory=dict)
    restart: bool = True
    """Restart when it exits (services); False for one-shot jobs (the rollout driver)."""
    ready: Callable[[], bool] | None = None
    """Returns True once the process serves (polled after start, before the next one)."""
    ready_timeout_s: float = 60.0
    cwd: Path | None = None
    infrastructure: bool = False
    """Stopped after every other child has exited (the bus, the router, emulated engines:
    what the services talk to while they stop)."""


@dataclass
class _Child:
    spec: ProcSpec
    log: Path
    proc: subprocess.Popen | None = None
    restarts: int = 0
    started: float = 0.0
    next_start: float | None = None
    backoff: float = 0.5
    exit_codes: list[int] = field(default_factory=list)
    crashes: int = 0  # exits in a row, each less than STABLE_S after its start
    gave_up: bool = False


class StartError(RuntimeError):
    """A child did not start or did not become ready; the message points at its log."""


class Supervisor:
    """Start, watch, restart and stop a set of processes."""

    MAX_BACKOFF_S = 10.0
    STABLE_S = 30.0  # up this long: the next crash starts the back-off (and the crash count) again

    def __init__(self, log_dir: Path, state_file: Path | None = None, on_event: Callable[[str], None] | None = None,
                 max_restarts: int = 5):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.state_file = state_file
        self.children: dict[str, _Child] = {}
        self.on_event = on_event or (lambda msg: None)
        self.max_restarts = max_restarts
        """Restarts in a row (each after less than STABLE_S up) before a child is given up."""
        self.given_up: list[str] = []
        """Children that kept crashing and are no longer restarted, in the order given up."""
        self._lock = threading.Lock()
        self.stopping = False

    # -- start --------------------------------------------------------------------------
    def start(self, spec: ProcSpec) -> None:
        """Start one process and wait until it is ready (raises :class:`StartError`)."""
        child = _Child(spec, self.log_dir / f"{spec.name}.log")
        self.children[spec.name] = child
        self._spawn(child)
        if spec.ready is None:
            return
        deadline = time.monotonic() + spec.ready_timeout_s
        while not spec.ready():
            if child.proc is not None and child.proc.poll() is not None:
                raise StartError(f"{spec.name} exited with code {child.proc.returncode} while starting; "
                                 f"last lines of {child.log}:\n{self.tail(spec.name)}")
            if time.monotonic() > deadline:
                raise StartError(f"{spec.name} not ready after {spec.ready_timeout_s:.0f}s; "
                                 f"last lines of {child.log}:\n{self.tail(spec.name)}")
            time.sleep(0.05)

    def _spawn(self, child: _Child) -> None:
        env = {**os.environ, **child.spec.env}
        with open(child.log, "ab") as fh:
            fh.write(f"--- {time.strftime('%H:%M:%S')} start: {' '.join(child.spec.cmd)}\n".encode())
            child.proc = subprocess.Popen(child.spec.cmd, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                          cwd=child.spec.cwd, start_new_session=True)
        child.started = time.monotonic()
        child.next_start = None
        self._save()

    def tail(self, name: str, lines: int = 15) -> str:
        try:
            return tail_lines(self.children[name].log, lines)
        except OSError:
            return "(no log)"

    # -- watch --------------------------------------------------------------------------
    def poll(self) -> list[str]:
        """Check every child once: schedule and perform restarts. Returns one-shot jobs that ended."""
        ended = []
        now = time.monotonic()
        with self._lock:
            if self.stopping:
                return ended
            for child in self.children.values():
                proc = child.proc
                if proc is None:
                    continue
                if proc.poll() is None:
                    if child.next_start is None and now - child.started > self.STABLE_S:
                        child.backoff = 0.5
                    continue
                if not child.spec.restart:
                    if child.next_start is None:
                        child.next_start = float("inf")  # reported once
                        child.exit_codes.append(proc.returncode)
                        ended.append(child.spec.name)
                    continue
                if child.next_start is None:
                    child.exit_codes.append(proc.returncode)
                    # A crash after a long stable run is a new incident, not part of a loop.
                    if now - child.started >= self.STABLE_S:
                        child.crashes, child.backoff = 1, 0.5
                    else:
                        child.crashes += 1
                    if child.crashes > self.max_restarts:
                        child.gave_up = True
                        child.next_start = float("inf")
                        self.given_up.append(child.spec.name)
                        self.on_event(f"{child.spec.name} exited with code {proc.returncode} after "
                                      f"{self.max_restarts} restarts in a row, none up for {self.STABLE_S:.0f}s; "
                                      f"giving up on it (log {child.log})")
                        self._save()
                        continue
                    child.next_start = now + child.backoff
                    self.on_event(f"{child.spec.name} exited with code {proc.returncode}; "
                                  f"restarting in {child.backoff:.1f}s (log {child.log})")
                    child.backoff = min(self.MAX_BACKOFF_S, child.backoff * 2)
                elif now >= child.next_start:
                    child.restarts += 1
                    self._spawn(child)
                    self.on_event(f"{child.spec.name} restarted (restart #{child.restarts})")
        return ended

    def gave_up_report(self, name: str) -> str:
        """One paragraph on a child given up: its exit codes and the last lines of its log."""
        child = self.children[name]
        codes = ", ".join(str(c) for c in child.exit_codes[-child.crashes:])
        times = "once" if self.max_restarts == 1 else f"{self.max_restarts} times"
        return (f"{name} kept exiting (exit codes {codes}): restarted {times} in a row, "
                f"none up for {self.STABLE_S:.0f}s, so it was given up. Last lines of {child.log}:\n{self.tail(name)}")

    def returncode(self, name: str) -> int | None:
        proc = self.children[name].proc
        return None if proc is None else proc.poll()

    # -- stop ---------------------------------------------------------------------------
    def stop(self, grace_s: float = 15.0, only: list[str] | None = None) -> None:
        """SIGTERM the children (reverse start order), wait up to ``grace_s``, SIGKILL the rest:
        first every child but the ``infrastructure`` ones, then those (each wave with its own
        ``grace_s``)."""
        with self._lock:
            if only is None:
                self.stopping = True
            names = [n for n in reversed(list(self.children)) if only is None or n in only]
            infra = [n for n in names if self.children[n].spec.infrastructure]
            for wave in ([n for n in names if n not in infra], infra):
                self._stop_wave(wave, grace_s)
            self._save()

    def _stop_wave(self, names: list[str], grace_s: float) -> None:
        for name in names:
            proc = self.children[name].proc
            if proc is not None and proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for name in names:
            proc = self.children[name].proc
            if proc is None:
                continue
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.on_event(f"{name} did not stop within {grace_s:.0f}s; killing it")
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(10)

    # -- state file ---------------------------------------------------------------------
    def _save(self) -> None:
        if self.state_file is None:
            return
        data = {
            name: {"pid": c.proc.pid if c.proc else None, "restarts": c.restarts, "log": str(c.log),
                   "cmd": c.spec.cmd, "running": bool(c.proc and c.proc.poll() is None),
                   "exit_codes": c.exit_codes, "gave_up": c.gave_up}
            for name, c in self.children.items()
        }
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"pid": os.getpid(), "processes": data}, indent=2))
        os.replace(tmp, self.state_file)

    def snapshot(self) -> dict:
        """Name -> (running, restarts) for progress displays."""
        return {n: (bool(c.proc and c.proc.poll() is None), c.restarts) for n, c in self.children.items()}
