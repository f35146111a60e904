"""``prorsa sim run``, ``compare``, ``calibrate`` and ``paper`` (registered into the ``prorsa`` app)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

WorkloadOpt = Annotated[str, typer.Option(
    "--workload", help="math | coding | general, or log:PATH: the trajectories recorded in an event log "
    "(docs/simulator.md, \"A recorded workload\").")]
ModelOpt = Annotated[str, typer.Option("--model", help="qwen3-235b | deepseek-v3.2 | mimo-v2.5-pro")]
StaleOpt = Annotated[int, typer.Option("--staleness", help="0 = synchronous; 2 or 8 = async bound")]
StepsOpt = Annotated[int, typer.Option(
    "--steps", help="Rollout steps (sync) / policy updates (async); the first is the warm-up, reported apart.")]
StartOpt = Annotated[str, typer.Option(
    "--start", help="P:D split the switching policies start from: best (the best static ratio, found by the "
    "sweep), own (the policy's own, n/2 : n/2) or P:D.")]
JobsOpt = Annotated[int | None, typer.Option("--jobs", help="Parallel processes (default: the CPU count).", min=1)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Workload seed (same seed, same trajectories).")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Trajectories per step.")]
GpusOpt = Annotated[int, typer.Option("--gpus", help="Cluster GPUs (paper: 128).")]
DpRoutingOpt = Annotated[str, typer.Option(
    "--dp-routing",
    help="How a request's attention-DP rank is chosen: load (SGLang's data-parallel controller, "
    "by load; default) or prefix (a DP-aware, cache-aware router).",
)]
RouterPolicyOpt = Annotated[str, typer.Option(
    "--router-policy",
    help="The router's rule between a prefix's holder and a less loaded worker: queue (the prefix's rank "
    "unless its queue, less the cached part, is longer than the least-loaded rank's; default) or smg "
    "(SGLang Model Gateway's cache_aware policy with its default thresholds).",
)]


MaxTurnsOpt = Annotated[int | None, typer.Option(
    "--max-turns", help="Cap on each trajectory's turns (default: the workload's own; the live demo: 6).")]
MaxOutputOpt = Annotated[int | None, typer.Option(
    "--max-output", help="Cap on each turn's output tokens (default: the workload's own; the live demo: 512).")]
TrainOpt = Annotated[float | None, typer.Option(
    "--train-s", help="Trainer seconds per policy update (default: the simulator's 30; the live demo's driver: 10).")]
PauseModeOpt = Annotated[str, typer.Option(
    "--pause-mode", help="How the weight sync pauses the engines (SGLang's pause_generation mode): abort (every "
    "request in flight is aborted and re-prefills its context after the sync; default, as slime and AReaL do) or "
    "in_place (the engines stop and keep what they hold, which goes on after the sync) or retract (as in_place, "
    "but what prefill and mixed engines run gives its KV back and re-prefills after the sync).")]
NoGroupPrefixOpt = Annotated[bool, typer.Option(
    "--no-group-prefix", help="A GRPO group's members do not share their first prompt's prefix cache (as the "
    "live demo's prompts do not).")]


def _config(workload, model, staleness, steps, seed, batch_size, gpus, dp_routing="load",
            max_turns=None, max_output=None, no_group_prefix=False, router_policy="queue", train_s=None,
            pause_mode="abort"):
    from prorsa_runtime.cli import fail

    from .simconfig import build_config

    if train_s is not None and not 0 <= train_s < float("inf"):
        fail(f"--train-s must be >= 0 seconds, got {train_s}")
    try:
        return build_config(
            workload=workload, model=model, staleness=staleness, steps=steps, seed=seed,
            batch_size=batch_size, total_gpus=gpus, dp_routing=dp_routing, router_policy=router_policy,
            max_turns=max_turns, max_output=max_output, group_prefix=not no_group_prefix, pause_mode=pause_mode,
            **({} if train_s is None else {"train_s": train_s}),
        )
    except (ValueError, TypeError) as exc:
        fail(str(exc))


def _check(cfg):
    from prorsa_runtime.cli import fail

    from prorsa_emulated.costmodel import get_profile

    if cfg.steps < 1 or cfg.batch_size < 1 or cfg.staleness < 0:
        fail("--steps and --batch-size must be >= 1 and --staleness >= 0")
    if cfg.seed < 0:
        fail(f"--seed must be >= 0, got {cfg.seed}")
    if get_profile(cfg.model).engines_in(cfg.total_gpus) < 2:
        fail(f"--gpus {cfg.total_gpus} holds fewer than two {cfg.model} engines")


def _check_specs(cfg, specs: list[str], start: str) -> None:
    """ValueError naming the first policy or ``--start`` that does not fit ``cfg``'s cluster."""
    from prorsa_emulated.costmodel import get_profile

    from .runner import check_specs, check_split, parse_start

    n = get_profile(cfg.model).engines_in(cfg.total_gpus)
    check_specs(specs, n, cfg.model)
    st = parse_start(start)
    if isinstance(st, tuple):
        check_split(*st, n, cfg.model, f"--start {start}")


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
            help="colocation | static | static:P:D | reactive | prorsa | oracle | bound "
            "(switching policies take :in_place or :restart, e.g. prorsa:restart; prorsa and oracle take "
            "allocator settings as :FIELD=VALUE, e.g. prorsa:settle_s=0; bound[:<grid_s>][:beam=<B>] "
            "searches the hindsight-best schedule first: slow)",
        )] = "colocation",
        steps: StepsOpt = 6,
        seed: SeedOpt = 0,
        batch_size: BatchOpt = 512,
        gpus: GpusOpt = 128,
        dp_routing: DpRoutingOpt = "load",
        router_policy: RouterPolicyOpt = "queue",
        max_turns: MaxTurnsOpt = None,
        max_output: MaxOutputOpt = None,
        no_group_prefix: NoGroupPrefixOpt = False,
        train_s: TrainOpt = None,
        pause_mode: PauseModeOpt = "abort",
        start: StartOpt = "own",
        jobs: JobsOpt = None,
        no_plot: Annotated[bool, typer.Option("--no-plot", help="Skip timeline.png and ideal_split.png.")] = False,
    ) -> None:
        """Simulate one policy; write DIR/events.jsonl.gz, summary.json, timeline.png, ideal_split.png."""
        from prorsa_runtime.cli import console, fail, out as stdout
        from rich.progress import Progress

        from .runner import default_jobs, run_to_dir

        cfg = _config(workload, model, staleness, steps, seed, batch_size, gpus, dp_routing,
                      max_turns, max_output, no_group_prefix, router_policy, train_s, pause_mode)
        _check(cfg)
        try:
            _check_specs(cfg, [policy], start)
        except ValueError as exc:
            fail(str(exc))
        if out.exists() and not out.is_dir():
            fail(f"--out {out} exists and is not a folder")
        try:
            with Progress(console=console, transient=True) as bar:
                task = bar.add_task(f"simulating {policy}", total=cfg.steps)
                res = run_to_dir(cfg, policy, out, progress=lambda step, t: bar.update(task, completed=step),
                                 plot=not no_plot, start=start, n_jobs=jobs or default_jobs(),
                                 search_progress=_search_bar(bar))
        except ValueError as exc:
            fail(str(exc))
        stdout.print_json(json.dumps({k: v for k, v in res.summary.items() if k not in ("step_times_s", "ideal_split")}))

    @sim.command("compare")
    def compare_cmd(
        workload: WorkloadOpt = "coding",
        staleness: StaleOpt = 0,
        model: ModelOpt = "deepseek-v3.2",
        policies: Annotated[str, typer.Option(
            "--policies",
            help="Comma-separated; the first is the baseline. 'all' = colocation,static,reactive,"
            "prorsa,oracle ('all:restart': the switching ones restart instead of switching in place); "
            "bound (the hindsight-best schedule, searched: slow) is not in 'all'.",
        )] = "colocation,static",
        steps: StepsOpt = 6,
        seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated workload seeds.")] = "0,1,2",
        seed: Annotated[int | None, typer.Option("--seed", help="One seed (same as --seeds N).", hidden=True)] = None,
        batch_size: BatchOpt = 512,
        gpus: GpusOpt = 128,
        dp_routing: DpRoutingOpt = "load",
        router_policy: RouterPolicyOpt = "queue",
        max_turns: MaxTurnsOpt = None,
        max_output: MaxOutputOpt = None,
        no_group_prefix: NoGroupPrefixOpt = False,
        train_s: TrainOpt = None,
        pause_mode: PauseModeOpt = "abort",
        start: StartOpt = "best",
        grid: Annotated[int, typer.Option("--grid", help="Points of the static sweep.")] = 7,
        jobs: JobsOpt = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON rows.")] = False,
    ) -> None:
        """Run several policies on the same seeded workloads; mean and spread across seeds."""
        from prorsa_runtime.cli import console, fail, out as stdout
        from rich.table import Table

        from .catalog import expand_policies
        from .progress import sweep_bar
        from .compare import compare_seeds
        from .runner import default_jobs

        cfg = _config(workload, model, staleness, steps, 0, batch_size, gpus, dp_routing,
                      max_turns, max_output, no_group_prefix, router_policy, train_s, pause_mode)
        _check(cfg)
        specs = expand_policies(policies)
        if not specs:
            fail("--policies is empty")
        seed_list = _ints(str(seed), "--seed") if seed is not None else _ints(seeds, "--seeds")
        try:
            _check_specs(cfg, specs, start)
        except ValueError as exc:
            fail(str(exc))
        if grid < 1:
            fail("--grid must be >= 1")
        with sweep_bar(console) as bar:
            res = compare_seeds(cfg, specs, seed_list, n_jobs=jobs or default_jobs(), start=start, grid=grid,
                                progress=bar.progress, on_total=bar.on_total)
        rows = res["rows"]
        if as_json:
            stdout.print_json(json.dumps([_flat(r) for r in rows]))
            return
        table = Table(title=f"{workload} / {model} / staleness {staleness} / {steps} steps (1 warm-up) / "
                            f"seeds {','.join(map(str, seed_list))} / start {start}")
        for col in ("policy", "rollout s", "spread", "speedup", "spread", "warm-up s", "traj s", "GPU idle",
                    "imbalance", "unused", "switches", "preempt"):
            table.add_column(col)
        for r in rows:
            table.add_row(
                r["policy"], _f(r["rollout_time_s"]["mean"]), _rng(r["rollout_time_s"]), _f(r["speedup"]["mean"], "x"),
                _rng(r["speedup"]), _f(r["warmup_step_s"]["mean"]), _f(r["mean_trajectory_s"]["mean"]),
                _pct(r["gpu_idle_ratio"]["mean"]), _pct(r["gpu_imbalance_ratio"]["mean"]),
                _pct(r["gpu_unused_ratio"]["mean"]), _f(r["switches"]["mean"]), _f(r["preemptions"]["mean"]),
            )
        stdout.print(table)

    @sim.command("calibrate")
    def calibrate_cmd(
        models: Annotated[str, typer.Option("--models", help="Comma-separated profiles (default: all).")] = "",
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    ) -> None:
        """The cost model beside the published figures it is built from."""
        from prorsa_runtime.cli import fail, out as stdout

        from .calibrate import calibrate
        from prorsa_emulated.costmodel import PROFILES

        names = [m for m in models.split(",") if m] or list(PROFILES)
        bad = [m for m in names if m not in PROFILES]
        if bad:
            fail(f"unknown model {bad[0]!r}; choose one of: {', '.join(sorted(PROFILES))}")
        rep = calibrate(names)
        if as_json:
            stdout.print_json(json.dumps(rep))
            return
        _print_calibration(stdout, rep)

    @sim.command("paper")
    def paper_cmd(
        out: Annotated[Path, typer.Option("--out", help="Folder: cached runs, report.json, report.md.")] = Path("sim-paper"),
        models: Annotated[str, typer.Option("--models", help="Comma-separated (default: all three).")] = "",
        workloads: Annotated[str, typer.Option("--workloads", help="Comma-separated (default: math,coding,general).")] = "",
        staleness: Annotated[str, typer.Option("--staleness", help="Comma-separated (default: 0,2,8).")] = "",
        seeds: Annotated[str, typer.Option("--seeds", help="Comma-separated (default 0,1,2; --quick: 0).")] = "",
        steps: Annotated[int | None, typer.Option("--steps", help="Steps incl. the warm-up (default 6; --quick: 3).")] = None,
        grid: Annotated[int | None, typer.Option("--grid", help="Static sweep points (default 7; --quick: 4).")] = None,
        jobs: JobsOpt = None,
        pd_policy: Annotated[str | None, typer.Option(
            "--pd-policy", help="PD = this switching policy (from the best static ratio) instead of the best static.")] = None,
        batch_size: BatchOpt = 512,
        gpus: GpusOpt = 128,
        dp_routing: DpRoutingOpt = "load",
        router_policy: RouterPolicyOpt = "queue",
        quick: Annotated[bool, typer.Option("--quick", help="Preview preset: 3 steps, seed 0, 4-point static grid.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    ) -> None:
        """Run the paper's settings and print each §5 figure beside the simulator's."""
        from prorsa_runtime.cli import console, fail, out as stdout

        from prorsa_emulated.costmodel import PROFILES
        from .paper import options, report
        from .paper_text import to_markdown
        from .catalog import make_policy
        from .progress import sweep_bar
        from .workloads import WORKLOADS

        ms = [m for m in models.split(",") if m] or None
        ws = [w for w in workloads.split(",") if w] or None
        for m in ms or []:
            if m not in PROFILES:
                fail(f"unknown model {m!r}; choose one of: {', '.join(sorted(PROFILES))}")
        for w in ws or []:
            if w not in WORKLOADS:
                fail(f"unknown workload {w!r}; choose one of: {', '.join(sorted(WORKLOADS))}")
        st = _ints(staleness, "--staleness") if staleness else None
        if pd_policy is not None:
            from .simulation import is_pd_fixed

            if pd_policy == "static" or is_pd_fixed(pd_policy):
                fail(f"--pd-policy takes a switching policy (e.g. prorsa, reactive), not {pd_policy!r}: without it "
                     "the PD column is the best fixed ratio of the sweep")
            try:
                make_policy(pd_policy)
            except ValueError as exc:
                fail(str(exc))
        o = options(models=ms, workloads=ws, staleness=st, seeds=_ints(seeds, "--seeds") if seeds else None,
                    steps=steps, grid=grid, jobs=jobs, pd_policy=pd_policy, batch_size=batch_size, gpus=gpus,
                    quick=quick, dp_routing=dp_routing, router_policy=router_policy)
        if o.steps < 1 or o.grid < 1 or o.batch_size < 1:
            fail("--steps, --grid and --batch-size must be >= 1")
        for m in o.models:
            _check(_config("coding", m, 0, 1, 0, batch_size, gpus, dp_routing, router_policy=router_policy))
        if out.exists() and not out.is_dir():
            fail(f"--out {out} exists and is not a folder")
        with sweep_bar(console) as bar:
            rep = report(o, out, progress=bar.progress, on_total=bar.on_total)
        (out / "report.json").write_text(json.dumps(rep, indent=1, sort_keys=True) + "\n")
        (out / "report.md").write_text(to_markdown(rep))
        if as_json:
            stdout.print_json(json.dumps(rep))
            return
        _print_paper(stdout, rep)


def _ints(text: str, opt: str) -> list[int]:
    """Comma-separated integers >= 0 (seeds, staleness), or a clear error."""
    from prorsa_runtime.cli import fail

    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"{opt} takes comma-separated integers, got {text!r}")
    if not vals:
        fail(f"{opt} is empty")
    if min(vals) < 0:
        fail(f"{opt} must be >= 0, got {min(vals)}")
    return vals


def _search_bar(bar):
    """A progress callback for a policy's search (``bound``): a second task on ``bar``."""
    state: dict = {}

    def update(done: int, total: int, info: dict) -> None:
        if "task" not in state:
            state["task"] = bar.add_task("bound search", total=total)
        best = info.get("best_finish_s")
        bar.update(state["task"], completed=done, total=total,
                   description=f"bound search: segment at {info['t']} s, {info['lookaheads']} lookaheads, "
                               f"{info['sim_s']} sim s" + (f", best finish {best} s" if best is not None else ""))

    return update


def _flat(row: dict) -> dict:
    """A compare row for --json: the first seed's summary keys are not repeated; means
    and spreads per key, the per-seed summaries under ``per_seed``."""
    out = {"policy": row["policy"], "spec": row["spec"]}
    for k, v in row.items():
        if k in ("policy", "spec"):
            continue
        out[k] = v
    out["speedup_spread"] = row["speedup"]
    out["speedup"] = round(row["speedup"]["mean"], 4) if row["speedup"]["mean"] is not None else None
    return out


def _f(x, suffix="") -> str:
    if x is None:
        return "-"
    return f"{x:.3g}{suffix}" if abs(x) < 100 else f"{x:.1f}{suffix}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _rng(d: dict) -> str:
    if d.get("min") is None:
        return "-"
    return f"{_f(d['min'])}-{_f(d['max'])} (sd {_f(d['std'])})"


def _print_calibration(stdout, rep: dict) -> None:
    from rich.table import Table

    t = Table(title="prefill: full chunks of 2000-token inputs (computed tokens/s)")
    for c in ("model", "chunk", "per rank", "per engine", "per 8-GPU node", "per GPU"):
        t.add_column(c)
    for name, c in rep["profiles"].items():
        p = c["prefill"]
        t.add_row(name, str(p["chunk_size"]), _f(p["per_rank_tok_s"]), _f(p["per_engine_tok_s"]),
                  _f(p["per_node_tok_s"]), _f(p["per_gpu_tok_s"]))
    stdout.print(t)
    t = Table(title="decode: output tokens/s at a batch per attention-DP rank")
    for c in ("model", "seqs/rank", "context", "step ms", "per engine", "per 8-GPU node", "per GPU"):
        t.add_column(c)
    for name, c in rep["profiles"].items():
        for d in c["decode"]:
            t.add_row(name, str(d["batch_per_rank"]), str(d["context_tokens"]), _f(d["step_ms"]),
                      _f(d["per_engine_tok_s"]), _f(d["per_node_tok_s"]), _f(d["per_gpu_tok_s"]))
    stdout.print(t)
    t = Table(title="lock-step: decode ranks wait for one rank's prefill chunk (SGLang runs a waiting prefill first)")
    for c in ("model", "DP ranks", "decode-only step ms", "chunk (ctx)", "chunk ms", "decode rank ms", "step ms",
              "slowdown", "idle share"):
        t.add_column(c)
    for name, c in rep["profiles"].items():
        for r in c["lockstep"]:
            t.add_row(name, str(c["attn_dp"]), _f(r["decode_only_step_ms"]),
                      f"{r['chunk_tokens']} ({r['chunk_context_tokens']})", _f(r["prefill_chunk_ms"]),
                      _f(r["decode_rank_in_extend_step_ms"]), _f(r["step_with_chunk_ms"]), f"{r['slowdown']}x",
                      _pct(r["idle_share"]))
    stdout.print(t)
    t = Table(title="KV capacity and switches")
    for c in ("model", "KV / rank (tokens)", "KV / engine", "8k seqs / engine", "KV transfer 8k ms", "in-place s",
              "restart s"):
        t.add_column(c)
    for name, c in rep["profiles"].items():
        k = c["kv"]
        t.add_row(name, f"{k['per_rank_tokens']:,}", f"{k['per_engine_tokens']:,}", str(k["sequences_of_8k_per_engine"]),
                  _f(k["transfer_8k_ms"]), _f(c["switch_s"]["in_place"]), _f(c["switch_s"]["restart"]))
    stdout.print(t)
    t = Table(title="beside the published figures (sources below)")
    for c in ("model", "figure", "published", "sim", "sim / published", "use", "src"):
        t.add_column(c)
    notes: dict[str, int] = {}
    for r in rep["published"]:
        n = notes.setdefault(r["source"] + " -- " + r["note"], len(notes) + 1)
        t.add_row(r["model"], r["figure"], f"{r['published']:,.0f} {r['unit']}", f"{r['sim']:,.0f}", f"{r['ratio']:.2f}",
                  r["use"], f"[{n}]")
    stdout.print(t)
    for text, n in notes.items():
        stdout.print(f"[{n}] {text}", markup=False)


def _print_paper(stdout, rep: dict) -> None:
    from rich.table import Table

    from .paper_text import fmt_value, miss_text

    m = rep["meta"]
    t = Table(title=f"paper vs sim ({m['steps']} steps, 1 warm-up; seeds {m['seeds']}; PD = {m['pd']}"
                    f"{'; QUICK' if m['quick'] else ''})")
    for c in ("source", "figure", "setting", "paper", "sim", "spread", "within", "miss", "status"):
        t.add_column(c)
    for r in rep["figures"]:
        within = "-" if r["within"] is None else ("yes" if r["within"] else "no")
        t.add_row(r["section"], r["figure"], r["setting"], fmt_value(r["paper"], r["unit"]), fmt_value(r["sim"], r["unit"]),
                  fmt_value(r["sim_spread"], r["unit"]), within, miss_text(r), r["status"])
    stdout.print(t)
    t = Table(title="must show")
    for c in ("bar", "setting", "value", "ok", "note"):
        t.add_column(c)
    for b in rep["must_show"]:
        t.add_row(b["bar"], b["setting"], fmt_value(b["value"]), "yes" if b["ok"] else "NO", b.get("note", ""))
    stdout.print(t)
