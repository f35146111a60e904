"""``POST /pause_generation`` in its three modes on the emulated SGLang server (SGLang's
scheduler: no batch runs while paused; ``abort`` aborts, ``retract`` frees the KV of what
runs, ``in_place`` keeps it), over real HTTP."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from prorsa_emulated.cluster import EmulatedProcess, engine_command, free_port
from prorsa_runtime.testing import wait_until

SPEED = 50.0


@pytest.fixture()
def mixed():
    port = free_port()
    p = EmulatedProcess("m", engine_command(port, "null", speed=SPEED), f"http://127.0.0.1:{port}").start()
    try:
        p.wait_healthy(20)
        yield p.url
    finally:
        p.stop()


def _loads(c: httpx.Client, url: str) -> dict:
    rows = c.get(f"{url}/v1/loads").json()["loads"]
    return {k: sum(r[k] for r in rows) for k in ("num_running_reqs", "num_waiting_reqs", "num_used_tokens")}


def _decoding(c: httpx.Client, url: str, n: int) -> tuple[list[threading.Thread], list[dict]]:
    """``n`` requests of a 4k prompt and 20k output tokens (minutes of emulated decode), sent
    and decoding."""
    answers: list[dict] = []

    def send(i: int) -> None:
        r = httpx.post(f"{url}/generate", timeout=120, json={
            "input_ids": [i + 1] * 4096, "sampling_params": {"max_new_tokens": 20_000}})
        answers.append(r.json()["meta_info"])

    threads = [threading.Thread(target=send, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    wait_until(lambda: _loads(c, url)["num_running_reqs"] == n and _loads(c, url)["num_used_tokens"] > n * 4200)
    return threads, answers


def test_in_place_holds_every_request_and_its_kv_until_generation_continues(mixed):
    with httpx.Client(timeout=30) as c:
        threads, answers = _decoding(c, mixed, 3)
        assert c.post(f"{mixed}/pause_generation", json={"mode": "in_place"}).status_code == 200
        assert c.get(f"{mixed}/ready").status_code == 503
        held = _loads(c, mixed)
        # 0.4 s of wall time is 20 s of the engine's: hundreds of decode steps, were it running.
        time.sleep(0.4)
        assert _loads(c, mixed) == held and held["num_running_reqs"] == 3
        # A request sent while paused waits in the queue.
        late = threading.Thread(target=lambda: answers.append(httpx.post(f"{mixed}/generate", timeout=120, json={
            "input_ids": [9] * 512, "sampling_params": {"max_new_tokens": 4}}).json()["meta_info"]))
        late.start()
        wait_until(lambda: _loads(c, mixed)["num_waiting_reqs"] == 1)
        # SGLang flushes the cache only when the engine holds nothing.
        assert c.post(f"{mixed}/flush_cache").status_code != 200
        assert c.post(f"{mixed}/continue_generation", json={}).status_code == 200
        assert c.get(f"{mixed}/ready").status_code == 200
        for t in threads + [late]:
            t.join(120)
    assert sorted(a["finish_reason"]["type"] for a in answers) == ["length"] * 4
    assert sorted(a["completion_tokens"] for a in answers) == [4, 20_000, 20_000, 20_000]


def test_retract_frees_the_kv_and_the_requests_re_prefill_when_generation_continues(mixed):
    with httpx.Client(timeout=30) as c:
        threads, answers = _decoding(c, mixed, 2)
        assert c.post(f"{mixed}/pause_generation", json={"mode": "retract"}).status_code == 200
        after = _loads(c, mixed)
        assert after["num_running_reqs"] == 0 and after["num_waiting_reqs"] == 2
        # The KV they held is freed (the decode run under way hands its reservation back
        # when it stops at its next step boundary).
        wait_until(lambda: _loads(c, mixed)["num_used_tokens"] == 0)
        assert c.post(f"{mixed}/continue_generation", json={}).status_code == 200
        wait_until(lambda: _loads(c, mixed)["num_running_reqs"] == 2)
        for t in threads:
            t.join(120)
    assert [a["finish_reason"]["type"] for a in answers] == ["length", "length"]
    assert [a["completion_tokens"] for a in answers] == [20_000, 20_000]
    # Their prompts stayed in the radix cache: the re-prefill found all of each 4096-token
    # prompt but the last token, which SGLang always computes.
    assert [a["cached_tokens"] for a in answers] == [4095, 4095]


def test_abort_ends_every_request_and_a_bad_mode_is_refused(mixed):
    with httpx.Client(timeout=30) as c:
        threads, answers = _decoding(c, mixed, 2)
        assert c.post(f"{mixed}/pause_generation", json={"mode": "rewind"}).status_code == 422
        assert _loads(c, mixed)["num_running_reqs"] == 2  # the refusal changed nothing
        assert c.post(f"{mixed}/pause_generation", json={}).status_code == 200  # abort, SGLang's default
        for t in threads:
            t.join(60)
        assert [a["finish_reason"]["type"] for a in answers] == ["abort", "abort"]
        assert c.post(f"{mixed}/flush_cache").status_code == 200
        assert c.post(f"{mixed}/continue_generation", json={}).status_code == 200


def test_a_pause_on_an_engine_that_has_served_nothing_answers_at_once(mixed):
    # Its scheduler loop starts with the first request: there is no step to wait for.
    with httpx.Client(timeout=5) as c:
        for mode in ("in_place", "retract", "abort"):
            assert c.post(f"{mixed}/pause_generation", json={"mode": mode}).status_code == 200
            assert c.get(f"{mixed}/ready").status_code == 503
            assert c.post(f"{mixed}/continue_generation", json={}).status_code == 200
