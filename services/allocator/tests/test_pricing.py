"""The 'priced' gain test: each switch's price (dead time, re-prefill of what its drain
aborts, prefix cache lost) and the horizon it must pay back over, on hand-computed cases;
the weight-update pause (free switches, planned for the last step's steady demand) and the
hold through a step's opening."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from prorsa_allocator.config import AllocatorConfig
from prorsa_allocator.engines import EngineView
from prorsa_allocator.planner import Allocator
from prorsa_allocator.pricing import (
    PricedContext, SwitchPrice, SwitchPrices, TurnLatency, decode_full, prefill_room, price_switch, price_switches,
    priced_net, role_pressed,
)
from prorsa_allocator.served import CacheRegime
from prorsa_allocator.switching import DemandView
from prorsa_allocator.testing import KV, RUN, THETA, failed, forecast, registered, stats, switched
from prorsa_schemas import EngineCommand, PolicyUpdated


def _config(**kw) -> AllocatorConfig:
    """The config these tests use: the warm-up's evidence rule (``served_evidence_first``)
    off, so a first forecast is acted on as the rule under test says; the settle time and the
    closed-loop coupling off (each has its own tests below, which turn it on)."""
    return AllocatorConfig(**{"prefill_tokens_per_s": THETA, "served_evidence_first": False, "settle_s": 0.0,
                              "closed_loop_coupling": 0.0, **kw})

CFG = _config()  # drain deadline 10 s, prefill drain 2 s


def view(role: str, running: int = 0, kv_used: int = 0, kv_cap: int = 100_000, rate=None, hit=None) -> EngineView:
    return EngineView(engine="e", server="s", role=role, gpus=8, kv_capacity_tokens=kv_cap, switch_modes=("in_place",),
                      running_reqs=running, kv_used_tokens=kv_used, prefill_tokens_per_s=rate, cache_hit_rate=hit)


def test_idle_engine_costs_only_its_switch() -> None:
    assert price_switch(view("decode"), "prefill", 15.0, CFG, decode_turn_s=40.0) == SwitchPrice(0.0, 15.0)
    assert price_switch(view("prefill"), "decode", 15.0, CFG, decode_turn_s=40.0) == SwitchPrice(0.0, 15.0)


def test_busy_decode_engine_drains_to_the_deadline_and_aborts_what_is_left() -> None:
    v = view("decode", running=20, kv_used=100_000)
    # Turns of 40 s: at the 10 s deadline 1 - 10/40 = 3/4 of the sequences still run; their
    # 75k KV tokens are re-prefilled; the engine is dead 10 s + 15 s.
    p = price_switch(v, "prefill", 15.0, CFG, decode_turn_s=40.0)
    assert (p.drain_s, p.switch_s, p.reprefill_tokens, p.cache_lost_tokens) == (10.0, 15.0, 75_000.0, 0.0)
    assert p.dead_s == 25.0
    # At θᴾ = 50k tokens/s that is 1.5 s of one prefill engine.
    assert p.prefill_engine_s(50_000.0, 0.6) == pytest.approx(1.5)
    # Turns of 5 s finish before the deadline: a 5 s drain, nothing aborted.
    assert price_switch(v, "prefill", 15.0, CFG, decode_turn_s=5.0) == SwitchPrice(5.0, 15.0, 0.0)
    # No turn length known: the KV-full engine reaches the deadline and aborts everything.
    assert price_switch(v, "prefill", 15.0, CFG) == SwitchPrice(10.0, 15.0, 100_000.0)


def test_busy_prefill_engine_loses_its_prefix_cache() -> None:
    # 20k computed tokens/s at a 50% hit ratio = 20k cached tokens/s; over one turn cycle
    # (30 s decode turn + one 10 s window) 800k tokens would have been hit, but the cache
    # holds at most the engine's KV: 500k. Recomputed at θᴾ·(1 - hit) = 25k tokens/s: 20 s.
    v = view("prefill", running=2, rate=20_000.0, hit=0.5, kv_cap=500_000)
    p = price_switch(v, "decode", 15.0, CFG, decode_turn_s=30.0, window_s=10.0)
    assert (p.drain_s, p.switch_s, p.reprefill_tokens, p.cache_lost_tokens) == (2.0, 15.0, 0.0, 500_000.0)
    assert p.prefill_engine_s(50_000.0, 0.5) == pytest.approx(20.0)
    # With room in the cache the cycle decides: 20k x 40 s = 800k.
    big = view("prefill", running=2, rate=20_000.0, hit=0.5, kv_cap=10_000_000)
    assert price_switch(big, "decode", 15.0, CFG, decode_turn_s=30.0).cache_lost_tokens == pytest.approx(800_000.0)


def test_a_switch_in_the_pause_costs_only_what_outlasts_the_pause() -> None:
    v = view("decode", running=20, kv_used=100_000)
    # 3 s of the 5 s pause left: a 15 s switch is dead 12 s beyond it; no drain, no aborts.
    assert price_switch(v, "prefill", 15.0, CFG, decode_turn_s=40.0, pause_left_s=3.0) == SwitchPrice(0.0, 12.0)
    pf = view("prefill", running=2, rate=20_000.0, hit=0.5)
    assert price_switch(pf, "decode", 2.0, CFG, pause_left_s=3.0) == SwitchPrice(0.0, 0.0)


def test_pricing_many_engines_at_once_is_pricing_each() -> None:
    # A mixed list (idle, busy decode, busy prefill with and without cache figures, in-place
    # and restart times): the array pricing equals the hand-checked one engine at a time.
    views = [view("decode"), view("decode", running=20, kv_used=100_000), view("prefill", running=2),
             view("prefill", running=2, rate=20_000.0, hit=0.5, kv_cap=500_000),
             view("prefill", running=1, rate=20_000.0, hit=0.99, kv_cap=0), view("prefill")]
    switch = [15.0, 15.0, 90.0, 15.0, 2.0, 90.0]
    for turn, pause in ((None, 0.0), (40.0, 0.0), (5.0, 0.0), (30.0, 3.0)):
        many = price_switches(views, "prefill", switch, CFG, decode_turn_s=turn, pause_left_s=pause, window_s=10.0)
        assert len(many) == len(views)
        assert [many[i] for i in range(len(views))] == [
            price_switch(v, "prefill", s, CFG, decode_turn_s=turn, pause_left_s=pause, window_s=10.0)
            for v, s in zip(views, switch)]
    # And priced_net takes either form.
    dv = DemandView(7.0, 1.0, 7.0, 1.0, 10.0)
    listed = [SwitchPrice(10.0, 15.0, 75_000.0), SwitchPrice(0.0, 15.0)]
    a, a_old = priced_net(6, 2, "prefill", listed, dv, CFG, 120.0, PricedContext(50_000.0))
    b, b_old = priced_net(6, 2, "prefill", SwitchPrices.of(listed), dv, CFG, 120.0, PricedContext(50_000.0))
    assert a.tolist() == b.tolist() and a_old == b_old


def test_priced_net_by_hand() -> None:
    # 6:2, prefill demand 7 engines, decode 1, over 120 s (S = 10 s): W_P = 840, W_D = 120
    # engine-seconds; f_old = min(720/840, 240/120 -> capped 2) = 6/7.
    # One decode engine to prefill, dead 25 s, re-prefilling 75k tokens at θ 50k (1.5 s):
    # capᴾ = 720 + 95 = 815, W_P = 841.5, capᴰ = 120: f = min(815/841.5, 1.0).
    dv = DemandView(7.0, 1.0, 7.0, 1.0, 10.0)
    prices = [SwitchPrice(10.0, 15.0, 75_000.0)]
    f_new, f_old = priced_net(6, 2, "prefill", prices, dv, CFG, 120.0, PricedContext(50_000.0))
    assert f_old == pytest.approx(6 / 7)
    assert f_new[0] == pytest.approx(815 / 841.5)
    # The now/later split: 10 s at 9 engines, 110 s at 7: W_P = 90 + 770 = 860.
    dv2 = DemandView(9.0, 1.0, 7.0, 1.0, 10.0)
    f_new2, f_old2 = priced_net(6, 2, "prefill", prices, dv2, CFG, 120.0, PricedContext(50_000.0))
    assert f_old2 == pytest.approx(720 / 860)
    assert f_new2[0] == pytest.approx(815 / 861.5)
    # Toward decode: 2:6 with decode demand 7, the prefill engine's lost cache (20 s of
    # a prefill engine) adds to W_P = 1 x 120: capᴾ = 120 -> 120/140; capᴰ = 720 + 103 = 823.
    dv3 = DemandView(1.0, 7.0, 1.0, 7.0, 10.0)
    cache = [SwitchPrice(2.0, 15.0, 0.0, 500_000.0)]
    f_new3, f_old3 = priced_net(2, 6, "decode", cache, dv3, CFG, 120.0, PricedContext(50_000.0, 0.5))
    assert f_old3 == pytest.approx(720 / 840)
    assert f_new3[0] == pytest.approx(min(120 / 140, 823 / 840))


def test_a_backlog_is_counted_once_over_the_lookahead() -> None:
    # 5:3 at a re-prefill burst (S = 10 s, H = 120 s): this window's forecast is 26 prefill
    # engines' worth, 0.1 of it arrivals (the rest queued at its start); the smoothed rate of
    # the windows' whole forecasts is 20, that of their arrivals 3. Decode: 2.5 engines.
    dv = DemandView(26.0, 2.5, 20.0, 2.5, 10.0, prefill_fed_share=0.1, prefill_arrivals_later=3.0)
    prices = [SwitchPrice(0.0, 15.0)]  # an idle decode engine to prefill: dead 15 s
    # Counted once (prefill_backlog_once): W_P = 10 x 26 + 110 x 3 = 590 engine-seconds,
    # W_D = 300. Held: min(600/590, 360/300) = 1.0169. One engine to prefill: capᴾ = 600 +
    # 105, capᴰ = 240: min(705/590, 240/300) = 0.8, a loss: the backlog clears at 5:3
    # within the lookahead, and decode would be short for the rest of it.
    once = _config(prefill_backlog_once=True)
    f_new, f_old = priced_net(5, 3, "prefill", prices, dv, once, 120.0, PricedContext(50_000.0))
    assert f_old == pytest.approx(600 / 590) and f_new[0] == pytest.approx(0.8)
    # Counted in every window it waits in (the default): W_P = 260 + 110 x 20 = 2,460, the
    # burst read as 20 engines of demand for the whole lookahead: 600/2460 -> 705/2460,
    # +17.5%, past the hysteresis.
    f_new_off, f_old_off = priced_net(5, 3, "prefill", prices, dv, CFG, 120.0, PricedContext(50_000.0))
    assert f_old_off == pytest.approx(600 / 2460) and f_new_off[0] == pytest.approx(705 / 2460)
    # A provisioning quantile of the whole forecasts (30) is scaled to the arrivals the same
    # way (30 x 3/20 = 4.5) for a move to decode: W_P = 260 + 110 x 4.5 = 755.
    up = DemandView(26.0, 2.5, 20.0, 2.5, 10.0, prefill_fed_share=0.1, prefill_arrivals_later=3.0,
                    prefill_upper=30.0)
    f_new_d, f_old_d = priced_net(5, 3, "decode", prices, up, once, 120.0, PricedContext(50_000.0))
    assert f_old_d == pytest.approx(600 / 755) and f_new_d[0] == pytest.approx(480 / 755)


def _busy_cluster(cfg: AllocatorConfig) -> Allocator:
    alloc = Allocator(cfg)
    for i in range(15):
        alloc.handle(registered(f"p{i}", "prefill"))
    for i in range(2):
        alloc.handle(registered(f"d{i}", "decode"))
        alloc.handle(stats(f"d{i}", "decode", ts=90.0, running=3, kv_used=100_000))
    return alloc


def test_the_pause_makes_a_marginal_switch_pay() -> None:
    # 15:2, prefill demand 15.5 engines, decode 0.5: the target is 16:1. H = max(120, 4 x 25).
    # Outside the pause: dead 10 + 15 s, 100k tokens re-prefilled (10 s at θ 10k):
    #   f_old = 1800/1860, f_new = min(1895/1870, 120/60) -> gain 4.72% < 5%.
    # In the pause (5 s left): dead 10 s, nothing re-prefilled: 1910/1860 -> +6.1%.
    cfg = _config(in_place_switch_s=15.0)
    out = _busy_cluster(cfg)
    assert [e for e in out.handle(forecast(t=100.0, prefill_engines=15.5, decode_engines=0.5))
            if isinstance(e, EngineCommand)] == []
    assert "below the hysteresis" in out.last_decision.selection.reason
    assert (1895 / 1870) / (1800 / 1860) - 1 == pytest.approx(0.0472, abs=1e-4)

    inside = _busy_cluster(cfg)
    inside.handle(PolicyUpdated(id="pu-1", ts=100.0, run=RUN, version=1))
    assert inside.pause_left() == 5.0
    # The weight sync aborted what the decode engines held: they report empty (a pause
    # counts only then).
    for i in range(2):
        inside.handle(stats(f"d{i}", "decode", ts=100.0))
    cmds = [e for e in inside.handle(forecast(t=100.0, prefill_engines=15.5, decode_engines=0.5))
            if isinstance(e, EngineCommand)]
    assert [c.to_role for c in cmds] == ["prefill"]
    assert "in the pause" in inside.last_decision.selection.reason
    # Its deadline carries no drain: max(min_deadline_s, 2 x (0 + 10)).
    assert cmds[0].deadline == 100.0 + 30.0


def test_a_step_is_planned_for_the_steady_demand_and_holds_through_its_opening() -> None:
    # No switch is ever made here (hysteresis 10x): only the plan is checked.
    alloc = Allocator(_config(hysteresis=10.0))
    for i in range(4):
        alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered(f"d{i}", "decode"))
    alloc.handle(PolicyUpdated(id="pu-1", ts=0.0, run=RUN, version=1))
    # The step's opening (after the pause, within opening_hold_s = 120 s): a prefill burst.
    for t in range(10, 130, 10):
        alloc.handle(forecast(t=float(t), prefill_engines=6.0, decode_engines=1.0))
        assert "holding through the step's opening" in alloc.last_decision.selection.reason
    burst = alloc.last_decision.allocation
    # The rest of the step: decode-heavy, steady; the opening does not enter the steady demand.
    for t in range(130, 500, 10):
        alloc.handle(forecast(t=float(t), prefill_engines=2.0, decode_engines=5.0))
    steady = alloc.last_decision.allocation
    assert steady.n_prefill < burst.n_prefill
    # In the next pause the window sees only the aborted requests, re-queued (prefill-heavy
    # again); the plan is the steady one.
    alloc.handle(PolicyUpdated(id="pu-2", ts=500.0, run=RUN, version=2))
    alloc.handle(forecast(t=500.0, prefill_engines=6.0, decode_engines=0.5))
    got = alloc.last_decision.allocation
    assert (got.n_prefill, got.n_decode) == (steady.n_prefill, steady.n_decode)
    assert got.prefill_demand == pytest.approx(2.0) and got.decode_demand == pytest.approx(5.0, rel=0.05)
    # The paper rule plans every window from its forecast alone and never holds.
    paper = Allocator(_config(hysteresis=10.0, rule="paper"))
    for i in range(4):
        paper.handle(registered(f"p{i}", "prefill"))
        paper.handle(registered(f"d{i}", "decode"))
    paper.handle(PolicyUpdated(id="pu-1", ts=0.0, run=RUN, version=1))
    paper.handle(forecast(t=10.0, prefill_engines=6.0, decode_engines=1.0))
    assert paper.last_decision.allocation.n_prefill == burst.n_prefill
    assert "holding" not in paper.last_decision.selection.reason


def test_no_switch_in_a_steps_opening() -> None:
    # 4:4 idle engines, a forecast that wants 6:2 (idle engines: each move costs only its
    # switch, well past the hysteresis): held within opening_hold_s of the update, made after.
    def cmds(t: float, hold: float = 120.0) -> list:
        alloc = Allocator(_config(opening_hold_s=hold))
        for i in range(4):
            alloc.handle(registered(f"p{i}", "prefill"))
            alloc.handle(registered(f"d{i}", "decode"))
        alloc.handle(PolicyUpdated(id="pu-1", ts=0.0, run=RUN, version=1))
        return [e for e in alloc.handle(forecast(t=t, prefill_engines=6.0, decode_engines=1.5))
                if isinstance(e, EngineCommand)]

    assert cmds(60.0) == []
    assert [c.to_role for c in cmds(130.0)][:1] == ["prefill"]
    assert [c.to_role for c in cmds(60.0, hold=0.0)][:1] == ["prefill"]


def test_cache_regime_on_hand_computed_hits() -> None:
    r = CacheRegime(ratio=2.0, max_s=600.0, alpha=0.5, max_hit=0.95)
    r.on_update(0.0)
    assert not r.cold  # nothing measured yet: nothing to come back to
    # The reference miss ratio: the mean over the first 1/alpha windows, then the EMA.
    r.measured(0.9)
    assert r.miss_ref == pytest.approx(0.1)
    r.measured(0.8)
    assert r.miss_ref == pytest.approx(0.15)
    r.measured(0.99)  # capped at max_hit: a miss ratio of 0.05
    assert r.miss_ref == pytest.approx(0.10)
    r.on_update(100.0)
    assert r.cold
    r.observe(110.0, 0.5)  # miss 0.5 > 2 x 0.1
    assert r.cold
    r.observe(200.0, 0.82)  # miss 0.18 <= 0.2: back
    assert not r.cold and r.miss_ref == pytest.approx(0.10)
    # Never back within max_s: the reuse has changed, and the reference restarts.
    r.on_update(300.0)
    r.observe(850.0, 0.3)
    assert r.cold
    r.observe(950.0, 0.3)
    assert not r.cold and r.miss_ref is None and r.windows == 0
    off = CacheRegime(ratio=0.0, max_s=600.0, alpha=0.5, max_hit=0.95)
    off.measured(0.9)
    off.on_update(0.0)
    assert not off.cold


def test_the_opening_waits_for_the_prefill_cache_and_measures_nothing_cold() -> None:
    # 4:4, prefill engines queueing at hit 0.9 before a weight update (the served rate of
    # 4 and the reference miss ratio 0.1 are measured); after it a forecast that wants 6:2
    # (idle decode engines: each move costs only its switch).
    def run(**kw) -> tuple[Allocator, dict[float, list], dict[float, int]]:
        # (θᴾ from the engines' samples alone: THETA full-prompt tokens/s at the hit of 0.9)
        alloc = _cluster(4, 4, served_ramp_s=0.0, served_min_samples=1, theta_prior_samples=0, **kw)
        cmds: dict[float, list] = {}
        measured: dict[float, int] = {}  # windows measured at 4 prefill engines, after each window

        def window(t: float, hit: float, p: float, d: float) -> None:
            for i in range(4):
                # backlogged engines computing at their capacity, whatever the hit
                alloc.handle(stats(f"p{i}", "prefill", ts=t - 5.0, running=2, queued=3,
                                   prefill_tokens_per_s=THETA * 0.1, cache_hit_rate=hit))
            cmds[t] = [e.to_role for e in alloc.handle(forecast(t=t, prefill_engines=p, decode_engines=d))
                       if isinstance(e, EngineCommand)]
            measured[t] = alloc.served[4][1]

        for t in (10.0, 20.0, 30.0):
            window(t, 0.9, 4.0, 4.0)
        alloc.handle(PolicyUpdated(id="pu-1", ts=100.0, run=RUN, version=2))
        window(230.0, 0.5, 6.0, 1.5)  # past opening_hold_s, the cache still cold
        window(240.0, 0.5, 6.0, 1.5)
        window(250.0, 0.85, 6.0, 1.5)  # miss 0.15 <= 2 x 0.1: back
        return alloc, cmds, measured

    alloc, cmds, measured = run()
    # The reference: miss 0.1 over three windows, then 0.15 in the one the cache came back in.
    assert alloc.cache.miss_ref == pytest.approx((3 * 0.1 + 0.15) / 4)
    assert cmds[230.0] == [] and cmds[240.0] == []
    assert measured[240.0] == 3  # the cold windows were not measured
    assert cmds[250.0][:1] == ["prefill"]
    assert measured[250.0] == 4  # the window the cache came back in was
    # With the rule off the first window after the hold moves, cold or not, and is measured.
    _, cmds_off, measured_off = run(opening_cache_ratio=0.0)
    assert cmds_off[230.0][:1] == ["prefill"] and measured_off[230.0] == 4


def test_the_hit_gauge_of_a_window_that_holds_the_pause_does_not_end_the_cold_cache() -> None:
    # As above, the update at t = 100 s with a 5 s pause. The window at t = 110 s reports
    # [100, 110): the pause and 5 s after it. A prefill engine that has finished no prefill
    # since the update still reports the hit of its prefills before it (0.9, a gauge), which
    # would say the cache is back (miss 0.1 <= 2 x 0.1) before anything was prefilled cold.
    # It is not read: the cache stays cold, and the opening holds until a window wholly
    # after the pause shows it back.
    alloc = _cluster(4, 4, served_ramp_s=0.0, served_min_samples=1, theta_prior_samples=0)
    assert alloc.config.weight_sync_s == 5.0

    def window(t: float, hit: float, p: float = 6.0, d: float = 1.5) -> list[str]:
        for i in range(4):
            alloc.handle(stats(f"p{i}", "prefill", ts=t - 1.0, running=2, queued=3,
                               prefill_tokens_per_s=THETA * 0.1, cache_hit_rate=hit))
        return [e.to_role for e in alloc.handle(forecast(t=t, prefill_engines=p, decode_engines=d))
                if isinstance(e, EngineCommand)]

    for t in (10.0, 20.0, 30.0):
        assert window(t, 0.9, 4.0, 4.0) == []
    alloc.handle(PolicyUpdated(id="pu-1", ts=100.0, run=RUN, version=2))
    assert alloc.cache.cold
    assert window(110.0, 0.9) == []  # the stale gauge: not read
    assert alloc.cache.cold
    assert window(120.0, 0.5) == []  # [110, 120), wholly after the pause: read, miss 0.5 > 2 x 0.1
    assert alloc.cache.cold
    assert window(230.0, 0.5) == []  # past opening_hold_s, still cold
    assert alloc.cache.cold and alloc.served[4][1] == 3  # nothing measured cold
    assert window(250.0, 0.85)[:1] == ["prefill"]  # miss 0.15 <= 0.2: back, and measured
    assert not alloc.cache.cold and alloc.served[4][1] == 4


def test_learned_switch_cost_is_net_of_the_deadline_drain() -> None:
    # The priced rule expects a busy decode engine to drain to the 10 s deadline: a switch
    # reported at 35 s (command to switched) is learned as 25 s of switch.
    alloc = Allocator(_config(switch_cost_alpha=1.0))
    for i in range(4):
        alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered(f"d{i}", "decode"))
        alloc.handle(stats(f"d{i}", "decode", ts=50.0, running=3, kv_used=1_000))
    cmds = [e for e in alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.0))
            if isinstance(e, EngineCommand)]
    assert cmds
    alloc.handle(switched(cmds[0].engine, cmds[0].cmd, "decode", "prefill", ts=95.0, seconds=35.0))
    assert alloc.switch_cost.in_place_s == pytest.approx(25.0)


def _cluster(n_p: int, n_d: int, **kw) -> Allocator:
    alloc = Allocator(_config(**kw))
    for i in range(n_p):
        alloc.handle(registered(f"p{i}", "prefill"))
    for i in range(n_d):
        alloc.handle(registered(f"d{i}", "decode"))
    return alloc


def test_a_count_that_served_less_is_not_gone_back_to() -> None:
    # 6:2 with prefill demand 7, decode 1: the forecast asks for 7:1 (+16.7% before price).
    def cmds(served7: float) -> list:
        alloc = _cluster(6, 2)
        # (EMA of the served full-prompt rate, windows measured, last window's t)
        alloc.served = {6: (100_000.0, 5, 50.0), 7: (served7, 5, 50.0)}
        out = alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
        return [e for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    got, reason = cmds(90_000.0)  # 7:1 was held and served 10% less: vetoed
    assert got == [] and "served less" in reason
    got, _ = cmds(104_000.0)  # 4% more is within the hysteresis (5%): still vetoed
    assert got == []
    got, _ = cmds(106_000.0)  # 6% more: the forecast's move is made
    assert [c.to_role for c in got] == ["prefill"]
    # Evidence older than served_memory_s, or from fewer than served_min_samples windows, does not veto.
    alloc = _cluster(6, 2, served_memory_s=5.0)
    alloc.served = {6: (100_000.0, 5, 50.0), 7: (90_000.0, 5, 50.0)}
    assert [e for e in alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
            if isinstance(e, EngineCommand)]
    alloc = _cluster(6, 2)
    alloc.served = {6: (100_000.0, 5, 50.0), 7: (90_000.0, 2, 50.0)}
    assert [e for e in alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
            if isinstance(e, EngineCommand)]


def test_no_count_past_one_that_served_less_is_moved_to() -> None:
    # 5:3 and the forecast asks for 7:1. 6:2 was held and served 10% less than 5:3; 7:1 was
    # never held. The served rate is unimodal in the prefill count, so 7:1 is vetoed too.
    alloc = _cluster(5, 3)
    alloc.served = {5: (100_000.0, 5, 50.0), 6: (90_000.0, 5, 50.0)}
    out = alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
    assert [e for e in out if isinstance(e, EngineCommand)] == []
    assert "served less" in alloc.last_decision.selection.reason
    # 6:2 never held: the forecast's move goes ahead.
    alloc = _cluster(5, 3)
    alloc.served = {5: (100_000.0, 5, 50.0)}
    out = alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
    assert [c.to_role for c in out if isinstance(c, EngineCommand)][:1] == ["prefill"]


def test_served_rate_is_measured_on_saturated_whole_windows() -> None:
    # served_ramp_s = None: the run's cold first step is measured, and forgotten at the
    # first weight update.
    cold = _cluster(2, 2, hysteresis=10.0, served_ramp_s=None)
    cold.handle(stats("p0", "prefill", ts=5.0, running=2, queued=3, prefill_tokens_per_s=20_000.0))
    cold.handle(forecast(t=10.0, prefill_engines=2.0, decode_engines=2.0))
    assert cold.served == {2: (pytest.approx(20_000.0), 1, 10.0)}
    cold.handle(PolicyUpdated(id="pu-0", ts=20.0, run=RUN, version=1))
    assert cold.served == {}
    # With a ramp (30 s here), the windows within it of the first forecast are not measured.
    alloc = _cluster(2, 2, hysteresis=10.0, served_ramp_s=30.0)  # no switch: only the measurement is checked
    alloc.handle(stats("p0", "prefill", ts=5.0, running=2, queued=3, prefill_tokens_per_s=20_000.0))
    alloc.handle(forecast(t=10.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.served == {}
    alloc.handle(PolicyUpdated(id="pu-0", ts=20.0, run=RUN, version=1))
    alloc.handle(stats("p0", "prefill", ts=45.0, running=2, queued=0, prefill_tokens_per_s=20_000.0, cache_hit_rate=0.5))
    # Prefill engines: 20k computed tokens/s at hit 0.5 (40k full-prompt) and 30k at hit 0
    # (30k): 70k tokens/s served at 2 prefill engines. Nothing queues: no sample.
    alloc.handle(stats("p0", "prefill", ts=55.0, running=2, prefill_tokens_per_s=20_000.0, cache_hit_rate=0.5))
    alloc.handle(stats("p1", "prefill", ts=55.0, running=2, prefill_tokens_per_s=30_000.0, cache_hit_rate=0.0))
    alloc.handle(forecast(t=60.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.served == {}
    alloc.handle(stats("p1", "prefill", ts=65.0, running=2, queued=3, prefill_tokens_per_s=30_000.0, cache_hit_rate=0.0))
    alloc.handle(forecast(t=70.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.served == {2: (pytest.approx(70_000.0), 1, 70.0)}
    # A second window of 50k (p0 at 10k / 0.5): the mean while fewer than 1/served_alpha
    # windows were seen; an EMA of weight served_alpha after that.
    alloc.handle(stats("p0", "prefill", ts=75.0, running=2, prefill_tokens_per_s=10_000.0, cache_hit_rate=0.5))
    alloc.handle(forecast(t=80.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.served[2][0] == pytest.approx(60_000.0)
    # A window that opens within one window + the pause after a weight update is not measured.
    alloc.handle(PolicyUpdated(id="pu-1", ts=85.0, run=RUN, version=2))
    alloc.handle(forecast(t=90.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.served[2][1] == 2


def test_a_replay_rebuilds_the_served_rates() -> None:
    # After a restart the allocator replays the stream without acting: the served rates
    # and backlogs it measured live come back the same.
    events = [stats("p0", "prefill", ts=45.0, running=2, queued=2, prefill_tokens_per_s=20_000.0, cache_hit_rate=0.5),
              stats("p1", "prefill", ts=45.0, running=2, queued=1, prefill_tokens_per_s=30_000.0),
              forecast(t=50.0, prefill_engines=2.0, decode_engines=2.0),
              stats("p0", "prefill", ts=55.0, running=2, queued=4, prefill_tokens_per_s=10_000.0, cache_hit_rate=0.5),
              forecast(t=60.0, prefill_engines=2.0, decode_engines=2.0)]
    live, replayed = (_cluster(2, 2, hysteresis=10.0, served_ramp_s=None) for _ in range(2))
    for ev in events:
        live.handle(ev)
        replayed.handle(ev, act=False)
    assert live.served == replayed.served == {2: (pytest.approx(60_000.0), 2, 60.0)}
    assert replayed.prefill_backlog == live.prefill_backlog == {2: pytest.approx(2.0)}


def _two_six(cfg: AllocatorConfig) -> Allocator:
    """8 idle engines, 2 prefill : 6 decode, with one engine.stats each."""
    alloc = Allocator(cfg)
    for i in range(8):
        role = "prefill" if i < 2 else "decode"
        alloc.handle(registered(f"e{i}", role))
        alloc.handle(stats(f"e{i}", role, ts=1.0))
    return alloc


def test_a_move_waits_until_the_imbalance_outlasts_its_dead_time() -> None:
    # persist_dead_multiple = 1: the move to prefill (idle decode engines: dead time = the
    # 15 s switch) is held until the engines have been off target for 15 s of forecasts.
    alloc = _two_six(_config(in_place_switch_s=15.0, persist_dead_multiple=1.0))
    got, why = {}, {}
    for t in (100.0, 110.0, 120.0):
        out = alloc.handle(forecast(t=t, prefill_engines=6.0, decode_engines=1.0))
        got[t] = [e for e in out if isinstance(e, EngineCommand)]
        why[t] = alloc.last_decision.selection.reason
    assert got[100.0] == [] and got[110.0] == []
    assert "has lasted 10s < 15s (1 x a switch's dead time)" in why[110.0]
    assert got[120.0] and all(c.to_role == "prefill" for c in got[120.0])
    # Off (the default): the same forecasts move at once.
    now = _two_six(_config(in_place_switch_s=15.0))
    assert [e for e in now.handle(forecast(t=100.0, prefill_engines=6.0, decode_engines=1.0))
            if isinstance(e, EngineCommand)]


def test_the_veto_yields_when_the_engines_show_the_need_now() -> None:
    # 6:2, the forecast asks for 7:1, and 7:1 served 10% less when it was held: vetoed,
    # unless the prefill engines queue (5 a engine > 4) while decode idles (KV 20% < 50%,
    # no queue): then the engines' state, not an average over other phases, decides.
    def cmds(prefill_queue: int, decode_kv: int, yields: bool = True) -> list:
        alloc = _cluster(6, 2, served_veto_yields_to_state=yields)
        for i in range(6):
            alloc.handle(stats(f"p{i}", "prefill", ts=55.0, running=2, queued=prefill_queue))
        for i in range(2):
            alloc.handle(stats(f"d{i}", "decode", ts=55.0, running=3, kv_used=decode_kv))
        alloc.served = {6: (100_000.0, 5, 50.0), 7: (90_000.0, 5, 50.0)}
        out = alloc.handle(forecast(t=60.0, prefill_engines=7.0, decode_engines=1.0))
        return [e for e in out if isinstance(e, EngineCommand)]

    kv_cap = KV  # every engine's KV capacity (registered())
    assert [c.to_role for c in cmds(5, kv_cap // 5)] == ["prefill"]
    assert cmds(4, kv_cap // 5) == []  # 4 queued a engine is not more than 4
    assert cmds(5, kv_cap * 6 // 10) == []  # decode at 60% KV is not idle
    assert cmds(5, kv_cap // 5, yields=False) == []


def test_a_full_decode_pool_lifts_the_capacity_ceiling_not_a_measured_rate() -> None:
    # 7:1 (θᴾ 10k tokens/s, 7:1 served 66k with its prefill engines queueing) and a forecast
    # that wants 6:2. While the prefill engines queue too (6 a engine, so role_pressed does
    # not yield), 6 x θᴾ = 60k < 66k x 1.05 holds 7:1, unless the one decode engine's KV is
    # full (90% > 85%): the rollout then goes at decode's pace, and prefill's capacity alone
    # bounds nothing. A rate measured at 6:2 (the closed loop's answer there) still holds.
    def cmds(decode_kv: int, served6: float | None = None) -> tuple[list, str]:
        alloc = _cluster(7, 1)
        for i in range(7):
            alloc.handle(stats(f"p{i}", "prefill", ts=55.0, running=2, queued=6))
        alloc.handle(stats("d0", "decode", ts=55.0, running=40, queued=8, kv_used=decode_kv))
        alloc.served = {7: (66_000.0, 5, 50.0)} | ({6: (served6, 5, 50.0)} if served6 else {})
        alloc.prefill_backlog = {7: 2.0}
        alloc.theta.value = 10_000.0
        out = alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=2.0))
        return [e.to_role for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    held, why = cmds(KV * 8 // 10)
    assert held == [] and "can serve less (count x θᴾ)" in why
    moved, why = cmds(KV * 9 // 10)
    assert moved == ["decode"], why
    held, why = cmds(KV * 9 // 10, served6=60_000.0)
    assert held == [] and "served less than 7" in why


def test_decode_full_reads_the_decode_pools_kv() -> None:
    def v(role: str, kv: int, cap: int = 100) -> EngineView:
        return EngineView(engine=f"{role}{kv}{cap}", server="s", role=role, gpus=8, kv_capacity_tokens=cap,
                          kv_used_tokens=kv)

    assert decode_full([v("prefill", 0), v("decode", 86)])
    assert not decode_full([v("prefill", 0), v("decode", 85)])  # not more than 85%
    assert not decode_full([v("decode", 100), v("decode", 60)])  # the pool: 80%
    assert decode_full([v("prefill", 100, 100), v("decode", 90), v("decode", 90)])  # prefill's KV is not read
    switching = v("decode", 100)
    switching.switching_to = "prefill"
    assert not decode_full([switching, v("decode", 10)])  # an engine mid-switch is left out
    assert not decode_full([v("prefill", 0)])  # no decode engine


def test_role_pressed_reads_saturated_and_idle_roles() -> None:
    def v(role: str, queued: int = 0, kv: int = 0) -> EngineView:
        return EngineView(engine=f"{role}{queued}{kv}", server="s", role=role, gpus=8, kv_capacity_tokens=100,
                          queued_reqs=queued, kv_used_tokens=kv)

    assert role_pressed([v("prefill", 5), v("decode", 0, 49)], "prefill")
    assert not role_pressed([v("prefill", 5), v("decode", 1, 10)], "prefill")  # decode queues
    assert role_pressed([v("prefill", 0), v("decode", 0, 86)], "decode")  # KV over 85%
    assert role_pressed([v("prefill", 0), v("decode", 5, 10)], "decode")  # decode queue over 4
    assert not role_pressed([v("prefill", 1), v("decode", 5, 90)], "decode")  # prefill queues too
    switching = v("decode", 0, 99)
    switching.switching_to = "prefill"
    assert not role_pressed([v("prefill", 0), switching], "decode")  # no decode engine serving
    # A shortage: a decode queue counts only with the decode pool's KV at least half used.
    assert not role_pressed([v("prefill", 0), v("decode", 5, 41)], "decode", short=True)
    assert role_pressed([v("prefill", 0), v("decode", 5, 50)], "decode", short=True)
    assert role_pressed([v("prefill", 0), v("decode", 0, 86)], "decode", short=True)  # KV over 85%
    assert role_pressed([v("prefill", 5), v("decode", 0, 49)], "prefill", short=True)


def test_no_move_on_the_forecast_alone_before_a_served_rate() -> None:
    # 4:4 idle engines and a forecast that wants 6:2 (prefill 6 engines, decode 1.5): the
    # gain is well past the hysteresis (f from min(4/6, 4/1.5 -> 2) = 0.67 to about 1).
    # With no count's served rate measured yet, the move waits: the gain rests on priors.
    def cmds(served=None, prefill_queue: int = 0, decode_kv: int = 0, first: bool = True) -> tuple[list, str]:
        alloc = _cluster(4, 4, served_evidence_first=first)
        for i in range(4):
            alloc.handle(stats(f"p{i}", "prefill", ts=55.0, running=2, queued=prefill_queue))
            alloc.handle(stats(f"d{i}", "decode", ts=55.0, running=3, kv_used=decode_kv))
        alloc.served = dict(served or {})
        out = alloc.handle(forecast(t=60.0, prefill_engines=6.0, decode_engines=1.5))
        return [e.to_role for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    got, reason = cmds()
    assert got == [] and "no prefill count has a served rate yet" in reason
    # Once a count has a served rate (here the current one, 5 windows), the forecast's move is made.
    assert cmds({4: (40_000.0, 5, 50.0)})[0][:1] == ["prefill"]
    # Too few windows (2 < served_min_samples) are no evidence yet.
    assert cmds({4: (40_000.0, 2, 50.0)})[0] == []
    # The engines showing the need now is evidence: prefill queues 5 a engine (> 4) while
    # decode idles (KV 20% < 50%, no queue).
    assert cmds(prefill_queue=5, decode_kv=KV // 5)[0][:1] == ["prefill"]
    assert cmds(prefill_queue=5, decode_kv=KV * 6 // 10)[0] == []  # decode at 60% KV is not idle
    # Off: the forecast alone decides from the first window.
    assert cmds(first=False)[0][:1] == ["prefill"]


def test_before_a_served_rate_a_decode_queue_with_free_kv_is_no_evidence() -> None:
    # 7:1, a forecast that wants 5:3 (prefill 4 engines, decode 3), no served rate yet, the
    # prefill engines idle. The decode engine holds 5 queued requests (> 4): at 41% KV that is
    # a burst its next iteration admits, so the move waits for a served rate; at 60% KV the
    # queue waits for KV, a shortage another decode engine relieves, and the move is made.
    def cmds(decode_kv: int) -> tuple[list, str]:
        alloc = _cluster(7, 1, served_evidence_first=True)
        for i in range(7):
            alloc.handle(stats(f"p{i}", "prefill", ts=55.0, running=2))
        alloc.handle(stats("d0", "decode", ts=55.0, running=3, queued=5, kv_used=decode_kv))
        out = alloc.handle(forecast(t=60.0, prefill_engines=4.0, decode_engines=3.0))
        return [e.to_role for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    got, reason = cmds(KV * 41 // 100)
    assert got == [] and "no prefill count has a served rate yet" in reason
    got, reason = cmds(KV * 6 // 10)
    assert got[:1] == ["decode"], reason


def test_prefill_room_by_hand() -> None:
    # Four prefill engines, none queued; share 0.5: the engines left must number at least
    # twice the demand (the larger of now, later and the provisioning quantile), and one.
    pre = [view("prefill") for _ in range(4)] + [view("decode")]
    def room(now: float, later: float, upper=None, share: float = 0.5, engines=pre) -> int:
        return prefill_room(engines, DemandView(now, 1.0, later, 1.0, 10.0, prefill_upper=upper), 4, share)
    assert room(0.2, 0.1) == 3  # 0.2 / 0.5 = 0.4: one engine left is enough
    assert room(0.2, 1.2) == 1  # 1.2 / 0.5 = 2.4: three engines stay
    assert room(0.2, 0.1, upper=1.6) == 0  # the quantile, 1.6 / 0.5 = 3.2: all four stay
    assert room(1.0, 1.0) == 2  # exactly 2 x the demand left
    assert room(0.2, 0.1, share=1.0) == 3 and room(1.5, 1.5, share=1.0) == 2
    assert room(0.2, 0.1, share=0.0) == 0  # off
    # A prefill pool that queues (0.5 requests an engine or more) has no room to give.
    queued = [EngineView(engine="e", server="s", role="prefill", gpus=8, kv_capacity_tokens=100_000,
                         switch_modes=("in_place",), queued_reqs=1) for _ in range(4)] + [view("decode")]
    assert room(0.2, 0.1, engines=queued) == 0


def test_before_a_served_rate_a_prefill_pool_with_room_gives_engines_to_decode() -> None:
    # 4:4 idle engines, no served rate yet, a forecast that asks for little prefill and much
    # decode (a math step's decode), judged by saturation (a synchronous run's objective).
    # The prefill engines never queue, so no served rate will come; a move to decode is made
    # as far as the prefill engines left serve twice the forecast's prefill demand
    # (served_evidence_idle_share 0.5). Under the capacity ratio (an asynchronous run's) it
    # waits for a served rate.
    def cmds(prefill: float, queued: int = 0, share: float = 0.5, objective: str = "saturation") -> tuple[list, str]:
        alloc = _cluster(4, 4, served_evidence_first=True, served_evidence_idle_share=share, objective=objective)
        for i in range(4):
            alloc.handle(stats(f"p{i}", "prefill", ts=55.0, queued=queued))
            alloc.handle(stats(f"d{i}", "decode", ts=55.0, running=40, kv_used=KV // 4))
        out = alloc.handle(forecast(t=60.0, prefill_engines=prefill, decode_engines=6.0))
        return [e.to_role for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    got, reason = cmds(0.2)
    assert got and set(got) == {"decode"} and len(got) <= 3, reason
    got, reason = cmds(1.2)  # 1.2 engines of prefill work: three engines stay, one may move
    assert got == ["decode"], reason
    for kw in ({"prefill": 1.6}, {"prefill": 0.2, "queued": 1}, {"prefill": 0.2, "share": 0.0},
               {"prefill": 0.2, "objective": "capacity"}):
        got, reason = cmds(**kw)
        assert got == [] and "no prefill count has a served rate yet" in reason, kw


def test_a_move_to_decode_needs_fewer_prefill_engines_to_serve_more() -> None:
    # 7:1 idle engines, θᴾ = 10k tokens/s. The forecast wants 5:3 (prefill 4 engines, decode
    # 3: band [4, 5]); moving 1 engine gives f = min(6/4, 2/3) ~ 0.67, 2 engines min(5/4, 1) ~ 1,
    # from min(7/4, 1/3) = 0.33. While the current count's prefill engines queue (0.5 or
    # more a engine over its measured windows), a count never held can serve at most
    # count x θᴾ.
    def cmds(served: dict, ceiling: bool = True, decode_kv: int = 0, backlog: float = 2.0) -> tuple[list, str]:
        alloc = _cluster(7, 1, served_capacity_ceiling=ceiling)
        for i in range(7):
            alloc.handle(stats(f"p{i}", "prefill", ts=55.0, running=2))
        alloc.handle(stats("d0", "decode", ts=55.0, running=3, kv_used=decode_kv))
        alloc.served = served
        alloc.prefill_backlog = {7: backlog}
        out = alloc.handle(forecast(t=60.0, prefill_engines=4.0, decode_engines=3.0))
        return [e.to_role for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    # 7:1 served 66k tokens/s: 6 x 10k = 60k < 66k x 1.05 = 69.3k, and 5 x 10k less still.
    got, reason = cmds({7: (66_000.0, 5, 50.0)})
    assert got == [] and "can serve less (count x θᴾ)" in reason
    # 7:1 served 50k: 6:2 can serve 60k >= 52.5k, 5:3 only 50k < 52.5k: one engine moves.
    assert cmds({7: (50_000.0, 5, 50.0)})[0] == ["decode"]
    # 7:1 served 40k (prefill idles part of the time): 5:3's 50k >= 42k: both move.
    assert cmds({7: (40_000.0, 5, 50.0)})[0] == ["decode", "decode"]
    # Prefill engines that queued 0.4 a engine had room to give: θᴾ, measured on backlogged
    # engines only, bounds nothing then, and the forecast judges.
    assert cmds({7: (66_000.0, 5, 50.0)}, backlog=0.4)[0] == ["decode", "decode"]
    assert cmds({7: (66_000.0, 5, 50.0)}, backlog=0.5)[0] == []
    # A count that was held is judged by what it served, not by the ceiling: 6:2 served 70k.
    assert cmds({7: (66_000.0, 5, 50.0), 6: (70_000.0, 5, 50.0)})[0] == ["decode"]
    # The ceiling yields to the engines' state as the veto does: decode at 90% KV (> 85%)
    # with no prefill queue.
    assert cmds({7: (66_000.0, 5, 50.0)}, decode_kv=KV * 9 // 10)[0] == ["decode", "decode"]
    # Off: the forecast alone judges a count never held.
    assert cmds({7: (66_000.0, 5, 50.0)}, ceiling=False)[0] == ["decode", "decode"]


def test_the_prefill_backlog_is_measured_with_the_served_rate() -> None:
    # Two saturated whole windows at 2 prefill engines (after a 0 s ramp): 3 + 1 queued
    # (2 a engine), then 0 + 1 (0.5 a engine): the mean, 1.25, as the rate's.
    alloc = _cluster(2, 2, hysteresis=10.0, served_ramp_s=0.0)
    alloc.handle(stats("p0", "prefill", ts=5.0, running=2, queued=3, prefill_tokens_per_s=20_000.0))
    alloc.handle(stats("p1", "prefill", ts=5.0, running=2, queued=1, prefill_tokens_per_s=20_000.0))
    alloc.handle(forecast(t=10.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.prefill_backlog == {2: pytest.approx(2.0)}
    alloc.handle(stats("p0", "prefill", ts=15.0, running=2, queued=0, prefill_tokens_per_s=20_000.0))
    alloc.handle(forecast(t=20.0, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.served[2][1] == 2 and alloc.prefill_backlog == {2: pytest.approx(1.25)}


def test_the_closed_loop_couples_each_roles_work_to_what_the_other_serves() -> None:
    # 7:1, prefill demand 7 engines, decode 4, over 120 s (S = 10 s): W_P = 840, W_D = 480
    # engine-seconds. Before: prefill serves all of its work (720+120 = 840 / 840 = 1),
    # decode a quarter (120/480), so f_old = 0.25. Idle engines: each move is dead 15 s.
    dv = DemandView(7.0, 4.0, 7.0, 4.0, 10.0)
    prices = [SwitchPrice(0.0, 15.0), SwitchPrice(0.0, 15.0)]
    # Taken as given (coupling 0): one engine to decode gives min(720/840, 225/480) =
    # 0.469, two give min(600/840, 330/480) = 0.6875: both, toward the 4 decode engines.
    flat, f_old = priced_net(7, 1, "decode", prices, dv, _config(), 120.0, PricedContext(50_000.0))
    assert f_old == pytest.approx(0.25)
    assert list(flat) == pytest.approx([225 / 480, 330 / 480])
    # Coupled (1): decode then serves 225/480 = 0.469 of its work instead of 0.25, so the
    # turns it finishes feed prefill 1.875x the work (1575); prefill serving 6/7 feeds
    # decode 6/7 of it (411.4): f = min(720/1575, 225/411.4) = 0.457. Two engines: decode
    # serves 0.6875 (g = 2.75: prefill work 2310), f = min(600/2310, 330/342.9) = 0.260.
    coupled, f_old_c = priced_net(7, 1, "decode", prices, dv, _config(closed_loop_coupling=1.0), 120.0,
                                  PricedContext(50_000.0))
    assert f_old_c == pytest.approx(0.25)
    g1, g2 = (225 / 480) / 0.25, (330 / 480) / 0.25
    assert list(coupled) == pytest.approx([min(720 / (840 * g1), 225 / (480 * 6 / 7)),
                                           min(600 / (840 * g2), 330 / (480 * 5 / 7))])
    assert coupled[0] == pytest.approx(0.45714, abs=1e-5) and coupled[1] == pytest.approx(0.25974, abs=1e-5)
    # So the coupled test moves one engine, not two: the second would only move the pile.
    assert int(np.argmax(coupled)) == 0 and int(np.argmax(flat)) == 1
    # Half coupled: prefill work x (1 + 0.5 x 0.875) for one engine.
    half, _ = priced_net(7, 1, "decode", prices, dv, _config(closed_loop_coupling=0.5), 120.0, PricedContext(50_000.0))
    assert half[0] == pytest.approx(min(720 / (840 * (1 + 0.5 * (g1 - 1))), 225 / (480 * (1 - 0.5 / 7))))


def test_no_coupling_where_no_role_is_short() -> None:
    # 4:4 with 2 engines of demand each: both roles serve all their work before and after
    # one move, so the coupled test equals the flat one.
    dv = DemandView(2.0, 2.0, 2.0, 2.0, 10.0)
    prices = [SwitchPrice(0.0, 15.0)]
    flat, old = priced_net(4, 4, "prefill", prices, dv, _config(), 120.0, PricedContext(50_000.0))
    coupled, old_c = priced_net(4, 4, "prefill", prices, dv, _config(closed_loop_coupling=1.0), 120.0,
                                PricedContext(50_000.0))
    assert (list(coupled), old_c) == (list(flat), old)


def test_a_second_move_the_same_way_waits_until_the_first_has_settled() -> None:
    # 2:6, prefill demand 6 engines: the first plan moves decode engines to prefill; at most
    # 2 of 8 a plan (max_switch_fraction 0.25, applied to the first plan too here).
    alloc = _two_six(_config(settle_s=120.0, max_switch_fraction=0.25, initial_switch_fraction=0.25))

    def plan(t: float) -> list:
        return [e for e in alloc.handle(forecast(t=t, prefill_engines=6.0, decode_engines=1.0))
                if isinstance(e, EngineCommand)]

    first = plan(100.0)
    assert len(first) == 2 and all(c.to_role == "prefill" for c in first)
    for c in first:
        alloc.handle(switched(c.engine, c.cmd, "decode", "prefill", ts=116.0))
    # The same forecast 10 s and 110 s later: still short of the target, but the first
    # move's effect has not come round the loop yet.
    assert plan(110.0) == [] and plan(210.0) == []
    assert "the last move to prefill has not settled (110s < 120s)" in alloc.last_decision.selection.reason
    # 120 s after the first plan, the next move is made.
    assert len(plan(220.0)) == 2
    # Off: the second plan follows at once.
    now = _two_six(_config(settle_s=0.0, max_switch_fraction=0.25, initial_switch_fraction=0.25))
    cmds = [e for e in now.handle(forecast(t=100.0, prefill_engines=6.0, decode_engines=1.0)) if isinstance(e, EngineCommand)]
    for c in cmds:
        now.handle(switched(c.engine, c.cmd, "decode", "prefill", ts=116.0))
    assert [e for e in now.handle(forecast(t=120.0, prefill_engines=6.0, decode_engines=1.0))
            if isinstance(e, EngineCommand)]


def test_a_failed_move_does_not_hold_the_next_one() -> None:
    alloc = _two_six(_config(settle_s=120.0, max_switch_fraction=0.25, initial_switch_fraction=0.25,
                             failure_cooldown_s=300.0))
    first = [e for e in alloc.handle(forecast(t=100.0, prefill_engines=6.0, decode_engines=1.0))
             if isinstance(e, EngineCommand)]
    assert first
    alloc.handle(failed(first[0].engine, first[0].cmd, "decode", ts=105.0))
    again = [e for e in alloc.handle(forecast(t=110.0, prefill_engines=6.0, decode_engines=1.0))
             if isinstance(e, EngineCommand)]
    assert again and first[0].engine not in {c.engine for c in again}


def test_only_the_decode_demand_the_prefills_bring_is_coupled() -> None:
    # 2:6, prefill demand 6 engines, decode 7, over 120 s: W_P = 720, W_D = 840; before,
    # prefill serves 240/720 = 1/3 of its work and decode 720/840 = 6/7. One decode engine
    # to prefill (dead 15 s): capᴾ = 345 (prefill serves 345/720, g_P = 1.4375), capᴰ = 600
    # (decode serves 600/840, g_D = 0.8333, so W_P = 600 and capᴾ/W_P = 0.575).
    prices = [SwitchPrice(0.0, 15.0)]
    cfg = _config(closed_loop_coupling=1.0)
    g_p = (345 / 720) / (240 / 720)
    # All of the decode demand fed by the prefills: W_D = 840 x 1.4375 = 1207.5, and decode
    # binds at 600/1207.5 = 0.497.
    fed, _ = priced_net(2, 6, "prefill", prices, DemandView(6.0, 7.0, 6.0, 7.0, 10.0), cfg, 120.0,
                        PricedContext(50_000.0))
    assert fed[0] == pytest.approx(600 / (840 * g_p)) and fed[0] == pytest.approx(0.4969, abs=1e-4)
    # Half of it resident KV (the forecast's K̂ᴰ is half of Kᴰ + K̂ᴰ): W_D = 840 x (1 + 0.5 x
    # 0.4375) = 1023.75, decode at 0.586, so prefill binds at 345/600 = 0.575.
    half, _ = priced_net(2, 6, "prefill", prices, DemandView(6.0, 7.0, 6.0, 7.0, 10.0, decode_fed_share=0.5), cfg,
                         120.0, PricedContext(50_000.0))
    assert half[0] == pytest.approx(min(345 / 600, 600 / (840 * (1 + 0.5 * (g_p - 1)))))
    assert half[0] == pytest.approx(0.575)


def test_only_the_prefill_demand_arrivals_bring_is_coupled() -> None:
    # The first test's 7:1 (prefill demand 7 engines, decode 4, over 120 s: W_P = 840,
    # W_D = 480), one engine to decode: decode then serves 225/480 of its work instead of
    # 120/480 (g_D = 1.875), prefill 720/840.
    prices = [SwitchPrice(0.0, 15.0)]
    cfg = _config(closed_loop_coupling=1.0)
    g_d = (225 / 480) / 0.25
    # All of the prefill demand fed by the loop: W_P = 840 x 1.875 = 1575, prefill binds at
    # 720/1575 = 0.457.
    fed, _ = priced_net(7, 1, "decode", prices, DemandView(7.0, 4.0, 7.0, 4.0, 10.0), cfg, 120.0,
                        PricedContext(50_000.0))
    assert fed[0] == pytest.approx(720 / (840 * g_d))
    # Three quarters of it a backlog queued now (fed share 0.25): the backlog is cleared
    # once whatever decode serves, so W_P = 840 x (1 + 0.25 x 0.875) = 1023.75, prefill at
    # 720/1023.75 = 0.703; decode (fed by prefill's 6/7) at 225/411.4 = 0.547 binds.
    part, _ = priced_net(7, 1, "decode", prices, DemandView(7.0, 4.0, 7.0, 4.0, 10.0, prefill_fed_share=0.25), cfg,
                         120.0, PricedContext(50_000.0))
    assert part[0] == pytest.approx(min(720 / (840 * (1 + 0.25 * (g_d - 1))), 225 / (480 * 6 / 7)))
    assert part[0] == pytest.approx(0.546875)
    # All backlog (share 0): the work is taken as given on the prefill side.
    none, _ = priced_net(7, 1, "decode", prices, DemandView(7.0, 4.0, 7.0, 4.0, 10.0, prefill_fed_share=0.0), cfg,
                         120.0, PricedContext(50_000.0))
    assert none[0] == pytest.approx(min(720 / 840, 225 / (480 * 6 / 7)))


def test_the_latency_term_is_worth_the_step_speedup_it_buys() -> None:
    # 4:4, no prefill demand, decode KV 3 engines' worth, and a latency-balance term asking
    # for 20 engines (a decode phase with no admissions). Step t(n) = 0.04 + 0.01/n s.
    # Idle engines: a move is dead 15 s, over 120 s.
    prices = [SwitchPrice(0.0, 15.0)]
    ctx = PricedContext(50_000.0)
    # As a share of engines: f_old = 480/2400 = 0.2, one more decode engine 585/2400: +21.9%.
    flat = DemandView(0.0, 20.0, 0.0, 20.0, 10.0)
    f_flat, f_flat_old = priced_net(4, 4, "decode", prices, flat, CFG, 120.0, ctx)
    assert (f_flat_old, f_flat[0]) == pytest.approx((0.2, 585 / 2400))
    # By its step: 4 engines run the step at t(20)/t(4) = 0.0405/0.0425 of the balanced
    # pace; 4.875 engines on average (585 engine-seconds over 120 s) at 0.0405/0.042051.
    # The KV share (480/360, 585/360) does not bind. Gain +1.07%: under the hysteresis.
    by_step = DemandView(0.0, 20.0, 0.0, 20.0, 10.0, decode_kv_now=3.0, decode_kv_later=3.0,
                         decode_step=(0.04, 0.01))
    f_new, f_old = priced_net(4, 4, "decode", prices, by_step, CFG, 120.0, ctx)
    assert f_old == pytest.approx(0.0405 / 0.0425)
    assert f_new[0] == pytest.approx(0.0405 / (0.04 + 0.01 / 4.875))
    assert f_new[0] / f_old - 1 == pytest.approx(0.0107, abs=1e-4)
    # Where the KV share binds, it is the ratio: KV 5 engines' worth on 4 engines (0.8),
    # 585/600 = 0.975 after the move.
    kv_short = DemandView(0.0, 20.0, 0.0, 20.0, 10.0, decode_kv_now=5.0, decode_kv_later=5.0,
                          decode_step=(0.04, 0.01))
    f_kv, f_kv_old = priced_net(4, 4, "decode", prices, kv_short, CFG, 120.0, ctx)
    assert (f_kv_old, f_kv[0]) == pytest.approx((0.8, min(585 / 600, 0.0405 / (0.04 + 0.01 / 4.875))))
    # With no latency excess (decode demand = its KV share) the ratio is the capacity one.
    kv_only = DemandView(0.0, 5.0, 0.0, 5.0, 10.0, decode_kv_now=5.0, decode_kv_later=5.0, decode_step=(0.04, 0.01))
    f_k, f_k_old = priced_net(4, 4, "decode", prices, kv_only, CFG, 120.0, ctx)
    assert (f_k_old, f_k[0]) == pytest.approx((0.8, 585 / 600))



def test_engines_past_the_spread_shorten_no_step() -> None:
    # 6:2 at a step's tail: prefill 2.96 engines, decode KV 0.1 engines' worth and a latency
    # term of 1.49 engines; idle engines, a move dead 15 s, over 120 s.
    prices = [SwitchPrice(0.0, 15.0)]
    ctx = PricedContext(50_000.0)
    flat = DemandView(2.96, 1.49, 2.96, 1.49, 10.0, decode_kv_now=0.1, decode_kv_later=0.1)
    # As a share of engines: min(720/355.2, 240/178.8) = 1.342 -> min(600/355.2, 345/178.8)
    # = 1.689 after one engine to decode, +25.9%.
    f, f_old = priced_net(6, 2, "decode", prices, flat, CFG, 120.0, ctx)
    assert (f_old, f[0]) == pytest.approx((240 / 178.8, 600 / 355.2))
    # With 24 sequences on engines of 16 ranks (spread 1.5 engines), the work beyond KV is
    # served by at most 1.5 x 120 = 180 engine-seconds: 180/178.8 before and after, and the
    # prefill engine given away costs its share for nothing.
    spread = replace(flat, decode_spread=1.5)
    f, f_old = priced_net(6, 2, "decode", prices, spread, CFG, 120.0, ctx)
    assert (f_old, f[0]) == pytest.approx((180 / 178.8, 180 / 178.8))
    # The KV share still binds where it is short: KV 2.5 engines' worth on 2 engines.
    kv_short = replace(spread, decode_kv_now=2.5, decode_kv_later=2.5, decode_now=2.5, decode_later=2.5)
    f, f_old = priced_net(6, 2, "decode", prices, kv_short, CFG, 120.0, ctx)
    assert (f_old, f[0]) == pytest.approx((240 / 300, min(345 / 300, 600 / 355.2)))


def test_the_step_speed_up_stops_at_the_spread() -> None:
    # The latency term priced by its step (test above): 4:4, the term asks for 20 engines,
    # t(n) = 0.04 + 0.01/n. With the sequences spread over at most 4.5 engines, the pool
    # of 4 runs at t(4.5)/t(4) = 0.042222/0.0425 of the balanced pace, and 4.875 engines at
    # t(4.5)/t(4.5) = 1: +0.65%, where the uncapped pace gained +1.07%.
    prices = [SwitchPrice(0.0, 15.0)]
    ctx = PricedContext(50_000.0)
    dv = DemandView(0.0, 20.0, 0.0, 20.0, 10.0, decode_kv_now=3.0, decode_kv_later=3.0, decode_step=(0.04, 0.01),
                    decode_spread=4.5)
    f_new, f_old = priced_net(4, 4, "decode", prices, dv, CFG, 120.0, ctx)
    assert f_old == pytest.approx((0.04 + 0.01 / 4.5) / 0.0425)
    assert f_new[0] == pytest.approx(1.0)
    # At a spread of 4 the pool already steps at one sequence a rank: no gain at all.
    f_new, f_old = priced_net(4, 4, "decode", prices, replace(dv, decode_spread=4.0), CFG, 120.0, ctx)
    assert f_new[0] == pytest.approx(f_old) == pytest.approx(1.0)


def _decode_phase(by_step: bool, per_seq_s: float, admit: float) -> str:
    """4:4, four decode engines of 100 sequences (50k KV each), prefill demand 0.5 engines,
    decode KV 2 engines' worth; ``admit`` KV tokens admitted a window (the decode turn is
    S·Kᴰ/Âᴰ). Returns the selection's reason."""
    from prorsa_schemas import ForecastWindow

    cfg = _config(decode_latency_by_step=by_step, decode_step_fixed_s=0.04, decode_step_per_seq_s=per_seq_s,
                  decode_step_per_kv_token_s=0.0)
    alloc = Allocator(cfg)
    for i in range(4):
        alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered(f"d{i}", "decode"))
        alloc.handle(stats(f"d{i}", "decode", ts=90.0, running=100, kv_used=50_000))
    alloc.handle(ForecastWindow(id=f"fc-{by_step}-{admit}", ts=100.0, run=RUN, t=100.0, horizon=10.0,
                                prefill_tokens=0.5 * 10.0 * THETA, decode_admit_tokens=admit,
                                decode_kv_tokens=0.0, decode_kv_now=2.0 * KV))
    return alloc.last_decision.selection.reason


