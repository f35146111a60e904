"""Tool-duration frailty (frailty.py): the ANOVA's variances, the shrunk effects and the
scaled hazard, on hand-computed cases; and through LiveState, the effects a log teaches."""

import math

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.frailty import THETA_MAX, Frailty, _Anova
from prorsa_forecaster.state import LiveState
from prorsa_forecaster.survival import DurationModel
from prorsa_schemas import event_from_dict


def test_anova_variances_by_hand():
    # Units {1, 3} and {4, 6, 8}: means 2 and 6, grand mean 22/5 = 4.4.
    a = _Anova()
    for unit in ((1.0, 3.0), (4.0, 6.0, 8.0)):
        n, s = 0, 0.0
        for y in unit:
            a.add(y, n, s)
            n, s = n + 1, s + y
    # Within: ((1-2)^2 + (3-2)^2 + (4-6)^2 + 0 + (8-6)^2) / (5 - 2) = 10 / 3.
    # Between mean square: (2 (2-4.4)^2 + 3 (6-4.4)^2) / 1 = 19.2; n0 = (5 - 13/5) / 1 = 2.4.
    within, between = a.variances()
    assert within == pytest.approx(10 / 3)
    assert between == pytest.approx((19.2 - 10 / 3) / 2.4)
    # One unit, or one observation a unit: no estimate.
    b = _Anova()
    b.add(1.0, 0, 0.0)
    b.add(2.0, 1, 1.0)
    assert b.variances()[1] == 0.0 and _Anova().variances()[1] == 0.0


def _learn(fr: Frailty, calls: dict[tuple[int, int], list[float]]) -> dict[tuple[int, int], tuple[int, float, int]]:
    """Feed log durations per (group, trajectory) round-robin; returns each trajectory's
    (n, sum, group code)."""
    codes = {g: fr.group_code("r", g) for g, _ in calls}
    state = {k: (0, 0.0, codes[k[0]]) for k in calls}
    longest = max(len(v) for v in calls.values())
    for j in range(longest):
        for k, ys in calls.items():
            if j < len(ys):
                n, s, g = state[k]
                fr.observe(ys[j], n, s, g)
                state[k] = (n + 1, s + ys[j], g)
    return state


def test_effects_are_the_shrunk_group_and_trajectory_means():
    rng = np.random.default_rng(1)
    fr = Frailty(min_calls=50)
    # 40 groups of 4 trajectories, 20 calls each: group effect sd 0.6, trajectory 0.3, noise 1.0.
    g_eff = rng.normal(0, 0.6, 40)
    t_eff = rng.normal(0, 0.3, (40, 4))
    calls = {(g, t): list(g_eff[g] + t_eff[g, t] + rng.normal(0, 1.0, 20)) for g in range(40) for t in range(4)}
    state = _learn(fr, calls)
    c = fr.components()
    assert fr.active and c.var_g > 0 and c.var_t > 0
    # The ANOVA recovers the variances of the effects drawn, to its sampling error: a
    # trajectory's mean of 20 calls carries noise of variance 1/20 = 0.05, so the
    # between-trajectory variance of 160 is known to about sqrt(2/159) x (0.09 + 0.05)
    # = 0.016, the groups' of 40 to about sqrt(2/39) x (0.36 + 0.03) = 0.09.
    assert c.var_g == pytest.approx(np.var(g_eff, ddof=1), abs=0.15)
    assert c.var_t == pytest.approx(np.var(t_eff, ddof=1), abs=0.05)
    assert c.var_t * c.k_t == pytest.approx(1.0, abs=0.05)  # sigma_W^2, from 3040 degrees of freedom
    # By hand for one trajectory: its group's mean residual shrunk by n_g / (n_g + k_g),
    # then its own mean residual less that, shrunk by n_t / (n_t + k_t); the error's
    # variance is each effect's variance times k / (n + k).
    n, s, code = state[(3, 1)]
    n_g, s_g = fr.group_n[code], fr.group_sum[code]
    g_hat = (s_g / n_g - c.mu) * n_g / (n_g + c.k_g)
    u_hat = (s / n - c.mu - g_hat) * n / (n + c.k_t)
    var = c.var_g * c.k_g / (n_g + c.k_g) + c.var_t * c.k_t / (n + c.k_t)
    assert fr.effect(n, s, code) == pytest.approx((g_hat + u_hat, var))
    # The effects track the true ones: correlation over the 160 trajectories.
    est = np.array([fr.effect(*state[(g, t)])[0] for g in range(40) for t in range(4)])
    true = np.array([g_eff[g] + t_eff[g, t] for g in range(40) for t in range(4)])
    assert np.corrcoef(est, true)[0, 1] > 0.8
    # A trajectory with no call yet: its group's effect alone, and the whole trajectory
    # variance; no group, no call: 0, with both variances whole.
    assert fr.effect(0, 0.0, code) == pytest.approx((g_hat, c.var_g * c.k_g / (n_g + c.k_g) + c.var_t))
    assert fr.effect(0, 0.0, -1) == pytest.approx((0.0, c.var_g + c.var_t))


