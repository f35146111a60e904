"""The window loop: what a forecast may see, and how actuals are measured (EVENTS.md)."""

import dataclasses

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.state import LiveState
from prorsa_forecaster.windows import WindowLoop, replay
from prorsa_schemas import EVENT_TYPES

from .synth import rollout

CFG = ForecastConfig(horizon=10.0)


class F:
    def __init__(self):
        self.n = 0

    def __call__(self, type_, ts, **kw):
        self.n += 1
        return EVENT_TYPES[type_](id=f"e{self.n}", ts=ts, run="r", **kw)


def test_actuals_follow_the_contract_definition_by_hand():
    f = F()
    events = [
        f("trajectory.dispatched", 3.0, traj="a", prompt_tokens=100),
        f("request.queued", 4.0, traj="a", req="a0", turn=0, prompt_tokens=1000),  # backlog at 10
        f("trajectory.dispatched", 5.0, traj="b", prompt_tokens=100),
        f("request.queued", 6.0, traj="b", req="b0", turn=0, prompt_tokens=300),
        f("prefill.finished", 9.0, traj="b", req="b0"),  # admitted in window 0
        f("request.queued", 10.0, traj="c", req="c0", turn=0, prompt_tokens=50),  # ts == t: window 1
        f("prefill.finished", 12.0, traj="a", req="a0"),  # admitted in window 1
        f("request.queued", 19.999, traj="b", req="b1", turn=1, prompt_tokens=400),  # re-prefill of b
        f("request.queued", 20.0, traj="c", req="c1", turn=1, prompt_tokens=7),  # window 2
    ]
    ws = list(replay(events, CFG, gate=False))
    assert [w.t for w in ws] == [0.0, 10.0, 20.0]
    assert [w.prefill_actual for w in ws] == [1300, 1000 + 50 + 400, 50 + 400 + 7]
    assert [w.decode_actual for w in ws] == [300, 1000, 0]
    assert [w.decode_known for w in ws] == [0, 1000, 0]  # a0 was queued before t = 10
    assert [w.backlog for w in ws] == [0, 1000, 450]


def test_windows_start_at_the_first_ts_rounded_down():
    f = F()
    ws = list(replay([f("trajectory.dispatched", 1234.5, traj="a", prompt_tokens=1)], CFG, gate=False))
    assert [w.t for w in ws] == [1230.0]


def test_a_forecast_never_reads_the_future():
    events = rollout(seed=3, concurrency=32, duration=120)
    cut = 60.0
    full = [w for w in replay(events, CFG)]
    # Change everything at or after the cut (drop it): forecasts for windows <= cut stay equal.
    past = [w for w in replay([e for e in events if e.ts < cut], CFG)]
    for a, b in zip(full, past):
        if a.t > cut:
            break
        assert a.forecast == b.forecast, a.t
    # ...and altering future prompt sizes changes no forecast made before them.
    bumped = [
        e.model_copy(update={"prompt_tokens": e.prompt_tokens * 3}) if e.ts >= cut and e.type == "request.queued" else e
        for e in events
    ]
    for a, b in zip(full, replay(bumped, CFG)):
        if a.t > cut:
            break
        assert a.forecast == b.forecast


def test_backlog_forecast_equals_backlog_actual():
    for w in replay(rollout(seed=1, concurrency=32, duration=60), CFG):
        c = w.forecast.components
        assert c["ready"] + c["inflight"] == pytest.approx(w.backlog)


@pytest.mark.parametrize(
    "drop", [dict(sandbox=False), dict(prefill_started=False), dict(run_started=False), dict(tools=False),
             dict(sandbox=False, prefill_started=False, run_started=False, tools=False)],
)
def test_logs_without_optional_events_still_forecast(drop):
    ws = list(replay(rollout(seed=2, concurrency=32, duration=60, **drop), CFG))
    assert len(ws) > 5
    assert sum(w.forecast.prefill_tokens for w in ws) > 0
    assert sum(w.forecast.decode_admit_tokens for w in ws) > 0


