"""Options and helpers every `prorsa` sub-command shares: the services' commands and the
`prorsa` CLI alike (here, below both, so that no service depends on the CLI)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer
from rich.console import Console

# No markup and no emoji codes: what the commands print is mostly the user's data (event
# fields, paths, policy names), and "[/x]" in it must not raise nor ":a:" become an emoji.
# A styled line asks for markup itself and escapes what it interpolates (see fail).
console = Console(stderr=True, markup=False, emoji=False)
out = Console(markup=False, emoji=False)

def check_nats_url(value: str) -> str:
    """``value`` if it is a NATS URL (one server, or several separated by commas); a clear
    error at once otherwise, instead of retrying a connection that cannot work."""
    from urllib.parse import urlsplit

    servers = [s.strip() for s in value.split(",")]
    for s in servers:
        try:
            u = urlsplit(s)
            port = u.port  # raises on a port that is no number or out of range
        except ValueError as exc:
            raise typer.BadParameter(f"{s!r} is not a NATS URL ({exc})") from None
        if u.scheme not in ("nats", "tls", "ws", "wss") or not u.hostname or u.path not in ("", "/"):
            from prorsa_runtime.redact import mask_url

            raise typer.BadParameter(f"{mask_url(s)!r} is not a NATS URL: expected nats://host:port (or tls://, ws://, "
                                     "wss://), several separated by commas")
        del port
    return value


NatsOpt = Annotated[
    str,
    typer.Option(
        "--nats",
        envvar="PRORSA_NATS_URL",
        help="NATS server URL (env PRORSA_NATS_URL).",
        show_default=True,
        callback=check_nats_url,
    ),
]
PrefixOpt = Annotated[
    str,
    typer.Option("--prefix", envvar="PRORSA_SUBJECT_PREFIX", help="Subject prefix of all events."),
]
StreamOpt = Annotated[
    str, typer.Option("--stream", envvar="PRORSA_STREAM", help="JetStream stream name.")
]

DEFAULT_NATS = "nats://127.0.0.1:4222"

CONNECT_TIMEOUT_S = 3.0
"""How long a one-shot command (publish, replay) waits for the bus by default: a server
that is not there fails in seconds; --connect-timeout waits longer for one starting."""


def flags_show_no_type() -> None:
    """typer 0.29 prints a type beside every flag in help (``--json <bool>``), although a
    flag takes no value: show none, as click does."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_prorsa_flags", False):
        return

    def display_type_rich(self, ctx):  # noqa: ANN001, ANN202 - typer's signature
        return None if self.is_flag else shown(self, ctx)

    display_type_rich._prorsa_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


def reflow_help(app: typer.Typer) -> None:
    """Join the lines of each paragraph of every command's help in ``app`` and its sub-apps.

    typer 0.29's rich help keeps a docstring's line breaks, so a paragraph wrapped at 88
    columns in the source prints broken at the terminal's width. Each paragraph (split on
    a blank line) becomes one line, which rich wraps; a paragraph that starts with click's
    ``\\b`` marker, or that holds a list (lines starting ``-`` or ``*``), is kept as
    written. Call it once all commands are registered."""
    for info in app.registered_commands:
        text = info.help or (info.callback.__doc__ if info.callback else None)
        if text:
            info.help = reflow_paragraphs(text)
    for group in app.registered_groups:
        if group.typer_instance is not None:
            reflow_help(group.typer_instance)


def reflow_paragraphs(text: str) -> str:
    """``text`` (a docstring) with the lines of each plain paragraph joined by spaces."""
    import inspect

    out = []
    for para in inspect.cleandoc(text).split("\n\n"):
        lines = para.splitlines()
        keep = para.startswith("\b") or any(ln.lstrip().startswith(("- ", "* ")) for ln in lines)
        out.append(para if keep else " ".join(ln.strip() for ln in lines))
    return "\n\n".join(out)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error (one line, no traceback, never a password) and exit."""
    from rich.markup import escape

    from prorsa_runtime.redact import mask_secrets

    console.print(f"[bold red]error:[/] {escape(mask_secrets(message))}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(code)


def positive(value: float | None) -> float | None:
    """typer callback: a finite number > 0 (None: the option's unset default). NaN passes
    every ``x <= 0`` check, and a NaN time-out or speed hangs a command or paces nothing."""
    import math

    if value is not None and not (math.isfinite(value) and value > 0):
        raise typer.BadParameter(f"must be a finite number > 0, got {value}")
    return value


def non_negative(value: float | None) -> float | None:
    """typer callback: a finite number >= 0 (None: unset)."""
    import math

    if value is not None and not (math.isfinite(value) and value >= 0):
        raise typer.BadParameter(f"must be a finite number >= 0, got {value}")
    return value


def namespace(prefix: str, stream: str):
    from prorsa_schemas import Namespace

    try:
        return Namespace(prefix=prefix, stream=stream)
    except ValueError as exc:
        fail(str(exc))


def is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("CI") is None


class StopSignals:
    """SIGINT and SIGTERM set a flag that a foreground command's loop polls (:meth:`wait`).

    The handler takes no lock. Python runs a signal handler in the main thread between two
    bytecodes, so a ``threading.Event.set()`` there deadlocks when the signal lands while
    that thread holds the event's own lock inside ``Event.wait``: the command then never
    stops, and what it started (a nats-server, emulated engines) is left running."""

    def __init__(self) -> None:
        import signal

        self.stopped = False
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)

    def _on_signal(self, *_: object) -> None:
        self.stopped = True

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds`` unless a stop was asked already; whether one was asked.
        A signal during the sleep sets the flag, and the sleep ends when its time is up."""
        import time

        if not self.stopped:
            time.sleep(seconds)
        return self.stopped