def test_the_step_prices_the_latency_term_only_where_a_turn_outlasts_the_horizon() -> None:
    # A decode turn of 2,000 s (1k tokens admitted a window on 200k held) and a light step
    # (c = 400 x 1e-5 = 4 ms on t0 = 40 ms): the latency term asks for ~4.4 engines. As a
    # share of engines one more decode engine pays (+20%); by its step, 0.5%: no move.
    assert "engine(s) to decode" in _decode_phase(False, 1e-5, 1_000.0)
    assert "below the hysteresis" in _decode_phase(True, 1e-5, 1_000.0)
    # A turn of 20 s (100k admitted) and a heavy step (c = 0.4 s): the term asks for more
    # than the KV share, and the turns cycle within the horizon, so the capacity view is
    # kept: the decision is the same whether the step pricing is on or off (+19.5%; by the
    # step it would read t(2.39)/t(4) = 1.48 -> t(2.39)/t(4.875) = 1.70, +15%).
    assert _decode_phase(True, 1e-3, 100_000.0) == _decode_phase(False, 1e-3, 100_000.0)
    assert "decode" in _decode_phase(True, 1e-3, 100_000.0)


def test_priced_net_provisions_the_donor_prefill_to_its_upper_demand() -> None:
    # 2:6 toward decode, prefill now 1 engine, later 1 (smoothed) but 2 at the quantile:
    # W_P = 10 x 1 + 110 x 2 = 230 engine-seconds against capᴾ 120 after the move.
    dv = DemandView(1.0, 7.0, 1.0, 7.0, 10.0, prefill_upper=2.0)
    idle = [SwitchPrice(0.0, 15.0)]
    f_new, f_old = priced_net(2, 6, "decode", idle, dv, CFG, 120.0, PricedContext(50_000.0))
    assert f_old == pytest.approx(min(240 / 230, 720 / 840))
    assert f_new[0] == pytest.approx(min(120 / 230, 825 / 840))
    # Toward prefill the upper bound plays no part: prefill is the role that gains.
    f_up, _ = priced_net(2, 6, "prefill", idle, dv, CFG, 120.0, PricedContext(50_000.0))
    f_plain, _ = priced_net(2, 6, "prefill", idle, DemandView(1.0, 7.0, 1.0, 7.0, 10.0), CFG, 120.0,
                            PricedContext(50_000.0))
    assert f_up[0] == pytest.approx(f_plain[0])


