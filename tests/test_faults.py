# Over 400 lines on purpose: every fault runs against the one live stack this module starts
# (a module-scoped fixture, about a minute to bring up); split, each part would start its own.
"""The fault suite: one live `prorsa up --emulated-cluster` run under the shipped
deploy/nats/server.conf (a NATS user per service), and the faults an unlucky operator or a
hostile RL framework brings, one after the other while the run goes on:

* a forged ``engine.command`` from the rollout user (refused by the server on the command
  subject; an anomaly row, never a switch, when disguised on a rollout subject);
* poison (1,000 nested ``[``) on a rollout, an engine and the command subject;
* an old event re-sent after the tracker's memory de-duplication window (a small
  ``PRORSA_TRACKER_DEDUP_CACHE``), and one with a known id but other content;
* kill -9 of the tracker, the forecaster, the allocator, an engine agent in the middle of a
  role switch, and the nats-server (restarted by the supervisor on the same store).

Each fault checks what it breaks (a row, a refusal, a restart, the service working again);
the last test checks the whole run: it completes, published = stored, no duplicate, no
anomaly in the run, forecasts for every window, only the killed services restarted.
Before the shared run, `prorsa up` must exit 1 when a service keeps crashing.

The tests share one stack (the faults are spaced: each waits for the previous recovery)
and run in file order; the last one checks the whole run, so it means most when the module
runs as a whole. The stack's output is in the test's
temporary directory (``up.out``, ``logs/``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from prorsa_cli.report import scrape
from prorsa_cli.options import UpOptions, plan_ports
from prorsa_runtime.testing import wait_until
from prorsa_schemas import DEFAULT, EngineCommand, encode_event
from prorsa_schemas.events import ROLLOUT_TYPES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[1]
SERVER_CONF = ROOT / "deploy" / "nats" / "server.conf"
PY = [sys.executable, "-m", "prorsa_cli.main"]
RUN = "faults"
BATCH, STEPS = 16, 5
POISON = b"[" * 1000
# The tracker keeps max(DEDUP_CACHE, 3 x BATCH_MAX) ids in memory: 1,000 here (the least
# it accepts), so an event re-sent 1,100 messages later is decided by the events table alone.
WINDOW = 1000
ENV = {**os.environ, "PRORSA_ALLOCATOR_PREFILL_TOKENS_PER_S": "5000", "PRORSA_TRACKER_DEDUP_CACHE": str(WINDOW),
       "PRORSA_TRACKER_BATCH_MAX": "300"}
USERS = {"admin": "PRORSA_ADMIN_NATS_PASSWORD", "rollout": "PRORSA_ROLLOUT_NATS_PASSWORD",
         "allocator": "PRORSA_ALLOCATOR_NATS_PASSWORD", "engine-agent": "PRORSA_AGENT_NATS_PASSWORD"}


class Stack:
    """A running `prorsa up` and what a test reads from it (ports from its --port-base)."""

    def __init__(self, workdir: Path, *args: str, engines: int = 6):
        self.workdir = workdir
        self.base = plan_ports(UpOptions(port_base=0, emulated_cluster=True, engines=engines)).nats
        self.out = workdir / "up.out"
        cmd = PY + ["up", "--workdir", str(workdir), "--port-base", str(self.base), *args]
        with open(self.out, "wb") as fh:
            self.proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=ENV)
        self.injected: dict[str, int] = {}  # what the tests published on purpose -> its stream seq
        self.killed: set[str] = set()
        self.measured: dict[str, str] = {}  # fault -> what was measured (printed by the last test)
        self._killed_at = 0.0

    # -- where things are
    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.base}"

    def metrics(self, service: str) -> dict[str, float]:
        port = {"tracker": 3, "forecaster": 4, "allocator": 5, "agent-node0": 10, "agent-node1": 11}[service]
        return scrape(f"http://127.0.0.1:{self.base + port}")

    def engine_url(self, i: int) -> str:
        return f"http://127.0.0.1:{self.base + 40 + 2 * i}"

    def password(self, user: str) -> str:
        lines = (self.workdir / "nats-passwords.env").read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)[USERS[user]]

    def output(self) -> str:
        return self.out.read_text(errors="replace")

    # -- the process table and the durable log
    def state(self) -> dict:
        return json.loads((self.workdir / "up-state.json").read_text())["processes"]

    def sql(self, query: str, *params: object) -> list[tuple]:
        try:
            db = sqlite3.connect(f"file:{self.workdir / 'tracker.db'}?mode=ro", uri=True, timeout=10)
        except sqlite3.OperationalError:  # the tracker has not created the file yet
            return []
        try:
            return db.execute(query, params).fetchall()
        except sqlite3.OperationalError:  # ... nor its tables
            return []
        finally:
            db.close()

    def stored(self) -> int:
        """Rollout events of the run in the tracker's events table."""
        marks = ",".join("?" * len(ROLLOUT_TYPES))
        rows = self.sql(f"select count(*) from events where run = ? and type in ({marks})", RUN, *sorted(ROLLOUT_TYPES))
        return rows[0][0] if rows else 0

    def position(self) -> int:
        rows = self.sql("select max(seq) from positions")
        return (rows[0][0] or 0) if rows else 0

    def anomaly(self, seq: int) -> tuple | None:
        rows = self.sql("select reason, raw, subject, event_id, run from anomalies where seq = ?", seq)
        return rows[0] if rows else None

    # -- faults
    def assert_live(self) -> None:
        driver = self.state()["driver"]
        assert driver["running"], (f"the run ended before this fault (driver exit {driver['exit_codes']}): "
                                   f"raise STEPS\n{self.output()[-3000:]}")

    def progress(self) -> dict:
        """The driver's progress file (rewritten every 0.5 s)."""
        try:
            return json.loads((self.workdir / "progress.json").read_text())
        except (OSError, ValueError):
            return {}

    def wait_busy(self) -> None:
        """Wait until trajectories are in flight (not the pause between two steps)."""
        self.assert_live()
        wait_until(lambda: self.progress().get("live", 0) >= 4 or not self.state()["driver"]["running"],
                   timeout=60, interval=0.05, what="trajectories in flight")
        self.assert_live()

    def kill(self, name: str, busy: bool = True) -> int:
        """kill -9 one supervised process (once trajectories are in flight, with ``busy``);
        returns its pid."""
        if busy:
            self.wait_busy()
        self.assert_live()
        pid = self.state()[name]["pid"]
        os.kill(pid, signal.SIGKILL)
        self._killed_at = time.monotonic()
        self.killed.add(name)
        return pid

    def since_kill(self) -> float:
        return time.monotonic() - self._killed_at

    def wait_restarted(self, name: str, old_pid: int, health: str | None = None, timeout: float = 120) -> float:
        """Wait until the supervisor has restarted ``name`` (and it answers ``health``);
        returns the seconds since the kill."""
        def back() -> bool:
            p = self.state()[name]
            return p["running"] and p["pid"] != old_pid and p["restarts"] >= 1
        wait_until(back, timeout=timeout, interval=0.1, what=f"the supervisor to restart {name}")
        assert -9 in self.state()[name]["exit_codes"]
        if health:
            wait_until(lambda: _http_ok(health), timeout=timeout, interval=0.1, what=f"{name} healthy again")
        return self.since_kill()

    def published(self) -> int:
        """Rollout events the driver has published so far."""
        return self.progress().get("events", 0)

    def caught_up(self, timeout: float = 120) -> tuple[int, float]:
        """Wait until the tracker stores every event the driver had published by now (what
        was published while a service or the bus was down included), and that no event is
        stored twice; returns (published, seconds since the last kill)."""
        want = self.published()
        wait_until(lambda: self.stored() >= want, timeout=timeout, interval=0.1,
                   what=f"the tracker to store the {want} events published so far ({self.stored()} stored)")
        assert self.sql("select count(*) - count(distinct event_id) from events")[0][0] == 0
        return want, self.since_kill()

    def finish(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail("prorsa up did not finish in time:\n" + self.output()[-4000:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: up stops its children
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _http_ok(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


class Login:
    """A plain nats-py client logged in as one of the deployment's users, collecting the
    server's asynchronous errors (a permissions violation arrives as one)."""

    def __init__(self, nc, errors: list[str]):
        self.nc, self.errors, self.js = nc, errors, nc.jetstream()

    @classmethod
    async def as_user(cls, stack: Stack, user: str) -> "Login":
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc).lower())

        nc = await nats.connect(stack.nats_url, user=user, password=stack.password(user), error_cb=on_error,
                                allow_reconnect=False, inbox_prefix=f"_INBOX.{user}", name=f"faults-{user}")
        return cls(nc, errors)

    async def publish(self, subject: str, data: bytes, msg_id: str | None = None) -> int:
        """A JetStream publish; returns the stream sequence it got."""
        ack = await self.js.publish(subject, data, timeout=10, headers={"Nats-Msg-Id": msg_id or uuid.uuid4().hex})
        return ack.seq

    async def refused(self, subject: str, data: bytes) -> None:
        await self.nc.publish(subject, data, reply=self.nc.new_inbox())
        await self.nc.flush()
        text = f'permissions violation for publish to "{subject.lower()}"'
        deadline = time.monotonic() + 10
        while not any(text in e for e in self.errors):
            assert time.monotonic() < deadline, f"no refusal of {subject}: {self.errors}"
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        await self.nc.close()


# -- `prorsa up` gives up on a service that keeps crashing -----------------------------------

def test_up_exits_1_when_a_service_keeps_crashing(tmp_path: Path):
    # The tracker's SQLite file is destroyed under it (a disk fault): every restart ends at
    # once with a permanent database error. After --max-restarts restarts, up gives up.
    stack = Stack(tmp_path, "--policy", "static", "--max-restarts", "1", engines=2)
    try:
        wait_until(lambda: "all services up" in stack.output() or stack.proc.poll() is not None, timeout=180,
                   interval=0.1, what="the services to be up")
        assert stack.proc.poll() is None, stack.output()
        pid = stack.state()["tracker"]["pid"]
        for suffix in ("", "-wal", "-shm"):
            path = Path(f"{tmp_path / 'tracker.db'}{suffix}")
            if path.exists():
                path.write_bytes(b"this is no SQLite database" * 100)
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code = stack.proc.wait(180)
    finally:
        stack.stop()
    out = stack.output()
    assert code == 1, out[-3000:]
    tracker = stack.state()["tracker"]
    assert tracker["gave_up"] and tracker["restarts"] == 1 and tracker["exit_codes"][0] == -9, tracker
    assert "tracker kept exiting" in out and "restarted once in a row" in out, out[-3000:]
    assert "cannot be used" in out  # the tracker's own one-line reason, from its log tail
    assert not any(p["running"] for p in stack.state().values())
    print(f"\n| a service that keeps crashing | prorsa up exit {code}; tracker exit codes {tracker['exit_codes']}; "
          f"given up {time.monotonic() - killed:.1f} s after the first kill; every process stopped |")


# -- one live run, faults in turn ------------------------------------------------------------

@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    wd = tmp_path_factory.mktemp("faults")
    s = Stack(wd, "--emulated-cluster", "--nats-config", str(SERVER_CONF), "--engines", "6", "--prefill", "1",
              "--batch-size", str(BATCH), "--steps", str(STEPS), "--max-turns", "5", "--horizon", "3",
              "--speed", "10", "--run", RUN)
    try:
        wait_until(lambda: s.stored() >= 40 or s.proc.poll() is not None, timeout=240, interval=0.2,
                   what="the run to be under way")
        assert s.proc.poll() is None, s.output()[-4000:]
        yield s
    finally:
        s.stop()


async def test_a_forged_command_from_the_rollout_user_is_refused_or_an_anomaly(stack: Stack):
    stack.assert_live()
    forged = EngineCommand(id="forged-1", ts=time.time(), run="intruder", cmd="forged-1", engine="node0-e0",
                           action="switch_role", to_role="decode", deadline=time.time() + 600)
    rollout = await Login.as_user(stack, "rollout")
    t0 = time.monotonic()
    try:
        # On the command subject: the server refuses it.
        await rollout.refused(DEFAULT.commands(), encode_event(forged))
        # Disguised on a rollout subject it may publish on: stored, never as a command.
        stack.injected["forged"] = await rollout.publish(DEFAULT.subject_for_type("trajectory.dispatched"),
                                                         encode_event(forged))
        # A planted event whose id is re-sent with other content later (test below).
        stack.injected["planted"] = await rollout.publish(DEFAULT.subject_for_type("trajectory.dispatched"),
                                                          _dispatched("planted-1", 100))
    finally:
        await rollout.close()
    row = wait_until(lambda: stack.anomaly(stack.injected["forged"]), timeout=60, interval=0.1,
                     what="the forged command's anomaly row")
    took = time.monotonic() - t0
    reason, raw, subject, event_id, run = row
    assert raw == encode_event(forged) and subject == DEFAULT.subject_for_type("trajectory.dispatched")
    assert "engine.command" in reason and event_id == "forged-1" and run == "intruder", row
    log = (stack.workdir / "logs" / "nats-server.log").read_text()
    assert re.search(r'user:rollout" - Publish Violation - Subject "prorsa\.control\.engine\.command"', log), log[-2000:]
    stack.measured["forged engine.command from the rollout user"] = (
        f"on prorsa.control.engine.command: refused by the server (Publish Violation, user rollout, in its log); "
        f"on a rollout subject: an anomaly row {took:.1f} s after the publish ({reason[:60]}...); never carried out")


async def test_poison_is_an_anomaly_row_and_a_dead_letter_in_every_consumer(stack: Stack):
    stack.assert_live()
    before = {n: p["pid"] for n, p in stack.state().items()}
    seqs = {}
    t0 = time.monotonic()
    for user, subject in (("rollout", DEFAULT.subject_for_type("request.queued")),
                          ("engine-agent", DEFAULT.subject_for_type("engine.registered")),
                          ("allocator", DEFAULT.commands())):
        login = await Login.as_user(stack, user)
        try:
            seqs[subject] = await login.publish(subject, POISON)
        finally:
            await login.close()
    stack.injected.update({f"poison {s}": q for s, q in seqs.items()})
    for subject, seq in seqs.items():
        reason, raw, subj, _id, _run = wait_until(lambda: stack.anomaly(seq), timeout=60, interval=0.1,
                                                  what=f"an anomaly row for the poison on {subject}")
        assert raw == POISON and subj == subject and "nest" in reason.lower(), reason
    rows = time.monotonic() - t0

    def dead(service: str) -> float:
        return stack.metrics(service).get(f'prorsa_{service.split("-")[0]}_dead_letters_total{{kind="invalid"}}', 0)

    # The forecaster reads rollout and engine events, the allocator engine and control
    # events, each agent its commands: each skipped what it could not read, and goes on.
    counted = {}
    for service, n in (("forecaster", 2), ("allocator", 2), ("agent-node0", 1), ("agent-node1", 1)):
        counted[service] = wait_until(lambda: (d := dead(service)) >= n and d, timeout=60, interval=0.2,
                                      what=f"{service}'s dead letters")
    assert {n: p["pid"] for n, p in stack.state().items()} == before  # nothing crashed
    stack.measured["poison: 1,000 nested [ on a rollout, an engine and the command subject"] = (
        f"3 anomaly rows (reason: nested too deeply) within {rows:.1f} s of the first publish; dead letters (invalid): "
        + ", ".join(f"{k} {v:.0f}" for k, v in counted.items()) + "; no service restarted")


def test_kill_9_of_the_tracker(stack: Stack):
    pid = stack.kill("tracker")
    up = stack.wait_restarted("tracker", pid, f"http://127.0.0.1:{stack.base + 3}/health")
    # It resumes after its stored position and takes in what was published while it was down.
    n, caught = stack.caught_up()
    stack.measured["kill -9 tracker"] = (f"restarted and healthy {up:.1f} s after the kill; all {n} events "
                                         f"published by then stored {caught:.1f} s after it")


def test_kill_9_of_the_forecaster(stack: Stack):
    pid = stack.kill("forecaster")
    up = stack.wait_restarted("forecaster", pid, f"http://127.0.0.1:{stack.base + 4}/health")
    wait_until(lambda: stack.metrics("forecaster").get("prorsa_forecaster_windows_total", 0) >= 1, timeout=60,
               interval=0.2, what="a forecast from the restarted forecaster")
    first = stack.since_kill()
    n, _ = stack.caught_up()
    stack.measured["kill -9 forecaster"] = (f"restarted and healthy {up:.1f} s after the kill, its first window "
                                            f"out {first:.1f} s after it; {n} published = stored")


def test_kill_9_of_the_allocator(stack: Stack):
    pid = stack.kill("allocator")
    up = stack.wait_restarted("allocator", pid, f"http://127.0.0.1:{stack.base + 5}/health")
    wait_until(lambda: stack.metrics("allocator").get("prorsa_allocator_plans_total", 0) >= 1, timeout=60,
               interval=0.2, what="a plan from the restarted allocator")
    first = stack.since_kill()
    n, _ = stack.caught_up()
    stack.measured["kill -9 allocator"] = (f"restarted and healthy {up:.1f} s after the kill, its first plan "
                                           f"{first:.1f} s after it; {n} published = stored")


async def test_kill_9_of_an_engine_agent_in_the_middle_of_a_switch(stack: Stack):
    stack.wait_busy()
    mine = [1, 3, 5]  # node1's engines (engines are dealt to the agents in turn)
    # Slow switches (100 emulated s = 10 s at x10), so that one is surely in flight.
    for i in mine:
        httpx.post(stack.engine_url(i) + "/_emu/config", json={"switch_seconds": 100}, timeout=5).raise_for_status()
    journal = stack.workdir / "agents" / "node1" / "journal.json"

    def switching() -> list[str]:
        try:
            inflight = json.loads(journal.read_text()).get("inflight", {})
        except (OSError, ValueError):
            return []
        return [c for c, sw in inflight.items() if sw["phase"] == "switch"]

    def outcome(c: str) -> list[tuple[str, bytes]]:
        return stack.sql("select type, raw from events where type in ('engine.switched', 'engine.switch_failed') "
                         "and cast(raw as text) like ?", f'%"cmd":"{c}"%')

    admin = await Login.as_user(stack, "admin")
    try:
        ended_early: list = []
        for attempt in range(3):
            # An operator's switch of node1-e5 (as `prorsa switch` sends it). The agent refuses
            # it when the allocator is switching that engine just then: then once more.
            role = httpx.get(stack.engine_url(5) + "/model_info", timeout=5).json()["disaggregation_mode"]
            cmd, now = f"op-{uuid.uuid4().hex[:8]}", time.time()
            await admin.publish(DEFAULT.commands(), encode_event(EngineCommand(
                id=f"{cmd}/command", ts=now, run="operator", cmd=cmd, engine="node1-e5", action="switch_role",
                to_role="prefill" if role == "decode" else "decode", deadline=now + 300)), msg_id=f"{cmd}/command")
            inflight = wait_until(lambda: switching() or outcome(cmd), timeout=60, interval=0.02,
                                  what="a switch of node1 in its switch phase")
            if isinstance(inflight[0], str):
                break
            ended_early.append(inflight[0][1][:400])
            if b"already switching" in inflight[0][1]:
                # Refused because the allocator is switching node1-e5 just then: that switch
                # is one of node1's in flight too; once it reaches its switch phase, it is
                # the one the kill lands in.
                try:
                    inflight = wait_until(switching, timeout=60, interval=0.02,
                                          what="the allocator's switch of node1-e5 in its switch phase")
                    break
                except AssertionError:
                    pass  # it ended first: send the operator's switch once more
        else:
            pytest.fail(f"three operator switches of node1-e5 ended before their switch phase: {ended_early}")
    finally:
        await admin.close()
    pid = stack.kill("agent-node1", busy=False)
    for i in mine:
        httpx.post(stack.engine_url(i) + "/_emu/config", json={"switch_seconds": 2}, timeout=5).raise_for_status()
    up = stack.wait_restarted("agent-node1", pid, f"http://127.0.0.1:{stack.base + 11}/health")
    # The restarted agent resumes each switch it was in and reports how it ended: switched
    # once (one engine.switched per command, the engine in its new role).
    for c in inflight:
        ended = wait_until(lambda: outcome(c), timeout=120, interval=0.2, what=f"the outcome of {c}")
        assert [t for t, _ in ended] == ["engine.switched"], ended
        done = json.loads(ended[0][1])
        assert httpx.get(stack.engine_url(int(done["engine"].rsplit("e", 1)[1])) + "/model_info",
                         timeout=5).json()["disaggregation_mode"] == done["to_role"]
    switched = stack.since_kill()
    n, _ = stack.caught_up()
    stack.measured["kill -9 engine agent mid-switch"] = (
        f"killed in the switch phase of {len(inflight)} switch(es); restarted and healthy {up:.1f} s after the "
        f"kill; each resumed and switched once ({switched:.1f} s after the kill); {n} published = stored")


async def test_an_old_event_resent_after_the_memory_window_is_not_applied_again(stack: Stack):
    stack.assert_live()
    first = stack.sql("select pos, event_id, raw from events where run = ? and type = 'trajectory.dispatched' "
                      "order by pos limit 1", RUN)[0]
    pos, event_id, raw = first
    # More messages after it than the tracker keeps ids of in memory.
    wait_until(lambda: stack.sql("select count(*) from events where pos > ?", pos)[0][0] > WINDOW + 100,
               timeout=120, interval=0.2, what=f"{WINDOW + 100} events after the one to re-send")
    dup_before = stack.metrics("tracker").get("prorsa_tracker_duplicates_total", 0)
    rollout = await Login.as_user(stack, "rollout")
    try:
        if "planted" not in stack.injected:  # this test run alone
            stack.injected["planted"] = await rollout.publish(DEFAULT.subject_for_type("trajectory.dispatched"),
                                                              _dispatched("planted-1", 100))
        # A new Nats-Msg-Id: as a re-send after the stream's own duplicate window would be.
        resent = await rollout.publish(DEFAULT.subject_for_type("trajectory.dispatched"), bytes(raw))
        conflict = await rollout.publish(DEFAULT.subject_for_type("trajectory.dispatched"),
                                         _dispatched("planted-1", 999))
    finally:
        await rollout.close()
    stack.injected["conflict"] = conflict
    wait_until(lambda: stack.position() >= max(resent, conflict), timeout=60, interval=0.1,
               what="the tracker to commit past the re-sent events")
    # The re-send: skipped as a duplicate, not applied (it would be an illegal transition
    # now, so an anomaly row would show it), and counted.
    assert stack.sql("select count(*) from events where event_id = ?", event_id)[0][0] == 1
    assert stack.anomaly(resent) is None
    wait_until(lambda: stack.metrics("tracker").get("prorsa_tracker_duplicates_total", 0) >= dup_before + 1,
               timeout=30, interval=0.2, what="the duplicate counted")
    # A known id with other content: an anomaly row with the copy's bytes; the first stays.
    reason, raw2, *_ = stack.anomaly(conflict)
    assert "duplicate event id 'planted-1' with other content" in reason and b"999" in raw2
    assert b'"prompt_tokens":100' in stack.sql("select raw from events where event_id = 'planted-1'")[0][0]
    older = stack.sql("select count(*) from events where pos > ?", pos)[0][0]
    stack.measured[f"an old event re-sent after the memory window ({WINDOW} ids)"] = (
        f"re-sent {older} stored events later: not applied (one row for its id, no anomaly), "
        f"prorsa_tracker_duplicates_total +1; the same id with other content: an anomaly row")


def test_kill_9_of_the_nats_server(stack: Stack):
    pid = stack.kill("nats-server")
    up = stack.wait_restarted("nats-server", pid)
    # Same store: the driver's buffered events and the services' consumers carry on.
    n, caught = stack.caught_up()
    stack.measured["kill -9 nats-server"] = (f"restarted on the same store {up:.1f} s after the kill; all {n} events "
                                             f"published by then stored {caught:.1f} s after it")


def test_the_run_completes_with_published_equal_to_stored(stack: Stack):
    code = stack.finish()
    out = stack.output()
    assert code == 0, out[-4000:]
    driver = json.loads((stack.workdir / "driver.json").read_text())
    summary = json.loads((stack.workdir / "summary.json").read_text())
    assert driver["completed"] == BATCH * STEPS
    # Published = stored, type by type; no event stored twice; every trajectory done.
    by_type = dict(stack.sql("select type, count(*) from events where run = ? group by type", RUN))
    assert {t: by_type.get(t, 0) for t in driver["by_type"]} == driver["by_type"]
    assert summary["tracker_events"] == driver["events"] == stack.stored()
    assert stack.sql("select count(*) - count(distinct event_id) from events")[0][0] == 0
    assert stack.sql("select state, count(*) from trajectories where run = ? group by state", RUN) == [
        ("done", BATCH * STEPS)]
    # The anomalies are exactly what was injected: nothing in the run, no switch confused.
    assert summary["anomalies"] == 0
    seqs = sorted(q for (q,) in stack.sql("select seq from anomalies"))
    assert seqs == sorted(stack.injected[k] for k in stack.injected if k != "planted"), (
        stack.sql("select seq, subject, reason from anomalies"), stack.injected)
    # The forged command was never carried out.
    assert stack.sql("select count(*) from events where cast(raw as text) like '%forged-1%' and type != 'trajectory.dispatched'"
                     ) == [(0,)]
    # A forecast for every window, across the forecaster's restart.
    starts = sorted({json.loads(r)["t"] for (r,) in stack.sql("select raw from events where type = 'forecast.window'")})
    assert starts and all(abs((b - a) - 3.0) < 1e-6 for a, b in zip(starts, starts[1:])), starts
    # Only the killed services restarted, once each; nothing was given up.
    state = stack.state()
    assert {n for n, p in state.items() if p["restarts"]} == stack.killed, state
    assert all(state[n]["restarts"] == 1 and state[n]["exit_codes"] == [-9] for n in stack.killed), state
    # The only permissions violations in the server's log are the rollout user's forgery.
    log = "".join(p.read_text() for p in (stack.workdir / "logs").glob("nats-server.log"))
    violations = [line for line in log.splitlines() if "Violation" in line]
    assert violations and all('"prorsa.control.engine.command"' in v for v in violations), violations
    stack.measured["the whole run"] = (
        f"prorsa up exit 0; {driver['events']} published = {stack.stored()} stored, 0 duplicates, "
        f"{BATCH * STEPS} trajectories done, 0 anomalies in the run ({len(seqs)} rows: the injected ones), "
        f"{len(starts)} consecutive forecast windows, restarts: "
        + ", ".join(f"{n} {state[n]['restarts']}" for n in sorted(stack.killed)) + ", others 0")
    (stack.workdir / "faults.json").write_text(json.dumps(stack.measured, indent=2))
    print("\n" + "\n".join(f"| {k} | {v} |" for k, v in stack.measured.items()))


def _dispatched(event_id: str, prompt_tokens: int) -> bytes:
    return json.dumps({"v": 1, "id": event_id, "type": "trajectory.dispatched", "ts": time.time(),
                       "run": "intruder", "traj": "x", "prompt_tokens": prompt_tokens},
                      separators=(",", ":")).encode()
