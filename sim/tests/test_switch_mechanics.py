"""Role-switch mechanics, hand-computed on small clusters (docs/simulator.md, "Role
switches"): a draining engine takes no new work and re-queues what it has not started at
once; what it runs finishes up to the drain deadline, then is aborted and re-queued with
its partial output; a switch during the weight-update pause needs no drain; the prefix
cache a flip loses is counted."""

import math
from types import SimpleNamespace

import pytest

from prorsa_emulated.costmodel import RESERVED_DECODE_TOKENS, get_profile
from prorsa_sim.cluster import ClusterSim
from prorsa_sim.switching import DRAIN_DEADLINE_S
from prorsa_sim.engines import Req
from prorsa_sim.catalog import make_policy
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.policies.schedule import RecordedPolicy
from prorsa_sim.simulator import Simulator
from prorsa_sim.policy import SwitchRequest
from prorsa_sim.policies.bound import BoundPolicy

PROF = get_profile("mimo-v2.5-pro")  # 2 attention-DP ranks per engine, 4096-token chunks
SWITCH_S = PROF.in_place_switch_s


def _traj(i):
    return SimpleNamespace(tid=f"t{i}", last_rank=None)


class Recorder(ClusterSim):
    """A bare cluster whose hooks record what happened, and re-queue an aborted request
    as the rollout side does: its partial output joins the prompt, the rest is still to
    generate."""

    def __init__(self, roles):
        super().__init__(PROF, roles)
        self.log = []
        self.requeued: dict[str, Req] = {}

    def _on_prefill_finished(self, req, eng, decode_eng):
        self.log.append(("prefill_finished", req.rid, eng.name, decode_eng.name if decode_eng else None, self.now))

    def _on_decode_finished(self, req, output_tokens):
        self.log.append(("decode_finished", req.rid, req.rank.engine.name, self.now, output_tokens))

    def _on_aborted(self, req, gen_total, requeue):
        req.alive = False
        self.log.append(("aborted", req.rid, self.now, gen_total))
        new = Req(req.traj, req.rid + "+", req.prompt + gen_total, max(1, req.out_done + req.out_target - gen_total))
        self.requeued[req.rid] = new
        self.route_prefill(new)

    def _on_switched(self, eng, sw):
        self.log.append(("switched", eng.name, sw["to"], self.now))

    def events(self, kind):
        return [e for e in self.log if e[0] == kind]


def _run_decoding(sim, rank, rid, prompt, out_target, traj=None):
    """``rid`` decodes on ``rank`` (its prefill already produced its first token)."""
    req = Req(traj or _traj(0), rid, prompt, out_target)
    req.out_done = 1
    rank.admit_running(req, prompt)
    sim.kick(rank.engine)
    return req


def _transferred(sim, rank, rid, prompt, out_target, i):
    """A request whose prefill made its first token, its KV shipped to ``rank``."""
    req = Req(_traj(i), rid, prompt, out_target)
    req.out_done = 1
    sim._ship(req, rank)
    return req


def test_a_draining_decode_engine_admits_no_pending_request_and_requeues_it_at_once():
    sim = Recorder(["prefill", "decode", "decode"])
    pf, d1, d2 = sim.engines
    rank = d1.ranks[0]
    # d1's rank 0 is KV-full: a running request holds it, a transferred one waits for space.
    rank.capacity = 12_000
    _run_decoding(sim, rank, "running", 10_000, 40)
    _transferred(sim, rank, "pending", 5_000, 30, 1)
    sim.run_until(lambda: bool(rank.pending))
    t0 = sim.now
    assert rank.pending and not sim.events("aborted")
    # And a transfer still in flight to d1.
    _transferred(sim, d1.ranks[1], "inflight", 3_000, 20, 2)

    assert sim.request_switch(d1, "prefill", "in_place", "c1")
    # Both are aborted and re-queued at once; the prefill engine re-prefills them.
    assert [(e[1], e[2], e[3]) for e in sim.events("aborted")] == [("pending", t0, 1), ("inflight", t0, 1)]
    assert not rank.pending and not sim._inflight
    assert [q.rid for q in pf.ranks[0].waiting] + [q.rid for q in pf.ranks[1].waiting] == ["pending+", "inflight+"]
    assert sim.requeued["pending"].prompt == 5_001  # the first token joins the context
    assert sim.drain_aborts == 2 and sim.drain_deadline_aborts == 0
    assert sim.drain_requeued_tokens == 5_001 + 3_001
    sim.run_until(lambda: False)
    # Re-prefilled, they decode on the other decode engine; d1 never admitted them.
    done = {e[1]: e[2] for e in sim.events("decode_finished")}
    assert done == {"running": "e001", "pending+": "e002", "inflight+": "e002"}
    assert rank.waiting_tokens == 0 and d1.ranks[1].waiting_tokens == 0
    assert d1.role == "prefill" and sim.switches == 1


