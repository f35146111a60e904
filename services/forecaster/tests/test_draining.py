"""An engine switching away from prefill drains: from its ``engine.switching`` on it
takes no new request, so the queue model serves the window's arrivals (and the requests
whose engine the log does not name) on the prefill engines that stay."""

from prorsa_forecaster.config import ForecastConfig
from prorsa_forecaster.state import LiveState
from prorsa_schemas import event_from_dict

PAR = {"tp": 1, "dp": 2, "ep": 2, "attn_dp": 2}


def _state() -> tuple[LiveState, callable]:
    ids = iter(range(1, 10**9))

    def ev(kind, ts, **f):
        return event_from_dict({"v": 1, "id": f"e{next(ids)}", "type": kind, "ts": ts, "run": "r", **f})

    st = LiveState(ForecastConfig())
    for name, role in (("p0", "prefill"), ("p1", "prefill"), ("d0", "decode")):
        st.apply(ev("engine.registered", 0.0, engine=name, server="s0", role=role, gpus=8,
                    kv_capacity_tokens=10**6, parallel=PAR))
    return st, ev


def test_a_draining_prefill_engine_leaves_the_queue_model_at_once():
    st, ev = _state()
    assert st.prefill_instances() == ["p0", "p1"]
    assert st.snapshot(1.0).instance_servers.tolist() == [2, 2]
    st.apply(ev("engine.switching", 2.0, engine="p1", cmd="c1", from_role="prefill", to_role="decode"))
    assert st.prefill_instances() == ["p0"]
    assert st.snapshot(3.0).instance_servers.tolist() == [2]
    # A decode engine on its way to prefill is not a prefill queue until it has switched.
    st.apply(ev("engine.switching", 3.0, engine="d0", cmd="c2", from_role="decode", to_role="prefill"))
    assert st.prefill_instances() == ["p0"]
    st.apply(ev("engine.switched", 5.0, engine="d0", cmd="c2", from_role="decode", to_role="prefill", seconds=2.0))
    assert st.prefill_instances() == ["d0", "p0"]
    st.apply(ev("engine.switched", 6.0, engine="p1", cmd="c1", from_role="prefill", to_role="decode", seconds=4.0))
    assert st.prefill_instances() == ["d0", "p0"]


def test_when_every_prefill_engine_drains_they_all_stay():
    st, ev = _state()
    for name in ("p0", "p1"):
        st.apply(ev("engine.switching", 2.0, engine=name, cmd=f"c-{name}", from_role="prefill", to_role="decode"))
    assert st.prefill_instances() == ["p0", "p1"]
    # A switch that failed leaves the engine where it was, taking requests again.
    st.apply(ev("engine.switch_failed", 3.0, engine="p0", cmd="c-p0", role="prefill", error="drain timed out"))
    assert st.prefill_instances() == ["p0"]
