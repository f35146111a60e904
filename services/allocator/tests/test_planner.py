"""The allocator core: engine choice, roles kept, dwell, command tracking, stale forecasts."""

from __future__ import annotations

import pytest

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.planner import Allocator
from prorsa_allocator.testing import THETA, deregistered, failed, forecast, registered, stats, switched
from prorsa_schemas import AllocationPlan, EngineCommand


def config(**kw) -> AllocatorConfig:
    """The warm-up's evidence rule (``served_evidence_first``, test_pricing.py) off: these
    tests act on a first forecast. The settle time and the closed-loop coupling (both
    test_pricing.py) off too: these tests plan back to back on hand-set demands."""
    return AllocatorConfig(**{"prefill_tokens_per_s": THETA, "served_evidence_first": False, "settle_s": 0.0,
                              "closed_loop_coupling": 0.0, **kw})


def cluster(n_prefill: int, n_decode: int, cfg: AllocatorConfig | None = None, modes=("in_place",)) -> Allocator:
    alloc = Allocator(cfg or config())
    for i in range(n_prefill):
        alloc.handle(registered(f"p{i}", "prefill", modes=modes))
    for i in range(n_decode):
        alloc.handle(registered(f"d{i}", "decode", modes=modes))
    return alloc


def commands(events) -> list[EngineCommand]:
    return [e for e in events if isinstance(e, EngineCommand)]


def plan_of(events) -> AllocationPlan:
    (plan,) = [e for e in events if isinstance(e, AllocationPlan)]
    return plan


def test_prefill_heavy_forecast_moves_the_least_loaded_decode_engines() -> None:
    alloc = cluster(4, 4)
    loads = {"d0": (10, 50_000), "d1": (0, 0), "d2": (3, 9_000), "d3": (3, 2_000)}
    for eng, (running, kv) in loads.items():
        alloc.handle(stats(eng, "decode", ts=50.0, running=running, kv_used=kv))
    out = alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
    plan = plan_of(out)
    assert (plan.n_prefill, plan.n_decode, plan.feasible) == (6, 1, True)
    cmds = commands(out)
    # Least loaded first: d1 (idle), then d3 (3 running, less KV than d2).
    assert [(c.engine, c.to_role) for c in cmds] == [("d1", "prefill"), ("d3", "prefill")]
    assert [(s.engine, s.to_role) for s in plan.switches] == [("d1", "prefill"), ("d3", "prefill")]
    assert all(c.deadline > c.ts for c in cmds)
    assert len({c.cmd for c in cmds}) == 2


def test_advisory_mode_publishes_the_plan_and_commands_nothing() -> None:
    # The same cluster and forecast as above, with actuate off: the plan names the same two
    # switches, no command goes out, and the engines stay as they are.
    acting, advising = cluster(4, 4, config(min_dwell_s=30.0)), cluster(4, 4, config(actuate=False, min_dwell_s=30.0))
    loads = {"d0": (10, 50_000), "d1": (0, 0), "d2": (3, 9_000), "d3": (3, 2_000)}
    for alloc in (acting, advising):
        for eng, (running, kv) in loads.items():
            alloc.handle(stats(eng, "decode", ts=50.0, running=running, kv_used=kv))
    acted = acting.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
    advised = advising.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
    assert plan_of(advised).switches == plan_of(acted).switches
    assert [(s.engine, s.to_role) for s in plan_of(advised).switches] == [("d1", "prefill"), ("d3", "prefill")]
    assert len(commands(acted)) == 2 and commands(advised) == []
    assert advising.table.commands == {} and all(v.command is None for v in advising.table.engines.values())
    assert {e: v.role for e, v in advising.table.engines.items()} == {**{f"p{i}": "prefill" for i in range(4)},
                                                                      **{f"d{i}": "decode" for i in range(4)}}
    assert (advising.counters.commands, advising.counters.advised, advising.counters.plans) == (0, 2, 1)
    # Nothing moved, so nothing dwells or settles: ten seconds later the same demand gets the
    # same advice (the acting allocator counts its two moving engines as prefill already).
    again = advising.handle(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0))
    assert [(s.engine, s.to_role) for s in plan_of(again).switches] == [("d1", "prefill"), ("d3", "prefill")]
    assert commands(again) == [] and advising.counters.advised == 4
    assert commands(acting.handle(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0))) == []
    # No deadline to miss: advancing event time retries nothing.
    assert advising.advance(600.0) == []