def test_b_running_decodes_that_finish_before_the_deadline_switch_at_drain_end_plus_switch_time():
    sim = Recorder(["prefill", "decode", "decode"])
    d1 = sim.engines[1]
    _run_decoding(sim, d1.ranks[0], "r", 1_000, 50)
    assert sim.request_switch(d1, "prefill", "in_place", "c1")
    # One macro-step of 50 decode steps (nothing else on the engine), KV at its midpoint.
    drain_end = 50 * PROF.decode_step_time(1, 1_000 + 25)
    assert drain_end < DRAIN_DEADLINE_S
    sim.run_until(lambda: False)
    assert sim.events("decode_finished") == [("decode_finished", "r", "e001", pytest.approx(drain_end), 1 + 50)]
    assert sim.events("switched") == [("switched", "e001", "prefill", pytest.approx(drain_end + SWITCH_S))]
    log = sim.switch_log[0]
    assert log["drain_s"] == pytest.approx(drain_end, abs=1e-3)
    assert log["switch_s"] == pytest.approx(SWITCH_S, abs=1e-3)
    assert log["drain_aborts"] == 0 and sim.drain_aborts == 0 and not log["in_pause"]


def test_c_a_decode_still_running_at_the_deadline_is_requeued_with_its_partial_output():
    sim = Recorder(["prefill", "decode", "decode"])
    d1 = sim.engines[1]
    _run_decoding(sim, d1.ranks[0], "long", 1_000, 100_000)
    assert sim.request_switch(d1, "prefill", "in_place", "c1")
    sim.run_until(lambda: bool(sim.events("aborted")))
    # A macro-step of 512 steps (MAX_MACRO_STEPS) is under way at the deadline; the steps
    # completed by then are kept.
    step = PROF.decode_step_time(1, 1_000 + 256)
    assert 512 * step > DRAIN_DEADLINE_S
    gen = math.floor(DRAIN_DEADLINE_S / step)
    assert sim.events("aborted") == [("aborted", "long", DRAIN_DEADLINE_S, 1 + gen)]
    new = sim.requeued["long"]
    assert new.prompt == 1_000 + 1 + gen  # the context grows by the generated tokens
    assert new.out_target == 100_000 - gen  # and the rest is still to generate
    assert sim.drain_deadline_aborts == 1 and sim.drain_aborted_decode_tokens == 1 + gen
    assert sim.drain_requeued_tokens == 1_000 + 1 + gen
    sim.run_until(lambda: bool(sim.events("switched")))
    assert sim.now == pytest.approx(DRAIN_DEADLINE_S + SWITCH_S)
    assert sim.switch_log[0]["drain_s"] == pytest.approx(DRAIN_DEADLINE_S)
    assert sim.switch_log[0]["drain_aborts"] == 1