def test_a_calm_spell_does_not_give_away_the_engines_the_last_burst_needed() -> None:
    # 6:2 idle engines. Three windows of prefill demand 7 engines (a burst), then eighteen
    # calm ones at 4; decode demand 2.5 throughout. At t = 200 the smoothed level is 4.0,
    # so one engine to decode gives min(600/480, (360 - 15)/300) = 1.15 from
    # min(720/480, 240/300) = 0.8. The 0.9 quantile of the 21 windows is 7 (sorted, index
    # 18 of 0..20): W_P = 10 x 4 + 110 x 7 = 810, one engine fewer serves 600/810 = 0.74
    # < 0.8, so nothing moves. With a memory of 100 s the burst is forgotten.
    def cmds(**kw) -> tuple[list, str]:
        alloc = _cluster(6, 2, **kw)
        for i, t in enumerate(range(0, 210, 10)):
            fc = forecast(t=float(t), prefill_engines=7.0 if i < 3 else 4.0, decode_engines=2.5)
            out = alloc.handle(fc, act=t == 200)
        return [e.to_role for e in out if isinstance(e, EngineCommand)], alloc.last_decision.selection.reason

    moved, _ = cmds()
    assert moved and set(moved) == {"decode"}
    held, reason = cmds(provision_quantile=0.9)
    assert held == [] and "below the hysteresis" in reason
    forgot, _ = cmds(provision_quantile=0.9, provision_memory_s=100.0)
    assert forgot == moved


