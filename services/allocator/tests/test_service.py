"""The allocator service over a real nats-server: plans and commands on the bus, command
tracking to engine.switched / deadline, restart without re-issuing, bad input survived."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import pytest

from prorsa_allocator.service import AllocatorService
from prorsa_allocator.settings import AllocatorSettings
from prorsa_allocator.testing import RUN, THETA, forecast, registered, stats, switched
from prorsa_runtime import connect, ensure_stream, publish_event
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import AllocationPlan, EngineCommand, Namespace, PolicyUpdated, RunStarted, decode_event
from prorsa_tracker.outputs import Watermark


class Harness:
    """A running allocator service plus a bus client that publishes and records control events."""

    def __init__(self, url: str, ns: Namespace, **tuning):
        self.url, self.ns, self.tuning = url, ns, tuning
        self.control: list = []

    async def __aenter__(self) -> "Harness":
        self.nc = await connect(self.url, "test")
        self.js = self.nc.jetstream()
        await ensure_stream(self.js, self.ns)

        async def record(msg) -> None:
            self.control.append(decode_event(msg.data))

        self.sub = await self.nc.subscribe(self.ns.control_all(), cb=record)
        return self

    async def start_service(self) -> AllocatorService:
        settings = AllocatorSettings(
            nats_url=self.url, subject_prefix=self.ns.prefix, stream=self.ns.stream,
            prefill_tokens_per_s=THETA, **{"served_evidence_first": False, **self.tuning},
        )
        self.service = AllocatorService(settings)
        self.stop = asyncio.Event()
        self.stack = AsyncExitStack()
        self.task = asyncio.create_task(self.service.run(self.stack, self.stop))
        await async_wait_until(lambda: self.service.state.caught_up.is_set() or self.task.done(), 20, what="service start")
        assert not self.task.done(), self.task.exception()
        return self.service

    async def stop_service(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 10)
        await self.stack.aclose()

    async def publish(self, *events) -> None:
        for e in events:
            await publish_event(self.js, self.ns, e)

    def of(self, cls) -> list:
        return [e for e in self.control if isinstance(e, cls)]

    async def __aexit__(self, *exc) -> None:
        if getattr(self, "task", None) is not None and not self.task.done():
            await self.stop_service()
        await self.sub.unsubscribe()
        await self.nc.close()


async def cluster(h: Harness) -> None:
    for i in range(4):
        await h.publish(registered(f"p{i}", "prefill"), registered(f"d{i}", "decode"))


async def test_forecast_to_plan_and_commands_then_switched(nats_url: str, ns: Namespace, caplog) -> None:
    caplog.set_level("INFO", logger="prorsa.allocator.service")
    async with Harness(nats_url, ns) as h:
        svc = await h.start_service()
        await cluster(h)
        await h.publish(stats("d0", "decode", ts=50.0, running=9, kv_used=90_000))
        await h.publish(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(EngineCommand)) == 2, 10, what="two commands")
        (plan,) = h.of(AllocationPlan)
        assert (plan.n_prefill, plan.n_decode, plan.feasible) == (6, 1, True)
        cmds = h.of(EngineCommand)
        assert {c.engine for c in cmds} == {s.engine for s in plan.switches}
        assert "d0" not in {c.engine for c in cmds}  # the busy one stays
        # The engines report the switch; the service folds it into its table.
        for c in cmds:
            await h.publish(switched(c.engine, c.cmd, "decode", "prefill", ts=66.0))
        table = svc.state.allocator.table
        await async_wait_until(lambda: not table.commands, 10, what="commands closed")
        assert sum(v.role == "prefill" for v in table.engines.values()) == 6
        # The next forecast, same demand: a plan and no further switch.
        await h.publish(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(AllocationPlan)) == 2, 10, what="second plan")
        assert h.of(AllocationPlan)[1].switches is None and len(h.of(EngineCommand)) == 2
        # Each plan's log line says why it switches or holds (the operator's first question).
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan t=")]
        assert len(lines) == 2 and all(line.endswith(")") for line in lines), lines
        assert "prefill count 6 within target band" in lines[1], lines


async def test_advisory_mode_publishes_plans_and_no_command(nats_url: str, ns: Namespace, caplog) -> None:
    # PRORSA_ALLOCATOR_ACTUATE=false: the plans go out with the switches they advise, and
    # no engine.command reaches the bus (one publisher lane: a command of a plan would come
    # before the next plan).
    caplog.set_level("INFO", logger="prorsa.allocator.service")
    async with Harness(nats_url, ns, actuate=False) as h:
        svc = await h.start_service()
        await cluster(h)
        await h.publish(stats("d0", "decode", ts=50.0, running=9, kv_used=90_000))
        for t in (60.0, 70.0):
            await h.publish(forecast(t=t, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(AllocationPlan)) == 2, 10, what="two plans")
        first, second = h.of(AllocationPlan)
        assert (first.n_prefill, first.n_decode) == (6, 1) and len(first.switches) == 2
        assert "d0" not in {s.engine for s in first.switches}  # the busy one stays, as when acting
        assert second.switches == first.switches  # nothing moved: the same advice
        assert h.of(EngineCommand) == []
        a = svc.state.allocator
        assert (a.counters.commands, a.counters.advised) == (0, 4) and not a.table.commands
        assert sum(v.role == "prefill" for v in a.table.engines.values()) == 4
        messages = [r.getMessage() for r in caplog.records]
        assert any(m.startswith("advisory mode (actuate=false)") for m in messages), messages
        advice = [m for m in messages if m.startswith("advice (not commanded) t=")]
        moves = ", ".join(f"{s.engine} -> prefill" for s in first.switches)
        assert len(advice) == 2 and all(f"2 switches [{moves}]" in m for m in advice), advice


ONE_COMMAND = dict(max_switch_fraction=0.125, initial_switch_fraction=0.125, ack_grace_s=5.0, max_attempts=2,
                   in_place_switch_s=0.0)
"""Harness settings under which a prefill-heavy forecast yields exactly one command, re-sent
``ack_grace_s`` after its deadline (the switch itself is taken as instant)."""


async def one_command(h: Harness):
    """Start the service on the cluster, send a prefill-heavy forecast; (service, its one command)."""
    svc = await h.start_service()
    await cluster(h)
    await h.publish(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
    await async_wait_until(lambda: h.of(EngineCommand), 10, what="command")
    (cmd,) = h.of(EngineCommand)
    return svc, cmd


async def test_missed_deadline_is_retried_then_abandoned(nats_url: str, ns: Namespace) -> None:
    async with Harness(nats_url, ns, **ONE_COMMAND) as h:
        svc, cmd = await one_command(h)
        # Event time passes (engine stats) with no answer from the engine.
        await h.publish(stats("p0", "prefill", ts=cmd.deadline + 6.0))
        await async_wait_until(lambda: len(h.of(EngineCommand)) == 2, 10, what="retry")
        retry = h.of(EngineCommand)[1]
        assert retry.cmd == cmd.cmd and retry.deadline > cmd.deadline
        await h.publish(stats("p0", "prefill", ts=retry.deadline + 6.0))
        await async_wait_until(lambda: svc.state.allocator.counters.abandoned == 1, 10, what="abandon")
        assert len(h.of(EngineCommand)) == 2 and not svc.state.allocator.table.commands


async def test_restart_rebuilds_state_without_reissuing(nats_url: str, ns: Namespace) -> None:
    async with Harness(nats_url, ns) as h:
        await h.start_service()
        await cluster(h)
        await h.publish(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(EngineCommand)) == 2, 10, what="commands")
        first = h.of(EngineCommand)
        await h.stop_service()
        # One engine answers while the allocator is down.
        await h.publish(switched(first[0].engine, first[0].cmd, "decode", "prefill", ts=65.0))
        svc = await h.start_service()
        table = svc.state.allocator.table
        assert len(table.engines) == 8
        assert set(table.commands) == {first[1].cmd}  # the unanswered one is still tracked
        assert table.engines[first[0].engine].role == "prefill"
        assert len(h.of(EngineCommand)) == 2 and len(h.of(AllocationPlan)) == 1  # nothing re-sent
        # The old forecast is not acted on again; a new one is.
        await h.publish(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(AllocationPlan)) == 2, 10, what="plan after restart")
        assert len(h.of(EngineCommand)) == 2  # both moving engines already count as prefill


async def test_stale_forecast_and_bad_messages_are_survived(nats_url: str, ns: Namespace) -> None:
    async with Harness(nats_url, ns) as h:
        svc = await h.start_service()
        await cluster(h)
        await h.publish(stats("p0", "prefill", ts=500.0))
        await h.nc.publish(ns.subject_for_type("engine.stats"), b'{"type": "engine.stats", "engine": 7}')
        await h.nc.publish(ns.subject_for_type("engine.stats"), b"not json")
        # A valid event stamped a year ahead of this host's clock: applied, it would make
        # every forecast stale and expire every deadline from then on.
        await h.publish(stats("p0", "prefill", ts=time.time() + 365 * 86400))
        await h.publish(forecast(t=100.0, prefill_engines=6.0, decode_engines=1.0))  # 400 s old
        await h.publish(forecast(t=495.0, prefill_engines=1.0, decode_engines=1.0))
        await async_wait_until(lambda: h.of(AllocationPlan), 10, what="plan for the fresh forecast")
        assert [p.t for p in h.of(AllocationPlan)] == [495.0]
        # The three bad messages reached the stream; each was counted with its reason.
        assert svc.state.invalid == 3 and "ahead of this host's clock" in svc.state.last_invalid
        assert svc.state.dead_letters.counts == {"invalid": 2, "future": 1}
        assert svc.state.allocator.now == 500.0
        assert svc.state.allocator.counters.stale == 1
        assert len(svc.state.allocator.table.engines) == 8


@pytest.mark.parametrize("bad", [{"PRORSA_ALLOCATOR_HYSTERESIS": "-1"}, {"PRORSA_ALLOCATOR_NATS_URL": "http://x"}])
def test_bad_settings_are_refused_with_the_variable_named(monkeypatch, bad) -> None:
    from pydantic import ValidationError

    for k, v in bad.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValidationError) as err:
        AllocatorSettings()
    assert list(bad)[0].removeprefix("PRORSA_ALLOCATOR_").lower() in str(err.value).lower()


async def test_deadlines_expire_on_the_tracker_watermark_alone(nats_url: str, ns: Namespace) -> None:
    async with Harness(nats_url, ns, **ONE_COMMAND) as h:
        svc, cmd = await one_command(h)
        # The bus goes quiet: no engine event; only the tracker's watermark moves event time.
        await h.nc.publish(ns.watermark(), b'{"ts": null, "seq": 0}')  # no event yet: ignored
        await h.nc.publish(ns.watermark(), b"garbage")
        await h.nc.publish(ns.watermark(), b'{"ts": "soon"}')
        future = Watermark(ts=time.time() + 365 * 86400, seq=19)  # would expire everything at once
        await h.nc.publish(ns.watermark(), future.model_dump_json().encode())
        await h.nc.publish(ns.watermark(), Watermark(ts=cmd.deadline + 1.0, seq=20).model_dump_json().encode())
        await async_wait_until(lambda: svc.state.watermarks == 1, 10, what="watermark applied")
        assert len(h.of(EngineCommand)) == 1  # inside the grace period: nothing yet
        assert svc.state.invalid == 3 and "watermark" in svc.state.last_invalid
        assert svc.state.dead_letters.counts["future"] == 1
        await h.nc.publish(ns.watermark(), Watermark(ts=cmd.deadline + 6.0, seq=21).model_dump_json().encode())
        await async_wait_until(lambda: len(h.of(EngineCommand)) == 2, 10, what="retry on the watermark")
        retry = h.of(EngineCommand)[1]
        assert retry.cmd == cmd.cmd and retry.ts == cmd.deadline + 6.0 and retry.deadline > cmd.deadline
        await h.nc.publish(ns.watermark(), Watermark(ts=retry.deadline + 6.0, seq=22).model_dump_json().encode())
        await async_wait_until(lambda: svc.state.allocator.counters.abandoned == 1, 10, what="abandon")
        assert len(h.of(EngineCommand)) == 2 and not svc.state.allocator.table.commands
        ok, health = svc.state.health()
        assert ok and health["watermarks"] == 3 and health["event_time"] == retry.deadline + 6.0


async def test_poison_mid_run_is_dead_lettered_and_a_restart_replays_past_it(nats_url: str, ns: Namespace) -> None:
    from prometheus_client import generate_latest

    from prorsa_allocator.metrics import allocator_registry
    from prorsa_schemas import encode_event

    async with Harness(nats_url, ns, **ONE_COMMAND) as h:
        svc = await h.start_service()
        await cluster(h)
        forged = switched("p0", "forged", "prefill", "decode", ts=1.0)
        poison = [
            (ns.subject_for_type("engine.stats"), b"[" * 1000),  # RecursionError in a plain JSON parser
            (ns.subject_for_type("engine.stats"), b"\xff\xfe\x00"),
            (f"{ns.prefix}.control.engine.switched", encode_event(forged)),  # an engine event on a control subject
        ]
        seqs = [(await h.js.publish(subject, data)).seq for subject, data in poison]
        await h.nc.publish(ns.watermark(), b'{"ts": ' + b"[" * 1000 + b"}")
        await h.publish(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: h.of(EngineCommand), 10, what="a command after the poison")
        letters = svc.state.dead_letters
        assert letters.counts == {"invalid": 3, "subject": 1}
        assert [d.seq for d in letters.recent if d.seq is not None] == seqs
        assert svc.state.allocator.table.engines["p0"].role == "prefill"  # the forged switch is not applied
        text = generate_latest(allocator_registry(svc.state)).decode()
        assert 'prorsa_allocator_dead_letters_total{kind="subject"} 1.0' in text
        await h.stop_service()
        # The restart replays the stream, poison included, and acts again on what follows.
        svc = await h.start_service()
        assert svc.state.dead_letters.counts == {"invalid": 2, "subject": 1}  # the watermark is not in the stream
        assert len(svc.state.allocator.table.engines) == 8 and len(h.of(EngineCommand)) == 1
        await h.publish(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(AllocationPlan)) == 2, 10, what="a plan after the restart")


async def test_the_pause_is_decided_at_the_policy_update(nats_url: str, ns: Namespace, caplog) -> None:
    # No forecast window starts in the pause: the update itself, with every engine empty,
    # brings the pause's plan and commands (planned for the steady demand of the window
    # before, which moved nothing: its imbalance had not lasted).
    caplog.set_level("INFO", logger="prorsa.allocator.service")
    async with Harness(nats_url, ns, run=RUN, persist_dead_multiple=2.0) as h:
        await h.start_service()
        await cluster(h)
        await h.publish(forecast(t=40.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(AllocationPlan)) == 1, 10, what="the window's plan")
        assert h.of(EngineCommand) == []
        await h.publish(PolicyUpdated(id="pu-1", ts=50.0, run=RUN, version=1))
        await async_wait_until(lambda: len(h.of(EngineCommand)) == 2, 10, what="the pause's commands")
        plans = h.of(AllocationPlan)
        assert len(plans) == 2 and len(plans[1].switches) == 2 and plans[1].n_prefill == 6
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan t=")]
        assert "at the weight update" in lines[-1] and "to prefill in the pause" in lines[-1], lines
        assert "at the weight update" not in lines[0], lines


async def test_a_policy_update_on_the_rollout_subject_opens_the_pause_and_the_opening(
        nats_url: str, ns: Namespace, caplog) -> None:
    # The allocator reads policy.updated from the rollout subject tree: the pause after it
    # plans switches as free, and the step's opening after the pause is held.
    caplog.set_level("INFO", logger="prorsa.allocator.service")
    async with Harness(nats_url, ns, run=RUN) as h:
        svc = await h.start_service()
        await cluster(h)
        # Another run's update is not this allocator's.
        await h.publish(PolicyUpdated(id="pu-other", ts=40.0, run="other-run", version=1))
        await h.publish(PolicyUpdated(id="pu-1", ts=50.0, run=RUN, version=1))
        alloc = svc.state.allocator
        await async_wait_until(lambda: alloc.last_update_ts == 50.0, 10, what="the update folded in")
        # A window in the pause (weight_sync_s = 5 s after the update): the moves are priced
        # free, and the per-plan cap does not apply.
        await h.publish(forecast(t=52.0, prefill_engines=6.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(EngineCommand)) == 2, 10, what="the pause's commands")
        # A window in the step's opening (opening_hold_s = 120 s): held, whatever it asks.
        await h.publish(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
        await async_wait_until(lambda: len(h.of(AllocationPlan)) == 2, 10, what="second plan")
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan t=")]
        assert "to prefill in the pause" in lines[0], lines
        assert "holding through the step's opening" in lines[1], lines
        assert len(h.of(AllocationPlan)[0].switches) == 2
        assert h.of(AllocationPlan)[1].switches is None and len(h.of(EngineCommand)) == 2


async def test_a_sync_run_started_on_the_rollout_subject_sets_the_auto_objective(nats_url: str, ns: Namespace) -> None:
    # The allocator reads run.started from the rollout subject tree: another run's is not
    # this allocator's; its own sync run resolves the 'auto' objective to saturation.
    async with Harness(nats_url, ns, run=RUN) as h:
        svc = await h.start_service()
        alloc = svc.state.allocator
        assert (alloc.requested.objective, alloc.config.objective) == ("auto", "capacity")
        await h.publish(RunStarted(id="rs-other", ts=1.0, run="other-run", mode="async", batch_size=8))
        await h.publish(RunStarted(id="rs-1", ts=2.0, run=RUN, mode="sync", batch_size=8))
        await async_wait_until(lambda: alloc.run_modes == {RUN: "sync"}, 10, what="the run's mode folded in")
        assert alloc.config.objective == "saturation"