class _PauseSwitch(Simulator):
    """Requests a switch of e001 (prefill -> decode) at the first weight-update pause."""

    asked_at = None

    def _policy_update(self):
        super()._policy_update()
        if self.asked_at is None and self.paused:
            self.asked_at = self.now
            self.request_switch(self.engines[1], "decode", "in_place", "c1")
            self.at(self.now + self.cfg.weight_sync_s, self._check_after_resume)

    def _check_after_resume(self):
        # The pause (5 s) is over but the switch (15 s) is not: the engine stays out.
        self.resumed_while_switching = not self.engines[1].available and self.engines[1].switch is not None


def test_d_a_switch_during_the_weight_update_pause_needs_no_drain():
    cfg = SimConfig(workload="math", model="mimo-v2.5-pro", total_gpus=48, staleness=0, steps=2, batch_size=8)
    sim = _PauseSwitch(cfg, make_policy("static:2:1"))
    res = sim.run()
    assert sim.asked_at is not None and sim.resumed_while_switching
    assert res.summary["switch_log"] == [{
        "t": round(sim.asked_at + SWITCH_S, 3), "engine": "e001", "from": "prefill", "to": "decode",
        "mode": "in_place", "requested_t": round(sim.asked_at, 3), "drain_s": 0.0, "switch_s": SWITCH_S,
        "in_pause": True, "drain_aborts": 0, "cache_lost_tokens": 0,  # the update flushed it already
    }]
    assert res.summary["drain_aborts"] == 0 and res.summary["final_roles"] == {"prefill": 1, "decode": 2, "mixed": 0}
    assert res.summary["cache_flushed_at_update_tokens"] > 0


def test_d_an_engine_draining_when_the_pause_starts_switches_at_once():
    cfg = SimConfig(workload="math", model="mimo-v2.5-pro", total_gpus=48, staleness=0, steps=1, batch_size=1)
    sim = Simulator(cfg, make_policy("static:1:2"))
    d = sim.engines[2]
    # A request of no live trajectory (the rollout side ignores its abort).
    _run_decoding(sim, d.ranks[0], "long", 1_000, 100_000, SimpleNamespace(tid="x", last_rank=None, alive=False))
    assert sim.request_switch(d, "prefill", "in_place", "c1")
    sim.at(3.0, sim._policy_update)
    sim.run_until(lambda: sim.switches >= 1)
    assert sim.now == pytest.approx(3.0 + SWITCH_S)
    log = sim.switch_log[0]
    assert (log["drain_s"], log["switch_s"], log["in_pause"]) == (3.0, SWITCH_S, True)
    # Its request was aborted by the weight update, not by the drain.
    assert sim.drain_aborts == 0 and log["drain_aborts"] == 0


def test_e_cache_lost_tokens_is_the_prefix_cache_held_at_the_flip():
    sim = Recorder(["prefill", "prefill", "decode"])
    p0, p1, _ = sim.engines
    p0.ranks[0].cache_put("old-a", 3_000)
    p0.ranks[1].cache_put("old-b", 2_000)
    # p0 prefills an 8192-token prompt (two chunks) with another one queued behind it.
    sim.enqueue(p0.ranks[0], Req(_traj(1), "first", 8_192, 4))
    sim.enqueue(p0.ranks[0], Req(_traj(2), "second", 2_000, 4))
    assert [q.started for q in p0.ranks[0].waiting] == [True, False]
    assert sim.request_switch(p0, "decode", "in_place", "c1")
    # The queued prompt moves at once, with no abort; the started one finishes here.
    assert [q.rid for q in p1.ranks[0].waiting] + [q.rid for q in p1.ranks[1].waiting] == ["second"]
    assert sim.drain_rerouted_reqs == 1 and sim.drain_aborts == 0
    sim.run_until(lambda: False)
    assert [e[1:3] for e in sim.events("prefill_finished")] == [("second", "e001"), ("first", "e000")]
    # At the flip p0 held the two old prefixes and the first prompt it just finished.
    assert sim.cache_lost_tokens == 3_000 + 2_000 + 8_192
    assert sim.switch_log[0]["cache_lost_tokens"] == 3_000 + 2_000 + 8_192
    assert sim.cache_flushed_at_update_tokens == 0
    assert p0.role == "decode" and all(r.cache_tokens == 0 for r in p0.ranks)