def test_durations_that_do_not_cluster_give_no_effect():
    rng = np.random.default_rng(2)
    fr = Frailty(min_calls=50)
    calls = {(g, t): list(rng.normal(0, 1.0, 10)) for g in range(20) for t in range(4)}
    state = _learn(fr, calls)
    # Between-unit variances estimated at (or near) 0: effects near 0 for every trajectory.
    est = np.array([fr.effect(*v)[0] for v in state.values()])
    assert np.abs(est).max() < 0.25
    # Before min_calls nothing is estimated.
    young = Frailty(min_calls=10_000)
    _learn(young, {(0, 0): [5.0] * 10, (1, 0): [-5.0] * 10})
    assert not young.active and young.effect(10, 50.0, 0) == (0.0, 0.0)


def test_effects_are_clipped_and_groups_are_freed():
    fr = Frailty(min_calls=4)
    # Two groups of one trajectory each, far apart: effects clipped at THETA_MAX.
    a, b = fr.group_code("r", "a"), fr.group_code("r", "b")
    for j in range(10):
        fr.observe(10.0, j, 10.0 * j, a)
        fr.observe(-10.0 + 0.01 * j, j, sum(-10.0 + 0.01 * i for i in range(j)), b)
    assert fr.effect(10, 100.0, a)[0] == THETA_MAX
    assert fr.effect(10, -99.55, b)[0] == -THETA_MAX
    # The last member leaving frees the code for the next group, whose sums start at 0.
    fr.leave("r", "a", a)
    c = fr.group_code("r", "c")
    assert c == a and fr.group_n[c] == 0 and fr.group_sum[c] == 0.0
    assert fr.group_code("r", None) == -1


def test_scaled_query_is_the_query_of_scaled_durations():
    rng = np.random.default_rng(3)
    d = np.exp(rng.normal(1.5, 1.0, 5000))
    base, doubled = DurationModel("b", 1.0, prior_weight=0.0), DurationModel("d", 1.0, prior_weight=0.0)
    for x in d:
        base.observe(x)
        doubled.observe(2.0 * x)
    elapsed = np.array([0.0, 1.0, 3.0, 8.0, 20.0])
    w = np.ones(len(elapsed))
    # theta = 0: the plain query.
    assert base.weighted_steps(elapsed, w, 10.0, 5, theta=np.zeros(5)) == pytest.approx(
        base.weighted_steps(elapsed, w, 10.0, 5), abs=1e-9)
    # theta = log 2: durations twice as long, which the doubled model knows directly
    # (to the grid: theta quantised at 0.05, elapsed bucketed at 2%).
    got = base.weighted_steps(elapsed, w, 10.0, 5, theta=np.full(5, math.log(2.0)))
    want = doubled.weighted_steps(elapsed, w, 10.0, 5)
    assert got == pytest.approx(want, abs=0.03)
    # Rows with different theta and groups keep their sums apart.
    grouped = base.weighted_steps(elapsed, w, 10.0, 5, np.array([0, 1, 0, 1, 1]), 2,
                                  theta=np.array([0.0, 0.0, 0.7, 0.7, -0.7]))
    assert grouped.shape == (2, 5) and grouped.sum() == pytest.approx(
        base.weighted_steps(elapsed, w, 10.0, 5, theta=np.array([0.0, 0.0, 0.7, 0.7, -0.7])).sum())


def _ev(kind: str, ts: float, **kw):
    return event_from_dict({"v": 1, "id": f"{kind}-{ts}-{kw.get('traj', '')}-{kw.get('req', '')}", "type": kind, "ts": ts,
                        "run": "r", **kw})


