"""docker-compose.yml and the Dockerfiles, checked by parsing (docker cannot run here).

The compose file must describe the deployment the issue asks for (JetStream with file
storage on a volume, PostgreSQL, the four services, an emulated profile, credentials from
the environment or secrets), and every Dockerfile must be well formed, copy only paths that
exist, and install only what its deployable needs.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES = COMPOSE["services"]
INSTRUCTIONS = {"FROM", "RUN", "CMD", "LABEL", "EXPOSE", "ENV", "ADD", "COPY", "ENTRYPOINT", "VOLUME",
                "USER", "WORKDIR", "ARG", "ONBUILD", "STOPSIGNAL", "HEALTHCHECK", "SHELL"}


def parse_dockerfile(path: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) per logical line; raises on an unknown instruction."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, args = buf.partition(" ")
        if word.upper() not in INSTRUCTIONS:
            raise ValueError(f"{path.name}: unknown instruction {word!r}")
        out.append((word.upper(), args.strip()))
        buf = ""
    if buf:
        raise ValueError(f"{path.name}: dangling line continuation")
    return out


def dockerfiles() -> list[Path]:
    return sorted((ROOT / "docker").glob("*.Dockerfile"))


def test_every_built_service_has_a_dockerfile_that_exists():
    for name, svc in SERVICES.items():
        if "build" in svc:
            assert (ROOT / svc["build"]["context"] / svc["build"]["dockerfile"]).is_file(), name


def test_the_four_services_nats_and_postgres_are_there():
    assert {"nats", "postgres", "tracker", "forecaster", "allocator", "engine-agent"} <= set(SERVICES)
    assert {"router", "emulated-agent", "driver"} <= {n for n, s in SERVICES.items() if "emulated" in s.get("profiles", [])}


def test_nats_runs_jetstream_on_file_storage_in_a_volume_with_accounts():
    nats = SERVICES["nats"]
    conf_mount = next(v for v in nats["volumes"] if v.endswith("server.conf:ro"))
    conf = (ROOT / conf_mount.split(":")[0]).read_text()
    assert re.search(r"store_dir:\s*\$PRORSA_NATS_STORE_DIR\b", conf)
    store = nats["environment"]["PRORSA_NATS_STORE_DIR"]
    assert "jetstream" in conf and "include ./accounts.conf" in conf
    volumes = {v.split(":")[1]: v.split(":")[0] for v in nats["volumes"]}
    assert volumes[store] in COMPOSE["volumes"], "the JetStream store must be a named volume"
    assert "/etc/nats/accounts.conf" in volumes


def test_the_nats_monitoring_port_is_not_published():
    # It has no authentication: server.conf binds it to loopback, compose does not publish it.
    conf = (ROOT / "deploy" / "nats" / "server.conf").read_text()
    assert re.search(r'^http:\s*"127\.0\.0\.1:8222"', conf, re.M)
    for name, svc in SERVICES.items():
        for port in svc.get("ports", []):
            assert "8222" not in str(port), f"{name} publishes the monitoring port: {port}"
    assert "127.0.0.1:8222" in " ".join(SERVICES["nats"]["healthcheck"]["test"])


def test_the_stream_is_set_up_by_the_admin_before_any_service_starts():
    setup = SERVICES["nats-setup"]
    assert setup["command"] == ["prorsa", "nats", "setup"] and setup["restart"] == "no"
    assert setup["environment"]["PRORSA_NATS_USER"] == "admin"
    assert setup["environment"]["PRORSA_NATS_PASSWORD"].startswith("${PRORSA_ADMIN_NATS_PASSWORD")
    assert "PRORSA_ADMIN_NATS_PASSWORD" in SERVICES["nats"]["environment"]
    for name in ("tracker", "forecaster", "allocator", "engine-agent", "emulated-agent", "driver"):
        assert SERVICES[name]["depends_on"]["nats-setup"] == {"condition": "service_completed_successfully"}, name


def test_credentials_come_from_environment_or_secrets_never_literals():
    for name, svc in SERVICES.items():
        for key, value in (svc.get("environment") or {}).items():
            if re.search(r"PASSWORD|TOKEN", key) and not key.endswith("_FILE"):
                assert str(value).startswith("${"), f"{name}.{key} must come from the environment"
    assert SERVICES["postgres"]["environment"]["POSTGRES_PASSWORD_FILE"].startswith("/run/secrets/")
    # Every service logs in as its own NATS user.
    users = {n: s["environment"].get("PRORSA_NATS_USER") for n, s in SERVICES.items() if "environment" in s}
    assert users["tracker"] == "tracker" and users["allocator"] == "allocator"
    assert users["forecaster"] == "forecaster" and users["engine-agent"] == "engine-agent"
    assert users["emulated-agent"] == "engine-agent" and users["driver"] == "rollout"
    # No password on a command line (docker inspect and ps show those).
    for name, svc in SERVICES.items():
        assert "PASSWORD" not in " ".join(map(str, svc.get("command", []))), name


def test_service_commands_exist_in_the_cli():
    from typer.main import get_command

    from prorsa_cli.main import app

    cli = get_command(app)
    for name in ("tracker", "forecaster", "allocator"):
        cmd = parse_dockerfile(ROOT / "docker" / f"{name}.Dockerfile")[-1]
        assert cmd[0] == "CMD"
        argv = yaml.safe_load(cmd[1])
        assert argv[0] == "prorsa" and argv[1] in cli.commands and argv[2] in cli.commands[argv[1]].commands


@pytest.mark.parametrize("path", dockerfiles(), ids=lambda p: p.name)
def test_dockerfile_is_well_formed_and_copies_existing_paths(path: Path):
    steps = parse_dockerfile(path)
    first = next(k for k, _ in steps if k != "ARG")  # build arguments of FROM may come first
    assert first == "FROM", "a Dockerfile starts with FROM"
    assert steps[-1][0] in ("CMD", "ENTRYPOINT")
    assert any(k == "USER" for k, _ in steps), "services must not run as root"
    for kind, args in steps:
        if kind == "COPY" and not args.startswith("--from"):
            *sources, _dest = shlex.split(args)
            for src in sources:
                assert (ROOT / src).exists(), f"{path.name}: COPY {src}: no such path"
        if kind == "RUN" and "uv sync" in args:
            assert "--frozen" in args and "--no-dev" in args, "images install from the lock file, no dev deps"


def _deps(package: str) -> set[str]:
    """The workspace packages a package pulls in, transitively (from the pyproject files)."""
    files = {tomllib.loads(p.read_text())["project"]["name"]: p for p in ROOT.glob("**/pyproject.toml")
             if ".venv" not in p.parts and p.parent != ROOT}
    seen, todo = set(), [package]
    while todo:
        name = todo.pop()
        if name in seen or name not in files:
            continue
        seen.add(name)
        for dep in tomllib.loads(files[name].read_text())["project"]["dependencies"]:
            todo.append(re.split(r"[<>=\[ ;]", dep, maxsplit=1)[0])
    return seen


def test_engine_agent_image_carries_no_tracker_dependencies():
    steps = parse_dockerfile(ROOT / "docker" / "engine-agent.Dockerfile")
    sync = next(a for k, a in steps if k == "RUN" and "uv sync" in a)
    package = re.search(r"--package\s+(\S+)", sync).group(1)
    pulled = _deps(package)
    assert package == "prorsa-engine-agent"
    assert "prorsa-tracker" not in pulled and "prorsa-sim" not in pulled and "prorsa" not in pulled
    cmd = yaml.safe_load(steps[-1][1])
    assert cmd[:3] == ["python", "-m", "prorsa_engine_agent"]
    assert (ROOT / "services/engine-agent/src/prorsa_engine_agent/__main__.py").is_file()


def test_emulated_agent_config_is_valid():
    from prorsa_engine_agent.config import load_config

    cfg = load_config(ROOT / "docker" / "agent-emulated.toml")
    assert {i.role for i in cfg.instances} == {"prefill", "decode"}
    assert all(i.launch == "emulated" for i in cfg.instances)


def test_the_emulated_profile_runs_the_real_router():
    """sglang-router 0.3.2 in PD mode, as `prorsa up --emulated-cluster` runs it: its command
    is accepted by the router's own argument parser, its package is in the image, and the
    agent and the driver reach it where it listens."""
    from sglang_router.launch_router import parse_router_args

    from prorsa_engine_agent.config import load_config

    router = SERVICES["router"]
    cmd = router["command"]
    assert cmd[:3] == ["python", "-m", "sglang_router.launch_router"], cmd
    args = parse_router_args(cmd[3:])  # an unknown flag or a bad value exits here
    assert args.pd_disaggregation and args.host == "0.0.0.0"
    assert not args.prefill_urls and not args.decode_urls, "the agent registers the workers"
    assert router["ports"] == [f"{args.port}:{args.port}"]
    assert f"127.0.0.1:{args.port}/health" in " ".join(router["healthcheck"]["test"])
    # The image installs the package whose dependencies pin the router.
    steps = parse_dockerfile(ROOT / router["build"]["dockerfile"])
    sync = next(a for k, a in steps if k == "RUN" and "uv sync" in a)
    package = re.search(r"--package\s+(\S+)", sync).group(1)
    assert "prorsa-emulated" in _deps(package)
    emulated = tomllib.loads((ROOT / "emulated" / "pyproject.toml").read_text())["project"]["dependencies"]
    assert "sglang-router==0.3.2" in emulated
    # The agent registers its engines there once it answers; the driver sends requests there.
    agent = SERVICES["emulated-agent"]
    assert agent["depends_on"]["router"] == {"condition": "service_healthy"}
    cfg = load_config(ROOT / "docker" / "agent-emulated.toml")
    assert cfg.settings.router_url == f"http://router:{args.port}"
    driver = SERVICES["driver"]["command"]
    assert driver[driver.index("--router") + 1] == f"http://router:{args.port}"


CLUSTER = ROOT / "deploy" / "nats" / "cluster"


def test_the_cluster_profile_runs_three_nats_nodes_on_their_own_stores():
    # `nats` is node 1 when .env selects cluster/nats-1.conf; nats-2 and nats-3 come with the profile.
    assert SERVICES["nats"]["command"] == ["-c", "/etc/nats/${PRORSA_NATS_CONFIG:-server.conf}"]
    assert "nats-1" in SERVICES["nats"]["networks"]["default"]["aliases"]
    stores = set()
    for i, name in ((1, "nats"), (2, "nats-2"), (3, "nats-3")):
        svc = SERVICES[name]
        if i > 1:
            assert svc["profiles"] == ["cluster"]
            assert svc["command"] == ["-c", f"/etc/nats/cluster/nats-{i}.conf"]
        mounts = {v.split(":")[1]: v.split(":")[0] for v in svc["volumes"]}
        assert mounts["/etc/nats/cluster"] == "./deploy/nats/cluster" and "/etc/nats/accounts.conf" in mounts
        store = mounts[svc["environment"]["PRORSA_NATS_STORE_DIR"]]
        assert store in COMPOSE["volumes"]
        stores.add(store)
        env = svc["environment"]
        for n in (1, 2, 3):  # each node's route URL logs in with the route password, from .env
            assert env[f"PRORSA_NATS_ROUTE_{n}"] == f"nats-route://route:${{PRORSA_NATS_ROUTE_PASSWORD:-}}@nats-{n}:6222"
        assert "127.0.0.1:8222" in " ".join(svc["healthcheck"]["test"])
    assert len(stores) == 3, "each node needs its own JetStream store"
    # The set-up step reaches whichever nodes run and sets the replicas from .env.
    setup = SERVICES["nats-setup"]
    assert setup["environment"]["PRORSA_STREAM_REPLICAS"] == "${PRORSA_STREAM_REPLICAS:-1}"
    assert setup["environment"]["PRORSA_NATS_URL"] == COMPOSE["x-prorsa-env"]["PRORSA_NATS_URL"]
    assert setup["depends_on"]["nats-2"] == {"condition": "service_healthy", "required": False}
    # The settings that switch it on are in the example .env.
    example = (ROOT / "deploy" / "compose.env.example").read_text()
    for line in ("COMPOSE_PROFILES=cluster", "PRORSA_NATS_CONFIG=cluster/nats-1.conf", "PRORSA_STREAM_REPLICAS=3",
                 "PRORSA_NATS_URL=nats://nats:4222,nats://nats-2:4222,nats://nats-3:4222"):
        assert f"# {line}" in example, line


@pytest.mark.parametrize("node", [1, 2, 3])
def test_each_cluster_config_is_accepted_by_nats_server(node: int):
    # nats-server -t parses the file (its include and every variable) without starting.
    from prorsa_runtime.natsserver import find_nats_server

    conf = (CLUSTER / f"nats-{node}.conf").read_text()
    assert re.search(rf"^server_name:\s*nats-{node}\s*$", conf, re.M)
    others = sorted(int(n) for n in re.findall(r"\$PRORSA_NATS_ROUTE_(\d)", conf.split("routes:", 1)[1]))
    assert others == [n for n in (1, 2, 3) if n != node]
    assert re.search(r'^http:\s*"127\.0\.0\.1:8222"', conf, re.M) and "include ../accounts.conf" in conf
    env = {"PATH": "/usr/bin:/bin", "PRORSA_NATS_STORE_DIR": "/tmp/unused", "PRORSA_NATS_ROUTE_PASSWORD": "proute",
           **{f"PRORSA_NATS_ROUTE_{n}": f"nats-route://route:proute@nats-{n}:6222" for n in (1, 2, 3)},
           **{f"PRORSA_{u}_NATS_PASSWORD": f"p{u.lower()}" for u in
              ("ADMIN", "ROLLOUT", "TRACKER", "FORECASTER", "ALLOCATOR", "AGENT")}}
    r = subprocess.run([str(find_nats_server()), "-t", "-c", str(CLUSTER / f"nats-{node}.conf")],
                       capture_output=True, text=True, env=env, timeout=30)
    assert r.returncode == 0 and "is valid" in r.stdout + r.stderr, r.stdout + r.stderr


def test_the_gpu_profile_could_run_sglang_engines():
    """The agent in the SGLang image its flags are checked against, on the host's network with
    the GPUs, shared memory and the config the agent's loader accepts; the router beside it."""
    from prorsa_engine_agent.sglang_flags import SGLANG_VERSION

    agent, router = SERVICES["engine-agent"], SERVICES["router-gpu"]
    assert agent["profiles"] == ["gpu"] and router["profiles"] == ["gpu"]
    image = f"lmsysorg/sglang:v{SGLANG_VERSION}"
    assert agent["build"]["args"]["BASE"] == image and router["image"] == image
    assert agent["network_mode"] == "host" and router["network_mode"] == "host"
    assert agent["ipc"] == "host" and agent["shm_size"]
    gpus = agent["deploy"]["resources"]["reservations"]["devices"]
    assert gpus[0]["driver"] == "nvidia" and gpus[0]["capabilities"] == ["gpu"]
    assert "./deploy/agent.toml:/etc/prorsa/agent.toml:ro" in agent["volumes"]
    assert agent["command"][-2:] == ["--config", "/etc/prorsa/agent.toml"]
    assert "--pd-disaggregation" in router["command"] and "30080" in router["command"]
    dockerfile = (ROOT / agent["build"]["dockerfile"]).read_text()
    assert "ARG BASE=" in dockerfile and "FROM ${BASE}" in dockerfile
