"""Logging set-up shared by every service: plain text for people, JSON for collectors.

Every line goes through :func:`prorsa_runtime.redact.mask_secrets`, so a URL with a
password (a database or NATS URL in an error message) is never written out. A record's
``extra={"fields": {...}}`` becomes keys of the JSON line (e.g. a dead letter's subject,
sequence and hash).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path

from .redact import mask_secrets


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": round(record.created, 6),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for k, v in fields.items():
                out.setdefault(k, v)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return mask_secrets(json.dumps(out, default=str))


class _MaskingFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record))


def setup_logging(level: str = "INFO", json_lines: bool = False, service: str = "") -> None:
    """Configure the root logger once (idempotent)."""
    handler = logging.StreamHandler(sys.stderr)
    if json_lines:
        handler.setFormatter(_JsonFormatter())
    else:
        fmt = "%(asctime)s %(levelname)-7s " + (f"{service} " if service else "") + "%(name)s: %(message)s"
        formatter = _MaskingFormatter(fmt, "%H:%M:%S")
        formatter.converter = time.gmtime
        handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("nats").setLevel(max(logging.WARNING, root.level))


def tail_lines(path: str | Path, lines: int, max_bytes: int = 65536) -> str:
    """The last ``lines`` lines of a text log (read from its last ``max_bytes``; bytes that
    are not UTF-8 replaced). Raises OSError when the file cannot be read."""
    with open(path, "rb") as f:
        f.seek(0, 2)
        f.seek(max(0, f.tell() - max_bytes))
        text = f.read().decode("utf-8", "replace")
    return "\n".join(text.strip().splitlines()[-lines:])
