"""Passwords never printed (URLs masked in text and in every log line) and dead-letter records."""

from __future__ import annotations

import hashlib
import io
import json
import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from prorsa_runtime import BusUnavailable, connect
from prorsa_runtime.deadletter import PREFIX_BYTES, DeadLetters, dead_letter
from prorsa_runtime.logs import setup_logging
from prorsa_runtime.redact import mask_secrets, mask_url


@pytest.mark.parametrize("text,shown", [
    ("postgresql://u:s3cret@db:5432/prorsa", "postgresql://u:***@db:5432/prorsa"),
    ("postgresql+psycopg://u:p@ss@db/prorsa", "postgresql+psycopg://u:***@db/prorsa"),  # '@' in the password
    ("nats://svc:pw@127.0.0.1:4222", "nats://svc:***@127.0.0.1:4222"),
    ("postgresql://db/prorsa?user=u&password=hunter2&sslmode=x", "postgresql://db/prorsa?user=u&password=***&sslmode=x"),
    ("sqlite:///tmp/t.db", "sqlite:///tmp/t.db"),
    ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
    ("http://host:8080/path", "http://host:8080/path"),
])
def test_mask_url(text: str, shown: str) -> None:
    assert mask_url(text) == shown


def test_mask_secrets_masks_every_url_in_a_text() -> None:
    text = "cannot open postgresql://a:one@h1/db, then nats://b:two@h2:4222 failed"
    assert mask_secrets(text) == "cannot open postgresql://a:***@h1/db, then nats://b:***@h2:4222 failed"


@pytest.mark.parametrize("json_lines", [False, True])
def test_no_log_line_carries_a_password(json_lines: bool) -> None:
    setup_logging("INFO", json_lines, "test")
    buf = io.StringIO()
    logging.getLogger().handlers[0].setStream(buf)
    try:
        logging.getLogger("prorsa.test").warning("database postgresql://u:hunter2@db/x down (%s)",
                                                 "nats://n:hunter3@h")
        try:
            raise RuntimeError("connect to postgresql://u:hunter4@db/x failed")
        except RuntimeError:
            logging.getLogger("prorsa.test").exception("boom")
    finally:
        logging.getLogger().handlers.clear()
    out = buf.getvalue()
    assert "hunter" not in out and out.count("***") >= 3


async def test_a_bus_connect_error_masks_the_url() -> None:
    with pytest.raises(BusUnavailable) as got:
        await connect("nats://svc:hunter2@127.0.0.1:1", "t", timeout=0.5)
    assert "hunter2" not in str(got.value) and "nats://svc:***@127.0.0.1:1" in str(got.value)


def test_dead_letter_record_logs_and_counts() -> None:
    data = b"[" * 1000
    dl = dead_letter("svc", "invalid", "p.rollout.x", 42, data, "nested too deeply")
    assert (dl.size, dl.sha256, dl.seq, dl.subject) == (1000, hashlib.sha256(data).hexdigest(), 42, "p.rollout.x")
    assert dl.prefix == "[" * PREFIX_BYTES
    assert dead_letter("svc", "invalid", None, None, b"\xff\xfe", "x").prefix == "\\xff\\xfe"

    setup_logging("INFO", True, "svc")
    buf = io.StringIO()
    logging.getLogger().handlers[0].setStream(buf)
    try:
        letters = DeadLetters("my-svc")
        letters.record("invalid", "p.rollout.x", 7, data, "nested too deeply")
        letters.record("subject", "p.rollout.x", 8, b"{}", "wrong subject")
    finally:
        logging.getLogger().handlers.clear()
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert [x["dead_letter"]["seq"] for x in lines] == [7, 8]
    assert lines[0]["dead_letter"]["sha256"] == hashlib.sha256(data).hexdigest()
    assert lines[0]["level"] == "WARNING" and "nested too deeply" in lines[0]["msg"]
    reg = CollectorRegistry()
    reg.register(letters)
    text = generate_latest(reg).decode()
    assert 'prorsa_my_svc_dead_letters_total{kind="invalid"} 1.0' in text
    assert 'prorsa_my_svc_dead_letters_total{kind="subject"} 1.0' in text
    assert letters.total == 2


def test_a_log_tail_is_its_last_lines_from_its_last_bytes(tmp_path):
    import pytest

    from prorsa_runtime.logs import tail_lines

    log = tmp_path / "e.log"
    log.write_bytes(b"one\ntwo\nthree \xff\n\n")
    assert tail_lines(log, 2) == "two\nthree \ufffd"
    assert tail_lines(log, 9) == "one\ntwo\nthree \ufffd"
    assert tail_lines(log, 1, max_bytes=4) == "\ufffd"
    with pytest.raises(OSError):
        tail_lines(tmp_path / "missing.log", 3)
