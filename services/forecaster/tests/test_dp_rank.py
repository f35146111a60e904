"""Queued and in-flight requests on the attention-DP rank the router named.

``request.queued.dp_rank`` (an optional field added to the contract) says which of an
engine's data-parallel ranks the request waits on. Without it the queue model deals an
engine's requests over its ranks in arrival order, which on a saturated engine puts the
wrong requests at the heads of the ranks' queues. Hand-computed cases on one engine of
two ranks at 1 ms per prompt token."""

import numpy as np
import pytest

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.core import forecast
from prorsa_forecaster.history import History
from prorsa_forecaster.snapshot import Snapshot
from prorsa_forecaster.state import LiveState
from prorsa_schemas import event_from_dict

CFG = ForecastConfig(horizon=10.0, steps=10, bias_half_life=0)
ENGINE = dict(instance_overhead=np.array([0.0]), instance_per_token=np.array([0.001]),
              instance_per_pair=np.array([0.0]), instance_servers=np.array([2]))


def quiet() -> History:
    h = History(CFG)
    h.decode_tool, h.decode_done = 0.0, 1.0  # no next turns
    return h


def queued(ranks, prompts=(6000.0, 6000.0), **extra):
    n = len(prompts)
    return Snapshot(t=0.0, ready_prompt=np.asarray(prompts), ready_since=-0.1 * np.arange(n, 0, -1),
                    ready_instance=np.zeros(n, int), ready_growth=np.zeros(n), ready_rank=np.asarray(ranks, int),
                    **ENGINE, **extra)


def test_two_requests_named_on_one_rank_wait_for_each_other():
    # Dealt over the two ranks both finish at 6 s; both on rank 1, the second at 12 s.
    assert forecast(queued([], ), quiet(), CFG).decode_admit_tokens == pytest.approx(12000)
    assert forecast(queued([1, 1]), quiet(), CFG).decode_admit_tokens == pytest.approx(6000)
    assert forecast(queued([0, 1]), quiet(), CFG).decode_admit_tokens == pytest.approx(12000)
    # A rank the engine does not have, or none said (-1): dealt as before.
    assert forecast(queued([1, 7]), quiet(), CFG).decode_admit_tokens == pytest.approx(12000)
    off = ForecastConfig(horizon=10.0, steps=10, bias_half_life=0, use_dp_rank=False)
    assert off.use_dp_rank is False


def test_a_request_named_on_a_busy_rank_waits_for_its_holder():
    # Rank 1 is busy until 8 s with a prefill that started 1 s before t (9000 tokens);
    # a queued 3000-token request on rank 1 ends at 11 s, on rank 0 at 3 s.
    busy = dict(inflight_prompt=np.array([9000.0]), inflight_started=np.array([-1.0]),
                inflight_instance=np.array([0]), inflight_since=np.array([-2.0]),
                inflight_growth=np.zeros(1), inflight_rank=np.array([1]))
    on_busy = forecast(queued([1], prompts=(3000.0,), **busy), quiet(), CFG)
    on_free = forecast(queued([0], prompts=(3000.0,), **busy), quiet(), CFG)
    assert on_busy.decode_admit_tokens == pytest.approx(9000)  # only the holder, at 8 s
    assert on_free.decode_admit_tokens == pytest.approx(12000)


def test_the_fold_carries_each_requests_rank_and_the_switch_turns_it_off():
    def ev(n, kind, ts, **f):
        return event_from_dict({"v": 1, "id": f"e{n}", "type": kind, "ts": ts, "run": "r", **f})

    for use, want in ((True, [2, -1]), (False, [])):
        st = LiveState(ForecastConfig(use_dp_rank=use))
        st.apply(ev(1, "request.queued", 1.0, traj="a", req="a0", turn=0, prompt_tokens=10, engine="p0", dp_rank=2))
        st.apply(ev(2, "request.queued", 2.0, traj="b", req="b0", turn=0, prompt_tokens=10, engine="p0"))
        assert st.snapshot(3.0).ready_rank.tolist() == want


def _events():
    """A factory of events of run ``r`` with fresh ids: ``ev(type, ts, **fields)``."""
    ids = iter(range(1, 10**9))

    def ev(kind, ts, **f):
        return event_from_dict({"v": 1, "id": f"e{next(ids)}", "type": kind, "ts": ts, "run": "r", **f})

    return ev


def _back_to_back(use_rank: bool, n: int = 300) -> float:
    """Requests of 1000 new tokens on rank 0 of engine p0, each holding the rank for 2 s;
    chunked prefill starts each one 0.5 s before the previous one finishes (its head
    rides in the last chunk of the one ahead). Returns the learnt g(1000 tokens)."""
    st = LiveState(ForecastConfig(use_dp_rank=use_rank))
    ev = _events()

    st.apply(ev("engine.registered", 0.0, engine="p0", server="s0", role="prefill", gpus=8, kv_capacity_tokens=10**6,
                parallel={"tp": 1, "dp": 2, "ep": 2, "attn_dp": 2}))
    for j in range(n):
        traj, req = f"t{j}", f"r{j}"
        st.apply(ev("request.queued", max(2.0 * j - 1.0, 0.0), traj=traj, req=req, turn=0, prompt_tokens=1000, engine="p0", dp_rank=0))
    events = []
    for j in range(n):
        traj, req = f"t{j}", f"r{j}"
        events.append((2.0 * j + 1.5, 0, ev("prefill.started", 2.0 * j + 1.5, traj=traj, req=req, engine="p0")))
        events.append((2.0 * j + 4.0, 1, ev("prefill.finished", 2.0 * j + 4.0, traj=traj, req=req, engine="p0", cached_tokens=0)))
    for _, _, e in sorted(events, key=lambda t: (t[0], t[1])):
        st.apply(e)
    a, b, d = st.history.prefill_model("p0").coefficients3()
    return a + b * 1000 + d * 1000 * 500


