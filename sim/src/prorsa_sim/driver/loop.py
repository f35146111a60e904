"""The driver's agent loop: rollout steps of trajectories that really call the router.

Sampler: synchronous (``staleness`` 0: a step dispatches its whole batch, waits for every
reward, trains, publishes ``policy.updated`` and syncs the weights to the engines, then
dispatches the next batch) or asynchronous (``staleness`` N > 0), as the
simulator's sampler (the rules of ``prorsa_sim.sampler``, which both run): up to ``over_dispatch`` batches live at
once within an AReaL-style launch budget ((version + N + 1) batches over the admission
rate), GRPO groups dispatched whole; the trainer starts when a batch of admitted rewards
is in and trains while rollout goes on; at the update the trajectories more than N
versions old are dropped (``trajectory.dropped`` "stale") and the engines pause for the
weight sync (:mod:`.weights`): every request in flight is aborted and re-sent after it
(``pause_mode`` abort, the default; with retract or in_place it stays open and goes on). A
step's time is then the time between two updates. The run ends at the last update; the
trajectories still live are dropped ("aborted").

Time: every simulated duration (sandbox start, tool, reward, trainer) is divided by
``speed``, and the emulated engines run at the same speed, so the whole workload runs
``speed`` times faster than real time while every service runs in real (wall) time. Event
``ts`` is the wall clock, as in production.

Prefill finish: every request is streamed (SGLang's ``stream: true``), and the driver
announces ``prefill.finished`` at its first streamed chunk, when the first output token
exists (in PD: the prefill is done and its KV reached the decode engine), as a framework
that streams does. An answer that comes without a first chunk (an abort before the first
token) is announced when it comes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp

from prorsa_emulated.prefix_cache import emulated_prompt_text
from prorsa_schemas import Namespace
from prorsa_sdk import Emitter

from .. import sampler
from ..workloads import TrajectoryPlan, WorkloadSpec, get_workload, plan_trajectory, sandbox_start
from . import weights
from .config import DriverConfig

log = logging.getLogger("prorsa.driver")

DROP_REASONS = {
    "stale": "more policy versions old than the staleness bound",
    "aborted": "live at the run's last update, which ends it",
}
"""The reasons an asynchronous run drops a trajectory for (``trajectory.dropped``), with
what each means: the run's summary says it beside each count."""


@dataclass
class DriverResult:
    """What the driver did; written as JSON at the end (``DriverConfig.out``)."""

    run: str
    workload: str
    speed: float
    mode: str = "sync"
    staleness: int = 0
    trajectories: int = 0
    completed: int = 0
    requests: int = 0
    aborted_requests: int = 0
    retried_requests: int = 0
    events: int = 0
    by_type: dict[str, int] = field(default_factory=dict)
    dropped: dict[str, int] = field(default_factory=dict)
    """Trajectories dropped, by reason (:data:`DROP_REASONS`)."""
    weight_syncs: int = 0
    pause_mode: str = "abort"
    """How each weight sync paused the engines (``DriverConfig.pause_mode``)."""
    paused_engines: int = 0
    """Engine pauses of the async weight syncs, summed over the syncs."""
    step_times_s: list[float] = field(default_factory=list)
    """Wall seconds: sync, from each step's first dispatch to its last reward; async, from
    the start or the previous policy update to each update."""
    wall_s: float = 0.0
    started_at: float = 0.0
    finished_at: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)


class RouterRefused(RuntimeError):
    """The router answered a request with a client error (4xx other than 408/429)."""


