"""The trainer's weight sync, against the live engines.

At each policy update the rollout engines stop, drop what they hold and load the new
weights, as slime and AReaL do it against SGLang (docs/demo.md); in a sync run the batch
has drained by then, so nothing is aborted, and the next batch is dispatched once the
engines resume. For every engine, ``POST /pause_generation {"mode": "abort"}`` (every
request in flight is aborted; its trajectory re-sends the context plus what was
generated, after the sync) and ``POST /flush_cache`` (the prefixes were computed with the old weights); then,
after the sync time, ``POST /update_weight_version`` and ``POST /continue_generation``.
With the driver's ``pause_mode`` ``retract`` or ``in_place`` (SGLang's other two modes:
slime's ``--rollout-weight-sync-pause-mode retract``, and a framework that lets the
requests under way finish on the new weights) nothing is aborted: the requests in flight
stay open and go on when the engines continue (re-prefilled inside the engine under
``retract``), and SGLang refuses the flush of an engine that still holds them.
The engines synced are every worker the router has listed since the run began
(:class:`Fleet`), not only those it lists at that moment: an engine between the two
halves of a role switch is out of the router but still runs, and skipped it would come
back serving the old weights (a framework holds its engine list, not the router's). The
driver logs in to NATS as the ``rollout`` user, which reads nothing from the stream, so it
cannot take the engines' announcements as ``prorsa_sdk.coordination.engine_urls`` does; it
remembers the router's listings instead. An
engine that does not answer is logged and the run goes on, as a framework's would; one
neither listed nor answering is taken to be shut down and forgotten.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp

log = logging.getLogger("prorsa.driver")

_TIMEOUT = aiohttp.ClientTimeout(total=10.0)


async def engine_urls(client: aiohttp.ClientSession, router_url: str) -> list[str]:
    """The URLs of the workers the router lists now (prefill, decode or regular)."""
    try:
        async with client.get(f"{router_url}/workers", timeout=_TIMEOUT) as r:
            body = await r.json(content_type=None)
        return sorted({w["url"].rstrip("/") for w in body["workers"] if isinstance(w.get("url"), str)})
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError, TypeError) as exc:
        log.warning("weight sync: router %s did not list its workers (%r); no engine paused", router_url, exc)
        return []


async def _post(client: aiohttp.ClientSession, url: str, path: str, body: dict, routine: bool = False) -> bool:
    """POST and say whether it answered 200. A refusal is a warning (the engine keeps its
    old weights or stays paused) unless ``routine`` (a cache flush refused while the engine
    still holds a request)."""
    try:
        async with client.post(f"{url}{path}", json=body, timeout=_TIMEOUT) as r:
            if r.status == 200:
                return True
            (log.debug if routine else log.warning)(
                "weight sync: %s%s answered %d: %s", url, path, r.status, (await r.text())[:200])
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        log.warning("weight sync: %s%s failed: %r", url, path, exc)
    return False


class Fleet:
    """The engines a weight sync reaches: every URL the router has listed, kept while it is
    out of the router (a role switch), forgotten once it is neither listed nor answers."""

    def __init__(self) -> None:
        self.known: set[str] = set()

    def targets(self, listed: list[str]) -> list[str]:
        """The engines to sync: those listed now and those listed before."""
        self.known |= set(listed)
        return sorted(self.known)

    def settle(self, listed: list[str], paused: list[str]) -> list[str]:
        """After a pause: forget the engines neither listed nor paused; returns them."""
        gone = sorted(self.known - set(listed) - set(paused))
        self.known -= set(gone)
        for url in gone:
            log.warning("weight sync: %s is no longer listed by the router and did not answer: "
                        "taken as shut down, not synced again", url)
        return gone


async def pause(client: aiohttp.ClientSession, urls: list[str], mode: str = "abort") -> list[str]:
    """Pause every engine in ``mode`` (``abort``: abort what it holds; ``retract``: free
    the KV of what it runs, re-prefilled when it continues; ``in_place``: keep it), then
    flush its prefix cache. Returns the engines that paused."""
    ok = await asyncio.gather(*(_post(client, u, "/pause_generation", {"mode": mode}) for u in urls))
    # A cache flush is refused while an engine still holds a request: not an error here.
    await asyncio.gather(*(_post(client, u, "/flush_cache", {}, routine=True) for u, o in zip(urls, ok) if o))
    return [u for u, o in zip(urls, ok) if o]


async def resume(client: aiohttp.ClientSession, urls: list[str], version: int) -> int:
    """Name the new weights on every paused engine and let it generate again. Returns how
    many resumed."""
    await asyncio.gather(*(_post(client, u, "/update_weight_version",
                                 {"new_version": str(version), "abort_all_requests": False}) for u in urls))
    ok = await asyncio.gather(*(_post(client, u, "/continue_generation", {}) for u in urls))
    return sum(ok)
