"""The async driver's weight sync over real HTTP: the calls SGLang takes, in order, on every
worker the router lists; an engine that refuses or a router that answers nonsense is
skipped and logged, and the sync goes on."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from prorsa_emulated.cluster import free_port
from prorsa_sim.driver import weights


async def _serve(routes: list[web.RouteDef]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


async def test_weight_sync_pauses_flushes_names_and_resumes_each_listed_engine(caplog):
    calls: list[tuple[str, dict]] = []

    async def record(request: web.Request) -> web.Response:
        calls.append((request.path, await request.json()))
        return web.json_response({"status": "ok"})

    async def refuse(_request: web.Request) -> web.Response:
        return web.Response(status=503, text="engine is switching")

    good, good_url = await _serve([web.post(p, record) for p in (
        "/pause_generation", "/flush_cache", "/update_weight_version", "/continue_generation")])
    bad, bad_url = await _serve([web.post(p, refuse) for p in (
        "/pause_generation", "/flush_cache", "/update_weight_version", "/continue_generation")])

    async def listing(_request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": good_url + "/", "worker_type": "prefill"},
                                              {"url": bad_url, "worker_type": "decode"},
                                              {"worker_type": "decode"}],  # no url: not an engine to reach
                                  "total": 3})

    router, router_url = await _serve([web.get("/workers", listing)])
    try:
        async with aiohttp.ClientSession() as client:
            urls = await weights.engine_urls(client, router_url)
            assert urls == sorted([good_url, bad_url])
            assert await weights.pause(client, urls) == [good_url]
            assert await weights.resume(client, urls, 7) == 1
    finally:
        for r in (good, bad, router):
            await r.cleanup()
    # SGLang's sequence for a weight sync (slime, AReaL): abort and pause, flush, then name
    # the new weights and continue.
    assert calls == [("/pause_generation", {"mode": "abort"}), ("/flush_cache", {}),
                     ("/update_weight_version", {"new_version": "7", "abort_all_requests": False}),
                     ("/continue_generation", {})]
    # The refusing engine is reported by URL and status, not skipped silently.
    assert any(bad_url in r.getMessage() and "503" in r.getMessage() for r in caplog.records)


async def test_a_router_that_answers_nonsense_pauses_nothing_and_says_so(caplog):
    async def nonsense(_request: web.Request) -> web.Response:
        return web.Response(text="<html>not json</html>")

    router, router_url = await _serve([web.get("/workers", nonsense)])
    try:
        async with aiohttp.ClientSession() as client:
            assert await weights.engine_urls(client, router_url) == []
            assert await weights.pause(client, []) == []
    finally:
        await router.cleanup()
    assert any("did not list its workers" in r.getMessage() for r in caplog.records)


async def test_an_engine_out_of_the_router_for_a_switch_is_still_synced(caplog):
    # Engines A and B; the router lists both, then only A (B is between the two halves of a
    # role switch, still running), then only A again once B has shut down.
    calls: list[tuple[str, str]] = []

    def engine(name: str):
        async def record(request: web.Request) -> web.Response:
            calls.append((name, request.path))
            return web.json_response({"status": "ok"})
        return [web.post(p, record) for p in ("/pause_generation", "/flush_cache", "/update_weight_version",
                                              "/continue_generation")]

    a, a_url = await _serve(engine("A"))
    b, b_url = await _serve(engine("B"))
    listed = [[a_url, b_url]]

    async def listing(_request: web.Request) -> web.Response:
        return web.json_response({"workers": [{"url": u} for u in listed[0]]})

    router, router_url = await _serve([web.get("/workers", listing)])
    fleet = weights.Fleet()
    try:
        async with aiohttp.ClientSession() as client:
            async def sync() -> list[str]:
                now = await weights.engine_urls(client, router_url)
                urls = fleet.targets(now)
                paused = await weights.pause(client, urls)
                fleet.settle(now, paused)
                return paused

            assert await sync() == sorted([a_url, b_url])
            listed[0] = [a_url]
            calls.clear()
            assert await sync() == sorted([a_url, b_url])  # B, unlisted mid-switch, is paused too
            assert ("B", "/pause_generation") in calls
            await b.cleanup()
            assert await sync() == [a_url]
            assert fleet.known == {a_url}  # B neither listed nor answering: forgotten
    finally:
        for r in (a, router):
            await r.cleanup()
    assert any(b_url in r.getMessage() and "taken as shut down" in r.getMessage() for r in caplog.records)


async def test_the_pause_mode_is_sglangs_and_a_bad_one_is_refused_by_name():
    from pydantic import ValidationError

    from prorsa_sim.driver.config import DriverConfig

    calls: list[dict] = []

    async def record(request: web.Request) -> web.Response:
        if request.path == "/pause_generation":
            calls.append(await request.json())
        return web.json_response({"status": "ok"})

    eng, url = await _serve([web.post(p, record) for p in ("/pause_generation", "/flush_cache")])
    try:
        async with aiohttp.ClientSession() as client:
            for mode in ("in_place", "retract"):
                assert await weights.pause(client, [url], mode) == [url]
    finally:
        await eng.cleanup()
    assert calls == [{"mode": "in_place"}, {"mode": "retract"}]
    assert DriverConfig(router_url="http://r:1").pause_mode == "abort"
    with pytest.raises(ValidationError, match="pause_mode"):
        DriverConfig(router_url="http://r:1", pause_mode="rewind")
