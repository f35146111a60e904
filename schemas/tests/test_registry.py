"""The engine registry (one fold of the engine events) and the Mutators dispatch, against
tables worked out by hand."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from prorsa_schemas import EVENT_TYPES, Event
from prorsa_schemas.fold import Mutators
from prorsa_schemas.registry import EngineRecord, EngineRegistry

_ids = itertools.count()


def ev(type_: str, ts: float, **fields) -> Event:
    return EVENT_TYPES[type_](id=f"x{next(_ids)}", ts=ts, run="r", **fields)


def reg(engine: str, role: str, ts: float = 0.0, **kw) -> Event:
    kw.setdefault("kv_capacity_tokens", 1000)
    return ev("engine.registered", ts, engine=engine, server="s1", role=role, gpus=4, **kw)


def stats(engine: str, role: str, ts: float, **kw) -> Event:
    base = {"running_reqs": 0, "queued_reqs": 0, "kv_used_tokens": 0, "kv_capacity_tokens": 1000}
    return ev("engine.stats", ts, engine=engine, role=role, **{**base, **kw})


def test_a_registered_engine_takes_its_reports_and_its_switch() -> None:
    r = EngineRegistry()
    ch = r.apply(reg("e1", "prefill", 1.0, switch_modes=["in_place"], parallel={"attn_dp": 8}))
    assert ch.problems == [] and ch.known is False and ch.role_before is None and ch.previous is None
    e = r.engines["e1"]
    assert (e.role, e.registered, e.server, e.gpus, e.kv_capacity_tokens, e.switch_modes, e.parallel.attn_dp) == (
        "prefill", True, "s1", 4, 1000, ("in_place",), 8)

    r.apply(stats("e1", "prefill", 2.0, running_reqs=2, queued_reqs=1, kv_used_tokens=300,
                  prefill_tokens_per_s=5e4, cache_hit_rate=0.5))
    # A later report leaves the rates out and says capacity 0 (unknown): the last values stand.
    ch = r.apply(stats("e1", "prefill", 3.0, running_reqs=1, kv_capacity_tokens=0))
    assert ch.known and ch.role_before == "prefill" and ch.record is e
    assert (e.running_reqs, e.queued_reqs, e.kv_used_tokens, e.kv_capacity_tokens) == (1, 0, 0, 1000)
    assert (e.prefill_tokens_per_s, e.cache_hit_rate, e.decode_tokens_per_s, e.stats_ts) == (5e4, 0.5, None, 3.0)

    assert r.apply(ev("engine.switching", 4.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode")).problems == []
    assert (e.role, e.switching_cmd, e.switching_to, e.switching_since) == ("prefill", "c1", "decode", 4.0)
    ch = r.apply(ev("engine.switched", 9.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode", seconds=5.0))
    assert ch.problems == [] and ch.role_before == "prefill"
    assert (e.role, e.switching_cmd, e.switching_to, e.switching_since, e.updated_ts) == ("decode", None, None, None, 9.0)

    r.apply(ev("engine.switching", 10.0, engine="e1", cmd="c2", from_role="decode", to_role="prefill"))
    r.apply(ev("engine.switch_failed", 11.0, engine="e1", cmd="c2", role="decode", error="not idle"))
    assert (e.role, e.switching_cmd) == ("decode", None)
    assert r.roles() == {"e1": "decode"}


def test_reports_that_do_not_follow_are_applied_and_named() -> None:
    r = EngineRegistry()
    r.apply(reg("e1", "prefill"))
    r.apply(ev("engine.switching", 1.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode"))
    ch = r.apply(ev("engine.switching", 2.0, engine="e1", cmd="c2", from_role="decode", to_role="prefill"))
    assert ch.problems == ["engine 'e1' starts switch 'c2' while 'c1' is in flight",
                           "engine 'e1' switches from decode but its role is prefill"]
    assert r.engines["e1"].switching_cmd == "c2"
    ch = r.apply(ev("engine.switched", 3.0, engine="e1", cmd="c1", from_role="prefill", to_role="decode", seconds=1.0))
    assert ch.problems == ["engine 'e1' finished switch 'c1' but 'c2' was in flight"]
    assert r.engines["e1"].role == "decode"
    # An older report after a newer one: the entry keeps the newest time it heard of.
    r.apply(stats("e1", "decode", 1.5))
    assert r.engines["e1"].updated_ts == 3.0


def test_an_unregistered_engine_gets_an_entry_from_its_reports_until_it_leaves() -> None:
    r = EngineRegistry()
    ch = r.apply(ev("engine.switching", 1.0, engine="x", cmd="c", from_role="decode", to_role="prefill"))
    assert ch.problems == ["engine.switching for engine 'x', which is not registered"]
    x = r.engines["x"]
    assert (x.role, x.registered, x.switching_to) == ("decode", False, "prefill")  # from_role: its role now
    ch = r.apply(stats("x", "prefill", 2.0, kv_capacity_tokens=0))
    assert ch.known is False and len(ch.problems) == 1 and (x.role, x.kv_capacity_tokens) == ("prefill", 0)
    ch = r.apply(ev("engine.deregistered", 3.0, engine="x", reason="gone"))
    assert ch.previous is x and ch.record is None and r.engines == {}
    # Registering later starts a proper entry.
    r.apply(stats("y", "decode", 4.0))
    ch = r.apply(reg("y", "prefill", 5.0))
    assert ch.previous is not None and ch.previous.registered is False
    assert (r.engines["y"].registered, r.engines["y"].role, r.engines["y"].stats_ts) == (True, "prefill", None)


def test_a_registry_that_keeps_only_registered_engines_ignores_the_rest() -> None:
    r = EngineRegistry(keep_unregistered=False)
    ch = r.apply(stats("x", "decode", 1.0))
    assert ch.record is None and ch.previous is None and ch.problems and r.engines == {}
    ch = r.apply(ev("engine.deregistered", 2.0, engine="x", reason="gone"))
    assert ch.record is None and ch.previous is None and ch.problems


def test_a_re_registration_starts_afresh_and_other_events_are_not_the_registry_s() -> None:
    r = EngineRegistry()
    r.apply(reg("e1", "decode", 0.0))
    r.apply(stats("e1", "decode", 1.0, running_reqs=7, decode_tokens_per_s=900.0))
    old = r.engines["e1"]
    ch = r.apply(reg("e1", "decode", 2.0, kv_capacity_tokens=2000))
    assert ch.previous is old and ch.known is True and ch.role_before == "decode"
    assert (r.engines["e1"].running_reqs, r.engines["e1"].decode_tokens_per_s, r.engines["e1"].kv_capacity_tokens) == (
        0, None, 2000)
    assert r.apply(ev("engine.command", 3.0, cmd="c", engine="e1", action="switch_role", to_role="prefill",
                       deadline=9.0)) is None
    assert r.apply(ev("policy.updated", 3.0, version=1)) is None


def test_an_entry_type_extends_the_record() -> None:
    @dataclass(slots=True)
    class Mine(EngineRecord):
        mark: int = 0

    r = EngineRegistry(entry_type=Mine)
    r.apply(reg("e1", "prefill"))
    assert isinstance(r.engines["e1"], Mine) and r.engines["e1"].mark == 0


def test_mutators_dispatch_by_type_and_refuse_unknown_or_repeated_types() -> None:
    mutate: Mutators = Mutators()
    seen: list[tuple[str, str]] = []

    @mutate.on("engine.switched", "engine.switch_failed")
    def _outcome(state: list, e: Event, tag: str) -> str:
        state.append((e.type, tag))
        return "done"

    assert mutate(seen, ev("engine.switch_failed", 1.0, engine="e", cmd="c", role="decode", error="x"), "a") == "done"
    assert mutate(seen, ev("policy.updated", 1.0, version=1), "b") is None
    assert seen == [("engine.switch_failed", "a")]
    assert mutate.types == {"engine.switched", "engine.switch_failed"} and mutate.get("policy.updated") is None
    with pytest.raises(ValueError, match="not an event type"):
        mutate.on("engine.switchd")
    with pytest.raises(ValueError, match="has a handler already"):
        mutate.on("engine.switched")
