"""What `prorsa up` can be asked for (:class:`UpOptions`) and the ports it uses
(:class:`Ports`: the standard ones, or a free block)."""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from prorsa_schemas.events import DEFAULT_WINDOW_S

Policy = Literal["prorsa", "advise", "static", "colocation"]
"""prorsa: PD with the allocator switching engines; advise: PD with the allocator in advisory
mode (plans published, no switch); static: PD, no allocator; colocation: mixed engines."""
RouterKind = Literal["sglang", "emulated"]
PauseMode = Literal["abort", "retract", "in_place"]


class UpError(RuntimeError):
    """A clear, user-facing reason why the stack cannot start."""


@dataclass
class UpOptions:
    """Everything `prorsa up` (and the demo) can be asked for."""

    workdir: Path = Path(".prorsa/up")
    nats: str | None = None  # an existing server's URL; None: run the embedded one
    nats_config: Path | None = None  # nats-server -c file (accounts) for the embedded server
    db: str | None = None  # default: SQLite in the workdir
    emulated_cluster: bool = False
    router: RouterKind = "sglang"
    """With --emulated-cluster: the real router (sglang-router) or the emulated one."""
    with_router: bool = False
    """Without --emulated-cluster: also run sglang-router (PD mode) for a real cluster's agents."""
    router_host: str | None = None  # where that router listens (default: ``host``)
    router_args: list[str] = field(default_factory=list)  # more sglang-router flags
    engines: int = 6
    prefill: int | None = None  # engines that start as prefill (default: a third)
    agents: int = 2  # engine agents ("servers") the engines are spread over
    policy: Policy = "prorsa"
    speed: float = 10.0
    workload: str = "general"
    batch_size: int = 24
    steps: int = 2
    staleness: int = 0
    """The driver's sampler: 0 synchronous steps; N > 0 asynchronous, N policy versions of
    staleness at most (docs/demo.md, "Asynchronous rollout")."""
    pause_mode: PauseMode = "abort"
    """How the driver's weight syncs pause the engines (SGLang's ``pause_generation`` mode,
    docs/demo.md "How the engines pause for a weight sync")."""
    max_turns: int = 6
    seed: int = 0
    emulated_model: str = "deepseek-v3.2"
    run: str = "demo"
    horizon: float | None = None
    """The forecast window S in wall seconds; None: :attr:`window_s`'s default."""
    port_base: int | None = None  # None: the standard ports; 0: any free block
    host: str = "127.0.0.1"
    compare_with: Path | None = None  # a workdir whose summary.json (the other policy) to compare with
    max_restarts: int = 5  # restarts in a row (none up for 30 s) before a service is given up
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def time_scale(self) -> float:
        """Cluster seconds per wall second: ``speed`` for the emulated cluster (its engines
        and driver run that much faster than the services' wall clock), 1 for a real one."""
        return self.speed if self.emulated_cluster else 1.0

    @property
    def window_s(self) -> float:
        """The forecast window S in wall seconds: ``horizon`` if given, else the contract's
        default (10 s, the paper's S) of the cluster's time."""
        return self.horizon if self.horizon is not None else DEFAULT_WINDOW_S / self.time_scale


def demo_steps(steps: int | None, staleness: int) -> int:
    """`prorsa demo`'s rollout steps: ``steps`` when given; else 3 for an asynchronous run
    (a warm-up that fills the empty cluster, then two measured steps, each one policy update
    to the next) and 2 for a synchronous one (each step a whole batch, the first the warm-up)."""
    if steps is not None:
        return steps
    return 3 if staleness > 0 else 2


@dataclass
class Ports:
    nats: int
    router: int
    router_metrics: int  # sglang-router's Prometheus listener (--prometheus-port)
    tracker_api: int
    tracker_metrics: int
    forecaster_metrics: int
    allocator_metrics: int
    agent_metrics: list[int]
    engines: list[tuple[int, int]]  # (http, bootstrap)
    nats_monitor: int = 8222  # with --nats-config: the server's monitoring port, on loopback

    def named(self) -> list[tuple[str, int]]:
        out = [("nats", self.nats), ("nats monitoring", self.nats_monitor), ("router", self.router),
               ("router metrics", self.router_metrics), ("tracker API", self.tracker_api),
               ("tracker metrics", self.tracker_metrics), ("forecaster metrics", self.forecaster_metrics),
               ("allocator metrics", self.allocator_metrics)]
        out += [(f"engine agent {i} metrics", p) for i, p in enumerate(self.agent_metrics)]
        for i, (h, b) in enumerate(self.engines):
            out += [(f"engine {i}", h), (f"engine {i} bootstrap", b)]
        return out


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    from prorsa_runtime.natsserver import port_in_use

    return not port_in_use(port, host)


