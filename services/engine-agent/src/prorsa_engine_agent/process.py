"""Launch, adopt and stop SGLang processes.

Processes run in their own session, so the agent can die (even SIGKILL) without taking
its engines down; their ids go to the journal so that a restarted agent adopts them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

from prorsa_runtime.logs import tail_lines


def alive(pid: int | None) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still answers kill(0); read its state where /proc exists
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        return state != "Z"
    except OSError:
        return True


class Processes:
    """The engine processes this agent launched (or adopted from its journal)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self._popen: dict[str, subprocess.Popen] = {}

    def log_path(self, engine: str) -> Path:
        """Where the engine's process writes its output."""
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in engine)
        return self.log_dir / f"{safe}.log"

    def tail(self, engine: str, lines: int = 5) -> str:
        """The last lines of the engine's log ('' when there is none)."""
        try:
            return tail_lines(self.log_path(engine), lines)
        except OSError:
            return ""

    def launch(self, engine: str, cmd: list[str], env: dict[str, str]) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path(engine), "ab")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                env={**os.environ, **env}, start_new_session=True)
        log.close()
        self._popen[engine] = proc
        return proc.pid

    def exited(self, engine: str, pid: int | None) -> bool:
        proc = self._popen.get(engine)
        if proc is not None and proc.pid == pid:
            return proc.poll() is not None
        return not alive(pid)

    async def stop(self, engine: str, pid: int | None, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL after ``grace_s``; returns once it is gone."""
        if not pid:
            return
        proc = self._popen.pop(engine, None)
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while loop.time() < deadline:
                if proc is not None and proc.poll() is not None:
                    return
                if proc is None and not alive(pid):
                    return
                await asyncio.sleep(0.02)