def test_balanced_forecast_within_band_switches_nothing() -> None:
    alloc = cluster(4, 4)
    out = alloc.handle(forecast(t=60.0, prefill_engines=1.0, decode_engines=1.0))
    plan = plan_of(out)
    assert plan.feasible and plan.delta > 1.0
    assert commands(out) == [] and plan.switches is None


def test_at_least_one_engine_stays_in_each_role() -> None:
    alloc = cluster(2, 3, config(max_switch_fraction=1.0))
    out = alloc.handle(forecast(t=60.0, prefill_engines=50.0, decode_engines=0.0))
    assert not plan_of(out).feasible
    cmds = commands(out)
    assert len(cmds) == 2 and {c.engine for c in cmds} <= {"d0", "d1", "d2"}
    # One decode engine is left, and the next forecast cannot take it.
    out = alloc.handle(forecast(t=70.0, prefill_engines=50.0, decode_engines=0.0))
    assert commands(out) == []


def test_switches_per_plan_are_capped_after_the_first() -> None:
    alloc = cluster(1, 7, config(max_switch_fraction=0.25))
    # A small first move (uncapped), completed...
    first = commands(alloc.handle(forecast(t=60.0, prefill_engines=1.5, decode_engines=0.5)))
    assert 1 <= len(first) <= 3
    for c in first:
        alloc.handle(switched(c.engine, c.cmd, "decode", "prefill", ts=65.0))
    # ...then every later plan is capped at ceil(0.25 * 8) = 2 engines.
    cmds = commands(alloc.handle(forecast(t=70.0, prefill_engines=7.0, decode_engines=0.5)))
    assert 7 - 1 - len(first) > 2 and len(cmds) == 2


def test_first_plan_reaches_its_target_in_one_step() -> None:
    # The registered roles were nobody's decision: the first plan may move every engine the
    # gain test pays for (one kept per role), not just max_switch_fraction of them.
    alloc = cluster(1, 7, config(max_switch_fraction=0.25))
    cmds = commands(alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=0.5)))
    assert len(cmds) == 6
    # With the old behaviour configured, the first plan is capped too.
    alloc = cluster(1, 7, config(max_switch_fraction=0.25, initial_switch_fraction=0.25))
    assert len(commands(alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=0.5)))) == 2


def test_minimum_dwell_time_applies_to_switched_engines() -> None:
    alloc = cluster(4, 4, config(min_dwell_s=30.0, max_switch_fraction=1.0))
    # Registered at ts=0: the registered role is no decision, so it may be left at t=5.
    first = commands(alloc.handle(forecast(t=5.0, prefill_engines=6.0, decode_engines=1.0)))
    assert len(first) == 2
    for c in first:
        alloc.handle(switched(c.engine, c.cmd, "decode", "prefill", ts=10.0))
    # Decode-heavy now: the engines that just switched must dwell 30 s (until ts=40) and
    # the reversal guard holds until 35 s after the command; the others may go at once.
    moved = {c.engine for c in first}
    out = commands(alloc.handle(forecast(t=36.0, prefill_engines=0.5, decode_engines=7.0)))
    assert out and not {c.engine for c in out} & moved
    for c in out:
        alloc.handle(switched(c.engine, c.cmd, "prefill", "decode", ts=37.0))
    # At t=41 the switched engines have dwelt long enough.
    more = commands(alloc.handle(forecast(t=75.0, prefill_engines=0.5, decode_engines=7.0)))
    assert more and {c.engine for c in more} & moved


