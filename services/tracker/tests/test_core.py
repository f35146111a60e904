"""The state machine of EVENTS.md: every legal and illegal transition, and the fold's state."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from prorsa_tracker.core import TrajState, apply, apply_all, new_state
from prorsa_tracker.examples import EventFactory, agentic_trajectory, workload

S = TrajState


def drive(f: EventFactory, state, traj: str, target: TrajState, t: float = 0.0):
    """Bring ``traj`` to ``target`` through legal events; returns the current ts."""
    paths = {
        S.DISPATCHED: [],
        S.SANDBOX: [("sandbox.started", {"mode": "cold"})],
        S.READY: [("sandbox.started", {"mode": "prewarm"}), ("sandbox.ready", {})],
        S.QUEUED: [("request.queued", {"req": "q0", "turn": 0, "prompt_tokens": 100})],
        S.PREFILL: [("request.queued", {"req": "q0", "turn": 0, "prompt_tokens": 100}), ("prefill.started", {"req": "q0"})],
        S.DECODE: [("request.queued", {"req": "q0", "turn": 0, "prompt_tokens": 100}), ("prefill.finished", {"req": "q0"})],
        S.TOOL: [
            ("request.queued", {"req": "q0", "turn": 0, "prompt_tokens": 100}),
            ("prefill.finished", {"req": "q0"}),
            ("decode.finished", {"req": "q0", "output_tokens": 10, "finish": "tool"}),
        ],
        S.REWARD: [
            ("request.queued", {"req": "q0", "turn": 0, "prompt_tokens": 100}),
            ("prefill.finished", {"req": "q0"}),
            ("decode.finished", {"req": "q0", "output_tokens": 10, "finish": "stop"}),
        ],
    }
    apply(state, f("trajectory.dispatched", t, traj=traj, prompt_tokens=100))
    for typ, kw in paths[target]:
        t += 1.0
        _, _, an = apply(state, f(typ, t, traj=traj, **kw))
        assert an == []
    assert state.trajectory(f.run, traj).state is target
    return t


# Every trajectory event type with the fields it needs (req q0 = the current request).
EVENTS = {
    "sandbox.started": {"mode": "prewarm"},
    "sandbox.ready": {},
    "request.queued": {"req": "q1", "turn": 1, "prompt_tokens": 150},
    "prefill.started": {"req": "q0"},
    "prefill.finished": {"req": "q0"},
    "decode.finished_tool": {"req": "q0", "output_tokens": 5, "finish": "tool"},
    "decode.finished_abort": {"req": "q0", "output_tokens": 5, "finish": "abort"},
    "decode.finished_stop": {"req": "q0", "output_tokens": 5, "finish": "stop"},
    "decode.finished_length": {"req": "q0", "output_tokens": 5, "finish": "length"},
    "tool.started": {"tool": "bash"},
    "tool.finished": {"result_tokens": 7},
    "reward.started": {},
    "reward.finished": {"admitted": True},
    "trajectory.dropped": {"reason": "stale"},
}

# (from state, event) -> to state. Everything not listed must be an anomaly.
LEGAL = {
    (S.DISPATCHED, "sandbox.started"): S.SANDBOX,
    (S.SANDBOX, "sandbox.ready"): S.READY,
    (S.DISPATCHED, "request.queued"): S.QUEUED,
    (S.READY, "request.queued"): S.QUEUED,
    (S.TOOL, "request.queued"): S.QUEUED,
    (S.DECODE, "request.queued"): S.QUEUED,
    (S.QUEUED, "prefill.started"): S.PREFILL,
    (S.QUEUED, "prefill.finished"): S.DECODE,
    (S.PREFILL, "prefill.finished"): S.DECODE,
    (S.DECODE, "decode.finished_tool"): S.TOOL,
    (S.DECODE, "decode.finished_abort"): S.READY,
    (S.DECODE, "decode.finished_stop"): S.REWARD,
    (S.DECODE, "decode.finished_length"): S.REWARD,
    (S.TOOL, "tool.started"): S.TOOL,
    (S.TOOL, "tool.finished"): S.READY,
    (S.REWARD, "reward.started"): S.REWARD,
    (S.REWARD, "reward.finished"): S.DONE,
    **{(s, "trajectory.dropped"): S.DROPPED for s in S if s.live},
}

CASES = [(s, e) for s in S if s.live for e in EVENTS]


@pytest.mark.parametrize("src,name", CASES, ids=[f"{s.value}-{e}" for s, e in CASES])
def test_every_transition_from_every_live_state(src: TrajState, name: str) -> None:
    f = EventFactory()
    state = new_state()
    t = drive(f, state, "a", src)
    before = state.trajectory("r1", "a")
    before_fields = (before.state, before.state_ts, before.context_tokens, before.turns)
    typ = name.split("_")[0] if name.startswith("decode.finished") else name
    ev = f(typ, t + 1.0, traj="a", **EVENTS[name])
    _, transitions, anomalies = apply(state, ev)
    expected = LEGAL.get((src, name))
    rs = state.runs["r1"]
    if expected is None:
        assert transitions == []
        assert len(anomalies) == 1 and anomalies[0].event_id == ev.id
        assert src.value in anomalies[0].reason or "request" in anomalies[0].reason
        tr = state.trajectory("r1", "a")
        assert (tr.state, tr.state_ts, tr.context_tokens, tr.turns) == before_fields  # untouched
        assert "a" in rs.by_state[src]
    else:
        assert anomalies == []
        assert [(t.from_state, t.to_state, t.event_id) for t in transitions] == [(src, expected, ev.id)]
        if expected.live:
            assert state.trajectory("r1", "a").state is expected
            assert "a" in rs.by_state[expected]
            assert sum("a" in v for v in rs.by_state.values()) == 1
        else:
            assert state.trajectory("r1", "a") is None  # finished ones leave memory
            assert all("a" not in v for v in rs.by_state.values())


@pytest.mark.parametrize("name", list(EVENTS))
def test_events_for_unknown_and_finished_trajectories_are_anomalies(name: str) -> None:
    f = EventFactory()
    state = new_state()
    typ = name.split("_")[0] if name.startswith("decode.finished") else name
    _, tr, an = apply(state, f(typ, 1.0, traj="ghost", **EVENTS[name]))
    assert tr == [] and "never dispatched" in an[0].reason
    drive(f, state, "b", S.REWARD)
    apply(state, f("reward.finished", 10.0, traj="b", admitted=False))
    _, tr, an = apply(state, f(typ, 11.0, traj="b", **EVENTS[name]))
    assert tr == [] and "already ended (done)" in an[0].reason


def test_dispatch_twice_and_wrong_request_are_anomalies() -> None:
    f = EventFactory()
    state = new_state()
    drive(f, state, "a", S.QUEUED)
    _, _, an = apply(state, f("trajectory.dispatched", 5.0, traj="a", prompt_tokens=1))
    assert "already live" in an[0].reason
    _, tr, an = apply(state, f("prefill.started", 5.0, traj="a", req="other"))
    assert tr == [] and "current request is 'q0'" in an[0].reason
    assert state.anomalies == 2


def test_full_lifecycle_state_samples_and_records() -> None:
    f = EventFactory()
    state = new_state()
    evs = [
        f("run.started", 0.0, mode="sync", batch_size=4, group_size=2, injection="group"),
        f("trajectory.dispatched", 1.0, traj="a", prompt_tokens=100, group="g1", policy_version=3),
        f("sandbox.started", 1.5, traj="a", mode="cold"),
        f("sandbox.ready", 4.5, traj="a"),
        f("request.queued", 5.0, traj="a", req="q0", turn=0, prompt_tokens=120, engine="p1"),
        f("prefill.started", 5.5, traj="a", req="q0"),
        f("prefill.finished", 6.0, traj="a", req="q0", cached_tokens=20, decode_engine="d1"),
        f("decode.finished", 8.0, traj="a", req="q0", output_tokens=30, finish="tool"),
        f("tool.started", 8.5, traj="a", tool="py"),
        f("tool.finished", 10.0, traj="a", result_tokens=40, ok=True),
        f("request.queued", 10.5, traj="a", req="q1", turn=1, prompt_tokens=190),
    ]
    _, trans, an = apply_all(state, evs)
    assert an == []
    rs = state.runs["r1"]
    assert (rs.config.mode, rs.config.group_size, rs.config.injection, rs.config.declared) == ("sync", 2, "group", True)
    tr = state.trajectory("r1", "a")
    assert (tr.state, tr.state_ts, tr.turns, tr.group, tr.policy_version, tr.sandbox_mode) == (S.QUEUED, 10.5, 2, "g1", 3, "cold")
    assert tr.context_tokens == 190 and tr.request.prompt_tokens == 190 and tr.request.queued_ts == 10.5
    assert list(rs.samples["sandbox_cold"]) == [3.0]
    assert list(rs.samples["startup_to_request_cold"]) == [3.5]
    assert list(rs.samples["dispatch_to_request"]) == [4.0]
    assert list(rs.samples["tool"]) == [2.0]  # entered Tool at 8.0, left at 10.0
    assert list(rs.samples["tool_exec"]) == [1.5]
    assert list(rs.samples["tool_to_request"]) == [2.5]
    assert tr.tool_ema == 2.0
    # the decode.finished transition closes request q0 with its times and lengths
    closing = [t for t in trans if t.request is not None]
    assert len(closing) == 1
    r = closing[0].request
    assert (r.req, r.queued_ts, r.prefill_started_ts, r.prefill_finished_ts, r.decode_finished_ts) == ("q0", 5.0, 5.5, 6.0, 8.0)
    assert (r.prompt_tokens, r.output_tokens, r.cached_tokens, r.engine, r.decode_engine, r.finish) == (120, 30, 20, "p1", "d1", "tool")
    assert closing[0].req == "q0" and closing[0].prompt_tokens == 120
    spans = [t.span for t in trans if t.span is not None]
    assert [(s.kind, s.start_ts, s.end_ts) for s in spans] == [("sandbox", 1.5, 4.5), ("tool", 8.5, 10.0)]
    # finish: reward
    more = [
        f("prefill.finished", 11.0, traj="a", req="q1"),
        f("decode.finished", 12.0, traj="a", req="q1", output_tokens=5, finish="length"),
        f("reward.started", 12.5, traj="a"),
        f("reward.finished", 14.0, traj="a", admitted=True, reward=0.5),
    ]
    _, trans, an = apply_all(state, more)
    assert an == [] and trans[-1].to_state is S.DONE and trans[-1].span.reward == 0.5
    assert list(rs.samples["reward"]) == [2.0]
    assert (rs.rewarded, rs.admitted, rs.done, rs.dispatched) == (1, 1, 1, 1)
    assert list(rs.admissions) == [(14.0, True)]
    assert state.live_count() == 0 and state.watermark == 14.0


def test_missing_run_started_gives_documented_defaults() -> None:
    f = EventFactory()
    state = new_state()
    apply(state, f("trajectory.dispatched", 0.0, traj="a", prompt_tokens=5))
    cfg = state.runs["r1"].config
    assert (cfg.mode, cfg.injection, cfg.group_size, cfg.declared) == ("async", "replace", 1, False)


def test_reprefill_from_decode_supersedes_request_and_drop_closes_it() -> None:
    f = EventFactory()
    state = new_state()
    t = drive(f, state, "a", S.DECODE)
    apply(state, f("policy.updated", t, version=7))
    _, tr, _ = apply(state, f("request.queued", t + 1, traj="a", req="q1", turn=0, prompt_tokens=100))
    assert tr[0].request.finish == "superseded" and tr[0].request.req == "q0"
    _, tr, _ = apply(state, f("trajectory.dropped", t + 2, traj="a", reason="stale"))
    assert tr[0].to_state is S.DROPPED and tr[0].request.finish == "dropped" and tr[0].request.req == "q1"
    rs = state.runs["r1"]
    assert rs.dropped == 1 and rs.policy_version == 7 and state.live_count() == 0


def test_duplicate_ids_are_ignored() -> None:
    f = EventFactory()
    state = new_state()
    ev = f("trajectory.dispatched", 0.0, traj="a", prompt_tokens=5)
    apply(state, ev)
    _, tr, an = apply(state, ev)
    assert (tr, an, state.duplicates, state.applied, state.anomalies) == ([], [], 1, 1, 0)
    assert state.is_duplicate(ev.id)


def test_backwards_ts_is_reported_but_applied() -> None:
    f = EventFactory()
    state = new_state()
    apply(state, f("trajectory.dispatched", 5.0, traj="a", prompt_tokens=5))
    _, tr, an = apply(state, f("request.queued", 4.0, traj="a", req="q", turn=0, prompt_tokens=5))
    assert tr[0].to_state is S.QUEUED and "earlier" in an[0].reason
    assert list(state.runs["r1"].samples["dispatch_to_request"]) == [0.0]


def test_engine_table() -> None:
    f = EventFactory()
    state = new_state()
    evs = [
        f("engine.registered", 0.0, engine="e1", server="s1", role="prefill", gpus=4, kv_capacity_tokens=1000),
        f("engine.stats", 1.0, engine="e1", role="prefill", running_reqs=2, queued_reqs=1, kv_used_tokens=300, kv_capacity_tokens=1000, prefill_tokens_per_s=5e4),
        f("engine.switching", 2.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode"),
    ]
    _, tr, an = apply_all(state, evs)
    e = state.engines["e1"]
    assert tr == [] and an == [] and e.switching_cmd == "c1" and e.running_reqs == 2 and e.prefill_tokens_per_s == 5e4
    apply(state, f("engine.switched", 3.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode", seconds=1.0))
    assert e.role == "decode" and e.switching_cmd is None
    _, _, an = apply(state, f("engine.stats", 4.0, engine="zz", role="decode", running_reqs=0, queued_reqs=0, kv_used_tokens=0, kv_capacity_tokens=1))
    assert "not registered" in an[0].reason and state.engines["zz"].kv_capacity_tokens == 1
    apply(state, f("engine.deregistered", 5.0, engine="e1", reason="bye"))
    assert "e1" not in state.engines
    _, tr, an = apply(state, f("allocation.plan", 6.0, t=6.0, n_prefill=1, n_decode=1, delta=0.0, feasible=True))
    assert (tr, an) == ([], [])


def fingerprint(state) -> dict:
    """The state as plain comparable data (sample rings as sorted multisets)."""
    out = {"watermark": state.watermark, "applied": state.applied, "anomalies": state.anomalies, "runs": {}}
    for run, rs in state.runs.items():
        out["runs"][run] = {
            "counts": (rs.dispatched, rs.rewarded, rs.admitted, rs.done, rs.dropped),
            "samples": {k: sorted(v) for k, v in rs.samples.items()},
            "admissions": sorted(rs.admissions),
            "by_state": {s: sorted(v) for s, v in rs.by_state.items()},
            "live": {k: repr(v) for k, v in sorted(rs.live.items())},
        }
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(min_value=0, max_value=2**31), st.integers(min_value=2, max_value=12))
def test_any_interleaving_of_independent_trajectories_gives_the_same_state(seed: int, n: int) -> None:
    rng = random.Random(seed)
    f = EventFactory()
    trajs = []
    for i in range(n):
        evs = agentic_trajectory(f, f"t{i}", 0.0, turns=rng.randint(1, 3), rng=random.Random(seed + i))
        cut = rng.randint(1, len(evs))  # some stay live, some finish
        trajs.append(evs[:cut] if rng.random() < 0.5 else evs)
    base = new_state()
    apply_all(base, [e for evs in trajs for e in evs])
    # a random interleaving that keeps each trajectory's own order
    queues = [list(evs) for evs in trajs]
    mixed = []
    while any(queues):
        q = rng.choice([q for q in queues if q])
        mixed.append(q.pop(0))
    other = new_state()
    apply_all(other, mixed)
    assert fingerprint(other) == fingerprint(base)


def test_finished_trajectories_leave_memory() -> None:
    state = new_state()
    _, _, an = apply_all(state, workload(300, turns=2))
    assert an == []
    rs = state.runs["r1"]
    assert rs.done == 300 and rs.live == {} and all(not v for v in rs.by_state.values())
