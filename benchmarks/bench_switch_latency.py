"""Command published -> engine.switched latency with emulated in-place switches.

Starts a nats-server, an emulated router and an engine agent (real processes) whose two
emulated engines switch in place with a 0 s engine switch time, then times N switches
(alternating prefill/decode). The figure printed excludes the engine's own switch time
(it is zero here), so it is the agent's overhead: deregister, drain check, the
/pd_role_switch call, health, re-registration and the bus round trips. Baseline in the
same run: a bare publish -> receive round trip on the same bus.

    .venv/bin/python benchmarks/bench_switch_latency.py [-n 20]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "services/engine-agent/tests"))

from agent_harness import Agent, emulated_instance  # noqa: E402

from prorsa_runtime.bus import connect, ensure_stream, publish_event  # noqa: E402
from prorsa_runtime.natsserver import NatsServer  # noqa: E402
from prorsa_schemas import EngineCommand, Namespace, decode_event  # noqa: E402
from prorsa_emulated.cluster import EmulatedProcess, free_port, router_command  # noqa: E402


async def main(n: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-switch-"))
    server = NatsServer(tmp / "nats", port=0).start()
    port = free_port()
    router = EmulatedProcess("router", router_command(port, health_interval=0.5),
                             f"http://127.0.0.1:{port}").start().wait_healthy(30)
    ns = Namespace(prefix="bench", stream="BENCH")
    agent = Agent(tmp / "agent", server.url, ns, router.url,
                  [emulated_instance("b0", "prefill", switch_seconds=0.0),
                   emulated_instance("b1", "decode", switch_seconds=0.0)],
                  stats_interval_s=1.0, poll_s=0.005)
    agent.start()
    nc = await connect(server.url, "bench")
    js = nc.jetstream()
    await ensure_stream(js, ns)
    got: dict[str, float] = {}
    registered: set[str] = set()

    async def on_msg(msg) -> None:
        ev = decode_event(msg.data)
        if ev.type == "engine.registered":
            registered.add(ev.engine)
        if ev.type in ("engine.switched", "engine.switch_failed"):
            got[ev.cmd] = time.perf_counter()

    await nc.subscribe(ns.engine_all(), cb=on_msg)
    try:
        while len(registered) < 2:
            await asyncio.sleep(0.05)
        # baseline: a publish -> receive round trip through the stream
        base = []
        for _ in range(n):
            cid = f"ping-{uuid.uuid4().hex[:8]}"
            t0 = time.perf_counter()
            await publish_event(js, ns, EngineCommand(id=cid, ts=time.time(), run="b", cmd=cid, engine="nobody",
                                                      action="switch_role", to_role="decode", deadline=time.time()))
            base.append(time.perf_counter() - t0)
        lat = []
        role = "decode"
        for i in range(n):
            cid = f"sw-{i}-{uuid.uuid4().hex[:6]}"
            t0 = time.perf_counter()
            await publish_event(js, ns, EngineCommand(id=cid, ts=time.time(), run="b", cmd=cid, engine="b0",
                                                      action="switch_role", to_role=role, deadline=time.time() + 60))
            while cid not in got:
                await asyncio.sleep(0.001)
            lat.append(got[cid] - t0)
            role = "prefill" if role == "decode" else "decode"
        q = statistics.quantiles(lat, n=20)
        print("all (ms):", " ".join(f"{x * 1e3:.0f}" for x in lat))
        print(f"switches: {n}")
        print(f"baseline publish->ack p50 {statistics.median(base) * 1e3:.1f} ms")
        print(f"command -> engine.switched (in place, engine switch time 0): "
              f"p50 {statistics.median(lat) * 1e3:.0f} ms, p95 {q[18] * 1e3:.0f} ms, max {max(lat) * 1e3:.0f} ms")
    finally:
        await nc.close()
        agent.kill()
        agent.kill_engines()
        router.stop()
        server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("-n", type=int, default=20)
    asyncio.run(main(p.parse_args().n))
