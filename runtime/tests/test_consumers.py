"""Named ordered consumers (prorsa_runtime.consumers) against a real nats-server: a fixed name
replaces what a previous subscription left, and nats-py's own re-creation after a gap (which
would collide with the consumer it replaces under the same name) goes on in order."""

from __future__ import annotations

from nats.js.api import AckPolicy, ConsumerConfig
from nats.js.errors import NotFoundError

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.consumers import delete_consumer, subscribe_ordered
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import Namespace


async def _publish(js, ns: Namespace, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        await js.publish(f"{ns.prefix}.rollout.x", str(i).encode(), stream=ns.stream)


async def test_a_named_ordered_consumer_replaces_the_one_left_before_and_starts_where_asked(nats_url: str,
                                                                                         ns: Namespace):
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    await _publish(js, ns, 10)
    name = ns.durable("svc")
    # What a crashed process leaves: a consumer of that name with another configuration.
    await js.add_consumer(ns.stream, ConsumerConfig(name=name, ack_policy=AckPolicy.EXPLICIT,
                                                    filter_subject=f"{ns.prefix}.engine.>"))
    got: list[int] = []

    async def on_msg(msg) -> None:
        got.append(msg.metadata.sequence.stream)

    sub = await subscribe_ordered(js, ns, name, [ns.rollout_all(), ns.engine_all()], on_msg, start_seq=4)
    await async_wait_until(lambda: len(got) == 7, timeout=10, what="messages 4..10")
    assert got == list(range(4, 11))
    info = await js.consumer_info(ns.stream, name)
    assert info.config.filter_subjects == [ns.rollout_all(), ns.engine_all()]
    await sub.unsubscribe()
    assert await delete_consumer(js, ns, name) is True
    assert await delete_consumer(js, ns, name) is False
    await nc.close()


async def test_nats_py_recreating_it_under_the_same_name_goes_on_from_the_gap(nats_url: str, ns: Namespace):
    # nats-py re-creates an ordered consumer from the message after the last one it handed
    # over when it sees a gap or misses heartbeats (a slow client, a server restart), with
    # the same configuration: under a fixed name the old consumer is still there, and a
    # consumer's start cannot be updated. Here the re-creation is started as nats-py
    # starts it (reset_ordered_consumer, nats-py 2.16); it must go on from the gap.
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    name = ns.durable("gap")
    got: list[int] = []

    async def on_msg(msg) -> None:
        got.append(msg.metadata.sequence.stream)

    sub = await subscribe_ordered(js, ns, name, [ns.rollout_all()], on_msg)
    await _publish(js, ns, 10)
    await async_wait_until(lambda: len(got) == 10, timeout=10, what="the first 10 messages")
    first = await js.consumer_info(ns.stream, name)
    await sub._sub._jsi.reset_ordered_consumer(6)  # as if 6..10 had been dropped by the client

    async def recreated() -> bool:
        try:
            info = await js.consumer_info(ns.stream, name)
        except NotFoundError:  # between the delete and the create
            return False
        return info.config.deliver_subject != first.config.deliver_subject

    await async_wait_until(recreated, timeout=10, what="the consumer re-created under its name")
    await _publish(js, ns, 5, start=10)
    await async_wait_until(lambda: len(got) == 20, timeout=10, what="6..15 after the gap")
    assert got == list(range(1, 11)) + list(range(6, 16))
    await sub.unsubscribe()
    await nc.close()
