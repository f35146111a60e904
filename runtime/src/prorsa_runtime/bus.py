"""The bus: NATS connection with reconnect, the JetStream stream, and event publishing."""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import nats
import nats.errors
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig, StreamInfo
from nats.js.errors import NotFoundError

from prorsa_schemas import Event, Namespace, encode_event

from .redact import mask_secrets, mask_url

log = logging.getLogger("prorsa.bus")

MSG_ID = "Nats-Msg-Id"
DROPPED_HOOK = "_prorsa_on_dropped"
"""The attribute of a nats-py subscription that :func:`connect`'s error handler calls with
each ``SlowConsumerError`` (a message dropped by the client)."""
DEFAULT_DUPLICATE_WINDOW_S = 600.0
"""The stream drops a re-sent event id seen within this window (10 min: longer than any
outage a buffering publisher is expected to ride out)."""


class BusUnavailable(ConnectionError):
    """The NATS server could not be reached within the allowed time."""


class BusAuthError(PermissionError):
    """The NATS server refused our credentials or a permission."""


class StreamMissing(RuntimeError):
    """The stream does not exist (or is not usable) and this connection may not set it up."""


_INBOX_TOKEN = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Credentials:
    """How a client logs in to NATS, and the reply-inbox prefix it uses.

    ``inbox_prefix`` defaults to ``_INBOX.<user>`` for a user (``_INBOX`` otherwise), so
    that a deployment can let each user subscribe to its own replies only
    (``_INBOX.<user>.>`` in ``deploy/nats/accounts.conf``) instead of everyone's.
    """

    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds_file: str | None = None
    inbox_prefix: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Credentials":
        """The common ``PRORSA_NATS_USER`` / ``_PASSWORD`` / ``_TOKEN`` / ``_CREDS`` /
        ``_INBOX_PREFIX`` variables (what the SDK and the operator commands read)."""
        env = os.environ if environ is None else environ
        return cls(
            user=env.get("PRORSA_NATS_USER") or None,
            password=env.get("PRORSA_NATS_PASSWORD") or None,
            token=env.get("PRORSA_NATS_TOKEN") or None,
            creds_file=env.get("PRORSA_NATS_CREDS") or None,
            inbox_prefix=env.get("PRORSA_NATS_INBOX_PREFIX") or None,
        )

    def login(self, url: str) -> str | None:
        """The user this connection logs in as: ours, else the one in ``url``."""
        return self.user or urlsplit(url).username or None

    def restricted(self, url: str) -> bool:
        """True when the connection logs in as a user (or with a .creds file), whose
        permissions the server may restrict; False without auth or with a token."""
        return bool(self.login(url) or self.creds_file)

    def inbox(self, url: str) -> str:
        if self.inbox_prefix:
            return self.inbox_prefix
        user = self.login(url)
        return f"_INBOX.{_INBOX_TOKEN.sub('_', user)}" if user else "_INBOX"

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


