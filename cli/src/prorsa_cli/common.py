"""Options and helpers every `prorsa` sub-command shares."""

from __future__ import annotations

import os
import sys
from typing import Annotated, NoReturn

import typer
from rich.console import Console

console = Console(stderr=True)
out = Console()

NatsOpt = Annotated[
    str,
    typer.Option(
        "--nats",
        envvar="PRORSA_NATS_URL",
        help="NATS server URL (env PRORSA_NATS_URL).",
        show_default=True,
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


def fail(message: str, code: int = 2) -> NoReturn:
    """Print a clear error (one line, no traceback, never a password) and exit."""
    from rich.markup import escape

    from prorsa_runtime.redact import mask_secrets

    console.print(f"[bold red]error:[/] {escape(mask_secrets(message))}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def namespace(prefix: str, stream: str):
    from prorsa_schemas import Namespace

    try:
        return Namespace(prefix=prefix, stream=stream)
    except ValueError as exc:
        fail(str(exc))


def is_tty() -> bool:
    return sys.stderr.isatty() and os.environ.get("CI") is None
