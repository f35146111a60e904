"""``prorsa switch``: publish one engine.command and wait for its outcome."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

from prorsa_runtime.bus import Credentials, connect, open_stream, publish_event
from prorsa_schemas import EngineCommand, EventError, Namespace, decode_event
from prorsa_schemas.events import Event


@dataclass
class Outcome:
    event: Event | None
    progress: list[Event]


async def request_switch(nats_url: str, ns: Namespace, engine: str, to_role: str, *,
                         run: str = "cli", deadline_s: float = 600.0, timeout: float = 900.0,
                         cmd: str | None = None, on_progress=None,
                         credentials: Credentials | None = None) -> Outcome:
    """Publish a switch command and return its ``engine.switched`` / ``engine.switch_failed``.

    ``event`` is None when no outcome arrived within ``timeout`` seconds. Publishing a
    command and reading engine events takes a user that may do both (the admin user of
    ``deploy/nats/accounts.conf``); ``credentials`` default to ``PRORSA_NATS_*`` in the
    environment.
    """
    creds = credentials if credentials is not None else Credentials.from_env()
    nc = await connect(nats_url, "prorsa-switch", timeout=10.0, credentials=creds)
    try:
        js = nc.jetstream()
        await open_stream(js, ns, nats_url, creds)
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        progress: list[Event] = []
        cmd_id = cmd or f"cli-{uuid.uuid4().hex[:16]}"

        async def on_msg(msg) -> None:
            try:
                ev = decode_event(msg.data)
            except EventError:
                return
            if getattr(ev, "cmd", None) != cmd_id:
                return
            if ev.type in ("engine.switched", "engine.switch_failed"):
                if not done.done():
                    done.set_result(ev)
            else:
                progress.append(ev)
                if on_progress:
                    on_progress(ev)

        # Subscribe before publishing, so the outcome cannot be missed.
        sub = await nc.subscribe(ns.engine_all(), cb=on_msg)
        now = time.time()
        command = EngineCommand(id=f"{cmd_id}/command", ts=now, run=run, cmd=cmd_id, engine=engine,
                                action="switch_role", to_role=to_role, deadline=now + deadline_s)
        await publish_event(js, ns, command)
        try:
            ev = await asyncio.wait_for(done, timeout)
        except asyncio.TimeoutError:
            ev = None
        await sub.unsubscribe()
        return Outcome(ev, progress)
    finally:
        await nc.close()
