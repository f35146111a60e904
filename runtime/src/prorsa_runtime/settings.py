"""Settings shared by every service, read from the environment by pydantic-settings.

Each service subclasses :class:`ServiceSettings` with its own ``env_prefix``
(``PRORSA_TRACKER_``, ``PRORSA_ALLOCATOR_``, ...). The bus settings also fall back to the
common ``PRORSA_NATS_URL`` / ``PRORSA_NATS_*`` variables, so one variable points every
process of a host at the bus.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from prorsa_schemas import Namespace

from .bus import Credentials
from .clock import DEFAULT_MAX_CLOCK_AHEAD_S

DEFAULT_NATS_URL = "nats://127.0.0.1:4222"
NATS_SCHEMES = ("nats://", "tls://", "ws://", "wss://")


def check_nats_url(v: str) -> str:
    """A NATS server URL, or several separated by commas (the nodes of a cluster), or
    ValueError naming what was given (one rule for every config)."""
    parts = [p.strip() for p in v.split(",")]
    if not all(p.startswith(NATS_SCHEMES) for p in parts):
        raise ValueError(f"must be a nats:// (or tls://, ws://, wss://) URL, or several separated by commas, got {v!r}")
    return ",".join(parts)


def check_http_url(v: str) -> str:
    """An http(s) base URL without its trailing slash, or ValueError naming what was given."""
    if not v.startswith(("http://", "https://")):
        raise ValueError(f"must be an http:// or https:// URL, got {v!r}")
    return v.rstrip("/")


def _alias(prefix: str, name: str) -> AliasChoices:
    return AliasChoices(f"{prefix}{name}", f"PRORSA_{name}")


class ServiceSettings(BaseSettings):
    """Bus, namespace, logging and metrics settings common to all services."""

    model_config = SettingsConfigDict(
        env_prefix="PRORSA_", extra="ignore", validate_default=True, populate_by_name=True
    )

    nats_url: str = Field(default=DEFAULT_NATS_URL, description="NATS server URL")
    nats_user: str | None = Field(default=None, description="NATS user (accounts mode)")
    nats_password: SecretStr | None = Field(default=None, description="NATS password")
    nats_token: SecretStr | None = Field(default=None, description="NATS auth token")
    nats_creds: str | None = Field(default=None, description="path to a NATS .creds file")
    nats_inbox_prefix: str | None = Field(
        default=None,
        description="reply-inbox prefix (default _INBOX.<user>; set it with a .creds file)",
    )
    subject_prefix: str = Field(default="prorsa", description="subject prefix of all events")
    stream: str = Field(default="PRORSA", description="JetStream stream name")
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_json: bool = Field(default=False, description="one JSON object per log line")
    metrics_port: int | None = Field(
        default=None, ge=0, le=65535, description="Prometheus /metrics port (None: off)"
    )
    max_clock_ahead_s: float = Field(
        default=DEFAULT_MAX_CLOCK_AHEAD_S, ge=0, le=365 * 86400,
        description="an event (or watermark) whose ts is more than this many seconds ahead of this host's clock "
        "is dead-lettered (kind 'future') instead of moving event time (0: no check); prorsa_runtime.clock",
    )

    @field_validator("nats_url")
    @classmethod
    def _url(cls, v: str) -> str:
        return check_nats_url(v)

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, v: object) -> object:
        return v.upper() if isinstance(v, str) else v

    def namespace(self) -> Namespace:
        return Namespace(prefix=self.subject_prefix, stream=self.stream)

    def credentials(self) -> Credentials:
        return Credentials(
            user=self.nats_user,
            password=self.nats_password.get_secret_value() if self.nats_password else None,
            token=self.nats_token.get_secret_value() if self.nats_token else None,
            creds_file=self.nats_creds,
            inbox_prefix=self.nats_inbox_prefix,
        )


def settings_for(prefix: str, base: type[ServiceSettings] = ServiceSettings) -> type[ServiceSettings]:
    """Helper for services: a subclass whose own fields read ``PRORSA_<SERVICE>_...``.

    The common bus fields keep answering to ``PRORSA_NATS_URL`` etc. as well.
    """

    class _S(base):  # type: ignore[valid-type, misc]
        model_config = SettingsConfigDict(
            env_prefix=prefix, extra="ignore", validate_default=True, populate_by_name=True
        )

    for name in ServiceSettings.model_fields:
        f = _S.model_fields[name]
        f.validation_alias = _alias(prefix, name.upper())
    _S.model_rebuild(force=True)
    _S.__name__ = base.__name__
    return _S
