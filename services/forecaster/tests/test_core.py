"""The pure core, one component at a time, on hand-computed cases."""

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.core import forecast
from prorsa_forecaster.history import History
from prorsa_forecaster.terms.correction import BiasCorrector
from prorsa_forecaster.snapshot import START_COLD, START_PREWARM, RunInfo, Snapshot
from prorsa_forecaster.survival import DurationModel
from prorsa_forecaster.terms.update import not_interrupted

CFG = ForecastConfig(horizon=10.0, steps=10, bias_half_life=0)


def fixed(name: str, *durations: float) -> DurationModel:
    """An empirical model of exactly these durations (no prior)."""
    m = DurationModel(name, prior_mean=1.0, prior_weight=0.0)
    for d in durations:
        m.observe(d)
    return m


def quiet_history() -> History:
    """A history whose chained (beyond-the-paper) terms are off: no tool ever called."""
    h = History(CFG)
    h.decode_tool, h.decode_done = 0.0, 1.0
    return h


def test_ready_queue_and_inflight_count_in_full():
    snap = Snapshot(
        t=100.0,
        ready_prompt=np.array([100.0, 200.0]), ready_since=np.array([99.0, 99.5]), ready_instance=np.array([-1, -1]),
        ready_growth=np.zeros(2),
        inflight_prompt=np.array([50.0]), inflight_started=np.array([99.9]), inflight_instance=np.array([0]),
        inflight_since=np.array([99.0]), inflight_growth=np.zeros(1),
    )
    f = forecast(snap, quiet_history(), CFG)
    assert f.components["ready"] == 300 and f.components["inflight"] == 50
    assert f.prefill_tokens == pytest.approx(350)


def test_tool_returns_with_context_plus_growth():
    h = quiet_history()
    h.tool = fixed("tool", *[4.0] * 50)
    snap = Snapshot(
        t=0.0,
        tool_elapsed=np.array([0.0, 2.0, 0.0]),
        tool_context=np.array([1000.0, 2000.0, 500.0]),
        tool_growth=np.array([100.0, 300.0, 0.0]),
        tool_result=np.array([-1.0, -1.0, 40.0]),  # the third already returned 40 tokens
    )
    f = forecast(snap, h, CFG)
    # All return within 10 s: 1100 + 2300 + (500 + 40 + overhead 0).
    assert f.components["tool"] == pytest.approx(3940, rel=1e-6)


def test_sandbox_prewarm_arrives_cold_does_not():
    h = quiet_history()
    h.start[START_PREWARM] = fixed("prewarm", *[3.0] * 20)
    h.start[START_COLD] = fixed("cold", *[30.0] * 20)
    snap = Snapshot(
        t=0.0,
        start_elapsed=np.array([1.0, 1.0]),
        start_mode=np.array([START_PREWARM, START_COLD]),
        start_prompt=np.array([500.0, 700.0]),
    )
    assert forecast(snap, h, CFG).components["sandbox"] == pytest.approx(500, rel=1e-6)


def test_sampler_admission_rate_times_injection_times_prompt():
    h = quiet_history()
    h.reward = fixed("reward", *[2.0] * 20)
    h.launch = fixed("launch", *[1.0] * 20)
    h.admitted, h.completed = 3.0, 4.0  # p-hat = 0.75
    h.launched, h.admitted_for_launch = 1.0, 1.0  # f(n) = n
    h.first_prompt.value = 1000.0
    h.completions = 1  # rewards complete in this log
    snap = Snapshot(t=0.0, reward_elapsed=np.zeros(4), reward_cohort=np.full(4, -1))
    # 4 complete within ~2 s, 3 admitted and replaced, first requests ~1 s later: 3 x 1000.
    assert forecast(snap, h, CFG).components["sampler"] == pytest.approx(3000, rel=0.01)


def test_sampler_launch_that_lands_after_the_window_is_not_counted():
    h = quiet_history()
    h.reward = fixed("reward", *[2.0] * 20)
    h.launch = fixed("launch", *[30.0] * 20)
    snap = Snapshot(t=0.0, reward_elapsed=np.zeros(4), reward_cohort=np.full(4, -1))
    assert forecast(snap, h, CFG).components["sampler"] == pytest.approx(0, abs=1e-6)


