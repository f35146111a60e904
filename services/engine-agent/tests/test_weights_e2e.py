"""Weight updates and SGLang's refusals end to end: emulated SGLang + router over real HTTP,
a real nats-server, the agent as a real process."""

from __future__ import annotations

import time

import httpx

from prorsa_runtime.bus import publish_event
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import PolicyUpdated

from agent_harness import emulated_instance, engine_role, listed_as, router_workers, send_command  # type: ignore


async def _post(url: str, path: str, body: dict) -> dict:
    async with httpx.AsyncClient(timeout=10) as c:
        r = await c.post(url + path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


async def _model_info(url: str) -> dict:
    async with httpx.AsyncClient(timeout=10) as c:
        return (await c.get(url + "/model_info")).json()


async def test_a_restart_after_a_weight_update_comes_back_on_the_updated_weights(agent_factory, events, ns, router):
    e0 = emulated_instance("w0", "prefill", transfer_backend="nixl")  # restart mode only
    agent = agent_factory([e0]).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="w0", timeout=60)
        out = await _post(url, "/update_weights_from_disk", {"model_path": "/ckpt/step-3", "weight_version": "3"})
        assert out["success"]
        cmd = await send_command(events.js, ns, "w0", "decode")
        done = await events.wait("engine.switched", cmd=cmd, timeout=60)
        assert done.mode == "restart"
        info = await _model_info(url)  # a new process: what it was launched with
        assert (info["model_path"], info["weight_version"], info["disaggregation_mode"]) == \
            ("/ckpt/step-3", "3", "decode")

        # Weights updated in memory (a version, same path) and no way to find them: refused
        # before the engine is touched; it keeps serving, registered, in its role.
        await _post(url, "/update_weight_version", {"new_version": "4"})
        cmd = await send_command(events.js, ns, "w0", "prefill")
        failed = await events.wait("engine.switch_failed", cmd=cmd, timeout=30)
        assert "current weights" in failed.error and "weights_path" in failed.error, failed.error
        assert failed.role == "decode" and not events.of("engine.switching", cmd=cmd)
        assert (await router_workers(router.url))[url] == "decode"

        # policy.updated names where version 4 lives: the restart loads it. One stamped a
        # year ahead of the clock (a wrong producer clock) would win as the newest and pin
        # the weights for good: it is ignored.
        await publish_event(events.js, ns, PolicyUpdated(id="pu-9", ts=time.time() + 365 * 86400, run="rl",
                                                         version=9, model_path="/ckpt/step-9"))
        await publish_event(events.js, ns, PolicyUpdated(id="pu-4", ts=time.time(), run="rl", version=4,
                                                         model_path="/ckpt/step-4"))
        await _post(url, "/update_weight_version", {"new_version": "4"})
        cmd = await send_command(events.js, ns, "w0", "prefill")
        await events.wait("engine.switched", cmd=cmd, timeout=60)
        info = await _model_info(url)
        assert (info["model_path"], info["weight_version"], info["disaggregation_mode"]) == \
            ("/ckpt/step-4", "4", "prefill")
    finally:
        print(agent.tail())


async def test_no_switch_overlaps_a_weight_update(agent_factory, events, ns, router):
    # Generation paused (how frameworks bracket a weight sync): an in-place switch takes the
    # engine off the router at once, so the batch that follows the update does not land on
    # it, and flips once the update ends (no drain); still paused after update_wait_s, the
    # switch is refused and the engine goes back to the router in its old role.
    e0 = emulated_instance("g0", "prefill")
    e1 = emulated_instance("g1", "decode")
    agent = agent_factory([e0, e1], update_wait_s=1.5).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="g0", timeout=60)
        await events.wait("engine.registered", engine="g1", timeout=60)
        await _post(url, "/pause_generation", {"mode": "abort"})
        cmd = await send_command(events.js, ns, "g0", "decode")
        failed = await events.wait("engine.switch_failed", cmd=cmd, timeout=30)
        assert "weight update in progress" in failed.error and failed.role == "prefill", failed.error
        assert events.of("engine.switching", cmd=cmd)
        await async_wait_until(lambda: listed_as(router.url, url, "prefill"), timeout=10,
                               what="g0 back in the router as prefill")
        assert await engine_role(url) == "prefill"

        cmd = await send_command(events.js, ns, "g0", "decode")
        await events.wait("engine.switching", cmd=cmd, timeout=10)
        # Held off the router until the update ends; not flipped meanwhile.
        await async_wait_until(lambda: listed_as(router.url, url, None), timeout=10, what="g0 off the router")
        assert await engine_role(url) == "prefill" and not events.of("engine.switched", cmd=cmd)
        await _post(url, "/continue_generation", {})
        done = await events.wait("engine.switched", cmd=cmd, timeout=30)
        assert done.to_role == "decode" and not done.aborted_reqs  # nothing aborted
        assert (await router_workers(router.url))[url] == "decode"
    finally:
        print(agent.tail())


async def test_in_place_refusals_before_the_engine_is_touched(agent_factory, events, ns, router):
    # No decode peer and no configured figure: a flip to decode cannot get
    # decode_cuda_graph_memory_gb, so SGLang would refuse it; the agent refuses first.
    e0 = emulated_instance("m0", "prefill")
    agent = agent_factory([e0]).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="m0", timeout=60)
        cmd = await send_command(events.js, ns, "m0", "decode")
        failed = await events.wait("engine.switch_failed", cmd=cmd, timeout=30)
        assert "decode_cuda_graph_memory_gb" in failed.error, failed.error
        assert not events.of("engine.switching", cmd=cmd)
        assert (await router_workers(router.url))[url] == "prefill" and await engine_role(url) == "prefill"
    finally:
        print(agent.tail())
