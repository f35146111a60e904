"""The progress bar of a sweep of simulations (``prorsa sim compare``, ``prorsa sim paper``,
``benchmarks/headline_table.py``): one task whose total :func:`runner.run_matrix` sets
(``on_total``) and that advances once per job done or read from the cache (``progress``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class SweepBar:
    progress: Callable[[object], None]
    """Call with each job done (``run_jobs``' ``progress``)."""
    on_total: Callable[[int], None]
    """Call with the number of jobs (``run_matrix``' ``on_total``)."""


@contextmanager
def sweep_bar(console=None, description: str = "simulations", transient: bool = True) -> Iterator[SweepBar]:
    """A rich progress bar on ``console`` (stderr when None): jobs done of the total,
    elapsed and estimated remaining time, the last job's policy and setting."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    console = console or Console(stderr=True, markup=False, emoji=False)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=transient) as bar:
        task = bar.add_task(description, total=None)

        def progress(job) -> None:
            cfg = getattr(job, "cfg", None)
            last = (f" (last: {cfg.model} {cfg.workload}/{cfg.staleness} seed {cfg.seed} {job.spec})"
                    if cfg is not None else "")
            bar.update(task, advance=1, description=description + last)

        yield SweepBar(progress, lambda n: bar.update(task, total=n))
