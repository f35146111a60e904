"""`prorsa tracker run|load|api`; the query commands (`prorsa export`, `history`,
`trajectories`, `runs`) are in :mod:`.cli_query`. Heavy imports stay inside the commands so
`prorsa --help` stays fast."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .cli_query import DbOpt, engine as _engine, fail as _fail, shown as _shown
from .cli_query import register as register_queries


def register(app: typer.Typer) -> None:
    tracker = typer.Typer(help="The tracker: durable trajectory log and history.", no_args_is_help=True)
    app.add_typer(tracker, name="tracker")

    @tracker.command("run")
    def run_cmd(
        db: Annotated[Optional[str], typer.Option("--db", help="Database URL (default: env PRORSA_TRACKER_DB_URL or sqlite).")] = None,
        nats: Annotated[Optional[str], typer.Option("--nats", help="NATS URL (default: env PRORSA_NATS_URL).")] = None,
        http_port: Annotated[Optional[int], typer.Option(help="Serve the query API on this port.")] = None,
        clock: Annotated[Optional[str], typer.Option(help="'wall' (production heartbeat) or 'event' (replay).")] = None,
    ) -> None:
        """Run the tracker service (settings from PRORSA_TRACKER_* env vars; options override)."""
        import asyncio

        from pydantic import ValidationError

        from prorsa_runtime.lifecycle import run_until_stopped
        from prorsa_runtime.logs import setup_logging

        from .service import Tracker
        from .settings import TrackerSettings

        from prorsa_runtime import BusAuthError, BusUnavailable
        from prorsa_runtime.redact import mask_secrets

        from .db import DatabaseUnusable, DatabaseUrlError, normalize_url

        over = {k: v for k, v in {"db_url": db, "nats_url": nats, "http_port": http_port, "clock": clock}.items() if v is not None}
        try:
            s = TrackerSettings(**over)
        except ValidationError as exc:
            _fail(f"bad tracker settings: {mask_secrets(str(exc))}")
        if s.http_port is not None and s.api_token is None:
            _fail("the query API needs a token: set PRORSA_TRACKER_API_TOKEN")
        try:
            normalize_url(s.db_url)  # a malformed URL or an unsupported backend: say so before starting
        except DatabaseUrlError as exc:
            _fail(str(exc))
        setup_logging(s.log_level, s.log_json, "tracker")
        tr = Tracker(s)
        if s.metrics_port is not None:  # Prometheus /metrics and /health (PRORSA_TRACKER_METRICS_PORT)
            from prorsa_runtime.metrics import serve_metrics

            from .metrics import tracker_health, tracker_registry

            try:
                serve_metrics(tracker_registry(tr), s.metrics_port, tracker_health(tr))
            except OSError as exc:
                _fail(f"cannot serve metrics on port {s.metrics_port}: {exc}")
        try:
            asyncio.run(run_until_stopped(lambda stack, stop: tr.run(stop), "tracker"))
        except (DatabaseUnusable, DatabaseUrlError) as exc:  # retrying cannot help: stop, say why
            _fail(str(exc), 1)
        except (BusUnavailable, BusAuthError) as exc:
            _fail(str(exc), 1)

    @tracker.command("load")
    def load_cmd(log: Annotated[Path, typer.Argument(help="Event log (.jsonl / .jsonl.gz).")], db: DbOpt,
                 batch: Annotated[int, typer.Option(help="Lines per transaction.", min=1)] = 5000) -> None:
        """Bulk-apply a log into a database offline (resumable: re-run to continue).

        A line that is not applied (invalid, or an id already loaded with other content) is
        reported with its line number and recorded in the anomalies table; the load goes on.
        Exits 1 when the log ends early (a truncated or corrupt gzip stream: what came before
        is loaded) or when no new line of it was a valid event.
        """
        from rich.progress import Progress

        from prorsa_runtime.cli import console

        from sqlalchemy.exc import DBAPIError

        from .db import error_line, migrate
        from .tools import load

        if not log.exists():
            _fail(f"no such log file: {log}")
        if log.is_dir():
            _fail(f"{log} is a directory, not an event log")
        eng = _engine(db, must_exist=False)
        try:
            migrate(eng)
        except Exception as exc:
            _fail(f"cannot prepare {_shown(db)}: {error_line(exc)}")
        size = log.stat().st_size
        try:
            with Progress(console=console, transient=True) as prog:
                task = prog.add_task(f"loading {log.name}", total=None if log.name.endswith(".gz") else max(1, size // 200))
                counts = load(eng, log, batch_size=batch, progress=lambda n: prog.advance(task, n),
                              rejected=lambda lineno, reason: console.print(f"{log}:{lineno}: {reason}",
                                                                            highlight=False, markup=False,
                                                                            soft_wrap=True))
        except DBAPIError as exc:  # the database went away mid-load: what is committed stays; re-run to resume
            _fail(f"loading {log} into {_shown(db)} stopped: {error_line(exc)} (re-run to continue)", 1)
        except OSError as exc:
            _fail(f"cannot read {log}: {exc}", 1)
        console.print(f"loaded {log}: {counts['events']} events, {counts['anomalies']} anomalies, "
                      f"{counts['duplicates']} duplicates, {counts['skipped']} lines already loaded", soft_wrap=True)
        if counts["truncated"]:
            _fail(f"{log} ends early ({counts['truncated']}): the events before it are loaded; "
                  "re-run the load on the whole log to continue from there", 1)
        fresh = counts["lines"] - counts["skipped"]
        if fresh > 0 and counts["events"] == 0 and counts["duplicates"] == 0:
            _fail(f"no line of {log} is a valid event ({fresh} lines, listed above and kept as "
                  "anomalies): is it an event log? `prorsa validate` checks one", 1)

    @tracker.command("api")
    def api_cmd(db: DbOpt, port: Annotated[int, typer.Option(help="Port.", min=1, max=65535)] = 8470,
                host: Annotated[str, typer.Option(help="Bind address.")] = "127.0.0.1",
                token: Annotated[Optional[str], typer.Option(envvar="PRORSA_TRACKER_API_TOKEN", help="Bearer token.")] = None,
                no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve without a token (local use).")] = False) -> None:
        """Serve the read-only query API (OpenAPI at /docs)."""
        import uvicorn

        from .api import create_app

        if token is None and not no_auth:
            _fail("set --token / PRORSA_TRACKER_API_TOKEN, or pass --no-auth for local use")
        _engine(db)
        uvicorn.run(create_app(db, token), host=host, port=port, log_level="warning")

    register_queries(app)
