"""`prorsa export`, `prorsa history`, `prorsa trajectories`, `prorsa runs`: the durable log
read by a person. Tables show times in UTC, keep ids whole and fit the terminal (the least
useful columns are left out when it is narrow; `--json` has every field, times as epoch
seconds). Heavy imports stay inside the commands so `prorsa --help` stays fast."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Optional

import typer

from prorsa_runtime.humane import TIME_HELP

DbOpt = Annotated[str, typer.Option("--db", envvar="PRORSA_TRACKER_DB_URL", help="Database URL (sqlite:///f.db or postgresql://...).")]
RunOpt = Annotated[str, typer.Option("--run", help="Run id.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table (times as epoch seconds).")]

PSEUDO_RUN_HELP = ("the labels of events that belong to no rollout run: the engine agent's (`engines` by "
                   "default) and the forecaster's and allocator's output (`prorsa` by default)")


def fail(msg: str, code: int = 2):
    from prorsa_runtime.cli import fail as _fail

    _fail(msg, code)


def shown(db: str) -> str:
    from .db import shown_url

    return shown_url(db)


def _sqlite_file(db: str) -> Path | None:
    """The file a SQLite URL names (None for another backend or an in-memory database)."""
    from sqlalchemy.engine import make_url

    try:
        u = make_url(db)
    except Exception:  # noqa: BLE001 - make_engine reports a malformed URL
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:" or u.database.startswith("file:"):
        return None
    return Path(u.database)


def engine(db: str, must_exist: bool = True):
    """An engine on the tracker database ``db``; with ``must_exist``, exit 1 with one line
    when there is no tracker database there (and never create a file or a folder)."""
    from sqlalchemy import inspect

    from .db import DatabaseUrlError, error_line, make_engine

    path = _sqlite_file(db)
    if must_exist and path is not None:
        if not path.exists():
            fail(f"no tracker database at {path}: the file does not exist (create it with `prorsa tracker load LOG "
                 f"--db {shown(db)}`, or point --db / PRORSA_TRACKER_DB_URL at the tracker's)", 1)
        if not path.is_file():
            fail(f"no tracker database at {path}: it is not a file", 1)
    try:
        eng = make_engine(db)
    except DatabaseUrlError as exc:
        fail(str(exc))
    if must_exist:
        try:
            has = inspect(eng).has_table("events")
        except Exception as exc:  # unreachable server, a file that is no database
            fail(f"cannot open {shown(db)}: {error_line(exc)}", 1)
        if not has:
            fail(f"{shown(db)} is not a tracker database (no 'events' table): run `prorsa tracker load` or the tracker first", 1)
    return eng


def known_runs(eng) -> list[str]:
    from sqlalchemy import select

    from .models import RunRow

    with eng.connect() as conn:
        return list(conn.execute(select(RunRow.run).order_by(RunRow.run)).scalars())


def require_run(eng, db: str, run: str) -> None:
    """Exit 1 with the runs there are when ``run`` is not in the log."""
    names = known_runs(eng)
    if run not in names:
        listed = ", ".join(names[:10]) + (f" (and {len(names) - 10} more)" if len(names) > 10 else "")
        fail(f"no run {run!r} in {shown(db)}; runs: {listed or 'none'} (`prorsa runs --all` lists them)", 1)


def is_rollout_run(row: dict) -> bool:
    """A run of the RL framework: declared by run.started, or with a trajectory dispatched."""
    return bool(row.get("declared")) or (row.get("dispatched") or 0) > 0


def print_table(rows: list[dict], columns: Sequence[str], title: str, *, times: Sequence[str] = (),
                ids: Sequence[str] = (), drop: Sequence[str] = (), ms: bool = False) -> None:
    """A table of ``rows`` that fits the terminal: ``times`` in UTC, ``ids`` never cut or
    wrapped, ``drop`` (least useful first) left out while the table is too wide."""
    from rich.table import Table

    from prorsa_runtime.cli import console, out
    from prorsa_runtime.humane import cell, fit_columns, human_ts

    text = [{c: (human_ts(r.get(c), ms) if c in times else cell(r.get(c))) for c in columns} for r in rows]
    # One date for every time of the table (a trajectory's timeline): say it once, in the header.
    days = {v[:10] for r in text for c in times if (v := r[c])}
    zone = f"UTC {days.pop()}" if ms and len(days) == 1 else "UTC"
    if zone != "UTC":
        text = [{c: (v[11:] if c in times else v) for c, v in r.items()} for r in text]

    def header(c: str) -> str:
        return f"{'time' if c == 'ts' else c.removesuffix('_ts')} ({zone})" if c in times else c

    widths = {c: max([len(header(c))] + [len(t[c]) for t in text]) for c in columns}
    shown_cols = fit_columns(columns, widths, out.width, drop)
    t = Table(title=title)
    for c in shown_cols:
        # Ids and times whole; any other cell folds onto a second line rather than lose characters.
        t.add_column(header(c), no_wrap=c in ids or c in times, overflow="fold",
                     min_width=widths[c] if c in ids or c in times else None)
    for r in text:
        t.add_row(*[r[c] for c in shown_cols])
    out.print(t)
    hidden = [c for c in columns if c not in shown_cols]
    if hidden and rows:
        console.print(f"({len(hidden)} column{'s' if len(hidden) > 1 else ''} left out at this width: {', '.join(hidden)}; "
                      "a wider terminal or --json shows them)", highlight=False, soft_wrap=True)


def dump(obj) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def time_option(text: str | None, name: str) -> float | None:
    import time

    from prorsa_runtime.humane import TimeError, parse_time

    if text is None:
        return None
    try:
        return parse_time(text, time.time())
    except TimeError as exc:
        fail(f"{name}: {exc}")


def register(app: typer.Typer) -> None:
    @app.command("export")
    def export_cmd(run: RunOpt, db: DbOpt, output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Log to write (.jsonl or .jsonl.gz); default stdout.")] = None,
                   with_engines: Annotated[bool, typer.Option("--with-engines", help="Also every engine's events (of any run) while the run was live, with their registrations: the cluster a forecast replay of the run needs.")] = False) -> None:
        """Write a run's events back as a contract log (exact bytes, ordered by ts).

        The export carries the engine events of other runs that its own engine events need
        (their registrations), so that it loads without anomalies; with --with-engines, the
        events of every engine that was live meanwhile too (engine agents publish under
        their own run)."""
        import sys

        from .queries import count_events
        from .tools import engine_context, export, export_events

        eng = engine(db)
        if count_events(eng, run) == 0:
            require_run(eng, db, run)
            fail(f"run {run!r} has no events in {shown(db)}", 1)
        if output is None:
            ctx = engine_context(eng, run, with_engines)
            for raw in export_events(eng, run, ctx):
                sys.stdout.buffer.write(raw + b"\n")
            n_ctx = len(ctx)
        else:
            n, n_ctx = export(eng, run, output, with_engines)
            typer.echo(f"exported {n} events of run {run} to {output}", err=True)
        if n_ctx:
            why = "of the engines live meanwhile" if with_engines else "that the run's engine events need"
            typer.echo(f"({n_ctx} of them engine events of other runs {why})", err=True)

    @app.command("history")
    def history_cmd(traj: Annotated[str, typer.Argument(help="Trajectory id.")], run: RunOpt, db: DbOpt, as_json: JsonOpt = False) -> None:
        """A trajectory's full timeline: states, requests (tokens, latencies), tool and reward spans."""
        from .queries import QueryError, history

        eng = engine(db)
        require_run(eng, db, run)
        try:
            h = history(eng, run, traj)
        except QueryError as exc:
            fail(str(exc), 1)
        if as_json:
            dump(h)
            return
        tr = h["trajectory"]
        typer.echo(f"trajectory {traj} (run {run}): {tr['state']}, {tr['turns']} turns, {tr['context_tokens']} context tokens")
        print_table(h["timeline"], ["ts", "event", "from", "to", "context_tokens", "req"], "states",
                    times=["ts"], ids=["req"], drop=["context_tokens", "from"], ms=True)
        print_table(h["requests"], ["req", "turn", "prompt_tokens", "cached_tokens", "output_tokens", "queued_ts", "queue_s",
                                    "ttft_s", "decode_s", "finish", "engine", "decode_engine"], "requests",
                    times=["queued_ts"], ids=["req"],
                    drop=["cached_tokens", "decode_engine", "engine", "finish", "queued_ts", "turn", "queue_s"], ms=True)
        print_table(h["spans"], ["kind", "start_ts", "end_ts", "mode", "ok", "tokens", "reward"], "spans",
                    times=["start_ts", "end_ts"], drop=["mode", "tokens"], ms=True)
        if h["anomalies"]:
            print_table(h["anomalies"], ["ts", "type", "reason"], "anomalies", times=["ts"], ms=True)

    @app.command("trajectories")
    def trajectories_cmd(
        run: RunOpt, db: DbOpt,
        state: Annotated[Optional[str], typer.Option(help="State filter (or 'live').")] = None,
        since: Annotated[Optional[str], typer.Option(help=f"Alive at or after this time: {TIME_HELP}.")] = None,
        until: Annotated[Optional[str], typer.Option(help=f"Dispatched at or before this time: {TIME_HELP}.")] = None,
        limit: Annotated[int, typer.Option(help="Rows per page.")] = 100,
        offset: Annotated[int, typer.Option(help="Rows to skip.")] = 0,
        as_json: JsonOpt = False,
    ) -> None:
        """List a run's trajectories by state and time range (times in UTC)."""
        from .queries import QueryError, trajectories

        t_since, t_until = time_option(since, "--since"), time_option(until, "--until")
        eng = engine(db)
        require_run(eng, db, run)
        try:
            rows = trajectories(eng, run, state, t_since, t_until, limit, offset)
        except QueryError as exc:
            fail(str(exc))
        if as_json:
            dump(rows)
        else:
            print_table(rows, ["traj", "state", "state_ts", "dispatched_ts", "ended_ts", "turns", "context_tokens", "group",
                               "admitted"], f"trajectories of {run}",
                        times=["state_ts", "dispatched_ts", "ended_ts"], ids=["traj"],
                        drop=["admitted", "group", "state_ts", "context_tokens", "turns", "ended_ts"])

    @app.command("runs")
    def runs_cmd(db: DbOpt, as_json: JsonOpt = False,
                 all_: Annotated[bool, typer.Option("--all", help=f"Also list {PSEUDO_RUN_HELP}.")] = False) -> None:
        """List the rollout runs in the log with their counters (times in UTC)."""
        from .queries import runs

        rows = runs(engine(db))
        if not all_:
            rows = [r for r in rows if is_rollout_run(r)]
        if as_json:
            dump(rows)
        else:
            print_table(rows, ["run", "mode", "injection", "dispatched", "live", "done", "dropped", "admitted", "first_ts",
                               "last_ts"], "runs", times=["first_ts", "last_ts"], ids=["run"],
                        drop=["injection", "admitted", "dropped", "mode", "first_ts", "live"])
