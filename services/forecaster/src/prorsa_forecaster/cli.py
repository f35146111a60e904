"""`prorsa forecast-eval` and `prorsa forecaster run` (heavy imports inside the commands)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from prorsa_schemas.events import DEFAULT_WINDOW_S


def _fail(message: str, code: int = 2):
    from prorsa_runtime.cli import fail

    fail(message, code)


def forecast_eval(
    log: Annotated[Path, typer.Argument(help="Contract event log (.jsonl or .jsonl.gz).")],
    horizon: Annotated[float, typer.Option("--horizon", help="Window length S in seconds.")] = DEFAULT_WINDOW_S,
    as_json: Annotated[bool, typer.Option("--json", help="Print the JSON report.")] = False,
    windows_csv: Annotated[
        Optional[Path], typer.Option("--windows", help="Also write every window (t, forecast, actual) as CSV.")
    ] = None,
    option: Annotated[
        Optional[list[str]],
        typer.Option(
            "--option", "-o",
            help="Override a ForecastConfig field, KEY=VALUE (repeatable), e.g. -o bias_half_life=0 "
            "-o bias_prior_windows=5: to measure what one part of the forecaster is worth.",
        ),
    ] = None,
) -> None:
    """Replay a log through the tracker core and the forecaster; report WAPE beside baselines.

    Each window's forecast uses only the events before its start. Actuals and WAPE follow
    EVENTS.md ("What a forecast is measured against"). Baselines (last value, EMA, Kalman)
    predict each window from the actuals of earlier windows.
    """
    from prorsa_runtime.cli import console, out

    from .config import ForecastConfig
    from .evaluate import evaluate_log
    from .core import COMPONENTS
    from .windows import SOURCES

    overrides = parse_options(option or [])
    try:
        cfg = ForecastConfig(horizon=horizon, **overrides)
    except ValueError as exc:
        _fail(f"invalid configuration: {exc}")
    if not log.exists():
        _fail(f"no such file: {log}")
    if log.is_dir():
        _fail(f"{log} is a directory, not an event log")
    fh = None
    if windows_csv is not None:
        try:  # before the evaluation, which may take minutes, not after it
            fh = open(windows_csv, "w", newline="")
        except OSError as exc:
            _fail(f"cannot write --windows {windows_csv}: {exc.strerror or exc}")
    try:
        ev = evaluate_log(log, cfg, keep_windows=windows_csv is not None)
    except OSError as exc:
        _fail(f"cannot read {log}: {exc}")
    if ev.events == 0 and ev.invalid:  # (an empty log is an empty report)
        _fail(f"{log} holds no valid event ({ev.invalid} invalid lines"
              f"{'; ' + ev.truncated if ev.truncated else ''}): `prorsa validate {log}` lists them", code=1)
    report = ev.report()
    if fh is not None:
        with fh:
            out_csv = csv.writer(fh)
            out_csv.writerow(
                ["t", "prefill_forecast", "prefill_actual", "decode_forecast", "decode_actual", *COMPONENTS, "bias",
                 "decode_known_forecast", "decode_known_actual", "decode_bias", "share_factor",
                 *(f"actual_{name}" for name in SOURCES), "lifecycle_prefill", "lifecycle_decode",
                 "weight_lifecycle_prefill", "weight_lifecycle_decode"]
            )
            for w in ev.windows:
                f = w.forecast
                tokens = [f.prefill_tokens, w.prefill_actual, f.decode_admit_tokens, w.decode_actual]
                tokens += [f.components.get(name, 0.0) for name in COMPONENTS]
                tokens += [f.bias, f.raw_decode_known, w.decode_known, f.decode_bias]
                actual = (f"{w.sources.get(name, 0.0):.0f}" for name in SOURCES)
                weights = (sum(v for k, v in f.weights.get(series, {}).items() if k.startswith("lifecycle"))
                           for series in ("prefill", "decode"))
                out_csv.writerow([w.t, *(f"{v:.0f}" for v in tokens), f"{f.share_factor:.4f}", *actual,
                                  f"{f.model_prefill:.0f}", f"{f.model_decode:.0f}", *(f"{v:.4f}" for v in weights)])
    if as_json:
        out.print(json.dumps(report), highlight=False, soft_wrap=True)
        return
    _print_table(report, console, out)


def parse_options(items: list[str]) -> dict:
    """``KEY=VALUE`` strings into ForecastConfig overrides, typed by the field's default."""
    import dataclasses

    from .config import ForecastConfig

    fields = {f.name: f for f in dataclasses.fields(ForecastConfig) if f.name != "horizon"}
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            _fail(f"--option {item!r}: expected KEY=VALUE")
        if key not in fields:
            _fail(f"--option {item!r}: unknown field {key!r}; one of: {', '.join(sorted(fields))}")
        if key in out:
            _fail(f"--option {item!r}: {key} is set twice")
        default = fields[key].default
        raw = raw.strip()
        try:
            if isinstance(default, bool):
                low = raw.lower()
                if low not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                    raise ValueError("expected true or false")
                value = low in ("true", "1", "yes", "on")
            elif isinstance(default, int):
                value = int(raw)
            elif raw.lower() == "none" and "None" in str(fields[key].type):
                value = None
            elif isinstance(default, float):
                value = float(raw)
            else:
                value = raw
        except ValueError as exc:
            _fail(f"--option {item!r}: {exc}")
        out[key] = value
    return out


