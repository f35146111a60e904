"""The small entry point every service shares: signals set an event, an AsyncExitStack
owns the connections, and the service's coroutine runs until the event is set."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from .bus import BusAuthError, BusUnavailable, StreamMissing

log = logging.getLogger("prorsa.lifecycle")

FATAL = (BusAuthError, BusUnavailable, StreamMissing)
"""Errors a service cannot fix by itself (credentials refused, no bus, no stream): it ends
with their message on one line and exit status 1 instead of a traceback."""

ServiceMain = Callable[[AsyncExitStack, asyncio.Event], Awaitable[None]]


async def run_until_stopped(main: ServiceMain, name: str, stop: asyncio.Event | None = None) -> None:
    """Run ``main(stack, stop)``; SIGINT/SIGTERM set ``stop``; close the stack on the way out.

    ``main`` should return soon after ``stop`` is set. A second signal while shutting
    down cancels it outright. One of :data:`FATAL` ends the process (``SystemExit(1)``)
    after logging its message.
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    signals = 0

    def on_signal(sig: signal.Signals) -> None:
        nonlocal signals
        signals += 1
        if signals == 1:
            log.info("%s: %s received, shutting down", name, sig.name)
            stop.set()
        elif task is not None:
            log.warning("%s: second %s, cancelling", name, sig.name)
            task.cancel()

    installed = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            loop.add_signal_handler(sig, on_signal, sig)
            installed.append(sig)
        except (NotImplementedError, RuntimeError):  # not the main thread
            pass
    try:
        async with AsyncExitStack() as stack:
            await main(stack, stop)
    except FATAL as exc:
        log.error("%s cannot run: %s", name, exc)
        raise SystemExit(1) from None
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
        log.info("%s stopped", name)


def run_service(main: ServiceMain, name: str) -> None:
    """Synchronous wrapper for console entry points."""
    try:
        asyncio.run(run_until_stopped(main, name))
    except KeyboardInterrupt:  # pragma: no cover - handled by the signal handler
        pass
