"""Event builders for tests and demos of the allocator (contract events, validated by the schemas)."""

from __future__ import annotations

import itertools

from prorsa_schemas import (
    EngineDeregistered,
    EngineRegistered,
    EngineStats,
    EngineSwitched,
    EngineSwitchFailed,
    ForecastWindow,
)
from prorsa_schemas.events import DEFAULT_WINDOW_S, Parallel

RUN = "run-1"
THETA = 10_000.0  # prefill tokens/s per engine used by the tests' config
KV = 100_000  # KV tokens per engine
_ids = itertools.count(1)


def _id(kind: str) -> str:
    return f"{kind}-{next(_ids)}"


def registered(engine: str, role: str, ts: float = 0.0, gpus: int = 8, modes=("in_place",),
               attn_dp: int | None = None) -> EngineRegistered:
    """``modes`` None: a registration without ``switch_modes``."""
    return EngineRegistered(
        id=_id("reg"), ts=ts, run=RUN, engine=engine, server=f"srv-{engine}", role=role, gpus=gpus,
        kv_capacity_tokens=KV, switch_modes=None if modes is None else list(modes),
        parallel=None if attn_dp is None else Parallel(attn_dp=attn_dp),
    )


def stats(engine: str, role: str, ts: float, running: int = 0, queued: int = 0, kv_used: int = 0, **kw) -> EngineStats:
    return EngineStats(
        id=_id("st"), ts=ts, run=RUN, engine=engine, role=role, running_reqs=running, queued_reqs=queued,
        kv_used_tokens=kv_used, kv_capacity_tokens=KV, **kw,
    )


def forecast(t: float, prefill_engines: float, decode_engines: float, horizon: float = DEFAULT_WINDOW_S, ts: float | None = None) -> ForecastWindow:
    """A forecast whose demand is the given number of prefill and decode engines' worth."""
    return ForecastWindow(
        id=_id("fc"), ts=t if ts is None else ts, run=RUN, t=t, horizon=horizon,
        prefill_tokens=prefill_engines * horizon * THETA,
        decode_admit_tokens=0.0, decode_kv_tokens=decode_engines * KV * 0.25, decode_kv_now=decode_engines * KV * 0.75,
    )


def switched(engine: str, cmd: str, frm: str, to: str, ts: float, seconds: float = 5.0, mode: str = "in_place") -> EngineSwitched:
    return EngineSwitched(id=_id("sw"), ts=ts, run=RUN, engine=engine, cmd=cmd, from_role=frm, to_role=to, seconds=seconds, mode=mode)


def failed(engine: str, cmd: str, role: str, ts: float) -> EngineSwitchFailed:
    return EngineSwitchFailed(id=_id("sf"), ts=ts, run=RUN, engine=engine, cmd=cmd, role=role, error="not idle")


def deregistered(engine: str, ts: float) -> EngineDeregistered:
    return EngineDeregistered(id=_id("dr"), ts=ts, run=RUN, engine=engine, reason="shutdown")