PORT_QUANTUM = 100
"""Ports per claimable unit: a `--port-base 0` block starts on a multiple of it and claims
the units it spans, so that two claimed blocks never overlap."""


class PortBlocks:
    """Claims on port blocks, one lock file per unit of :data:`PORT_QUANTUM` ports in
    ``directory`` (an exclusive ``flock``: released when this process exits or drops it, so
    a crashed `prorsa up` leaves nothing to clean up). A process keeps at most ``keep``
    claims, dropping its oldest (a stack planned that long ago has bound its ports, or is
    gone). Without ``fcntl`` (not POSIX) every claim succeeds."""

    def __init__(self, directory: Path | None = None, keep: int = 16):
        self.directory = directory or Path(tempfile.gettempdir()) / "prorsa-port-blocks"
        self.keep = keep
        self.held: list[list] = []

    def claim(self, units) -> bool:
        """Claim every unit of ``units`` (all or none)."""
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return True
        self.directory.mkdir(parents=True, exist_ok=True)
        files = []
        for u in units:
            f = open(self.directory / f"{u}.lock", "a")
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.close()
                for g in files:
                    g.close()
                return False
            files.append(f)
        self.held.append(files)
        while len(self.held) > self.keep:
            for g in self.held.pop(0):
                g.close()
        return True

    def release(self) -> None:
        """Drop every claim of this process."""
        for files in self.held:
            for f in files:
                f.close()
        self.held.clear()


blocks = PortBlocks()
"""This process's claims."""


def plan_ports(opts: UpOptions, rng: random.Random | None = None) -> Ports:
    """Standard ports, or a block from ``port_base`` (0: a random free block, claimed
    against every other process that plans one on this host: :class:`PortBlocks`)."""
    n, k = opts.engines, opts.agents

    def layout(b: int | None) -> Ports:
        if b is None:
            return Ports(4222, 30080, 29000, 8470, 9101, 9102, 9103, [9111 + i for i in range(k)],
                         [(30001 + i, 31001 + i) for i in range(n)], 8222)
        return Ports(b, b + 1, b + 7, b + 2, b + 3, b + 4, b + 5, [b + 10 + i for i in range(k)],
                     [(b + 40 + 2 * i, b + 41 + 2 * i) for i in range(n)], b + 6)

    if opts.port_base == 0:
        # Below the OS's ephemeral range: a port in it that is free now can become the
        # source port of an outgoing connection before its service binds it (the tracker
        # once connected to NATS from the port it was about to serve metrics on).
        span = max(p for _, p in layout(0).named()) + 1
        low = ephemeral_low()
        top = low - span if low - span > 20000 + 100 else 60000
        rng = rng or random.Random()
        quanta = -(-span // PORT_QUANTUM)
        for _ in range(200):
            # A block starts on the quantum grid and is claimed (blocks.claim) for as long
            # as this process lives: two `prorsa up` planning at once each see the other's
            # ports free until they are bound (an engine's bootstrap port only when it
            # serves prefill), so a free-looking block is not enough.
            q = rng.randrange(20000 // PORT_QUANTUM, max(top // PORT_QUANTUM, 20000 // PORT_QUANTUM + 1))
            ports = layout(q * PORT_QUANTUM)
            if not all(port_free(p, opts.host) for _, p in ports.named()):
                continue
            if blocks.claim(range(q, q + quanta)):
                return ports
        raise UpError("found no block of free ports; pass --port-base N")
    return layout(opts.port_base)


def ephemeral_low(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> int:
    """The first port of the range the OS picks outgoing connections' source ports from
    (Linux; 32768, its default, where it cannot be read)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