def test_a_log_teaches_each_group_its_speed():
    # 30 groups of 2 trajectories, 8 tool calls each; group k's calls take 2 s or 20 s
    # (alternating groups), with noise. The slow groups' open calls get positive effects.
    rng = np.random.default_rng(4)
    st = LiveState(ForecastConfig(frailty_min_calls=50))
    events = []
    for g in range(30):
        slow = g % 2 == 1
        for k in range(2):
            tid = f"t{g}-{k}"
            t = 0.0
            events.append(_ev("trajectory.dispatched", t, traj=tid, prompt_tokens=100, group=f"g{g}"))
            for turn in range(8):
                req = f"{tid}-{turn}"
                events += [_ev("request.queued", t + 0.1, traj=tid, req=req, turn=turn, prompt_tokens=100 + turn),
                           _ev("prefill.finished", t + 0.2, traj=tid, req=req),
                           _ev("decode.finished", t + 0.3, traj=tid, req=req, output_tokens=10, finish="tool")]
                t += 0.3 + (20.0 if slow else 2.0) * math.exp(rng.normal(0, 0.3))
    for e in sorted(events, key=lambda e: e.ts):
        st.apply(e)
    fr = st.history.frailty
    assert fr.active and fr.calls == 30 * 2 * 7
    snap = st.snapshot(max(e.ts for e in events) + 0.01)
    assert len(snap.tool_theta) == len(snap.tool_elapsed) == 60
    slow = np.array([g % 2 == 1 for g in range(30) for _ in range(2)])
    # Slots are in dispatch order: the slow groups' effects are about +log(10)/2, the
    # fast ones' -log(10)/2 (the grand mean is halfway in log terms).
    theta = snap.tool_theta[:, 0]
    assert np.all(theta[slow] > 0.8) and np.all(theta[~slow] < -0.8)
    # The baseline is the durations with the effects taken out: narrower than the pooled.
    assert st.history.tool_base.quantile(0.9) / st.history.tool_base.quantile(0.1) < \
        st.history.tool.quantile(0.9) / st.history.tool.quantile(0.1) / 3


def _history_with_base(tool_s: float, base_s: float):
    from prorsa_forecaster.history import History

    from .test_core import CFG, fixed

    h = History(CFG)
    h.decode = fixed("decode", *[3.0] * 50)
    h.tool = fixed("tool", *[tool_s] * 50)
    h.tool_base = fixed("tool_base", *[base_s] * 50)
    h.decode_tool, h.decode_done = 1.0, 1.0  # every response calls a tool
    h.output.value = 200.0
    return h


def test_an_open_call_returns_on_its_own_time_scale():
    from prorsa_forecaster.core import forecast
    from prorsa_forecaster.snapshot import Snapshot

    from .test_core import CFG

    # Baseline calls take 4 s. Two calls open for 1 s: one of a fast group (theta =
    # log 0.5: 2 s, back at once), one of a slow group (theta = log 4: 16 s, back after
    # the window). Only the first comes back, with its context plus its growth. The
    # pooled model (every call 4 s) would bring both back.
    h = _history_with_base(4.0, 4.0)
    base = dict(t=0.0, tool_elapsed=np.array([1.0, 1.0]), tool_context=np.array([1000.0, 2000.0]),
                tool_growth=np.array([100.0, 100.0]), tool_result=np.array([-1.0, -1.0]))
    with_effects = Snapshot(**base, effects=True, tool_theta=np.array([[math.log(0.5), 1.0], [math.log(4.0), 1.0]]))
    assert forecast(with_effects, h, CFG).components["tool"] == pytest.approx(1100, rel=1e-6)
    assert forecast(Snapshot(**base), h, CFG).components["tool"] == pytest.approx(3200, rel=1e-6)


