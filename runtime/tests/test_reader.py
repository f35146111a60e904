"""OrderedReader (prorsa_runtime.reader) against a real nats-server: every message exactly once
and in order even when the client-side queue overflows, at most max_pending messages
outstanding, the backlog read from the server, and recovery from a deleted consumer and a
server restart (kill -9)."""

from __future__ import annotations

import asyncio

from prorsa_runtime import connect, ensure_stream
from prorsa_runtime.consumers import subscribe_ordered
from prorsa_runtime.reader import OrderedReader
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import Namespace


async def _publish(js, ns: Namespace, n: int, start: int = 0) -> list[int]:
    """Publish n messages, alternating over a rollout, an engine and a tracker subject (the
    last outside the readers' filter); returns the stream sequences of the filtered ones."""
    seqs = []
    for i in range(start, start + n):
        subject = (f"{ns.prefix}.rollout.x", f"{ns.prefix}.engine.y", f"{ns.prefix}.tracker.z")[i % 3]
        ack = await js.publish(subject, str(i).encode() * 20, stream=ns.stream)
        if i % 3 != 2:
            seqs.append(ack.seq)
    return seqs


async def test_every_message_once_and_in_order_when_the_client_queue_overflows(nats_url: str, ns: Namespace):
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    want = await _publish(js, ns, 1500)
    got: list[int] = []
    reader: OrderedReader

    def on_msg(msg, seq: int) -> None:
        got.append(seq)
        reader.release()

    # A client-side queue of 5 messages against pull requests of 50: nats-py drops most of
    # each batch before the callback sees it.
    reader = OrderedReader(js, ns, ns.durable("tiny"), [ns.rollout_all(), ns.engine_all()], on_msg,
                           max_pending=200, batch=50, pending_msgs_limit=5, heartbeat_s=0.5, expires_s=5)
    await reader.start()
    more = await _publish(js, ns, 300, start=1500)  # and some while it reads
    await async_wait_until(lambda: len(got) >= len(want) + len(more), timeout=60, what="every message")
    assert got == want + more
    assert reader.gaps > 0  # the drops were seen, not skipped
    info = await reader.read_info()
    assert info is not None and info.num_pending == 0 and reader.backlog() == 0
    await reader.stop()
    await nc.close()


async def test_nats_py_ordered_push_consumer_skips_what_its_client_queue_drops(nats_url: str, ns: Namespace):
    # Why the services do not use nats-py's ordered push consumer: with the same tiny queue
    # it loses messages, and neither it nor the server knows (the consumer has moved past
    # them). If this starts failing, nats-py has fixed the hole.
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    want = await _publish(js, ns, 3000)
    got: list[int] = []

    async def on_msg(msg) -> None:
        got.append(msg.metadata.sequence.stream)
        await asyncio.sleep(0)

    name = ns.durable("push")
    sub = await subscribe_ordered(js, ns, name, [ns.rollout_all(), ns.engine_all()], on_msg, pending_msgs_limit=5)

    async def consumer_done() -> bool:
        info = await js.consumer_info(ns.stream, name)
        return info.num_pending == 0 and info.delivered.stream_seq >= want[-1]

    await async_wait_until(consumer_done, timeout=30, what="the server to have delivered everything")
    await nc.flush()
    assert len(got) < len(want)  # lost on the client
    assert got == sorted(got) and set(got) < set(want)
    await sub.unsubscribe()
    await nc.close()


async def test_at_most_max_pending_outstanding_and_the_backlog_comes_from_the_server(nats_url: str, ns: Namespace):
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    want = await _publish(js, ns, 1500)  # 1000 filtered
    got: list[int] = []
    reader = OrderedReader(js, ns, ns.durable("slow"), [ns.rollout_all(), ns.engine_all()],
                           lambda msg, seq: got.append(seq), max_pending=100, batch=40, info_every_s=0)
    await reader.start()
    await async_wait_until(lambda: len(got) == 100, timeout=10, what="the first 100")
    info = await reader.read_info()  # nothing released: no more is asked for
    assert len(got) == 100 and reader.unreleased == 100
    assert info is not None and info.num_pending == 900 and reader.backlog() == 1000
    reader.release(60)
    await async_wait_until(lambda: len(got) == 160, timeout=10, what="60 more after releasing 60")
    while len(got) < len(want):
        reader.release(reader.unreleased)
        await async_wait_until(lambda: reader.unreleased > 0 or len(got) == len(want), timeout=10)
    assert got == want
    await reader.stop()
    await nc.close()


async def test_a_deleted_consumer_is_re_created_where_it_was(nats_url: str, ns: Namespace):
    nc = await connect(nats_url, "t")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    want = await _publish(js, ns, 300)
    got: list[int] = []

    def on_msg(msg, seq: int) -> None:
        got.append(seq)
        reader.release()

    reader = OrderedReader(js, ns, ns.durable("del"), [ns.rollout_all(), ns.engine_all()], on_msg,
                           heartbeat_s=0.5, expires_s=5)
    await reader.start()
    await async_wait_until(lambda: len(got) == len(want), timeout=10, what="the first messages")
    await js.delete_consumer(ns.stream, ns.durable("del"))  # as the server does after inactivity
    await async_wait_until(lambda: reader.resets >= 1, timeout=10, what="the reader noticing")
    want += await _publish(js, ns, 300, start=300)
    await async_wait_until(lambda: len(got) == len(want), timeout=20, what="the messages after the deletion")
    assert got == want
    await reader.stop()
    await nc.close()


async def test_a_server_killed_and_restarted_loses_and_repeats_nothing(nats_factory, ns: Namespace):
    server = nats_factory()
    nc = await connect(server.url, "t", reconnect_wait=0.1)
    js = nc.jetstream()
    await ensure_stream(js, ns)
    want = await _publish(js, ns, 600)
    got: list[int] = []

    def on_msg(msg, seq: int) -> None:
        got.append(seq)
        reader.release()

    reader = OrderedReader(js, ns, ns.durable("restart"), [ns.rollout_all(), ns.engine_all()], on_msg,
                           heartbeat_s=0.5, expires_s=5, max_pending=100)
    await reader.start()
    await async_wait_until(lambda: len(got) >= 100, timeout=10, what="the first messages")
    await asyncio.to_thread(server.restart)  # kill -9, then start on the same port and store
    await async_wait_until(lambda: nc.is_connected, timeout=30, what="the reconnect")
    want += await _publish(js, ns, 300, start=600)
    await async_wait_until(lambda: len(got) >= len(want), timeout=30, what="every message after the restart")
    assert got == want
    assert reader.resets >= 1
    await reader.stop()
    await nc.close()