def test_one_switch_in_flight_per_engine_and_completion() -> None:
    alloc = cluster(4, 4, config(max_switch_fraction=1.0))
    first = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    assert len(first) == 2
    # The same demand again: the moving engines already count as prefill; nothing new.
    assert commands(alloc.handle(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0))) == []
    # More demand: only engines without a switch in flight are chosen.
    more = commands(alloc.handle(forecast(t=80.0, prefill_engines=7.0, decode_engines=0.5)))
    assert more and not {c.engine for c in more} & {c.engine for c in first}
    for c in first:
        alloc.handle(switched(c.engine, c.cmd, "decode", "prefill", ts=85.0))
    roles = {e: v.role for e, v in alloc.table.engines.items()}
    assert all(roles[c.engine] == "prefill" for c in first)
    assert all(alloc.table.engines[c.engine].command is None for c in first)
    assert alloc.counters.switched == 2


def test_restart_switch_that_cannot_pay_back_is_not_made() -> None:
    # Restart engines (6.5 min per switch) vs a 60 s lookahead: the imbalance is real but a
    # switch would cost more than it gains. (The paper rule's 60 s lookahead: the priced rule
    # judges a move over at least horizon_switch_multiple x its dead time, test_pricing.py.)
    alloc = cluster(4, 4, config(restart_lookahead_s=0.0, rule="paper"), modes=("restart",))
    for t in range(60, 600, 10):  # persistent, so only the payback test decides
        assert commands(alloc.handle(forecast(t=float(t), prefill_engines=6.0, decode_engines=1.0))) == []
    assert "below the hysteresis" in alloc.last_decision.selection.reason
    # In place, the same forecast does switch.
    assert commands(cluster(4, 4).handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))


def test_restart_is_judged_over_the_restart_lookahead() -> None:
    # Judged over 1200 s, moving two idle decode engines pays back a 390 s restart when the
    # smoothed forecast says prefill needs 6 engines; the deadline covers the restart.
    alloc = cluster(4, 4, modes=("restart",))
    # Ski rental: no restart until the imbalance has lasted as long as a restart (390 s).
    for t in range(60, 450, 10):
        assert commands(alloc.handle(forecast(t=float(t), prefill_engines=6.0, decode_engines=1.0))) == []
    assert "has lasted" in alloc.last_decision.selection.reason
    cmds = commands(alloc.handle(forecast(t=450.0, prefill_engines=6.0, decode_engines=1.0)))
    assert len(cmds) == 2 and all(c.deadline - c.ts >= 2 * 390.0 for c in cmds)
    # Where the moving engines' own role would become the bottleneck for the minutes the
    # restart takes, it does not pay.
    alloc = cluster(4, 4, modes=("restart",))
    assert commands(alloc.handle(forecast(t=60.0, prefill_engines=4.6, decode_engines=3.8))) == []


def test_stale_and_out_of_order_forecasts_are_ignored() -> None:
    alloc = cluster(4, 4)
    alloc.handle(stats("d0", "decode", ts=200.0))  # event time is now 200
    assert alloc.handle(forecast(t=150.0, prefill_engines=6.0, decode_engines=1.0)) == []
    assert alloc.counters.stale == 1
    assert plan_of(alloc.handle(forecast(t=195.0, prefill_engines=1.0, decode_engines=1.0)))
    # An older (or repeated) window after a newer one is not acted on.
    assert alloc.handle(forecast(t=190.0, prefill_engines=6.0, decode_engines=1.0, ts=201.0)) == []
    assert alloc.counters.stale == 2


def test_forecasts_of_another_run_are_ignored_when_a_run_is_configured() -> None:
    alloc = cluster(4, 4, config(run="other-run"))
    assert alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)) == []