def _print_table(report: dict, console, out) -> None:
    from rich.table import Table

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:.1f}%"

    table = Table(title=f"forecast-eval: {report['windows']} windows of {report['horizon']:g} s")
    names = list(report["prefill"]["baselines"])
    table.add_column("series")
    table.add_column("prorsa WAPE", justify="right", no_wrap=True)
    for n in names:
        table.add_column(n, justify="right")
    table.add_column("noise floor", justify="right")
    table.add_column("vs best", justify="right")
    table.caption = "vs best: WAPE points over the best baseline's, ± 2 standard errors"

    def gap(r: dict) -> str:
        g = r.get("vs_best_naive")
        return "-" if g is None else f"{100 * g['excess']:+.1f}±{200 * g['se']:.1f}"

    rows = [("prefill", report["prefill"]), ("  lifecycle alone", {"wape": report["prefill"]["lifecycle_wape"]}),
            ("prefill arrivals (no backlog)", report["prefill"].get("arrivals")),
            ("decode", report["decode"]), ("  lifecycle alone", {"wape": report["decode"]["lifecycle_wape"]})]
    for series, r in rows:
        if r is not None:
            table.add_row(series, pct(r["wape"]), *(pct(r["baselines"][n]) if "baselines" in r else "" for n in names),
                          pct(r.get("noise_floor")) if "noise_floor" in r else "-", gap(r))
    out.print(table)
    comps = Table(title="prefill by source (actual = arrivals attributed by state at t)")
    for col in ("source", "WAPE", "forecast tokens", "actual tokens"):
        comps.add_column(col, justify="right" if col != "source" else "left")
    for name, c in report["prefill"]["components"].items():
        comps.add_row(name, pct(c["wape"]), f"{c['forecast_tokens']:,}", f"{c['actual_tokens']:,}")
    out.print(comps)
    dec = Table(title="decode admissions before the correction: requests known at t / arriving in the window")
    for col in ("part", "WAPE", "forecast tokens", "actual tokens"):
        dec.add_column(col, justify="right" if col != "part" else "left")
    for name, c in report["decode"].get("components", {}).items():
        dec.add_row(name, pct(c["wape"]), f"{c['forecast_tokens']:,}", f"{c['actual_tokens']:,}")
    out.print(dec)
    if report["windows"] == 0:
        partial = report.get("partial_windows", 0)
        console.print("note: no window was scored: " + (
            f"the log's {partial} window(s) end where the log does, cut short" if partial
            else "the log holds no event") + f"; a window is {report['horizon']:g} s (--horizon)")
    if report.get("truncated"):
        console.print(f"warning: the log ends early ({report['truncated']}): the figures cover what came before it")
    if report["invalid_lines"] or report["ignored_events"] or report["out_of_order"]:
        console.print(
            f"{report['invalid_lines']} invalid lines skipped, {report['ignored_events']} events ignored "
            f"(duplicates / illegal transitions), {report['out_of_order']} out of order"
        )


def forecaster_run(
    horizon: Annotated[Optional[float], typer.Option(help="Window length S (env PRORSA_FORECASTER_HORIZON).")] = None,
    metrics_port: Annotated[Optional[int], typer.Option(help="Prometheus /metrics port.")] = None,
) -> None:
    """Run the forecaster service (settings from PRORSA_FORECASTER_* / PRORSA_NATS_URL)."""
    import asyncio
    import functools

    from pydantic import ValidationError

    from prorsa_runtime.lifecycle import run_until_stopped
    from prorsa_runtime.logs import setup_logging

    from .service import main
    from .settings import ForecasterSettings

    overrides = {k: v for k, v in {"horizon": horizon, "metrics_port": metrics_port}.items() if v is not None}
    try:
        settings = ForecasterSettings(**overrides)
    except ValidationError as exc:
        _fail(f"invalid forecaster settings: {exc}")
    setup_logging(settings.log_level, settings.log_json, "forecaster")
    try:
        asyncio.run(run_until_stopped(functools.partial(main, settings=settings), "forecaster"))
    except KeyboardInterrupt:  # pragma: no cover
        pass
    except Exception as exc:  # connection refused, auth: a clear message, no traceback
        _fail(f"forecaster: {exc}", 1)


def register(app: typer.Typer) -> None:
    """Add `forecast-eval` and the `forecaster` group to the `prorsa` app."""
    app.command("forecast-eval")(forecast_eval)
    group = typer.Typer(help="The forecaster service (Appendix B).", no_args_is_help=True)
    group.command("run")(forecaster_run)
    app.add_typer(group, name="forecaster")
