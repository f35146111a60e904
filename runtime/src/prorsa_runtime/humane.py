"""What the CLI shows people and reads from them: times and tables that fit the terminal.

Pure functions (the current time is passed in), so the rules are tested without a clock:
tables show times in UTC as ``YYYY-MM-DD HH:MM:SS``; ``--since``/``--until`` take that
(or any ISO 8601 time, UTC unless it names an offset), an epoch in seconds, or a time
relative to now (``-10m``, ``2h``: that long ago).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import datetime, timezone

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
_RELATIVE = re.compile(r"^-?(\d+(?:\.\d+)?)\s*([smhdw])$")
_EPOCH = re.compile(r"^\d+(?:\.\d+)?$")

TIME_HELP = ("UTC time (2026-11-06T17:30:00 or '2026-11-06 17:30', an offset such as +02:00 honoured), "
             "epoch seconds, or a time ago (-10m, 2h, 3d)")


class TimeError(ValueError):
    """A time a user typed that is none of the accepted forms."""


def parse_time(text: str, now: float) -> float:
    """Epoch seconds of ``text``: an ISO 8601 time (UTC when it names no offset), epoch
    seconds, ``now``, or a time relative to ``now`` (``-10m`` and ``10m`` both mean ten
    minutes ago; units s, m, h, d, w).

    Raises:
        TimeError: ``text`` is none of these (the message lists the forms).
    """
    t = text.strip()
    if t.lower() == "now":
        return now
    if _EPOCH.match(t):
        return float(t)
    m = _RELATIVE.match(t.lower())
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        dt = datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeError(f"not a time: {text!r} (expected an ISO 8601 time such as 2026-11-06T17:30:00 "
                        "(UTC unless an offset is given), epoch seconds, or a time ago such as -10m, 2h, 3d)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp()


def human_ts(ts: float | None, ms: bool = False) -> str:
    """``ts`` (epoch seconds) as ``YYYY-MM-DD HH:MM:SS`` in UTC (``.mmm`` added when
    ``ms``); empty for no time."""
    if ts is None or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        return ""
    dt = datetime.fromtimestamp(ts, tz=timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if ms else dt.strftime("%Y-%m-%d %H:%M:%S")


def cell(value) -> str:
    """A table cell: nothing for None, a float without a trailing ``.0`` noise."""
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e15 else repr(value)
    return str(value)


def table_width(widths: Sequence[int]) -> int:
    """Width of a rich table (the default box: a border between columns and at both ends,
    one space of padding each side of a cell) whose columns are ``widths`` wide."""
    return sum(w + 2 for w in widths) + len(widths) + 1


def fit_columns(columns: Sequence[str], widths: dict[str, int], width: int, drop: Sequence[str]) -> list[str]:
    """The columns to show within ``width``: ``columns`` less as many of ``drop`` (the
    least useful first) as it takes to fit, none of the others ever dropped (ids stay
    whole; a table still too wide then wraps its other cells)."""
    shown = list(columns)
    for name in drop:
        if table_width([widths[c] for c in shown]) <= width:
            break
        if name in shown:
            shown.remove(name)
    return shown
