"""The router `prorsa up` starts: sglang-router 0.3.2 (the real one) or prorsa_emulated's
emulated router; and what a run's summary calls it."""

from __future__ import annotations

import socket
import sys

import httpx

from .options import Ports, UpError, UpOptions
from .supervisor import ProcSpec

PY = sys.executable
ROUTERS = ("sglang", "emulated")


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


def check_router_host(host: str) -> None:
    """Refuse a ``--router-host`` this machine cannot listen on, saying so."""

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.bind((host, 0))
    except OSError as exc:
        raise UpError(f"--router-host {host}: cannot listen there ({exc.strerror or exc}); "
                      "give an address of this host, or 0.0.0.0") from None


def router_spec(opts: UpOptions, ports: Ports, kind: str) -> tuple[str, ProcSpec]:
    """(router URL, process) of the router ``prorsa up`` starts.

    ``sglang``: the real router, sglang-router 0.3.2 (``python -m sglang_router.launch_router``),
    in PD mode (regular workers under colocation), with no worker: the engine agents add and
    remove theirs through ``POST``/``DELETE /workers``. ``emulated``: prorsa_emulated's router,
    kept for the faults the real one cannot be made to produce (see docs/engine-agent.md)."""

    if kind not in ROUTERS:
        raise UpError(f"--router must be one of {', '.join(ROUTERS)}, got {kind!r}")
    host = opts.router_host or opts.host
    # The URL the agents and the driver use: a wildcard address is reached on loopback here.
    reach = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    url = f"http://[{reach}]:{ports.router}" if ":" in reach else f"http://{reach}:{ports.router}"
    if kind == "emulated":
        cmd = [PY, "-m", "prorsa_emulated", "router", "--host", host, "--port", str(ports.router),
               "--health-interval", "0.5"]
    else:
        try:
            import sglang_router  # noqa: F401
        except ImportError:
            raise UpError("the real router needs sglang-router==0.3.2 (a dependency of prorsa-emulated; "
                          "`scripts/bootstrap` installs it), or pass --router emulated") from None
        from prorsa_emulated.cluster import sglang_router_command

        cmd = sglang_router_command(ports.router, host, pd=opts.policy != "colocation",
                                    prometheus_port=ports.router_metrics, extra=opts.router_args)
    return url, ProcSpec("router", cmd, ready=lambda: _http_ok(url + "/health"), ready_timeout_s=60.0,
                         infrastructure=True)


def router_name(kind: str | None) -> str:
    """What the run's router was: ``sglang-router 0.3.2`` (the installed version) or the
    emulated one."""
    if kind == "sglang":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"sglang-router {version('sglang-router')}"
        except PackageNotFoundError:
            return "sglang-router"
    return "emulated router (prorsa_emulated)" if kind == "emulated" else "none"
