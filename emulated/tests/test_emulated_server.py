"""The emulated SGLang server and router over real HTTP: the shapes and refusals the engine
agent relies on (SGLang 0.5.23, sglang-router 0.3.2)."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from prorsa_emulated import EmulatedCluster
from prorsa_emulated.cluster import EmulatedProcess, engine_command, free_port


@pytest.fixture(scope="module", params=["sglang", "emulated"])
def cluster(request):
    # The real router (sglang-router 0.3.2) and the emulated one answer alike.
    c = EmulatedCluster(["prefill", "decode"], speed=1.0, router_kind=request.param).start(register=True)
    yield c
    c.stop()


def _wait(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.02)


def test_role_switch_refused_while_busy_then_done_when_idle(cluster):
    p, d = (e.url for e in cluster.engines)
    with httpx.Client(timeout=30) as c:
        _wait(lambda: c.get(f"{cluster.router.url}/workers").json()["total"] == 2)
        assert c.get(f"{p}/v1/loads?include=bogus").status_code == 400
        # a long prefill keeps the engine busy
        import threading

        t = threading.Thread(target=lambda: httpx.post(f"{p}/generate", timeout=60, json={
            "input_ids": [1] * 60_000, "sampling_params": {"max_new_tokens": 1}}))
        t.start()
        _wait(lambda: c.get(f"{p}/v1/loads").json()["loads"][0]["num_running_reqs"] == 1)
        r = c.post(f"{p}/pd_role_switch", json={"new_role": "decode"})
        assert r.status_code == 400
        assert r.json()["safe_to_restore"] is True and "not idle" in r.json()["message"]
        c.post(f"{p}/abort_request", json={"abort_all": True})
        t.join(30)
        r = c.post(f"{p}/pd_role_switch", json={"new_role": "decode", "decode_cuda_graph_memory_gb": 1.0})
        assert r.status_code == 200 and r.json()["old_role"] == "prefill"
        assert c.get(f"{p}/model_info").json()["disaggregation_mode"] == "decode"
        r = c.post(f"{p}/pd_role_switch", json={"new_role": "decode"})
        assert r.json()["message"] == "already in target role"
        c.post(f"{p}/pd_role_switch", json={"new_role": "prefill"})


def test_a_prompt_in_its_single_prefill_forward_counts_as_running(cluster):
    # SGLang answers /v1/loads between forward passes, so a request is never invisible to
    # it; the emulated engine answers during one, and counts what that forward prefills.
    p = cluster.engines[0].url
    import threading

    got: list[httpx.Response] = []
    with httpx.Client(timeout=30) as c:
        def load() -> dict:
            return c.get(f"{p}/v1/loads").json()["loads"][0]

        before = load()["total_prefill_uncached_tokens"]
        t = threading.Thread(target=lambda: got.append(httpx.post(f"{p}/generate", timeout=60, json={
            "input_ids": [3] * 8_000, "sampling_params": {"max_new_tokens": 1}})))  # one 8,192 chunk
        t.start()
        # Running while its forward has not yet computed its tokens (the counter moves at its end).
        _wait(lambda: (lambda x: x["num_running_reqs"] == 1 and x["total_prefill_uncached_tokens"] == before)(load()))
        t.join(30)
    assert got and got[0].status_code == 200


def test_router_worker_api_shapes(cluster):
    with httpx.Client(timeout=30) as c:
        url = cluster.engines[0].url
        _wait(lambda: c.get(f"{cluster.router.url}/workers").json()["total"] == 2)
        ws = c.get(f"{cluster.router.url}/workers").json()
        w = next(w for w in ws["workers"] if w["url"] == url)
        assert w["worker_type"] == "prefill" and "bootstrap_port" in w
        r = c.delete(f"{cluster.router.url}/workers/{w['id']}")
        assert r.status_code == 202 and r.json()["status"] == "accepted"
        _wait(lambda: all(x["url"] != url for x in c.get(f"{cluster.router.url}/workers").json()["workers"]))
        cmd = cluster.engines[0].cmd
        bport = int(cmd[cmd.index("--disaggregation-bootstrap-port") + 1])
        r = c.post(f"{cluster.router.url}/workers", json={"url": url, "worker_type": "prefill", "bootstrap_port": bport})
        assert r.status_code == 202 and r.headers["location"] == f"/workers/{r.json()['worker_id']}"
        assert c.post(f"{cluster.router.url}/workers", json={"worker_type": "prefill"}).status_code == 422
        if cluster.router_kind == "emulated":  # (the real router queues it and its job fails)
            assert c.post(f"{cluster.router.url}/workers", json={"url": url, "worker_type": "x"}).status_code == 400
        _wait(lambda: any(x["url"] == url for x in c.get(f"{cluster.router.url}/workers").json()["workers"]))
        out = c.post(f"{cluster.router.url}/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 3}})
        assert out.status_code == 200 and out.json()["meta_info"]["completion_tokens"] == 3


def test_a_worker_field_of_the_wrong_type_is_refused_at_once(cluster):
    """sglang-router deserialises POST /workers into typed fields: a wrong type is a 422
    naming the field, the emulated router alike (before, a string of labels was accepted
    and made every GET /workers a 500, a string time-out left its job 'processing')."""
    base = {"url": "http://127.0.0.1:1"}
    bad = [{"labels": "gpu=h100"}, {"health_check_timeout_secs": "soon"}, {"bootstrap_port": "abc"},
           {"bootstrap_port": 70000}, {"priority": -1}, {"cost": "x"}]
    with httpx.Client(timeout=30) as c:
        for fields in bad:
            r = c.post(f"{cluster.router.url}/workers", json=dict(base, **fields))
            assert r.status_code == 422 and list(fields)[0] in r.text, (fields, r.status_code, r.text)
        listing = c.get(f"{cluster.router.url}/workers")
        assert listing.status_code == 200 and all(w["url"] != base["url"] for w in listing.json()["workers"])
        if cluster.router_kind == "emulated":  # (the real router queues these and their jobs fail)
            for url in ("http://[::1", "http://127.0.0.1:99999"):
                r = c.post(f"{cluster.router.url}/workers", json={"url": url})
                assert r.status_code == 400 and "Invalid worker URL" in r.text, r.text


def test_a_prompt_no_rank_can_hold_is_refused_and_the_engine_serves_on():
    """SGLang refuses an input longer than what a DP rank's KV pool holds (its
    max_req_input_len); queued, it would wait at the head of the queue for good, and every
    request behind it with it."""
    port = free_port()
    p = EmulatedProcess("e", engine_command(port, "prefill", extra=["--max-total-tokens", "20000"]),
                        f"http://127.0.0.1:{port}").start()
    try:
        p.wait_healthy(20)
        with httpx.Client(timeout=30) as c:
            limit = c.get(f"{p.url}/get_server_info").json()["max_total_num_tokens"] - 1
            for body in ({"prompt_tokens": 50_000}, {"prompt_tokens": 400_000_000},
                         {"text": "0123456789abcdef <999999999 emulated tokens>"}, {"input_ids": [1] * 20_000}):
                r = c.post(f"{p.url}/generate", json=dict(body, sampling_params={"max_new_tokens": 2}))
                assert r.status_code == 400 and f"maximum allowed length ({limit} tokens)" in r.text, r.text
            ok = c.post(f"{p.url}/generate", json={"input_ids": [1] * limit, "sampling_params": {"max_new_tokens": 1}})
            assert ok.status_code == 200, ok.text
            assert c.get(f"{p.url}/v1/loads").json()["loads"][0]["num_waiting_reqs"] == 0
    finally:
        p.stop()


def test_emulation_knobs_of_the_wrong_type_or_range_change_nothing():
    port = free_port()
    p = EmulatedProcess("e", engine_command(port, "prefill"), f"http://127.0.0.1:{port}").start()
    try:
        p.wait_healthy(20)
        with httpx.Client(timeout=30) as c:
            before = c.post(f"{p.url}/_emu/config", json={}).json()
            for body in ({"speed": 0}, {"speed": "fast"}, {"speed": None}, {"switch_seconds": -1},
                         {"fail_switch": "yes"}, {"bogus": 1}):
                assert c.post(f"{p.url}/_emu/config", json=body).status_code == 422, body
            assert c.post(f"{p.url}/_emu/config", json={}).json() == before
            assert c.get(f"{p.url}/v1/loads").status_code == 200
            r = c.post(f"{p.url}/generate", json={"text": "a b", "sampling_params": {"max_new_tokens": 2}})
            assert r.status_code == 200
            assert c.post(f"{p.url}/_emu/config", json={"switch_seconds": 2}).json()["switch_seconds"] == 2
            assert c.get(f"{p.url}/_emu/kv/1", params={"timeout": "inf"}).status_code == 422
            r = c.post(f"{p.url}/pd_role_switch", json={"new_role": "decode", "decode_cuda_graph_memory_gb": "NaN"})
            assert r.status_code == 400 and "non-negative" in r.text and \
                c.get(f"{p.url}/model_info").json()["disaggregation_mode"] == "prefill"
    finally:
        p.stop()


def test_pd_pair_meets_at_the_prefill_bootstrap_port(cluster):
    """The router sends a request to a prefill and a decode engine with bootstrap_host/port/
    room; the decode engine waits for that room's prefill at the prefill's bootstrap port and
    reports the prefill's cached tokens. The second turn of a conversation hits the cache."""
    from prorsa_emulated.prefix_cache import emulated_prompt_text

    with httpx.Client(timeout=30) as c:
        _wait(lambda: c.get(f"{cluster.router.url}/workers").json()["stats"]["prefill_count"] == 1)
        metas = []
        p = cluster.engines[0].url
        for n in (4000, 4400):
            # The router answers with the decode side; the prefill side caches the prompt
            # when its KV transfer ends, a moment later: wait for it to be idle.
            _wait(lambda: c.get(f"{p}/v1/loads").json()["loads"][0]["disaggregation"]["prefill_inflight_queue_reqs"] == 0)
            body = {"rid": f"pd-{n}-{cluster.router_kind}", "sampling_params": {"max_new_tokens": 5},
                    "text": emulated_prompt_text(f"conv-{cluster.router_kind}", n)}
            r = c.post(f"{cluster.router.url}/generate", json=body)
            assert r.status_code == 200, r.text
            metas.append(r.json()["meta_info"])
        assert [m["prompt_tokens"] for m in metas] == [4000, 4400]
        assert metas[0]["cached_tokens"] == 0 and metas[1]["cached_tokens"] >= 4000 - 16
        assert [m["completion_tokens"] for m in metas] == [5, 5]
        # A decode engine asked directly with a room nobody prefills gives up as an abort
        # when the bootstrap server it names refuses the connection.
        d = cluster.engines[1].url
        r = c.post(f"{d}/generate", json={"text": "a b c", "sampling_params": {"max_new_tokens": 2},
                                           "bootstrap_host": "127.0.0.1", "bootstrap_port": free_port(),
                                           "bootstrap_room": 7})
        assert r.status_code == 200 and r.json()["meta_info"]["finish_reason"]["type"] == "abort"


