"""No poison: command messages the agent cannot handle, published mid-run to a real
nats-server, are dead-lettered (a log line with subject, stream sequence and hash; a
counter on /metrics) and acknowledged; the next command is carried out, and a restarted
agent neither sees them again nor stops."""

from __future__ import annotations

import httpx

from prorsa_runtime import free_port
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import encode_event
from prorsa_tracker.examples import EventFactory

from agent_harness import emulated_instance, send_command  # type: ignore


def _metric(port: int, name: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in {text}")


async def test_poison_commands_are_dead_lettered_and_a_restart_carries_on(agent_factory, events, ns, router):
    port = free_port()
    agent = agent_factory(
        # A flip to decode needs the decode CUDA-graph memory figure (PRECHECK refuses it
        # otherwise, as SGLang does); this agent has no decode engine to read it from.
        [emulated_instance("x0", "prefill", decode_cuda_graph_memory_gb=1.5)], metrics_port=port).start()
    try:
        await events.wait("engine.registered", engine="x0", timeout=60)
        stats = EventFactory("t")("engine.stats", 1.0, engine="x0", role="prefill", running_reqs=0, queued_reqs=0,
                                  kv_used_tokens=0, kv_capacity_tokens=1)
        poison = [b"[" * 1000, b"\xff\xfe\x00", encode_event(stats)]  # the last: an engine event on the command subject
        seqs = [(await events.js.publish(ns.commands(), data)).seq for data in poison]
        cmd = await send_command(events.js, ns, "x0", "decode")
        await events.wait("engine.switched", cmd=cmd, timeout=60)
        log = agent.tail()
        for seq in seqs:
            assert f"seq={seq}" in log and "dead letter" in log
        assert _metric(port, 'prorsa_agent_dead_letters_total{kind="invalid"}') == 2
        assert _metric(port, 'prorsa_agent_dead_letters_total{kind="subject"}') == 1
        assert agent.proc.poll() is None

        # A restart: the poison was acknowledged, so it is not delivered again; commands work.
        agent.stop()
        mark = agent.log.stat().st_size
        agent.start()
        await async_wait_until(lambda: len(events.of("engine.registered", engine="x0")) >= 2, timeout=60,
                               what="re-registration after the restart")
        back = await send_command(events.js, ns, "x0", "prefill")
        await events.wait("engine.switched", cmd=back, timeout=60)
        assert "dead letter" not in agent.log.read_text()[mark:]
        assert agent.proc.poll() is None
    finally:
        print(agent.tail())
