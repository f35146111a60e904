"""Every event type round-trips, and every rule of EVENTS.md rejects a violating event."""

from __future__ import annotations

import json

import pytest

from prorsa_schemas import EVENT_TYPES, EventError, decode_event, encode_event, event_from_dict

from .samples import FULL, OPTIONAL, event, minimal


def test_samples_cover_every_type() -> None:
    assert set(FULL) == set(EVENT_TYPES)


@pytest.mark.parametrize("kind", sorted(FULL))
def test_round_trip_full(kind: str) -> None:
    raw = json.dumps(event(kind)).encode()
    ev = decode_event(raw)
    assert ev.type == kind
    again = decode_event(encode_event(ev))
    assert again == ev
    assert json.loads(encode_event(ev)) == {**event(kind)}


@pytest.mark.parametrize("kind", sorted(FULL))
def test_round_trip_minimal_keeps_unset_fields_out(kind: str) -> None:
    obj = minimal(kind)
    ev = event_from_dict(obj)
    assert json.loads(encode_event(ev)) == obj


@pytest.mark.parametrize("kind", sorted(FULL))
def test_models_are_frozen(kind: str) -> None:
    ev = event_from_dict(event(kind))
    with pytest.raises(Exception):
        ev.ts = 1.0  # type: ignore[misc]


def _reject(obj: dict, field: str) -> EventError:
    with pytest.raises(EventError) as info:
        decode_event(json.dumps(obj))
    err = info.value
    assert f"field '{field}" in err.reason, err.reason
    return err


# (event type, field, bad value) for every constraint the contract states.
VIOLATIONS = [
    # envelope
    ("policy.updated", "v", 2),
    ("policy.updated", "v", "1"),
    ("policy.updated", "id", ""),
    ("policy.updated", "id", "x" * 129),
    ("policy.updated", "id", "tab\there"),
    ("policy.updated", "id", 7),
    ("policy.updated", "ts", -0.001),
    ("policy.updated", "ts", "12"),
    ("policy.updated", "run", ""),
    ("policy.updated", "run", "has space"),
    ("policy.updated", "run", "slash/no"),
    ("policy.updated", "run", "r" * 129),
    # token counts: ints in 0..10,000,000
    ("trajectory.dispatched", "prompt_tokens", -1),
    ("trajectory.dispatched", "prompt_tokens", 10_000_001),
    ("trajectory.dispatched", "prompt_tokens", 1.5),
    ("trajectory.dispatched", "prompt_tokens", "812"),
    ("request.queued", "prompt_tokens", -5),
    ("prefill.finished", "cached_tokens", 10_000_001),
    ("decode.finished", "output_tokens", -1),
    ("tool.finished", "result_tokens", -1),
    ("run.started", "prompt_tokens_mean", -1),
    ("engine.registered", "kv_capacity_tokens", -1),
    # enums
    ("run.started", "mode", "semi"),
    ("run.started", "injection", "append"),
    ("sandbox.started", "mode", "warm"),
    ("decode.finished", "finish", "eos"),
    ("trajectory.dropped", "reason", "timeout"),
    ("engine.registered", "role", "both"),
    ("engine.registered", "switch_modes", ["hot"]),
    ("engine.switching", "to_role", "encoder"),
    ("engine.command", "action", "restart"),
    ("engine.command", "to_role", "mixed"),
    ("allocation.plan", "feasible", "yes"),
    # ints with bounds
    ("run.started", "batch_size", 0),
    ("run.started", "max_staleness", -1),
    ("run.started", "group_size", 0),
    ("request.queued", "turn", -1),
    ("request.queued", "dp_rank", -1),
    ("request.queued", "dp_rank", 4096),
    ("request.queued", "dp_rank", 1.0),
    ("request.queued", "dp_rank", "3"),
    ("tool.started", "calls", 0),
    # booleans are strict
    ("reward.finished", "admitted", 1),
    ("tool.finished", "ok", "true"),
    # ids on other fields
    ("request.queued", "traj", ""),
    ("request.queued", "req", "r" * 129),
    ("engine.stats", "engine", "\x00"),
]


@pytest.mark.parametrize(("kind", "field", "bad"), VIOLATIONS)
def test_rule_violation_names_the_field(kind: str, field: str, bad: object) -> None:
    _reject(event(kind, **{field: bad}), field)


@pytest.mark.parametrize("kind", sorted(FULL))
def test_every_required_field_is_required(kind: str) -> None:
    required = set(FULL[kind]) - OPTIONAL.get(kind, set())
    for name in sorted(required | {"v", "id", "ts", "run"}):
        obj = event(kind)
        obj.pop(name)
        err = _reject(obj, name)
        assert "missing" in err.reason


def test_missing_v_is_an_error_on_the_wire_only() -> None:
    obj = event("request.queued")
    obj.pop("v")
    for decode in (lambda: decode_event(json.dumps(obj)), lambda: event_from_dict(obj)):
        with pytest.raises(EventError) as info:
            decode()
        assert info.value.reason.startswith("field 'v': is required but missing"), info.value.reason
    # reported together with the event's other violations
    with pytest.raises(EventError) as info:
        decode_event(json.dumps({**obj, "turn": -1}))
    assert [v.field for v in info.value.violations] == ["v", "turn"]
    # an event built in Python gets v=1, and it is encoded
    ev = EVENT_TYPES["policy.updated"](id="p", ts=1.0, run="r", version=2)
    assert json.loads(encode_event(ev))["v"] == 1


def test_unknown_type_and_unknown_field_and_garbage() -> None:
    with pytest.raises(EventError, match="'type'.*not a known event type"):
        decode_event(json.dumps(event("policy.updated", type="policy.exploded")))
    with pytest.raises(EventError, match="'type'.*missing"):
        obj = event("policy.updated")
        obj.pop("type")
        decode_event(json.dumps(obj))
    # A field the type does not name is not an error (EVENTS.md): kept, and written back.
    ev = decode_event(json.dumps(event("policy.updated", colour="red")))
    assert ev.model_extra == {"colour": "red"}
    assert json.loads(encode_event(ev))["colour"] == "red"
    # ... and reported in the strict validation mode, nested ones by their path.
    with pytest.raises(EventError, match="'colour'.*not a field"):
        decode_event(json.dumps(event("policy.updated", colour="red")), strict_fields=True)
    with pytest.raises(EventError, match="not valid JSON"):
        decode_event(b"\xff\xfe{not json")
    with pytest.raises(EventError, match="JSON object"):
        decode_event(b"[1, 2, 3]")
    with pytest.raises(EventError, match="not valid JSON"):
        decode_event(b"")


@pytest.mark.parametrize("bad", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_ts_must_be_finite(bad: str) -> None:
    raw = json.dumps(event("policy.updated")).replace('"ts": 12.5', f'"ts": {bad}')
    with pytest.raises(EventError) as info:
        decode_event(raw)
    assert "'ts'" in info.value.reason


def test_error_carries_field_value_rule() -> None:
    with pytest.raises(EventError) as info:
        decode_event(json.dumps(event("request.queued", turn=-3)))
    (v,) = info.value.violations
    assert (v.field, v.value) == ("turn", -3)
    assert ">= 0" in v.rule or "greater than or equal" in v.rule