def _sse_chunks(c: httpx.Client, url: str, body: dict) -> list[tuple[float, object]]:
    """(arrival time, parsed data) of each server-sent event of a streamed /generate."""
    out = []
    with c.stream("POST", url, json=body) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data:"):
                data = line[5:].strip()
                out.append((time.monotonic(), data if data == "[DONE]" else json.loads(data)))
    return out


def test_a_streamed_request_sends_its_first_chunk_when_the_first_token_exists(cluster):
    """SGLang's `stream: true` through the router in PD mode: a chunk once the decode engine
    holds the prefill's KV and first token (finish_reason null, 1 token), the full answer
    at the end, then [DONE]. The first chunk comes a decode run before the end: here 59
    decode steps of one sequence at speed 1."""
    from prorsa_emulated.prefix_cache import emulated_prompt_text
    from prorsa_emulated.profiles import emulated_profile

    with httpx.Client(timeout=60) as c:
        _wait(lambda: c.get(f"{cluster.router.url}/workers").json()["stats"]["decode_count"] == 1)
        body = {"rid": f"stream-{cluster.router_kind}", "stream": True, "sampling_params": {"max_new_tokens": 60},
                "text": emulated_prompt_text(f"stream-{cluster.router_kind}", 3000)}
        chunks = _sse_chunks(c, f"{cluster.router.url}/generate", body)
        model = c.get(f"{cluster.engines[1].url}/_emu/stats").json()["emulated_model"]
    assert [d for _t, d in chunks][-1] == "[DONE]"
    (t1, first), (t2, last) = chunks[0], chunks[-2]
    assert len(chunks) == 3, chunks
    assert first["meta_info"]["finish_reason"] is None and first["meta_info"]["completion_tokens"] == 1
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert last["meta_info"]["completion_tokens"] == 60 and last["meta_info"]["prompt_tokens"] == 3000
    profile = emulated_profile(model)
    decode_run = 59 * profile.decode_step_time(1, 3000)
    assert t2 - t1 >= 0.5 * decode_run, (t2 - t1, decode_run)


