"""The cost model's behaviour: DP-rank interference, KV preemption, PD transfer time."""

from types import SimpleNamespace

import pytest

from prorsa_sim.engines import Req
from prorsa_emulated.costmodel import PROFILES, get_profile
from prorsa_sim.cluster import ClusterSim


def _traj(i):
    return SimpleNamespace(tid=f"t{i}", last_rank=None)


class Recorder(ClusterSim):
    """A bare cluster whose hooks record what happened and when."""

    def __init__(self, profile, roles):
        super().__init__(profile, roles)
        self.log = []

    def _on_prefill_finished(self, req, eng, decode_eng):
        self.log.append(("prefill_finished", req.rid, self.now))

    def _on_decode_finished(self, req, output_tokens):
        self.log.append(("decode_finished", req.rid, self.now, output_tokens))

    def _on_aborted(self, req, gen_total, requeue):
        self.log.append(("aborted", req.rid, self.now))


def test_profiles_are_the_papers_layouts():
    assert get_profile("deepseek-v3.2").attn_dp == 16 and get_profile("deepseek-v3.2").chunk_size == 512
    assert get_profile("qwen3-235b").gpus_per_engine == 4 and get_profile("qwen3-235b").attn_dp == 2
    assert get_profile("mimo-v2.5-pro").attn_tp == 8 and get_profile("mimo-v2.5-pro").chunk_size == 4096
    for p in PROFILES.values():
        assert p.engines_in(128) * p.gpus_per_engine == 128
        assert p.kv_capacity_per_rank > 100_000
        assert p.prefill_time(p.chunk_size, 30_000) > p.prefill_time(p.chunk_size, 0) > 0
        assert p.decode_step_time(64, 2_000_000) > p.decode_step_time(64, 100_000) > 0
        assert p.switch_time("restart") > 10 * p.switch_time("in_place")
    with pytest.raises(ValueError, match="choose one of"):
        get_profile("gpt-9")


def test_one_prefill_chunk_stalls_every_decoding_rank_in_colocation():
    prof = get_profile("deepseek-v3.2")
    sim = Recorder(prof, ["mixed"])
    eng = sim.engines[0]
    # Every rank decodes a batch of 8 sequences of 10k tokens...
    for rank in eng.ranks:
        for j in range(8):
            rank.admit_running(Req(_traj(f"{rank.idx}-{j}"), f"d{rank.idx}-{j}", 10_000, 1000), 10_000)
    # ...and rank 0 gets a 512-token prompt to prefill.
    req = Req(_traj("p"), "p", 512, 100)
    sim.enqueue(eng.ranks[0], req)
    assert eng.seg_kind == "prefill"
    # While rank 0 prefills, the decoding ranks run the extend step's eager path.
    decode_t = prof.decode_step_time(8, 8 * 10_000, extend=True)
    prefill_t = prof.prefill_time(512, 0)
    assert eng.seg_dt == pytest.approx(prefill_t)
    sim.run_until(lambda: any(e[0] == "prefill_finished" for e in sim.log))
    # The 15 decoding ranks waited (prefill - decode) each; rank 0 was busy throughout.
    assert eng.wait_s == pytest.approx(15 * (prefill_t - decode_t))
    assert eng.busy_s == pytest.approx(prefill_t + 15 * decode_t)
    assert eng.wait_s / (eng.wait_s + eng.busy_s) > 0.3


def test_decode_only_engine_has_no_sync_wait_when_balanced():
    sim = Recorder(get_profile("deepseek-v3.2"), ["decode"])
    eng = sim.engines[0]
    for rank in eng.ranks:
        rank.admit_running(Req(_traj(rank.idx), f"d{rank.idx}", 5_000, 200), 5_000)
    sim.kick(eng)
    sim.run_until(lambda: False)
    assert len([e for e in sim.log if e[0] == "decode_finished"]) == 16
    assert eng.wait_s == pytest.approx(0.0, abs=1e-9)
    assert all(e[3] == 200 for e in sim.log)


