"""A request retracted under KV pressure and re-admitted finishes exactly once, with
exactly its output tokens.

What this guards: a retracted request whose old entry stayed in the rank's lazy finish
heap would, once re-admitted (back in ``running``), look live through that stale entry
and finish early or twice in one step (on ``coding / qwen3-235b / staleness 2 / batch
512`` colocation: a ``KeyError`` in ``Rank.remove_running`` from ``_step_end``, or a
negative ``kv_used_tokens`` in ``engine.stats``); and the recompute prefill of a retracted
request would count a fresh first token. The cluster core keeps a heap entry live only if
its finish count is the request's current one, and a resumed request goes back to
decoding without a new first token.
"""

import random
from types import SimpleNamespace

from prorsa_emulated.costmodel import get_profile
from prorsa_sim.cluster import ClusterSim
from prorsa_sim.engines import Rank, Req


class Recorder(ClusterSim):
    def __init__(self, profile, roles):
        super().__init__(profile, roles)
        self.finished: list[tuple[str, int]] = []

    def _on_decode_finished(self, req, output_tokens):
        self.finished.append((req.rid, output_tokens))


def _traj(i):
    return SimpleNamespace(tid=f"t{i}", last_rank=None)


def test_a_stale_finish_entry_of_a_readmitted_request_is_ignored():
    eng = Recorder(get_profile("qwen3-235b"), ["mixed"]).engines[0]
    rank: Rank = eng.ranks[0]
    req = Req(_traj(0), "r", 100, 10)
    rank.admit_running(req, 100)  # would finish at count 10
    rank.counter = 3
    # Retracted after 3 tokens (what _make_room does), re-admitted one step later.
    gen = rank.generated(req)
    rank.remove_running(req)
    req.out_target -= gen
    req.prompt += gen
    rank.counter = 4
    rank.admit_running(req, req.prompt)  # 7 tokens left: finishes at count 11
    rank.counter = 10
    assert rank.pop_finished() == []  # the old entry (count 10) is dead
    assert rank.steps_to_next_finish() == 1
    rank.counter = 11
    assert rank.pop_finished() == [req]
    assert rank.remove_running(req) == 100 + 3 + 7
    assert rank.kv_used == 0


def test_requests_under_kv_pressure_finish_once_with_all_their_tokens():
    prof = get_profile("qwen3-235b")
    retracted = 0
    for seed in range(40):
        rnd = random.Random(seed)
        sim = Recorder(prof, ["mixed"])
        eng = sim.engines[0]
        rank = eng.ranks[0]
        rank.capacity = rnd.randint(8_000, 30_000)
        reqs = []
        while len(reqs) < rnd.randint(3, 8):
            prompt, out = rnd.randint(500, 4_000), rnd.randint(10, 3_000)
            if prompt + out <= rank.capacity:  # a request larger than the rank never fits
                reqs.append((prompt, out))
        for i, (prompt, out) in enumerate(reqs):
            sim.enqueue(rank, Req(_traj(i), f"r{i}", prompt, out))
        sim.run_until(lambda: False)
        retracted += sim.preemptions
        assert sorted(sim.finished) == sorted((f"r{i}", out) for i, (_, out) in enumerate(reqs)), seed
        # Every output token but each request's first (produced by its prefill) is one
        # decode token: a retraction neither skips nor repeats any.
        assert eng.decode_tokens_done == sum(out for _, out in reqs) - len(reqs), seed
        assert rank.kv_used == 0 and not rank.running, seed
    assert retracted >= 10  # the scenario really exercises retraction