def test_prefill_capacity_follows_the_cache_each_count_was_measured_at() -> None:
    from prorsa_allocator.pricing import cache_scale

    # Measured miss ratios: 6 prefill engines compute 20% of each prompt, 5 compute 40%,
    # 4 were never measured.
    miss = {6: 0.2, 5: 0.4}
    assert list(cache_scale(6, np.array([5, 4]), miss)) == pytest.approx([0.5, 1.0])
    assert list(cache_scale(5, np.array([6]), miss)) == pytest.approx([2.0])
    assert list(cache_scale(7, np.array([6]), miss)) == [1.0]  # the held count not measured
    # 6:2, prefill demand 5 engines, decode 2.5, over 120 s: W_P = 600, W_D = 300
    # engine-seconds; one engine to decode (dead 15 s). θᴾ taken as given, prefill keeps
    # 5 x 120 = 600 against 600 and decode rises from 240/300 = 0.8 to 345/300: f = 1.
    dv = DemandView(5.0, 2.5, 5.0, 2.5, 10.0)
    prices = [SwitchPrice(0.0, 15.0)]
    flat, old = priced_net(6, 2, "decode", prices, dv, _config(), 120.0, PricedContext(50_000.0))
    assert old == pytest.approx(0.8) and flat[0] == pytest.approx(1.0)
    # At 5 engines the pool computes twice the share of each prompt: its 5 engines serve
    # 2.5 engines' worth of full prompts, 300/600 = 0.5 of the work, and the move loses.
    cached, _ = priced_net(6, 2, "decode", prices, dv, _config(), 120.0, PricedContext(50_000.0, miss=miss))
    assert cached[0] == pytest.approx(0.5)
    # A count below the one held that was never measured computes every prompt token:
    # ``below`` = 1 − the hit θᴾ is taken at. Above the held count, or measured, as before.
    assert list(cache_scale(6, np.array([5, 4]), {6: 0.2}, below=0.25)) == pytest.approx([0.25, 0.25])
    assert list(cache_scale(6, np.array([7]), {6: 0.2}, below=0.25)) == [1.0]
    assert list(cache_scale(6, np.array([5, 4]), miss, below=0.25)) == pytest.approx([0.5, 0.25])
    assert list(cache_scale(6, np.array([5]), {}, below=0.25)) == pytest.approx([0.25])
    # θᴾ taken at a hit of 0.75, nothing measured: 5 engines keep 5 x 120 x 0.25 = 150
    # engine-seconds against 600, f = 0.25, and the move loses.
    lost, _ = priced_net(6, 2, "decode", prices, dv, _config(), 120.0, PricedContext(50_000.0, theta_hit=0.75))
    assert lost[0] == pytest.approx(0.25)


