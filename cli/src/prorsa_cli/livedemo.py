"""The run loop of `prorsa up`: start the planned processes, watch them, finish a live run.

A service that keeps crashing (the supervisor gives up on it after ``max_restarts`` restarts
in a row) stops everything: `prorsa up` prints its exit codes and log tail and exits 1.

With the emulated cluster, the run ends when the rollout driver exits: the loop then waits
until the tracker holds every event the driver published and the forecaster has closed the
last window, prints the summary (rollout time per step, switches, forecast WAPE, where the
durable log is and how to explore it), writes ``summary.json`` and ``timeline.png``, and
stops every service (unless ``keep_running``).
"""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from prorsa_runtime.redact import mask_url

from prorsa_runtime.cli import console, is_tty, out
from .routerproc import router_name
from .options import UpError, UpOptions
from .stack import StackPlan, plan_stack, register_colocated
from .supervisor import StartError, Supervisor


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _endpoints(plan: StackPlan) -> Table:
    t = Table(title="prorsa up: endpoints", show_header=True)
    t.add_column("what")
    t.add_column("where")
    t.add_row("bus (NATS JetStream)", plan.nats_url)
    t.add_row("durable log (tracker)", mask_url(plan.db_url))
    t.add_row("tracker query API", f"http://127.0.0.1:{plan.ports.tracker_api}/docs (token in api-token)")
    for name, url in plan.metrics.items():
        t.add_row(f"{name} metrics / health", f"{url}/metrics  {url}/health")
    if plan.router_url:
        t.add_row(f"router ({router_name(plan.router_kind)})", plan.router_url)
    return t


class GaveUp(Exception):
    """The supervisor gave up on a service that kept crashing."""


def _watch(sup: Supervisor) -> list[str]:
    """One supervisor poll (restarts); raises :class:`GaveUp` when a service was given up."""
    ended = sup.poll()
    if sup.given_up:
        raise GaveUp(sup.gave_up_report(sup.given_up[0]))
    return ended


def _wait(cond, timeout: float, stop: threading.Event, sup: Supervisor) -> bool:
    """Wait for ``cond`` while the supervisor keeps the services up."""
    deadline = time.monotonic() + timeout
    while not cond():
        if stop.is_set() or time.monotonic() > deadline:
            return False
        _watch(sup)
        stop.wait(0.25)
    return True


def run_up(opts: UpOptions, keep_running: bool = False, fresh: bool = False) -> int:
    """Start, supervise and (for a live run) summarise; returns the exit code."""
    if fresh and opts.workdir.exists():
        shutil.rmtree(opts.workdir)
    try:
        plan = plan_stack(opts)
    except UpError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        return 2
    wd = opts.workdir.resolve()
    for f in (plan.driver_out, plan.progress):
        f.unlink(missing_ok=True)
    sup = Supervisor(wd / "logs", wd / "up-state.json", on_event=lambda m: console.print(f"[yellow]{escape(m)}[/]", markup=True),
                     max_restarts=opts.max_restarts)
    stop = threading.Event()

    def on_term(*_):
        raise KeyboardInterrupt  # SIGTERM to `prorsa up` stops like Ctrl-C

    old_term = signal.signal(signal.SIGTERM, on_term)
    # Ctrl-C stops it even when started with SIGINT ignored (a parent that ignores it, as
    # some job runners do: Python then installs no handler of its own).
    old_int = signal.signal(signal.SIGINT, on_term)
    code = 0
    try:
        for spec in plan.specs:
            console.print(f"starting {spec.name} (log {wd / 'logs' / (spec.name + '.log')})", highlight=False)
            sup.start(spec)
            if spec.name == "nats-server" and plan.setup is not None:
                console.print(plan.setup(), highlight=False)  # the admin step: the stream
            if spec.name.startswith("engine-") and spec.name == f"engine-{opts.engines - 1}" and plan.colocated_engines:
                register_colocated(plan.router_url, plan.colocated_engines)
        out.print(_endpoints(plan))
        if not opts.emulated_cluster:
            console.print("all services up; Ctrl-C stops them")
            while not stop.is_set():
                _watch(sup)
                stop.wait(0.25)
            return 0
        code = _follow_run(opts, plan, sup, stop)
        if keep_running and code == 0:
            console.print("run finished; services keep running (Ctrl-C stops them)")
            while not stop.is_set():
                _watch(sup)
                stop.wait(0.25)
    except GaveUp as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        code = 1
    except StartError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        code = 1
    except UpError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}", highlight=False, markup=True)
        code = 2
    except KeyboardInterrupt:
        console.print("stopping (Ctrl-C)")
        code = 130
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, signal.default_int_handler if old_int is signal.SIG_IGN else old_int)
        console.print("stopping services")
        try:
            sup.stop()
        except KeyboardInterrupt:  # a second Ctrl-C: kill at once
            sup.stop(grace_s=0.0)
        console.print(f"stopped; logs in {wd / 'logs'}", highlight=False)
    return code


