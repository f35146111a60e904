"""The hot path's reading of already-validated bytes gives the fold exactly what strict
validation gives it: the same states, transitions and anomalies, for every event type."""

from __future__ import annotations

import pytest

from prorsa_schemas import EVENT_TYPES, decode_event, encode_event
from prorsa_tracker.core import apply, new_state
from prorsa_tracker.examples import EventFactory, iter_workload
from prorsa_tracker.state import encode_transitions
from prorsa_tracker.validated import load_validated


def mixed_stream() -> list[bytes]:
    """A workload plus every other event type, optional fields both set and absent, and
    floats written as JSON integers."""
    f = EventFactory("r2", prefix="m")
    extra = [
        f("run.started", 0.0, mode="sync", batch_size=8, max_staleness=1, group_size=2, injection="group"),
        f("policy.updated", 1.0, version=3),
        f("engine.registered", 1.0, engine="e1", server="s1", role="prefill", gpus=4, kv_capacity_tokens=1000,
          parallel={"tp": 4}, switch_modes=["in_place"]),
        f("engine.stats", 2.0, engine="e1", role="prefill", running_reqs=2, queued_reqs=1, kv_used_tokens=300,
          kv_capacity_tokens=1000, prefill_tokens_per_s=5e4, cache_hit_rate=0.5),
        f("engine.switching", 3.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode", mode="in_place"),
        f("engine.switched", 4.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode", seconds=1.5),
        f("engine.switch_failed", 5.0, engine="e1", cmd="c2", role="decode", error="boom"),
        f("engine.deregistered", 6.0, engine="e1", reason="gone"),
        f("trajectory.dispatched", 7.0, traj="a", prompt_tokens=10),
        f("trajectory.dropped", 8.0, traj="a", reason="stale"),
        f("reward.finished", 9.0, traj="a", admitted=False),  # after the end: an anomaly
        f("allocation.plan", 9.0, t=9.0, n_prefill=1, n_decode=1, delta=0.0, feasible=True),
    ]
    raws = [encode_event(e) for e in iter_workload(3000, live=200)] + [encode_event(e) for e in extra]
    # integers where the contract has floats: strict validation makes them floats
    raws.append(b'{"v":1,"id":"int-1","type":"trajectory.dispatched","ts":12,"run":"r2","traj":"b","prompt_tokens":5}')
    raws.append(b'{"v":1,"id":"int-2","type":"engine.switched","ts":13,"run":"r2","engine":"e2","cmd":"c","from_role":"decode","to_role":"prefill","seconds":2}')
    return raws


def test_every_event_type_is_covered() -> None:
    seen = {decode_event(r).type for r in mixed_stream()}
    assert seen >= set(EVENT_TYPES) - {"forecast.window", "engine.command"}


def test_validated_reading_folds_exactly_like_strict_validation() -> None:
    a, b = new_state(), new_state()
    for raw in mixed_stream():
        _, ta, aa = apply(a, decode_event(raw))
        _, tb, ab = apply(b, load_validated(raw))
        assert encode_transitions(ta) == encode_transitions(tb)
        assert aa == ab
    assert a == b


@pytest.mark.parametrize("raw", mixed_stream()[-16:])
def test_validated_fields_equal_the_model_fields(raw: bytes) -> None:
    model, fast = decode_event(raw), load_validated(raw)
    for name in type(model).model_fields:
        got, want = getattr(fast, name), getattr(model, name)
        if name == "parallel" and want is not None:  # a nested model there, its JSON object here
            assert got == want.model_dump(exclude_none=True)
            continue
        assert got == want and type(got) is type(want), name
    assert getattr(fast, "not_a_field", "default") == "default"