def test_group_injection_waits_for_the_whole_group():
    h = quiet_history()
    h.reward = fixed("reward", *[2.0] * 20)
    h.cohort_launch = fixed("cohort", *[1.0] * 20)
    h.first_prompt.value = 1000.0
    snap = Snapshot(
        t=0.0,
        run=RunInfo(injection="group", group_size=2),
        reward_elapsed=np.zeros(3),
        reward_cohort=np.array([0, 0, 1]),  # group 0 all in Reward; group 1 has a member elsewhere
        cohort_pending=np.array([0.0, 1.0]),
    )
    # Only group 0 completes: a new group of 2, 2 x 1000 tokens.
    assert forecast(snap, h, CFG).components["sampler"] == pytest.approx(2000, rel=0.01)


def test_decode_admissions_by_queue_simulation_and_kv_pages():
    cfg = ForecastConfig(horizon=10.0, steps=10, bias_half_life=0, kv_page_tokens=16)
    snap = Snapshot(
        t=0.0,
        ready_prompt=np.array([1000.0, 8000.0, 5000.0]),
        ready_since=np.array([-1.0, -0.5, -0.2]),
        ready_instance=np.array([0, 0, 0]),
        ready_growth=np.zeros(3),
        instance_overhead=np.array([0.0]),
        instance_per_token=np.array([0.001]),
    )
    f = forecast(snap, quiet_history(), cfg)
    # b = 1, 9, 14 s: the first two complete before t + 10.
    assert f.decode_admit_tokens == pytest.approx(9000)
    assert f.decode_kv_tokens == pytest.approx(1008 + 8000)


def test_bias_shrink_keeps_a_steady_bias_and_drops_a_noisy_one():
    steady = BiasCorrector(half_life=1e9, clip=2.0, shrink=True)
    for _ in range(10):
        steady.update(predicted=100.0, realised=130.0)
    assert steady.factor == pytest.approx(1.3)
    # Two windows at 1.3 and 1.1: mean 1.2, spread 0.01, variance of the mean 0.01 x 1/2;
    # gain (0.04 - 0.005) / 0.04.
    two = BiasCorrector(half_life=1e9, clip=2.0, shrink=True)
    two.update(predicted=100.0, realised=130.0)
    two.update(predicted=100.0, realised=110.0)
    assert two.factor == pytest.approx(1.0 + 0.2 * 0.035 / 0.04, rel=1e-6)
    # 1.10 and 0.96: a 3% mean inside a 7% spread is noise.
    noisy = BiasCorrector(half_life=1e9, clip=2.0, shrink=True)
    noisy.update(predicted=100.0, realised=110.0)
    noisy.update(predicted=100.0, realised=96.0)
    assert noisy.factor == 1.0


def test_inflight_progress_counts_before_t():
    snap = Snapshot(
        t=100.0,
        inflight_prompt=np.array([4000.0]), inflight_started=np.array([92.0]), inflight_instance=np.array([0]),
        inflight_since=np.array([91.0]), inflight_growth=np.zeros(1),
        ready_prompt=np.array([5000.0]), ready_since=np.array([95.0]), ready_instance=np.array([0]),
        ready_growth=np.zeros(1),
        instance_overhead=np.array([0.0]), instance_per_token=np.array([0.003]),
    )
    f = forecast(snap, quiet_history(), CFG)
    # In flight since 92 for 12 s -> done at 104 (t + 4); the queued one starts then, 15 s -> 119.
    assert f.decode_admit_tokens == pytest.approx(4000)


