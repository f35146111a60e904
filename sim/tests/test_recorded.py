"""A workload recorded in an event log (``--workload log:PATH``, :mod:`prorsa_sim.recorded`)."""

import gzip
import json
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from prorsa_cli.main import app
from prorsa_schemas import LogWriter
from prorsa_schemas import events as E
from prorsa_sim.recorded import load_recorded
from prorsa_sim.runner import Job
from prorsa_sim.simconfig import SimConfig
from prorsa_sim.simulation import simulate
from prorsa_sim.workloads import get_workload, plan_trajectory


def _write(path, events):
    with LogWriter(path) as w:
        for ev in events:
            w.write(ev)
    return path


class _Log:
    """Hand-built rollout events of one run (ids and run filled in)."""

    def __init__(self):
        self.events, self.n = [], 0

    def __call__(self, cls, ts, **fields):
        self.n += 1
        self.events.append(cls(id=f"e{self.n}", ts=ts, run="r", **fields))


def _two_turns(log, traj, group, t0, *, admitted=True, sandbox="cold"):
    """A trajectory whose numbers are easy to check: sandbox 4 s, a turn of prompt 1,000
    answering 100 tokens, 7.5 s between turns, then 1,400 tokens of prompt (300 added),
    an abort of 20 tokens re-prefilled and 50 more, and a reward 2 s after the answer."""
    log(E.TrajectoryDispatched, t0, traj=traj, prompt_tokens=1000, group=group)
    if sandbox:
        log(E.SandboxStarted, t0, traj=traj, mode=sandbox)
        log(E.SandboxReady, t0 + 4, traj=traj)
    log(E.RequestQueued, t0 + 4, traj=traj, req=f"{traj}-1", turn=0, prompt_tokens=1000)
    log(E.PrefillFinished, t0 + 5, traj=traj, req=f"{traj}-1")
    log(E.DecodeFinished, t0 + 9, traj=traj, req=f"{traj}-1", output_tokens=100, finish="tool")
    log(E.ToolStarted, t0 + 9, traj=traj)
    log(E.ToolFinished, t0 + 16, traj=traj, result_tokens=300)
    log(E.RequestQueued, t0 + 16.5, traj=traj, req=f"{traj}-2", turn=1, prompt_tokens=1400)
    log(E.PrefillFinished, t0 + 17, traj=traj, req=f"{traj}-2")
    log(E.DecodeFinished, t0 + 18, traj=traj, req=f"{traj}-2", output_tokens=20, finish="abort")
    log(E.RequestQueued, t0 + 19, traj=traj, req=f"{traj}-3", turn=1, prompt_tokens=1420)
    log(E.PrefillFinished, t0 + 20, traj=traj, req=f"{traj}-3")
    log(E.DecodeFinished, t0 + 21, traj=traj, req=f"{traj}-3", output_tokens=50, finish="stop")
    log(E.RewardStarted, t0 + 21, traj=traj)
    log(E.RewardFinished, t0 + 23, traj=traj, admitted=admitted, reward=1.0 if admitted else 0.0)


def test_a_recorded_trajectory_becomes_its_plan(tmp_path):
    log = _Log()
    log(E.RunStarted, 0.0, mode="sync", batch_size=4, group_size=2)
    _two_turns(log, "a", "g1", 0.0)
    _two_turns(log, "b", "g1", 1.0, admitted=False, sandbox="prewarm")
    _two_turns(log, "c", "g2", 2.0, sandbox=None)
    # Left out: one dropped, one with no reward yet.
    log(E.TrajectoryDispatched, 3.0, traj="d", prompt_tokens=10, group="g2")
    log(E.TrajectoryDropped, 4.0, traj="d", reason="stale")
    log(E.TrajectoryDispatched, 3.0, traj="e", prompt_tokens=10, group="g2")
    log(E.RequestQueued, 3.0, traj="e", req="e-1", turn=0, prompt_tokens=10)
    w = load_recorded(_write(tmp_path / "r.jsonl.gz", log.events))
    assert len(w.plans) == 3 and w.group_size == 2
    assert w.skipped == {"dropped": 1, "unfinished (no reward.finished)": 1}
    assert w.run_started == {"mode": "sync", "batch_size": 4, "max_staleness": None, "group_size": 2}
    a, b, c = w.plans
    assert a.prompt_tokens == 1000
    assert a.outputs == [100, 70]  # the aborted 20 and the re-prefilled 50 are one turn
    assert a.results == [300]  # 1,400 - 1,000 - 100
    assert a.tool_s == [7.5]  # answer at 9 s, next request at 16.5 s
    assert a.reward_s == 2.0 and a.admitted and a.reward == 1.0
    assert (a.sandbox, a.cold_start_s) == ("cold", 4.0)
    assert (b.sandbox, b.prewarm_s, b.admitted) == ("prewarm", 4.0, False)
    assert c.sandbox == "none"
    assert w.groups == ((0, 1), (2,))

    spec = get_workload(f"log:{w.path}")
    assert spec.recorded is not None and spec.group_size == 2
    assert spec.admission_rate == pytest.approx(2 / 3)
    assert spec.max_context == 1000 + 170 + 300 + 1
    # Seed 0 deals the groups as recorded, a short group repeats its members, and the
    # workload cycles.
    assert [plan_trajectory(spec, 0, i).prompt_tokens for i in range(4)] == [1000] * 4
    dealt = [plan_trajectory(spec, 0, i) for i in range(6)]
    assert [p.admitted for p in dealt] == [True, False, True, True, True, False]
    assert [p.sandbox for p in dealt[:4]] == ["cold", "prewarm", "none", "none"]
    # Another seed deals whole groups in another order: a group's members stay together.
    for seed in (1, 2, 3):
        pairs = [(plan_trajectory(spec, seed, 2 * k).sandbox, plan_trajectory(spec, seed, 2 * k + 1).sandbox)
                 for k in range(2)]
        assert sorted(pairs) == [("cold", "prewarm"), ("none", "none")]


