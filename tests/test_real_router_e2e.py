"""The real router in the loop: `prorsa up --emulated-cluster --router sglang` runs
sglang-router 0.3.2 (the PyPI wheel's Rust binary) in PD mode in front of emulated SGLang
engines. The engine agents add and remove their engines through its ``/workers`` API, the
driver sends every request through it, the router pairs a prefill and a decode engine per
request (bootstrap host, port and room), and the allocator's switches run in place while
requests are in flight. Every trajectory completes (aborted requests are re-queued by the
driver) and the tracker stores every event the driver published.

About a minute and a half on two cores (6 emulated engines, 16 trajectories x 2 steps at x10).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from prorsa_runtime.testing import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

UP = [sys.executable, "-m", "prorsa_cli.main", "up", "--emulated-cluster", "--router", "sglang",
      "--port-base", "0", "--engines", "6", "--prefill", "1", "--batch-size", "16", "--steps", "2",
      "--max-turns", "5", "--horizon", "3", "--run", "real-router"]
# A declared prefill throughput far below the emulated engines' makes the allocator want more
# prefill engines during the first turns' burst: it switches while requests are in flight.
# The run is shorter than the served-rate evidence the allocator waits for before a move
# on the forecast alone (docs/allocator.md), so that rule is off here: the test is about
# the switching path end to end, not about when the allocator may start using it.
ENV = {**os.environ, "PRORSA_ALLOCATOR_PREFILL_TOKENS_PER_S": "5000", "PRORSA_ALLOCATOR_SERVED_EVIDENCE_FIRST": "false"}


def _progress(workdir: Path) -> dict:
    try:
        return json.loads((workdir / "progress.json").read_text())
    except (OSError, ValueError):
        return {}


def test_real_sglang_router_pd_run_with_in_place_switches_under_load(tmp_path: Path):
    proc = subprocess.Popen(UP + ["--workdir", str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=ENV)
    try:
        wait_until(lambda: _progress(tmp_path).get("completed", 0) >= 2 or proc.poll() is not None,
                   timeout=240, interval=0.2, what="the run to be under way")
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        # The router is the real one: its process, and its own worker listing of the agents'
        # registrations (a prefill with its bootstrap port, decodes).
        state = json.loads((tmp_path / "up-state.json").read_text())
        cmd = state["processes"]["router"]["cmd"]
        assert "sglang_router.launch_router" in cmd and "--pd-disaggregation" in cmd, cmd
        router = f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
        workers = httpx.get(f"{router}/workers", timeout=5).json()
        assert workers["stats"]["prefill_count"] >= 1 and workers["stats"]["decode_count"] >= 1, workers
        assert all(w.get("bootstrap_port") for w in workers["workers"] if w["worker_type"] == "prefill")
        out, _ = proc.communicate(timeout=300)
    except BaseException:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            out, _ = proc.communicate(timeout=60)
            print(out[-6000:])
        raise
    assert proc.returncode == 0, out[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    driver = json.loads((tmp_path / "driver.json").read_text())
    assert summary["router"] == "sglang-router 0.3.2"
    assert "sglang-router 0.3.2" in out
    # Every trajectory completed; events published = events stored, nothing anomalous.
    assert driver["trajectories"] == driver["completed"] == 32
    assert summary["tracker_events"] == driver["events"] == summary["run_events_in_log"], out[-3000:]
    assert summary["anomalies"] == 0

    db = sqlite3.connect(tmp_path / "tracker.db")
    raws = [json.loads(r) for (r,) in db.execute("select raw from events order by pos")]
    run = [e for e in raws if e.get("run") == "real-router"]
    # Every request the driver sent was answered: a decode.finished per request.queued, an
    # aborted one followed by a new request.queued for its trajectory (re-queued).
    queued = {e["req"]: e for e in run if e["type"] == "request.queued"}
    finished = {e["req"]: e for e in run if e["type"] == "decode.finished"}
    assert queued.keys() == finished.keys() and len(queued) == driver["requests"]
    aborted = [e for e in finished.values() if e["finish"] == "abort"]
    assert len(aborted) == driver["aborted_requests"]
    for a in aborted:
        assert any(q["traj"] == a["traj"] and q["ts"] >= a["ts"] for q in queued.values()), a
    assert sum(1 for e in run if e["type"] == "reward.finished") == 32
    # Switches ran in place, executed by the engine agents, while requests were in flight.
    cmds = {e["cmd"]: e for e in raws if e["type"] == "engine.command"}
    switched = [e for e in raws if e["type"] == "engine.switched"]
    assert switched and {e["cmd"] for e in switched} <= cmds.keys()
    in_place = [e for e in switched if e.get("mode") == "in_place"]
    assert in_place, switched

    def in_flight(t0: float, t1: float) -> int:
        return sum(1 for r, q in queued.items() if q["ts"] <= t1 and finished[r]["ts"] >= t0)

    assert max(in_flight(cmds[e["cmd"]]["ts"], e["ts"]) for e in in_place) > 0