def test_bias_correction_scales_each_predicted_source_by_its_own_factor():
    h = History(ForecastConfig(bias_half_life=4, bias_prior_windows=0))
    h.decode_tool, h.decode_done = 0.0, 1.0
    h.tool = fixed("tool", *[4.0] * 50)
    h.start[START_PREWARM] = fixed("prewarm", *[3.0] * 20)
    for name, ratio in (("tool", 1.5), ("sandbox", 0.5)):
        for _ in range(10):
            h.correction.source[name].update(predicted=100.0, realised=100.0 * ratio)
    snap = Snapshot(
        t=0.0, tool_elapsed=np.zeros(1), tool_context=np.array([1000.0]), tool_growth=np.zeros(1),
        tool_result=np.array([-1.0]),
        start_elapsed=np.array([1.0]), start_mode=np.array([START_PREWARM]), start_prompt=np.array([400.0]),
        ready_prompt=np.array([500.0]), ready_since=np.array([-1.0]), ready_instance=np.array([-1]),
        ready_growth=np.zeros(1),
    )
    f = forecast(snap, h, ForecastConfig(bias_half_life=4))
    assert f.components["tool"] == pytest.approx(1000) and f.components["sandbox"] == pytest.approx(400)
    # The backlog (the ready queue) is observed: it is never scaled.
    assert f.prefill_tokens == pytest.approx(500 + 1.5 * 1000 + 0.5 * 400)
    assert f.bias == pytest.approx(500 - 200)


def test_bias_factor_shrinks_towards_one_with_few_windows():
    b = BiasCorrector(half_life=1e9, clip=2.0, prior=2.0)
    b.update(predicted=100.0, realised=150.0)
    assert b.factor == 1.0  # one window is not a bias yet
    b.update(predicted=100.0, realised=150.0)
    # Two windows at 1.5 against two pseudo-windows of the same volume at 1: (300 + 200) / 400.
    assert b.factor == pytest.approx(1.25)
    for _ in range(198):
        b.update(predicted=100.0, realised=150.0)
    assert b.factor == pytest.approx((200 * 150 + 2 * 100) / (200 * 100 + 2 * 100))


def test_bias_factor_is_clipped_and_neutral_without_history():
    b = BiasCorrector(half_life=4, clip=2.0)
    assert b.factor == 1.0
    for _ in range(5):
        b.update(predicted=10.0, realised=30.0)
    assert b.factor == 2.0


def test_bias_factor_ignores_misses_and_weights_windows_by_volume():
    b = BiasCorrector(half_life=1e9, clip=2.0)
    # A window nothing predicted (a sync step's first wave) or a 100x miss is no bias.
    b.update(predicted=0.0, realised=1000.0)
    b.update(predicted=10.0, realised=1000.0)
    assert b.windows == 0 and b.factor == 1.0
    # Ratios 1.5 on 100 tokens and 1.0 on 300 tokens: (150 + 300) / 400.
    b.update(predicted=100.0, realised=150.0)
    b.update(predicted=300.0, realised=300.0)
    assert b.factor == pytest.approx(450 / 400)


def test_snapshot_refuses_ragged_sources():
    with pytest.raises(ValueError, match="ready arrays differ"):
        Snapshot(t=0.0, ready_prompt=np.ones(2), ready_since=np.ones(1), ready_instance=np.ones(2, int), ready_growth=np.ones(2))


def test_config_refuses_bad_values():
    for bad in ({"horizon": 0}, {"horizon": float("nan")}, {"steps": 0}, {"tool_ema_alpha": 0}, {"bias_clip": 0.5}):
        with pytest.raises(ValueError):
            ForecastConfig(**bad)


def test_prefill_spread_is_the_bernoulli_spread_of_tool_returns():
    from prorsa_forecaster.uncertainty import prefill_sd

    h = quiet_history()
    # Half the tool calls take 4 s, half 40 s: a fresh call returns within S = 10 s with
    # probability 1/2; one 10 s in (past the 4 s mass) will not return before 20 s.
    h.tool = fixed("tool", *([4.0] * 50 + [40.0] * 50))
    snap = Snapshot(
        t=0.0,
        tool_elapsed=np.array([0.0, 0.0, 10.0]),
        tool_context=np.array([1000.0, 3000.0, 5000.0]),
        tool_growth=np.zeros(3),
        tool_result=np.array([-1.0, -1.0, -1.0]),
    )
    f = forecast(snap, h, CFG)
    assert f.components["tool"] == pytest.approx(0.5 * 1000 + 0.5 * 3000, rel=1e-3)
    # var = sum q(1-q) x^2 = 0.25 * (1000^2 + 3000^2); the third is certain not to come.
    assert prefill_sd(snap, h, CFG) == pytest.approx(np.sqrt(0.25 * (1000**2 + 3000**2)), rel=1e-3)
    # Nothing uncertain, nothing spread: a certain return has no variance either.
    h.tool = fixed("tool", *[4.0] * 50)
    sure = Snapshot(t=0.0, tool_elapsed=np.zeros(3), tool_context=snap.tool_context, tool_growth=np.zeros(3),
                    tool_result=snap.tool_result)
    assert prefill_sd(sure, h, CFG) == pytest.approx(0.0, abs=1e-6)
    assert prefill_sd(Snapshot(t=0.0), h, CFG) == 0.0