def test_failed_switch_cools_the_engine_down_and_another_is_chosen() -> None:
    alloc = cluster(4, 4, config(max_switch_fraction=0.125, initial_switch_fraction=0.125, failure_cooldown_s=300.0))
    (cmd,) = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    alloc.handle(failed(cmd.engine, cmd.cmd, "decode", ts=62.0))
    assert alloc.table.engines[cmd.engine].role == "decode"
    assert alloc.counters.failed == 1
    # Direction is unchanged, so no reversal guard; the failed engine sits out its cooldown.
    (again,) = commands(alloc.handle(forecast(t=70.0, prefill_engines=6.0, decode_engines=1.0)))
    assert again.engine != cmd.engine


def test_an_engine_registered_with_no_switch_mode_is_never_chosen() -> None:
    # d1 is the least loaded decode engine, the first pick; it registered with
    # switch_modes [] (its agent can neither flip nor restart it), so d2 and d3 go instead.
    # Without switch_modes at all (d0) the registration says nothing against it.
    alloc = Allocator(config())
    for i in range(4):
        alloc.handle(registered(f"p{i}", "prefill"))
    alloc.handle(registered("d0", "decode", modes=None))
    alloc.handle(registered("d1", "decode", modes=()))
    alloc.handle(registered("d2", "decode"))
    alloc.handle(registered("d3", "decode"))
    for eng, running in (("d0", 9), ("d1", 0), ("d2", 2), ("d3", 3)):
        alloc.handle(stats(eng, "decode", ts=50.0, running=running, kv_used=1000 * running))
    out = alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
    assert [(c.engine, c.to_role) for c in commands(out)] == [("d2", "prefill"), ("d3", "prefill")]
    assert alloc.table.engines["d1"].cannot_switch and not alloc.table.engines["d0"].cannot_switch
    # Registered again with a mode (relaunched with the flag): it may move again.
    alloc.handle(registered("d1", "decode", ts=61.0))
    assert not alloc.table.engines["d1"].cannot_switch


def test_deadline_retry_then_abandon() -> None:
    cfg = config(max_switch_fraction=0.125, initial_switch_fraction=0.125, max_attempts=2, ack_grace_s=5.0,
                 failure_cooldown_s=1000.0, in_place_switch_s=0.0)
    alloc = cluster(4, 4, cfg)
    (cmd,) = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    # Nothing before deadline + grace (the switch itself takes no time here).
    assert commands(alloc.handle(stats("p0", "prefill", ts=cmd.deadline + 4.0))) == []
    (retry,) = commands(alloc.handle(stats("p0", "prefill", ts=cmd.deadline + 6.0)))
    assert retry.cmd == cmd.cmd and retry.id != cmd.id and retry.deadline > cmd.deadline
    assert alloc.counters.retries == 1
    # Our own publishes read back from the stream change nothing.
    assert alloc.handle(cmd) == [] and alloc.handle(retry) == []
    assert alloc.table.commands[cmd.cmd].attempts == 2
    # Missed again: abandoned, the engine is left alone and counted in its reported role.
    assert commands(alloc.handle(stats("p0", "prefill", ts=retry.deadline + 6.0))) == []
    assert alloc.counters.abandoned == 1 and cmd.cmd not in alloc.table.commands
    view = alloc.table.engines[cmd.engine]
    assert view.role == "decode" and view.switching_to is None and view.command is None
    # A late engine.switched still updates the role; a late echo of the command cannot reopen it.
    alloc.handle(switched(cmd.engine, cmd.cmd, "decode", "prefill", ts=retry.deadline + 7.0))
    assert view.role == "prefill"
    alloc.handle(cmd)
    assert cmd.cmd not in alloc.table.commands


