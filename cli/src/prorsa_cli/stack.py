"""What `prorsa up` starts: the process specs of the embedded single-machine deployment.

Pure planning (ports, environment, command lines, agent config files); the supervisor
(`supervisor.py`) runs the result and `up.py` is the command line.
"""

from __future__ import annotations

import os
import secrets
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from prorsa_allocator.timescale import time_scaled_env

from .options import Ports, UpError, UpOptions, plan_ports, port_free
from .routerproc import check_router_host, router_spec
from .supervisor import ProcSpec

PY = sys.executable

NATS_USERS = {
    # user of deploy/nats/accounts.conf -> the variable that holds its password
    "admin": "PRORSA_ADMIN_NATS_PASSWORD",
    "rollout": "PRORSA_ROLLOUT_NATS_PASSWORD",
    "tracker": "PRORSA_TRACKER_NATS_PASSWORD",
    "forecaster": "PRORSA_FORECASTER_NATS_PASSWORD",
    "allocator": "PRORSA_ALLOCATOR_NATS_PASSWORD",
    "engine-agent": "PRORSA_AGENT_NATS_PASSWORD",
}
PASSWORDS_FILE = "nats-passwords.env"

def emulated_prefill_tokens_per_s(model: str, speed: float) -> float:
    """θᴾ of one emulated engine as its profile computes it: every attention-DP rank running
    full chunks (``attn_dp x chunk / prefill_time(chunk)``), per wall second (x ``speed``:
    the services run on the wall clock). The allocator's prior, as an operator who
    benchmarked the engine would set it; it then learns θᴾ from engine.stats."""
    from prorsa_emulated.profiles import emulated_profile

    p = emulated_profile(model)
    return speed * p.attn_dp * p.chunk_size / p.prefill_time(p.chunk_size)


def emulated_switch_priors(model: str, speed: float) -> dict[str, str]:
    """The allocator's switch-time priors from the emulated engines' profile (in place and
    restart, as an operator who timed a switch would set them), in wall seconds (/ ``speed``),
    as ``PRORSA_ALLOCATOR_*`` variables; learned from engine.switched after that."""
    from prorsa_emulated.profiles import emulated_profile

    p = emulated_profile(model)
    return {"PRORSA_ALLOCATOR_IN_PLACE_SWITCH_S": f"{p.in_place_switch_s / speed:.6g}",
            "PRORSA_ALLOCATOR_RESTART_SWITCH_S": f"{p.restart_switch_s / speed:.6g}"}


def check_ports(ports: Ports, opts: UpOptions) -> None:
    """Refuse to start when a port we need is taken, naming the port and its use."""
    needed = ports.named()
    if opts.nats is not None:
        needed = [x for x in needed if not x[0].startswith("nats")]
    if opts.nats_config is None:
        needed = [x for x in needed if x[0] != "nats monitoring"]
    if not opts.emulated_cluster:
        needed = [x for x in needed if not x[0].startswith("engine ")]
    if not (opts.emulated_cluster or opts.with_router):
        needed = [x for x in needed if not x[0].startswith("router")]
    elif opts.emulated_cluster and opts.router == "emulated":
        needed = [x for x in needed if x[0] != "router metrics"]
    rhost = opts.router_host or opts.host
    if rhost != opts.host and any(what.startswith("router") for what, _ in needed):
        check_router_host(rhost)
    taken = [f"{p} ({what}{' on ' + rhost if rhost != opts.host and what.startswith('router') else ''})"
             for what, p in needed if not port_free(p, rhost if what.startswith("router") else opts.host)]
    if taken:
        raise UpError(f"port(s) already in use on {opts.host}: {', '.join(taken)}. Stop what holds them "
                      "(another `prorsa up`?) or choose other ports with --port-base N (0: any free block).")


def _http_ok(url: str, any_status: bool = False) -> bool:
    try:
        r = httpx.get(url, timeout=1.0)
    except httpx.HTTPError:
        return False
    return any_status or r.status_code == 200