def test_health_is_503_while_starting_and_failed_switch_needs_restart():
    port = free_port()
    p = EmulatedProcess("e", engine_command(port, "prefill", extra=["--startup-seconds", "1.0", "--fail-switch",
                                                                    "--switch-seconds", "0"]),
                        f"http://127.0.0.1:{port}").start()
    try:
        _wait(lambda: _status(p.url) == 503, 20)
        p.wait_healthy(20)
        r = httpx.post(f"{p.url}/pd_role_switch", json={"new_role": "decode"})
        assert r.status_code == 400 and r.json()["safe_to_restore"] is False
        assert _status(p.url) == 503 and "restart required" in r.json()["message"]
    finally:
        p.stop()


def _status(url: str) -> int:
    try:
        return httpx.get(f"{url}/health", timeout=1).status_code
    except httpx.HTTPError:
        return 0


def test_a_failed_prefill_half_ends_the_decode_stream_with_an_error_at_once():
    """The emulated PD router relays the decode engine's stream; when the prefill half of the
    request fails (here a prefill worker that answers 503 and whose bootstrap server never
    answers), the stream ends with an error chunk at once instead of waiting with the decode
    engine for KV that never comes, and the decode engine drops the request."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    release = threading.Event()

    class Refusing(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path.startswith("/_emu/kv/"):
                release.wait(60)  # the bootstrap server: no KV ever
                self._send(200, b'{"ok": false}')
            else:
                self._send(200, b"{}")

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._send(503, b'{"error": {"message": "server is unavailable"}}')

    fake = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=fake.serve_forever, daemon=True).start()
    port = fake.server_address[1]
    c = EmulatedCluster(["decode"], speed=1.0, router_kind="emulated").start(register=True)
    try:
        with httpx.Client(timeout=60) as h:
            r = h.post(f"{c.router.url}/workers", json={"url": f"http://127.0.0.1:{port}", "worker_type": "prefill",
                                                       "bootstrap_port": port})
            assert r.status_code == 202
            _wait(lambda: h.get(f"{c.router.url}/workers").json()["stats"]["prefill_count"] == 1)
            t0 = time.monotonic()
            chunks = _sse_chunks(h, f"{c.router.url}/generate", {"text": "a b c", "stream": True,
                                                               "sampling_params": {"max_new_tokens": 4}})
            assert time.monotonic() - t0 < 20
            assert "HTTP 503" in chunks[0][1]["error"]["message"] and chunks[-1][1] == "[DONE]", chunks
            d = c.engines[0].url

            def transferring() -> int:
                loads = h.get(f"{d}/v1/loads").json()["loads"]
                return sum(x["disaggregation"]["decode_transfer_queue_reqs"] for x in loads)
            _wait(lambda: transferring() == 0)
    finally:
        release.set()
        c.stop()
        fake.shutdown()