def _follow_run(opts: UpOptions, plan: StackPlan, sup: Supervisor, stop: threading.Event) -> int:
    # Sync: trajectories done out of the batches; async: policy updates out of the steps
    # (more trajectories end than are trained on: some are not admitted, some dropped).
    total = opts.steps if opts.staleness else opts.batch_size * opts.steps
    unit = "policy updates" if opts.staleness else "trajectories"
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, disable=not is_tty()) as bar:
        task = bar.add_task("rollout", total=total)
        last_print = 0.0
        while True:
            ended = _watch(sup)
            p = _read_json(plan.progress) or {}
            restarts = sum(r for _, r in sup.snapshot().values())
            desc = (f"step {p.get('step', 0) + 1}/{opts.steps}, {p.get('live', 0)} live, "
                    f"{p.get('requests', 0)} requests, {restarts} restarts")
            done = p.get("step", 0) if opts.staleness else p.get("completed", 0)
            bar.update(task, completed=done, description=desc)
            if not is_tty() and time.monotonic() - last_print > 10:
                console.print(f"rollout: {done}/{total} {unit}; {desc}", highlight=False)
                last_print = time.monotonic()
            if "driver" in ended:
                break
            stop.wait(0.25)
    rc = sup.returncode("driver")
    if rc != 0:
        console.print(f"[bold red]error:[/] the rollout driver failed (exit {rc}); last lines of its log:\n"
                      + escape(sup.tail("driver")), highlight=False, markup=True)
        return 1
    driver = _read_json(plan.driver_out) or {}
    return _finish(opts, plan, driver, stop, sup)


# Wall seconds the summary waits for commanded switches to end (switched or failed): the
# emulated agent's drain deadline plus a switch, with room for a loaded host (CHOICE).
SETTLE_S = 60.0