def test_the_miss_ratio_is_measured_per_prefill_count() -> None:
    # 2:2, both prefill engines queueing, hits 0.6 and 0.8 (pool miss 0.3), then 0.7 and 0.9
    # (0.2): the mean of the two windows, 0.25, at count 2.
    alloc = _cluster(2, 2, served_ramp_s=0.0)
    for t, hits in ((10.0, (0.6, 0.8)), (20.0, (0.7, 0.9))):
        for i, h in enumerate(hits):
            alloc.handle(stats(f"p{i}", "prefill", ts=t - 5.0, running=2, queued=3,
                               prefill_tokens_per_s=20_000.0, cache_hit_rate=h))
        alloc.handle(forecast(t=t, prefill_engines=2.0, decode_engines=2.0))
    assert alloc.prefill_miss == {2: pytest.approx(0.25)}
    # The cap on a credible hit (max_cache_hit_rate) applies: a reported hit of 1.0 counts
    # as the cap.
    capped = _cluster(2, 2, served_ramp_s=0.0, max_cache_hit_rate=0.95)
    for i in range(2):
        capped.handle(stats(f"p{i}", "prefill", ts=5.0, running=2, queued=3, prefill_tokens_per_s=1_000.0,
                            cache_hit_rate=1.0))
    capped.handle(forecast(t=10.0, prefill_engines=2.0, decode_engines=2.0))
    assert capped.prefill_miss == {2: pytest.approx(0.05)}