def test_a_simulator_log_replayed_as_its_workload_gives_the_same_run(tmp_path):
    """Seed 0 replays a sync run's trajectories in their recorded order, and every part of a
    plan the log records (prompts, answers, results, tool and sandbox and reward times) comes
    back exactly: the same policy gives the same run."""
    cfg = SimConfig(workload="general", model="deepseek-v3.2", staleness=0, steps=2, batch_size=32)
    path = tmp_path / "events.jsonl.gz"
    with LogWriter(path) as w:
        first = simulate(cfg, "static:6:2", sink=w).summary
    replay = simulate(replace(cfg, workload=f"log:{path}"), "static:6:2").summary
    for key in ("rollout_time_s", "step_times_s", "prefill_tokens", "decode_tokens", "cached_tokens",
                "mean_trajectory_s"):
        assert replay[key] == first[key], key
    # Another seed deals the same trajectories to the steps in another order.
    other = simulate(replace(cfg, workload=f"log:{path}", seed=1), "static:6:2").summary
    assert other["decode_tokens"] == first["decode_tokens"]
    assert other["step_times_s"] != first["step_times_s"]


def test_the_cache_key_names_the_recorded_plans(tmp_path):
    log = _Log()
    _two_turns(log, "a", "g1", 0.0)
    path = _write(tmp_path / "r.jsonl", log.events)
    cfg = SimConfig(workload=f"log:{path}", steps=1, batch_size=8)
    key = Job(cfg, "static:6:2").key()
    assert key.startswith(f"log-r.jsonl@{load_recorded(path).digest}_")
    log2 = _Log()
    _two_turns(log2, "a", "g1", 0.0, admitted=True, sandbox="prewarm")
    _write(tmp_path / "r.jsonl", log2.events)  # the same path, another workload
    assert Job(cfg, "static:6:2").key() != key


def test_bad_recorded_logs_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="workload log not found"):
        get_workload(f"log:{tmp_path / 'missing.jsonl.gz'}")
    (tmp_path / "junk.jsonl").write_text("not json\n{}\n")
    with pytest.raises(ValueError, match=r"no valid event in it \(2 invalid lines\)"):
        load_recorded(tmp_path / "junk.jsonl")
    log = _Log()
    log(E.TrajectoryDispatched, 0.0, traj="d", prompt_tokens=10)
    log(E.TrajectoryDropped, 1.0, traj="d", reason="error")
    with pytest.raises(ValueError, match="no complete trajectory .*: 1 dropped"):
        load_recorded(_write(tmp_path / "dropped.jsonl", log.events))
    log = _Log()
    _two_turns(log, "a", "g1", 0.0, admitted=False)
    with pytest.raises(ValueError, match="none of its 1 complete trajectories was admitted"):
        load_recorded(_write(tmp_path / "rejected.jsonl", log.events))
    # An event the lifecycle refuses (a second trajectory.dispatched) is counted, and the
    # trajectory is judged on the rest.
    log = _Log()
    _two_turns(log, "a", "g1", 0.0)
    log(E.TrajectoryDispatched, 30.0, traj="a", prompt_tokens=10, group="g1")
    w = load_recorded(_write(tmp_path / "refused.jsonl", log.events))
    assert len(w.plans) == 1 and w.skipped == {"events the lifecycle refused": 1}
    # A log cut short keeps what it holds before the cut, and says how many lines it lost.
    log = _Log()
    _two_turns(log, "a", "g1", 0.0)
    _two_turns(log, "b", "g1", 0.0)
    whole = _write(tmp_path / "whole.jsonl.gz", log.events).read_bytes()
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(whole[: len(whole) - 20])
    w = load_recorded(cut)
    assert len(w.plans) >= 1 and w.skipped.get("invalid lines") == 1


