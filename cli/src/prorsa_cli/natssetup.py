"""`prorsa nats setup`: the admin step that creates (or repairs) the JetStream stream.

Services that log in as a restricted user only check the stream (``$JS.API.STREAM.INFO``);
this step, run with a user that may create and update streams (``admin`` in
``deploy/nats/accounts.conf``), sets it up. ``prorsa up`` runs it itself after starting
its nats-server.
"""

from __future__ import annotations

from prorsa_runtime.bus import (
    DEFAULT_DUPLICATE_WINDOW_S,
    BusUnavailable,
    Credentials,
    connect,
    ensure_stream,
    stream_drift,
    wait_for_jetstream,
)
from prorsa_runtime.redact import mask_url
from prorsa_schemas import Namespace


class StreamSetupError(RuntimeError):
    """The stream could not be set up; the message says why and what to check."""


async def setup_stream(
    url: str,
    ns: Namespace,
    credentials: Credentials,
    *,
    duplicate_window_s: float = DEFAULT_DUPLICATE_WINDOW_S,
    max_age_s: float = 0.0,
    replicas: int | None = None,
    timeout: float = 30.0,
) -> str:
    """Create or repair the stream; returns one line saying what was done. ``replicas`` is
    set on creation and on an existing stream; None creates one replica and keeps an
    existing stream's count.

    On a cluster it first waits (up to ``timeout``) for JetStream to answer: the servers
    elect a leader a few seconds after they start.
    """
    import nats.errors
    from nats.js.errors import APIError, NotFoundError

    user = credentials.login(url) or "(no user)"
    shown = mask_url(url)
    nc = await connect(url, "prorsa-nats-setup", credentials=credentials, timeout=timeout)
    try:
        js = nc.jetstream(timeout=10.0)
        try:
            await wait_for_jetstream(js, timeout)
            try:
                before = (await js.stream_info(ns.stream)).config
            except NotFoundError:
                before = None
            cfg = await ensure_stream(js, ns, duplicate_window_s=duplicate_window_s, max_age_s=max_age_s,
                                      replicas=replicas)
        except (nats.errors.TimeoutError, BusUnavailable):
            raise StreamSetupError(
                f"no answer from JetStream at {shown} to the stream set-up as {user}: is JetStream enabled, may "
                "this user create and update streams (the admin user of deploy/nats/accounts.conf), and (on a "
                "cluster) are a majority of its servers up?"
            ) from None
        except APIError as exc:
            if (replicas or 1) > 1 and "replica" in str(exc.description or "").lower():
                raise StreamSetupError(
                    f"JetStream at {shown} refused {replicas} replicas: {exc.description}. Replicas above 1 need a "
                    f"cluster of at least {replicas} JetStream servers (docs/deployment.md, \"A JetStream cluster\")"
                ) from None
            raise StreamSetupError(f"JetStream at {shown} refused the stream set-up: {exc.description}") from None
    finally:
        await nc.close()
    storage = getattr(cfg.storage, "value", cfg.storage)
    what = (f"subjects {', '.join(cfg.subjects or [])}, {storage} storage, "
            f"duplicate window {cfg.duplicate_window or 0:g}s, direct get {'on' if cfg.allow_direct else 'off'}, "
            f"{cfg.num_replicas or 1} replica(s)")
    if before is None:
        return f"created stream {ns.stream} on {shown}: {what}"
    drift = stream_drift(ns, before, duplicate_window_s, replicas)
    if drift:
        return f"updated stream {ns.stream} on {shown} (it had {'; '.join(drift)}): {what}"
    return f"stream {ns.stream} on {shown} is set up: {what}"