def test_kv_exhaustion_preempts_and_the_request_still_finishes():
    prof = get_profile("qwen3-235b")
    sim = Recorder(prof, ["mixed"])
    rank = sim.engines[0].ranks[0]
    rank.capacity = 25_000
    for j in range(2):
        sim.enqueue(rank, Req(_traj(j), f"r{j}", 10_000, 4_000))
    sim.run_until(lambda: False)
    assert sim.preemptions >= 1
    finished = sorted(e[1] for e in sim.log if e[0] == "decode_finished")
    assert finished == ["r0", "r1"]
    assert all(e[3] == 4_000 for e in sim.log if e[0] == "decode_finished")


def test_pd_adds_kv_transfer_time_between_prefill_and_decode():
    prof = get_profile("deepseek-v3.2")
    times = {}
    for roles in (["mixed"], ["prefill", "decode"]):
        sim = Recorder(prof, roles)
        sim.route_prefill(Req(_traj(0), "r", 4_000, 2))
        sim.run_until(lambda: False)
        pf = next(e[2] for e in sim.log if e[0] == "prefill_finished")
        dec = next(e[2] for e in sim.log if e[0] == "decode_finished")
        times[roles[0]] = dec - pf
    # One more decode step in both; PD also waits for the KV transfer.
    assert times["prefill"] - times["mixed"] == pytest.approx(prof.kv_transfer_time(4_000), rel=0.05)
    assert prof.kv_transfer_time(4_000) > prof.kv_transfer_time(400) > 0


def test_extend_step_penalty_is_eager_launches_plus_normal_mode_all_to_all():
    prof = get_profile("deepseek-v3.2")
    # Hand-computed from the profile's sources: 61 layers x 0.2 ms of eager launches, plus
    # the normal-mode all-to-all (20 ms) in place of the low-latency one (58 x 313 us).
    low_latency = 58 * (118e-6 + 195e-6)
    assert prof.decode_comm_s == pytest.approx(0.018154)
    assert prof.extend_step_penalty_s == pytest.approx(61 * 0.0002 + (0.020 - low_latency))
    assert prof.decode_step_time(8, 80_000, extend=True) == pytest.approx(
        prof.decode_step_time(8, 80_000) + 0.014046, abs=1e-6)
    # An engine without attention DP never mixes modes within a step.
    plain = get_profile("qwen3-235b").__class__(**{**get_profile("qwen3-235b").__dict__, "attn_dp": 1})
    assert plain.extend_step_penalty_s == 0.0
    # The engine step is the slowest rank's (lock-step).
    assert prof.engine_step_time([0.03, 0.0985, 0.0537]) == 0.0985
    assert prof.engine_step_time([]) == 0.0


def test_decode_only_step_is_not_penalised_and_a_mixed_step_is():
    prof = get_profile("deepseek-v3.2")
    sim = Recorder(prof, ["mixed"])
    eng = sim.engines[0]
    for rank in eng.ranks[:2]:
        rank.admit_running(Req(_traj(f"{rank.idx}"), f"d{rank.idx}", 1_000, 50), 1_000)
    sim.kick(eng)
    # Decode only: the plain (CUDA-graph) step time.
    assert eng.seg_kind == "decode"
    assert eng.seg_dt == pytest.approx(prof.decode_step_time(1, 1_000 + eng.seg_k // 2))
    # A prompt arrives on rank 5: the next step is an extend step for everyone.
    sim.enqueue(eng.ranks[5], Req(_traj("p"), "p", 200, 10))
    sim.run_until(lambda: eng.seg_kind == "prefill")
    expected = max(prof.prefill_time(200, 0), prof.decode_step_time(1, eng.ranks[0].kv_used, extend=True))
    assert eng.seg_dt == pytest.approx(expected)