def test_the_cli_runs_a_recorded_workload_and_names_a_missing_log(tmp_path):
    log = _Log()
    log(E.RunStarted, 0.0, mode="sync", batch_size=8, group_size=1)
    for i in range(8):
        _two_turns(log, f"t{i}", None, float(i))
    path = _write(tmp_path / "r.jsonl.gz", log.events)
    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["sim", "run", "--workload", f"log:{path}", "--staleness", "0", "--policy",
                                 "static:6:2", "--steps", "2", "--batch-size", "8", "--no-plot", "--out", str(out)])
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["workload"] == f"log:{path}"
    rec = summary["recorded_workload"]
    assert rec["name"].startswith("log:r.jsonl.gz@") and (rec["trajectories"], rec["group_size"]) == (8, 1)
    assert rec["run_started"]["batch_size"] == 8 and rec["skipped"] == {}
    # 16 trajectories of 2 turns: 8 recorded, dealt twice.
    with gzip.open(out / "events.jsonl.gz", "rt") as fh:
        queued = [json.loads(x) for x in fh if '"request.queued"' in x]
    assert sorted({q["prompt_tokens"] for q in queued}) == [1000, 1400] and len(queued) == 32
    bad = CliRunner().invoke(app, ["sim", "run", "--workload", f"log:{tmp_path / 'nope.jsonl'}", "--out",
                                   str(tmp_path / "x")])
    assert bad.exit_code == 2 and "workload log not found" in bad.output


def test_a_trace_without_rewards_ends_each_trajectory_with_its_last_answer(tmp_path):
    """A serving or chat trace (``scripts/trace_to_contract.py --sessions``) has no reward:
    a conversation ends with its last answer, and the user's last wait, which never
    returned, is not part of it."""
    log = _Log()
    log(E.TrajectoryDispatched, 0.0, traj="c", prompt_tokens=500)
    log(E.RequestQueued, 0.0, traj="c", req="c-1", turn=0, prompt_tokens=500)
    log(E.PrefillFinished, 1.0, traj="c", req="c-1")
    log(E.DecodeFinished, 2.0, traj="c", req="c-1", output_tokens=40, finish="tool")
    log(E.ToolStarted, 2.0, traj="c")
    log(E.ToolFinished, 100.0, traj="c", result_tokens=60)
    log(E.RequestQueued, 100.0, traj="c", req="c-2", turn=1, prompt_tokens=600)
    log(E.PrefillFinished, 101.0, traj="c", req="c-2")
    log(E.DecodeFinished, 103.0, traj="c", req="c-2", output_tokens=30, finish="tool")
    log(E.ToolStarted, 103.0, traj="c")
    log(E.TrajectoryDispatched, 1.0, traj="d", prompt_tokens=50)
    log(E.RequestQueued, 1.0, traj="d", req="d-1", turn=0, prompt_tokens=50)  # never answered
    w = load_recorded(_write(tmp_path / "chat.jsonl", log.events))
    (p,) = w.plans
    assert (p.outputs, p.results, p.tool_s, p.reward_s, p.admitted) == ([40, 30], [60], [98.0], 0.0, True)
    assert w.skipped == {"a turn without an answer": 1}


def test_events_out_of_order_and_runs_apart(tmp_path):
    """A log written in arrival order (a live run's) may hold a trajectory's events out of
    event-time order: they are taken by ``ts``. Two runs' groups of one name stay apart."""
    log = _Log()
    _two_turns(log, "a", "g1", 0.0)
    _two_turns(log, "b", "g1", 1.0)
    in_order = load_recorded(_write(tmp_path / "sorted.jsonl", log.events))
    # Written latest time first; events of one time stay in the order they were emitted
    # (the order a tie is read in).
    by_ts: dict[float, list] = {}
    for ev in log.events:
        by_ts.setdefault(ev.ts, []).append(ev)
    reversed_log = [ev for ts in sorted(by_ts, reverse=True) for ev in by_ts[ts]]
    shuffled = load_recorded(_write(tmp_path / "reversed.jsonl", reversed_log))
    assert shuffled.plans == in_order.plans and shuffled.groups == in_order.groups == ((0, 1),)
    other = [ev.model_copy(update={"id": f"o{ev.id}", "run": "other"}) for ev in log.events]
    both = load_recorded(_write(tmp_path / "two-runs.jsonl", log.events + other))
    # By first event: r.a, other.a (both at 0 s), r.b, other.b (1 s); each run its own group.
    assert both.groups == ((0, 2), (1, 3))
