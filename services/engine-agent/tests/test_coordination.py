"""A framework that owns the router shares the engines with Prorsa: real HTTP against an
emulated SGLang engine and sglang-router 0.3.2, a real nats-server, the agent as a real
process. While a switch has the engine off the router, the framework still finds it
(prorsa_sdk.coordination.engine_urls) and its abort reaches it (abort_all); the weight
update it then brackets on the engine stops the switch, which puts the engine back in the
router in its old role."""

from __future__ import annotations

import asyncio

import httpx

from prorsa_runtime.testing import async_wait_until
from prorsa_sdk.coordination import abort_all, engine_urls

from agent_harness import emulated_instance, engine_role, router_workers, running, send_command  # type: ignore


async def test_the_frameworks_abort_and_update_reach_an_engine_a_switch_took_off_the_router(
        agent_factory, events, ns, router):
    e0 = emulated_instance("f0", "prefill", speed=1.0, switch_seconds=0.2, decode_cuda_graph_memory_gb=1.5)
    agent = agent_factory([e0], update_wait_s=1.5).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="f0", timeout=60)
        async with httpx.AsyncClient(timeout=60) as c:
            # A long request (~40 s of prefill at speed 1) keeps the switch draining.
            long = asyncio.create_task(c.post(f"{url}/generate", json={
                "input_ids": [1] * 90_000, "sampling_params": {"max_new_tokens": 1}}))
            await async_wait_until(lambda: running(url), timeout=10)
            cmd = await send_command(events.js, ns, "f0", "decode", deadline_s=60.0)
            await events.wait("engine.switching", cmd=cmd, timeout=30)

            async def off_router() -> bool:
                return url not in await router_workers(router.url)

            await async_wait_until(off_router, timeout=10)
            # The router's list misses the draining engine; the shared list has it.
            assert url in await engine_urls(router.url, events.nats_url, namespace=ns)
            # The framework brackets a weight sync on every engine it found: pause, abort, update.
            for u in await engine_urls(router.url, events.nats_url, namespace=ns):
                assert (await c.post(f"{u}/pause_generation", json={"mode": "retract"})).status_code == 200
            assert await abort_all(router.url, events.nats_url, namespace=ns) == {url: 200}
            resp = await long
            assert resp.json()["meta_info"]["finish_reason"]["type"] == "abort"
            # Drained by the abort, but the engine's weights are being updated: no flip; it
            # goes back to the router in its old role.
            failed = await events.wait("engine.switch_failed", cmd=cmd, timeout=30)
            assert "weight update in progress" in failed.error and failed.role == "prefill", failed.error
            assert not events.of("engine.switched", cmd=cmd)
            assert await engine_role(url) == "prefill"
            assert (await router_workers(router.url))[url] == "prefill"
            await c.post(f"{url}/continue_generation", json={})
            cmd = await send_command(events.js, ns, "f0", "decode")  # the update is over: it switches
            assert (await events.wait("engine.switched", cmd=cmd, timeout=30)).to_role == "decode"
    finally:
        print(agent.tail())
