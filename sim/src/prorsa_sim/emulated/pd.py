"""PD pairing between emulated engines: a decode engine learns when its peer's prefill of
a request is done.

In SGLang the decode instance reserves KV, registers with the prefill instance's bootstrap
server (``bootstrap_host:bootstrap_port``, ``bootstrap_room``) and receives the KV when the
prefill is done. The emulation keeps the timing and drops the bytes: the emulated router adds
``emulated_prefill_url`` (the prefill instance's HTTP address) to the request it sends the
pair, and the decode engine long-polls ``GET {emulated_prefill_url}/_emu/kv/{room}``, which
answers when that room's prefill is done (``ok``, ``cached_tokens``) or aborted. Without it
(a client that calls the decode engine itself) the decode engine assumes the prefill ran
alone on an idle peer.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass

MAX_ROOMS = 10_000


@dataclass(frozen=True)
class PdLink:
    """Where a decode-side request's KV comes from."""

    room: int
    prefill_url: str | None = None


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
            return {"ok": False, "message": "no prefill for this room"}
        self._rooms.pop(room, None)
        return result
