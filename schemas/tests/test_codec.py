"""Streaming logs: plain and gzip, junk, truncation, huge lines, deterministic writing."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from prorsa_schemas import LogWriter, decode_event, event_from_dict, iter_events, read_log

from .samples import FULL, event


def _events() -> list:
    return [event_from_dict(event(k, id=f"e{i}", ts=float(i))) for i, k in enumerate(sorted(FULL))]


@pytest.mark.parametrize("name", ["log.jsonl", "log.jsonl.gz"])
def test_write_then_read_back(tmp_path: Path, name: str) -> None:
    evs = _events()
    with LogWriter(tmp_path / name) as w:
        for ev in evs:
            w.write(ev)
    assert w.count == len(evs)
    assert list(iter_events(tmp_path / name)) == evs


def test_gzip_output_is_deterministic(tmp_path: Path) -> None:
    for name in ("a.jsonl.gz", "b.jsonl.gz"):
        with LogWriter(tmp_path / name) as w:
            for ev in _events():
                w.write(ev)
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_mixed_valid_invalid_and_junk_lines(tmp_path: Path) -> None:
    good = json.dumps(event("policy.updated")).encode()
    lines = [
        good,
        b"",  # blank lines are skipped, not counted
        b"\x00\xff\xfe binary junk",
        json.dumps(event("request.queued", turn=-1)).encode(),
        b'{"v": 1, "id": "x"',
        good,
    ]
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    got = list(read_log(path))
    assert [g.lineno for g in got] == [1, 3, 4, 5, 6]
    assert [g.ok for g in got] == [True, False, False, False, True]
    assert "turn" in got[2].error.reason
    assert got[0].raw == good


def test_truncated_gzip_reports_and_stops(tmp_path: Path) -> None:
    body = b"".join(json.dumps(event("policy.updated", id=f"e{i}")).encode() + b"\n" for i in range(2000))
    data = gzip.compress(body)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    got = list(read_log(path))
    assert got[-1].error is not None and "truncated or corrupt" in got[-1].error.reason
    assert all(g.ok for g in got[:-1]) and len(got) > 1


def test_not_gzip_despite_name_is_read_as_text(tmp_path: Path) -> None:
    path = tmp_path / "plain.jsonl.gz"
    path.write_bytes(json.dumps(event("policy.updated")).encode() + b"\n")
    assert [g.ok for g in read_log(path)] == [True]


def test_huge_line_is_skipped_without_reading_it_whole(tmp_path: Path) -> None:
    good = json.dumps(event("policy.updated")).encode()
    path = tmp_path / "huge.jsonl"
    with open(path, "wb") as fh:
        fh.write(good + b"\n")
        fh.write(b"x" * (5 << 20) + b"\n")  # 5 MiB line
        fh.write(good + b"\n")
    got = list(read_log(path, max_line_bytes=1 << 16))
    assert [g.ok for g in got] == [True, False, True]
    assert "longer than the limit" in got[1].error.reason
    assert got[2].lineno == 3


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="event log not found"):
        list(read_log(tmp_path / "nope.jsonl"))


def test_writer_refuses_newlines(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "x.jsonl") as w, pytest.raises(ValueError):
        w.write_raw(b'{"a":\n1}')


def test_decode_accepts_str_and_bytes() -> None:
    raw = json.dumps(event("sandbox.ready"))
    assert decode_event(raw) == decode_event(raw.encode())


# --- no poison: any input becomes an EventError with a reason -------------------------------

POISON = [
    (b"[" * 1000, "nested too deeply"),  # the 2 KB message that crashed services
    (b'{"a":' * 1000, "nested too deeply"),
    (b"\xff\xfe\x00garbage", "not valid JSON"),
    ("\ud800".encode("utf-8", "surrogatepass"), "not valid JSON"),  # not UTF-8
    (b'"\\ud800"', "not valid JSON"),
    (b"[" * 200_000, "nested too deeply"),
    (b"", "not valid JSON"),
    (b"null", "JSON object"),
]


@pytest.mark.parametrize("data,why", POISON, ids=[f"poison{i}" for i in range(len(POISON))])
def test_any_bad_input_is_an_event_error_with_a_reason(data: bytes, why: str) -> None:
    from prorsa_schemas import EventError

    with pytest.raises(EventError) as got:
        decode_event(data)
    assert why.lower() in got.value.reason.lower() or "nested too deeply" in got.value.reason


def test_deep_nesting_inside_an_otherwise_valid_event_is_rejected() -> None:
    from prorsa_schemas import EventError

    obj = event("sandbox.ready")
    raw = json.dumps(obj)[:-1].encode() + b', "extra": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    with pytest.raises(EventError, match="nested too deeply|recursion"):
        decode_event(raw)


def test_oversized_and_non_bytes_input_are_refused_with_a_reason() -> None:
    from prorsa_schemas import EventError

    with pytest.raises(EventError, match="longer than the limit of 1048576 bytes"):
        decode_event(b" " * (2 << 20))
    with pytest.raises(EventError, match="must be bytes or text, not NoneType"):
        decode_event(None)  # type: ignore[arg-type]


def test_a_failure_inside_the_validator_becomes_an_event_error(monkeypatch) -> None:
    # MemoryError or a bug in a library: the reason names it, the caller sees one type.
    from prorsa_schemas import EventError, codec

    class Exploding:
        def validate_json(self, *a, **k):
            raise MemoryError

    monkeypatch.setattr(codec, "_ADAPTER", Exploding())
    with pytest.raises(EventError, match="out of memory"):
        decode_event(b"{}")


def test_a_log_with_poison_lines_reports_each_and_reads_on(tmp_path: Path) -> None:
    good = json.dumps(event("policy.updated")).encode()
    path = tmp_path / "poison.jsonl"
    path.write_bytes(b"\n".join([good, b"[" * 1000, b"\xff\xfe", good]) + b"\n")
    got = list(read_log(path))
    assert [(g.lineno, g.ok) for g in got] == [(1, True), (2, False), (3, False), (4, True)]
    assert "nested too deeply" in got[1].error.reason


def test_decode_message_checks_that_subject_and_type_agree() -> None:
    from prorsa_schemas import EventError, Namespace, SubjectMismatch, decode_message

    ns = Namespace(prefix="p", stream="P")
    cmd = json.dumps(event("engine.command")).encode()
    assert decode_message(cmd, "p.control.engine.command", ns).type == "engine.command"
    with pytest.raises(SubjectMismatch) as got:
        decode_message(cmd, "p.rollout.request.queued", ns)
    assert "'p.rollout.request.queued'" in got.value.reason and "'p.control.engine.command'" in got.value.reason
    assert got.value.event.type == "engine.command"
    with pytest.raises(EventError) as bad:
        decode_message(b"[" * 1000, "p.control.engine.command", ns)
    assert not isinstance(bad.value, SubjectMismatch)
