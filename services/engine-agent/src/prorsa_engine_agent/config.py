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

import json
import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from prorsa_runtime.settings import ServiceSettings, check_http_url, settings_for

Launch = Literal["sglang", "emulated", "external"]
SWITCH_BACKENDS = ("mooncake", "mori")


class ConfigError(ValueError):
    """The agent's configuration is invalid; the message names the field and the fix."""


class InstanceConfig(BaseModel):
    """One SGLang instance on this server."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str = Field(min_length=1, max_length=128, pattern=r"^[^\x00-\x1f\x7f-\x9f]+$")
    model: str = Field(default="emulated/model", min_length=1)
    host: str = "127.0.0.1"
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
    moe_a2a_backend: str = "none"
    speculative_algorithm: str | None = None
    transfer_backend: str = "mooncake"
    bootstrap_port: int = Field(default=8998, ge=1, le=65535)
    allow_in_place: bool = Field(default=True, description="start with --enable-pd-role-switch when possible")
    decode_cuda_graph_memory_gb: float | None = Field(default=None, ge=0.0)
    extra_args: list[str] = Field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def gpu_count(self) -> int:
        return self.gpus or self.tp * self.pp

    def in_place_blockers(self) -> list[str]:
        """Why this instance cannot switch in place (empty: it can). SGLang 0.5.23 rules."""
        out = []
        if not self.allow_in_place:
            out.append("allow_in_place is false")
        if self.transfer_backend not in SWITCH_BACKENDS:
            out.append(f"transfer backend {self.transfer_backend!r} (needs mooncake or mori)")
        if self.ep > 1:
            out.append(f"ep={self.ep}")
        if self.pp > 1:
            out.append(f"pp={self.pp}")
        if self.moe_a2a_backend != "none":
            out.append(f"MoE all-to-all ({self.moe_a2a_backend})")
        if self.speculative_algorithm:
            out.append(f"speculative decoding ({self.speculative_algorithm})")
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
    unknown_engine_grace_s: float = Field(default=2.0, ge=0)
    poll_s: float = Field(default=0.05, gt=0, description="poll period while waiting on an engine")
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
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
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
