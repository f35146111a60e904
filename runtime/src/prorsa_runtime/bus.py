"""The bus: NATS connection with reconnect, the JetStream stream, and event publishing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import NotFoundError

from prorsa_schemas import Event, Namespace, encode_event

from .redact import mask_secrets, mask_url

log = logging.getLogger("prorsa.bus")

MSG_ID = "Nats-Msg-Id"
DEFAULT_DUPLICATE_WINDOW_S = 600.0
"""The stream drops a re-sent event id seen within this window (10 min: longer than any
outage a buffering publisher is expected to ride out)."""


class BusUnavailable(ConnectionError):
    """The NATS server could not be reached within the allowed time."""


class BusAuthError(PermissionError):
    """The NATS server refused our credentials or a permission."""


@dataclass(frozen=True)
class Credentials:
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds_file: str | None = None

    def connect_kwargs(self) -> dict:
        kw: dict = {}
        if self.user:
            kw["user"] = self.user
            kw["password"] = self.password or ""
        if self.token:
            kw["token"] = self.token
        if self.creds_file:
            kw["user_credentials"] = self.creds_file
        return kw


async def connect(
    url: str,
    name: str,
    *,
    credentials: Credentials | None = None,
    timeout: float = 30.0,
    reconnect_wait: float = 0.25,
    on_disconnect: Callable[[], Awaitable[None]] | None = None,
    on_reconnect: Callable[[], Awaitable[None]] | None = None,
) -> NATS:
    """Connect, retrying the first connection for up to ``timeout`` seconds.

    After the first connection, nats-py reconnects forever on its own (in-flight publishes
    are buffered by the client and by :class:`~prorsa_sdk.Emitter`).

    Raises:
        BusAuthError: the server refused the credentials (retrying would not help).
        BusUnavailable: no server answered within ``timeout``.
    """
    creds = credentials or Credentials()
    shown = mask_url(url)  # what messages say: never the password a URL may carry
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    auth_errors: list[str] = []

    async def error_cb(exc: Exception) -> None:
        text = str(exc)
        if "Authorization" in text or "authorization" in text or "Permissions" in text:
            auth_errors.append(text)
            log.error("nats: %s", text)
        else:
            log.debug("nats: %s", text)

    holder: list[NATS] = []

    async def disconnected_cb() -> None:
        if holder and holder[0].is_closed:
            return  # our own close(), not an outage
        log.warning("nats: disconnected from %s; reconnecting", shown)
        if on_disconnect:
            await on_disconnect()

    async def reconnected_cb() -> None:
        log.info("nats: reconnected to %s", shown)
        if on_reconnect:
            await on_reconnect()

    while True:
        try:
            nc = await nats.connect(
                url,
                name=name,
                connect_timeout=2,
                # The first attempt must fail fast so that we control the retry loop and
                # its deadline (nats-py would otherwise retry forever inside connect());
                # once connected, reconnecting forever is switched on below.
                allow_reconnect=False,
                max_reconnect_attempts=1,  # nats-py's own server loop: one try, then raise
                reconnect_time_wait=reconnect_wait,  # type: ignore[arg-type]
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                pending_size=64 * 1024 * 1024,
                **creds.connect_kwargs(),
            )
            nc.options["allow_reconnect"] = True
            nc.options["max_reconnect_attempts"] = -1
            holder.append(nc)
            return nc
        except Exception as exc:  # nats-py raises several unrelated types here
            last = exc
            text = f"{exc} {auth_errors[-1] if auth_errors else ''}"
            if "uthorization" in text or "uthentication" in text:
                raise BusAuthError(
                    f"the NATS server at {shown} refused {name}'s credentials: {mask_secrets(text.strip())}"
                ) from exc
            if loop.time() >= deadline:
                raise BusUnavailable(
                    f"could not connect to NATS at {shown} within {timeout:g}s: {mask_secrets(repr(exc))}. "
                    "Is the server running? (`prorsa nats` starts a local one.)"
                ) from exc
            await asyncio.sleep(min(reconnect_wait, max(0.0, deadline - loop.time())))
    raise AssertionError(last)  # pragma: no cover


async def ensure_stream(
    js: JetStreamContext,
    ns: Namespace,
    *,
    duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
    max_age_s: float = 0.0,
    replicas: int = 1,
) -> StreamConfig:
    """Create the stream if it is missing; verify (and repair) it if it exists.

    A stream of the same name with file storage is kept (its data matters); a wrong
    subject set or a shorter duplicate window is updated in place. A stream on memory
    storage cannot be converted, so it is refused loudly instead of silently used.
    """
    wanted = StreamConfig(
        name=ns.stream,
        subjects=ns.stream_subjects(),
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        duplicate_window=duplicate_window_s,
        max_age=max_age_s,
        num_replicas=replicas,
    )
    try:
        info = await js.stream_info(ns.stream)
    except NotFoundError:
        info = None
    if info is None:
        created = await js.add_stream(wanted)
        log.info("created stream %s on %s", ns.stream, wanted.subjects)
        return created.config
    cfg = info.config
    if cfg.storage != StorageType.FILE:
        raise RuntimeError(
            f"stream {ns.stream} exists with {cfg.storage} storage; Prorsa needs file storage "
            "for a durable log. Delete or rename that stream."
        )
    needs_update = set(cfg.subjects or []) != set(wanted.subjects or []) or (
        (cfg.duplicate_window or 0) < duplicate_window_s
    )
    if needs_update:
        cfg.subjects = wanted.subjects
        cfg.duplicate_window = max(cfg.duplicate_window or 0, duplicate_window_s)
        updated = await js.update_stream(cfg)
        log.warning("updated stream %s to subjects=%s", ns.stream, cfg.subjects)
        return updated.config
    return cfg


async def publish_event(
    js: JetStreamContext, ns: Namespace, event: Event, timeout: float = 5.0
) -> int:
    """Publish one event and wait for the stream's ack; returns its stream sequence.

    The event id is the ``Nats-Msg-Id``, so a re-send within the duplicate window is
    acknowledged without being stored twice.
    """
    ack = await js.publish(
        ns.subject_for(event), encode_event(event), timeout=timeout, headers={MSG_ID: event.id}
    )
    return ack.seq
