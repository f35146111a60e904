"""The fold learns each sandbox mode's start-up, sandbox.ready or not.

Before session 7 a ``sandbox.ready`` switched the trajectory to the READY mode and the
prewarm / cold duration was never observed: both models kept their priors for the whole
run (a 20 s exponential for a cold start that takes 45 s on the coding workload)."""

import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.snapshot import START_COLD, START_DISPATCHED, START_PREWARM, START_READY
from prorsa_forecaster.state import LiveState
from prorsa_schemas import event_from_dict

_n = 0


def ev(kind: str, ts: float, **fields):
    global _n
    _n += 1
    return event_from_dict({"v": 1, "id": f"e{_n}", "type": kind, "ts": ts, "run": "r", **fields})


def test_each_mode_learns_its_start_to_the_first_request_with_and_without_ready():
    st = LiveState(ForecastConfig())
    # cold: started at 1, ready at 15, first request at 16 -> 15 s (and 1 s from ready).
    st.apply(ev("trajectory.dispatched", 0.0, traj="c", prompt_tokens=100))
    st.apply(ev("sandbox.started", 1.0, traj="c", mode="cold"))
    st.apply(ev("sandbox.ready", 15.0, traj="c"))
    st.apply(ev("request.queued", 16.0, traj="c", req="c0", turn=0, prompt_tokens=120))
    # prewarm without sandbox.ready: started at 2, first request at 4 -> 2 s.
    st.apply(ev("trajectory.dispatched", 2.0, traj="p", prompt_tokens=100))
    st.apply(ev("sandbox.started", 2.0, traj="p", mode="prewarm"))
    st.apply(ev("request.queued", 4.0, traj="p", req="p0", turn=0, prompt_tokens=120))
    # no sandbox events: only the dispatch -> first request delay (3 s).
    st.apply(ev("trajectory.dispatched", 5.0, traj="d", prompt_tokens=100))
    st.apply(ev("request.queued", 8.0, traj="d", req="d0", turn=0, prompt_tokens=120))
    start = st.history.start
    assert (start[START_COLD].count, start[START_COLD].observed_mean) == (1, pytest.approx(15.0))
    assert (start[START_PREWARM].count, start[START_PREWARM].observed_mean) == (1, pytest.approx(2.0))
    assert (start[START_READY].count, start[START_READY].observed_mean) == (1, pytest.approx(1.0))
    assert start[START_DISPATCHED].count == 3
    assert start[START_DISPATCHED].observed_mean == pytest.approx((16.0 + 2.0 + 3.0) / 3)


def test_a_reused_slot_forgets_the_last_trajectorys_sandbox():
    st = LiveState(ForecastConfig())
    st.apply(ev("trajectory.dispatched", 0.0, traj="a", prompt_tokens=100))
    st.apply(ev("sandbox.started", 0.0, traj="a", mode="cold"))
    st.apply(ev("sandbox.ready", 10.0, traj="a"))
    st.apply(ev("trajectory.dropped", 11.0, traj="a", reason="error"))
    # "b" takes a's slot: dispatched, sandbox.ready without sandbox.started, first request.
    st.apply(ev("trajectory.dispatched", 12.0, traj="b", prompt_tokens=100))
    st.apply(ev("sandbox.ready", 13.0, traj="b"))
    st.apply(ev("request.queued", 14.0, traj="b", req="b0", turn=0, prompt_tokens=120))
    assert st.history.start[START_COLD].count == 0
