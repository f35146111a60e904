"""Logs without ``prefill.started`` (a driver behind a router sees a request queued and
its first token, nothing between): what the forecaster learns of the delay that follows
a prefill's end on its server (the KV transfer, the router's hops), and how the queue
model places requests that may have been on a server for a while. Hand-computed cases:
one prefill engine of two attention-DP ranks, 1 s of server time per 1000-token prompt,
0.3 s of delay after it."""

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.history import PrefillLatency, PrefillTimeModel
from prorsa_forecaster.snapshot import Snapshot
from prorsa_forecaster.state import LiveState
from prorsa_forecaster.terms.known_queue import known_queue
from prorsa_schemas import event_from_dict

SERVER_S, DELAY_S = 1.0, 0.3
PAR = {"tp": 1, "dp": 2, "ep": 2, "attn_dp": 2}


def _events():
    ids = iter(range(1, 10**9))

    def ev(kind, ts, **f):
        return event_from_dict({"v": 1, "id": f"e{next(ids)}", "type": kind, "ts": ts, "run": "r", **f})

    return ev


def _driver_view(n_busy: int = 200, n_free: int = 5, starts: bool = False) -> LiveState:
    """``n_busy`` requests queued at once on two queues (each waits for a departure but
    the first two), then ``n_free`` requests that each find the queues idle. With
    ``starts`` every request also has its prefill.started."""
    st = LiveState(ForecastConfig())
    ev = _events()
    st.apply(ev("engine.registered", 0.0, engine="p0", server="s0", role="prefill", gpus=8,
                kv_capacity_tokens=10**6, parallel=PAR))
    timeline = []
    for j in range(n_busy):
        st.apply(ev("request.queued", 0.0, traj=f"t{j}", req=f"r{j}", turn=0, prompt_tokens=1000))
        start = SERVER_S * (j // 2)
        timeline.append((start, 0, "prefill.started", j))
        timeline.append((start + SERVER_S + DELAY_S, 1, "prefill.finished", j))
    for k in range(n_free):
        j, t0 = n_busy + k, 100.0 + 10.0 * k
        timeline.append((t0, -1, "request.queued", j))
        timeline.append((t0, 0, "prefill.started", j))
        timeline.append((t0 + SERVER_S + DELAY_S, 1, "prefill.finished", j))
    for ts, _, kind, j in sorted(timeline):
        if kind == "prefill.started" and not starts:
            continue
        extra = {"turn": 0, "prompt_tokens": 1000} if kind == "request.queued" else {"cached_tokens": 0}
        st.apply(ev(kind, ts, traj=f"t{j}", req=f"r{j}", **extra))
    return st


def test_a_request_that_waited_teaches_server_time_and_one_that_found_a_queue_free_the_delay():
    st = _driver_view()
    pool = st.history.prefill_model(None)
    # Timed from the departure that freed its queue, 1.3 s after the one before it: 1 s.
    # (The first two, queued before any departure, count their delay too, and the
    # prior counts as 4 observations: 206 in all.)
    assert float(pool.g(1000.0)) == pytest.approx(SERVER_S, abs=0.03)
    latency = st.history.prefill_latency.value(st.history.prefill_model)
    assert latency == pytest.approx(DELAY_S, abs=0.03)
    assert st.snapshot(200.0).prefill_latency == pytest.approx(latency)


def test_with_prefill_started_the_delay_is_not_separated():
    # prefill.started -> finished holds both; nothing is learnt as a delay.
    st = _driver_view(starts=True)
    assert st.history.prefill_latency.n == 0
    assert st.snapshot(200.0).prefill_latency == 0.0


def test_no_delay_until_the_server_time_has_been_fit():
    lat = PrefillLatency(min_fit=8)
    lat.observe(None, 1000.0, 0.0, 1.3)
    unfit = PrefillTimeModel()
    assert lat.value(lambda name: unfit) == 0.0
    fit = PrefillTimeModel(prior_weight=0.0)  # the fit's own: g(1000) = 1 s
    for _ in range(20):
        fit.observe(1000.0, SERVER_S)
    assert lat.value(lambda name: fit) == pytest.approx(DELAY_S, abs=0.02)
    lat.observe(None, float("nan"), 0.0, 1.0)  # ignored
    assert lat.n == 1


def test_the_servers_last_departures_less_the_delay():
    ev = _events()
    st = LiveState(ForecastConfig())
    st.apply(ev("engine.registered", 0.0, engine="p0", server="s0", role="prefill", gpus=8,
                kv_capacity_tokens=10**6, parallel=PAR))
    for j, ts in enumerate((1.0, 2.0, 3.0)):
        st.apply(ev("request.queued", 0.0, traj=f"t{j}", req=f"r{j}", turn=0, prompt_tokens=1000))
        st.apply(ev("prefill.finished", ts, traj=f"t{j}", req=f"r{j}", cached_tokens=0))
    names = st.prefill_instances()
    assert names == ["p0"]
    # The two most recent departures, newest first, each 0.25 s after its server freed.
    assert st.server_free(names, 0.25).tolist() == [2.75, 1.75]
    assert len(st.server_free([None], 0.25)) == 0  # no engine known: nothing to place
    st.apply(ev("request.queued", 4.0, traj="t9", req="r9", turn=0, prompt_tokens=1000))
    st.apply(ev("prefill.started", 4.0, traj="t9", req="r9"))
    assert len(st.server_free(names, 0.25)) == 0  # starts are seen: the in-flight hold the servers


ENGINE = dict(instance_overhead=np.array([0.0]), instance_per_token=np.array([0.001]),
              instance_per_pair=np.array([0.0]))


def _queued_since(since: float, servers: int, server_free=(), latency: float = 0.0, **extra) -> Snapshot:
    return Snapshot(t=0.0, ready_prompt=np.array([1000.0]), ready_since=np.array([since]),
                    ready_instance=np.zeros(1, int), ready_growth=np.zeros(1),
                    instance_servers=np.array([servers]), server_free=np.asarray(server_free, dtype=float),
                    prefill_latency=latency, **ENGINE, **extra)


def _admitted(snap: Snapshot, end: float) -> float:
    return float(known_queue(snap).admitted_by(end)[1][0])


def test_a_request_queued_before_t_may_have_been_on_its_server_since():
    # Queued 0.8 s before t with 1 s of prefill and 0.3 s after it.
    # Starts unknown and servers unplaced: it starts at t, ends at 1.0, is seen at 1.3.
    plain = _queued_since(-0.8, 2, latency=0.3)
    assert _admitted(plain, 1.25) == 0.0 and _admitted(plain, 1.35) == 1.0
    # One queue freed 0.9 s before t, the other never seen to: the request took a free
    # queue when it came (-0.8), ends at 0.2, is seen at 0.5.
    placed = _queued_since(-0.8, 2, server_free=[-0.9, np.nan], latency=0.3)
    assert _admitted(placed, 0.45) == 0.0 and _admitted(placed, 0.55) == 1.0
    # One queue, freed 0.5 s before t: it waited for that, ends at 0.5, is seen at 0.8.
    waited = _queued_since(-0.8, 1, server_free=[-0.5], latency=0.3)
    assert _admitted(waited, 0.75) == 0.0 and _admitted(waited, 0.85) == 1.0
    # A weight-sync pause until 2 s holds it whatever the departures say.
    paused = _queued_since(-0.8, 1, server_free=[-0.5], latency=0.3, prefill_pause=2.0)
    assert _admitted(paused, 3.25) == 0.0 and _admitted(paused, 3.35) == 1.0
    # Free times of the wrong length (not one per server) are not used.
    wrong = _queued_since(-0.8, 2, server_free=[-0.9], latency=0.3)
    assert _admitted(wrong, 1.25) == 0.0 and _admitted(wrong, 1.35) == 1.0
