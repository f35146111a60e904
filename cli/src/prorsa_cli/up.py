"""`prorsa up` (the whole system on one machine) and `prorsa demo` (the live demo).

`prorsa up` supervises each service as its own process: a nats-server with JetStream (from
the wheel; or `--nats URL`), the tracker (SQLite by default, `--db URL`), the forecaster, the
allocator and, with `--emulated-cluster`, the router (sglang-router 0.3.2 by default, or
`--router emulated`), engine agents that launch emulated engines, and the rollout driver.
Without it, `--with-router` runs sglang-router for a real cluster's engine agents. Logs go to `<workdir>/logs/`; crashed
services are restarted with back-off, and one that keeps crashing stops everything with exit
code 1; Ctrl-C stops everything (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from prorsa_runtime.settings import NATS_SCHEMES

from prorsa_runtime.cli import console, fail, out, positive

WorkdirOpt = Annotated[Path, typer.Option(help="Where the bus store, the SQLite log, process logs and results go.")]
StalenessOpt = Annotated[int, typer.Option(help="0: synchronous steps; N > 0: asynchronous rollout with at most N "
                                                "policy versions of staleness (the paper's 2 and 8).")]
PauseModeOpt = Annotated[str, typer.Option(help="How a weight sync pauses the engines (SGLang's pause_generation "
                                                "mode): abort (the requests in flight are aborted and re-sent, "
                                                "as slime and AReaL do), retract (their KV is freed and they "
                                                "re-prefill inside the engine) or in_place (they wait and go on).")]


def register(app: typer.Typer) -> None:
    """Add `prorsa up` and `prorsa demo`."""

    @app.command("up")
    def up_cmd(
        workdir: WorkdirOpt = Path(".prorsa/up"),
        nats: Annotated[Optional[str], typer.Option("--nats", help="Use this NATS server instead of starting one.")] = None,
        nats_config: Annotated[Optional[Path], typer.Option(help="nats-server config file (e.g. deploy/nats/accounts.conf).")] = None,
        db: Annotated[Optional[str], typer.Option("--db", help="Tracker database URL (default: SQLite in the workdir).")] = None,
        emulated_cluster: Annotated[bool, typer.Option("--emulated-cluster", help="Also run emulated engines, router and the rollout driver.")] = False,
        router: Annotated[str, typer.Option(help="With --emulated-cluster: sglang (the real sglang-router 0.3.2) or emulated.")] = "sglang",
        with_router: Annotated[bool, typer.Option("--with-router", help="Without --emulated-cluster: also run sglang-router "
                                                                      "(PD mode, no workers; the engine agents add theirs).")] = False,
        router_host: Annotated[Optional[str], typer.Option(help="Address the router listens on (default 127.0.0.1; "
                                                                "a real cluster's engines and agents must reach it).")] = None,
        router_arg: Annotated[Optional[list[str]], typer.Option("--router-arg", help="One more sglang-router flag, "
                                                                "e.g. --router-arg=--policy --router-arg=round_robin (repeatable).")] = None,
        engines: Annotated[int, typer.Option(help="Emulated engines.")] = 6,
        prefill: Annotated[Optional[int], typer.Option(help="Engines that start as prefill (default: a third).")] = None,
        agents: Annotated[int, typer.Option(help="Engine agents the engines are spread over.")] = 2,
        policy: Annotated[str, typer.Option(help="prorsa (switching), advise (PD; the allocator plans and publishes, no engine is switched), static (PD, no allocator) or colocation.")] = "prorsa",
        speed: Annotated[float, typer.Option(help="Simulated seconds per wall second (workload and engines).", callback=positive)] = 10.0,
        workload: Annotated[str, typer.Option(help="math, coding or general.")] = "general",
        batch_size: Annotated[int, typer.Option(help="Trajectories per rollout step.")] = 24,
        steps: Annotated[int, typer.Option(help="Rollout steps.")] = 2,
        staleness: StalenessOpt = 0,
        pause_mode: PauseModeOpt = "abort",
        max_turns: Annotated[int, typer.Option(help="Cap on turns per trajectory.")] = 6,
        seed: Annotated[int, typer.Option(help="Workload seed.", min=0)] = 0,
        emulated_model: Annotated[str, typer.Option(help="Cost-model profile of the emulated engines.")] = "deepseek-v3.2",
        run: Annotated[str, typer.Option(help="Run id of the driver's events.")] = "demo",
        horizon: Annotated[Optional[float], typer.Option(help="Forecast window S in wall seconds (default: 10 s of the "
                                                        "cluster's time, i.e. 10/--speed with --emulated-cluster).",
                                                        callback=positive)] = None,
        port_base: Annotated[Optional[int], typer.Option(help="Put every port in a block from N (0: any free block).")] = None,
        keep_running: Annotated[bool, typer.Option("--keep-running", help="With --emulated-cluster: keep the services up after the run.")] = False,
        fresh: Annotated[bool, typer.Option("--fresh", help="Delete the workdir first.")] = False,
        max_restarts: Annotated[int, typer.Option(help="Restarts in a row (none up for 30 s) after which a crashing "
                                                       "service is given up: everything stops, exit code 1.")] = 5,
    ) -> None:
        """Start the whole system on this machine (Ctrl-C stops it)."""
        from .livedemo import run_up
        from .options import UpOptions

        given = dict(locals())
        given["router_args"] = list(router_arg or [])
        if with_router and emulated_cluster:
            fail("--with-router is for a real cluster; --emulated-cluster starts its own router (see --router)")
        if (router_host or router_arg) and not (with_router or emulated_cluster):
            fail("--router-host and --router-arg need --with-router (or --emulated-cluster)")
        if router_arg and emulated_cluster and router != "sglang":
            fail("--router-arg is for sglang-router (--router sglang)")
        opts = _options(UpOptions, given)
        raise typer.Exit(run_up(opts, keep_running=keep_running, fresh=fresh))

    @app.command("demo")
    def demo_cmd(
        workdir: WorkdirOpt = Path(".prorsa/demo"),
        policy: Annotated[str, typer.Option(help="prorsa (switching), advise (the allocator's plans published, no switch), static or colocation (for comparison).")] = "prorsa",
        speed: Annotated[float, typer.Option(help="Simulated seconds per wall second (5: what two CPU cores keep up with in a synchronous run; see docs/demo.md).", callback=positive)] = 5.0,
        engines: Annotated[int, typer.Option(help="Emulated engines.")] = 4,
        batch_size: Annotated[int, typer.Option(help="Trajectories per rollout step (256: 4 per attention-DP rank of 4 DeepSeek-V3.2 engines, the paper's load per rank).")] = 256,
        steps: Annotated[Optional[int], typer.Option(help="Rollout steps (async: policy updates; default 3 "
                                                          "asynchronous, 2 synchronous).")] = None,
        staleness: Annotated[int, typer.Option(help="2 (the default): asynchronous rollout with at most 2 policy "
                                                    "versions of staleness, as large RL jobs run it; 0: synchronous "
                                                    "steps; the paper's settings are 0, 2 and 8.")] = 2,
        pause_mode: PauseModeOpt = "abort",
        workload: Annotated[str, typer.Option(help="math, coding or general.")] = "general",
        max_turns: Annotated[int, typer.Option(help="Cap on turns per trajectory.")] = 6,
        seed: Annotated[int, typer.Option(help="Workload seed (the same seed gives the same trajectories under every policy).")] = 0,
        emulated_model: Annotated[str, typer.Option(help="Cost-model profile of the emulated engines.")] = "deepseek-v3.2",
        port_base: Annotated[Optional[int], typer.Option(help="Put every port in a block from N (0: any free block).")] = 0,
        router: Annotated[str, typer.Option(help="sglang (the real sglang-router 0.3.2) or emulated.")] = "sglang",
        compare: Annotated[bool, typer.Option("--compare", help="Run colocation first, then --policy, and print the PD speedup.")] = False,
    ) -> None:
        """The live demo: `prorsa up --emulated-cluster` on a small scenario, then a summary and a PNG.

        By default an asynchronous rollout (staleness 2) of the general agent on 4 emulated
        DeepSeek-V3.2 engines; `--staleness 0` runs synchronous steps.

        Each policy runs in `<workdir>/<policy>`; when the other policy's run of the same
        scenario (same seed and options) is there, the summary adds the PD/colocation speedup."""
        from .livedemo import run_up
        from .options import UpOptions, demo_steps

        base = dict(locals())
        base["steps"] = demo_steps(steps, staleness)
        if compare and policy == "colocation":
            fail("--compare runs colocation against --policy prorsa, advise or static")
        code = 0
        for pol in (["colocation"] if compare else []) + [policy]:
            other = "prorsa" if pol == "colocation" else "colocation"
            # With --compare the colocation run comes first: the PD run in the workdir, if
            # any, is an earlier invocation's, not the one this colocation run is set against.
            first_of_compare = compare and pol == "colocation"
            opts = _options(UpOptions, {**base, "policy": pol, "emulated_cluster": True, "run": f"demo-{pol}",
                                        "workdir": workdir / pol,
                                        "compare_with": None if first_of_compare else workdir / other})
            code = max(code, run_up(opts, keep_running=False, fresh=True))
        raise typer.Exit(code)


def _options(cls, given: dict):
    policy = given.get("policy", "prorsa")
    if policy not in ("prorsa", "advise", "static", "colocation"):
        fail(f"--policy must be prorsa, advise, static or colocation, got {policy!r}")
    if given.get("router", "sglang") not in ("sglang", "emulated"):
        fail(f"--router must be sglang or emulated, got {given['router']!r}")
    if given.get("max_restarts", 0) < 0:
        fail("--max-restarts must be >= 0")
    if given.get("staleness", 0) < 0:
        fail("--staleness must be >= 0 (0: synchronous)")
    from typing import get_args

    from .options import PauseMode

    if given.get("pause_mode", "abort") not in get_args(PauseMode):
        fail(f"--pause-mode must be {', '.join(get_args(PauseMode)[:-1])} or {get_args(PauseMode)[-1]}, "
             f"got {given['pause_mode']!r}")
    for name in ("engines", "agents", "batch_size", "steps", "max_turns"):
        if name in given and given[name] < 1:
            fail(f"--{name.replace('_', '-')} must be >= 1")
    if given.get("emulated_model") is not None:
        try:
            from prorsa_emulated.profiles import emulated_profile

            emulated_profile(given["emulated_model"])
        except ImportError:
            pass
        except ValueError as exc:
            fail(str(exc))
    if given.get("engines", 2) < 2 and policy != "colocation":
        fail("PD needs at least 2 engines (one per role)")
    if given.get("port_base") is not None and not (given["port_base"] == 0 or 1024 <= given["port_base"] <= 65000):
        fail("--port-base must be 0 (any free block) or between 1024 and 65000")
    if given.get("nats") and not given["nats"].startswith(NATS_SCHEMES):
        fail(f"--nats must be a nats:// URL, got {given['nats']!r}")
    if given.get("nats_config") is not None and not Path(given["nats_config"]).is_file():
        fail(f"--nats-config: no such file: {given['nats_config']}")
    fields = {k: v for k, v in given.items() if k in cls.__dataclass_fields__}
    try:
        from prorsa_sim.workloads import get_workload

        if "workload" in fields:
            get_workload(fields["workload"])
    except ImportError:
        pass
    except ValueError as exc:
        fail(str(exc))
    opts = cls(**fields)
    from prorsa_forecaster.config import MIN_WINDOW_S

    if opts.horizon is not None and opts.horizon < MIN_WINDOW_S:
        fail(f"--horizon {opts.horizon:g} is under the forecaster's shortest window, {MIN_WINDOW_S:g} s")
    if opts.window_s < MIN_WINDOW_S:
        fail(f"the forecast window would be {opts.window_s:g} s of wall time (10 s of the cluster's at --speed "
             f"{opts.speed:g}), under the forecaster's {MIN_WINDOW_S:g} s: give --horizon {MIN_WINDOW_S:g} or more")
    return opts


__all__ = ["register", "console", "out"]
