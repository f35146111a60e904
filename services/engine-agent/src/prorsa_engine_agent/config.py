"""Configuration: the agent's settings (env ``PRORSA_AGENT_...``) and its SGLang instances
(a TOML file, or YAML when PyYAML is installed).

Example file::

    server = "gpu-node-1"
    router_url = "http://10.0.0.5:30080"

    [[instances]]
    engine = "node1-e0"
    model = "Qwen/Qwen3-8B"
    port = 30001
    role = "prefill"
    gpu_ids = "0"
    bootstrap_port = 8998

Values in the file's top level are agent settings; an environment variable of the same
name (``PRORSA_AGENT_ROUTER_URL`` ...) overrides them.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import tomllib
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prorsa_runtime.settings import ServiceSettings, check_http_url, settings_for

from .inplace import SWITCH_BACKENDS

Launch = Literal["sglang", "emulated", "external"]


class ConfigError(ValueError):
    """The agent's configuration is invalid; the message names the field and the fix."""


class InstanceConfig(BaseModel):
    """One SGLang instance on this server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$")
    model: str = Field(default="emulated/model", min_length=1)
    host: str | None = Field(default=None, description="address SGLang binds (--host); default: "
                             "the advertised address")
    advertise_host: str | None = Field(default=None, description="host of the URL registered with "
                                       "the router; default: the server's, else this host's routable address")
    port: int = Field(ge=1, le=65535)
    role: Literal["prefill", "decode"] = "prefill"
    launch: Launch = "sglang"
    gpus: int | None = Field(default=None, ge=1, description="GPUs it occupies (default tp*pp)")
    gpu_ids: str | None = Field(default=None, description="CUDA_VISIBLE_DEVICES for the process")
    tp: int = Field(default=1, ge=1)
    dp: int = Field(default=1, ge=1)
    attn_dp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    dcp: int = Field(default=1, ge=1, description="decode context parallel size (--dcp-size)")
    dp_attention_local_control_broadcast: bool = Field(
        default=False, description="--enable-dp-attention-local-control-broadcast")
    moe_a2a_backend: str = "none"
    speculative_algorithm: str | None = None
    transfer_backend: str = "mooncake"
    bootstrap_port: int = Field(default=8998, ge=1, le=65535)
    allow_in_place: bool = Field(default=True, description="start with --enable-pd-role-switch when possible")
    decode_cuda_graph_memory_gb: float | None = Field(default=None, ge=0.0)
    weight_version: str = Field(default="default", min_length=1, max_length=256,
                                description="--weight-version at first launch")
    weights_path: str | None = Field(
        default=None, description="where the weights of a version live, with {version} in it "
        "(e.g. /ckpt/step_{version}/hf): lets a restart reload weights updated in memory")
    extra_args: list[str] = Field(default_factory=list)

    @field_validator("weights_path")
    @classmethod
    def _template(cls, v: str | None) -> str | None:
        if v is not None and "{version}" not in v:
            raise ValueError("weights_path needs {version} in it (e.g. /ckpt/step_{version}/hf)")
        return v

    @property
    def bind_host(self) -> str:
        """The address SGLang listens on."""
        return self.host or self.advertise_host or "127.0.0.1"

    @property
    def url(self) -> str:
        """The URL the router and the agent reach the instance at (the advertised one)."""
        h = self.advertise_host or self.host or "127.0.0.1"
        return f"http://[{h}]:{self.port}" if ":" in h else f"http://{h}:{self.port}"

    def _extra_flag(self, flag: str) -> str | None:
        """The value of ``flag`` in ``extra_args`` ("" for a flag without value), or None."""
        for i, a in enumerate(self.extra_args):
            if a == flag:
                nxt = self.extra_args[i + 1] if i + 1 < len(self.extra_args) else ""
                return "" if nxt.startswith("--") else nxt
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return None

    @property
    def gpu_count(self) -> int:
        return self.gpus or self.tp * self.pp

    def in_place_blockers(self) -> list[str]:
        """Why this instance cannot switch in place (empty: it can).

        SGLang 0.5.23 refuses ``--enable-pd-role-switch`` at start with these
        (``arg_groups/pd_disaggregation_hook.py``), and ``/pd_role_switch`` needs the mooncake
        or mori backend (``disaggregation/role_switch.py``). Flags in ``extra_args`` count too.
        """
        out = []
        if not self.allow_in_place:
            out.append("allow_in_place is false")
        backend = self._extra_flag("--disaggregation-transfer-backend") or self.transfer_backend
        if backend not in SWITCH_BACKENDS:
            out.append(f"transfer backend {backend!r} (needs mooncake or mori)")
        if self.ep > 1:
            out.append(f"ep={self.ep}")
        if self.pp > 1:
            out.append(f"pp={self.pp}")
        dcp = self._extra_flag("--dcp-size") or self._extra_flag("--decode-context-parallel-size")
        if self.dcp > 1 or (dcp and dcp.isdigit() and int(dcp) > 1):
            out.append(f"decode context parallelism (dcp={dcp or self.dcp})")
        broadcast = (self.dp_attention_local_control_broadcast
                     or self._extra_flag("--enable-dp-attention-local-control-broadcast") is not None)
        if broadcast and self.attn_dp > 1:
            out.append("DP attention local control broadcast")
        if self.moe_a2a_backend != "none":
            out.append(f"MoE all-to-all ({self.moe_a2a_backend})")
        if self.speculative_algorithm:
            out.append(f"speculative decoding ({self.speculative_algorithm})")
        if self._extra_flag("--disaggregation-decode-allocation-policy") == "prefill_complete":
            out.append("decode allocation policy prefill_complete")
        return out

    @property
    def can_restart(self) -> bool:
        return self.launch != "external"

    def switch_modes(self) -> list[str]:
        modes = [] if self.in_place_blockers() else ["in_place"]
        return modes + (["restart"] if self.can_restart else [])


class _AgentFields(ServiceSettings):
    config: Path | None = Field(default=None, description="instances file (TOML or YAML)")
    server: str = Field(default="localhost", min_length=1, max_length=128)
    router_url: str = Field(default="http://127.0.0.1:30080", description="SGLang router base URL")
    run: str = Field(default="engines", pattern=r"^[A-Za-z0-9_.-]{1,128}$",
                     description="run id carried by engine.registered / engine.stats")
    state_dir: Path = Field(default=Path(".prorsa/engine-agent"), description="journal and logs")
    stats_interval_s: float = Field(default=1.0, gt=0)
    drain_max_s: float = Field(default=600.0, gt=0, description="longest wait for idle before abort")
    abort_grace_s: float = Field(default=10.0, gt=0, description="wait for idle after abort_all")
    switch_timeout_s: float = Field(default=300.0, gt=0, description="in-place switch call")
    restart_timeout_s: float = Field(default=1200.0, gt=0, description="relaunch until healthy")
    health_timeout_s: float = Field(default=60.0, gt=0)
    router_timeout_s: float = Field(default=60.0, gt=0, description="router add/remove to take effect")
    router_reconcile_s: float = Field(default=5.0, ge=0, description="how often the router's worker "
                                      "list is checked and missing engines registered again (0: never)")
    unknown_engine_grace_s: float = Field(default=2.0, ge=0)
    poll_s: float = Field(default=0.05, gt=0, description="poll period while waiting on an engine")
    update_wait_s: float = Field(default=120.0, ge=0, description="how long a switch waits for a weight "
                                 "update in progress on its engine before it is refused")
    advertise_host: str | None = Field(default=None, description="host of the engines' URLs for the "
                                       "router (default: this host's routable address)")
    python: str | None = Field(default=None, description="interpreter for launch (default: this one)")

    @field_validator("router_url")
    @classmethod
    def _http(cls, v: str) -> str:
        return check_http_url(v)


AgentSettings = settings_for("PRORSA_AGENT_", _AgentFields)


class AgentConfig(BaseModel):
    """Settings plus the instances this agent owns."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    settings: _AgentFields
    instances: list[InstanceConfig]

    @model_validator(mode="after")
    def _advertise(self) -> "AgentConfig":
        """Every instance gets the address it is registered under (see :func:`advertised`)."""
        router = urlsplit(self.settings.router_url).hostname or ""
        self.instances = [advertised(i, self.settings.advertise_host, router) for i in self.instances]
        return self

    @model_validator(mode="after")
    def _unique(self) -> "AgentConfig":
        seen: dict[str, set] = {"engine": set(), "port": set(), "bootstrap_port": set()}
        for inst in self.instances:
            for key, val in (("engine", inst.engine), ("port", (inst.host, inst.port)),
                             ("bootstrap_port", (inst.host, inst.bootstrap_port))):
                if val in seen[key]:
                    raise ValueError(f"two instances share {key} {val!r}; each needs its own")
                seen[key].add(val)
        ports = {(i.host, i.port) for i in self.instances}
        for inst in self.instances:
            if (inst.host, inst.bootstrap_port) in ports:
                raise ValueError(f"instance {inst.engine}: bootstrap_port {inst.bootstrap_port} "
                                 "collides with an HTTP port")
        return self

    def instance(self, engine: str) -> InstanceConfig | None:
        return next((i for i in self.instances if i.engine == engine), None)


