"""CLI: ``prorsa engine-agent run``, ``prorsa switch`` and ``prorsa emulated up``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from prorsa_runtime.cli import StopSignals, positive

NATS_DEFAULT = "nats://127.0.0.1:4222"


def register(app: typer.Typer) -> None:
    """Add the engine agent's commands to the ``prorsa`` app."""
    agent = typer.Typer(help="The engine agent (one per GPU server).", no_args_is_help=True)
    app.add_typer(agent, name="engine-agent")
    emulated = typer.Typer(help="Emulated SGLang engines and router (no GPUs).", no_args_is_help=True)
    app.add_typer(emulated, name="emulated")

    @agent.command("run")
    def run_cmd(
        config: Annotated[Path, typer.Option("--config", "-c", help="Instances file (TOML or YAML).")],
        nats: Annotated[Optional[str], typer.Option("--nats", help="NATS URL (env PRORSA_NATS_URL).")] = None,
        stop_engines: Annotated[bool, typer.Option("--stop-engines-on-exit",
                                                   help="Stop launched engines when the agent stops.")] = False,
    ) -> None:
        """Run the agent: launch/adopt instances, register them, execute switch commands."""
        from .service import run_agent

        raise typer.Exit(run_agent(config, nats, stop_engines))

    @app.command("switch")
    def switch_cmd(
        engine: Annotated[str, typer.Argument(help="Engine id.")],
        to: Annotated[str, typer.Option("--to", help="prefill or decode.")],
        nats: Annotated[str, typer.Option("--nats", envvar="PRORSA_NATS_URL", help="NATS URL.")] = NATS_DEFAULT,
        deadline: Annotated[float, typer.Option(help="Seconds the agent has to finish.", callback=positive)] = 600.0,
        timeout: Annotated[Optional[float], typer.Option(help="Seconds to wait for the outcome.", callback=positive)] = None,
        prefix: Annotated[str, typer.Option(envvar="PRORSA_SUBJECT_PREFIX")] = "prorsa",
        stream: Annotated[str, typer.Option(envvar="PRORSA_STREAM")] = "PRORSA",
        run: Annotated[str, typer.Option(help="Run id of the command event.")] = "cli",
    ) -> None:
        """Ask an engine to switch role; print the outcome; exit 1 on failure, 3 on timeout."""
        import asyncio

        from prorsa_schemas import Namespace

        from .switch_cmd import request_switch

        if to not in ("prefill", "decode"):
            _fail(f"--to must be prefill or decode, got {to!r}")
        try:
            ns = Namespace(prefix=prefix, stream=stream)
        except ValueError as exc:
            _fail(str(exc))
        show = lambda ev: typer.echo(f"{ev.type}: {ev.model_dump_json(exclude_none=True)}", err=True)  # noqa: E731
        try:
            out = asyncio.run(request_switch(nats, ns, engine, to, run=run, deadline_s=deadline,
                                             timeout=timeout if timeout is not None else deadline + 60,
                                             on_progress=show))
        except Exception as exc:  # bus unreachable, bad id: say it plainly
            _fail(f"switch request failed: {exc}")
        if out.event is None:
            typer.echo(f"no outcome for the switch of {engine} within the timeout", err=True)
            raise typer.Exit(3)
        typer.echo(out.event.model_dump_json(exclude_none=True))
        raise typer.Exit(0 if out.event.type == "engine.switched" else 1)

    @emulated.command("up")
    def emulated_up(
        n: Annotated[int, typer.Option("-n", help="Number of engines.")] = 2,
        prefill: Annotated[Optional[int], typer.Option(help="How many start as prefill (default n/2).")] = None,
        speed: Annotated[float, typer.Option(help="Emulated seconds per wall second.", callback=positive)] = 1.0,
        register_workers: Annotated[bool, typer.Option("--register", help="Register engines with the router.")] = False,
        log_dir: Annotated[Path, typer.Option(help="Where process logs go.")] = Path(".prorsa/emulated"),
        no_switch: Annotated[bool, typer.Option("--no-switch", help="Without --enable-pd-role-switch.")] = False,
    ) -> None:
        """Launch N emulated SGLang engines and a router as local processes (Ctrl-C stops)."""
        try:
            from prorsa_emulated import EmulatedCluster
        except ImportError:
            _fail("the emulated cluster needs the prorsa-emulated package (not installed on this host: "
                  "pip install 'prorsa-engine-agent[emulated]')")
        if n < 1:
            _fail("-n must be >= 1")
        k = n // 2 if prefill is None else prefill
        if not 0 <= k <= n:
            _fail("--prefill must be between 0 and -n")
        roles = ["prefill"] * k + ["decode"] * (n - k)
        cluster = EmulatedCluster(roles, speed=speed, switch=not no_switch, log_dir=log_dir)
        try:
            cluster.start(register=register_workers)
        except (RuntimeError, TimeoutError) as exc:
            cluster.stop()
            _fail(str(exc))
        assert cluster.router is not None
        typer.echo(f"router {cluster.router.url}")
        for p, role in zip(cluster.engines, roles):
            typer.echo(f"{p.name} {p.url} {role}")
        stop = StopSignals()
        while not stop.wait(0.5):
            if not all(p.running() for p in [cluster.router, *cluster.engines]):
                typer.echo("an emulated process exited; stopping", err=True)
                break
        cluster.stop()


def _fail(message: str, code: int = 2):
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)