def test_decode_spread_thins_arrivals_by_their_chance_of_admission():
    from prorsa_forecaster.uncertainty import decode_sd, prefill_sd

    h = quiet_history()
    h.tool = fixed("tool", *([4.0] * 50 + [40.0] * 50))
    base = dict(
        t=0.0, tool_elapsed=np.zeros(1), tool_context=np.array([2000.0]), tool_growth=np.zeros(1),
        tool_result=np.array([-1.0]),
        ready_prompt=np.array([1000.0]), ready_since=np.array([-1.0]), ready_instance=np.array([0]),
        ready_growth=np.zeros(1), instance_overhead=np.array([0.0]),
    )
    # Fast prefill: the queued request is surely through (no spread) and an arrival at
    # ~4 s is too (alpha 1): the decode spread is the tool return's, 0.5 x 2000.
    fast = Snapshot(**base, instance_per_token=np.array([1e-5]))
    f = forecast(fast, h, CFG)
    assert f.admit_detail.known_var == pytest.approx(0.0)
    assert f.admit_detail.alpha[4] == pytest.approx(1.0)
    assert decode_sd(fast, h, CFG, f.admit_detail) == pytest.approx(0.5 * 2000, rel=1e-3)
    assert prefill_sd(fast, h, CFG) == pytest.approx(0.5 * 2000, rel=1e-3)
    # Slow prefill (10 ms a token: 10 s for the queued one, 20 s for the arrival): the
    # arrival cannot be admitted in the window and the queued one surely is not either.
    slow = Snapshot(**base, instance_per_token=np.array([1e-2]))
    f = forecast(slow, h, CFG)
    assert f.admit_detail.alpha[4] == pytest.approx(0.0)
    assert decode_sd(slow, h, CFG, f.admit_detail) == pytest.approx(0.0, abs=1e-6)
    assert prefill_sd(slow, h, CFG) == pytest.approx(0.5 * 2000, rel=1e-3)


def return_behind_queued(queued: float, per_token: float, **extra) -> tuple[History, Snapshot]:
    """Tools that take 4 s, and one server (``per_token`` s a computed token) with one
    queued request of ``queued`` tokens ahead of a trajectory in Tool whose 2000-token
    prompt returns at ~4 s."""
    h = quiet_history()
    h.tool = fixed("tool", *[4.0] * 50)
    snap = Snapshot(
        t=0.0, tool_elapsed=np.zeros(1), tool_context=np.array([2000.0]), tool_growth=np.zeros(1),
        tool_result=np.array([-1.0]),
        ready_prompt=np.array([queued]), ready_since=np.array([-1.0]), ready_instance=np.array([0]),
        ready_growth=np.zeros(1), instance_overhead=np.array([0.0]), instance_per_token=np.array([per_token]),
        **extra,
    )
    return h, snap