class _Counted:
    """The SDK emitter, counting every event it accepted (the count the tracker must match).

    An emission runs to its end even when the trajectory that made it is cancelled (a stale
    drop): the event is published and counted, never half-sent."""

    def __init__(self, em: Emitter):
        self.em = em
        self.counts: Counter[str] = Counter()

    def __getattr__(self, name: str):
        method = getattr(self.em, name)

        def count(task: asyncio.Future) -> None:
            if not task.cancelled() and task.exception() is None:
                self.counts[task.result().type] += 1

        async def call(*args, **kwargs):
            task = asyncio.ensure_future(method(*args, **kwargs))
            task.add_done_callback(count)
            return await asyncio.shield(task)

        return call


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Driver:
    """One run of the driver. ``await Driver(cfg).run()``."""

    def __init__(self, cfg: DriverConfig):
        self.cfg = cfg
        self.spec: WorkloadSpec = get_workload(cfg.workload)
        self.result = DriverResult(run=cfg.run, workload=cfg.workload, speed=cfg.speed)
        self.result.mode = "async" if cfg.staleness else "sync"
        self.result.staleness = cfg.staleness
        self.result.pause_mode = cfg.pause_mode
        self.step = 0
        self.live = 0
        self._prewarm_free = self.spec.prewarm_pool
        # async sampler state (see the module's doc)
        self.version = 0
        self.admitted = 0
        self.next_idx = 0
        self._trainer_busy = False
        self._live: dict[str, tuple[asyncio.Task, int]] = {}  # traj -> (its task, its policy version)
        self._resumed = asyncio.Event()  # cleared while the engines are paused for a weight sync
        self._resumed.set()
        self._done = asyncio.Event()
        self._last_update = 0.0
        self._background: set[asyncio.Task] = set()
        self._rewarded: set[str] = set()
        self._fleet = weights.Fleet()  # the engines a weight sync reaches

    async def sleep_sim(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.cfg.speed)

    # -- readiness ----------------------------------------------------------------------
    async def wait_router(self, client: aiohttp.ClientSession) -> None:
        """Wait until the router lists a prefill and a decode worker (or a regular one)."""
        deadline = time.monotonic() + self.cfg.ready_timeout_s
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                async with client.get(f"{self.cfg.router_url}/workers", timeout=aiohttp.ClientTimeout(total=2.0)) as r:
                    stats = (await r.json(content_type=None))["stats"]
                pd = stats["prefill_count"] >= 1 and stats["decode_count"] >= 1
                if pd or stats.get("regular_count", 0) >= 1:  # a PD pair, or colocated workers
                    return
                last = f"workers {stats}"
            except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
                last = repr(exc)
            await asyncio.sleep(0.1)
        raise TimeoutError(f"router {self.cfg.router_url} has no prefill+decode workers after "
                           f"{self.cfg.ready_timeout_s:.0f}s ({last})")

    # -- one model request ------------------------------------------------------------------
    async def request(self, em: _Counted, client: aiohttp.ClientSession, traj: str, turn: int,
                      context: int, output: int, last: bool) -> int:
        """Queue, prefill and decode one turn (re-queued after an abort); returns the new context."""
        while True:
            req = f"{traj}-r{turn}-{uuid.uuid4().hex[:6]}"
            await em.request_queued(traj, req, turn, context)
            self.result.requests += 1
            # Every turn of a trajectory extends the same token sequence: one conversation, so
            # the engines' prefix cache (and the router's cache-aware routing) see the shared
            # prefix. Only SGLang's own fields: sglang-router drops any other.
            body = {"rid": req, "text": emulated_prompt_text(f"{self.cfg.run}/{traj}", context),
                    "sampling_params": {"max_new_tokens": output}, "stream": True}
            announced: list[bool] = []  # once announced, a re-send is not announced again
            while True:  # router or worker unavailable: the request stays queued and is re-sent
                await self._resumed.wait()  # held while the engines load new weights
                try:
                    meta = await self._stream(em, client, body, traj, req, announced)
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError):
                    meta = None  # unreachable, 5xx (no worker, engine switching), a malformed answer
                if meta is None:
                    self.result.retried_requests += 1
                    await asyncio.sleep(0.2)
                    continue
                break
            reason = meta.get("finish_reason")
            finish = reason.get("type") if isinstance(reason, dict) else "length"
            done = int(meta.get("completion_tokens") or 0)
            if not announced:
                # The answer came without a first chunk (an abort before the first token): the
                # prefill is over, as decode.finished(abort) follows a prefill in the contract.
                await em.prefill_finished(traj, req)
            if finish == "abort":
                await em.decode_finished(traj, req, done, "abort")
                self.result.aborted_requests += 1
                context += done  # re-prefill the context plus the partial output
                output = max(1, output - done)
                continue
            await em.decode_finished(traj, req, done, "stop" if last else "tool")
            return context + done

    async def _stream(self, em: _Counted, client: aiohttp.ClientSession, body: dict, traj: str, req: str,
                      announced: list[bool]) -> dict | None:
        """Send one request streamed (SGLang's ``stream: true``) and read its server-sent
        events: ``prefill.finished`` is announced at the first chunk (the first output
        token exists: the prefill is done and, in PD, its KV reached the decode engine), as
        a framework that streams would, with the chunk's ``cached_tokens``. Returns the last chunk's ``meta_info``, or None when
        the request did not get an answer (to be re-sent; an error chunk included)."""
        async with client.post(f"{self.cfg.router_url}/generate", json=body) as resp:
            if 400 <= resp.status < 500 and resp.status not in (408, 429):
                # A refusal of the request itself (sglang-router wraps the engine's:
                # {"error": {"code", "message"}}): re-sending it cannot help.
                raise RouterRefused(f"router {self.cfg.router_url} refused request {req}: "
                                    f"HTTP {resp.status}: {(await resp.text())[:300]}")
            if resp.status != 200:
                return None
            meta = None
            async for line in resp.content:
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return None
                meta = chunk["meta_info"]
                if not announced and meta.get("finish_reason") is None:
                    announced.append(True)
                    # SGLang's meta_info says how much of the prompt its prefix cache held.
                    cached = meta.get("cached_tokens")
                    await em.prefill_finished(traj, req, cached_tokens=cached if isinstance(cached, int) else None)
            return meta

    # -- one trajectory -----------------------------------------------------------------------
    async def trajectory(self, em: _Counted, client: aiohttp.ClientSession, traj: str, group: str,
                         plan: TrajectoryPlan, version: int = 0) -> None:
        plan = plan.capped(self.cfg.max_turns, self.cfg.max_output)
        turns = len(plan.outputs)
        context = min(plan.prompt_tokens, self.spec.max_context)
        try:
            await em.dispatched(traj, context, group=group, policy_version=version)
            mode, delay, pooled = sandbox_start(plan, self.spec, self._prewarm_free)
            if mode is not None:
                if pooled:
                    # The pool refills a cold start's time after a prewarmed sandbox is taken
                    # (the simulator's rule).
                    self._prewarm_free -= 1
                    asyncio.get_running_loop().call_later(self.spec.cold_median_s / self.cfg.speed,
                                                          self._refill_pool)
                await em.sandbox_started(traj, mode)
                await self.sleep_sim(delay)
                await em.sandbox_ready(traj)
            for turn in range(turns):
                out = plan.outputs[turn]
                last = turn == turns - 1
                context = await self.request(em, client, traj, turn, context, out, last)
                if last:
                    break
                result = plan.results[turn] if turn < len(plan.results) else 0
                await em.tool_started(traj, tool="sandbox.exec", calls=1)
                await self.sleep_sim(plan.tool_s[turn] if turn < len(plan.tool_s) else 0.0)
                await em.tool_finished(traj, result, ok=True)
                context = min(context + result, self.spec.max_context)
            await em.reward_started(traj)
            await self.sleep_sim(plan.reward_s)
            self._rewarded.add(traj)  # from here it ends with its reward, even if cancelled
            await em.reward_finished(traj, plan.admitted, reward=plan.reward)
            self.result.completed += 1
        finally:
            self.live -= 1
            self._live.pop(traj, None)
        if self.cfg.staleness and not self._closing and not self._done.is_set():
            self.admitted += plan.admitted
            self._maybe_train(em, client)
            self._fill(em, client)

    def _refill_pool(self) -> None:
        self._prewarm_free += 1

    def _launch(self, em: _Counted, client: aiohttp.ClientSession, traj: str, group: str, index: int) -> asyncio.Task:
        plan = plan_trajectory(self.spec, self.cfg.seed, index)
        self.live += 1
        self.result.trajectories += 1
        task = asyncio.create_task(self.trajectory(em, client, traj, group, plan, self.version))
        self._live[traj] = (task, self.version)
        if self.cfg.staleness:
            task.add_done_callback(self._trajectory_done)
        return task

    def _trajectory_done(self, task: asyncio.Task) -> None:
        """Async: a trajectory that failed (the router refused a request) ends the run."""
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())

    # -- the async sampler and trainer --------------------------------------------------------
    def _fill(self, em: _Counted, client: aiohttp.ClientSession) -> None:
        """Dispatch while under the live cap and the launch budget; a GRPO group whole
        (the simulator's rules: :mod:`prorsa_sim.sampler`)."""
        cfg, g = self.cfg, self.spec.group_size
        cap = sampler.live_cap(cfg.batch_size, cfg.staleness, cfg.over_dispatch)
        budget = sampler.launch_budget(self.version, cfg.staleness, cfg.batch_size, self.spec.admission_rate)
        while sampler.may_dispatch(self.live, self.next_idx, cap, budget, g):
            i = self.next_idx
            self.next_idx += 1
            self._launch(em, client, f"t{i:06d}", f"g{i // g:05d}", i)
        if not self.live and not self._trainer_busy and not self._done.is_set():
            # Nothing live, nothing to launch, no batch to train on: it would wait for ever.
            self._fail(RuntimeError(
                f"the async sampler stalled at policy version {self.version}: its launch budget "
                f"({budget} trajectories) is spent and {self.admitted} rewards were admitted, "
                f"fewer than the {(self.version + 1) * cfg.batch_size} the next update needs"))

    def _maybe_train(self, em: _Counted, client: aiohttp.ClientSession) -> None:
        if not self._trainer_busy and sampler.trainer_ready(self.admitted, self.version, self.cfg.batch_size):
            self._trainer_busy = True
            task = asyncio.create_task(self._train(em, client))
            self._background.add(task)
            task.add_done_callback(self._trained)

    def _trained(self, task: asyncio.Task) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._fail(task.exception())

    _failure: BaseException | None = None

    def _fail(self, exc: BaseException) -> None:
        if self._failure is None:
            self._failure = exc
        self._done.set()

    async def _train(self, em: _Counted, client: aiohttp.ClientSession) -> None:
        """Train (rollout goes on), publish the update, drop the stale, sync the weights."""
        cfg = self.cfg
        await self.sleep_sim(cfg.train_s)
        self._trainer_busy = False
        self.version += 1
        last = self.step + 1 >= cfg.steps
        now = time.monotonic()
        self.result.step_times_s.append(round(now - self._last_update, 3))
        self._last_update = now
        self.step += 1
        log.info("policy update %d (%d live)", self.version, self.live)
        if last:
            # The run ends at this update: nothing is launched from here on, and what is
            # still live is not trained on. It is dropped before the update is published:
            # policy.updated tells the consumers that the live trajectories carry over and
            # re-prefill, which these do not. The engines still load the new weights, so
            # that they report the version policy.updated names.
            self._closing = True
            await self._drop(em, self._live_sorted(), "aborted")
        await em.policy_updated(self.version)
        if not last:
            stale = [(t, task) for t, (task, v) in self._live.items()
                     if sampler.is_stale(v, self.version, cfg.staleness)]
            await self._drop(em, stale, "stale")
        await self._sync_weights(client)
        if last:
            self._done.set()
            return
        self._maybe_train(em, client)
        self._fill(em, client)

    async def _sync_weights(self, client: aiohttp.ClientSession) -> None:
        """The weight sync after a policy update: every engine stops and, in ``pause_mode``
        abort, drops what it holds (those the router lists and those between the two halves of a role switch:
        weights.Fleet), flushes its prefix cache, and after ``weight_sync_s`` names the new
        version and generates again. Trajectories hold their next request meanwhile."""
        cfg = self.cfg
        self._resumed.clear()
        try:
            listed = await weights.engine_urls(client, cfg.router_url)
            urls = self._fleet.targets(listed)
            paused = await weights.pause(client, urls, cfg.pause_mode)
            self._fleet.settle(listed, paused)
            urls = [u for u in urls if u in self._fleet.known]
            self.result.paused_engines += len(paused)
            await self.sleep_sim(cfg.weight_sync_s)
            await weights.resume(client, urls, self.version)
            self.result.weight_syncs += 1
        finally:
            self._resumed.set()

    _closing = False

    def _live_sorted(self) -> list[tuple[str, asyncio.Task]]:
        return sorted(((t, task) for t, (task, _) in self._live.items()), key=lambda x: x[0])

    async def _drop(self, em: _Counted, trajs: list[tuple[str, asyncio.Task]], reason: str) -> None:
        """End these trajectories without a reward: stop their tasks (a request in flight is
        abandoned: the engine aborts it), then publish ``trajectory.dropped``."""
        for _, task in trajs:
            task.cancel()
        await asyncio.gather(*(task for _, task in trajs), return_exceptions=True)
        for traj, _ in trajs:
            if traj in self._rewarded:
                continue  # its reward was on its way: it ended with it
            await em.dropped(traj, reason)
            self.result.dropped[reason] = self.result.dropped.get(reason, 0) + 1

    async def _run_async(self, em: _Counted, client: aiohttp.ClientSession) -> None:
        self._last_update = time.monotonic()
        self._fill(em, client)
        await self._done.wait()  # the last update dropped what was live
        if self._failure is not None:
            raise self._failure

    async def _run_sync(self, em: _Counted, client: aiohttp.ClientSession) -> None:
        cfg = self.cfg
        index = 0
        for step in range(cfg.steps):
            self.step = self.version = step
            began = time.monotonic()
            tasks = []
            for k in range(cfg.batch_size):
                tasks.append(self._launch(em, client, f"s{step}-t{k}", f"s{step}-g{k // self.spec.group_size}", index))
                index += 1
            await asyncio.gather(*tasks)
            self.result.step_times_s.append(round(time.monotonic() - began, 3))
            log.info("step %d done in %.1fs", step, self.result.step_times_s[-1])
            if step + 1 < cfg.steps:
                await self.sleep_sim(cfg.train_s)  # the trainer; engines are idle meanwhile
                self.version = step + 1
                await em.policy_updated(self.version)
                # The new weights reach the engines before the next batch is dispatched, as
                # the simulator's sync step does it (and verl's): pause, flush, load, resume.
                await self._sync_weights(client)

    # -- steps ----------------------------------------------------------------------------
    def _progress(self) -> None:
        if self.cfg.progress is None:
            return
        total = self.cfg.batch_size * self.cfg.steps
        _write_atomic(self.cfg.progress, json.dumps({
            "run": self.cfg.run, "step": self.step, "steps": self.cfg.steps, "completed": self.result.completed,
            "total": total, "live": self.live, "requests": self.result.requests,
            "aborted": self.result.aborted_requests, "events": sum(self._em.counts.values()) if self._em else 0,
        }))

    async def _report_progress(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self._progress()
            try:
                await asyncio.wait_for(stop.wait(), 0.5)
            except asyncio.TimeoutError:
                pass

    _em: _Counted | None = None

    async def run(self) -> DriverResult:
        cfg = self.cfg
        ns = Namespace(prefix=cfg.prefix, stream=cfg.stream)
        # aiohttp, not httpx: the driver holds a request open per live trajectory, and httpx's
        # pool slows down with hundreds in flight (seconds of added latency at 128).
        connector = aiohttp.TCPConnector(limit=4096)
        timeout = aiohttp.ClientTimeout(total=None, connect=5.0)
        self.result.started_at = time.time()
        t0 = time.monotonic()
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
            await self.wait_router(client)
            self._fleet.targets(await weights.engine_urls(client, cfg.router_url))
            raw = Emitter(run=cfg.run, nats_url=cfg.nats_url, namespace=ns, name="prorsa-driver")
            await raw.start()
            em = self._em = _Counted(raw)
            stop = asyncio.Event()
            reporter = asyncio.create_task(self._report_progress(stop))
            try:
                await em.run_started(self.result.mode, cfg.batch_size, group_size=self.spec.group_size,
                                     max_staleness=cfg.staleness if cfg.staleness else None,
                                     prompt_tokens_mean=int(self.spec.prompt_median))
                await (self._run_async(em, client) if cfg.staleness else self._run_sync(em, client))
                await raw.flush(cfg.flush_timeout_s)
            finally:
                stop.set()
                await reporter
                await raw.close(cfg.flush_timeout_s)
        self.result.by_type = dict(sorted(em.counts.items()))
        self.result.events = sum(em.counts.values())
        self.result.wall_s = round(time.monotonic() - t0, 3)
        self.result.finished_at = time.time()
        self._progress()
        if cfg.out is not None:
            _write_atomic(cfg.out, self.result.to_json())
        return self.result


async def run_driver(cfg: DriverConfig) -> DriverResult:
    """Run the configured workload to completion; returns (and writes) the result."""
    return await Driver(cfg).run()
