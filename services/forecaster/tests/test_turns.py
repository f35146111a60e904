"""Whether a response calls a tool, by the turn it answers (``tool_turn_pseudo``).

A trajectory's first responses nearly always call a tool and later ones are likelier
its last, so one pooled tool share over-forecasts the next turns late in a step and
under-forecasts them early. Hand-computed cases for the bins, the shrinkage, the fold
that learns them, and every place the forecast uses them.
"""

import math

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.core import forecast
from prorsa_forecaster.history import History, TurnBinnedRatio
from prorsa_forecaster.snapshot import TURN_BINS, RunInfo, Snapshot, turn_bin
from prorsa_forecaster.state import DECODE, LiveState
from prorsa_forecaster.uncertainty import prefill_sd
from prorsa_schemas import event_from_dict

from .test_core import CFG, fixed


def test_turn_bins_are_single_turns_then_octaves():
    turns = [0, 1, 7, 15, 16, 31, 32, 63, 64, 10_000, -3]
    assert turn_bin(turns).tolist() == [0, 1, 7, 15, 16, 16, 17, 17, 18, 18, 0]
    assert TURN_BINS == 19
    assert turn_bin(np.array([np.nan, np.inf])).tolist() == [0, 18]


def test_each_turn_bin_is_shrunk_towards_the_pooled_share():
    r = TurnBinnedRatio(None, pseudo=20.0, half_life=math.inf)
    for _ in range(10):
        r.observe(0, 1.0, 1.0)  # turn 0: 10 of 10 call a tool
    for k in range(10):
        r.observe(5, float(k < 8), 1.0)  # turn 5: 8 of 10
    table = r.table(0.9)
    assert table[0] == pytest.approx((10 + 20 * 0.9) / (10 + 20))
    assert table[5] == pytest.approx((8 + 20 * 0.9) / (10 + 20))
    assert table[3] == pytest.approx(0.9)  # never seen: the pooled share
    assert TurnBinnedRatio(None, pseudo=math.inf).table(0.9) == pytest.approx(np.full(TURN_BINS, 0.9))


def _ev(kind: str, ts: float, **fields):
    return event_from_dict({"v": 1, "id": f"{kind}-{ts}-{fields.get('req', fields.get('traj'))}", "type": kind, "ts": ts, "run": "r", **fields})


def test_the_fold_learns_the_share_per_turn_and_the_snapshot_carries_each_turn():
    st = LiveState(ForecastConfig())
    ts = 0.0
    # Two trajectories: "a" calls a tool at turn 0 and stops at turn 1; "b" calls a tool
    # at turn 0 and is decoding its turn 1 at the end.
    for traj in ("a", "b"):
        st.apply(_ev("trajectory.dispatched", ts, traj=traj, prompt_tokens=100))
    for turn, finishes in ((0, {"a": "tool", "b": "tool"}), (1, {"a": "stop", "b": None})):
        for traj, finish in finishes.items():
            req = f"{traj}{turn}"
            ts += 1.0
            st.apply(_ev("request.queued", ts, traj=traj, req=req, turn=turn, prompt_tokens=100 + 50 * turn))
            st.apply(_ev("prefill.finished", ts + 0.1, traj=traj, req=req))
            if finish is not None:
                st.apply(_ev("decode.finished", ts + 0.5, traj=traj, req=req, output_tokens=10, finish=finish))
                if finish == "tool":
                    st.apply(_ev("tool.started", ts + 0.5, traj=traj))
    h = st.history
    num, den = zip(*(b.sums for b in h.tool_by_turn._bins))
    # (Each bin forgets with a half-life of 2000 observations: 2 of 2 is 1.9997 of 1.9997.)
    assert num[0] == pytest.approx(2.0, rel=1e-3) and num[0] == den[0]
    assert num[1] == 0.0 and den[1] == pytest.approx(1.0)
    pooled = h.tool_fraction  # prior 1 of 2, then 2 tools in 3 finishes
    assert pooled == pytest.approx(3 / 5)
    table = h.tool_turn_table()
    assert table[0] == pytest.approx((2 + 20 * pooled) / 22, rel=1e-4) and table[1] == pytest.approx(20 * pooled / 21)
    snap = st.snapshot(ts + 1.0)
    assert st.state[st.slot("r", "b")] == DECODE and snap.decode_turn.tolist() == [1]
    assert snap.tool_share("decode_turn", "decode_elapsed", pooled) == pytest.approx([table[1]])


