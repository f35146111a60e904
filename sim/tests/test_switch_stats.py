"""No flapping: switches per measured step and flip-backs (``prorsa_sim.summary.switch_stats``)
on hand-built switch logs, and the summary keys of a run."""

from dataclasses import replace

from prorsa_sim.policies.schedule import SchedulePolicy
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulator import Simulator
from prorsa_sim.summary import switch_stats


def sw(engine, frm, to, requested_t, drain_s, switch_s):
    """A switch_log record as the simulator writes it: back in service at requested + drain + switch."""
    return {"engine": engine, "from": frm, "to": to, "requested_t": requested_t, "drain_s": drain_s,
            "switch_s": switch_s, "t": requested_t + drain_s + switch_s, "mode": "in_place"}


def test_a_switch_back_within_the_previous_switch_time_is_a_flip_back():
    log = [
        # e0: 25 s to prefill (10 drain + 15 switch), in service at 125; back requested at 140:
        # served 15 s < 25 s -> a flip-back.
        sw("e0", "decode", "prefill", 100.0, 10.0, 15.0),
        sw("e0", "prefill", "decode", 140.0, 2.0, 15.0),
        # e1: 17 s to decode, in service at 217; back requested at 234: served 17 s, not < 17 s.
        sw("e1", "prefill", "decode", 200.0, 2.0, 15.0),
        sw("e1", "decode", "prefill", 234.0, 10.0, 15.0),
    ]
    st = switch_stats(log, since_t=None, measured_steps=2)
    assert st["switches_measured"] == 4 and st["switches_per_step"] == 2.0
    assert st["flip_backs"] == st["flip_backs_run"] == 1
    (f,) = st["flip_back_log"]
    assert f["engine"] == "e0" and (f["from"], f["to"]) == ("decode", "prefill")
    assert f["back_in_service_t"] == 125.0 and f["switch_back_requested_t"] == 140.0
    assert f["served_s"] == 15.0 and f["switch_time_s"] == 25.0 and f["measured"]


def test_the_threshold_is_the_engines_own_previous_switch_time():
    # Served 30 s in both cases; a 45 s switch (30 drain) makes it a flip-back, a 15 s one not.
    slow = [sw("e0", "decode", "prefill", 0.0, 30.0, 15.0), sw("e0", "prefill", "decode", 75.0, 0.0, 15.0)]
    fast = [sw("e0", "decode", "prefill", 0.0, 0.0, 15.0), sw("e0", "prefill", "decode", 45.0, 0.0, 15.0)]
    assert switch_stats(slow, None, 1)["flip_backs"] == 1
    assert switch_stats(fast, None, 1)["flip_backs"] == 0


def test_other_engines_in_between_and_order_of_the_log_do_not_matter():
    log = [
        sw("e1", "decode", "prefill", 10.0, 10.0, 15.0),   # in service at 35
        sw("e0", "decode", "prefill", 12.0, 10.0, 15.0),   # in service at 37
        sw("e2", "prefill", "decode", 20.0, 1.0, 15.0),
        sw("e0", "prefill", "decode", 50.0, 1.0, 15.0),    # e0 served 13 s < 25 s: flip-back
        sw("e1", "prefill", "decode", 90.0, 1.0, 15.0),    # e1 served 55 s: no
    ]
    st = switch_stats(list(reversed(log)), None, 1)
    assert st["flip_backs"] == 1 and st["flip_back_log"][0]["engine"] == "e0"
    # Only an engine's *previous* switch counts: e0 -> prefill -> decode -> prefill, each quickly.
    three = [sw("e0", "decode", "prefill", 0.0, 0.0, 15.0), sw("e0", "prefill", "decode", 20.0, 0.0, 15.0),
             sw("e0", "decode", "prefill", 40.0, 0.0, 15.0)]
    assert switch_stats(three, None, 1)["flip_backs"] == 2


def test_warmup_switches_are_not_measured():
    log = [
        sw("e0", "decode", "prefill", 100.0, 10.0, 15.0),  # warm-up (before 300)
        sw("e0", "prefill", "decode", 130.0, 2.0, 15.0),   # warm-up flip-back (served 5 s)
        sw("e1", "decode", "prefill", 310.0, 10.0, 15.0),
        sw("e1", "prefill", "decode", 340.0, 2.0, 15.0),   # measured flip-back (served 5 s)
        sw("e2", "decode", "prefill", 400.0, 10.0, 15.0),
    ]
    st = switch_stats(log, since_t=300.0, measured_steps=2)
    assert st["switches_measured"] == 3 and st["switches_per_step"] == 1.5
    assert st["flip_backs"] == 1 and st["flip_backs_run"] == 2
    assert [f["measured"] for f in st["flip_back_log"]] == [False, True]
    # A single-step run (no warm-up apart) is measured over that step.
    assert switch_stats(log, None, 0)["switches_per_step"] == 5.0
    empty = switch_stats([], 300.0, 5)
    assert empty == {"switches_measured": 0, "switches_per_step": 0.0, "flip_backs": 0, "flip_backs_run": 0,
                     "flip_back_log": []}


SMALL = SimConfig(workload="general", model="qwen3-235b", staleness=2, steps=3, batch_size=16, total_gpus=32)


def test_the_summary_carries_them_from_its_own_switch_log():
    # 4 engines; a schedule that flips one engine every 10 s window: it is back in service
    # after >= 15 s, so some flips are requested before it served as long as it took.
    sched = [2, 3, 2, 3, 2, 3, 2, 1, 2, 1, 2] * 40
    s = Simulator(SMALL, SchedulePolicy(sched, grid_s=10.0)).run().summary
    assert s["switches"] == len(s["switch_log"]) > 0
    st = switch_stats(s["switch_log"], None, 0)
    assert s["flip_backs_run"] == st["flip_backs_run"] > 0
    assert s["flip_backs"] <= s["flip_backs_run"]
    assert s["switches_measured"] <= s["switches"]
    assert s["switches_per_step"] == round(s["switches_measured"] / s["measured_steps"], 3)
    # A fixed ratio never switches.
    s0 = Simulator(replace(SMALL, steps=2), SchedulePolicy([2], grid_s=10.0)).run().summary
    assert s0["switches_measured"] == s0["flip_backs"] == s0["flip_backs_run"] == 0