def test_tracker_gate_drops_duplicates_and_illegal_events():
    f = F()
    q = f("request.queued", 1.0, traj="a", req="a0", turn=0, prompt_tokens=100)
    events = [
        f("trajectory.dispatched", 0.5, traj="a", prompt_tokens=100),
        q, q,  # the same event id twice
        f("prefill.finished", 2.0, traj="zz", req="nope"),  # unknown trajectory: anomaly
    ]
    loop = WindowLoop(CFG)
    for e in events:
        loop.feed(e)
    w = loop.finish()[0]
    assert w.prefill_actual == 100 and w.decode_actual == 0
    assert loop.gate.rejected == 2


def test_live_state_grows_past_its_initial_capacity_and_frees_slots():
    f = F()
    st = LiveState(CFG)
    for i in range(3000):
        st.apply(f("trajectory.dispatched", 1.0, traj=f"t{i}", prompt_tokens=10))
    assert st.live == 3000
    for i in range(3000):
        st.apply(f("trajectory.dropped", 2.0, traj=f"t{i}", reason="error"))
    assert st.live == 0
    snap = st.snapshot(10.0)
    assert len(snap.start_elapsed) == 0


def test_tool_growth_ema_uses_alpha():
    f = F()
    st = LiveState(dataclasses.replace(CFG, tool_ema_alpha=0.1))
    st.apply(f("trajectory.dispatched", 0.0, traj="a", prompt_tokens=10))
    ctx = 100
    growths = [1000, 0, 0]
    st.apply(f("request.queued", 0.1, traj="a", req="a0", turn=0, prompt_tokens=ctx))
    for turn, g in enumerate(growths):
        st.apply(f("prefill.finished", turn + 0.2, traj="a", req=f"a{turn}"))
        st.apply(f("decode.finished", turn + 0.3, traj="a", req=f"a{turn}", output_tokens=10, finish="tool"))
        ctx = ctx + 10 + g
        st.apply(f("request.queued", turn + 0.9, traj="a", req=f"a{turn + 1}", turn=turn + 1, prompt_tokens=ctx))
    # First observation seeds the EMA (1000), then 0.9 * 1000 twice.
    assert st.growth[st.slot("r", "a")] == pytest.approx(810.0)


def test_share_correction_learns_from_the_actual_arrivals_per_sub_step():
    """The admitted-share corrector sees, per closed window, sum_k alpha_k x (tokens queued
    in sub-step k) against the tokens queued in the window and prefilled before its end:
    measured here straight from the events and fed to a corrector of our own."""
    from prorsa_forecaster.terms.correction import BiasCorrector

    events = rollout(seed=5, concurrency=48, duration=150)
    cfg = ForecastConfig(horizon=10.0, steps=5, share_half_life=4.0, bias_clip=2.0)
    loop = WindowLoop(cfg)
    results = []
    for ev in events:
        results += loop.feed(ev)
    ours = BiasCorrector(4.0, 2.0, 0.0, shrink=True)
    queued = {}
    for w in results:
        by_step, admitted = [0.0] * 5, 0.0
        for e in events:
            if w.t <= e.ts < w.t + 10.0:
                if e.type == "request.queued":
                    by_step[min(int((e.ts - w.t) / 2.0), 4)] += e.prompt_tokens
                    queued[(e.traj, e.req)] = (e.ts, e.prompt_tokens)
                elif e.type == "prefill.finished" and (e.traj, e.req) in queued:
                    ts, x = queued[(e.traj, e.req)]
                    admitted += x if ts >= w.t else 0.0
        assert w.decode_actual - w.decode_known == pytest.approx(admitted)
        ours.update(sum(a * x for a, x in zip(w.forecast.raw_alpha, by_step)), admitted)
    assert ours.windows >= 5
    assert loop.state.history.correction.share.factor == pytest.approx(ours.factor)
    assert loop.state.history.correction.share.windows == ours.windows


