"""The emulated engine's scheduler over real HTTP: continuous batching, chunked prefill, KV
capacity with waiting requests, prefix cache, PD transfer, and the cost-model profile."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from prorsa_emulated import EmulatedCluster, emulated_profile
from prorsa_emulated.cluster import EmulatedProcess, engine_command, free_port
from prorsa_emulated.prefix_cache import emulated_prompt_text
from prorsa_emulated.profiles import prefill_seconds

SMALL = emulated_profile("qwen3-8b")


def _engine(*extra: str, role: str = "null", speed: float = 10.0) -> EmulatedProcess:
    port = free_port()
    return EmulatedProcess("e", engine_command(port, role, speed=speed, extra=list(extra)),
                           f"http://127.0.0.1:{port}").start().wait_healthy(30)


def _gen(url: str, **body) -> dict:
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _many(url: str, bodies: list[dict]) -> list[dict]:
    with cf.ThreadPoolExecutor(len(bodies)) as ex:
        return list(ex.map(lambda b: _gen(url, **b), bodies))


def _load(url: str) -> dict:
    return httpx.get(f"{url}/v1/loads", timeout=5).json()["loads"][0]


@pytest.fixture(scope="module")
def engine():
    p = _engine()
    yield p
    p.stop()


def test_decode_steps_are_shared_by_the_batch(engine):
    alone = _gen(engine.url, prompt_tokens=500, sampling_params={"max_new_tokens": 300})
    batch = _many(engine.url, [dict(prompt_tokens=500, sampling_params={"max_new_tokens": 300})] * 24)
    assert all(m["completion_tokens"] == 300 for m in batch)
    mean = sum(m["e2e_latency"] for m in batch) / len(batch)
    # Bigger batch and more KV -> slower steps; but the steps are shared, not serialised.
    assert mean > alone["e2e_latency"] * 1.05
    assert mean < alone["e2e_latency"] * 4


def test_prefix_cache_hits_on_the_next_turn_and_flush_empties_it(engine):
    t1 = _gen(engine.url, prompt_tokens=2000, emulated_prefix_id="conv-a", sampling_params={"max_new_tokens": 50})
    assert t1["cached_tokens"] == 0
    t2 = _gen(engine.url, prompt_tokens=2300, emulated_prefix_id="conv-a", sampling_params={"max_new_tokens": 5})
    assert t2["cached_tokens"] == 2048  # prompt + output of turn 1 in full 16-token pages
    other = _gen(engine.url, prompt_tokens=2300, emulated_prefix_id="conv-b", sampling_params={"max_new_tokens": 5})
    assert other["cached_tokens"] == 0
    ids = list(range(1000, 1700))
    first = httpx.post(f"{engine.url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 20}},
                       timeout=60).json()
    again = _gen(engine.url, input_ids=ids + first["output_ids"] + [7] * 100, sampling_params={"max_new_tokens": 1})
    assert again["cached_tokens"] == 720  # 700 prompt + 20 output ids = 45 pages
    assert _load(engine.url)["cache_hit_rate"] > 0
    assert httpx.post(f"{engine.url}/flush_cache", timeout=5).status_code == 200
    t3 = _gen(engine.url, prompt_tokens=2300, emulated_prefix_id="conv-a", sampling_params={"max_new_tokens": 1})
    assert t3["cached_tokens"] == 0


def test_long_prompt_is_prefilled_in_chunks():
    p = _engine("--chunked-prefill-size", "4096", speed=1.0)
    try:
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_gen, p.url, prompt_tokens=20_000, sampling_params={"max_new_tokens": 1})
            seen = set()
            while not fut.done():
                seen.add(_load(p.url)["total_prefill_uncached_tokens"])
                time.sleep(0.01)
            meta = fut.result()
        assert {4096, 8192, 12288, 16384} & seen  # progress visible chunk by chunk
        # The chunks cost what the cost model says for them, one after another.
        want = prefill_seconds(SMALL.__class__(**{**SMALL.__dict__, "chunk_size": 4096}), 20_000)
        assert meta["e2e_latency"] >= want * 0.95
        # SGLang's cumulative prefill counters: every prompt token computed, over the time
        # spent in the steps that prefilled (in wall microseconds).
        load = _load(p.url)
        assert load["total_prefill_uncached_tokens"] == 20_000
        assert want * 0.95 <= load["total_prefill_busy_us"] / 1e6 <= meta["e2e_latency"] + 0.05
    finally:
        p.stop()


def test_full_kv_makes_requests_wait_and_loads_report_it():
    p = _engine("--max-total-tokens", "3000", speed=5.0)
    try:
        with cf.ThreadPoolExecutor(1) as ex:
            fut = ex.submit(_many, p.url, [dict(prompt_tokens=1000, sampling_params={"max_new_tokens": 300})] * 4)
            peak_wait, peak_used = 0, 0
            while not fut.done():
                ld = _load(p.url)
                peak_wait = max(peak_wait, ld["num_waiting_reqs"])
                peak_used = max(peak_used, ld["num_used_tokens"])
                assert ld["num_used_tokens"] <= 3000 and ld["token_usage"] <= 1.0
                time.sleep(0.01)
            metas = fut.result()
        assert peak_wait >= 1 and peak_used > 2000
        # everyone finished in full (retracted requests re-prefill and go on) ...
        assert all(m["completion_tokens"] == 300 for m in metas)
        # ... and the last one queued for KV.
        assert max(m["queue_time"] for m in metas) > 0.5
        ld = _load(p.url)
        assert ld["num_running_reqs"] == 0 and ld["num_used_tokens"] == 0
    finally:
        p.stop()


def test_pd_decode_waits_for_the_peers_real_prefill_and_the_transfer():
    # Speed 1: the short request must reach the prefill engine before the long prompt's last
    # chunk (2.35 s of emulated prefill), even on a busy machine.
    with EmulatedCluster(["prefill", "decode"], speed=1.0).start(register=True) as c:
        router = c.router.url
        deadline = time.monotonic() + 20
        while httpx.get(f"{router}/workers").json()["total"] < 2:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Through the real router: prompts known by length travel as text (it drops other fields).
        long = dict(text=emulated_prompt_text("long", 40_000), sampling_params={"max_new_tokens": 2})
        short = dict(text=emulated_prompt_text("short", 100), sampling_params={"max_new_tokens": 2})
        with cf.ThreadPoolExecutor(2) as ex:
            f_long = ex.submit(_gen, router, **long)
            # wait (by polling, not by sleeping) until the long prompt occupies the prefill engine
            prefill_url = c.engines[0].url
            deadline = time.monotonic() + 20
            while _load(prefill_url)["num_running_reqs"] + _load(prefill_url)["num_waiting_reqs"] < 1:
                assert time.monotonic() < deadline, "the long prompt never reached the prefill engine"
                time.sleep(0.01)
            f_short = ex.submit(_gen, router, **short)
            m_long, m_short = f_long.result(), f_short.result()
        assert m_long["completion_tokens"] == 2 and m_short["completion_tokens"] == 2
        min_long = prefill_seconds(SMALL, 40_000) + SMALL.kv_transfer_time(40_000)
        assert m_long["e2e_latency"] >= min_long * 0.95
        # The short request queued behind the long prefill on the prefill engine; a decode
        # engine that only estimated its own prefill would have answered in ~50 ms.
        assert m_short["e2e_latency"] > 0.5
        turn2 = _gen(router, text=emulated_prompt_text("t", 200), sampling_params={"max_new_tokens": 1})
        # The router answers with the decode side; the prefill side caches the prompt when
        # its KV transfer ends, a moment later.
        deadline = time.monotonic() + 20
        while _load(prefill_url)["disaggregation"]["prefill_inflight_queue_reqs"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        turn2b = _gen(router, text=emulated_prompt_text("t", 300), sampling_params={"max_new_tokens": 1})
        assert turn2["cached_tokens"] == 0 and turn2b["cached_tokens"] == 192  # prefill side caches the prompt
        d = httpx.get(f"{c.engines[1].url}/v1/loads").json()["loads"][0]["disaggregation"]
        assert d["mode"] == "decode" and d["decode_transfer_queue_reqs"] == 0


def test_emulated_model_selects_the_profile_and_bad_names_are_refused():
    p = _engine("--emulated-model", "deepseek-v3.2", role="prefill")
    try:
        prof = emulated_profile("deepseek-v3.2")
        info = httpx.get(f"{p.url}/server_info").json()
        assert info["emulated_model"] == "deepseek-v3.2"
        assert info["max_total_num_tokens"] == prof.kv_capacity_tokens
        loads = httpx.get(f"{p.url}/v1/loads").json()["loads"]
        assert [l["dp_rank"] for l in loads] == list(range(prof.attn_dp))
        assert httpx.get(f"{p.url}/v1/loads?dp_rank=99").status_code == 400
    finally:
        p.stop()
    port = free_port()
    bad = EmulatedProcess("bad", engine_command(port, extra=["--emulated-model", "gpt-9"]),
                          f"http://127.0.0.1:{port}").start()
    assert bad.proc.wait(30) != 0


def test_running_requests_per_rank_as_sglang_resolves_them():
    from prorsa_emulated.engine import EmulatedEngine, max_running_per_rank
    from prorsa_emulated.options import EngineOptions

    # Not given: SGLang's floor of 2048 a data-parallel worker, at most half its KV tokens.
    assert max_running_per_rank(None, 1_270_699, 16) == 2048
    assert max_running_per_rank(None, 3000, 1) == 1500
    # Given: split over the ranks, still at most half the KV tokens, at least one.
    assert max_running_per_rank(256, 1_270_699, 16) == 16
    assert max_running_per_rank(64, 100, 2) == 32
    assert max_running_per_rank(64, 40, 2) == 20
    assert max_running_per_rank(8, 1_000_000, 16) == 1
    eng = EmulatedEngine(EngineOptions(emulated_model="deepseek-v3.2"))
    assert {r.max_running for r in eng.ranks} == {2048} and len(eng.ranks) == 16
    eng = EmulatedEngine(EngineOptions(emulated_model="deepseek-v3.2", max_running_requests=256))
    assert {r.max_running for r in eng.ranks} == {16}