def test_a_switch_finishing_after_the_drain_deadline_is_waited_for() -> None:
    # The agent drains to the deadline, aborts what is left, then switches (15 s here): the
    # command is re-sent only after deadline + switch time + grace.
    cfg = config(max_switch_fraction=0.125, initial_switch_fraction=0.125, ack_grace_s=5.0, in_place_switch_s=15.0)
    alloc = cluster(4, 4, cfg)
    (cmd,) = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    assert commands(alloc.handle(stats("p0", "prefill", ts=cmd.deadline + 19.0))) == []
    (retry,) = commands(alloc.handle(stats("p0", "prefill", ts=cmd.deadline + 21.0)))
    assert retry.cmd == cmd.cmd and alloc.counters.retries == 1
    # Answered inside that time: never re-sent.
    alloc = cluster(4, 4, cfg)
    (cmd,) = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    assert commands(alloc.handle(stats("p0", "prefill", ts=cmd.deadline + 12.0))) == []
    alloc.handle(switched(cmd.engine, cmd.cmd, "decode", "prefill", ts=cmd.deadline + 14.0))
    assert commands(alloc.handle(stats("p0", "prefill", ts=cmd.deadline + 60.0))) == []
    assert alloc.counters.retries == 0 and cmd.cmd not in alloc.table.commands


def test_deregistered_engine_leaves_the_pool() -> None:
    alloc = cluster(1, 2)
    alloc.handle(deregistered("d1", ts=10.0))
    assert set(alloc.table.engines) == {"p0", "d0"}
    # An event about an engine never registered is reported and ignored, not fatal.
    assert alloc.handle(stats("ghost", "decode", ts=11.0)) == []
    assert alloc.counters.notes == 1


def test_too_few_engines_skips_planning() -> None:
    alloc = cluster(1, 0)
    assert alloc.handle(forecast(t=60.0, prefill_engines=1.0, decode_engines=1.0)) == []
    assert "nothing to plan" in alloc.last_decision.skipped


def test_theta_is_learned_from_saturated_prefill_engines_with_cache_hits() -> None:
    alloc = cluster(2, 2, config(theta_prior_samples=0))
    # An idle engine's rate is its demand, not its capacity: ignored.
    alloc.handle(stats("p0", "prefill", ts=1.0, running=1, queued=0, prefill_tokens_per_s=100.0))
    assert alloc.theta.value == pytest.approx(THETA)
    # Backlogged at 8k computed tokens/s with half the prompt cached: 16k full-prompt tokens/s.
    alloc.handle(stats("p0", "prefill", ts=2.0, running=1, queued=4, prefill_tokens_per_s=8000.0, cache_hit_rate=0.5))
    assert alloc.theta.value == pytest.approx(16_000.0)


def test_theta_is_the_engines_computed_capacity_over_the_pools_miss_now() -> None:
    # Backlogged at 10k computed tokens/s with half of each prompt cached: θᴾ 20k full-prompt
    # tokens/s. The cache comes back (hit 0.9) and the engines compute at the same rate: the
    # capacity quantile stays 10k, and the hit is the mean of the last 16 samples.
    alloc = cluster(2, 2, config(theta_prior_samples=0))
    for k in range(4):
        alloc.handle(stats("p0", "prefill", ts=1.0 + k, running=1, queued=3, prefill_tokens_per_s=10_000.0,
                           cache_hit_rate=0.5))
    assert alloc.theta.value == pytest.approx(20_000.0) and alloc.theta.hit == pytest.approx(0.5)
    for k in range(8):
        alloc.handle(stats("p0", "prefill", ts=5.0 + k, running=1, queued=3, prefill_tokens_per_s=10_000.0,
                           cache_hit_rate=0.9))
    hit = (4 * 0.5 + 8 * 0.9) / 12
    assert alloc.theta.hit == pytest.approx(hit) and alloc.theta.value == pytest.approx(10_000.0 / (1 - hit))
    for k in range(8):
        alloc.handle(stats("p0", "prefill", ts=13.0 + k, running=1, queued=3, prefill_tokens_per_s=10_000.0,
                           cache_hit_rate=0.9))
    assert alloc.theta.value == pytest.approx(100_000.0)  # the last 16 samples: all at 0.9


