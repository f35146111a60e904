"""The allocator's Prometheus metrics, scraped over real HTTP from the running registry."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from prorsa_allocator.metrics import allocator_registry
from prorsa_allocator.planner import Allocator
from prorsa_allocator.service import ServiceState
from prorsa_allocator.testing import THETA, forecast, registered, switched
from prorsa_allocator.config import AllocatorConfig
from prorsa_runtime.metrics import serve_metrics
from prorsa_schemas import AllocationPlan, EngineCommand


def _config(**kw) -> AllocatorConfig:
    """The config these tests use: the warm-up's evidence rule (``served_evidence_first``,
    tested in test_pricing.py) off, so a first forecast is acted on as the rule under test says."""
    return AllocatorConfig(**{"prefill_tokens_per_s": THETA, "served_evidence_first": False, **kw})


def _scrape(port: int) -> dict[str, list]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_plan_switches_in_flight_and_durations_are_exported() -> None:
    alloc = Allocator(_config())
    state = ServiceState(alloc)
    for i in range(4):
        alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered(f"d{i}", "decode"))
    out = alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
    state.plans += [e for e in out if isinstance(e, AllocationPlan)]
    c1, c2 = [e for e in out if isinstance(e, EngineCommand)]
    alloc.handle(switched(c1.engine, c1.cmd, "decode", "prefill", ts=72.0, seconds=12.0))
    server = serve_metrics(allocator_registry(state), 0, state.health, host="127.0.0.1")
    try:
        m = _scrape(server.server_address[1])
    finally:
        server.shutdown()
    assert dict((lab["role"], v) for lab, v in m["prorsa_allocator_plan_engines"]) == {"prefill": 6, "decode": 1}
    assert m["prorsa_allocator_commands_in_flight"] == [({}, 1.0)]
    # The one still in flight, aged in event time (commanded at 60, now 72).
    assert m["prorsa_allocator_switch_in_flight_seconds"] == [({"engine": c2.engine, "to_role": "prefill"}, 12.0)]
    assert m["prorsa_allocator_switch_attempts"] == [({"engine": c2.engine, "to_role": "prefill"}, 1.0)]
    # The completed one in the duration histogram: 12 s lands in the 15 s bucket, not the 5 s one.
    buckets = {lab["le"]: v for lab, v in m["prorsa_allocator_switch_duration_seconds_bucket"]}
    assert buckets["5.0"] == 0 and buckets["15.0"] == 1 and buckets["+Inf"] == 1
    assert m["prorsa_allocator_switch_duration_seconds_sum"] == [({"mode": "in_place"}, 12.0)]
    assert m["prorsa_allocator_prefill_tokens_per_s"] == [({}, THETA)]
    assert m["prorsa_allocator_event_time_seconds"] == [({}, 72.0)]
    assert m["prorsa_allocator_switched_total"] == [({}, 1.0)]
    # No run.started yet: the 'auto' objective is the capacity ratio.
    assert dict((lab["objective"], v) for lab, v in m["prorsa_allocator_objective"]) == {
        "capacity": 1.0, "turn_latency": 0.0, "saturation": 0.0}


def test_the_objective_in_force_follows_a_sync_run() -> None:
    from prometheus_client import generate_latest

    from prorsa_schemas import RunStarted

    alloc = Allocator(_config())
    alloc.handle(RunStarted(id="rs-1", ts=1.0, run="r1", mode="sync", batch_size=8))
    text = generate_latest(allocator_registry(ServiceState(alloc))).decode()
    got = {s.labels["objective"]: s.value for fam in text_string_to_metric_families(text)
           if fam.name == "prorsa_allocator_objective" for s in fam.samples}
    assert got == {"capacity": 0.0, "turn_latency": 0.0, "saturation": 1.0}


def test_advisory_mode_is_exported_with_its_advised_switches() -> None:
    from prometheus_client import generate_latest

    def scraped(alloc: Allocator) -> dict[str, float]:
        text = generate_latest(allocator_registry(ServiceState(alloc))).decode()
        return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
                if s.name in ("prorsa_allocator_actuating", "prorsa_allocator_advised_total",
                              "prorsa_allocator_commands_total")}

    for actuate, expected in ((True, {"prorsa_allocator_actuating": 1.0, "prorsa_allocator_advised_total": 0.0,
                                      "prorsa_allocator_commands_total": 2.0}),
                              (False, {"prorsa_allocator_actuating": 0.0, "prorsa_allocator_advised_total": 2.0,
                                       "prorsa_allocator_commands_total": 0.0})):
        alloc = Allocator(_config(actuate=actuate))
        for i in range(4):
            alloc.handle(registered(f"p{i}", "prefill"))
            alloc.handle(registered(f"d{i}", "decode"))
        alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
        assert scraped(alloc) == expected
