"""`prorsa tracker run|load|api`, `prorsa export`, `prorsa history`, `prorsa trajectories`,
`prorsa runs`. Heavy imports stay inside the commands so `prorsa --help` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

DbOpt = Annotated[str, typer.Option("--db", envvar="PRORSA_TRACKER_DB_URL", help="Database URL (sqlite:///f.db or postgresql://...).")]
RunOpt = Annotated[str, typer.Option("--run", help="Run id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]


def _fail(msg: str, code: int = 2):
    from prorsa_cli.common import fail

    fail(msg, code)


def _shown(db: str) -> str:
    from .db import shown_url

    return shown_url(db)


def _engine(db: str, must_exist: bool = True):
    from sqlalchemy import inspect

    from .db import DatabaseUrlError, error_line, make_engine

    try:
        eng = make_engine(db)
    except DatabaseUrlError as exc:
        _fail(str(exc))
    if must_exist:
        try:
            if not inspect(eng).has_table("events"):
                _fail(f"{_shown(db)} is not a tracker database (no 'events' table): run `prorsa tracker load` or the tracker first")
        except Exception as exc:  # unreachable server, bad file
            _fail(f"cannot open {_shown(db)}: {error_line(exc)}")
    return eng


def _print_table(rows: list[dict], columns: list[str], title: str) -> None:
    from rich.table import Table

    from prorsa_cli.common import out

    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*["" if r.get(c) is None else str(r.get(c)) for c in columns])
    out.print(t)


def _dump(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


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
                 batch: Annotated[int, typer.Option(help="Lines per transaction.")] = 5000) -> None:
        """Bulk-apply a log into a database offline (resumable: re-run to continue).

        A line that is not applied (invalid, or an id already loaded with other content) is
        reported with its line number and recorded in the anomalies table; the load goes on.
        """
        from rich.progress import Progress

        from prorsa_cli.common import console

        from sqlalchemy.exc import DBAPIError

        from .db import error_line, migrate
        from .tools import load

        if not log.exists() or log.is_dir():
            _fail(f"no such log file: {log}")
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

    @tracker.command("api")
    def api_cmd(db: DbOpt, port: Annotated[int, typer.Option(help="Port.")] = 8470,
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

    @app.command("export")
    def export_cmd(run: RunOpt, db: DbOpt, output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Log to write (.jsonl or .jsonl.gz); default stdout.")] = None) -> None:
        """Write a run's events back as a contract log (exact bytes, ordered by ts), with the
        engine events of other runs that its engine events need (their registrations), so
        that the export loads without anomalies."""
        import sys

        from .queries import count_events
        from .tools import engine_context, export, export_events

        eng = _engine(db)
        if count_events(eng, run) == 0:
            _fail(f"run {run!r} has no events in {_shown(db)}")
        if output is None:
            ctx = engine_context(eng, run)
            for raw in export_events(eng, run, ctx):
                sys.stdout.buffer.write(raw + b"\n")
            n_ctx = len(ctx)
        else:
            n, n_ctx = export(eng, run, output)
            typer.echo(f"exported {n} events of run {run} to {output}", err=True)
        if n_ctx:
            typer.echo(f"({n_ctx} of them engine events of other runs that the run's engine events need)", err=True)

    @app.command("history")
    def history_cmd(traj: Annotated[str, typer.Argument(help="Trajectory id.")], run: RunOpt, db: DbOpt, as_json: JsonOpt = False) -> None:
        """A trajectory's full timeline: states, requests (tokens, latencies), tool and reward spans."""
        from .queries import QueryError, history

        try:
            h = history(_engine(db), run, traj)
        except QueryError as exc:
            _fail(str(exc), 1)
        if as_json:
            _dump(h)
            return
        tr = h["trajectory"]
        typer.echo(f"trajectory {traj} (run {run}): {tr['state']}, {tr['turns']} turns, {tr['context_tokens']} context tokens")
        _print_table(h["timeline"], ["ts", "event", "from", "to", "context_tokens", "req"], "states")
        _print_table(h["requests"], ["req", "turn", "prompt_tokens", "cached_tokens", "output_tokens", "queued_ts", "queue_s", "ttft_s", "decode_s", "finish", "engine", "decode_engine"], "requests")
        _print_table(h["spans"], ["kind", "start_ts", "end_ts", "mode", "ok", "tokens", "reward"], "spans")
        if h["anomalies"]:
            _print_table(h["anomalies"], ["ts", "type", "reason"], "anomalies")

    @app.command("trajectories")
    def trajectories_cmd(
        run: RunOpt, db: DbOpt,
        state: Annotated[Optional[str], typer.Option(help="State filter (or 'live').")] = None,
        since: Annotated[Optional[float], typer.Option(help="Alive at or after this ts.")] = None,
        until: Annotated[Optional[float], typer.Option(help="Dispatched at or before this ts.")] = None,
        limit: Annotated[int, typer.Option(help="Rows per page.")] = 100,
        offset: Annotated[int, typer.Option(help="Rows to skip.")] = 0,
        as_json: JsonOpt = False,
    ) -> None:
        """List a run's trajectories by state and time range."""
        from .queries import QueryError, trajectories

        try:
            rows = trajectories(_engine(db), run, state, since, until, limit, offset)
        except QueryError as exc:
            _fail(str(exc))
        if as_json:
            _dump(rows)
        else:
            _print_table(rows, ["traj", "state", "state_ts", "dispatched_ts", "ended_ts", "turns", "context_tokens", "group", "admitted"], f"trajectories of {run}")

    @app.command("runs")
    def runs_cmd(db: DbOpt, as_json: JsonOpt = False) -> None:
        """List the runs in the log with their counters."""
        from .queries import runs

        rows = runs(_engine(db))
        if as_json:
            _dump(rows)
        else:
            _print_table(rows, ["run", "mode", "injection", "dispatched", "live", "done", "dropped", "admitted", "first_ts", "last_ts"], "runs")
