"""Poison lines in a log (JSON nested 1,000 deep, bytes that are not UTF-8): `prorsa validate`
reports each with its line number and reads on; so does `prorsa forecast-eval`. No traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from prorsa_cli.example import example_events
from prorsa_schemas import LogWriter, encode_event

PRORSA = [sys.executable, "-m", "prorsa_cli.main"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([*PRORSA, *args], capture_output=True, text=True, timeout=120, env=env)


def poison_log(path: Path) -> int:
    events = list(example_events(8))
    with LogWriter(path) as w:
        w.write(events[0])
        w.write_raw(b"[" * 1000)  # line 2
        w.write_raw(b"\xff\xfe\x00 not utf-8")  # line 3
        w.write_raw(b'{"v": 1, "id": "x", "type": "sandbox.ready", "ts": 1, "run": "r", "traj": "t", "x": '
                    + b"[" * 5000 + b"]" * 5000 + b"}")  # line 4: deep inside an otherwise valid event
        for ev in events[1:]:
            w.write_raw(encode_event(ev))
    return len(events)


def test_validate_reports_poison_lines_and_reads_on(tmp_path: Path) -> None:
    log = tmp_path / "poison.jsonl"
    n = poison_log(log)
    res = run("validate", str(log))
    assert res.returncode == 1 and "Traceback" not in res.stderr + res.stdout
    lines = res.stdout.splitlines()
    assert [x.split(": ", 1)[0] for x in lines] == [f"{log}:2", f"{log}:3", f"{log}:4"]
    assert "nested too deeply" in lines[0] and "not valid JSON" in lines[1] and "nested too deeply" in lines[2]
    assert f"{n + 3} events: {n} valid, 3 invalid" in res.stderr
    summary = json.loads(run("validate", str(log), "--json").stdout)
    assert (summary["valid"], summary["invalid"]) == (n, 3)


def test_forecast_eval_skips_poison_lines(tmp_path: Path) -> None:
    log = tmp_path / "poison.jsonl"
    n = poison_log(log)
    res = run("forecast-eval", str(log), "--json")
    assert res.returncode == 0 and "Traceback" not in res.stderr + res.stdout, res.stderr
    summary = json.loads(res.stdout)
    assert summary["invalid_lines"] == 3 and summary["events"] == n and summary["windows"] > 0