def _finish(opts: UpOptions, plan: StackPlan, driver: dict, stop: threading.Event, sup: Supervisor) -> int:
    from .report import count_run, load_events, scrape, summarise, timeline

    want = driver.get("events", 0)
    console.print(f"driver done: {driver.get('completed')} trajectories, {want} events published; "
                  "waiting for the tracker to store them", highlight=False)
    stored = [0, 0]

    def caught_up() -> bool:
        stored[:] = count_run(plan.db_url, opts.run)
        return stored[0] >= want

    _wait(caught_up, 120.0, stop, sup)
    last_ts = driver.get("finished_at", 0.0)

    def last_window() -> bool:  # the forecaster has published the window holding the last event
        return any(e["type"] == "forecast.window" and e["t"] + opts.window_s >= last_ts - opts.window_s
                   for e in load_events(plan.db_url)[-200:])

    _wait(last_window, 4 * opts.window_s + 10, stop, sup)

    def unsettled(events: list[dict]) -> set[str]:  # commands sent or begun with no outcome yet
        begun = {e["cmd"] for e in events if e["type"] in ("engine.command", "engine.switching")}
        return begun - {e["cmd"] for e in events if e["type"] in ("engine.switched", "engine.switch_failed")}

    # A switch the allocator commanded near the end finishes after the driver: the summary
    # waits for its outcome, so that it counts what the durable log will hold (a command
    # nobody answers ends the wait at SETTLE_S and is reported as unsettled).
    _wait(lambda: not unsettled(load_events(plan.db_url)), SETTLE_S, stop, sup)
    metrics = scrape(plan.metrics["forecaster"])
    emu = engine_stats([f"http://{opts.host}:{port}" for port, _b in plan.ports.engines])
    events = load_events(plan.db_url)
    summary = summarise(events, opts.run, driver, metrics, opts.window_s)
    summary.update(policy=opts.policy, workdir=str(opts.workdir.resolve()), tracker_events=stored[0], anomalies=stored[1], durable_log=mask_url(plan.db_url),
                   **scenario(opts))
    summary["emulated_engines"] = emu
    summary["switches_unsettled"] = len(unsettled(events))
    summary["router"] = router_name(plan.router_kind)
    steps = summary["rollout_step_times_s"]
    summary["rollout_mean_s"] = round(sum(steps) / len(steps), 3) if steps else None
    if opts.compare_with is not None:
        summary["comparison"] = compare(summary, opts.compare_with)
    wd = opts.workdir.resolve()
    png = timeline(events, opts.run, opts.window_s, wd / "timeline.png",
                   f"{opts.policy}: {opts.workload}, {opts.engines} engines, speed x{opts.speed:g}")
    summary["timeline_png"] = str(png) if png else None
    (wd / "summary.json").write_text(json.dumps(summary, indent=2))
    _print_summary(summary, plan, opts)
    ok = stored[0] == want and stored[1] == 0
    if not ok:
        console.print(f"[bold red]the tracker holds {stored[0]} of {want} events, {stored[1]} anomalies[/]", markup=True)
    return 0 if ok else 1


def engine_stats(urls: list[str]) -> dict:
    """The emulated engines' own account: emulated seconds stepping, and seconds they fell
    behind their cost model (a CPU-starved host makes them slower than the profile)."""
    import httpx

    busy = behind = 0.0
    steps = prefill_steps = answered = 0
    for url in urls:
        try:
            r = httpx.get(f"{url}/_emu/stats", timeout=2.0)
            st = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            st = None
        if not isinstance(st, dict):
            continue
        answered += 1
        busy += st.get("busy_s", 0.0)
        behind += st.get("behind_s", 0.0)
        steps += st.get("steps", 0)
        prefill_steps += st.get("prefill_steps", 0)
    return {"engines_answered": answered, "busy_s": round(busy, 1), "behind_s": round(behind, 1),
            "steps": steps, "prefill_steps": prefill_steps,
            "behind_share": round(behind / (busy + behind), 4) if busy + behind > 0 else None}


SCENARIO_KEYS = ("workload", "engines", "speed", "batch_size", "steps", "staleness", "pause_mode", "max_turns", "seed",
                 "emulated_model", "router")
"""What two runs must share for their rollout times to be compared."""
SCENARIO_DEFAULTS = {"pause_mode": "abort"}
"""The value of a key a summary written before it existed holds."""


def scenario(opts: UpOptions) -> dict:
    return {k: getattr(opts, k) for k in SCENARIO_KEYS}


