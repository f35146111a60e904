"""`prorsa allocator ...`: run the service, solve one allocation, show the settings."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer

from prorsa_runtime.cli import non_negative, positive

from prorsa_schemas.events import DEFAULT_WINDOW_S

allocator_app = typer.Typer(help="Forecast-driven prefill/decode allocation and role switching (paper §4.2).",
                            no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``allocator`` command group to the ``prorsa`` app."""
    app.add_typer(allocator_app, name="allocator")


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@allocator_app.command("run")
def run_cmd(
    nats_url: Annotated[Optional[str], typer.Option("--nats", help="NATS URL (default: PRORSA_NATS_URL or settings).")] = None,
    prefix: Annotated[Optional[str], typer.Option("--prefix", help="Subject prefix.")] = None,
    stream: Annotated[Optional[str], typer.Option("--stream", help="JetStream stream name.")] = None,
) -> None:
    """Run the allocator service until SIGINT/SIGTERM. Settings: PRORSA_ALLOCATOR_* (see `config`)."""
    from pydantic import ValidationError

    from prorsa_runtime.lifecycle import run_service
    from prorsa_runtime.logs import setup_logging

    from .service import AllocatorService
    from .settings import AllocatorSettings

    overrides = {k: v for k, v in {"nats_url": nats_url, "subject_prefix": prefix, "stream": stream}.items() if v}
    try:
        settings = AllocatorSettings(**overrides)
        settings.namespace()
    except (ValidationError, ValueError) as exc:
        _fail(f"invalid allocator settings: {exc}")
    setup_logging(settings.log_level, settings.log_json, "allocator")
    service = AllocatorService(settings)
    if settings.metrics_port is not None:
        from prorsa_runtime.metrics import serve_metrics

        from .metrics import allocator_registry

        try:
            serve_metrics(allocator_registry(service.state), settings.metrics_port, service.state.health)
        except OSError as exc:
            _fail(f"cannot serve metrics on port {settings.metrics_port}: {exc}")
    run_service(service.run, "allocator")


@allocator_app.command("solve")
def solve_cmd(
    prefill_tokens: Annotated[float, typer.Option(help="Ŵᴾ: prompt tokens to prefill in the window.", callback=non_negative)],
    decode_kv_tokens: Annotated[float, typer.Option(help="Kᴰ + K̂ᴰ: decode KV tokens now plus admitted.", callback=non_negative)],
    gpus: Annotated[int, typer.Option(help="G: the GPU budget.", min=1, max=1_000_000)],
    horizon: Annotated[float, typer.Option(help="S: window length, seconds.", callback=positive)] = DEFAULT_WINDOW_S,
    theta: Annotated[float, typer.Option(help="θᴾ: full-prompt tokens/s per prefill instance.", callback=positive)] = 40_000.0,
    kv_capacity: Annotated[float, typer.Option(help="C_KVᴰ: KV tokens per decode instance.", callback=positive)] = 1_000_000.0,
    gpus_prefill: Annotated[int, typer.Option(help="mᴾ: GPUs per prefill instance.")] = 8,
    gpus_decode: Annotated[int, typer.Option(help="mᴰ: GPUs per decode instance.")] = 8,
) -> None:
    """Solve the §4.2 allocation for one window's numbers and print it as JSON."""
    from .optimize import Capacity, Demand, solve

    try:
        alloc = solve(Demand(prefill_tokens, horizon, decode_kv_tokens),
                      Capacity(theta, kv_capacity, gpus_prefill, gpus_decode, gpus))
    except ValueError as exc:
        _fail(str(exc))
    typer.echo(json.dumps({f: getattr(alloc, f) for f in alloc.__dataclass_fields__}))


@allocator_app.command("config")
def config_cmd() -> None:
    """Print the settings' JSON schema (every PRORSA_ALLOCATOR_* variable, default and bound)."""
    from .settings import AllocatorSettings

    typer.echo(json.dumps(AllocatorSettings.model_json_schema(), indent=2))
