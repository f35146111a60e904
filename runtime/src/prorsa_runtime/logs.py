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
