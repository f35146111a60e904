"""`prorsa`: the single entry point for Prorsa's services and tools.

Service packages add their own sub-commands through a ``register(app)`` function in their
``cli`` module; heavy imports stay inside the commands so ``prorsa --help`` is quick.
"""

from __future__ import annotations

import importlib
import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Optional

import typer

from prorsa_runtime.cli import (CONNECT_TIMEOUT_S, DEFAULT_NATS, NatsOpt, PrefixOpt, StreamOpt, console, fail,
                                flags_show_no_type, namespace, non_negative, out, positive, reflow_help)

app = typer.Typer(
    name="prorsa",
    help="Prorsa: forecast-driven prefill/decode role switching for agentic RL rollout.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
flags_show_no_type()


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        names = ["prorsa", "prorsa-schemas", "prorsa-runtime", "prorsa-tracker", "prorsa-forecaster",
                 "prorsa-allocator", "prorsa-engine-agent"]
        found = []
        for name in names:
            try:
                found.append((name, version(name)))
            except PackageNotFoundError:
                continue  # not installed on this host (e.g. an agent-only image)
        out.print(f"prorsa {dict(found).get('prorsa', 'unknown')}", highlight=False)
        for name, v in found[1:]:
            out.print(f"  {name} {v}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version of prorsa and its installed packages, and exit.")] = False,
) -> None:
    """Prorsa: forecast-driven prefill/decode role switching for agentic RL rollout."""

# Sub-commands contributed by the service packages (each module defines register(app)).
PLUGINS = [
    "prorsa_tracker.cli",
    "prorsa_forecaster.cli",
    "prorsa_allocator.cli",
    "prorsa_engine_agent.cli",
    "prorsa_sim.cli",
    "prorsa_cli.up",
    "prorsa_cli.schema_cmd",
]


nats_app = typer.Typer(
    help="Run a local JetStream nats-server on a data folder (Ctrl-C stops it); `prorsa nats setup` sets up the stream.",
    invoke_without_command=True,
)
app.add_typer(nats_app, name="nats")


@nats_app.callback()
def nats_cmd(
    ctx: typer.Context,
    data: Annotated[Path, typer.Option(help="JetStream store folder.")] = Path(".prorsa/nats"),
    port: Annotated[int, typer.Option(help="Client port (0: pick a free one).", min=0, max=65535)] = 4222,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
) -> None:
    """Run a local JetStream nats-server on a data folder (Ctrl-C stops it)."""
    if ctx.invoked_subcommand is not None:
        return
    from prorsa_runtime.cli import StopSignals
    from prorsa_runtime.natsserver import NatsServer, NatsServerError, NatsServerNotFound

    stop = StopSignals()
    try:
        server = NatsServer(data, port=port, host=host).start()
    except (NatsServerError, NatsServerNotFound) as exc:
        fail(str(exc))
    out.print(server.url, highlight=False)
    console.print(f"nats-server with JetStream, store {data.resolve()}; Ctrl-C to stop")
    while not stop.wait(0.5):
        if not server.running():
            fail("nats-server exited unexpectedly", 1)
    server.stop()


@nats_app.command("setup")
def nats_setup_cmd(
    nats_url: NatsOpt = DEFAULT_NATS,
    prefix: PrefixOpt = "prorsa",
    stream: StreamOpt = "PRORSA",
    duplicate_window: Annotated[float, typer.Option(help="Seconds within which a re-sent event id is dropped.", callback=positive)] = 600.0,
    max_age: Annotated[float, typer.Option(help="Seconds a message is kept (0: for ever).", callback=non_negative)] = 0.0,
    replicas: Annotated[int | None, typer.Option(
        min=1, max=5, envvar="PRORSA_STREAM_REPLICAS",
        help="Stream replicas: 3 on a three-node cluster (each message stored on 3 servers before it is "
             "acknowledged). Set on creation and on an existing stream; unset: 1 for a new stream, an existing "
             "one keeps its count.")] = None,
    connect_timeout: Annotated[float, typer.Option(help="Seconds to wait for the bus.", callback=positive)] = 30.0,
) -> None:
    """Create the JetStream stream, or repair it (the admin step; services only check it).

    Logs in with PRORSA_NATS_USER / PRORSA_NATS_PASSWORD (or _TOKEN / _CREDS) from the
    environment: the admin user of deploy/nats/accounts.conf. Safe to run again: an
    existing stream keeps its messages.
    """
    import asyncio

    from prorsa_runtime.bus import BusAuthError, BusUnavailable, Credentials, StreamMissing

    from .natssetup import StreamSetupError, setup_stream

    ns = namespace(prefix, stream)
    try:
        line = asyncio.run(setup_stream(nats_url, ns, Credentials.from_env(), duplicate_window_s=duplicate_window,
                                        max_age_s=max_age, replicas=replicas, timeout=connect_timeout))
    except (BusAuthError, BusUnavailable, StreamMissing, StreamSetupError) as exc:
        fail(str(exc), 1)
    out.print(line, highlight=False, soft_wrap=True)