def test_with_the_rank_a_prefill_holds_its_queue_from_the_previous_departure():
    # prefill.started -> finished is 2.5 s, but the rank spent 2 s on each request.
    assert _back_to_back(True) == pytest.approx(2.0, rel=0.02)
    assert _back_to_back(False) == pytest.approx(2.5, rel=0.02)


def _unnamed_pool(n: int = 200, switch_at: int | None = None) -> tuple[float, LiveState]:
    """Requests of 1000 new tokens whose engine the log does not name (a router in front
    of the engines, as the demo's driver sees it), all queued at 0 s; two prefill engines
    of 2 attention-DP ranks each (4 queues), each request holding a queue for 2 s, so
    one departs every 0.5 s from 2 s on. With ``switch_at``, a decode engine of 2 ranks
    becomes a prefill engine after that many departures (6 queues; 2 s / 6 apart from
    then on). Returns the pool's learnt g(1000 tokens)."""
    st = LiveState(ForecastConfig())
    ev = _events()

    par = {"tp": 1, "dp": 2, "ep": 2, "attn_dp": 2}
    for name, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")):
        st.apply(ev("engine.registered", 0.0, engine=name, server="s0", role=role, gpus=8, kv_capacity_tokens=10**6, parallel=par))
    for j in range(n):
        st.apply(ev("request.queued", 0.0, traj=f"t{j}", req=f"r{j}", turn=0, prompt_tokens=1000))
    ts, gap = 2.0, 0.5
    for j in range(n):
        if j == switch_at:
            st.apply(ev("engine.switched", ts, engine="d0", cmd="c", from_role="decode", to_role="prefill", seconds=1.0))
            gap = 2.0 / 6
        st.apply(ev("prefill.finished", ts, traj=f"t{j}", req=f"r{j}", cached_tokens=0))
        ts += gap
    a, b, d = st.history.prefill_model(None).coefficients3()
    return a + b * 1000 + d * 1000 * 500, st


def test_requests_on_no_named_engine_are_served_by_every_prefill_queue():
    # The pool is the 4 queues of the two prefill engines: each request held one for the
    # time since the 4th departure before its own, 2 s (one queue would make it 0.5 s, and
    # the queue model would then run 4 queues of each engine 4 times too fast).
    g, st = _unnamed_pool()
    assert st.servers(None) == 4
    assert g == pytest.approx(2.0, rel=0.02)
    # A third prefill engine joins: 6 queues, a departure every 1/3 s, still 2 s each.
    g, st = _unnamed_pool(n=400, switch_at=100)
    assert st.servers(None) == 6
    assert g == pytest.approx(2.0, rel=0.03)
    # No engine known at all: one queue, as before.
    assert LiveState(ForecastConfig()).servers(None) == 1


def test_a_request_in_flight_behind_another_on_its_rank_is_timed_from_that_departure():
    # Rank 0 of p0: r0 finishes at 4.0 s; r1 started at 3.5 s in r0's last chunk. At 5 s
    # r1 has held the rank for 1 s (the service times are learnt so), not 1.5 s; on
    # rank 1, which r0 never used, its start stands.
    states = []
    for rank, use, want in ((0, True, 4.0), (1, True, 3.5), (0, False, 3.5)):
        st = LiveState(ForecastConfig(use_dp_rank=use))
        states.append(st)
        ev = _events()
        st.apply(ev("engine.registered", 0.0, engine="p0", server="s0", role="prefill", gpus=8,
                    kv_capacity_tokens=10**6, parallel={"tp": 1, "dp": 2, "ep": 2, "attn_dp": 2}))
        st.apply(ev("request.queued", 1.0, traj="a", req="r0", turn=0, prompt_tokens=1000, engine="p0", dp_rank=0))
        st.apply(ev("prefill.started", 1.0, traj="a", req="r0", engine="p0"))
        st.apply(ev("request.queued", 3.0, traj="b", req="r1", turn=0, prompt_tokens=1000, engine="p0", dp_rank=rank))
        st.apply(ev("prefill.started", 3.5, traj="b", req="r1", engine="p0"))
        st.apply(ev("prefill.finished", 4.0, traj="a", req="r0", engine="p0", cached_tokens=0))
        assert st.snapshot(5.0).inflight_started.tolist() == [want]
    # A re-registered engine starts afresh: no departure before it counts (the first
    # case's state, which holds r0's departure from rank 0 at 4.0 s).
    st = states[0]
    assert st._rank_departures.get(0, 0) == 4.0
    st.apply(_events()("engine.registered", 4.5, engine="p0", server="s0", role="prefill", gpus=8,
                       kv_capacity_tokens=10**6, parallel={"tp": 1, "dp": 2, "ep": 2, "attn_dp": 2}))
    assert st._rank_departures.get(0, 0) == -np.inf
