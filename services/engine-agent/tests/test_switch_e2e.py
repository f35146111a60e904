"""Role switches end to end: emulated SGLang + router over real HTTP, a real nats-server,
the agent as a real process."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import httpx

from prorsa_runtime.testing import async_wait_until

from agent_harness import emulated_instance, engine_role, listed_as, router_workers, running, send_command  # type: ignore


async def test_in_place_switch_prefill_to_decode_and_back(agent_factory, events, ns, router):
    e0 = emulated_instance("e0", "prefill")
    e1 = emulated_instance("e1", "decode")
    agent = agent_factory([e0, e1]).start()
    try:
        await events.wait("engine.registered", engine="e0", timeout=60)
        await events.wait("engine.registered", engine="e1", timeout=60)
        await events.wait("engine.stats", engine="e0")
        url0 = f"http://127.0.0.1:{e0['port']}"
        assert (await router_workers(router.url))[url0] == "prefill"

        cmd = await send_command(events.js, ns, "e0", "decode")
        done = await events.wait("engine.switched", cmd=cmd, timeout=60)
        assert (done.from_role, done.to_role, done.mode) == ("prefill", "decode", "in_place")
        assert events.of("engine.switching", cmd=cmd)
        assert await engine_role(url0) == "decode"
        assert (await router_workers(router.url))[url0] == "decode"

        back = await send_command(events.js, ns, "e0", "prefill")
        done = await events.wait("engine.switched", cmd=back, timeout=60)
        assert (done.from_role, done.to_role) == ("decode", "prefill")
        assert (await router_workers(router.url))[url0] == "prefill"
        # The router still serves through the pair after the switches.
        async with httpx.AsyncClient(timeout=30) as c:
            r = await c.post(f"{router.url}/generate", json={"text": "a b c", "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 4
        # The prefill engine's stats carry the prompt tokens it computed per second (from
        # SGLang's cumulative counter); the decode engine's carry none. The rate needs two polls
        # after the switch with prompt tokens computed between them, so requests keep coming
        # until one lands between polls (each a new prompt: a cached one computes nothing).
        sent = 0

        async def prefill_rate_seen() -> bool:
            nonlocal sent
            if any((e.prefill_tokens_per_s or 0) > 0 for e in events.of("engine.stats", engine="e0")):
                return True
            sent += 1
            async with httpx.AsyncClient(timeout=30) as c:
                r = await c.post(f"{router.url}/generate",
                                 json={"text": f"prompt {sent} " * 8, "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200, r.text
            return False

        await async_wait_until(prefill_rate_seen, timeout=30, interval=0.2, what="a prefill rate from e0")
        assert all(e.prefill_tokens_per_s is None for e in events.of("engine.stats", engine="e1"))

        # The CLI: publishes a command, prints the outcome, exit code says which.
        async def cli(*args: str) -> tuple[int, str]:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "prorsa_cli.main", "switch", *args, "--nats", events.nats_url,
                "--prefix", ns.prefix, "--stream", ns.stream, "--timeout", "60",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
            out, _ = await proc.communicate()
            return proc.returncode, out.decode()

        code, out = await cli("e0", "--to", "decode")
        assert code == 0 and '"type":"engine.switched"' in out and '"to_role":"decode"' in out
        code, out = await cli("nobody", "--to", "decode")
        assert code == 1 and "unknown engine" in out
    finally:
        print(agent.tail())


async def test_restart_switch_and_back(agent_factory, events, ns, router):
    # Without mooncake/mori the in-place switch is impossible: the agent restarts the engine.
    e0 = emulated_instance("r0", "prefill", transfer_backend="nixl")
    agent = agent_factory([e0]).start()
    try:
        await events.wait("engine.registered", engine="r0", timeout=60)
        reg = events.of("engine.registered", engine="r0")[-1]
        assert reg.switch_modes == ["restart"]
        url = f"http://127.0.0.1:{e0['port']}"
        cmd = await send_command(events.js, ns, "r0", "decode")
        done = await events.wait("engine.switched", cmd=cmd, timeout=60)
        assert (done.to_role, done.mode) == ("decode", "restart")
        assert await engine_role(url) == "decode"
        assert (await router_workers(router.url))[url] == "decode"
        cmd = await send_command(events.js, ns, "r0", "prefill")
        done = await events.wait("engine.switched", cmd=cmd, timeout=60)
        assert (await router_workers(router.url))[url] == "prefill"
    finally:
        print(agent.tail())


async def test_drain_aborts_at_deadline_then_switches(agent_factory, events, ns, router):
    # A long request keeps the engine busy past the command's deadline: the agent aborts it.
    # The figure a flip to decode needs (no decode peer to read it from).
    e0 = emulated_instance("d0", "prefill", speed=1.0, switch_seconds=0.2, decode_cuda_graph_memory_gb=1.5)
    agent = agent_factory([e0]).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="d0", timeout=60)
        async with httpx.AsyncClient(timeout=60) as c:
            # In prefill role a request takes prefill time; make it long (~40 s emulated = wall).
            long = asyncio.create_task(c.post(f"{url}/generate", json={"input_ids": [1] * 90_000,
                                                                       "sampling_params": {"max_new_tokens": 1}}))
            await async_wait_until(lambda: running(url), timeout=10)
            cmd = await send_command(events.js, ns, "d0", "decode", deadline_s=1.0)
            done = await events.wait("engine.switched", cmd=cmd, timeout=30)
            assert done.to_role == "decode"
            assert done.aborted_reqs == 1  # reported, for the framework to retry
            resp = await long
            assert resp.json()["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        print(agent.tail())


async def test_stuck_request_fails_the_switch_and_restores_the_role(agent_factory, events, ns, router):
    e0 = emulated_instance("s0", "prefill", speed=1.0, decode_cuda_graph_memory_gb=1.5)
    agent = agent_factory([e0], abort_grace_s=0.5).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="s0", timeout=60)
        async with httpx.AsyncClient(timeout=120) as c:
            stuck = asyncio.create_task(c.post(f"{url}/generate", json={
                "input_ids": [1] * 90_000, "sampling_params": {"max_new_tokens": 1}, "emulated_pinned": True}))
            await async_wait_until(lambda: running(url), timeout=10)
            cmd = await send_command(events.js, ns, "s0", "decode", deadline_s=0.5)
            failed = await events.wait("engine.switch_failed", cmd=cmd, timeout=30)
            assert failed.role == "prefill" and "timed out draining" in failed.error
            assert await engine_role(url) == "prefill"
            await async_wait_until(lambda: listed_as(router.url, url, "prefill"), timeout=10)
            stuck.cancel()
    finally:
        print(agent.tail())


async def test_engine_dies_mid_switch_is_relaunched_in_its_old_role(agent_factory, events, ns, router):
    e0 = emulated_instance("k0", "prefill", switch_seconds=300.0,  # 6 s wall at speed 50
                           decode_cuda_graph_memory_gb=1.5)
    agent = agent_factory([e0]).start()
    url = f"http://127.0.0.1:{e0['port']}"
    try:
        await events.wait("engine.registered", engine="k0", timeout=60)
        first_pid = agent.engine_pids()["k0"]
        cmd = await send_command(events.js, ns, "k0", "decode")
        await events.wait("engine.switching", cmd=cmd)
        await async_wait_until(lambda: _phase(agent, cmd) == "switch", timeout=10)
        os.killpg(first_pid, signal.SIGKILL)
        failed = await events.wait("engine.switch_failed", cmd=cmd, timeout=60)
        assert failed.role == "prefill"
        assert agent.engine_pids()["k0"] != first_pid
        assert await engine_role(url) == "prefill"
        await async_wait_until(lambda: listed_as(router.url, url, "prefill"), timeout=20)
    finally:
        print(agent.tail())


async def test_agent_killed_mid_switch_resumes_and_loses_nothing(agent_factory, events, ns, router):
    e0 = emulated_instance("m0", "prefill", switch_seconds=150.0)  # 3 s wall
    e1 = emulated_instance("m1", "decode")
    agent = agent_factory([e0, e1]).start()
    url0, url1 = (f"http://127.0.0.1:{e['port']}" for e in (e0, e1))
    try:
        await events.wait("engine.registered", engine="m1", timeout=60)
        await events.wait("engine.registered", engine="m0", timeout=60)
        pids = agent.engine_pids()
        cmd = await send_command(events.js, ns, "m0", "decode")
        await async_wait_until(lambda: _phase(agent, cmd) == "switch", timeout=10)
        agent.kill()
        agent.start()  # same config, same journal
        done = await events.wait("engine.switched", cmd=cmd, timeout=60)
        assert done.to_role == "decode"
        assert agent.engine_pids() == pids  # adopted, not relaunched
        assert await engine_role(url0) == "decode"
        await async_wait_until(lambda: listed_as(router.url, url0, "decode"), timeout=10)
        await async_wait_until(lambda: listed_as(router.url, url1, "decode"), timeout=10)
        assert len(events.of("engine.switched", cmd=cmd)) == 1
    finally:
        print(agent.tail())


async def test_duplicates_malformed_unknown_and_late_commands(agent_factory, events, ns, router):
    e0 = emulated_instance("u0", "prefill", decode_cuda_graph_memory_gb=1.5)
    agent = agent_factory([e0]).start()
    try:
        await events.wait("engine.registered", engine="u0", timeout=60)
        cmd = await send_command(events.js, ns, "u0", "decode")
        await send_command(events.js, ns, "u0", "decode", cmd=cmd)  # the same command again
        await events.wait("engine.switched", cmd=cmd, timeout=60)
        await send_command(events.js, ns, "u0", "decode", cmd=cmd)  # and after it finished

        # A malformed command gets a clear refusal; the agent keeps running.
        bad = b'{"v":1,"id":"bad-1","type":"engine.command","ts":1.0,"run":"t","cmd":"bad-cmd",' \
              b'"engine":"u0","action":"switch_role","to_role":"sideways","deadline":9e9}'
        await events.js.publish(ns.commands(), bad)
        refused = await events.wait("engine.switch_failed", cmd="bad-cmd")
        assert "malformed" in refused.error and "to_role" in refused.error

        unknown = await send_command(events.js, ns, "nope", "decode")
        refused = await events.wait("engine.switch_failed", cmd=unknown)
        assert "unknown engine" in refused.error

        late = await send_command(events.js, ns, "u0", "prefill", deadline_s=-5.0)
        refused = await events.wait("engine.switch_failed", cmd=late)
        assert "deadline" in refused.error and refused.role == "decode"

        # Everything above was handled after the duplicates: the switch ran exactly once.
        assert len(events.of("engine.switching", cmd=cmd)) == 1
        assert len(events.of("engine.switched", cmd=cmd)) == 1
        ok = await send_command(events.js, ns, "u0", "prefill")
        await events.wait("engine.switched", cmd=ok, timeout=60)
    finally:
        print(agent.tail())


def _phase(agent, cmd: str) -> str | None:
    import json

    path = agent.dir / "state" / "journal.json"
    try:
        sw = json.loads(path.read_text())["inflight"].get(cmd)
    except (OSError, ValueError):
        return None
    return sw["phase"] if sw else None


async def test_an_engine_that_cannot_start_is_reported_with_its_log(agent_factory, events, ns, router):
    # A prefill engine whose bootstrap port is taken exits at startup, as SGLang does: the
    # agent deregisters it, logs why with the last lines of the engine's own log, and says
    # how many of its engines are up; the other engine serves.
    import socket

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        e0 = emulated_instance("e0", "prefill", bootstrap_port=taken.getsockname()[1])
        e1 = emulated_instance("e1", "decode")
        agent = agent_factory([e0, e1]).start()
        gone = await events.wait("engine.deregistered", engine="e0", timeout=60)
        assert "not healthy" in gone.reason
        await events.wait("engine.registered", engine="e1", timeout=60)
        await async_wait_until(lambda: "ready: 1 of 2 engines up" in agent.tail(), timeout=30,
                               what="the agent's ready line")
        log = agent.tail()
        assert "e0 not healthy at" in log and "its process exited" in log, log
        assert "address already in use" in log, log
    finally:
        taken.close()
