"""The allocator service's settings: the bus settings every service has, plus every
:class:`~prorsa_allocator.config.AllocatorConfig` knob, all read from ``PRORSA_ALLOCATOR_*``
(e.g. ``PRORSA_ALLOCATOR_MIN_DWELL_S=60``). The bus also answers to ``PRORSA_NATS_URL``."""

from __future__ import annotations

from pydantic import Field, create_model

from prorsa_runtime.settings import ServiceSettings, settings_for

from .config import AllocatorConfig

ENV_PREFIX = "PRORSA_ALLOCATOR_"

_Base = settings_for(ENV_PREFIX)


class _AllocatorSettingsBase(_Base):  # type: ignore[misc, valid-type]
    instance: str = Field(default="", description="Suffix of this allocator's consumer names (one allocator per namespace).")
    max_pending: int = Field(
        default=10_000, ge=100, le=10_000_000,
        description="Most stream messages requested from the server or queued and not yet handled (bounded memory).",
    )

    def allocator_config(self) -> AllocatorConfig:
        """The core's configuration, from the fields it shares with these settings."""
        return AllocatorConfig(**{name: getattr(self, name) for name in AllocatorConfig.model_fields})


# One source of truth: every AllocatorConfig field becomes a setting with the same
# default, bounds and description.
AllocatorSettings = create_model(  # type: ignore[call-overload]
    "AllocatorSettings",
    __base__=_AllocatorSettingsBase,
    __doc__="Allocator service settings (env prefix PRORSA_ALLOCATOR_).",
    **{name: (f.annotation, f) for name, f in AllocatorConfig.model_fields.items()},
)

assert not set(AllocatorConfig.model_fields) & set(ServiceSettings.model_fields)