def _tcp_ok(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _agent_config(path: Path, server: str, router: str, state_dir: Path, engines: list[dict]) -> None:
    lines = [f'server = "{server}"', f'router_url = "{router}"', 'run = "engines"',
             f'state_dir = "{state_dir}"', "stats_interval_s = 1.0", "unknown_engine_grace_s = 5.0", ""]
    for e in engines:
        lines += ["[[instances]]"] + [f"{k} = {_toml(v)}" for k, v in e.items()] + [""]
    path.write_text("\n".join(lines))


def _toml(v: object) -> str:
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return str(v)


@dataclass
class StackPlan:
    specs: list[ProcSpec]
    ports: Ports
    nats_url: str
    db_url: str
    router_url: str | None
    api_token: str
    driver_out: Path
    progress: Path
    metrics: dict[str, str]
    colocated_engines: list[str] = field(default_factory=list)
    router_kind: str | None = None  # "sglang", "emulated" or None (no router started)
    setup: Callable[[], str] | None = None
    """The admin step after the nats-server is up: sets up the stream, says what it did."""


def nats_passwords(workdir: Path) -> dict[str, str]:
    """A password per user of ``deploy/nats/accounts.conf``: from the environment where set,
    else generated once and kept in ``<workdir>/nats-passwords.env`` (mode 0600)."""
    path = workdir / PASSWORDS_FILE
    kept: dict[str, str] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            key, sep, value = line.partition("=")
            if sep:
                kept[key.strip()] = value.strip()
    # nats-server parses a variable's value as a config value: a password that starts with a
    # digit or a dash is read as a number and refused, so ours start with a letter.
    generated = {var: kept.get(var) or "p" + secrets.token_hex(24) for var in NATS_USERS.values()}
    path.write_text("".join(f"{k}={v}\n" for k, v in generated.items()))
    path.chmod(0o600)
    return {var: os.environ.get(var) or generated[var] for var in NATS_USERS.values()}


def _nats_login(service_prefix: str, user: str, passwords: dict[str, str] | None) -> dict[str, str]:
    """A service's NATS user and password variables (``PRORSA_TRACKER_NATS_USER`` ...)."""
    if passwords is None:
        return {}
    return {f"{service_prefix}NATS_USER": user, f"{service_prefix}NATS_PASSWORD": passwords[NATS_USERS[user]]}


def plan_stack(opts: UpOptions) -> StackPlan:
    """The processes to start, in order, with their readiness checks."""
    from prorsa_runtime.natsserver import NatsServer, NatsServerNotFound

    wd = opts.workdir.resolve()
    wd.mkdir(parents=True, exist_ok=True)
    ports = plan_ports(opts)
    check_ports(ports, opts)
    h = opts.host
    specs: list[ProcSpec] = []
    base_env = {"PRORSA_LOG_LEVEL": "INFO", **opts.extra_env}
    # With a config file (deploy/nats/server.conf: a user per service), each service logs in
    # as its own user and the admin sets the stream up; without one, nobody logs in.
    passwords = nats_passwords(wd) if opts.nats is None and opts.nats_config is not None else None
    setup = None
    if opts.nats is None:
        try:
            server = NatsServer(wd / "nats", port=ports.nats, host=h, config_file=opts.nats_config,
                                monitor_port=ports.nats_monitor if opts.nats_config else None,
                                environ=passwords)
        except NatsServerNotFound as exc:
            raise UpError(str(exc)) from None
        nats_url = server.url
        specs.append(ProcSpec("nats-server", server.command(), env=server.env(), ready=lambda: _tcp_ok(h, ports.nats),
                              infrastructure=True))
        admin = _nats_login("PRORSA_", "admin", passwords)
        setup = lambda: _setup_stream(nats_url, admin)  # noqa: E731
    else:
        nats_url = opts.nats
    base_env["PRORSA_NATS_URL"] = nats_url
    db_url = opts.db or f"sqlite:///{wd / 'tracker.db'}"
    token_file = wd / "api-token"
    token = token_file.read_text().strip() if token_file.exists() else secrets.token_urlsafe(18)
    token_file.write_text(token)
    token_file.chmod(0o600)
    cli = [PY, "-m", "prorsa_cli.main"]
    m = {"tracker": f"http://{h}:{ports.tracker_metrics}", "forecaster": f"http://{h}:{ports.forecaster_metrics}",
         "allocator": f"http://{h}:{ports.allocator_metrics}"}
    specs.append(ProcSpec("tracker", cli + ["tracker", "run"], env={
        **base_env, "PRORSA_TRACKER_DB_URL": db_url, "PRORSA_TRACKER_METRICS_PORT": str(ports.tracker_metrics),
        "PRORSA_TRACKER_HTTP_PORT": str(ports.tracker_api), "PRORSA_TRACKER_HTTP_HOST": h,
        "PRORSA_TRACKER_API_TOKEN": token, "PRORSA_TRACKER_CLOCK": "wall",
        **_nats_login("PRORSA_TRACKER_", "tracker", passwords)},
        ready=lambda: _http_ok(m["tracker"] + "/health")))
    specs.append(ProcSpec("forecaster", cli + ["forecaster", "run"], env={
        **base_env, "PRORSA_FORECASTER_HORIZON": f"{opts.window_s:g}",
        # The emulated cluster's durations are `speed` times shorter on the wall clock the
        # events carry: so are the priors the forecaster uses before it has history.
        **({"PRORSA_FORECASTER_TIME_SCALE": f"{opts.time_scale:g}"}
           if opts.time_scale != 1 and "PRORSA_FORECASTER_TIME_SCALE" not in os.environ else {}),
        "PRORSA_FORECASTER_METRICS_PORT": str(ports.forecaster_metrics),
        **_nats_login("PRORSA_FORECASTER_", "forecaster", passwords)},
        ready=lambda: _http_ok(m["forecaster"] + "/metrics")))
    if opts.policy in ("prorsa", "advise"):
        alloc_env = {"PRORSA_ALLOCATOR_METRICS_PORT": str(ports.allocator_metrics),
                     **_nats_login("PRORSA_ALLOCATOR_", "allocator", passwords)}
        if opts.policy == "advise":
            # Advisory mode: every plan published and logged, no engine switched.
            alloc_env["PRORSA_ALLOCATOR_ACTUATE"] = "false"
        if opts.emulated_cluster:
            # The cluster runs `speed` times faster than the services' wall clock: every
            # duration of the allocator's defaults is scaled to it (a 30 s dwell stays 30 s of
            # the cluster's time), and θᴾ and the switch times are the emulated engines' own
            # from their profile.
            # Env vars win.
            env = {**time_scaled_env(opts.time_scale), "PRORSA_ALLOCATOR_PREFILL_TOKENS_PER_S":
                   f"{emulated_prefill_tokens_per_s(opts.emulated_model, opts.speed):.0f}",
                   **emulated_switch_priors(opts.emulated_model, opts.speed)}
            # It acts for the one run the stack's driver rolls out: another run's forecasts
            # and weight updates on the same bus (a second driver, a replay) are not its own.
            env["PRORSA_ALLOCATOR_RUN"] = opts.run
            alloc_env.update({k: v for k, v in env.items() if k not in os.environ})
        specs.append(ProcSpec("allocator", cli + ["allocator", "run"], env={**base_env, **alloc_env},
            ready=lambda: _http_ok(m["allocator"] + "/metrics")))
    else:
        m.pop("allocator")
    router_url = None
    colocated: list[str] = []
    kind = opts.router if opts.emulated_cluster else "sglang" if opts.with_router else None
    if opts.emulated_cluster:
        try:
            import prorsa_emulated  # noqa: F401
            import prorsa_sim.driver  # noqa: F401
        except ImportError:
            raise UpError("--emulated-cluster needs the prorsa-emulated and prorsa-sim packages, which are not "
                          "installed here") from None
    if kind is not None:
        router_url, spec = router_spec(opts, ports, kind)
        specs.append(spec)
    if opts.emulated_cluster:
        assert router_url is not None
        # The in-place switch takes the profile's time (DeepSeek-V3.2: 15 s), like every other cost.
        emu = ["--speed", str(opts.speed), "--emulated-model", opts.emulated_model]
        if opts.policy == "colocation":
            for i, (port, _b) in enumerate(ports.engines):
                url = f"http://{h}:{port}"
                specs.append(ProcSpec(f"engine-{i}", [PY, "-m", "prorsa_emulated", "engine", "--host", h,
                                                      "--port", str(port), "--disaggregation-mode", "null", *emu],
                                      ready=lambda u=url: _http_ok(u + "/health"), infrastructure=True))
                colocated.append(url)
        else:
            # Default: start short of prefill (1 in 3), so the allocator has something to fix.
            k = max(1, opts.engines // 3) if opts.prefill is None else opts.prefill
            if not 1 <= k < opts.engines:
                raise UpError(f"--prefill must leave at least one engine per role (got {k} of {opts.engines})")
            roles = ["prefill"] * k + ["decode"] * (opts.engines - k)
            # The instance's shape as its profile has it (DeepSeek-V3.2: 16 GPUs, 16
            # attention-DP ranks), so that engine.registered tells the forecaster and the
            # allocator what a real deployment's would: its GPUs and its DP ranks (each rank a
            # prefill server of the forecaster's queue model).
            from prorsa_emulated.profiles import emulated_profile

            prof = emulated_profile(opts.emulated_model)
            shape = {"gpus": prof.gpus_per_engine, "tp": prof.gpus_per_engine, "attn_dp": prof.attn_dp}
            # Interleave so that every agent holds both roles.
            for a in range(opts.agents):
                mine = [i for i in range(opts.engines) if i % opts.agents == a]
                if not mine:
                    continue
                server = f"node{a}"
                insts = [{"engine": f"{server}-e{i}", "model": "emulated/model", "host": h,
                          "port": ports.engines[i][0], "bootstrap_port": ports.engines[i][1],
                          "role": roles[i], "launch": "emulated", "extra_args": emu, **shape,
                          # A flip to decode needs the decode CUDA-graph memory figure, or a
                          # decode peer on the server to read it from (SGLang refuses without
                          # one). Emulated engines capture no graphs; on a GPU server the
                          # operator sets the measured figure (deploy/agent.toml).
                          "decode_cuda_graph_memory_gb": 1.0} for i in mine]
                cfg = wd / f"agent-{server}.toml"
                _agent_config(cfg, server, router_url, wd / "agents" / server, insts)
                url = f"http://{h}:{ports.agent_metrics[a]}"
                m[f"agent-{server}"] = url
                specs.append(ProcSpec(f"agent-{server}", cli + ["engine-agent", "run", "--config", str(cfg),
                                                               "--stop-engines-on-exit"],
                                      env={**base_env, "PRORSA_AGENT_METRICS_PORT": str(ports.agent_metrics[a]),
                                           **_nats_login("PRORSA_AGENT_", "engine-agent", passwords)},
                                      ready=lambda u=url: _http_ok(u + "/health"), ready_timeout_s=120.0))
    driver_out, progress = wd / "driver.json", wd / "progress.json"
    if opts.emulated_cluster:
        assert router_url is not None
        specs.append(ProcSpec("driver", [
            PY, "-m", "prorsa_sim.driver", "--router", router_url, "--nats", nats_url, "--run", opts.run,
            "--workload", opts.workload, "--batch-size", str(opts.batch_size), "--steps", str(opts.steps),
            "--max-turns", str(opts.max_turns), "--speed", str(opts.speed), "--seed", str(opts.seed),
            "--staleness", str(opts.staleness), "--pause-mode", opts.pause_mode,
            "--out", str(driver_out), "--progress", str(progress)],
            # The SDK logs in with PRORSA_NATS_USER / _PASSWORD: as the RL framework would, "rollout".
            env={**base_env, **_nats_login("PRORSA_", "rollout", passwords)}, restart=False))
    for s in specs:
        s.env = {**base_env, **s.env}
    return StackPlan(specs, ports, nats_url, db_url, router_url, token, driver_out, progress, m, colocated, kind, setup)


def _setup_stream(nats_url: str, login: dict[str, str]) -> str:
    """The admin step of `prorsa up`: set the stream up (as the admin user when there are users)."""
    import asyncio

    from prorsa_runtime.bus import Credentials
    from prorsa_runtime.settings import ServiceSettings

    from .natssetup import setup_stream

    creds = Credentials(user=login.get("PRORSA_NATS_USER"), password=login.get("PRORSA_NATS_PASSWORD"))
    ns = ServiceSettings(nats_url=nats_url).namespace()  # PRORSA_SUBJECT_PREFIX / PRORSA_STREAM
    try:
        return asyncio.run(setup_stream(nats_url, ns, creds))
    except Exception as exc:  # refused, unreachable, no JetStream: say it plainly
        raise UpError(f"setting up the stream on {nats_url} failed: {exc}") from None


def register_colocated(router_url: str, urls: list[str]) -> None:
    """Colocation has no engine agents: register the mixed engines with the router directly."""
    for url in urls:
        r = httpx.post(f"{router_url}/workers", json={"url": url, "worker_type": "regular"}, timeout=5.0)
        if r.status_code not in (200, 202, 409):
            raise UpError(f"router refused worker {url}: {r.status_code} {r.text}")