def _history(cfg=CFG) -> History:
    """Decode takes 3.5 s, the tool 1 s, a reward and a launch 1 s each, the answer is 200
    tokens; 3 in 4 responses call a tool overall (the pooled share)."""
    h = History(cfg)
    h.decode = fixed("decode", *[3.5] * 50)
    h.tool = fixed("tool", *[1.0] * 50)
    h.reward = fixed("reward", *[1.0] * 50)
    h.launch = fixed("launch", *[1.0] * 50)
    h.decode_tool, h.decode_done = 3.0, 4.0
    h.output.value = 200.0
    h.completions = 1  # rewards complete in this log: completions cause launches
    return h


def _decoding(turns, prompts, table, cfg=CFG, run=None):
    """Trajectories decoding at t (see :func:`_history`), each prompt growing by 100 per
    tool turn."""
    h = _history(cfg)
    n = len(turns)
    snap = Snapshot(
        t=0.0, run=run or RunInfo(), decode_elapsed=np.zeros(n), decode_prompt=np.asarray(prompts, float),
        decode_growth=np.full(n, 100.0), decode_turn=np.asarray(turns, int), tool_turn_table=np.asarray(table, float),
    )
    return snap, h


def test_a_decoding_trajectory_comes_back_with_its_turns_tool_share():
    # Turn 0 always calls a tool, turn 5 half the time: 1300 + 0.5 x 3300 tokens back at
    # ~4.5 s. With no table, the pooled 3/4 for both: 0.75 x (1300 + 3300).
    table = np.full(TURN_BINS, 0.75)
    table[0], table[5] = 1.0, 0.5
    snap, h = _decoding([0, 5], [1000.0, 3000.0], table)
    assert forecast(snap, h, CFG).components["tool"] == pytest.approx(1300 + 0.5 * 3300, rel=1e-6)
    snap, h = _decoding([0, 5], [1000.0, 3000.0], [])
    assert forecast(snap, h, CFG).components["tool"] == pytest.approx(0.75 * 4600, rel=1e-6)


def test_a_queued_request_comes_back_with_its_turns_tool_share():
    # One server at 1 ms/token, a queued 1000-token turn-3 prompt: prefilled at 1 s,
    # decoded by 4.5 s, back at ~5.5 s if turn 3 calls a tool (share 0.2).
    h = _history()
    table = np.full(TURN_BINS, 0.75)
    table[3] = 0.2
    snap = Snapshot(
        t=0.0, ready_prompt=np.array([1000.0]), ready_since=np.array([-0.1]), ready_instance=np.zeros(1, int),
        ready_growth=np.array([100.0]), ready_turn=np.array([3]), tool_turn_table=table,
        instance_overhead=np.array([0.0]), instance_per_token=np.array([0.001]),
        instance_per_pair=np.array([0.0]), instance_servers=np.array([1]),
    )
    assert forecast(snap, h, CFG).components["tool"] == pytest.approx(0.2 * 1300, rel=1e-6)


def test_decoding_trajectories_that_stop_feed_the_sampler_with_one_minus_their_share():
    # Async, replace: a response that does not call a tool ends the trajectory, whose
    # reward (1 s) frees a launch. Turn 0 never stops (share 1), turn 5 always (share 0):
    # the sampler term is half of what it is when both stop.
    run = RunInfo(mode="async", injection="replace")
    one = np.full(TURN_BINS, 1.0)
    one[5] = 0.0
    snap, h = _decoding([0, 5], [1000.0, 1000.0], one, run=run)
    half = forecast(snap, h, CFG).components["sampler"]
    snap, h = _decoding([0, 5], [1000.0, 1000.0], np.zeros(TURN_BINS), run=run)
    both = forecast(snap, h, CFG).components["sampler"]
    assert both > 0 and half == pytest.approx(both / 2, rel=1e-9)


def test_the_noise_floor_flips_each_turn_with_its_share():
    # One decoding trajectory back for sure if it calls a tool (share 1/2): a coin flip
    # of 1300 tokens, sd 650.
    table = np.full(TURN_BINS, 0.75)
    table[5] = 0.5
    snap, h = _decoding([5], [1000.0], table)
    assert prefill_sd(snap, h, CFG) == pytest.approx(650, rel=1e-6)


def test_off_every_turn_uses_the_pooled_share():
    off = ForecastConfig(horizon=10.0, steps=10, bias_half_life=0, tool_turn_pseudo=math.inf)
    h = History(off)
    for _ in range(100):
        h.tool_by_turn.observe(0, 1.0, 1.0)
    assert h.tool_turn_table() == pytest.approx(np.full(TURN_BINS, h.tool_fraction))
    with pytest.raises(ValueError, match="tool_turn_pseudo"):
        ForecastConfig(tool_turn_pseudo=float("nan"))
