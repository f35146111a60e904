"""The rollout driver against a router over real HTTP: what it sends passes sglang-router
(only SGLang's own fields), and a router that refuses a request (4xx) ends the run with a
clear error instead of re-sending it for ever."""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from prorsa_runtime.bus import connect, ensure_stream
from prorsa_emulated.cluster import free_port


async def _refusing_router(port: int, bodies: list[dict]) -> web.AppRunner:
    """A router on a real port that lists a PD pair and refuses every /generate with 400, in
    sglang-router 0.3.2's error shape; records what it was sent."""

    async def workers(_r: web.Request) -> web.Response:
        return web.json_response({"workers": [], "total": 2,
                                  "stats": {"prefill_count": 1, "decode_count": 1, "regular_count": 0}})

    async def generate(r: web.Request) -> web.Response:
        bodies.append(await r.json())
        return web.json_response({"error": {"type": "Bad Request", "code": "decode_bad_request",
                                            "message": "max_new_tokens is too large"}}, status=400)

    app = web.Application()
    app.router.add_get("/workers", workers)
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner


async def test_a_request_the_router_refuses_ends_the_run_with_its_reason(nats_url, ns):
    nc = await connect(nats_url, "test-setup")
    await ensure_stream(nc.jetstream(), ns)
    await nc.close()
    port, bodies = free_port(), []
    runner = await _refusing_router(port, bodies)
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prorsa_sim.driver", "--router", f"http://127.0.0.1:{port}",
            "--nats", nats_url, "--prefix", ns.prefix, "--stream", ns.stream, "--batch-size", "1",
            "--steps", "1", "--max-turns", "1", "--speed", "1000", "--workload", "math",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        await runner.cleanup()
    text = err.decode()
    assert proc.returncode == 1, out.decode() + text
    assert "refused request" in text and "HTTP 400" in text and "decode_bad_request" in text, text
    # Sent once, not re-sent; and only SGLang's fields (sglang-router drops any other).
    assert len(bodies) == 1
    assert set(bodies[0]) == {"rid", "text", "sampling_params", "stream"}, bodies[0]
    assert bodies[0]["stream"] is True  # streamed: prefill.finished is announced at the first chunk
    assert set(bodies[0]["sampling_params"]) == {"max_new_tokens"}