def test_every_requeue_after_an_abort_counts_as_reprefill():
    # "a" is in its tool at t = 10, comes back, is decoding when the update aborts it,
    # and re-queues: its first request is a tool return, its re-queue a re-prefill,
    # like "b"'s, which was decoding at t.
    f = F()
    events = [
        f("run.started", 0.0, mode="async", batch_size=4),
        f("trajectory.dispatched", 0.0, traj="a", prompt_tokens=100),
        f("trajectory.dispatched", 0.0, traj="b", prompt_tokens=100),
        f("request.queued", 1.0, traj="a", req="a0", turn=0, prompt_tokens=100),
        f("request.queued", 1.0, traj="b", req="b0", turn=0, prompt_tokens=100),
        f("prefill.finished", 2.0, traj="a", req="a0"),
        f("prefill.finished", 2.0, traj="b", req="b0"),
        f("decode.finished", 3.0, traj="a", req="a0", output_tokens=50, finish="tool"),
        f("tool.finished", 11.0, traj="a", result_tokens=50),
        f("request.queued", 11.0, traj="a", req="a1", turn=1, prompt_tokens=200),
        f("prefill.finished", 12.0, traj="a", req="a1"),
        f("policy.updated", 15.0, version=1),
        f("decode.finished", 15.0, traj="a", req="a1", output_tokens=10, finish="abort"),
        f("request.queued", 15.0, traj="a", req="a2", turn=1, prompt_tokens=210),
        f("decode.finished", 15.0, traj="b", req="b0", output_tokens=30, finish="abort"),
        f("request.queued", 15.0, traj="b", req="b1", turn=0, prompt_tokens=130),
        f("trajectory.dispatched", 25.0, traj="z", prompt_tokens=1),
    ]
    ws = list(replay(events, CFG, gate=False))
    assert ws[1].t == 10.0
    # a was in Tool at t = 10 and b decoding; both re-queues after the abort are re-prefills.
    assert ws[1].sources["tool"] == 200 and ws[1].sources["reprefill"] == 210 + 130


def test_a_window_that_opens_between_an_update_and_its_aborts_forecasts_the_re_prefills():
    # The demo's driver publishes policy.updated, then pauses its engines: the decodes
    # under way are aborted 30 ms after the update and re-sent at once, and the engines
    # hold them through the weight sync. A window opens in between (t = 20, the update at
    # 19.99): an earlier update has taught the loop that updates abort the decodes and
    # that aborted requests come back within 50 ms, so both decodes are forecast to
    # re-queue in this window (prompt + half the mean output), not to end their turns.
    f = F()
    events = [f("run.started", 0.0, mode="async", batch_size=64)]
    for k, t in enumerate(("a", "b")):
        events += [f("trajectory.dispatched", 0.0, traj=t, prompt_tokens=1000),
                   f("request.queued", 1.0, traj=t, req=f"{t}0", turn=0, prompt_tokens=1000),
                   f("prefill.finished", 2.0, traj=t, req=f"{t}0", cached_tokens=0)]
    # The first update: both aborted and re-queued 40 ms later, then prefilled again.
    events += [f("policy.updated", 5.0, version=1),
               f("decode.finished", 5.03, traj="a", req="a0", output_tokens=200, finish="abort"),
               f("decode.finished", 5.03, traj="b", req="b0", output_tokens=200, finish="abort"),
               f("request.queued", 5.07, traj="a", req="a1", turn=0, prompt_tokens=1200),
               f("request.queued", 5.07, traj="b", req="b1", turn=0, prompt_tokens=1200),
               f("prefill.finished", 6.5, traj="a", req="a1", cached_tokens=0),
               f("prefill.finished", 6.5, traj="b", req="b1", cached_tokens=0)]
    # The second update, 10 ms before the window at t = 20 opens.
    events += [f("policy.updated", 19.99, version=2),
               f("decode.finished", 20.02, traj="a", req="a1", output_tokens=300, finish="abort"),
               f("decode.finished", 20.02, traj="b", req="b1", output_tokens=300, finish="abort"),
               f("request.queued", 20.06, traj="a", req="a2", turn=0, prompt_tokens=1500),
               f("request.queued", 20.06, traj="b", req="b2", turn=0, prompt_tokens=1500),
               f("trajectory.dispatched", 31.0, traj="z", prompt_tokens=1)]
    loop = WindowLoop(CFG, gate=False)
    ws = [w for ev in events for w in loop.feed(ev)]
    h = loop.state.history
    assert h.cut_share == 1.0 and h.requeue.count == 4  # every abort, both updates, re-queued
    w = next(w for w in ws if w.t == 20.0)
    assert w.sources["reprefill"] == 3000
    mean_output = h.output.value  # nothing ended normally: the prior
    assert w.forecast.components["reprefill"] == pytest.approx(2 * (1200 + 0.5 * mean_output), rel=1e-4)
    assert w.forecast.components["tool"] == pytest.approx(0.0, abs=1e-6)
    # The pause is learnt from the first re-queued request's prefill, 1.5 s after the
    # update, less that request's own prefill time (the pool's learnt model then): the log
    # has no prefill.started, so the engines resumed that long before it finished.
    first = next(i for i, ev in enumerate(events) if ev.type == "prefill.finished" and ev.ts > 5.0)
    before = WindowLoop(CFG, gate=False)
    for ev in events[:first]:
        before.feed(ev)
    g = float(before.state.history.prefill_model(None).g(np.array([1200.0]), 0.0)[0])
    assert 0.0 < g < 1.5 and h.update_pause.n == 1
    assert h.update_pause.value == pytest.approx(1.5 - g)


