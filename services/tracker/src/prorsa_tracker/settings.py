"""The tracker's settings (environment prefix ``PRORSA_TRACKER_``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from prorsa_runtime.settings import ServiceSettings, settings_for

from .db import DEFAULT_DB_URL
from .state import SEEN_IDS_CAPACITY


class _TrackerFields(ServiceSettings):
    db_url: str = Field(default=DEFAULT_DB_URL, description="SQLAlchemy URL: sqlite:///file.db or postgresql://...")
    batch_max: int = Field(default=5000, ge=1, le=100_000, description="most messages written per transaction")
    linger_s: float = Field(
        default=0.05, ge=0, le=10,
        description="how long a batch smaller than batch_max waits for more messages before it is written "
        "(0: at once); one transaction for many messages instead of a few",
    )
    clock: Literal["wall", "event"] = Field(
        default="wall",
        description="'wall': production, a heartbeat advances the watermark to wall time when the bus is quiet; "
        "'event': replay/simulation, the watermark is only ever the largest event ts",
    )
    heartbeat_s: float = Field(default=1.0, gt=0, le=3600, description="watermark heartbeat period when idle")
    publish_transitions: bool = Field(default=True, description="publish canonical transitions for the forecaster")
    http_host: str = Field(default="127.0.0.1", description="query API bind address")
    http_port: int | None = Field(default=None, ge=0, le=65535, description="query API port (None: no API)")
    api_token: SecretStr | None = Field(default=None, description="bearer token the query API requires")
    max_inflight: int = Field(
        default=100_000, ge=1000, le=10_000_000,
        description="most messages requested from the server or received and not yet committed; the receiver "
        "asks for more only below it (bounded memory while the database is down or behind)",
    )
    snapshot_every: int = Field(
        default=200_000, ge=0,
        description="commit a state snapshot every this many stream messages, so a restart replays only the "
        "events after it (0: never; restart replays every event)",
    )
    gc_gen0: int = Field(
        default=50_000, ge=0, le=10_000_000,
        description="Python's first garbage-collection threshold while the tracker runs (0: leave the default, "
        "700); the fold allocates a few short-lived containers per event and collecting every 700 of them cost "
        "~2.5 us/event",
    )
    db_retry_s: float = Field(default=0.5, gt=0, le=60, description="first back-off when the database is down")
    dedup_cache: int = Field(
        default=SEEN_IDS_CAPACITY, ge=1000, le=10_000_000,
        description="recent event ids kept in memory as the fast path of de-duplication (at least three batches); "
        "an id outside it is looked up in the events table, whose unique event id decides",
    )


TrackerSettings = settings_for("PRORSA_TRACKER_", _TrackerFields)