def lat_kv(engines: float, fed: float = 1.0) -> TurnLatency:
    """The TurnLatency of the hand-computed cases with a decode KV demand of ``engines``."""
    return TurnLatency(10.0, 120.0, 0.1, 0.3, None, 3, 20.0, engines * 120.0, fed)


def _hand_case(prefill: float = 1.0) -> tuple[list[SwitchPrice], PricedContext, DemandView]:
    """The moves, context and demand of the hand-computed objective cases: two idle engines
    (a move is dead 15 s), a decode turn of 20 s, a prefill demand of ``prefill`` engines
    now and later, decode KV 1 engine, decode step t(n) = 0.1 + 0.3/n s, S = 10 s."""
    prices = [SwitchPrice(0.0, 15.0), SwitchPrice(0.0, 15.0)]
    dv = DemandView(prefill, 1.0, prefill, 1.0, 10.0, decode_kv_now=1.0, decode_kv_later=1.0, decode_step=(0.1, 0.3))
    return prices, PricedContext(50_000.0, decode_turn_s=20.0), dv


def test_turn_latency_objective_by_hand() -> None:
    # 5:3 over 120 s (S = 10 s), prefill demand 1 engine now and later, decode KV 1 engine;
    # decode step t(n) = 0.1 + 0.3/n s, a decode turn of 20 s measured at 3 engines
    # (t(3) = 0.2 s). Idle engines: a move is dead 15 s.
    cfg = _config(objective="turn_latency")
    prices, ctx, dv = _hand_case()
    f_new, f_old = priced_net(5, 3, "decode", prices, dv, cfg, 120.0, ctx)
    # Now: prefill wait 1 x 10 / (2 x 5) = 1 s, decode 20 s: 21 s a turn.
    assert f_old == pytest.approx(1 / 21)
    # One engine to decode: 4 prefill engines at once (wait 1.25 s); decode on 3 engines
    # for the move's 15 s of dead time, then on 4: t = 0.1 + 0.3/4, a turn 20 x t/0.2.
    d1 = (15 * 20 + 105 * 20 * (0.1 + 0.3 / 4) / 0.2) / 120
    assert f_new[0] == pytest.approx(1 / (1.25 + d1))
    # Two: 3 prefill engines (wait 10/6 s), 5 decode engines after 15 s.
    d2 = (15 * 20 + 105 * 20 * (0.1 + 0.3 / 5) / 0.2) / 120
    assert f_new[1] == pytest.approx(1 / (10 / 6 + d2))
    # The capacity objective sees both roles past ratio_cap (2x their demand): no gain at all.
    f_cap, f_cap_old = priced_net(5, 3, "decode", prices, dv, _config(), 120.0, ctx)
    assert f_cap_old == pytest.approx(2.0) and f_cap[0] == pytest.approx(2.0)
    # A prefill pool short of its work builds a backlog: 3 engines of work on 2 prefill
    # engines wait 3 x 10 / 4 + (3 - 2) x 120 / 4 = 37.5 s (TurnLatency over 120 s, window
    # 10 s, the same step and turn; capacities and work in engine-seconds).
    lat = TurnLatency(10.0, 120.0, 0.1, 0.3, None, 3, 20.0, 120.0)
    one = np.array([1.0])
    assert lat(2 * 120 * one, 3 * 120 * one, 360 * one, 0.0)[0] == pytest.approx(37.5 + 20.0)
    # Such a split is saturated, and priced_net judges it by the capacity ratio (2/3): in a
    # closed loop whose queues grow, what each role serves sets the pace.
    short = _hand_case(prefill=3.0)[2]
    assert lat.saturated(2 * 120 * one, 3 * 120 * one, 360 * one, 0.0)[0]
    _, f_short = priced_net(2, 6, "prefill", prices, short, cfg, 120.0, PricedContext(50_000.0, decode_turn_s=20.0))
    assert f_short == pytest.approx(2 / 3)
    # A move that would saturate a role scores 0 (never chosen): 5:3 with prefill work of
    # 2.5 engines; two engines to decode leave 3 prefill engines, one 2.
    near = DemandView(2.5, 1.0, 2.5, 1.0, 10.0, decode_kv_now=1.0, decode_kv_later=1.0, decode_step=(0.1, 0.3))
    f_near, _ = priced_net(5, 3, "decode", [SwitchPrice(0.0, 0.0)] * 3, near, cfg, 120.0, ctx)
    assert f_near[0] > 0 and f_near[1] > 0 and f_near[2] == 0.0
    # A backlog is cleared once: half of a window of 4 engines' work queued at its start
    # (prefill_fed_share 0.5: 20 engine-seconds), then 1 engine's work a window. Arrivals
    # over 120 s: 40 - 20 + 110 = 130 engine-seconds, a = 13/12 engines; 5 engines clear
    # the backlog in T = 20/(5 - 13/12) s; the queue averages 20·T/(2·120) over the horizon.
    backed = DemandView(4.0, 1.0, 1.0, 1.0, 10.0, prefill_fed_share=0.5, decode_kv_now=1.0, decode_kv_later=1.0,
                        decode_step=(0.1, 0.3))
    _, f_backed = priced_net(5, 3, "decode", prices, backed, cfg, 120.0, ctx)
    t_clear = 20 / (5 - 13 / 12)
    assert f_backed == pytest.approx(1 / ((13 / 12) * 10 / 10 + 20 * t_clear / 240 / 5 + 20.0))
    # The smoothed forecast after the window counts the standing backlog of every window;
    # where its arrival part is known, that is the rate (the same case: later 3 engines'
    # forecast of which 1 arrives).
    arrivals = replace(backed, prefill_later=3.0, prefill_arrivals_later=1.0)
    assert priced_net(5, 3, "decode", prices, arrivals, cfg, 120.0, ctx)[1] == pytest.approx(f_backed)
    # Decode KV over the pool: admissions wait in proportion (KV 4 engines on 3: x 4/3), a
    # saturated split.
    assert lat_kv(4.0)(5 * 120 * one, 3 * 120 * one, 120 * one, 0.0)[0] == pytest.approx(1.0 + 20.0 * 4 / 3)
    # A backlog the old split clears within the move's dead time gains nothing from it: 2:6
    # with 25 engine-seconds queued (a sync batch) and 0.5 engine of arrivals. Moving 3
    # decode engines to prefill (dead 25 s) leaves 2 prefill engines for those 25 s, which
    # clear the queue in 25/1.5 s, and takes 3 decode engines away at once.
    batch = DemandView(2.5, 1.0, 0.5, 1.0, 10.0, prefill_fed_share=0.0, decode_kv_now=1.0, decode_kv_later=1.0,
                       decode_step=(0.1, 0.3))
    b_ctx = PricedContext(50_000.0, decode_turn_s=20.0)
    f_b, f_b_old = priced_net(2, 6, "prefill", [SwitchPrice(10.0, 15.0)] * 3, batch, cfg, 120.0, b_ctx)
    assert f_b[2] < f_b_old
    # By hand: the window's 25 engine-seconds are the backlog (prefill_fed_share 0), the
    # 110 s after it bring 0.5 engine each (a = 55/120 engines over the horizon); the queue
    # is gone at 25/(2 - a) s, within the dead time; decode runs on 3 engines throughout.
    a = 55 / 120
    area = 25 * 25 / (2 * (2 - a))
    wait = (a * 10 / 2 * (25 / 2 + 95 / 5) + area / 2) / 120
    step = lambda n: 20 * (0.1 + 0.3 / n) / (0.1 + 0.3 / 6)  # noqa: E731
    assert f_b[2] == pytest.approx(1 / (wait + step(3)))
    # Admissions come as fast as prefill serves: 10 engines of prefill work on 5 (half of it
    # served) bring half the admitted KV, so KV 4 engines' worth, half of it admitted,
    # needs 4 x (0.5 + 0.5 x 0.5) = 3 engines: no wait on 3.
    fed = lat_kv(4.0, fed=0.5)
    assert fed.decode_kv(5 * 120 * one, 1200 * one, 0.0)[0] == pytest.approx(3.0)
    assert fed(5 * 120 * one, 3 * 120 * one, 1200 * one, 0.0)[0] == pytest.approx(10.0 + 60.0 + 20.0)
    # Without a measured decode turn the objective falls back to the capacity ratio.
    f_fb, f_fb_old = priced_net(5, 3, "decode", prices, dv, cfg, 120.0, PricedContext(50_000.0))
    assert (f_fb_old, f_fb[0]) == pytest.approx((2.0, 2.0))