def test_two_runs_in_one_log_keep_their_trajectories_apart():
    # The same trajectory id in two runs: two trajectories, not one seen twice.
    def ev(type_, ts, run, **kw):
        return EVENT_TYPES[type_](id=f"{run}-{type_}-{ts}", ts=ts, run=run, **kw)

    st = LiveState(CFG)
    for run in ("a", "b"):
        st.apply(ev("trajectory.dispatched", 1.0, run, traj="t0", prompt_tokens=100))
        st.apply(ev("request.queued", 2.0, run, traj="t0", req="q0", turn=0, prompt_tokens=1000 if run == "a" else 3000))
    assert st.live == 2 and st.ignored == 0
    assert st.snapshot(3.0).ready_prompt.tolist() == [1000.0, 3000.0]
    st.apply(ev("prefill.finished", 4.0, "b", traj="t0", req="q0"))
    snap = st.snapshot(5.0)
    assert snap.ready_prompt.tolist() == [1000.0] and snap.decode_prompt.tolist() == [3000.0]


def test_a_long_jump_live_closes_one_window_and_reopens_at_the_new_time():
    """Live (max_gap_windows), a jump past the cap (a quiet bus, a stream whose clocks
    disagree) closes the current window and reopens where the jump lands, without a forecast
    for each window between; offline every window is closed, as scoring needs."""
    f = F()
    first = [f("trajectory.dispatched", 3.0, traj="a", prompt_tokens=100),
             f("request.queued", 4.0, traj="a", req="a0", turn=0, prompt_tokens=1000)]
    late = f("request.queued", 1004.0, traj="b", req="b0", turn=0, prompt_tokens=50)
    live = WindowLoop(CFG, gate=False, max_gap_windows=5)
    for ev in first:
        live.feed(ev)
    closed = live.feed(late)
    assert [w.t for w in closed] == [0.0] and live.skipped == 99 and live.window_start == 1000.0
    assert live.advance(1050.0)[-1].t == 1040.0 and live.skipped == 99  # within the cap: one by one
    offline = WindowLoop(CFG, gate=False)
    for ev in first:
        offline.feed(ev)
    assert [w.t for w in offline.feed(late)] == [10.0 * k for k in range(100)] and offline.skipped == 0


@pytest.mark.parametrize("bad", [{"horizon": 1e-6}, {"horizon": float("nan")}, {"duration_half_life": 0.0},
                                 {"bias_prior_windows": float("nan")}, {"bias_prior_windows": -1.0},
                                 {"returning_memory": -1.0}, {"returning_memory": float("inf")}])
def test_a_knob_that_would_hang_or_crash_the_forecaster_is_refused(bad):
    with pytest.raises(ValueError, match=list(bad)[0]):
        ForecastConfig(**bad)