def test_share_correction_scales_the_arrivals_admissions_only():
    h, snap = return_behind_queued(1000.0, 1e-4)
    plain = forecast(snap, h, CFG)
    # Arrives at ~4 s, 0.2 s of prefill: admitted (alpha 1); the queued one too.
    assert plain.share_factor == 1.0
    assert plain.raw_decode_known == pytest.approx(1000)
    assert plain.decode_admit_tokens == pytest.approx(1000 + 2000, rel=1e-3)
    # The queue model admitted 20% less of the arrivals than came through, window after window.
    h.correction.share = BiasCorrector(half_life=1e9, clip=2.0, shrink=True)
    for _ in range(10):
        h.correction.share.update(predicted=1000.0, realised=800.0)
    f = forecast(snap, h, CFG)
    assert f.share_factor == pytest.approx(0.8)
    assert f.raw_decode_known == pytest.approx(1000)  # the known requests are not scaled
    assert f.decode_admit_tokens == pytest.approx(1000 + 0.8 * 2000, rel=1e-3)
    assert f.decode_kv_tokens == pytest.approx(plain.decode_kv_tokens - 0.2 * 2000, rel=1e-3)
    # The share it learns from stays the queue model's own; the spread sees the corrected one.
    assert f.raw_alpha == plain.admit_detail.alpha
    assert f.admit_detail.alpha[4] == pytest.approx(0.8 * plain.admit_detail.alpha[4])
    # 25% more than the model admits, but it admits all of it already: a share stays <= 1.
    h.correction.share = BiasCorrector(half_life=1e9, clip=2.0, shrink=True)
    for _ in range(10):
        h.correction.share.update(predicted=1000.0, realised=1250.0)
    up = forecast(snap, h, CFG)
    assert up.share_factor == pytest.approx(1.25)
    assert up.decode_admit_tokens == pytest.approx(plain.decode_admit_tokens)
    assert max(up.admit_detail.alpha) == pytest.approx(1.0)


def test_a_queued_request_start_spreads_with_the_cache_flips_ahead_of_it():
    from math import erf, sqrt

    def phi(z):
        return 0.5 * (1.0 + erf(z / sqrt(2.0)))

    # One server, 1 ms a computed token. A: 5000 tokens, 4000 cached: 1 s on a hit, 5 s on
    # a miss (hit rate 0.5: expected 3 s, variance 0.5 x 0.5 x 4^2 = 4). B behind it:
    # 6000 tokens, 5000 cached: 1 s or 6 s, starting at A's end, 3 s +- 2 s.
    snap = Snapshot(
        t=0.0,
        ready_prompt=np.array([5000.0, 6000.0]), ready_since=np.array([-2.0, -1.0]),
        ready_instance=np.array([0, 0]), ready_growth=np.zeros(2),
        ready_cached=np.array([4000.0, 5000.0]),
        instance_overhead=np.array([0.0]), instance_per_token=np.array([1e-3]),
        cache_hit=0.5,
    )
    spread = forecast(snap, quiet_history(), CFG)
    # A finishes by 5 s either way. B: a hit needs start < 9 s, a miss start < 4 s.
    w_b = 0.5 * phi((9.0 - 3.0) / 2.0) + 0.5 * phi((4.0 - 3.0) / 2.0)
    assert spread.decode_admit_tokens == pytest.approx(5000 + 6000 * w_b, rel=1e-6)
    # (At the mean start, 3 s, both of B's outcomes would finish in time: a hard cut
    # there would say 11000.)
    assert spread.decode_admit_tokens < 11000 - 500
    # The first in line has nothing ahead of it: no spread.
    first = forecast(Snapshot(**{**snap.__dict__, "ready_prompt": np.array([6000.0, 5000.0]),
                                 "ready_cached": np.array([5000.0, 4000.0])}), quiet_history(), CFG)
    # B first (1 or 6 s, both < 10), A behind it: start 3.5 +- 2.5; hit 1 s, miss 5 s.
    w_a = 0.5 * phi((9.0 - 3.5) / 2.5) + 0.5 * phi((5.0 - 3.5) / 2.5)
    assert first.decode_admit_tokens == pytest.approx(6000 + 5000 * w_a, rel=1e-6)


