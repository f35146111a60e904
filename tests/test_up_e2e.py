"""`prorsa up --emulated-cluster` end to end over real processes: a nats-server, the tracker,
forecaster, allocator, two engine agents with emulated engines, the router and the driver.

Each run is small (6 emulated DeepSeek-V3.2 engines of 16 DP ranks, 16 trajectories x 2
steps at x10 speed) to stay near a minute or two on two cores.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prorsa_runtime.testing import wait_until

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]

UP = [sys.executable, "-m", "prorsa_cli.main", "up", "--emulated-cluster", "--port-base", "0",
      "--engines", "6", "--prefill", "1", "--batch-size", "16", "--steps", "2", "--max-turns", "5",
      "--horizon", "3", "--run", "e2e"]


# The test checks the switch plumbing, so it declares a prefill throughput (θᴾ) far below
# the emulated engines' (their profile's ~80k tokens/s x speed): the allocator then wants
# more prefill engines for the first turns' burst and switches. The demo uses the profile's.
# The run is shorter than the served-rate evidence the allocator waits for before a move
# on the forecast alone (docs/allocator.md), so that rule is off here: the test is about
# the switching path end to end, not about when the allocator may start using it.
ENV = {**os.environ, "PRORSA_ALLOCATOR_PREFILL_TOKENS_PER_S": "5000", "PRORSA_ALLOCATOR_SERVED_EVIDENCE_FIRST": "false"}


def _start(workdir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(UP + ["--workdir", str(workdir), *extra], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=ENV)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
        pytest.fail("prorsa up did not finish in time:\n" + out[-4000:])
    return out


def _check_run(workdir: Path, out: str) -> dict:
    summary = json.loads((workdir / "summary.json").read_text())
    driver = json.loads((workdir / "driver.json").read_text())
    # Every event the driver published is in the tracker's log, and nothing is anomalous.
    assert driver["completed"] == 32
    assert summary["tracker_events"] == driver["events"] == summary["run_events_in_log"], out[-3000:]
    assert summary["anomalies"] == 0
    # The emulated engines (the demo's multi-DP profile) answered for their own stepping.
    assert summary["emulated_model"] == "deepseek-v3.2"
    assert summary["emulated_engines"]["engines_answered"] == 6 and summary["emulated_engines"]["steps"] > 0
    assert summary["trajectory_mean_s"] > 0
    # Forecasts every window: consecutive window starts from the first to the last.
    import sqlite3

    db = sqlite3.connect(workdir / "tracker.db")
    raws = [json.loads(r) for (r,) in db.execute("select raw from events order by pos")]
    starts = sorted({e["t"] for e in raws if e["type"] == "forecast.window"})
    assert len(starts) >= 5
    assert all(abs((b - a) - 3.0) < 1e-6 for a, b in zip(starts, starts[1:])), starts
    # At least one switch was commanded, executed and recorded.
    cmds = {e["cmd"] for e in raws if e["type"] == "engine.command"}
    done = {e["cmd"] for e in raws if e["type"] == "engine.switched"}
    assert cmds and done and done <= cmds, (cmds, done)
    assert summary["switches"] == len({e["id"] for e in raws if e["type"] == "engine.switched"})
    assert Path(summary["timeline_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The run exported from the durable log re-validates against the contract.
    log = workdir / "export.jsonl.gz"
    cli = [sys.executable, "-m", "prorsa_cli.main"]
    exp = subprocess.run(cli + ["export", "--run", "e2e", "--db", summary["durable_log"], "-o", str(log)],
                         capture_output=True, text=True, timeout=120)
    assert exp.returncode == 0, exp.stderr
    val = subprocess.run(cli + ["validate", str(log), "--json"], capture_output=True, text=True, timeout=120)
    assert val.returncode == 0, val.stdout + val.stderr
    report = json.loads(val.stdout)
    assert report["invalid"] == 0
    rollout = sum(1 for line in gzip.open(log, "rt") if json.loads(line)["type"] in driver["by_type"])
    assert rollout == driver["events"]
    # The export carries the engine events its switches need (the agents register under
    # their own run id): loading it into a fresh database records no anomaly.
    load = subprocess.run(cli + ["tracker", "load", str(log), "--db", f"sqlite:///{workdir / 'reloaded.db'}"],
                          capture_output=True, text=True, timeout=120)
    assert load.returncode == 0 and " 0 anomalies" in load.stderr, load.stdout + load.stderr
    return summary


def test_up_runs_a_workload_to_completion(tmp_path: Path):
    proc = _start(tmp_path)
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    summary = _check_run(tmp_path, out)
    # The sync run's one policy update reached every engine before the second batch: all
    # six paused, flushed and resumed on version 1.
    driver = json.loads((tmp_path / "driver.json").read_text())
    assert driver["weight_syncs"] == 1 and driver["paused_engines"] == 6
    assert summary["weight_syncs"] == {"syncs": 1, "engine_pauses": 6, "pause_mode": "abort"}
    assert "weight syncs / engines paused" in out and "1 / 6 (6 engines each; pause mode" in out, out[-3000:]
    assert "prorsa export --run e2e" in out and "forecast WAPE" in out
    # Clean shutdown: every supervised process is gone.
    state = json.loads((tmp_path / "up-state.json").read_text())
    assert not any(p["running"] for p in state["processes"].values())


def _mid_run(workdir: Path) -> bool:
    try:
        return json.loads((workdir / "progress.json").read_text())["completed"] >= 4
    except (OSError, ValueError, KeyError):
        return False


def test_up_runs_under_the_shipped_nats_config_with_a_user_per_service(tmp_path: Path):
    # deploy/nats/server.conf: a user per service with only what it needs, the stream set up
    # by the admin step, the rollout driver publishing as "rollout" through the SDK.
    proc = _start(tmp_path, "--nats-config", str(ROOT / "deploy" / "nats" / "server.conf"))
    wait_until(lambda: _mid_run(tmp_path), timeout=180, interval=0.1, what="the run to be under way")
    # While it runs, every process is logged in as its own user (the monitoring endpoint,
    # which listens on loopback only).
    nats_log = tmp_path / "logs" / "nats-server.log"
    monitor = re.search(r"Starting http monitor on 127\.0\.0\.1:(\d+)", nats_log.read_text())
    assert monitor, nats_log.read_text()[-2000:]
    expected = {"prorsa-tracker": "tracker", "prorsa-tracker-receiver": "tracker", "prorsa-forecaster": "forecaster",
                "prorsa-allocator": "allocator", "prorsa-allocator-pub": "allocator",
                "engine-agent-node0": "engine-agent", "engine-agent-node0-cmd": "engine-agent",
                "engine-agent-node1-cmd": "engine-agent", "prorsa-driver": "rollout"}

    def logins() -> dict[str, str]:
        conns = httpx.get(f"http://127.0.0.1:{monitor.group(1)}/connz?auth=true&limit=1024", timeout=5).json()
        return {c.get("name"): c.get("authorized_user") for c in conns.get("connections") or []}

    wait_until(lambda: expected.items() <= logins().items(), timeout=60, interval=0.2,
               what=f"every process logged in as its own user ({logins()})")
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    assert "created stream PRORSA" in out
    _check_run(tmp_path, out)
    # No process was refused anything it does: the server logs every permissions violation.
    assert "Violation" not in nats_log.read_text(), [l for l in nats_log.read_text().splitlines() if "Violation" in l]
    assert (tmp_path / "nats-passwords.env").stat().st_mode & 0o777 == 0o600


def test_up_runs_an_asynchronous_rollout_and_the_tracker_follows_it(tmp_path: Path):
    # --staleness 1: the driver over-dispatches, trains alongside rollout, drops what is too
    # old and pauses every engine for each weight sync (requests in flight are aborted and
    # re-sent). The tracker's lifecycle rules accept all of it: no anomaly, every event stored.
    proc = _start(tmp_path, "--staleness", "1", "--steps", "3")
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    driver = json.loads((tmp_path / "driver.json").read_text())
    assert summary["tracker_events"] == driver["events"] == summary["run_events_in_log"], out[-3000:]
    assert summary["anomalies"] == 0
    assert summary["sampler"] == {"mode": "async", "staleness": 1}
    assert driver["weight_syncs"] == 3 and driver["paused_engines"] == 3 * 6
    assert summary["weight_syncs"] == {"syncs": 3, "engine_pauses": 3 * 6, "pause_mode": "abort"}
    assert "weight syncs / engines paused" in out and "3 / 18 (6 engines each; pause mode" in out, out[-3000:]
    assert len(summary["rollout_step_times_s"]) == 3
    import sqlite3

    db = sqlite3.connect(tmp_path / "tracker.db")
    raws = [json.loads(r) for (r,) in db.execute("select raw from events order by pos")]
    run = [e for e in raws if e.get("run") == "e2e"]
    assert [e["version"] for e in run if e["type"] == "policy.updated"] == [1, 2, 3]
    started = next(e for e in run if e["type"] == "run.started")
    assert started["mode"] == "async" and started["max_staleness"] == 1
    ends = {e["traj"] for e in run if e["type"] in ("reward.finished", "trajectory.dropped")}
    assert ends == {e["traj"] for e in run if e["type"] == "trajectory.dispatched"}
    assert "sampler" in out and "async, staleness 1" in out


def test_up_in_advisory_mode_plans_switches_and_makes_none(tmp_path: Path):
    # --policy advise: the same stack and the same low θᴾ that makes the allocator switch in
    # the runs above, with the allocator in advisory mode. Its plans ask for switches; no
    # engine.command goes out, so no engine changes role, and the summary says so.
    proc = _start(tmp_path, "--policy", "advise")
    out = _finish(proc)
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["policy"] == "advise" and summary["anomalies"] == 0
    import sqlite3

    db = sqlite3.connect(tmp_path / "tracker.db")
    raws = [json.loads(r) for (r,) in db.execute("select raw from events order by pos")]
    plans = [e for e in raws if e["type"] == "allocation.plan"]
    advised = [s for e in plans for s in e.get("switches") or []]
    assert advised, "the allocator planned no switch: the test's θᴾ no longer makes it want one"
    assert not [e for e in raws if e["type"] in ("engine.command", "engine.switching", "engine.switched")]
    assert summary["commands"] == summary["switches"] == 0
    # The summary reads the log when the rollout ends; plans go on until the stack stops.
    assert 0 < summary["planned_switches"] <= len(advised) and 0 < summary["plans"] <= len(plans)
    assert "switches advised" in out, out[-3000:]
    log = (tmp_path / "logs" / "allocator.log").read_text()
    assert "advisory mode (actuate=false)" in log and "advice (not commanded) t=" in log
