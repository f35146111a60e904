"""Decode engines' engine.stats carry ``decode_tokens_per_s`` as an engine agent publishes
it (the sum over attention-DP ranks of SGLang's ``gen_throughput``), so the allocator's
decode step model is learned in the simulator as it is live."""

from types import SimpleNamespace

import pytest

from prorsa_emulated.costmodel import get_profile
from prorsa_sim.cluster import ClusterSim
from prorsa_sim.engines import Req
from prorsa_sim.policies import ProrsaPolicy
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator

PROF = get_profile("mimo-v2.5-pro")  # 2 attention-DP ranks per engine


def test_the_rate_is_every_ranks_tokens_over_the_engines_step():
    sim = ClusterSim(PROF, ["decode"])
    (eng,) = sim.engines
    r0, r1 = eng.ranks
    # Rank 0 decodes 3 sequences of 1,000 prompt tokens, rank 1 one of 2,000; each has 10
    # tokens to make, so the first segment is 10 steps and ends with all of them.
    for i, (rank, prompt) in enumerate([(r0, 1_000)] * 3 + [(r1, 2_000)]):
        req = Req(SimpleNamespace(tid=f"t{i}", last_rank=None), f"r{i}", prompt, 10)
        req.out_done = 1
        rank.admit_running(req, prompt)
    assert eng.gen_throughput == 0.0
    sim.kick(eng)
    sim.run_until(lambda: eng.decode_tokens_done > 0)
    assert eng.decode_tokens_done == 40
    # The ranks step together: each step takes the slower rank's time (KV mid-segment:
    # prompt + 5 tokens per sequence), and makes one token per sequence on every rank.
    step = max(PROF.decode_step_time(3, 3 * 1_000 + 3 * 5), PROF.decode_step_time(1, 2_000 + 5))
    assert eng.gen_throughput == pytest.approx(4 / step)
    # Idle, the gauge holds (SGLang updates it only when it decodes).
    sim.run_until(lambda: not eng.stepping)
    assert eng.gen_throughput == pytest.approx(4 / step)


def test_decode_engines_report_their_rate_and_the_allocator_fits_its_step_model():
    policy = ProrsaPolicy()
    events = []
    sink = SimpleNamespace(write=events.append)
    res = Simulator(SimConfig(workload="general", staleness=2, steps=2, batch_size=48), policy, sink=sink).run()
    assert res.summary["trajectories_done"] > 0
    stats = [e for e in events if e.type == "engine.stats"]
    assert all(e.decode_tokens_per_s is None for e in stats if e.role == "prefill")
    assert any(e.decode_tokens_per_s and e.running_reqs for e in stats if e.role == "decode")
    fit = policy.driver.allocator.decode_step
    assert fit.samples > fit.min_samples