def compare(summary: dict, other_dir: Path) -> dict | None:
    """PD against colocation when ``other_dir`` holds the other policy's summary of the same
    scenario (same seed, workload, engines, speed, ...); None otherwise."""
    other = _read_json(other_dir / "summary.json")
    if not other or any(other.get(k, SCENARIO_DEFAULTS.get(k)) != summary.get(k, SCENARIO_DEFAULTS.get(k))
                        for k in SCENARIO_KEYS):
        return None
    if (summary["policy"] == "colocation") == (other.get("policy") == "colocation"):
        return None
    pd, col = (other, summary) if summary["policy"] == "colocation" else (summary, other)
    t_pd, t_col = sum(pd["rollout_step_times_s"]), sum(col["rollout_step_times_s"])
    return {
        "pd_policy": pd["policy"], "pd_workdir": pd.get("workdir"), "colocation_workdir": col.get("workdir"),
        "pd_step_times_s": pd["rollout_step_times_s"], "colocation_step_times_s": col["rollout_step_times_s"],
        "pd_switches": [pd["commands"], pd["switches"]],
        "speedup": round(t_col / t_pd, 3) if t_pd > 0 else None,
        "pd_trajectory_mean_s": pd.get("trajectory_mean_s"),
        "colocation_trajectory_mean_s": col.get("trajectory_mean_s"),
        "trajectory_speedup": round(col["trajectory_mean_s"] / pd["trajectory_mean_s"], 3)
        if pd.get("trajectory_mean_s") and col.get("trajectory_mean_s") else None,
        "speedup_per_step": [round(c / p, 3) if p > 0 else None
                             for p, c in zip(pd["rollout_step_times_s"], col["rollout_step_times_s"])],
    }


def dropped_text(dropped: dict[str, int]) -> str:
    """The summary's dropped trajectories, by reason, each with what it means (the
    driver's :data:`~prorsa_sim.driver.loop.DROP_REASONS`)."""
    from prorsa_sim.driver.loop import DROP_REASONS

    return ", ".join(f"{n} {r}" + (f" ({DROP_REASONS[r]})" if r in DROP_REASONS else "")
                     for r, n in sorted(dropped.items()))


