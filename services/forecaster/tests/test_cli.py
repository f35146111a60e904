"""`prorsa forecast-eval` end to end, through the real `prorsa` app."""

import gzip
import json

import pytest
from typer.testing import CliRunner

from prorsa_cli.main import app
from prorsa_schemas import LogWriter

from .synth import rollout

runner = CliRunner()


def write(path, events, junk=False):
    with LogWriter(path) as w:
        for e in events:
            w.write(e)
    if junk:
        with gzip.open(path, "ab") as fh:
            fh.write(b'{"type": "request.queued"}\nnot json\n')


def test_json_report_shape_and_baselines(tmp_path):
    log = tmp_path / "events.jsonl.gz"
    write(log, rollout(seed=7, concurrency=24, duration=60), junk=True)
    res = runner.invoke(app, ["forecast-eval", str(log), "--horizon", "10", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["horizon"] == 10.0 and r["windows"] > 5
    for series in ("prefill", "decode"):
        assert 0 <= r[series]["wape"] < 1
        assert set(r[series]["baselines"]) == {"last_value", "ema", "kalman"}
    assert r["prefill"]["components"]["backlog"]["wape"] == 0.0
    # The arrivals' Bernoulli spread: positive (tool returns are uncertain), below 100%.
    assert 0 < r["prefill"]["noise_floor"] < 1
    # The same scores on the arrivals alone (backlog left out): less actual demand, so a
    # larger error share, and baselines computed on that series too.
    arr = r["prefill"]["arrivals"]
    assert arr["actual_tokens"] < r["prefill"]["actual_tokens"]
    assert set(arr["baselines"]) == {"last_value", "ema", "kalman"} and arr["wape"] >= r["prefill"]["wape"]
    assert r["invalid_lines"] == 2 and r["partial_windows"] == 1
    assert 0 < r["decode"]["noise_floor"] < 1
    # Decode admissions split into requests queued at t and arrivals: the parts add up.
    dc = r["decode"]["components"]
    assert set(dc) == {"known", "arrivals"}
    assert dc["known"]["actual_tokens"] + dc["arrivals"]["actual_tokens"] == r["decode"]["actual_tokens"]
    assert dc["known"]["actual_tokens"] > 0 and dc["arrivals"]["actual_tokens"] > 0
    # Against the best naive predictor: the WAPE difference, with its standard error.
    for series in ("prefill", "decode"):
        gap = r[series]["vs_best_naive"]
        best = min(r[series]["baselines"], key=r[series]["baselines"].get)
        assert gap["predictor"] == best
        assert gap["excess"] == pytest.approx(r[series]["wape"] - r[series]["baselines"][best], abs=2e-4)
        assert gap["se"] > 0


def test_table_output_and_windows_csv(tmp_path):
    log = tmp_path / "events.jsonl"
    write(log, rollout(seed=8, concurrency=8, duration=30, sandbox=False, prefill_started=False, run_started=False, tools=False))
    csv = tmp_path / "w.csv"
    res = runner.invoke(app, ["forecast-eval", str(log), "--windows", str(csv)])
    assert res.exit_code == 0, res.output
    assert "prorsa WAPE" in res.stdout and "kalman" in res.stdout and "known at t" in res.stdout
    import csv as csvmod

    rows = list(csvmod.DictReader(csv.read_text().splitlines()))
    assert len(rows) > 3
    from prorsa_forecaster.core import COMPONENTS

    assert set(COMPONENTS) <= set(rows[0]) and {"decode_known_forecast", "decode_known_actual", "share_factor"} <= set(rows[0])
    # Backlog and forecast add up per window: ready + inflight are the known part of prefill.
    for r in rows:
        assert float(r["prefill_actual"]) >= float(r["ready"]) + float(r["inflight"]) - 2  # each rounded
        assert float(r["decode_known_actual"]) <= float(r["decode_actual"])
        # The actual arrivals per source add up to the window's arrivals: its demand
        # less the backlog at t (ready + in flight, known exactly), each rounded.
        arrivals = sum(float(r[f"actual_{s}"]) for s in ("sampler", "sandbox", "tool", "reprefill", "other"))
        assert arrivals == pytest.approx(float(r["prefill_actual"]) - float(r["ready"]) - float(r["inflight"]), abs=8)


def test_empty_log_and_log_without_requests(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    r = json.loads(runner.invoke(app, ["forecast-eval", str(empty), "--json"]).stdout)
    assert r["windows"] == 0 and r["prefill"]["wape"] is None
    only_engines = tmp_path / "eng.jsonl"
    only_engines.write_text(
        '{"v":1,"id":"a","type":"engine.registered","ts":5.0,"run":"r","engine":"e0","server":"s",'
        '"role":"prefill","gpus":8,"kv_capacity_tokens":1000}\n'
    )
    r = json.loads(runner.invoke(app, ["forecast-eval", str(only_engines), "--json"]).stdout)
    # Its one window is the one the log ends in: cut short, so not scored.
    assert r["windows"] == 0 and r["partial_windows"] == 1 and r["decode"]["wape"] is None
    # The tables say why they are empty.
    res = runner.invoke(app, ["forecast-eval", str(empty)])
    assert res.exit_code == 0 and "no window was scored: the log holds no event" in res.output
    res = runner.invoke(app, ["forecast-eval", str(only_engines)])
    assert res.exit_code == 0 and "the log's 1 window(s) end where the log does" in res.output


def test_bad_arguments_get_clear_errors(tmp_path):
    res = runner.invoke(app, ["forecast-eval", str(tmp_path / "missing.jsonl")])
    assert res.exit_code == 2 and "no such file" in res.output
    res = runner.invoke(app, ["forecast-eval", str(tmp_path)])
    assert res.exit_code == 2 and "directory" in res.output
    log = tmp_path / "x.jsonl"
    log.write_text("")
    res = runner.invoke(app, ["forecast-eval", str(log), "--horizon", "0"])
    assert res.exit_code == 2 and "horizon" in res.output
    res = runner.invoke(app, ["forecast-eval", str(log), "--horizon", "1e-9"])  # would never finish
    assert res.exit_code == 2 and "horizon must be a number of seconds >= 0.1" in res.output
    # A log with lines and no valid event is an error, not an empty report that looks fine.
    log.write_text("not an event\n{}\n")
    res = runner.invoke(app, ["forecast-eval", str(log)])
    assert res.exit_code == 1 and "holds no valid event (2 invalid lines)" in res.output
    # --windows that cannot be written is found before the evaluation, not after it.
    good = tmp_path / "good.jsonl"
    write(good, rollout(seed=3, concurrency=8, duration=30))
    res = runner.invoke(app, ["forecast-eval", str(good), "--windows", str(tmp_path / "no" / "w.csv")])
    assert res.exit_code == 2 and "cannot write --windows" in res.output


def test_a_truncated_log_is_scored_up_to_its_end_and_says_so(tmp_path):
    import gzip

    full = tmp_path / "full.jsonl"
    write(full, rollout(seed=3, concurrency=8, duration=60))
    data = gzip.compress(full.read_bytes())
    cut = tmp_path / "cut.jsonl.gz"
    cut.write_bytes(data[: len(data) // 2])
    res = runner.invoke(app, ["forecast-eval", str(cut)])
    assert res.exit_code == 0 and "warning: the log ends early (line" in res.output and "truncated" in res.output
    report = json.loads(runner.invoke(app, ["forecast-eval", str(cut), "--json"]).stdout)
    assert report["truncated"].startswith("line ") and report["windows"] > 0
    assert json.loads(runner.invoke(app, ["forecast-eval", str(full), "--json"]).stdout)["truncated"] is None


def test_option_overrides_a_config_field_and_rejects_bad_ones(tmp_path):
    log = tmp_path / "events.jsonl"
    write(log, rollout(seed=9, concurrency=16, duration=60))
    base = json.loads(runner.invoke(app, ["forecast-eval", str(log), "--json"]).stdout)
    off = runner.invoke(app, ["forecast-eval", str(log), "--json", "-o", "bias_half_life=0", "-o", "tool_ema_alpha=0.5"])
    assert off.exit_code == 0, off.output
    off = json.loads(off.stdout)
    # Same windows and actuals, another forecast.
    assert off["windows"] == base["windows"] and off["prefill"]["actual_tokens"] == base["prefill"]["actual_tokens"]
    assert off["prefill"]["forecast_tokens"] != base["prefill"]["forecast_tokens"]
    for bad, says in (
        (["-o", "nope=1"], "unknown field 'nope'"),
        (["-o", "tool_ema_alpha"], "expected KEY=VALUE"),
        (["-o", "tool_ema_alpha=half"], "could not convert"),
        (["-o", "steps=many"], "invalid literal"),
        (["-o", "steps=0"], "steps must be in 1..1000"),
        (["-o", "steps=3", "-o", "steps=4"], "steps is set twice"),
    ):
        res = runner.invoke(app, ["forecast-eval", str(log), *bad])
        assert res.exit_code == 2 and says in res.output, (bad, res.output)