def server_urls(url: str) -> list[str]:
    """The servers of a NATS URL: one, or several separated by commas (the nodes of a
    cluster: ``nats://a:4222,nats://b:4222,nats://c:4222``), as nats-py takes them."""
    return [u.strip() for u in url.split(",") if u.strip()]


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

    ``url`` may list several servers separated by commas (a cluster's nodes); the client
    also learns the other nodes of a cluster from the server it reaches, and moves to
    another one when its server goes away.

    After the first connection, nats-py reconnects forever on its own (in-flight publishes
    are buffered by the client and by :class:`~prorsa_sdk.Emitter`).

    Raises:
        BusAuthError: the server refused the credentials (retrying would not help).
        BusUnavailable: no server answered within ``timeout``.
    """
    creds = credentials or Credentials()
    shown = mask_url(url)  # what messages say: never the password a URL may carry
    servers = server_urls(url)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: BaseException | None = None
    auth_errors: list[str] = []

    async def error_cb(exc: Exception) -> None:
        if isinstance(exc, nats.errors.SlowConsumerError):
            # nats-py dropped a message its subscription's queue had no room for; a reader
            # that marked the subscription (prorsa_runtime.reader) re-reads from before it.
            on_dropped = getattr(exc.sub, DROPPED_HOOK, None)
            if on_dropped is not None:
                on_dropped(exc)
            else:
                log.warning("nats: %s", exc)
            return
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
                servers,
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
                inbox_prefix=creds.inbox(url),
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


def stream_config(
    ns: Namespace,
    *,
    duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
    max_age_s: float = 0.0,
    replicas: int = 1,
) -> StreamConfig:
    """The stream Prorsa needs: every subject of the namespace, file storage, the
    de-duplication window, and direct gets (a service reads the last message of one
    subject with ``$JS.API.DIRECT.GET.<stream>.<subject>``, which a permission can name)."""
    return StreamConfig(
        name=ns.stream,
        subjects=ns.stream_subjects(),
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        discard=DiscardPolicy.OLD,
        duplicate_window=duplicate_window_s,
        max_age=max_age_s,
        num_replicas=replicas,
        allow_direct=True,
    )


def _refuse_memory_storage(ns: Namespace, cfg: StreamConfig) -> None:
    if cfg.storage != StorageType.FILE:
        raise StreamMissing(
            f"stream {ns.stream} exists with {cfg.storage} storage; Prorsa needs file storage "
            "for a durable log. Delete or rename that stream."
        )


def stream_drift(ns: Namespace, cfg: StreamConfig, duplicate_window_s: float,
                 replicas: int | None = None) -> list[str]:
    """What an existing stream lacks, in words (empty: it is fit for use). With ``replicas``,
    a different replica count is drift too (the admin step sets it; services accept any)."""
    wanted = ns.stream_subjects()
    out = []
    if replicas is not None and (cfg.num_replicas or 1) != replicas:
        out.append(f"{cfg.num_replicas or 1} replica(s) instead of {replicas}")
    if set(cfg.subjects or []) != set(wanted):
        out.append(f"subjects {cfg.subjects} instead of {wanted}")
    if (cfg.duplicate_window or 0) < duplicate_window_s:
        out.append(f"a duplicate window of {cfg.duplicate_window or 0:g}s, under {duplicate_window_s:g}s")
    if not cfg.allow_direct:
        out.append("direct gets off")
    if cfg.subject_transform:
        out.append("a subject transform")
    if cfg.sealed:
        out.append("sealed")
    return out


async def ensure_stream(
    js: JetStreamContext,
    ns: Namespace,
    *,
    duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
    max_age_s: float = 0.0,
    replicas: int | None = None,
) -> StreamConfig:
    """The admin step: create the stream if it is missing; verify and repair it if it exists.

    ``replicas``: the stream's replica count (3 on a three-node cluster: every message is
    stored on three servers before it is acknowledged), set on creation and changed on an
    existing stream; None creates one replica and leaves an existing stream's count alone.

    Needs ``$JS.API.STREAM.CREATE`` / ``UPDATE`` (the admin user in
    ``deploy/nats/accounts.conf``; ``prorsa nats setup`` calls this). A stream of the same
    name with file storage is kept (its data matters); a wrong subject set, a shorter
    duplicate window, direct gets off or a subject transform are updated in place. A
    stream on memory storage cannot be converted, so it is refused loudly instead of
    silently used.
    """
    wanted = stream_config(ns, duplicate_window_s=duplicate_window_s, max_age_s=max_age_s, replicas=replicas or 1)
    try:
        info = await js.stream_info(ns.stream)
    except NotFoundError:
        info = None
    if info is None:
        created = await js.add_stream(wanted)
        log.info("created stream %s on %s", ns.stream, wanted.subjects)
        return created.config
    cfg = info.config
    _refuse_memory_storage(ns, cfg)
    drift = stream_drift(ns, cfg, duplicate_window_s, replicas)
    if drift:
        if cfg.sealed:
            raise StreamMissing(f"stream {ns.stream} is sealed (it accepts no more messages); "
                                "delete it, or restore it from a backup")
        cfg.subjects = wanted.subjects
        if replicas is not None:
            cfg.num_replicas = replicas
        cfg.duplicate_window = max(cfg.duplicate_window or 0, duplicate_window_s)
        cfg.allow_direct = True
        if cfg.subject_transform:
            cfg.subject_transform = None
        updated = await js.update_stream(cfg)
        log.warning("updated stream %s (it had %s)", ns.stream, "; ".join(drift))
        return updated.config
    return cfg


async def wait_for_jetstream(js: JetStreamContext, timeout: float = 30.0) -> None:
    """Wait until JetStream answers API requests: a cluster answers once it has elected its
    meta leader, a few seconds after its servers start or after the leader's server died.

    Raises:
        BusUnavailable: no answer within ``timeout``.
    """
    import nats.js.errors

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            await js._api_request("$JS.API.INFO", b"", timeout=1.0)
            return
        except nats.js.errors.APIError as exc:
            if exc.code != 503 and not isinstance(exc, nats.js.errors.ServiceUnavailableError):
                return  # an answer (even a refusal) means JetStream is up
            last: Exception = exc
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError) as exc:
            last = exc
        if loop.time() >= deadline:
            raise BusUnavailable(f"JetStream did not answer within {timeout:g}s ({last!r}): is it enabled, "
                                 "and (on a cluster) are a majority of the servers up?") from last
        await asyncio.sleep(0.1)


async def verify_stream(
    js: JetStreamContext, ns: Namespace, *, duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S
) -> StreamInfo:
    """Check that the stream exists and is fit for use, with ``$JS.API.STREAM.INFO`` only.

    What a service with a restricted user calls: stream set-up is an admin step.

    Raises:
        StreamMissing: the stream is missing, on memory storage, or set up otherwise than
            :func:`ensure_stream` does it; the message says what to run.
    """
    hint = ("stream set-up is an admin step: run `prorsa nats setup` with the admin user's "
            "credentials (PRORSA_NATS_USER=admin PRORSA_NATS_PASSWORD=...)")
    try:
        info = await js.stream_info(ns.stream)
    except NotFoundError:
        raise StreamMissing(f"the JetStream stream {ns.stream} does not exist on this NATS server; {hint}") from None
    _refuse_memory_storage(ns, info.config)
    drift = stream_drift(ns, info.config, duplicate_window_s)
    if drift:
        raise StreamMissing(f"the JetStream stream {ns.stream} is not set up as Prorsa needs it "
                            f"({'; '.join(drift)}); {hint}")
    return info


async def open_stream(js: JetStreamContext, ns: Namespace, url: str, credentials: Credentials | None) -> None:
    """What every service does at start: set the stream up itself when it connects without
    a user (a development server without auth, where everyone may), else only verify it.

    Raises:
        StreamMissing: see :func:`verify_stream`.
    """
    if (credentials or Credentials()).restricted(url):
        await verify_stream(js, ns)
    else:
        await ensure_stream(js, ns)


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