@pytest.mark.parametrize("hit, moves", [(0.0, True), (0.75, False)])
def test_a_smaller_prefill_count_never_measured_is_taken_to_lose_the_cache(hit: float, moves: bool) -> None:
    # 6:2, every prefill engine backlogged at THETA full-prompt tokens/s (THETA x (1 - hit)
    # computed); the forecast wants 1.5 prefill and 2.4 decode engines (decode at 2/2.4 =
    # 0.83 of its need). With no cache to lose one engine to decode serves both roles
    # (+44%). At a hit of 0.75 a count below 6, never measured, computes every prompt
    # token: 5 engines serve 1.25 engines' worth of full prompts, 0.83 of 1.5, and the move
    # trades one shortage for another.
    alloc = cluster(6, 2, config(theta_prior_samples=0))
    for i in range(6):
        alloc.handle(stats(f"p{i}", "prefill", ts=50.0, running=1, queued=1,
                           prefill_tokens_per_s=THETA * (1 - hit), cache_hit_rate=hit))
    assert alloc.theta.value == pytest.approx(THETA)
    cmds = commands(alloc.handle(forecast(t=60.0, prefill_engines=1.5, decode_engines=2.4)))
    assert bool(cmds) == moves and all(c.to_role == "decode" for c in cmds)


def test_learned_switch_cost() -> None:
    alloc = cluster(4, 4, config(switch_cost_alpha=1.0))
    (c1, _) = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    alloc.handle(switched(c1.engine, c1.cmd, "decode", "prefill", ts=70.0, seconds=12.5))
    assert alloc.switch_cost.in_place_s == pytest.approx(12.5)


def test_learned_switch_cost_does_not_count_the_expected_drain_twice() -> None:
    # engine.switched.seconds runs from the command to the switch, drain included; the gain
    # test adds its own drain estimate, so the learned switch time is net of it. (The paper
    # rule's 20 s decode drain; the priced rule's, the drain deadline: test_pricing.py.)
    alloc = cluster(4, 4, config(switch_cost_alpha=1.0, drain_decode_s=20.0, rule="paper"))
    for i in range(4):
        alloc.handle(stats(f"d{i}", "decode", ts=50.0, running=3, kv_used=1_000))  # all busy
    (c1, c2) = commands(alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0)))
    alloc.handle(switched(c1.engine, c1.cmd, "decode", "prefill", ts=95.0, seconds=35.0))
    assert alloc.switch_cost.in_place_s == pytest.approx(15.0)
    # A drain that ran shorter than expected never makes the switch time negative.
    alloc.handle(switched(c2.engine, c2.cmd, "decode", "prefill", ts=96.0, seconds=8.0))
    assert alloc.switch_cost.in_place_s == pytest.approx(0.0)


def test_the_prefill_share_arrivals_bring_comes_from_the_forecasts_components() -> None:
    from prorsa_allocator.planner import prefill_fed_share
    from prorsa_schemas import ForecastComponents

    fc = forecast(t=10.0, prefill_engines=2.0, decode_engines=1.0)
    # No components: all of it counted as fed by the loop.
    assert fc.components is None and prefill_fed_share(fc) == 1.0
    # sampler 100 + sandbox 50 + tool 250 arrive; 300 queued and 300 in prefill at t:
    # 400 of 1,000 tokens are fed.
    comps = ForecastComponents(sampler=100.0, sandbox=50.0, tool=250.0, ready=300.0, inflight=300.0, bias=1.1)
    assert prefill_fed_share(fc.model_copy(update={"components": comps})) == pytest.approx(0.4)
    # A forecaster that leaves the backlog terms out says nothing about it.
    partial = ForecastComponents(sampler=100.0, tool=250.0)
    assert prefill_fed_share(fc.model_copy(update={"components": partial})) == 1.0
    # All zero: nothing queued, nothing arriving.
    assert prefill_fed_share(fc.model_copy(update={"components": ForecastComponents(
        sampler=0.0, sandbox=0.0, tool=0.0, ready=0.0, inflight=0.0)})) == 1.0


