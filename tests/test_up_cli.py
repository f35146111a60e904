"""`prorsa up` refuses clearly (port taken, nats-server missing, bad options), and its
supervisor restarts crashed processes and escalates SIGTERM to SIGKILL, on real processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from prorsa_cli.supervisor import ProcSpec, Supervisor
from prorsa_runtime.testing import wait_until

CLI = [sys.executable, "-m", "prorsa_cli.main"]


def _run(args: list[str], tmp_path: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + args, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, **(env or {})})


def test_a_taken_port_is_named(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        r = _run(["up", "--workdir", str(tmp_path / "w"), "--port-base", str(port)], tmp_path)
    assert r.returncode == 2
    assert f"{port} (nats)" in r.stderr and "already in use" in r.stderr and "--port-base" in r.stderr


def test_a_missing_nats_server_is_explained(tmp_path: Path):
    r = _run(["up", "--workdir", str(tmp_path / "w"), "--port-base", "0"], tmp_path,
             env={"PRORSA_NATS_SERVER": str(tmp_path / "no-such-nats-server")})
    assert r.returncode == 2
    assert "PRORSA_NATS_SERVER" in r.stderr and "not an executable file" in r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--policy", "magic"], "--policy must be"),
    (["--speed", "0"], "must be a finite number > 0, got 0.0"),
    (["--speed", "nan"], "must be a finite number > 0, got nan"),
    (["--horizon", "0.01"], "--horizon 0.01 is under the forecaster's shortest window, 0.1 s"),
    (["--emulated-cluster", "--speed", "500"], "the forecast window would be 0.02 s of wall time"),
    (["--engines", "1"], "at least 2 engines"),
    (["--nats", "http://x"], "nats:// URL"),
    (["--workload", "chess"], "unknown workload"),
    (["--emulated-cluster", "--router", "nginx"], "--router must be sglang or emulated"),
    (["--emulated-cluster", "--with-router"], "--with-router is for a real cluster"),
    (["--router-host", "10.0.0.10"], "need --with-router"),
    (["--emulated-cluster", "--staleness", "-1"], "--staleness must be >= 0"),
    (["--emulated-cluster", "--pause-mode", "rewind"], "--pause-mode must be abort, retract or in_place"),
])
def test_bad_options_are_refused(tmp_path: Path, args: list[str], needle: str):
    r = _run(["up", "--workdir", str(tmp_path / "w"), *args], tmp_path)
    assert r.returncode == 2 and needle in r.stderr, r.stderr


def test_with_router_plans_sglang_router_for_a_real_cluster(tmp_path: Path):
    from prorsa_cli.options import UpOptions
    from prorsa_cli.stack import plan_stack

    plan = plan_stack(UpOptions(workdir=tmp_path, port_base=0, with_router=True,
                                router_args=["--policy", "round_robin"]))
    spec = next(s for s in plan.specs if s.name == "router")
    assert spec.cmd[1:3] == ["-m", "sglang_router.launch_router"]
    assert "--pd-disaggregation" in spec.cmd and spec.cmd[-2:] == ["--policy", "round_robin"]
    assert spec.cmd[spec.cmd.index("--port") + 1] == str(plan.ports.router)
    assert spec.cmd[spec.cmd.index("--prometheus-port") + 1] == str(plan.ports.router_metrics)
    assert plan.router_kind == "sglang" and plan.router_url == f"http://127.0.0.1:{plan.ports.router}"
    assert not any(s.name.startswith(("agent-", "driver")) for s in plan.specs)
    # The rollout driver gets the sampler: sync by default, async with --staleness.
    drv = next(s for s in plan_stack(UpOptions(workdir=tmp_path / "a", port_base=0, emulated_cluster=True,
                                               staleness=2)).specs if s.name == "driver")
    assert drv.cmd[drv.cmd.index("--staleness") + 1] == "2"
    assert drv.cmd[drv.cmd.index("--pause-mode") + 1] == "abort"
    drv = next(s for s in plan_stack(UpOptions(workdir=tmp_path / "i", port_base=0, emulated_cluster=True,
                                               staleness=2, pause_mode="in_place")).specs if s.name == "driver")
    assert drv.cmd[drv.cmd.index("--pause-mode") + 1] == "in_place"
    # Colocation: the same router, regular workers (no PD mode).
    colo = plan_stack(UpOptions(workdir=tmp_path / "c", port_base=0, emulated_cluster=True, policy="colocation"))
    assert "--pd-disaggregation" not in next(s for s in colo.specs if s.name == "router").cmd
    # Stopped last: what the services talk to on their way out.
    assert {s.name for s in colo.specs if s.infrastructure} == {"nats-server", "router"} | {
        s.name for s in colo.specs if s.name.startswith("engine-")}
    assert not any(s.infrastructure for s in plan.specs if s.name in ("tracker", "forecaster", "allocator"))


def test_supervisor_restarts_a_crashed_process_with_backoff(tmp_path: Path):
    events: list[str] = []
    sup = Supervisor(tmp_path / "logs", tmp_path / "state.json", on_event=events.append)
    marker = tmp_path / "runs"
    # Crashes on its first two starts, then stays up.
    code = ("import pathlib,sys,time; p=pathlib.Path(sys.argv[1]); n=len(p.read_text()) if p.exists() else 0; "
            "p.write_text('x'*(n+1)); sys.exit(3) if n < 2 else time.sleep(60)")
    sup.start(ProcSpec("flaky", [sys.executable, "-c", code, str(marker)]))
    try:
        wait_until(lambda: sup.poll() is not None and sup.children["flaky"].restarts >= 2
                   and sup.returncode("flaky") is None, timeout=30, interval=0.05, what="two restarts")
        child = sup.children["flaky"]
        assert child.exit_codes == [3, 3]
        assert child.backoff == 2.0  # 0.5 -> 1 -> 2: it doubles per crash
        assert any("exited with code 3" in e for e in events)
        assert "flaky" in (tmp_path / "state.json").read_text()
    finally:
        sup.stop(grace_s=5)
    assert sup.returncode("flaky") is not None


def test_supervisor_gives_up_on_a_process_that_keeps_crashing(tmp_path: Path):
    events: list[str] = []
    sup = Supervisor(tmp_path / "logs", tmp_path / "state.json", on_event=events.append, max_restarts=2)
    sup.start(ProcSpec("crashy", [sys.executable, "-c", "import sys; print('boom'); sys.exit(4)"]))
    try:
        wait_until(lambda: sup.poll() is not None and sup.given_up, timeout=30, interval=0.05, what="giving up")
        child = sup.children["crashy"]
        # The first start and two restarts, each exiting at once; then no more restarts.
        assert sup.given_up == ["crashy"] and child.restarts == 2 and child.exit_codes == [4, 4, 4]
        assert any("giving up on it" in e for e in events)
        report = sup.gave_up_report("crashy")
        assert "restarted 2 times in a row" in report and "4, 4, 4" in report and "boom" in report
        state = json.loads((tmp_path / "state.json").read_text())["processes"]["crashy"]
        assert state["gave_up"] and not state["running"]
        for _ in range(5):
            sup.poll()
        assert child.restarts == 2 and sup.given_up == ["crashy"]
    finally:
        sup.stop(grace_s=5)


def test_supervisor_counts_a_crash_after_a_stable_run_as_a_new_incident(tmp_path: Path):
    sup = Supervisor(tmp_path / "logs", max_restarts=1)
    sup.STABLE_S = 0.3  # the class default is 30 s
    stop = tmp_path / "stop"
    # Runs until the test creates the stop file, then removes it and exits 5.
    code = ("import pathlib,sys,time; s=pathlib.Path(sys.argv[1])\n"
            "while not s.exists(): time.sleep(0.02)\n"
            "s.unlink(); sys.exit(5)")
    sup.start(ProcSpec("steady", [sys.executable, "-c", code, str(stop)]))
    child = sup.children["steady"]
    try:
        for n in (1, 2):  # each exit comes after more than STABLE_S up: a new incident, never given up
            wait_until(lambda: sup.poll() is not None and time.monotonic() - child.started > 0.5, timeout=30,
                       interval=0.02, what="a stable run")
            stop.touch()
            wait_until(lambda: sup.poll() is not None and child.restarts == n, timeout=30, interval=0.02,
                       what=f"restart {n}")
        assert sup.given_up == [] and child.crashes == 1 and child.exit_codes == [5, 5]
    finally:
        sup.stop(grace_s=5)


def test_supervisor_kills_what_ignores_sigterm(tmp_path: Path):
    sup = Supervisor(tmp_path / "logs")
    ready = tmp_path / "ready"
    code = ("import signal,time,pathlib,sys; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "pathlib.Path(sys.argv[1]).write_text('1'); time.sleep(60)")
    sup.start(ProcSpec("stubborn", [sys.executable, "-c", code, str(ready)], ready=ready.exists))
    t0 = time.monotonic()
    sup.stop(grace_s=1.0)
    assert sup.returncode("stubborn") == -9
    assert time.monotonic() - t0 < 10


def test_supervisor_stops_the_infrastructure_after_the_services(tmp_path: Path):
    # Each child appends "<name> <event> <time>" to one file. The service and the job take a
    # second to stop (as one flushing its last publishes does); the bus records when its
    # SIGTERM comes. Stopped together, the bus would be told first and gone before them;
    # stopped one by one, the second of them would be told a second after the first.
    trace = tmp_path / "trace"
    code = ("import os,pathlib,signal,sys,time\n"
            "name, linger, out = sys.argv[1], float(sys.argv[2]), pathlib.Path(sys.argv[3])\n"
            "def log(what):\n"
            "    with out.open('a') as f: f.write(f'{name} {what} {time.time():.6f}\\n')\n"
            "def term(*_):\n"
            "    log('sigterm'); time.sleep(linger); log('exit'); os._exit(0)\n"
            "signal.signal(signal.SIGTERM, term); log('up')\n"
            "while True: time.sleep(1)\n")
    up = lambda name: lambda: trace.exists() and f"{name} up" in trace.read_text()  # noqa: E731
    sup = Supervisor(tmp_path / "logs")
    sup.start(ProcSpec("bus", [sys.executable, "-c", code, "bus", "0", str(trace)], ready=up("bus"),
                       infrastructure=True))
    sup.start(ProcSpec("service", [sys.executable, "-c", code, "service", "1", str(trace)], ready=up("service")))
    sup.start(ProcSpec("job", [sys.executable, "-c", code, "job", "1", str(trace)], ready=up("job")))
    sup.stop(grace_s=10)
    at = {" ".join(line.split()[:2]): float(line.split()[2]) for line in trace.read_text().splitlines()}
    assert at["service exit"] < at["bus sigterm"] and at["job exit"] < at["bus sigterm"]
    assert abs(at["service sigterm"] - at["job sigterm"]) < 0.8  # together, not one by one
    assert all(sup.returncode(n) == 0 for n in ("bus", "service", "job"))


def test_a_one_shot_job_is_reported_once_and_not_restarted(tmp_path: Path):
    sup = Supervisor(tmp_path / "logs")
    sup.start(ProcSpec("job", [sys.executable, "-c", "print('done')"], restart=False))
    ended: list[str] = []
    wait_until(lambda: ended.extend(sup.poll()) or ended, timeout=20, interval=0.05, what="the job to end")
    assert ended == ["job"] and sup.poll() == [] and sup.children["job"].restarts == 0
    assert "done" in (tmp_path / "logs" / "job.log").read_text()


def test_any_free_block_lies_below_the_ephemeral_port_range(tmp_path: Path):
    # A port the OS may hand an outgoing connection as its source port can be gone by the
    # time a service binds it; `--port-base 0` keeps every port below that range.
    from prorsa_cli.options import UpOptions, ephemeral_low, plan_ports

    low = ephemeral_low()
    for _ in range(20):
        ports = plan_ports(UpOptions(port_base=0, emulated_cluster=True))
        assert all(20000 <= p < low for _, p in ports.named())
    assert ephemeral_low(str(tmp_path / "missing")) == 32768
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ephemeral_low(str(tmp_path / "range")) == 40000


def test_the_emulated_cluster_time_scales_the_services(tmp_path: Path, monkeypatch):
    # The emulated cluster runs `speed` times faster than the wall clock the services read:
    # the window is 10 s of the cluster's time, the allocator's durations and the
    # forecaster's priors are scaled; a real cluster gets neither.
    from prorsa_cli.options import UpOptions
    from prorsa_cli.stack import plan_stack

    monkeypatch.delenv("PRORSA_FORECASTER_TIME_SCALE", raising=False)
    monkeypatch.delenv("PRORSA_ALLOCATOR_MIN_DWELL_S", raising=False)
    monkeypatch.delenv("PRORSA_ALLOCATOR_RUN", raising=False)
    env = {s.name: s.env for s in plan_stack(UpOptions(workdir=tmp_path / "e", port_base=0,
                                                       emulated_cluster=True, speed=10.0)).specs}
    assert env["forecaster"]["PRORSA_FORECASTER_HORIZON"] == "1"
    assert env["forecaster"]["PRORSA_FORECASTER_TIME_SCALE"] == "10"
    assert env["allocator"]["PRORSA_ALLOCATOR_MIN_DWELL_S"] == "3"
    # The switch-time priors are the emulated profile's (DeepSeek-V3.2 in place: 15 s).
    assert env["allocator"]["PRORSA_ALLOCATOR_IN_PLACE_SWITCH_S"] == "1.5"
    # The allocator acts for the driver's run only; with no driver it is bound to none.
    drv = next(s for s in plan_stack(UpOptions(workdir=tmp_path / "d", port_base=0, emulated_cluster=True,
                                               run="rl-7")).specs if s.name == "driver")
    assert drv.cmd[drv.cmd.index("--run") + 1] == "rl-7"
    bound = {s.name: s.env for s in plan_stack(UpOptions(workdir=tmp_path / "b", port_base=0, emulated_cluster=True,
                                                         run="rl-7")).specs}
    assert bound["allocator"]["PRORSA_ALLOCATOR_RUN"] == "rl-7"
    real = {s.name: s.env for s in plan_stack(UpOptions(workdir=tmp_path / "r", port_base=0)).specs}
    assert real["forecaster"]["PRORSA_FORECASTER_HORIZON"] == "10"
    assert "PRORSA_FORECASTER_TIME_SCALE" not in real["forecaster"]
    assert "PRORSA_ALLOCATOR_MIN_DWELL_S" not in real["allocator"]
    assert "PRORSA_ALLOCATOR_RUN" not in real["allocator"]
    # The operator's own setting wins.
    monkeypatch.setenv("PRORSA_FORECASTER_TIME_SCALE", "4")
    again = {s.name: s.env for s in plan_stack(UpOptions(workdir=tmp_path / "o", port_base=0,
                                                         emulated_cluster=True, speed=10.0)).specs}
    assert "PRORSA_FORECASTER_TIME_SCALE" not in again["forecaster"]


def test_a_free_block_is_claimed_against_every_other_planner(tmp_path: Path, monkeypatch):
    # Two `prorsa up --port-base 0` planning at once each see the other's ports free until
    # they are bound (a decode engine's bootstrap port is bound only once it serves
    # prefill): a block is claimed, one lock file per 100-port unit, for the process's life.
    import random
    import subprocess
    import sys

    import prorsa_cli.options as o

    mine = o.PortBlocks(tmp_path / "locks", keep=2)
    monkeypatch.setattr(o, "blocks", mine)
    first = o.plan_ports(o.UpOptions(port_base=0, emulated_cluster=True), rng=random.Random(7))
    assert first.nats % o.PORT_QUANTUM == 0
    unit = first.nats // o.PORT_QUANTUM
    # Claimed by this process: a second claim (another planner) fails until it is dropped.
    other = o.PortBlocks(tmp_path / "locks")
    assert not other.claim([unit])
    mine.release()
    assert other.claim([unit])
    other.release()
    # Another process holds the unit: the same draw now plans a block that does not overlap.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys; f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); "
         "print('held', flush=True); sys.stdin.read()", str(tmp_path / "locks" / f"{unit}.lock")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        second = o.plan_ports(o.UpOptions(port_base=0, emulated_cluster=True), rng=random.Random(7))
        ports_first = {p for _, p in first.named()}
        assert not ports_first & {p for _, p in second.named()}
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    # At most `keep` claims per process: the oldest is dropped.
    mine.release()
    assert mine.claim([1]) and mine.claim([2]) and mine.claim([3])
    assert other.claim([1]) and not other.claim([3])


def test_the_advise_policy_runs_the_allocator_in_advisory_mode(tmp_path: Path):
    from prorsa_cli.options import UpOptions
    from prorsa_cli.stack import plan_stack

    def allocator(policy: str):
        plan = plan_stack(UpOptions(workdir=tmp_path / policy, port_base=0, emulated_cluster=True, policy=policy))
        return next((s for s in plan.specs if s.name == "allocator"), None)

    assert allocator("advise").env["PRORSA_ALLOCATOR_ACTUATE"] == "false"
    assert "PRORSA_ALLOCATOR_ACTUATE" not in allocator("prorsa").env
    assert allocator("static") is None and allocator("colocation") is None


def test_the_demo_is_asynchronous_by_default(tmp_path: Path):
    # `prorsa demo` runs the paper's staleness-2 rollout unless told otherwise, 3 steps
    # (a warm-up and two measured); a synchronous run defaults to 2; given steps are kept.
    from prorsa_cli.options import demo_steps

    assert demo_steps(None, 2) == 3 and demo_steps(None, 8) == 3
    assert demo_steps(None, 0) == 2
    assert demo_steps(5, 0) == 5 and demo_steps(1, 2) == 1
    r = _run(["demo", "--help"], tmp_path, env={"NO_COLOR": "1", "COLUMNS": "200"})
    assert r.returncode == 0
    assert "2 (the default): asynchronous rollout" in r.stdout and "[default: 2]" in r.stdout
    # A bad step count is still refused before anything starts.
    r = _run(["demo", "--steps", "0", "--workdir", str(tmp_path / "w")], tmp_path)
    assert r.returncode == 2 and "--steps must be >= 1" in r.stderr


def test_the_summary_says_why_trajectories_were_dropped():
    from prorsa_cli.livedemo import dropped_text

    assert dropped_text({"aborted": 385}) == "385 aborted (live at the run's last update, which ends it)"
    text = dropped_text({"stale": 3, "aborted": 2, "sandbox": 1})
    assert text.startswith("2 aborted (live at") and "3 stale (more policy versions old" in text
    assert "1 sandbox" in text and "1 sandbox (" not in text  # a reason it does not know is kept as is


def test_the_summary_counts_the_different_moves_advised():
    # In advisory mode nothing moves, so each plan names the same switches again: the
    # summary counts the switches named, the plans naming any, and the different moves.
    from prorsa_cli.report import summarise

    def plan(*moves):
        return {"type": "allocation.plan", "run": "r", "switches": [{"engine": e, "to_role": r} for e, r in moves] or None}

    events = [plan(("e1", "prefill"), ("e2", "prefill")), plan(("e1", "prefill"), ("e2", "prefill")),
              plan(), plan(("e3", "decode"))]
    s = summarise(events, "r", None, {}, 10.0)
    assert (s["plans"], s["plans_with_switches"], s["planned_switches"], s["distinct_planned_switches"]) == (4, 3, 5, 3)
