"""The `prorsa` command as a user runs it: real processes, real files, a real nats-server."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import nats
import pytest

from prorsa_cli.example import example_events
from prorsa_schemas import LogWriter, Namespace

PRORSA = [sys.executable, "-m", "prorsa_cli.main"]


def run(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([*PRORSA, *args], capture_output=True, text=True, timeout=timeout, env=env, **kw)


def _example_log(path: Path, n: int = 8) -> int:
    with LogWriter(path) as w:
        for ev in example_events(n):
            w.write(ev)
    return w.count


def test_help_lists_the_commands() -> None:
    res = run("--help")
    assert res.returncode == 0
    for cmd in ("nats", "validate", "publish", "replay", "demo", "up"):
        assert cmd in res.stdout


def test_help_paragraphs_wrap_at_the_terminal_not_at_the_source() -> None:
    # The docstring breaks "... its own engine events need" / "(their registrations) ..."
    # at 88 columns; at 200 columns the paragraph must print as one line.
    res = run("export", "--help")
    assert res.returncode == 0
    assert "its own engine events need (their registrations), so that it loads" in res.stdout
    res = run("tracker", "load", "--help")  # a sub-app's command too
    assert res.returncode == 0
    assert "content) is reported with its line number" in res.stdout


def test_reflow_keeps_lists_and_click_verbatim_blocks() -> None:
    from prorsa_runtime.cli import reflow_paragraphs

    text = "Summary line.\n\n    One sentence\n    in two lines.\n\n    - a list\n    - kept\n\n    \b\n    verbatim\n    block"
    assert reflow_paragraphs(text) == "Summary line.\n\nOne sentence in two lines.\n\n- a list\n- kept\n\n\b\nverbatim\nblock"


def test_validate_reports_each_invalid_line_and_counts(tmp_path: Path) -> None:
    log = tmp_path / "mixed.jsonl"
    good = [json.dumps(json.loads(ev.model_dump_json(exclude_none=True))) for ev in example_events(2)]
    lines = good[:5] + ["this is not json", '{"v":1,"id":"x","type":"sandbox.ready","ts":1,"run":"r"}'] + good[5:]
    log.write_text("\n".join(lines) + "\n")
    res = run("validate", str(log))
    assert res.returncode == 1
    out = res.stdout
    assert f"{log}:6: not valid JSON" in out
    assert f"{log}:7: field 'traj': is required but missing" in out
    assert f"{len(lines)} events: {len(good)} valid, 2 invalid" in res.stderr

    res = run("validate", str(log), "--json")
    assert res.returncode == 1
    summary = json.loads(res.stdout)
    assert summary["events"] == len(lines) and summary["valid"] == len(good) and summary["invalid"] == 2
    assert sum(summary["by_type"].values()) == len(good)
    assert summary["by_type"]["run.started"] == 1


def test_validate_clean_gz_log_exits_zero(tmp_path: Path) -> None:
    log = tmp_path / "ok.jsonl.gz"
    n = _example_log(log)
    res = run("validate", str(log), "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["valid"] == n


def test_validate_accepts_unknown_fields_and_reports_them_in_strict_mode(tmp_path: Path) -> None:
    # EVENTS.md: a field an event type does not name is not an error (forward
    # compatibility); the strict mode reports it.
    log = tmp_path / "extra.jsonl"
    evs = [json.loads(ev.model_dump_json(exclude_none=True)) for ev in example_events(1)]
    evs[1]["framework_note"] = "verl 0.6"
    log.write_text("\n".join(json.dumps(e) for e in evs) + "\n")
    res = run("validate", str(log), "--json")
    assert res.returncode == 0, res.stdout + res.stderr
    assert json.loads(res.stdout)["invalid"] == 0
    res = run("validate", str(log), "--strict")
    assert res.returncode == 1
    assert f"{log}:2: field 'framework_note': is not a field of this event type" in res.stdout


def test_validate_out_of_order_ts_is_invalid(tmp_path: Path) -> None:
    evs = list(example_events(2))
    evs[3], evs[4] = evs[4], evs[3]
    assert evs[3].ts > evs[4].ts
    log = tmp_path / "unordered.jsonl"
    with LogWriter(log) as w:
        for ev in evs:
            w.write(ev)
    res = run("validate", str(log))
    assert res.returncode == 1
    assert f"{log}:5: field 'ts'" in res.stdout and "earlier than" in res.stdout


@pytest.mark.parametrize(
    "content",
    [
        os.urandom(4096),  # binary junk
        gzip.compress(b'{"v":1}\n' * 1000)[:200],  # truncated gzip
        b"{" + b"a" * (3 << 20) + b"\n",  # a huge line
        b"",  # empty file
    ],
    ids=["junk", "truncated-gzip", "huge-line", "empty"],
)
def test_validate_never_crashes_on_garbage(tmp_path: Path, content: bytes) -> None:
    log = tmp_path / "bad.jsonl.gz"
    log.write_bytes(content)
    res = run("validate", str(log), "--json")
    assert res.returncode in (0, 1), res.stderr
    assert "Traceback" not in res.stderr
    summary = json.loads(res.stdout)
    assert summary["valid"] == 0
    assert (summary["invalid"] == 0) == (content == b"" )


def test_user_text_is_printed_as_it_is_never_as_markup_or_emoji(tmp_path: Path) -> None:
    # rich reads "[/x]" as a closing tag (a MarkupError) and ":a:" as an emoji code: an event
    # field, a path or a policy name that holds them is printed as written.
    folder = tmp_path / "runs[" / "x]"
    folder.mkdir(parents=True)
    log = folder / "odd.jsonl"
    log.write_text('{"type":"[/nope]","v":1}\n{"type":":thumbs_down: [bold]hi","v":1}\n')
    res = run("validate", str(log))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"{log}:1: field 'type': value '[/nope]'" in res.stdout
    assert "value ':thumbs_down: [bold]hi'" in res.stdout
    res = run("sim", "run", "--policy", "static:a:b", "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "'static:a:b'" in res.stderr, res.stderr


def test_a_path_that_cannot_be_written_is_one_error_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    res = run("sim", "run", "--policy", "static:4:4", "--steps", "1", "--batch-size", "8", "--no-plot",
              "--out", str(blocker / "run"))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"error: Not a directory: {blocker / 'run'}" in res.stderr


def test_validate_missing_file(tmp_path: Path) -> None:
    res = run("validate", str(tmp_path / "nope.jsonl"))
    assert res.returncode == 2 and "no such file" in res.stderr


async def _stream_count(url: str, ns: Namespace) -> int:
    nc = await nats.connect(url)
    try:
        return (await nc.jetstream().stream_info(ns.stream)).state.messages
    finally:
        await nc.close()


async def test_publish_then_republish_stores_each_event_once(tmp_path: Path, nats_url: str, ns: Namespace) -> None:
    import asyncio

    log = tmp_path / "ex.jsonl.gz"
    n = _example_log(log)
    args = ("publish", str(log), "--nats", nats_url, "--prefix", ns.prefix, "--stream", ns.stream)
    res = await asyncio.to_thread(run, *args)
    assert res.returncode == 0, res.stderr
    assert f"published {n} events" in res.stderr
    assert await _stream_count(nats_url, ns) == n
    res = await asyncio.to_thread(run, *args)
    assert res.returncode == 0
    assert f"{n} already in the stream" in res.stderr
    assert await _stream_count(nats_url, ns) == n


async def test_publish_skips_invalid_lines_and_exits_1(tmp_path: Path, nats_url: str, ns: Namespace) -> None:
    import asyncio

    log = tmp_path / "some-bad.jsonl"
    good = [ev.model_dump_json(exclude_none=True) for ev in example_events(1)]
    log.write_text("\n".join(good[:3] + ["garbage"] + good[3:]) + "\n")
    res = await asyncio.to_thread(
        run, "publish", str(log), "--nats", nats_url, "--prefix", ns.prefix, "--stream", ns.stream
    )
    assert res.returncode == 1
    assert f"{log}:4: skipped" in res.stderr
    assert await _stream_count(nats_url, ns) == len(good)


async def test_publish_at_speed_paces_by_event_time(tmp_path: Path, nats_url: str, ns: Namespace) -> None:
    import asyncio
    import time

    from prorsa_schemas import PolicyUpdated

    log = tmp_path / "paced.jsonl"
    with LogWriter(log) as w:
        for i in range(3):
            w.write(PolicyUpdated(id=f"p{i}", ts=100.0 + i, run="r", version=i))
    t0 = time.monotonic()
    res = await asyncio.to_thread(
        run, "replay", str(log), "--nats", nats_url, "--speed", "4", "--prefix", ns.prefix, "--stream", ns.stream
    )
    elapsed = time.monotonic() - t0
    assert res.returncode == 0, res.stderr
    assert elapsed >= 0.5  # 2 s of event time at 4x
    assert await _stream_count(nats_url, ns) == 3


def test_publish_to_a_dead_bus_fails_clearly(tmp_path: Path) -> None:
    from prorsa_runtime.natsserver import free_port

    log = tmp_path / "ex.jsonl"
    _example_log(log, 1)
    res = run("publish", str(log), "--nats", f"nats://127.0.0.1:{free_port()}", "--connect-timeout", "1")
    assert res.returncode == 1
    assert "could not connect" in res.stderr


def test_bad_speed_and_bad_prefix_are_refused(tmp_path: Path) -> None:
    log = tmp_path / "ex.jsonl"
    _example_log(log, 1)
    for bad in ("0", "nan", "-1"):  # NaN passed a `<= 0` check and published at full speed
        res = run("publish", str(log), "--speed", bad)
        assert res.returncode == 2 and "must be a finite number > 0" in res.stderr, res.stderr
    res = run("switch", "e0", "--to", "decode", "--timeout", "nan")  # it hung
    assert res.returncode == 2 and "must be a finite number > 0" in res.stderr
    res = run("publish", str(log), "--prefix", "bad prefix")
    assert res.returncode == 2 and "subject prefix" in res.stderr


def test_nats_command_runs_a_server_and_stops_on_sigint(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*PRORSA, "nats", "--data", str(tmp_path / "store"), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = proc.stdout.readline().strip()
        assert url.startswith("nats://127.0.0.1:")
        import asyncio

        async def ping() -> bool:
            nc = await nats.connect(url)
            ok = nc.is_connected
            await nc.close()
            return ok

        assert asyncio.run(ping())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