def test_saturation_objective_holds_a_split_that_keeps_up() -> None:
    # The cases of test_turn_latency_objective_by_hand under 'saturation'. 5:3 with 1 engine
    # of prefill work and 1 of decode KV keeps up over 120 s: no move to prefill (NaN),
    # where turn latency would price it by the mean turn's shorter prefill wait.
    cfg = _config(objective="saturation")
    prices, ctx, dv = _hand_case()
    f_new, f_old = priced_net(5, 3, "prefill", prices, dv, cfg, 120.0, ctx)
    assert np.isnan(f_new).all() and f_old == pytest.approx(1 / 21)
    f_lat, _ = priced_net(5, 3, "prefill", prices, dv, _config(objective="turn_latency"), 120.0, ctx)
    assert np.isfinite(f_lat).all()
    # A move to decode from it speeds up every decode step, the slowest trajectory's too:
    # priced as under turn latency (test_turn_latency_objective_by_hand's figures).
    f_dec, f_dec_old = priced_net(5, 3, "decode", prices, dv, cfg, 120.0, ctx)
    d1 = (15 * 20 + 105 * 20 * (0.1 + 0.3 / 4) / 0.2) / 120
    assert f_dec_old == pytest.approx(1 / 21) and f_dec[0] == pytest.approx(1 / (1.25 + d1))
    f_lat_dec, _ = priced_net(5, 3, "decode", prices, dv, _config(objective="turn_latency"), 120.0, ctx)
    assert f_dec == pytest.approx(f_lat_dec)
    # A prefill pool short of its work (3 engines of work on 2: its queue is not cleared) is
    # judged as under 'turn_latency': by the capacity ratio, 2/3 now.
    short = _hand_case(prefill=3.0)[2]
    f_s, f_s_old = priced_net(2, 6, "prefill", prices, short, cfg, 120.0, ctx)
    f_t, f_t_old = priced_net(2, 6, "prefill", prices, short, _config(objective="turn_latency"), 120.0, ctx)
    assert f_s_old == pytest.approx(2 / 3) and f_s == pytest.approx(f_t) and f_s_old == f_t_old
    # So is a decode pool whose KV demand is over it (4 engines of KV on 3): a move to
    # prefill is priced there.
    full = replace(dv, decode_now=4.0, decode_later=4.0, decode_kv_now=4.0, decode_kv_later=4.0)
    f_full, _ = priced_net(5, 3, "prefill", prices, full, cfg, 120.0, ctx)
    f_full_t, _ = priced_net(5, 3, "prefill", prices, full, _config(objective="turn_latency"), 120.0, ctx)
    assert np.isfinite(f_full).all() and f_full == pytest.approx(f_full_t)
    # Without a measured decode turn there is no queue model: the capacity ratio, as under
    # 'turn_latency'.
    f_fb, f_fb_old = priced_net(5, 3, "decode", prices, dv, cfg, 120.0, PricedContext(50_000.0))
    assert (f_fb_old, f_fb[0]) == pytest.approx((2.0, 2.0))