def test_arrivals_behind_a_queue_average_over_its_cache_flips():
    # One server, 1 ms a token. Queued: 5000 tokens, 4000 cached, hit rate 0.5: done at
    # 1 s or 5 s (3 s +- 2 s). A tool return of 2000 uncached tokens (2 s) arrives ~4 s.
    h, snap = return_behind_queued(5000.0, 1e-3, ready_cached=np.array([4000.0]), cache_hit=0.5)
    cfg = dict(horizon=10.0, steps=10, bias_half_life=0, share_half_life=0)
    spread = forecast(snap, h, ForecastConfig(**cfg))
    # (At the mean end of queue, 3 s, the server is free when the return comes: all
    # 2000 would be admitted.) Averaged over the queue's end 3 + 2z: a sub-step's work (w = its 2 s of prefill)
    # starting at s = max(kh, 3 + 2z) is admitted in the share min((S - s - g) / w,
    # (S - kh - g) / h), clipped to [0, 1]. The exact expectation by quadrature:
    z = np.linspace(-8.0, 8.0, 160_001)
    pdf = np.exp(-z * z / 2) / np.sqrt(2 * np.pi) * (z[1] - z[0])
    expected = 0.0
    for k, tokens in enumerate(spread.admit_detail.arrival_tokens):
        if tokens > 0:
            start = np.maximum(k * 1.0, 3.0 + 2.0 * z)
            share = np.clip(np.minimum((10.0 - start - 2.0) / 2.0, (10.0 - k - 2.0) / 1.0), 0.0, 1.0)
            expected += tokens * float((share * pdf).sum())
    assert spread.raw_decode_known == pytest.approx(5000)
    assert spread.decode_admit_tokens - spread.raw_decode_known == pytest.approx(expected, rel=2e-3)
    assert expected < 1990  # the spread matters here


def _decoding_with_update(train_s: float, cfg: ForecastConfig = CFG, cut: tuple[float, float] = (1.0, 1.0)):
    """One trajectory decoding at t (its decode ends at 3.5 s, its tool takes 1 s) and a
    weight update triggered at t that lands after ``train_s``; ``cut``: of the decodes
    under way at earlier updates, how many the update aborted, of how many."""
    h = History(cfg)
    h.cut, h.cut_ends = cut
    h.decode = fixed("decode", *[3.5] * 50)
    h.tool = fixed("tool", *[1.0] * 50)
    h.train = fixed("train", train_s)
    h.decode_tool, h.decode_done = 1.0, 1.0  # every response calls a tool
    h.output.value = 200.0
    snap = Snapshot(
        t=0.0, decode_elapsed=np.array([0.0]), decode_prompt=np.array([1000.0]), decode_growth=np.array([100.0]),
        update_elapsed=0.0,
    )
    return forecast(snap, h, cfg)


def test_an_update_before_a_turn_ends_cuts_its_next_request():
    # Without the update the turn ends at 3.5 s and is back at ~4.5 s with 1000 + 200
    # + 100 tokens. An update at 2.5 s aborts it first: its re-prefill (1000 + half the
    # expected output) is forecast instead of the next turn. One at 8.5 s comes after.
    early = _decoding_with_update(2.5)
    assert early.components["tool"] == pytest.approx(0.0, abs=1e-6)
    assert early.components["reprefill"] == pytest.approx(1100, rel=1e-6)
    late = _decoding_with_update(8.5)
    assert late.components["tool"] == pytest.approx(1300, rel=1e-6)


def test_an_update_that_aborts_a_share_of_the_decodes_cuts_that_share_of_the_turns():
    # A framework that lets most decodes under way at an update go on (SGLang's in_place
    # or retract pause): of 10 such decodes 1 was aborted (with the prior's 1 of 1: 2 of
    # 11). The update at 2.5 s cuts the turn with that share: 2/11 of its re-prefill
    # (1100) and 9/11 of its next turn (1300) are forecast.
    f = _decoding_with_update(2.5, cut=(2.0, 11.0))
    assert f.components["reprefill"] == pytest.approx(1100 * 2 / 11, rel=1e-6)
    assert f.components["tool"] == pytest.approx(1300 * 9 / 11, rel=1e-6)
    # Hand-computed Pr(not aborted before sub-step k ends mid-way): an update in sub-step
    # 0 or 1 with 0.5 each, aborting with share 0.2.
    cfg = ForecastConfig(steps=4)
    assert not_interrupted(np.array([0.5, 0.5, 0.0, 0.0]), cfg, 0.2) == pytest.approx([0.95, 0.85, 0.8, 0.8])


