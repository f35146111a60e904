"""Named JetStream consumers: each service reads the stream through consumers whose names
come from :meth:`prorsa_schemas.Namespace.durable`, so that a deployment's permissions can
name exactly the consumers a user may create, read, acknowledge and delete (see
``deploy/nats/accounts.conf``) instead of granting every consumer of the stream.

The services read through :class:`prorsa_runtime.reader.OrderedReader` (an ordered pull
consumer with bounded pending and a continuity check). :func:`subscribe_ordered` is
nats-py's ordered push consumer (no acks, flow control, idle heartbeats, re-created from the
next stream sequence on a gap) under a fixed name, for a caller that wants it: it loses a
message silently when its client-side queue overflows (see the reader's module). nats-py
re-creates an ordered consumer under the same configuration, so with a fixed name the
re-creation would collide with the consumer it replaces (a consumer's start sequence cannot
be updated); :func:`subscribe_ordered` therefore deletes the old consumer first, both when
it subscribes and when nats-py re-creates it.

:class:`DurableFigures` reads the backlog of a durable consumer with acknowledgements;
:func:`ack_sequences` reads the sequences of a delivery from its reply subject.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from prorsa_schemas import Namespace

log = logging.getLogger("prorsa.bus")

STATUS_HEADER = "Status"
LAST_CONSUMER_HEADER = "Nats-Last-Consumer"  # on an idle heartbeat: the last consumer sequence sent
PENDING_MSGS_HEADER = "Nats-Pending-Messages"  # on a 408/409 status: what the pull request had left
GONE_STATUSES = ("Consumer Deleted", "Leadership Change", "Consumer is push based")
"""Descriptions of a 409 status that say the consumer is gone (it is re-created)."""

ORDERED_INACTIVE_S = 30.0
"""How long the server keeps an ordered consumer nobody reads (a crashed service's) before
removing it; a restarted service deletes and re-creates its own at once anyway."""


async def delete_consumer(js: JetStreamContext, ns: Namespace, name: str) -> bool:
    """Delete one consumer of the stream; False when it did not exist."""
    try:
        return await js.delete_consumer(ns.stream, name)
    except NotFoundError:
        return False


async def subscribe_ordered(
    js: JetStreamContext,
    ns: Namespace,
    name: str,
    subjects: list[str],
    cb: Callable[[Msg], Awaitable[None]],
    *,
    start_seq: int | None = None,
    pending_msgs_limit: int = 512 * 1024,
    pending_bytes_limit: int = 256 * 1024 * 1024,
) -> JetStreamContext.PushSubscription:
    """An ordered push consumer named ``name`` over ``subjects``, from the stream's first
    message (or from ``start_seq``).

    One subject is sent as the filter of the create request's subject
    (``$JS.API.CONSUMER.CREATE.<stream>.<name>.<subject>``), which the server checks
    against the consumer's filter, so a permission can pin it; several go in the request
    body (``$JS.API.CONSUMER.CREATE.<stream>.<name>``).
    """
    await delete_consumer(js, ns, name)
    cfg = ConsumerConfig(
        name=name,
        inactive_threshold=ORDERED_INACTIVE_S,
        filter_subjects=list(subjects) if len(subjects) > 1 else None,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE if start_seq else DeliverPolicy.ALL,
        opt_start_seq=start_seq if start_seq else None,
    )
    sub = await js.subscribe(
        subjects[0], stream=ns.stream, cb=cb, ordered_consumer=True, config=cfg,
        pending_msgs_limit=pending_msgs_limit, pending_bytes_limit=pending_bytes_limit,
    )
    # nats-py (2.16, pinned in uv.lock) re-creates an ordered consumer after a gap or missed
    # heartbeats from its private _JSI.recreate_consumer; delete ours first there too.
    jsi = sub._sub._jsi
    recreate = jsi.recreate_consumer

    async def delete_then_recreate() -> None:
        try:
            await delete_consumer(js, ns, name)
        except Exception as exc:  # the server may still be away: the create will say so
            log.debug("deleting consumer %s before re-creating it: %r", name, exc)
        await recreate()

    jsi.recreate_consumer = delete_then_recreate
    return sub


def ack_sequences(reply: str) -> tuple[int, int]:
    """(stream sequence, consumer sequence) from a JetStream delivery's reply subject.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending>`` (v1), or the v2
    form with ``<domain>.<account hash>`` after ``$JS.ACK`` and a trailing token.
    """
    t = reply.split(".")
    if len(t) == 9:
        return int(t[5]), int(t[6])
    return int(t[7]), int(t[8])


class DurableFigures:
    """The backlog of a durable consumer with acknowledgements (the engine agent's commands),
    read from its consumer info by :meth:`read`, in the shape
    :func:`~prorsa_runtime.metrics.consumer_metrics` reads."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.num_pending: int | None = None
        self.num_ack_pending: int | None = None
        self.resets = 0  # re-created by its owner after it was lost

    async def read(self, js: JetStreamContext, stream: str) -> None:
        try:
            info = await js.consumer_info(stream, self.name, timeout=2.0)
        except Exception as exc:  # noqa: BLE001 - being created, or the server is away
            log.debug("consumer info %s: %r", self.name, exc)
            return
        self.num_pending, self.num_ack_pending = info.num_pending, info.num_ack_pending

    def backlog(self) -> int | None:
        """Messages not yet acknowledged: delivered or not."""
        if self.num_pending is None:
            return None
        return self.num_pending + (self.num_ack_pending or 0)
