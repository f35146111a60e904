"""``prorsa sim run`` and ``prorsa sim compare`` (registered into the ``prorsa`` app)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

WorkloadOpt = Annotated[str, typer.Option("--workload", help="math | coding | general")]
ModelOpt = Annotated[str, typer.Option("--model", help="qwen3-235b | deepseek-v3.2 | mimo-v2.5-pro")]
StaleOpt = Annotated[int, typer.Option("--staleness", help="0 = synchronous; 2 or 8 = async bound")]
StepsOpt = Annotated[int, typer.Option("--steps", help="Rollout steps (sync) / policy updates (async).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Workload seed (same seed, same trajectories).")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Trajectories per step.")]
GpusOpt = Annotated[int, typer.Option("--gpus", help="Cluster GPUs (paper: 128).")]


def _config(workload, model, staleness, steps, seed, batch_size, gpus):
    from prorsa_cli.common import fail

    from .simulator import build_config

    try:
        return build_config(
            workload=workload, model=model, staleness=staleness, steps=steps, seed=seed,
            batch_size=batch_size, total_gpus=gpus,
        )
    except (ValueError, TypeError) as exc:
        fail(str(exc))


def _check(cfg):
    from prorsa_cli.common import fail

    from .costmodel import get_profile

    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.staleness < 0:
        fail("--steps and --batch-size must be >= 1 and --staleness >= 0")
    if get_profile(cfg.model).engines_in(cfg.total_gpus) < 2:
        fail(f"--gpus {cfg.total_gpus} holds fewer than two {cfg.model} engines")


def register(app: typer.Typer) -> None:
    """Add the ``sim`` group to the ``prorsa`` app."""
    sim = typer.Typer(help="Discrete-event rollout-cluster simulator.", no_args_is_help=True)
    app.add_typer(sim, name="sim")

    @sim.command("run")
    def run_cmd(
        out: Annotated[Path, typer.Option("--out", help="Output folder.")],
        workload: WorkloadOpt = "coding",
        staleness: StaleOpt = 0,
        model: ModelOpt = "deepseek-v3.2",
        policy: Annotated[str, typer.Option(
            "--policy",
            help="colocation | static | static:P:D | reactive | prorsa | oracle "
            "(switching policies take :in_place or :restart, e.g. prorsa:restart)",
        )] = "colocation",
        steps: StepsOpt = 2,
        seed: SeedOpt = 0,
        batch_size: BatchOpt = 512,
        gpus: GpusOpt = 128,
        no_plot: Annotated[bool, typer.Option("--no-plot", help="Skip timeline.png.")] = False,
    ) -> None:
        """Simulate one policy; write DIR/events.jsonl.gz, summary.json, timeline.png."""
        from prorsa_cli.common import console, fail, out as stdout
        from rich.progress import Progress

        from .policy import make_policy
        from .runner import run_to_dir

        cfg = _config(workload, model, staleness, steps, seed, batch_size, gpus)
        _check(cfg)
        if policy != "static":
            try:
                make_policy(policy)
            except ValueError as exc:
                fail(str(exc))
        if out.exists() and not out.is_dir():
            fail(f"--out {out} exists and is not a folder")
        try:
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task(f"simulating {policy}", total=cfg.steps)
                res = run_to_dir(cfg, policy, out, progress=lambda step, t: bar.update(task, completed=step), plot=not no_plot)
        except ValueError as exc:
            fail(str(exc))
        stdout.print_json(json.dumps({k: v for k, v in res.summary.items() if k != "step_times_s"}))

    @sim.command("compare")
    def compare_cmd(
        workload: WorkloadOpt = "coding",
        staleness: StaleOpt = 0,
        model: ModelOpt = "deepseek-v3.2",
        policies: Annotated[str, typer.Option(
            "--policies",
            help="Comma-separated; the first is the baseline. 'all' = colocation,static,reactive,"
            "prorsa,oracle ('all:restart': the switching ones restart instead of switching in place).",
        )] = "colocation,static",
        steps: StepsOpt = 2,
        seed: SeedOpt = 0,
        batch_size: BatchOpt = 512,
        gpus: GpusOpt = 128,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
    ) -> None:
        """Run several policies on the same seeded workload and print a table."""
        from prorsa_cli.common import console, fail, out as stdout
        from rich.progress import Progress
        from rich.table import Table

        from .policy import expand_policies, make_policy
        from .runner import compare

        cfg = _config(workload, model, staleness, steps, seed, batch_size, gpus)
        _check(cfg)
        specs = expand_policies(policies)
        if not specs:
            fail("--policies is empty")
        for s in specs:
            if s != "static":
                try:
                    make_policy(s)
                except ValueError as exc:
                    fail(str(exc))
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("policies", total=len(specs))
            rows = compare(cfg, specs, progress=lambda _s: bar.advance(task))
        if as_json:
            stdout.print_json(json.dumps(rows))
            return
        table = Table(title=f"{workload} / {model} / staleness {staleness} / {steps} steps / seed {seed}")
        for col in ("policy", "rollout s", "speedup", "traj s", "GPU idle", "imbalance", "unused", "switches", "preempt"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["policy"], f"{r['rollout_time_s']}", f"{r['speedup']}x", f"{r['mean_trajectory_s']}",
                f"{100 * r['gpu_idle_ratio']:.1f}%", f"{100 * r['gpu_imbalance_ratio']:.1f}%",
                f"{100 * r['gpu_unused_ratio']:.1f}%", str(r["switches"]), str(r["preemptions"]),
            )
        stdout.print(table)