def test_the_auto_objective_follows_the_runs_modes() -> None:
    from prorsa_allocator.testing import RUN
    from prorsa_schemas import RunStarted

    def started(run: str, mode: str) -> RunStarted:
        return RunStarted(id=f"rs-{run}", ts=1.0, run=run, mode=mode, batch_size=8)

    alloc = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA))
    assert alloc.config.objective == "capacity"  # no run.started yet
    alloc.handle(started("a", "sync"), act=False)  # a replay folds it in too
    assert alloc.config.objective == "saturation"
    assert alloc.requested.objective == "auto"
    alloc.handle(started("b", "async"))  # one asynchronous run among them
    assert alloc.config.objective == "capacity"
    # Bound to a run, another run's mode is not its concern.
    bound = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA, run=RUN))
    bound.handle(started("other-run", "async"))
    assert bound.run_modes == {} and bound.config.objective == "capacity"
    bound.handle(started(RUN, "sync"))
    assert bound.config.objective == "saturation"
    # An objective set by hand is kept whatever the runs.
    fixed = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA, objective="capacity"))
    fixed.handle(started("a", "sync"))
    assert fixed.config.objective == "capacity"
    # Every other field is the configuration given.
    assert alloc.config.model_dump(exclude={"objective"}) == alloc.requested.model_dump(exclude={"objective"})


def test_a_policy_update_of_another_run_opens_no_pause() -> None:
    from prorsa_allocator.testing import RUN
    from prorsa_schemas import PolicyUpdated

    alloc = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA, run=RUN))
    alloc.handle(PolicyUpdated(id="pu-x", ts=50.0, run="other-run", version=1))
    assert alloc.last_update_ts is None and alloc.pause_left() == 0.0
    alloc.handle(PolicyUpdated(id="pu-1", ts=60.0, run=RUN, version=1))
    assert alloc.last_update_ts == 60.0
    # Not bound to a run, it takes any run's update (the simulator's allocator).
    free = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA))
    free.handle(PolicyUpdated(id="pu-y", ts=50.0, run="other-run", version=1))
    assert free.last_update_ts == 50.0


def _pause_plan(busy: bool, queued: int = 0):
    """An update at t = 50, then a prefill-heavy window at t = 52, inside the 5 s pause;
    the engines' last stats idle, or one decode engine still running requests; ``queued``
    requests waiting on one prefill engine."""
    from prorsa_schemas import PolicyUpdated

    alloc = cluster(4, 4)
    for eng in ("d0", "d1", "d2", "d3", "p0"):
        alloc.handle(stats(eng, "decode" if eng[0] == "d" else "prefill", ts=49.0,
                           running=4 if busy and eng == "d0" else 0, queued=queued if eng == "p0" else 0))
    alloc.handle(PolicyUpdated(id="pu-1", ts=50.0, run="run-1", version=1))
    out = alloc.handle(forecast(t=52.0, prefill_engines=7.0, decode_engines=1.0))
    return alloc, out


def test_a_pause_with_empty_engines_prices_its_switches_free_and_uncapped() -> None:
    alloc, out = _pause_plan(busy=False)
    assert len(commands(out)) == 3  # 4:4 to 7:1 at once: no per-plan cap in the pause
    assert "in the pause" in alloc.last_decision.selection.reason


def test_requests_waiting_in_a_paused_engine_do_not_end_the_pause() -> None:
    # Nothing runs them until the engine resumes (the simulator's asynchronous pause keeps
    # the waiting prompts of the engines it does not drain).
    alloc, out = _pause_plan(busy=False, queued=3)
    assert len(commands(out)) == 3 and "in the pause" in alloc.last_decision.selection.reason


def test_a_pause_whose_engines_still_hold_requests_is_no_pause() -> None:
    # policy.updated published after the engines resumed (a framework that reports the
    # update once the weights are loaded): the engines are serving, so no switch is free,
    # and the window counts as the step's opening, held.
    alloc, out = _pause_plan(busy=True)
    assert commands(out) == []
    assert "holding through the step's opening" in alloc.last_decision.selection.reason