def is_loopback(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _wildcard(host: str) -> bool:
    return host.strip("[]") in ("0.0.0.0", "::")


def routable_address() -> str | None:
    """This host's address on the interface of its default route, found without sending a
    packet (a UDP socket's connect only picks the route), else the address its hostname
    resolves to; None when both are loopback (no network but the local one)."""
    for probe in (("10.255.255.255", 1), ("192.0.2.1", 1)):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect(probe)
                addr = s.getsockname()[0]
            if addr and not is_loopback(addr) and not _wildcard(addr):
                return addr
        except OSError:
            continue
    try:
        addr = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if is_loopback(addr) else addr


def advertised(inst: InstanceConfig, server_advertise: str | None, router_host: str) -> InstanceConfig:
    """``inst`` with ``advertise_host`` and ``host`` (bind) filled in.

    Advertised: the instance's ``advertise_host``, else the server's, else a ``host`` that is
    a real address (not 0.0.0.0), else loopback when the router is on this host, else this
    host's routable address. Bind: ``host``, else the advertised address.

    Raises:
        ValueError: the router is on another host and the instance would be registered (or
            bound) on loopback, or advertised as a wildcard address: the router could not
            reach it.
    """
    local_router = is_loopback(router_host)
    adv = inst.advertise_host or server_advertise
    if adv is None and inst.host and not _wildcard(inst.host):
        adv = inst.host
    if adv is None:
        adv = "127.0.0.1" if local_router else routable_address()
        if adv is None:
            raise ValueError(
                f"instance {inst.engine}: no routable address found on this host for the router "
                f"at {router_host}; set advertise_host (per instance or server) to the address "
                "the router reaches this server at")
    if _wildcard(adv):
        raise ValueError(f"instance {inst.engine}: advertise_host {adv!r} is a bind address, not one "
                         "a router can reach; set this server's routable address")
    bind = inst.host or adv
    if not local_router and (is_loopback(adv) or is_loopback(bind)):
        what = "registered as" if is_loopback(adv) else "bound to"
        raise ValueError(
            f"instance {inst.engine} would be {what} {adv if is_loopback(adv) else bind} (loopback) "
            f"but the router {router_host} is on another host and cannot reach it; set "
            "advertise_host to this server's routable address (and host to it or 0.0.0.0)")
    return inst.model_copy(update={"advertise_host": adv, "host": bind})


def _read_file(path: Path) -> dict:
    if not path.exists():
        raise ConfigError(f"config file not found: {path}")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            try:
                import yaml  # optional
            except ImportError:
                raise ConfigError(f"{path}: YAML needs PyYAML; install it or use TOML") from None
            data = yaml.safe_load(text)
        elif path.suffix == ".json":
            data = json.loads(text)
        else:
            data = tomllib.loads(text)
    except ConfigError:
        raise
    except Exception as exc:  # tomllib/yaml/json errors all carry a line number
        raise ConfigError(f"{path}: cannot parse: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/mapping")
    return data


def _format(exc: ValidationError, where: str) -> str:
    parts = []
    for err in exc.errors(include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        if not loc:  # a rule over the whole file: its message says everything
            parts.append(str(err["msg"]).removeprefix("Value error, "))
            continue
        parts.append(f"{loc}: {err['msg']} (got {err.get('input')!r})")
    return f"{where}: " + "; ".join(parts)


def load_config(path: Path | str | None = None, **overrides: object) -> AgentConfig:
    """Read settings from the environment and instances (plus defaults) from the file.

    Raises:
        ConfigError: a missing/unparsable file, an unknown key, a bad value, a clash.
    """
    try:
        env = AgentSettings(**overrides)
    except ValidationError as exc:
        raise ConfigError(_format(exc, "agent settings (env PRORSA_AGENT_*)")) from None
    path = Path(path) if path else env.config
    if path is None:
        raise ConfigError("no instances file: pass --config FILE or set PRORSA_AGENT_CONFIG")
    data = dict(_read_file(path))
    raw_instances = data.pop("instances", None)
    if not isinstance(raw_instances, list) or not raw_instances:
        raise ConfigError(f"{path}: needs at least one [[instances]] entry")
    unknown = set(data) - set(_AgentFields.model_fields)
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {sorted(unknown)}")
    explicit = {k: getattr(env, k) for k in env.model_fields_set}
    try:
        settings = AgentSettings(**{**data, **explicit, "config": path})
    except ValidationError as exc:
        raise ConfigError(_format(exc, str(path))) from None
    try:
        instances = [InstanceConfig(**i) if isinstance(i, dict) else InstanceConfig.model_validate(i)
                     for i in raw_instances]
        return AgentConfig(settings=settings, instances=instances)
    except ValidationError as exc:
        raise ConfigError(_format(exc, f"{path} [[instances]]")) from None