class _EnqueueLog(Simulator):
    """Records where each request is queued for prefill, and whether the cluster was paused
    for a weight update then."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.queued: list[tuple[bool, str, float]] = []
        self.update_aborts = 0

    def enqueue(self, rank, req):
        self.queued.append((self.paused, rank.engine.name, self.now))
        super().enqueue(rank, req)

    def _on_aborted(self, req, gen_total, requeue):
        if self.paused:
            self.update_aborts += 1
        super()._on_aborted(req, gen_total, requeue)


@pytest.mark.parametrize("router", ["queue", "smg"])
def test_f_the_weight_update_stops_every_engine_before_it_aborts_any(router):
    """A prefill engine listed after a decode engine (e002, switched to prefill at t = 10 s)
    takes none of the decodes the update aborts on e001 while the others are paused: every
    request the update re-queues waits for the resume, then goes where the router sends it
    with every engine back (before, e002 was still taking work when e001's decodes were
    aborted and got all of them)."""
    cfg = SimConfig(workload="math", model="mimo-v2.5-pro", total_gpus=48, staleness=2, steps=2,
                    batch_size=16, router_policy=router, dp_routing="prefix")
    sim = _EnqueueLog(cfg, RecordedPolicy(1, [[10.0, "e002", "prefill", "in_place"]]))
    res = sim.run()
    assert res.summary["switch_log"][0]["engine"] == "e002" and res.summary["final_roles"]["prefill"] == 2
    assert sim.update_aborts > 0  # the update found decodes running on e001
    assert [name for paused, name, _ in sim.queued if paused] == []
    resumes = {round(t + cfg.weight_sync_s, 6) for t in sim.update_times[1:]}
    at_resume = [name for _, name, t in sim.queued if round(t, 6) in resumes]
    assert len(at_resume) >= sim.update_aborts and set(at_resume) <= {"e000", "e002"}


class _SwitchAtFirstUpdate:
    """A policy asked at each weight update (``on_update``): it moves e001 to decode at
    the first one, and nothing at any window."""

    name, wants_future = "switch-at-update", False

    def __init__(self) -> None:
        self.asked: list[tuple[float, list]] = []

    def initial_roles(self, profile, n_engines):
        return ["prefill", "prefill", "decode"]

    def on_window(self, obs):
        return []

    def on_update(self, obs):
        busy = [v.engine for v in obs.engines if v.running_reqs or v.queued_reqs]
        self.asked.append((obs.t, busy))
        if len(self.asked) > 1:
            return []
        assert obs.events[-1].type == "policy.updated" and obs.events[-1].ts == round(obs.t, 6)
        return [SwitchRequest("e001", "decode", "in_place")]


def test_d_a_policy_is_asked_at_the_update_with_the_engines_empty_and_its_replay_is_the_run():
    # The simulator asks a policy with on_update at every weight update, once the engines
    # are paused and emptied (as the allocator service decides at policy.updated); the
    # switch it asks for then needs no drain. RecordedPolicy gives its requests back at
    # the update, so the bound's replay of the run is the run.
    cfg = SimConfig(workload="math", model="mimo-v2.5-pro", total_gpus=48, staleness=0, steps=3, batch_size=8)
    pol = _SwitchAtFirstUpdate()
    sim = Simulator(cfg, pol)
    res = sim.run()
    # 3 sync steps, 2 updates: asked at each (on_update checks the update is the newest event).
    assert len(pol.asked) == 2 and all(busy == [] for _, busy in pol.asked)
    first = pol.asked[0][0]
    log = res.summary["switch_log"]
    assert len(log) == 1 and log[0]["requested_t"] == pytest.approx(first, abs=1e-3)
    assert (log[0]["drain_s"], log[0]["in_pause"], log[0]["drain_aborts"]) == (0.0, True, 0)
    assert res.summary["switch_requests"] == [[first, "e001", "decode", "in_place"]]
    replay = Simulator(cfg, RecordedPolicy(2, res.summary["switch_requests"])).run()
    assert replay.summary["rollout_time_s"] == res.summary["rollout_time_s"]
    assert replay.summary["switch_log"] == log
    # The bound answering with that run (a seed it was handed) replays it through itself.
    bound = BoundPolicy()
    bound.schedule, bound._replay = [2], RecordedPolicy(2, res.summary["switch_requests"], name="bound")
    again = Simulator(cfg, bound).run()
    assert again.summary["rollout_time_s"] == res.summary["rollout_time_s"] and again.summary["switch_log"] == log


_ASKED_AT: list[float] = []  # module-level: shared by a policy and its deep copies


class _CountsUpdates(_SwitchAtFirstUpdate):
    def on_update(self, obs):
        _ASKED_AT.append(obs.t)
        return []


def test_d_the_oracles_look_ahead_asks_no_policy_at_an_update():
    # peek_future runs a copy of the simulation with no policy calls: an update inside
    # its horizon is not handed to the copy's policy (the original asks its own later).
    cfg = SimConfig(workload="math", model="mimo-v2.5-pro", total_gpus=48, staleness=0, steps=2, batch_size=8)
    _ASKED_AT.clear()
    Simulator(cfg, _CountsUpdates()).run()
    (update,) = _ASKED_AT  # 2 sync steps: one update
    _ASKED_AT.clear()
    sim = Simulator(cfg, _CountsUpdates())
    sim.begin()
    sim.at(update - 5.0, lambda: None)  # a stop 5 s before the update
    sim.run_until(lambda: sim.now >= update - 5.0)
    t0 = sim.now
    assert t0 == update - 5.0
    sim.peek_future(cfg.window_s)  # the copy runs past the update
    assert _ASKED_AT == [] and sim.now == t0
    sim.run_until(lambda: sim.done)
    assert _ASKED_AT == [update]


def _retract_at(sim, eng, t):
    """At ``t``: the weight-update pause in ``retract`` mode on ``eng`` (stop it, take the
    KV of what it runs back), then generation continues at once."""
    def go():
        sim.settle(eng)
        sim.retract_engine(eng)
        sim.kick(eng)
    sim.at(t, go)


def test_g_a_retract_pause_re_prefills_a_mixed_ranks_decode_from_its_cached_prompt():
    sim = Recorder(["mixed"])
    eng = sim.engines[0]
    rank = eng.ranks[0]
    req = _run_decoding(sim, rank, "r", 1_000, 100)
    # One macro-step of 100 decode steps; 2 s into it, the pause retracts the request.
    step = PROF.decode_step_time(1, 1_000 + 50)
    gen = math.floor(2.0 / step)
    assert 0 < gen < 100
    _retract_at(sim, eng, 2.0)
    sim.run_until(lambda: sim.now >= 2.0)
    # First in line again, its context grown by what it generated; its prompt stayed in
    # the radix cache (the output's KV was freed), so the re-prefill begun at once
    # computes only what it generated.
    assert list(rank.waiting) == [req] and not rank.running and req.resumed
    assert (req.prompt, req.out_done, req.out_target) == (1_000 + gen, 1 + gen, 100 - gen)
    assert (req.cached, req.pf_left) == (1_000, gen) and sim.update_retractions == 1
    sim.run_until(lambda: False)
    # It re-prefills only what it generated, with no event, and ends with every token.
    assert eng.prefill_tokens_done == gen
    assert sim.events("aborted") == [] and sim.events("prefill_finished") == []
    assert [(e[1], e[4]) for e in sim.events("decode_finished")] == [("r", 1 + 100)]
    assert rank.kv_used == 0 and rank.waiting_tokens == 0


def test_g_a_retract_pause_keeps_the_chunks_a_prefill_made_and_a_decode_engines_batch():
    sim = Recorder(["prefill", "decode"])
    pf, dec = sim.engines
    rank = pf.ranks[0]
    req = Req(_traj(1), "p", 10_000, 20)
    sim.enqueue(rank, req)
    sim.kick(pf)
    running = _run_decoding(sim, dec.ranks[0], "d", 1_000, 50, traj=_traj(2))
    # After the first 4,096-token chunk, the pause retracts the prefill under way.
    sim.run_until(lambda: req.pf_ctx > 0)
    assert req.pf_ctx == PROF.chunk_size
    sim.settle(pf)
    sim.settle(dec)
    sim.retract_engine(pf)
    sim.retract_engine(dec)
    assert list(rank.waiting) == [req] and not req.started
    assert rank.inuse_prefill == 0 and rank.waiting_tokens == 10_000
    assert rank.cache_peek("t1") == PROF.chunk_size
    assert list(dec.ranks[0].running) == [running]  # offloaded and reloaded: kept
    sim.kick(pf)
    sim.kick(dec)
    sim.run_until(lambda: False)
    # The chunk made before the pause is a cache hit: 10,000 tokens computed in all.
    assert pf.prefill_tokens_done == 10_000
    assert sim.update_retractions == 0 and sim.events("aborted") == []
    assert sorted((e[1], e[4]) for e in sim.events("decode_finished")) == [("d", 1 + 50), ("p", 20)]


def test_h_a_decode_rank_admits_with_room_kept_for_its_batch():
    # SGLang's decode prealloc keeps RESERVED_DECODE_TOKENS (512) free for each request
    # it holds, the new one included. A rank of 10,000 tokens decoding a 6,000-token
    # request does not take a 3,000-token one (6,000 + 3,000 + 2 x 512 > 10,000) until
    # the first ends, though both prompts would fit.
    sim = Recorder(["prefill", "decode"])
    dec = sim.engines[1]
    rank = dec.ranks[0]
    rank.capacity = 10_000
    _run_decoding(sim, rank, "a", 6_000, 300)
    b = _transferred(sim, rank, "b", 3_000, 50, 1)
    sim.run_until(lambda: bool(rank.pending))
    assert list(rank.pending) == [b] and RESERVED_DECODE_TOKENS == 512
    sim.run_until(lambda: False)
    done = [(e[1], e[3]) for e in sim.events("decode_finished")]
    assert [d[0] for d in done] == ["a", "b"] and sim.preemptions == 0
    admitted_b = done[1][1] - 50 * PROF.decode_step_time(1, 3_000 + 25)  # one macro-step of its 50
    assert admitted_b == pytest.approx(done[0][1], abs=1e-6)  # b began as a ended


def test_h_a_decode_rank_out_of_kv_offloads_its_newest_request_and_resumes_it():
    # Two requests on a 10,000-token decode rank, admitted at once: 4,000 + 3,000 output
    # and 2,000 + 4,000. Their KV grows two tokens a step and fills the rank after 2,000
    # steps: the newer one is retracted, its KV offloaded (SGLang's decode swaps, it does
    # not re-prefill), and it resumes, with the 2,000 tokens it made, once it fits.
    sim = Recorder(["prefill", "decode"])
    pf, dec = sim.engines
    rank = dec.ranks[0]
    rank.capacity = 10_000
    _run_decoding(sim, rank, "a", 4_000, 3_000)
    b = _run_decoding(sim, rank, "b", 2_000, 4_000, traj=_traj(1))
    sim.run_until(lambda: sim.preemptions > 0)
    assert list(rank.pending) == [b] and list(rank.running) != [b]
    assert (b.prompt, b.out_done, b.out_target) == (2_000 + 2_000, 1 + 2_000, 4_000 - 2_000)
    sim.run_until(lambda: False)
    assert sim.events("aborted") == [] and sim.preemptions == 1
    assert [(e[1], e[4]) for e in sim.events("decode_finished")] == [("a", 1 + 3_000), ("b", 1 + 4_000)]
    # Every token decoded once, nothing prefilled again.
    assert dec.decode_tokens_done == 3_000 + 4_000 and pf.prefill_tokens_done == 0
    assert rank.kv_used == 0 and rank.waiting_tokens == 0
