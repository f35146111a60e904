"""The console in headless Chromium against a live `prorsa up --emulated-cluster`: the run,
its forecast windows, its role switches and one trajectory's history, read from the running
tracker's API with the token `up` wrote."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest

from prorsa_cli.options import UpOptions, plan_ports
from prorsa_runtime.testing import wait_until
from prorsa_tracker import console_browser as cb

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not Path(cb.CHROMIUM).exists(),
    reason=f"no Chromium at {cb.CHROMIUM}: apt-get install chromium (or set PRORSA_CHROMIUM)")]

RUN = "live"
# As in test_up_e2e.py: a declared prefill throughput far below the emulated engines' makes
# the allocator want more prefill engines for the first turns' burst, so the run switches.
# The run is shorter than the served-rate evidence the allocator waits for before a move
# on the forecast alone (docs/allocator.md), so that rule is off here: the test is about
# the console showing switches, not about when the allocator may make them.
ENV = {**os.environ, "PRORSA_ALLOCATOR_PREFILL_TOKENS_PER_S": "5000", "PRORSA_ALLOCATOR_SERVED_EVIDENCE_FIRST": "false"}


def test_console_shows_a_live_run_its_forecast_switches_and_a_trajectory(tmp_path: Path) -> None:
    base = plan_ports(UpOptions(port_base=0, emulated_cluster=True, engines=6)).nats
    cmd = [sys.executable, "-m", "prorsa_cli.main", "up", "--emulated-cluster", "--port-base", str(base),
           "--engines", "6", "--prefill", "1", "--batch-size", "16", "--steps", "2", "--max-turns", "5",
           "--horizon", "3", "--run", RUN, "--workdir", str(tmp_path), "--keep-running"]
    log = (tmp_path / "up.out").open("w")
    # Started with SIGINT ignored, as some job runners start their children: `up` still
    # stops on Ctrl-C (it installs its own handler).
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, start_new_session=True, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    out = lambda: (tmp_path / "up.out").read_text()[-4000:]  # noqa: E731
    try:
        # The run is over (summary written) and the services keep running.
        wait_until(lambda: proc.poll() is not None or (tmp_path / "summary.json").exists(),
                   timeout=240, interval=0.2, what="the run to finish")
        assert proc.poll() is None, out()
        api = f"http://127.0.0.1:{base + 2}"
        cb.wait_http(f"{api}/healthz")
        token = (tmp_path / "api-token").read_text().strip()

        db = sqlite3.connect(tmp_path / "tracker.db")
        raws = [json.loads(r) for (r,) in db.execute("select raw from events order by pos")]
        db.close()
        windows = sorted({e["t"] for e in raws if e["type"] == "forecast.window"})
        switches = {e["cmd"] for e in raws if e["type"] == "engine.command"}
        assert len(windows) >= 5 and switches, (len(windows), switches)
        traj = next(e["traj"] for e in raws if e["type"] == "reward.finished" and e.get("run") == RUN)
        traj_events = [e for e in raws if e.get("traj") == traj and e.get("run") == RUN]

        dom = cb.dump_dom(api, f"#/run/{RUN}", token)
        assert f'id="run-title">Run {RUN}<' in dom, dom[-3000:]
        # The forecast charts carry the windows: a dashed forecast line of several points
        # beside the actual one, in each of the three demand charts.
        paths = re.findall(r'<path d="([^"]*)"[^>]*data-series="forecast \(', dom)
        assert len(paths) == 3 and all(p.count("L") >= 3 for p in paths), paths
        assert dom.count('data-series="actual"') == 3
        # The switches table: one row per command the allocator issued. The services keep
        # running after the run (the allocator may still plan on the forecast of a next
        # batch), so the commands are counted before and after the page is rendered.
        db = sqlite3.connect(tmp_path / "tracker.db")
        after = {json.loads(r)["cmd"] for (r,) in db.execute("select raw from events where type = 'engine.command'")}
        db.close()
        shown = re.search(r"Role switches \((\d+)\)", dom)
        assert shown and len(switches) <= int(shown.group(1)) <= len(after), (shown, len(switches), len(after))
        sw = dom[dom.index('id="switches"'):]
        sw = sw[:sw.index("</section>")]
        assert sw.count("<tr>") - 1 == int(shown.group(1)) and "prefill" in sw, sw[:2000]
        assert f'href="#/run/{RUN}/traj/{quote(traj, safe="")}"' in dom or "next →" in dom

        # One trajectory's history: its events in the order applied.
        dom = cb.dump_dom(api, f"#/run/{RUN}/traj/{quote(traj, safe='')}", token)
        assert f'id="traj-title">Trajectory {traj}<' in dom, dom[-3000:]
        assert f"Events ({len(traj_events)}, in the order applied)" in dom
        for kind in ("trajectory.dispatched", "request.queued", "prefill.finished", "decode.finished", "reward.finished"):
            assert kind in dom, kind
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        log.close()
    assert proc.returncode == 130, out()  # stopped by Ctrl-C, nothing failed