def test_no_update_is_forecast_before_its_delay_was_seen_once():
    h = History(CFG)
    snap = Snapshot(t=0.0, decode_elapsed=np.array([0.0]), decode_prompt=np.array([1000.0]),
                    decode_growth=np.array([100.0]), update_elapsed=0.0)
    assert h.train.count == 0 and forecast(snap, h, CFG).components["reprefill"] == 0.0


def test_a_queued_request_turns_again_when_the_queue_model_finishes_its_prefill():
    # One server at 1 ms/token and two queued 5500-token prompts: prefilled at 5.5 s and
    # 11 s. Decode takes 3 s and the tool 1 s: the first is back at ~9.5 s with 5500 +
    # 200 (answer) + 100 (growth), the second not in the window.
    h = History(CFG)
    h.decode = fixed("decode", *[3.0] * 50)
    h.tool = fixed("tool", *[1.0] * 50)
    h.decode_tool, h.decode_done = 1.0, 1.0
    h.output.value = 200.0
    snap = Snapshot(
        t=0.0, ready_prompt=np.array([5500.0, 5500.0]), ready_since=np.array([-0.2, -0.1]),
        ready_instance=np.zeros(2, int), ready_growth=np.array([100.0, 100.0]),
        instance_overhead=np.array([0.0]), instance_per_token=np.array([0.001]),
        instance_per_pair=np.array([0.0]), instance_servers=np.array([1]),
    )
    assert forecast(snap, h, CFG).components["tool"] == pytest.approx(5800, rel=1e-6)


def test_prefill_spread_of_a_queued_turn_follows_its_cache_flip():
    from prorsa_forecaster.uncertainty import prefill_sd

    # One queued 4000-token prompt, 3000 of it cached on a hit (probability 1/2), 1 ms
    # per token: prefilled at 1 s (hit) or 4 s (miss). Decode 6 s, tool 1 s: back at
    # ~8 s on a hit, after the window on a miss. A coin flip of 4000 + 200 + 100 tokens.
    h = History(CFG)
    h.decode = fixed("decode", *[6.0] * 50)
    h.tool = fixed("tool", *[1.0] * 50)
    h.decode_tool, h.decode_done = 1.0, 1.0
    h.output.value = 200.0
    snap = Snapshot(
        t=0.0, ready_prompt=np.array([4000.0]), ready_since=np.array([-0.1]), ready_instance=np.zeros(1, int),
        ready_growth=np.array([100.0]), ready_cached=np.array([3000.0]), cache_hit=0.5,
        instance_overhead=np.array([0.0]), instance_per_token=np.array([0.001]),
        instance_per_pair=np.array([0.0]), instance_servers=np.array([1]),
    )
    assert forecast(snap, h, CFG).components["tool"] == pytest.approx(0.5 * 4300, rel=1e-6)
    assert prefill_sd(snap, h, CFG) == pytest.approx(0.5 * 4300, rel=1e-6)


def test_prefill_spread_flips_the_next_sync_batch_as_one_coin():
    from prorsa_forecaster.uncertainty import prefill_sd

    # A sync run whose batch of 4 (first prompts of 100 tokens) is due after the weight
    # sync: half the syncs took 2 s, half 30 s, and start-up takes 1 s. The batch is in
    # the window (at ~3 s) with probability 1/2: forecast 200 tokens, and one coin of 400.
    h = quiet_history()
    h.sync_start = fixed("sync_start", *([2.0] * 20 + [30.0] * 20))
    h.start[2] = fixed("start", *[1.0] * 20)  # START_DISPATCHED
    h.first_prompt.value = 100.0
    snap = Snapshot(t=0.0, run=RunInfo(mode="sync", batch_size=4), next_batch_elapsed=0.0,
                    reward_elapsed=np.array([1.0]), reward_cohort=np.array([0]))
    assert forecast(snap, h, CFG).components["sampler"] == pytest.approx(200, rel=1e-3)
    # The member of the last batch still in Reward launches nothing by itself.
    assert prefill_sd(snap, h, CFG) == pytest.approx(0.5 * 400, rel=1e-3)


