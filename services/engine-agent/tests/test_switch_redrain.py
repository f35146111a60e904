"""An in-place flip that finds the engine busy drains again, against a real emulated SGLang
over HTTP: the procedure's shell (procedure.run_switch) and the core's re-drain together.

The agent's drain takes one idle reading of ``/v1/loads`` as drained; a request can still
reach the engine before the flip (one the router had already sent, one in SGLang's HTTP and
tokenizer layer, which ``/v1/loads`` does not see). The test puts a request on the engine
after that reading by starting the procedure at the flip, with the engine busy."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import httpx
import pytest

from prorsa_emulated.cluster import EmulatedProcess, engine_command, free_port
from prorsa_engine_agent.clients import EngineClient
from prorsa_engine_agent.config import AgentSettings, InstanceConfig
from prorsa_engine_agent.core import Phase, begin
from prorsa_engine_agent.instances import EngineState
from prorsa_engine_agent.journal import Journal
from prorsa_engine_agent.procedure import PhaseFailed, restart, run_switch
from prorsa_engine_agent.weights import Weights
from prorsa_runtime.testing import async_wait_until
from prorsa_schemas import EngineCommand


class _Agent:
    """What the procedure reads of the agent: its settings and journal, the weights policy,
    the decode graph figure and the router registration (recorded, no router here)."""

    def __init__(self, journal: Journal) -> None:
        self.settings = AgentSettings(poll_s=0.02)
        self.journal = journal
        self.policy = None
        self.registered: list[str] = []

    async def decode_graph_gb(self, st: EngineState) -> float:
        return 1.5

    async def ensure_registered(self, st: EngineState, role: str) -> None:
        self.registered.append(role)

    def launched_weights(self, st: EngineState) -> Weights:
        return Weights(st.inst.model, st.inst.weight_version)


class _Processes:
    """The process table as ``restart`` reads it: the engine runs; a stop is recorded."""

    def __init__(self) -> None:
        self.stopped: list[str] = []

    def exited(self, engine: str, pid: int | None) -> bool:
        return False

    async def stop(self, engine: str, pid: int | None) -> None:
        self.stopped.append(engine)


@pytest.fixture
def engine(tmp_path):
    """An emulated prefill engine (a real process), its port."""
    port = free_port()
    eng = EmulatedProcess("e", engine_command(port, "prefill", speed=1.0), f"http://127.0.0.1:{port}",
                          log=tmp_path / "engine.log").start()
    try:
        eng.wait_healthy(60)
        yield port
    finally:
        eng.stop()


async def _busy(http: httpx.AsyncClient, client: EngineClient) -> asyncio.Task:
    """A prompt of some seconds of prefill on the engine (no PD peer: the engine answers it
    itself), returned once the engine reports it; the task is its answer."""
    late = asyncio.create_task(http.post(f"{client.url}/generate", json={
        "input_ids": [7] * 40_000, "sampling_params": {"max_new_tokens": 1}}))

    async def busy() -> bool:
        return not (await client.loads()).idle

    await async_wait_until(busy, timeout=10, interval=0.02, what="the request on the engine")
    return late


def _served(resp: httpx.Response) -> bool:
    return resp.status_code == 200 and resp.json()["meta_info"]["finish_reason"]["type"] != "abort"


def _switch(cmd: str, mode: str, phase: Phase):
    c = EngineCommand(id="i", ts=0.0, run="r", cmd=cmd, engine="e", action="switch_role", to_role="decode",
                      deadline=1e12)
    return replace(begin(c, "prefill", mode, 0.0), phase=phase)


async def test_a_flip_that_finds_the_engine_busy_drains_again_and_switches(engine, tmp_path):
    url = f"http://127.0.0.1:{engine}"
    async with httpx.AsyncClient(timeout=60) as http:
        client = EngineClient(http, url)
        st = EngineState(InstanceConfig(engine="e", port=engine, launch="external"), client, role="prefill")
        agent = _Agent(Journal(tmp_path / "journal.json"))
        late = await _busy(http, client)
        done = await run_switch(agent, st, _switch("c1", "in_place", Phase.SWITCH))
        resp = await late
        role = await client.role()
    assert done.phase is Phase.DONE, done.error
    assert done.redrains == 1 and done.aborted == 0
    assert (done.role_now, agent.registered, role) == ("decode", ["decode"], "decode")
    assert _served(resp)  # the request that arrived late was served, not aborted


async def test_a_restart_that_finds_the_engine_busy_does_not_stop_it(engine, tmp_path):
    # The process would take the request with it: the phase fails as busy (core: DRAIN again)
    # and the engine keeps running and serving.
    url = f"http://127.0.0.1:{engine}"
    async with httpx.AsyncClient(timeout=60) as http:
        client = EngineClient(http, url)
        st = EngineState(InstanceConfig(engine="e", port=engine, launch="sglang"), client, role="prefill", pid=1)
        agent = _Agent(Journal(tmp_path / "journal.json"))
        agent.processes = _Processes()
        late = await _busy(http, client)
        with pytest.raises(PhaseFailed) as failed:
            await restart(agent, st, _switch("c2", "restart", Phase.RESTART))
        assert failed.value.busy and failed.value.safe_to_restore
        assert "just before the stop" in failed.value.detail
        assert agent.processes.stopped == []
        assert _served(await late)