def _steady_then_update(busy_at_update: bool):
    """A prefill-heavy window at t = 40 that moves nothing (the imbalance has not lasted:
    ``persist_dead_multiple``) but sets the steady demand; then the engines' stats at
    t = 49 and a weight update at t = 50, with no forecast window in the pause."""
    from prorsa_schemas import PolicyUpdated

    alloc = cluster(4, 4, config(persist_dead_multiple=2.0))
    first = alloc.handle(forecast(t=40.0, prefill_engines=7.0, decode_engines=1.0))
    assert commands(first) == [] and "has lasted 0s" in alloc.last_decision.selection.reason
    for eng in ("p0", "p1", "p2", "p3", "d0", "d1", "d2", "d3"):
        alloc.handle(stats(eng, "prefill" if eng[0] == "p" else "decode", ts=49.0,
                           running=4 if busy_at_update and eng == "d0" else 0))
    out = alloc.handle(PolicyUpdated(id="pu-1", ts=50.0, run="run-1", version=1))
    return alloc, out


def test_the_pause_is_decided_at_the_update_not_at_the_next_window() -> None:
    # The pause (weight_sync_s, 5 s) is shorter than a window (10 s): waiting for a window
    # to start in it misses it about half the time. At the update, with every engine
    # empty, the pause's decision is taken from the last window and the steady demand.
    alloc, out = _steady_then_update(busy_at_update=False)
    cmds = commands(out)
    assert len(cmds) == 3 and {c.to_role for c in cmds} == {"prefill"}  # uncapped: 4:4 -> 7:1
    assert "in the pause" in alloc.last_decision.selection.reason
    assert plan_of(out).n_prefill == 7
    # Once per update: later stats in the same pause decide nothing more.
    assert commands(alloc.handle(stats("d3", "decode", ts=51.0))) == []


def test_a_pause_whose_engines_hold_requests_at_the_update_is_decided_when_they_are_empty() -> None:
    # Stats lag behind the pause (an async run's engines are emptied by the abort just
    # after the update): the first stats that show every engine empty decide it.
    alloc, out = _steady_then_update(busy_at_update=True)
    assert commands(out) == []
    cmds = commands(alloc.handle(stats("d0", "decode", ts=51.0)))
    assert len(cmds) == 3 and "in the pause" in alloc.last_decision.selection.reason
    # After the pause (t >= 55) empty engines open nothing.
    late, _ = _steady_then_update(busy_at_update=True)
    assert commands(late.handle(stats("d0", "decode", ts=56.0))) == []


@pytest.mark.parametrize("floor, moved", [(0.5, 3), (0.0, 0)])
def test_the_pause_plans_for_the_steps_body_not_its_tail(floor: float, moved: int) -> None:
    # A sync step: a prefill-heavy window (7 + 1 instances), then a tail of stragglers
    # (0.3 instances) until the update; no window moves anything (no imbalance lasts
    # persist_dead_multiple = 100 dead times).
    # The tail's windows are under half the step's peak: the pause plans for the body
    # (4:4 -> 7:1 at once). With the floor at 0 the tail's EMA leaves nothing to plan for.
    from prorsa_schemas import PolicyUpdated

    alloc = cluster(4, 4, config(persist_dead_multiple=100.0, steady_floor=floor))
    assert commands(alloc.handle(forecast(t=40.0, prefill_engines=7.0, decode_engines=1.0))) == []
    for t in (50.0, 60.0, 70.0, 80.0, 90.0):
        assert commands(alloc.handle(forecast(t=t, prefill_engines=0.2, decode_engines=0.1))) == []
    out = alloc.handle(PolicyUpdated(id="pu-1", ts=95.0, run="run-1", version=1))
    assert len(commands(out)) == moved
    if moved:
        assert "in the pause" in alloc.last_decision.selection.reason
