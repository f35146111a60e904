"""Prorsa's shared runtime: bus, stream, publishing, settings, logging, lifecycle, metrics,
and the embedded nats-server. Small on purpose: every service imports it."""

from .bus import (
    DEFAULT_DUPLICATE_WINDOW_S,
    MSG_ID,
    BusAuthError,
    BusUnavailable,
    Credentials,
    StreamMissing,
    connect,
    ensure_stream,
    open_stream,
    publish_event,
    stream_config,
    verify_stream,
)
from .natsserver import NatsServer, NatsServerError, NatsServerNotFound, find_nats_server, free_port
from .publisher import BufferFull, PublisherClosed, ReliablePublisher

__all__ = [
    "DEFAULT_DUPLICATE_WINDOW_S",
    "MSG_ID",
    "BufferFull",
    "BusAuthError",
    "BusUnavailable",
    "Credentials",
    "NatsServer",
    "NatsServerError",
    "NatsServerNotFound",
    "PublisherClosed",
    "ReliablePublisher",
    "StreamMissing",
    "connect",
    "ensure_stream",
    "find_nats_server",
    "free_port",
    "open_stream",
    "publish_event",
    "stream_config",
    "verify_stream",
]
