"""benchmarks/reference_runs.py: the comparison of a run's figures with those recorded for
other code, and its answers to bad input (no simulation runs here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "reference_runs.py"


def _module():
    spec = importlib.util.spec_from_file_location("reference_runs", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["reference_runs"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_compare_names_the_codes_whose_figures_differ() -> None:
    rr = _module()
    a, b = rr.REFS[0], rr.REFS[1]
    recorded = {"codes": {"old": {}, "older": {}}, "runs": {
        a.name: {"by_code": {"old": {"rollout_s": 100.04, "switches": 2},     # within 0.05 s: the same
                             "older": {"rollout_s": 100.0, "switches": 3}}},  # another switch count
        b.name: {"by_code": {"old": {"rollout_s": 200.1, "switches": 0}}},    # 0.1 s off
    }}
    now = {a.name: {"rollout_s": 100.0, "switches": 2, "code": "cur"},
           b.name: {"rollout_s": 200.0, "switches": 0, "code": "cur"}}
    rows = rr.compare([a, b], now, recorded, {})
    assert [r["differs_from"] for r in rows] == [["older"], ["old"]]
    assert rows[0]["command"].startswith(f"prorsa sim run --workload {a.workload} --staleness {a.staleness}")
    # a run this code cannot make differs from nothing and says why
    rows = rr.compare([a], {}, recorded, {a.name: "prorsa:x: unknown"})
    assert rows[0]["now"] is None and rows[0]["differs_from"] == [] and rows[0]["unavailable"] == "prorsa:x: unknown"


def test_the_runs_cover_every_setting_once() -> None:
    rr = _module()
    six = [r for r in rr.REFS if r.steps == 6 and r.spec == "prorsa"]
    assert sorted((r.model, r.workload, r.staleness) for r in six) == sorted(
        (m, w, s) for m in ("deepseek-v3.2", "mimo-v2.5-pro") for w in ("math", "coding", "general")
        for s in (0, 2, 8))
    assert len({r.name for r in rr.REFS}) == len(rr.REFS)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_bad_arguments_are_refused_with_the_reason() -> None:
    r = _run("--only", "no such run")
    assert r.returncode == 2 and "no run matches" in r.stderr and "ds general/0 from 6:2 x6" in r.stderr
    r = _run("--alias", "prorsa:capacity")
    assert r.returncode == 2 and "expected SPEC=OTHER" in r.stderr
    r = _run("--jobs", "0")
    assert r.returncode == 2 and "--jobs must be >= 1" in r.stderr


def test_an_unreadable_record_is_refused_before_any_run(tmp_path: Path) -> None:
    bad = tmp_path / "runs.json"
    bad.write_text("{not json")
    r = _run("--file", str(bad), "--only", "x3")
    assert r.returncode == 2 and f"cannot read {bad}" in r.stderr
    bad.write_text('{"runs": []}')
    r = _run("--file", str(bad), "--only", "x3")
    assert r.returncode == 2 and "expected an object" in r.stderr


def test_recorded_compares_the_recorded_codes_without_simulating(tmp_path: Path) -> None:
    rr = _module()
    a, b = rr.REFS[0], rr.REFS[1]
    doc = {"codes": {"new": {"label": "the code of the docs"}, "old": {}}, "runs": {
        a.name: {"by_code": {"new": {"rollout_s": 100.0, "switches": 2, "policy": a.spec},
                             "old": {"rollout_s": 100.0, "switches": 3, "policy": a.spec}}},
        b.name: {"by_code": {"new": {"rollout_s": 50.0, "switches": 0, "policy": b.spec},
                             "old": {"rollout_s": 50.03, "switches": 0, "policy": b.spec}}},
    }}
    f = tmp_path / "runs.json"
    f.write_text(__import__("json").dumps(doc))
    r = _run("--file", str(f), "--recorded", "new", "--only", a.name, b.name)
    assert r.returncode == 0, r.stderr
    assert "against old: 1 of 2 runs the same" in r.stdout
    assert f"| {a.name} | 100.0 / 2 | 100.0 / 3 | 100.0 / 2 | old |" in r.stdout
    assert "- new: the code of the docs" in r.stdout
    # a code with no figures is refused, naming the recorded ones; --record makes no sense
    r = _run("--file", str(f), "--recorded", "nope")
    assert r.returncode == 2 and "code nope has no figures" in r.stderr and "recorded: new, old" in r.stderr
    r = _run("--file", str(f), "--recorded")  # the current code's key is not in this record
    assert r.returncode == 2 and "the current code" in r.stderr
    r = _run("--file", str(f), "--recorded", "new", "--record")
    assert r.returncode == 2 and "nothing to --record" in r.stderr
