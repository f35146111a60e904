"""Router reconciliation: a restarted router (which keeps no state) gets the agent's engines
back within a few reconcile rounds, without a new engine.registered; an engine a switch has
taken off the router is not put back until the switch registers it in its new role."""

from __future__ import annotations

import asyncio

import httpx

from prorsa_runtime.testing import async_wait_until
from prorsa_engine_agent.reconcile import Expected, to_register

from agent_harness import emulated_instance, router_workers, send_command  # type: ignore


def test_to_register_finds_missing_and_mistyped_engines():
    p = Expected("p0", "http://10.0.0.1:30001", "prefill")
    d = Expected("d0", "http://10.0.0.1:30002", "decode")
    assert to_register([p, d], []) == [p, d]
    listed = [{"url": "http://10.0.0.1:30001/", "worker_type": "prefill"},
              {"url": "http://10.0.0.1:30002", "worker_type": "decode"}]
    assert to_register([p, d], listed) == []
    assert to_register([p, d], [listed[0], {"url": d.url, "worker_type": "prefill"}]) == [d]
    assert to_register([p], ["junk", {"worker_type": "prefill"}]) == [p]


def _metric(port: int, name: str) -> float:
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not served")


async def _workers(url: str) -> dict[str, str]:
    try:
        return await router_workers(url)
    except (httpx.HTTPError, ValueError, KeyError):
        return {}


async def test_restarted_router_gets_the_engines_back_but_not_one_mid_switch(agent_factory, events, ns, router):
    from prorsa_runtime import free_port

    metrics = free_port()
    p0 = emulated_instance("p0", "prefill", speed=1.0, switch_seconds=3.0, decode_cuda_graph_memory_gb=1.5)
    d0 = emulated_instance("d0", "decode")
    url_p, url_d = (f"http://127.0.0.1:{i['port']}" for i in (p0, d0))
    agent = agent_factory([p0, d0], router_reconcile_s=0.3, metrics_port=metrics).start()
    try:
        for e in ("p0", "d0"):
            await events.wait("engine.registered", engine=e, timeout=60)
        assert await router_workers(router.url) == {url_p: "prefill", url_d: "decode"}
        assert _metric(metrics, "prorsa_agent_router_reregistrations_total") == 0

        # The router crashes and comes back on the same port with an empty worker list.
        router.kill()
        router.start().wait_healthy(30)
        async def both_back() -> bool:
            return await _workers(router.url) == {url_p: "prefill", url_d: "decode"}

        await async_wait_until(both_back, timeout=30, interval=0.1,
                               what="the restarted router to list p0 and d0 again")
        async with httpx.AsyncClient(timeout=10) as c:  # routable: a prefill and a decode
            r = await c.post(f"{router.url}/generate",
                             json={"text": "a b c", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200, r.text
        assert _metric(metrics, "prorsa_agent_router_reregistrations_total") == 2
        assert "missing from the router" in agent.tail()
        # The engines' roles did not change: no second engine.registered.
        assert len(events.of("engine.registered", engine="p0")) == 1
        assert len(events.of("engine.registered", engine="d0")) == 1

        # A switch takes p0 off the router for its 3 s flip; reconciliation (every 0.3 s)
        # must not put it back as a prefill. Once it is gone, it may only come back as decode.
        cmd = await send_command(events.js, ns, "p0", "decode")
        seen_types: list[str | None] = []
        deadline = asyncio.get_running_loop().time() + 60
        while not events.of("engine.switched", cmd=cmd):
            assert not events.of("engine.switch_failed", cmd=cmd), events.of("engine.switch_failed", cmd=cmd)
            assert asyncio.get_running_loop().time() < deadline, f"no engine.switched; agent:\n{agent.tail()}"
            t = (await _workers(router.url)).get(url_p)
            if not seen_types or seen_types[-1] != t:
                seen_types.append(t)
            await asyncio.sleep(0.05)
        assert None in seen_types, seen_types
        assert "prefill" not in seen_types[seen_types.index(None):], seen_types
        assert (await router_workers(router.url)) == {url_p: "decode", url_d: "decode"}
        assert _metric(metrics, "prorsa_agent_router_reregistrations_total") == 2
    finally:
        print(agent.tail())
