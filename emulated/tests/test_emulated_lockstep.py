"""The emulated engine's ranks run in lock-step, as the simulator's (``engines._plan``):
hand-computed step times on a two-rank profile with round constants, on the scheduler
directly and through the engine's asyncio loop."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from prorsa_emulated.costmodel import PREFILL_FLOPS_PER_GPU, ModelProfile
from prorsa_emulated.engine import EmulatedEngine
from prorsa_emulated.options import EngineOptions
from prorsa_emulated.prefix_cache import synthetic_keys
from prorsa_emulated.scheduler import Rank, Req, plan_step, steps_done

# Two attention DP ranks of one GPU each, constants picked so the arithmetic is easy:
#   prefill_time(n, ctx) = 0.02 + n * 1e-4                  (no attention term)
#   decode_step_time(b, kv) = 0.01 (weights) + 0.005 (comm) + b * 0.001   (no KV term)
#   extend penalty = 10 layers * 0.0002 + (0.02 - 0.005) = 0.017
TWO = ModelProfile(
    name="two-rank-test", gpus_per_engine=2, attn_dp=2, attn_tp=1, ep=2, chunk_size=512,
    kv_bytes_per_token=1000,
    weight_gb_per_gpu=0.01 * 4.8e12 * 0.6 / 1e9,  # 28.8 GB at 2.88 TB/s effective = 10 ms
    active_params=PREFILL_FLOPS_PER_GPU * 1e-4 / 2,  # 1e-4 s per prefill token
    prefill_fixed_s=0.02, attn_flops_per_pair=0.0, decode_comm_s=0.005,
    decode_s_per_seq=0.001, kv_read_bytes_per_token=0, in_place_switch_s=1.0,
    restart_switch_s=10.0, layers=10, eager_launch_s_per_layer=0.0002,
)


def test_the_profile_arithmetic():
    assert TWO.prefill_time(512) == pytest.approx(0.0712)
    assert TWO.decode_step_time(1, 500) == pytest.approx(0.016)
    assert TWO.decode_step_time(1, 500, extend=True) == pytest.approx(0.033)


def _req(rid: str, prompt: int, max_new: int, completion: int = 0) -> Req:
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
    finally:
        loop.close()
    return Req(rid, synthetic_keys(rid, prompt), lambda n: synthetic_keys(rid, prompt + n), prompt,
               max_new, fut, completion=completion)


def _decoding(rank: Rank, req: Req) -> None:
    """Put ``req`` on ``rank`` as if it had been prefilled there."""
    assert rank.reserve(req, req.prompt_tokens + req.completion)
    req.phase = "running"
    rank.running.append(req)


def _ranks(n: int = 2) -> list[Rank]:
    return [Rank(i, 100_000, 64) for i in range(n)]


def test_a_prefill_chunk_on_one_rank_stalls_the_decoding_rank():
    r0, r1 = _ranks()
    r0.waiting.append(_req("p", 1000, 10))
    dec = _req("d", 500, 50, completion=5)
    _decoding(r1, dec)
    step = plan_step([r0, r1], TWO, TWO.chunk_size, "null", 0.0)
    kinds = {rank.index: plan.kind for rank, plan in step.plans}
    assert kinds == {0: "prefill", 1: "decode"} and step.any_prefill and step.k == 1
    # rank 0: 0.02 + 512 x 1e-4 = 0.0712 s; rank 1 decodes one sequence in an extend
    # step: 0.015 + 0.001 + 0.017 = 0.033 s. The engine step is the slower: 0.0712 s.
    times = {rank.index: plan.seconds for rank, plan in step.plans}
    assert times[0] == pytest.approx(0.0712) and times[1] == pytest.approx(0.033)
    assert step.dt == pytest.approx(0.0712)


def test_a_big_decode_batch_is_the_slower_rank():
    r0, r1 = _ranks()
    r0.waiting.append(_req("p", 1000, 10))
    for i in range(50):
        _decoding(r1, _req(f"d{i}", 100, 50, completion=1))
    step = plan_step([r0, r1], TWO, TWO.chunk_size, "null", 0.0)
    # rank 1: 0.015 + 50 x 0.001 + 0.017 = 0.082 s > rank 0's 0.0712 s.
    assert step.dt == pytest.approx(0.082)


def test_decode_only_ranks_run_a_macro_step_of_the_slowest_rank():
    r0, r1 = _ranks()
    _decoding(r0, _req("a", 500, 30, completion=10))  # 20 tokens left
    for i in range(4):
        _decoding(r1, _req(f"b{i}", 500, 100, completion=1))
    step = plan_step([r0, r1], TWO, TWO.chunk_size, "null", 0.0)
    # No prefill: no extend penalty; k = the first request to finish (20 steps); the step
    # is rank 1's 0.015 + 4 x 0.001 = 0.019 s (rank 0: 0.016 s).
    assert not step.any_prefill and step.k == 20
    assert step.dt == pytest.approx(0.019)
    # A new arrival 0.1 s in cuts the run after the step under way: 0.1 / 0.019 -> 6 steps.
    assert steps_done(step, 0.1) == 6


def test_a_prefill_rank_holds_its_decode_batch_prefill_first():
    (r0,) = _ranks(1)
    _decoding(r0, _req("d", 500, 50, completion=5))
    r0.waiting.append(_req("p", 300, 10))
    step = plan_step([r0], TWO, TWO.chunk_size, "null", 0.0)
    ((_, plan),) = step.plans
    assert plan.kind == "prefill" and not plan.decode
    assert step.dt == pytest.approx(0.02 + 300 * 1e-4)


async def _serve(eng: EmulatedEngine, rid: str, prompt: int, max_new: int) -> dict:
    keys = synthetic_keys(rid, prompt)
    return await eng.generate(rid, keys, lambda n: synthetic_keys(rid, prompt + n), prompt, max_new)


def _engine(speed: float) -> EmulatedEngine:
    eng = EmulatedEngine(EngineOptions(speed=speed))
    eng.profile = TWO
    eng.chunk = TWO.chunk_size
    eng.ranks = [Rank(i, 100_000, 64) for i in range(TWO.attn_dp)]
    return eng


def test_the_engine_loop_makes_the_decoder_wait_for_the_other_ranks_prefill():
    """Over the asyncio loop: a 10-token decode alone takes 1 prefill step + 9 decode steps;
    with a 5120-token prompt prefilling on the other rank, its 9 decode steps run in lock-step
    with 9 chunks of 0.0712 s."""

    async def run() -> tuple[dict, dict]:
        eng = _engine(speed=1.0)
        alone = await _serve(eng, "a", 100, 10)
        eng2 = _engine(speed=1.0)
        # Both are queued before the loop's first plan (the loop task starts after them);
        # the rank choice (least loaded) puts them on different ranks.
        dec = asyncio.create_task(_serve(eng2, "d", 100, 10))
        long = asyncio.create_task(_serve(eng2, "p", 5120, 1))
        return alone, (await asyncio.gather(dec, long))[0]

    alone, contended = asyncio.run(run())
    first = 0.02 + 100 * 1e-4  # the prompt's own prefill step: 0.03 s
    assert alone["meta_info"]["completion_tokens"] == 10
    # alone: 0.03 + 9 decode steps of 0.016 s (one macro-step) = 0.174 s
    assert alone["meta_info"]["e2e_latency"] == pytest.approx(first + 9 * 0.016, abs=0.02)
    # contended: rank 1's first step is the prefill of "d" in lock-step with the first chunk
    # of "p" (0.0712 s), then 9 decode steps each stalled by one of p's 10 chunks.
    assert contended["meta_info"]["e2e_latency"] == pytest.approx(10 * 0.0712, abs=0.03)


def test_profile_fields_are_the_simulators():
    # The emulated engine steps with the simulator's own cost functions.
    assert dataclasses.is_dataclass(TWO) and hasattr(TWO, "engine_step_time")


def test_a_decode_rank_admits_with_room_kept_for_its_batch_and_resumes_a_retracted_request_first():
    # SGLang's decode prealloc keeps RESERVED_DECODE_TOKENS (512) free for each request
    # held, the new one included. A 10,000-token rank decoding a 6,000-token request
    # does not take a 3,000-token one (6,000 + 3,000 + 2 x 512 > 10,000); an empty rank
    # takes it.
    from prorsa_emulated.costmodel import RESERVED_DECODE_TOKENS

    assert RESERVED_DECODE_TOKENS == 512
    rank = Rank(0, 10_000, 64)
    _decoding(rank, _req("a", 6_000, 100, completion=1))
    rank.prealloc.append(_req("b", 3_000, 50))
    rank._admit_decode()
    assert [r.rid for r in rank.prealloc] == ["b"] and rank.transfer == []
    rank.remove(rank.running[0])
    rank._admit_decode()
    assert [r.rid for r in rank.transfer] == ["b"]
    # A retracted request resumes (prompt + what it made, with its room) before the
    # prealloc queue is served.
    rank = Rank(0, 10_000, 64)
    parked = _req("p", 2_000, 500, completion=100)
    parked.phase = "retracted"
    rank.retracted.append(parked)
    rank.prealloc.append(_req("c", 1_000, 50))
    rank._admit_decode()
    assert [r.rid for r in rank.running] == ["p"]
    assert [r.rid for r in rank.transfer] == ["c"]  # 2,100 + 1,000 + 2 x 512 <= 10,000
    assert rank.private == 2_100 + 1_000