def test_a_decoding_trajectory_calls_its_next_tool_on_its_own_time_scale():
    from prorsa_forecaster.core import forecast
    from prorsa_forecaster.snapshot import Snapshot

    from .test_core import CFG

    # Decode ends at 3 s; the baseline tool takes 2 s, so a trajectory at theta = 0 is
    # back at ~5 s with 1000 + 200 (answer) + 100 (growth) tokens, one at theta = log 4
    # (8 s) after the window. Without effects the pooled 2 s brings both back.
    h = _history_with_base(2.0, 2.0)
    base = dict(t=0.0, decode_elapsed=np.array([0.0, 0.0]), decode_prompt=np.array([1000.0, 1000.0]),
                decode_growth=np.array([100.0, 100.0]))
    with_effects = Snapshot(**base, effects=True, decode_theta=np.array([[0.0, 1.0], [math.log(4.0), 1.0]]))
    assert forecast(with_effects, h, CFG).components["tool"] == pytest.approx(1300, rel=1e-6)
    assert forecast(Snapshot(**base), h, CFG).components["tool"] == pytest.approx(2600, rel=1e-6)
    # A snapshot that says it carries effects carries one per row.
    with pytest.raises(ValueError, match="decode_theta"):
        Snapshot(**base, effects=True)


def test_a_call_mixes_the_baseline_and_the_pooled_distribution_by_what_is_resolved():
    from prorsa_forecaster.core import forecast
    from prorsa_forecaster.snapshot import Snapshot

    from .test_core import CFG

    # Baseline calls take 4 s, pooled ones 2 s. A call open 1 s at theta = log 4 (16 s:
    # not back in the window) resolved at 0.25: both kinds have survived to 1 s, so it
    # is the pooled kind with 0.75 and comes back with that weight.
    h = _history_with_base(2.0, 4.0)
    base = dict(t=0.0, tool_context=np.array([1000.0]), tool_growth=np.array([200.0]), tool_result=np.array([-1.0]))
    theta = np.array([[math.log(4.0), 0.25]])
    young = Snapshot(**base, tool_elapsed=np.array([1.0]), effects=True, tool_theta=theta)
    assert forecast(young, h, CFG).components["tool"] == pytest.approx(0.75 * 1200, rel=1e-6)
    # Open 3 s, it is past every pooled call: it is the slow kind, and does not come back.
    old = Snapshot(**base, tool_elapsed=np.array([3.0]), effects=True, tool_theta=theta)
    assert forecast(old, h, CFG).components["tool"] == pytest.approx(0.0, abs=1e-6)


def test_a_decoding_trajectory_mixes_its_next_call_by_what_is_resolved():
    from prorsa_forecaster.core import forecast
    from prorsa_forecaster.snapshot import Snapshot

    from .test_core import CFG

    # Decode ends at 3 s; the pooled tool takes 2 s (back at ~5 s), the baseline at theta
    # = log 4 takes 16 s (after the window). Resolved at 0.3 (a step of the kernels'
    # 0.1 grid), the next call comes back with weight 0.7: 0.7 x (1000 + 200 + 100).
    h = _history_with_base(2.0, 4.0)
    snap = Snapshot(t=0.0, decode_elapsed=np.array([0.0]), decode_prompt=np.array([1000.0]),
                    decode_growth=np.array([100.0]), effects=True, decode_theta=np.array([[math.log(4.0), 0.3]]))
    assert forecast(snap, h, CFG).components["tool"] == pytest.approx(0.7 * 1300, rel=1e-6)


def test_a_queued_request_calls_its_next_tool_on_its_own_time_scale():
    from prorsa_forecaster.core import forecast
    from prorsa_forecaster.snapshot import Snapshot

    from .test_core import CFG

    # test_core's queued case: two 5500-token prompts prefilled at 5.5 s and 11 s, decode
    # 3 s, the tool 1 s: the first is back at ~9.5 s with 5800 tokens. On the baseline at
    # theta = 0 the same; at theta = log 4 its tool takes 4 s and it is back after the window.
    h = _history_with_base(1.0, 1.0)
    base = dict(t=0.0, ready_prompt=np.array([5500.0, 5500.0]), ready_since=np.array([-0.2, -0.1]),
                ready_instance=np.zeros(2, int), ready_growth=np.array([100.0, 100.0]),
                instance_overhead=np.array([0.0]), instance_per_token=np.array([0.001]),
                instance_per_pair=np.array([0.0]), instance_servers=np.array([1]))
    same = Snapshot(**base, effects=True, ready_theta=np.array([[0.0, 1.0], [0.0, 1.0]]))
    slow = Snapshot(**base, effects=True, ready_theta=np.array([[math.log(4.0), 1.0], [0.0, 1.0]]))
    assert forecast(same, h, CFG).components["tool"] == pytest.approx(5800, rel=1e-6)
    assert forecast(slow, h, CFG).components["tool"] == pytest.approx(0.0, abs=1e-6)
