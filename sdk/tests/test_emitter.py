"""The SDK against a real nats-server: exactly-once under a server crash, ordering, sync use."""

from __future__ import annotations

import asyncio
import threading

import nats
import pytest

from prorsa_runtime.testing import async_wait_until, stream_messages
from prorsa_schemas import EventError, Namespace
from prorsa_sdk import BufferFull, Emitter, SyncEmitter


async def _count(url: str, ns: Namespace) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(ns.stream)).state.messages
    except Exception:
        return 0
    finally:
        await nc.close()


@pytest.mark.slow
async def test_100k_events_with_server_killed_midway_exactly_once(nats_factory, ns: Namespace) -> None:
    server = nats_factory()
    n, trajs = 100_000, 2_000
    em = Emitter("crash-run", server.url, namespace=ns, ack_timeout=1.0)
    await em.start()

    async def produce() -> None:
        for i in range(n):
            traj = f"t{i % trajs}"
            await em.request_queued(traj, f"{traj}-r{i // trajs}", i // trajs, 100 + i % 7, ts=float(i))
            if i % 500 == 0:
                await asyncio.sleep(0)  # let the sender run, as a real agent loop would

    producer = asyncio.create_task(produce())
    # Crash the server once a third of the events are stored, while the rest are in flight.
    await async_wait_until(lambda: _count(server.url, ns), timeout=60, what="first events stored")
    await async_wait_until(
        lambda: _count_ge(server.url, ns, n // 3), timeout=120, what="a third of the events stored"
    )
    await asyncio.to_thread(server.restart)
    await producer
    await em.flush(timeout=180)
    await em.close()

    msgs = await stream_messages(server.url, ns)
    ids = [m[0] for m in msgs]
    assert len(msgs) == n
    assert len(set(ids)) == n
    assert all(i == ev.id for i, ev in msgs)
    # Per-trajectory order survives the crash: turns of each trajectory are increasing.
    last: dict[str, int] = {}
    for _, ev in msgs:
        assert ev.turn > last.get(ev.traj, -1), f"{ev.traj} out of order"
        last[ev.traj] = ev.turn


async def _count_ge(url: str, ns: Namespace, k: int) -> bool:
    return await _count(url, ns) >= k


async def test_events_wait_while_bus_is_down_then_arrive(nats_factory, ns: Namespace) -> None:
    server = nats_factory()
    url = server.url
    server.kill()  # the bus is down before the emitter starts
    async with Emitter("late-bus", url, namespace=ns) as em:
        for i in range(50):
            await em.dispatched(f"t{i}", prompt_tokens=10)
        assert em.pending == 50
        await asyncio.to_thread(server.start)
        await em.flush(timeout=60)
    assert await _count(url, ns) == 50


async def test_invalid_arguments_raise_at_once(nats_url: str, ns: Namespace) -> None:
    async with Emitter("ok-run", nats_url, namespace=ns) as em:
        with pytest.raises(EventError, match="prompt_tokens"):
            await em.dispatched("t1", prompt_tokens=-1)
        with pytest.raises(EventError, match="finish"):
            await em.decode_finished("t1", "r1", 5, "eos")  # type: ignore[arg-type]
        assert em.pending == 0
    with pytest.raises(EventError, match="run"):
        Emitter("bad run id", nats_url, namespace=ns)


async def test_every_rollout_method_publishes_its_type(nats_url: str, ns: Namespace) -> None:
    async with Emitter("all-types", nats_url, namespace=ns, clock=lambda: 5.0) as em:
        await em.run_started("async", 8, max_staleness=2, group_size=4, injection="group")
        await em.dispatched("t", 10, group="g", policy_version=0)
        await em.sandbox_started("t", "cold")
        await em.sandbox_ready("t")
        await em.request_queued("t", "r", 0, 10, engine="p0")
        await em.prefill_started("t", "r", engine="p0")
        await em.prefill_finished("t", "r", engine="p0", cached_tokens=0, decode_engine="d0")
        await em.decode_finished("t", "r", 5, "tool")
        await em.tool_started("t", tool="bash", calls=1)
        await em.tool_finished("t", 7, ok=True)
        await em.reward_started("t")
        await em.reward_finished("t", True, reward=1.0)
        await em.dropped("u", "stale")
        await em.policy_updated(1)
    msgs = await stream_messages(nats_url, ns)
    types = {ev.type for _, ev in msgs}
    assert len(types) == 14
    assert all(ev.ts == 5.0 and ev.run == "all-types" for _, ev in msgs)


def test_buffer_full_is_reported(nats_factory, ns: Namespace) -> None:
    server = nats_factory()
    server.kill()
    em = SyncEmitter("full", server.url, namespace=ns, max_buffer=10)
    try:
        for i in range(10):
            em.dispatched(f"t{i}", 1)
        # submissions cross a thread: wait until the loop has buffered all ten
        from prorsa_runtime.testing import wait_until

        wait_until(lambda: em.pending == 10, timeout=10)
        with pytest.raises(BufferFull, match="max_buffer=10"):
            em.dispatched("t-over", 1)
    finally:
        server.start()
        em.close(timeout=30)


def test_sync_emitter_from_many_threads(nats_url: str, ns: Namespace) -> None:
    with SyncEmitter("threads", nats_url, namespace=ns) as em:
        def work(k: int) -> None:
            for i in range(500):
                em.request_queued(f"t{k}", f"r{i}", i, 10)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        em.flush(timeout=60)
    msgs = asyncio.run(stream_messages(nats_url, ns))
    assert len(msgs) == 4000
    assert len({ev.id for _, ev in msgs}) == 4000
    for k in range(8):
        turns = [ev.turn for _, ev in msgs if ev.traj == f"t{k}"]
        assert turns == sorted(turns) and len(turns) == 500
