"""Announced sync batches: run.started gives the size, the learnt training pause after the
last reward (or policy.updated) the timing; the batch is forecast in the window it lands
in (hand-computed cases)."""

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.core import forecast
from prorsa_forecaster.terms.sampler import sync_batch
from prorsa_forecaster.snapshot import START_DISPATCHED, RunInfo, Snapshot
from prorsa_forecaster.state import LiveState
from prorsa_schemas import EVENT_TYPES

from .test_core import fixed, quiet_history

CFG = ForecastConfig(horizon=10.0, steps=10)
SYNC = RunInfo(mode="sync", batch_size=8)


def _history():
    """Training takes 30 s, the next batch is dispatched at once after the update, its
    first requests 3 s after their dispatch, 1000 tokens each."""
    h = quiet_history()
    h.train = fixed("train", *[30.0] * 3)
    h.sync_start = fixed("sync_start", *[0.0] * 3)
    h.start[START_DISPATCHED] = fixed("start", *[3.0] * 20)
    h.first_prompt.value = 1000.0
    return h


def test_the_batch_lands_after_the_training_pause_and_its_start_up():
    h = _history()
    # Drained 10 s ago: the update comes in 20 s, the first requests 3 s later: not in
    # [t, t + 10).
    size, due = sync_batch(Snapshot(t=100.0, run=SYNC, update_elapsed=10.0), h, 10.0, 10)
    assert size == 8 and due.sum() == pytest.approx(0.0, abs=1e-6)
    # Drained 25 s ago: update in 5 s, first requests at t + 8 s (placed mid-sub-step: on
    # the edge of sub-steps 7 and 8), all of them.
    size, due = sync_batch(Snapshot(t=100.0, run=SYNC, update_elapsed=25.0), h, 10.0, 10)
    assert due[7:9].sum() == pytest.approx(1.0, abs=1e-3)
    f = forecast(Snapshot(t=100.0, run=SYNC, update_elapsed=25.0), h, CFG)
    assert f.components["sampler"] == pytest.approx(8 * 1000, rel=1e-3)


def test_one_training_pause_seen_is_enough():
    h = _history()
    h.train = fixed("train", 30.0)
    _, due = sync_batch(Snapshot(t=100.0, run=SYNC, update_elapsed=25.0), h, 10.0, 10)
    assert due.sum() == pytest.approx(1.0, abs=1e-3)
    h.train = fixed("train")  # none seen: the pause is not known, nothing is forecast
    _, due = sync_batch(Snapshot(t=100.0, run=SYNC, update_elapsed=25.0), h, 10.0, 10)
    assert due.sum() == 0.0


def test_after_policy_updated_the_batch_is_due_at_once():
    h = _history()
    # The update came just now: dispatch at once, first requests 3 s later.
    size, due = sync_batch(Snapshot(t=100.0, run=SYNC, next_batch_elapsed=0.0), h, 10.0, 10)
    assert due[2:4].sum() == pytest.approx(1.0, abs=1e-3)
    assert sync_batch(Snapshot(t=100.0, run=RunInfo(mode="async", batch_size=8), next_batch_elapsed=1.0), h, 10.0, 10)[0] == 0.0


def _ev(kind, ts, **f):
    _ev.k += 1
    return EVENT_TYPES[kind](id=f"s{_ev.k}", ts=ts, run="r", **f)


_ev.k = 0


def test_run_started_announces_the_first_batch_and_a_drain_the_next():
    st = LiveState(CFG)
    st.apply(_ev("run.started", 0.5, mode="sync", batch_size=2, prompt_tokens_mean=1000))
    snap = st.snapshot(1.0)
    assert snap.next_batch_elapsed == pytest.approx(0.5)
    # The prior says at once: most of the batch's first requests within the window (their
    # own first requests only: no tool call learnt yet, none made).
    st.history.decode_tool = 0.0
    f = forecast(snap, st.history, CFG)
    assert 0.5 * 2000 < f.components["sampler"] <= 2000
    for k in range(2):
        st.apply(_ev("trajectory.dispatched", 1.0, traj=f"a{k}", prompt_tokens=1000))
    assert np.isnan(st.snapshot(1.5).next_batch_elapsed)  # out: its trajectories are live
    for k in range(2):
        st.apply(_ev("request.queued", 2.0, traj=f"a{k}", req="q", turn=0, prompt_tokens=1000))
        st.apply(_ev("prefill.finished", 2.5, traj=f"a{k}", req="q"))
        st.apply(_ev("decode.finished", 4.0, traj=f"a{k}", req="q", output_tokens=10, finish="stop"))
        st.apply(_ev("reward.finished", 5.0 + k, traj=f"a{k}", admitted=True))
    snap = st.snapshot(7.0)
    assert snap.update_elapsed == pytest.approx(1.0)  # drained at 6: training runs
    st.apply(_ev("policy.updated", 20.0, version=1))
    assert st.history.train.count == 1 and st.snapshot(21.0).next_batch_elapsed == pytest.approx(1.0)
