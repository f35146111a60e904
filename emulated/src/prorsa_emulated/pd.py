"""PD pairing between emulated engines, keyed as SGLang keys it: a decode engine learns when
the prefill of its request is done from the prefill instance's bootstrap server.

In SGLang a PD router (sglang-router, or the emulated one) sends the same request to one
prefill and one decode instance, with ``bootstrap_host`` (the prefill's host),
``bootstrap_port`` (its ``--disaggregation-bootstrap-port``) and a random ``bootstrap_room``
added. The decode instance reserves KV, registers with the bootstrap server at
``bootstrap_host:bootstrap_port`` for that room and receives the KV when the prefill is
done. The emulation keeps the timing and drops the bytes: the prefill engine serves
``GET /_emu/kv/{room}`` on its bootstrap port, which answers when that room's prefill is
done (``ok``, ``cached_tokens``) or aborted, and the decode engine long-polls it. Without
bootstrap fields (a client that calls the decode engine itself) the decode engine assumes
the prefill ran alone on an idle peer.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from dataclasses import dataclass

from aiohttp import web

MAX_ROOMS = 10_000
MAX_WAIT_S = 3600.0
"""The longest a decode peer may wait for a room (``timeout`` of ``/_emu/kv``): a KV
transfer the driver gives up on long before; an unbounded one would hold a connection and
its room for good."""
log = logging.getLogger("prorsa.emulated")


@dataclass(frozen=True)
class PdLink:
    """Where a decode-side request's KV comes from: the prefill's bootstrap server and room."""

    room: int
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None

    @property
    def kv_url(self) -> str | None:
        """The prefill's answer for this room, or None when the request names no peer."""
        if not self.bootstrap_host or not self.bootstrap_port:
            return None
        host = f"[{self.bootstrap_host}]" if ":" in self.bootstrap_host else self.bootstrap_host
        return f"http://{host}:{self.bootstrap_port}/_emu/kv/{self.room}"


class RoomBoard:
    """Prefill side: the outcome of each bootstrap room, awaited by decode peers."""

    def __init__(self) -> None:
        self._rooms: OrderedDict[int, asyncio.Future] = OrderedDict()

    def _get(self, room: int) -> asyncio.Future:
        fut = self._rooms.get(room)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._rooms[room] = fut
            while len(self._rooms) > MAX_ROOMS:  # forget the oldest answered rooms
                old, f = next(iter(self._rooms.items()))
                if not f.done():
                    break
                self._rooms.pop(old)
        return fut

    def done(self, room: int, result: dict) -> None:
        fut = self._get(room)
        if not fut.done():
            fut.set_result(result)

    async def wait(self, room: int, timeout_s: float) -> dict:
        """The room's outcome; ``{"ok": False}`` if nothing is known within ``timeout_s``."""
        fut = self._get(room)
        try:
            result = await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            if self._rooms.get(room) is fut and not fut.done():
                self._rooms.pop(room)  # nobody prefilled it: no room kept for a waiter that left
            return {"ok": False, "message": "no prefill for this room"}
        self._rooms.pop(room, None)
        return result


class BootstrapServer:
    """The emulated bootstrap server of a prefill instance: ``GET /_emu/kv/{room}`` on
    ``--disaggregation-bootstrap-port`` (SGLang's prefill listens there for its decode peers)."""

    def __init__(self, rooms: RoomBoard, host: str, port: int):
        self.rooms, self.host, self.port = rooms, host, port
        self._runner: web.AppRunner | None = None

    @property
    def running(self) -> bool:
        return self._runner is not None

    async def start(self) -> None:
        """Listen; raises OSError when the port is taken (as SGLang's prefill fails to start)."""
        if self._runner is not None:
            return
        app = web.Application()
        app.router.add_get("/_emu/kv/{room}", self._kv)
        app.router.add_get("/health", lambda _r: web.Response(text="OK"))
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _kv(self, request: web.Request) -> web.Response:
        try:
            room = int(request.match_info["room"])
            timeout = float(request.query.get("timeout", "600"))
        except ValueError:
            return web.json_response({"ok": False, "message": "room and timeout must be numbers"}, status=400)
        if not 0 < timeout <= MAX_WAIT_S:
            return web.json_response({"ok": False, "message": f"timeout must be > 0 and at most {MAX_WAIT_S:g} s"},
                                     status=400)
        return web.json_response(await self.rooms.wait(room, timeout))