@app.command("validate")
def validate_cmd(
    log: Annotated[Path, typer.Argument(help="Event log (.jsonl or .jsonl.gz).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON summary.")] = False,
    max_line_bytes: Annotated[int, typer.Option(help="Longest acceptable line.", min=1)] = 1 << 20,
    quiet: Annotated[bool, typer.Option("-q", help="Do not list invalid lines.")] = False,
    strict: Annotated[bool, typer.Option("--strict", help="Also report fields an event's type does not name "
                                         "(accepted and kept otherwise: the contract's forward compatibility).")] = False,
) -> None:
    """Check every event of a log against the contract; exit 1 if any is invalid.

    Prints one line per invalid event (line number and reason). Out-of-order events (a
    ``ts`` earlier than the line before) break the contract's ordering rule and count as
    invalid too.
    """
    from prorsa_schemas import read_log

    if not log.exists():
        fail(f"no such file: {log}")
    counts: Counter[str] = Counter()
    valid = invalid = 0
    last_ts = float("-inf")
    try:
        for line in read_log(log, max_line_bytes=max_line_bytes, strict_fields=strict):
            if line.event is not None and line.event.ts < last_ts:
                invalid += 1
                if not quiet and not as_json:
                    out.print(
                        f"{log}:{line.lineno}: field 'ts': value {line.event.ts} is earlier than "
                        f"the previous event's {last_ts} (a log is ordered by ts)",
                        highlight=False, soft_wrap=True,
                    )
                continue
            if line.event is not None:
                valid += 1
                last_ts = line.event.ts
                counts[line.event.type] += 1
            else:
                invalid += 1
                if not quiet and not as_json:
                    out.print(f"{log}:{line.lineno}: {line.error.reason}", highlight=False, soft_wrap=True)
    except OSError as exc:
        fail(f"cannot read {log}: {exc}")
    if as_json:
        out.print_json(
            json.dumps(
                {"events": valid + invalid, "valid": valid, "invalid": invalid, "by_type": dict(sorted(counts.items()))}
            )
        )
    else:
        console.print(f"{valid + invalid} events: {valid} valid, {invalid} invalid")
    raise typer.Exit(1 if invalid else 0)


@app.command("publish")
def publish_cmd(
    log: Annotated[Path, typer.Argument(help="Event log (.jsonl or .jsonl.gz).")],
    nats_url: NatsOpt = DEFAULT_NATS,
    speed: Annotated[
        Optional[float], typer.Option(help="Pace at X times the event-time rate (default: as fast as possible).", callback=positive)
    ] = None,
    prefix: PrefixOpt = "prorsa",
    stream: StreamOpt = "PRORSA",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the last acks.", callback=positive)] = 120.0,
    connect_timeout: Annotated[float, typer.Option(help="Seconds to wait for the bus (a server that is starting).", callback=positive)] = CONNECT_TIMEOUT_S,
) -> None:
    """Publish a log's events to the bus, byte for byte, with de-duplication by event id.

    Invalid lines are reported and skipped (exit code 1 at the end); every valid event is
    published. Re-running the command within the stream's duplicate window stores nothing
    twice.
    """
    import asyncio

    from .publishing import publish_log

    if not log.exists():
        fail(f"no such file: {log}")
    ns = namespace(prefix, stream)
    try:
        result = asyncio.run(
            publish_log(log, nats_url, ns, speed=speed, timeout=timeout, connect_timeout=connect_timeout)
        )
    except Exception as exc:  # connection, timeout: say it plainly
        fail(f"publish failed: {exc}", 1)
    console.print(
        f"published {result.published} events to {nats_url} (stream {stream}); "
        f"{result.invalid} invalid lines skipped; {result.duplicates} already in the stream"
    )
    raise typer.Exit(1 if result.invalid else 0)


@app.command("replay")
def replay_cmd(
    log: Annotated[Path, typer.Argument(help="Event log (.jsonl or .jsonl.gz), e.g. from `prorsa export`.")],
    nats_url: NatsOpt = DEFAULT_NATS,
    speed: Annotated[float, typer.Option(help="X times the event-time pace (1.0: as recorded).", callback=positive)] = 1.0,
    fast: Annotated[bool, typer.Option("--fast", help="Ignore event time; publish as fast as possible.")] = False,
    prefix: PrefixOpt = "prorsa",
    stream: StreamOpt = "PRORSA",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the last acks.", callback=positive)] = 120.0,
    connect_timeout: Annotated[float, typer.Option(help="Seconds to wait for the bus (a server that is starting).", callback=positive)] = CONNECT_TIMEOUT_S,
) -> None:
    """Re-publish a log at its recorded pace so live services can be debugged against it.

    Point it at a separate namespace (--prefix/--stream) or a fresh bus: re-sent event ids
    that the stream saw within its duplicate window are dropped by design.
    """
    publish_cmd(log, nats_url, None if fast else speed, prefix, stream, timeout, connect_timeout)


def _register_plugins() -> None:
    for name in PLUGINS:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue  # that package is not installed on this host (e.g. an agent-only image)
            raise
        register = getattr(mod, "register", None)
        if register is not None:
            register(app)


_register_plugins()
reflow_help(app)


def main() -> None:
    try:
        app()
    except OSError as exc:
        # What no command checked for itself (a path under /proc, a folder where a file goes,
        # a disk that is full): one line naming the path and the reason, not a traceback.
        import sys

        from prorsa_runtime.cli import console
        from prorsa_runtime.redact import mask_secrets

        what = f"{exc.strerror}: {exc.filename}" if exc.strerror and exc.filename else str(exc) or type(exc).__name__
        console.print(f"error: {mask_secrets(what)}", highlight=False, soft_wrap=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