def _print_summary(s: dict, plan: StackPlan, opts: UpOptions) -> None:
    t = Table(title=f"live run {s['run']} ({s['policy']})")
    t.add_column("measure")
    t.add_column("value")
    steps = ", ".join(f"{w:.1f} s" for w in s["rollout_step_times_s"])
    sim = ", ".join(f"{w:.0f} s" for w in s["rollout_step_times_simulated_s"])
    t.add_row("engines (emulated model)", f"{opts.engines} x {opts.emulated_model}")
    t.add_row("router", s["router"])
    sampler = s.get("sampler") or {}
    if sampler.get("mode") == "async":
        t.add_row("sampler", f"async, staleness {sampler.get('staleness')} (a step: one policy update to the next)")
    else:
        t.add_row("sampler", "sync (a step: first dispatch to last reward)")
    syncs = s.get("weight_syncs") or {}
    if syncs.get("syncs"):
        t.add_row("weight syncs / engines paused and synced",
                  f"{syncs['syncs']} / {syncs.get('engine_pauses', 0)} ({opts.engines} engines each; "
                  f"pause mode {syncs.get('pause_mode', 'abort')})")
    t.add_row("rollout time per step (wall)", steps or "-")
    t.add_row(f"rollout time per step (simulated, x{opts.speed:g})", sim or "-")
    dropped = s.get("dropped") or {}
    t.add_row("trajectories completed" + (" / dropped" if dropped else ""),
              str(s["trajectories"]) + (" / " + dropped_text(dropped) if dropped else ""))
    if s.get("trajectory_mean_s") is not None:
        t.add_row("mean trajectory time (wall)", f"{s['trajectory_mean_s']:.1f} s")
    e = s.get("emulated_engines") or {}
    if e.get("engines_answered"):
        share = e["behind_share"] or 0.0
        t.add_row("emulated engines: steps (with a prefill) / behind the cost model",
                  f"{e['steps']} ({e['prefill_steps']}) / {100 * share:.1f}% of their time")
    t.add_row("events: published / in the log / anomalies", f"{s['driver_events']} / {s['tracker_events']} / {s['anomalies']}")
    t.add_row("switches: commanded / executed / failed", f"{s['commands']} / {s['switches']} / {s['switch_failures']}"
              + (f" ({s['switches_unsettled']} without an outcome)" if s.get("switches_unsettled") else ""))
    if s.get("policy") == "advise":
        t.add_row("switches advised, not commanded",
                  f"{s.get('planned_switches', 0)} in {s.get('plans_with_switches', 0)} of {s.get('plans', 0)} plans"
                  f" ({s.get('distinct_planned_switches', 0)} different engine moves: a move not commanded"
                  f" is advised again by the next plan)")
    w = s["forecast_wape"]
    pct = lambda v: "-" if v is None else f"{100 * v:.1f}%"  # noqa: E731
    sim_s = f", {opts.window_s * opts.time_scale:g} s simulated" if opts.time_scale != 1 else ""
    t.add_row(f"forecast windows (S = {opts.window_s:g} s{sim_s})", str(s["forecast_windows"]))
    t.add_row("forecast WAPE: prefill / decode", f"{pct(w['prefill'])} / {pct(w['decode'])}")
    t.add_row("durable log", mask_url(plan.db_url))
    t.add_row("timeline", str(s["timeline_png"]))
    out.print(t)
    c = s.get("comparison")
    if c:
        ct = Table(title=f"PD ({c['pd_policy']}) against colocation, same scenario and seed")
        ct.add_column("run")
        ct.add_column("rollout time per step (wall)")
        ct.add_column("mean trajectory time (wall)")
        ct.add_column("switches: commanded / executed")
        fmt = lambda ts: ", ".join(f"{w:.1f} s" for w in ts)  # noqa: E731
        sec = lambda v: "-" if v is None else f"{v:.1f} s"  # noqa: E731
        ct.add_row(f"PD ({c['pd_policy']})", fmt(c["pd_step_times_s"]), sec(c["pd_trajectory_mean_s"]),
                   "{} / {}".format(*c["pd_switches"]))
        ct.add_row("colocation", fmt(c["colocation_step_times_s"]), sec(c["colocation_trajectory_mean_s"]), "0 / 0")
        per = ", ".join(f"{x:.2f}x" for x in c["speedup_per_step"] if x is not None)
        tj = c.get("trajectory_speedup")
        ct.add_row("PD speedup (colocation / PD)", f"{c['speedup']:.2f}x over the run ({per} per step)",
                   "-" if tj is None else f"{tj:.2f}x", "")
        out.print(ct)
    elif opts.compare_with is not None:
        other = "colocation" if opts.policy != "colocation" else "prorsa"
        out.print(f"no {other} run of the same scenario in {opts.compare_with} to compare with "
                  f"(`prorsa demo --policy {other}` with the same options makes one; `--compare` runs both)",
                  highlight=False)
    db = mask_url(plan.db_url)  # a password never printed: the reader puts theirs back
    exe = _prorsa_command()
    out.print("explore the durable log:", highlight=False)
    out.print(f"  {exe} runs --db {db}", highlight=False, soft_wrap=True)
    out.print(f"  {exe} trajectories --run {s['run']} --db {db}", highlight=False, soft_wrap=True)
    first = "t000000" if (s.get("sampler") or {}).get("mode") == "async" else "s0-t0"  # the driver's first trajectory
    out.print(f"  {exe} history {first} --run {s['run']} --db {db}", highlight=False, soft_wrap=True)
    out.print(f"  {exe} export --run {s['run']} --db {db} --with-engines -o {s['run']}.jsonl.gz", highlight=False, soft_wrap=True)


def _prorsa_command() -> str:
    """How the user can type `prorsa` here: the bare name if it is on PATH, else its path."""
    import os
    import shutil
    import sys

    here = Path(sys.executable).parent / "prorsa"
    if shutil.which("prorsa") and Path(shutil.which("prorsa")).resolve() == here.resolve():
        return "prorsa"
    if here.exists():
        try:
            return os.path.relpath(here)
        except ValueError:
            return str(here)
    return "prorsa"