def test_a_persistent_bias_of_2_to_4x_is_corrected_by_default():
    # A source seen at 3x its forecast window after window. Half-life 6 windows: the
    # effective windows tend to 1 / (1 - 0.5 ** (1 / 6)) = 9.17; the prior adds 2 windows
    # of average volume at ratio 1: (3 x 9.17 + 2) / (9.17 + 2) = 2.642. A clip of 2
    # counts each window at 2: (2 x 9.17 + 2) / (9.17 + 2) = 1.821.
    cfg = ForecastConfig()
    b = BiasCorrector(cfg.bias_half_life, cfg.bias_clip, cfg.bias_prior_windows)
    clipped = BiasCorrector(cfg.bias_half_life, 2.0, cfg.bias_prior_windows)
    for _ in range(300):
        b.update(100.0, 300.0)
        clipped.update(100.0, 300.0)
    eff = 1.0 / (1.0 - 0.5 ** (1.0 / 6.0))
    assert b.factor == pytest.approx((3.0 * eff + 2.0) / (eff + 2.0), rel=1e-6)
    assert clipped.factor == pytest.approx((2.0 * eff + 2.0) / (eff + 2.0), rel=1e-6)
    # Beyond 4x a window is a miss, not a bias: left out, so the factor stays at 1.
    miss = BiasCorrector(cfg.bias_half_life, cfg.bias_clip, cfg.bias_prior_windows)
    for _ in range(10):
        miss.update(100.0, 500.0)
    assert miss.factor == 1.0


def test_an_aborted_request_comes_back_after_the_learnt_requeue_delay():
    # Aborted 0.5 s before t with a context of 3000 tokens; re-queued 2 s after an abort
    # on every occasion, 3 of 4 times (one trajectory was dropped instead): 0.75 x 3000
    # in the window, in the sub-step 1.5 s after t. Past the window it is not counted.
    h = quiet_history()
    h.requeue = fixed("requeue", *[2.0] * 50)
    h.requeued, h.abort_ends = 3.0, 4.0
    snap = Snapshot(t=0.0, aborted_elapsed=np.array([0.5]), aborted_context=np.array([3000.0]))
    f = forecast(snap, h, CFG)
    assert f.components["reprefill"] == pytest.approx(0.75 * 3000, rel=1e-6)
    assert f.prefill_tokens == pytest.approx(0.75 * 3000, rel=1e-6)
    h.requeue = fixed("requeue", *[20.0] * 50)
    assert forecast(snap, h, CFG).components["reprefill"] == pytest.approx(0.0, abs=1e-6)


def test_a_decode_under_way_at_a_landed_update_is_re_queued_not_turned():
    # The update landed 0.2 s before t; a decode that began 1 s before t was under way
    # then and has not been aborted yet: with the learnt share of such decodes cut (3 of
    # 4), it is re-queued with 1000 + half the mean output (200) after the requeue delay,
    # and its turn (a tool call back at 3.5 + 1 s) counts with the rest, 1 in 4. A decode
    # that began after the update is not cut.
    h = History(CFG)
    h.decode = fixed("decode", *[3.5] * 50)
    h.tool = fixed("tool", *[1.0] * 50)
    h.requeue = fixed("requeue", *[0.1] * 50)
    h.decode_tool, h.decode_done = 1.0, 1.0
    h.output.value = 200.0
    h.cut, h.cut_ends = 3.0, 4.0
    snap = Snapshot(t=0.0, decode_elapsed=np.array([1.0]), decode_prompt=np.array([1000.0]),
                    decode_growth=np.array([100.0]), since_update=0.2)
    f = forecast(snap, h, CFG)
    assert f.components["reprefill"] == pytest.approx(0.75 * 1100, rel=1e-6)
    assert f.components["tool"] == pytest.approx(0.25 * 1300, rel=1e-6)
    after = Snapshot(t=0.0, decode_elapsed=np.array([0.1]), decode_prompt=np.array([1000.0]),
                     decode_growth=np.array([100.0]), since_update=0.2)
    g = forecast(after, h, CFG)
    assert g.components["reprefill"] == 0.0 and g.components["tool"] == pytest.approx(1300, rel=1e-6)
