"""Sharing the engines with a framework that owns the router (slime, verl's own managers).

Such a framework aborts and updates weights on the engines it finds in the router's worker
list. A Prorsa role switch takes its engine off the router while it drains, so that list
misses it: the framework's abort would not reach its requests, and its weight update would
not reach its weights. :func:`engine_urls` is the list to use instead: the router's workers
and every engine an engine agent announced (``engine.registered`` on the bus, less those
it gave up, ``engine.deregistered``). :func:`abort_all` sends SGLang's
``POST /abort_request {"abort_all": true}`` to each of them.

The other half is the engine agent's: it never switches an engine while a weight update
is in progress on it (generation paused, or a weight version older than the last
``policy.updated``): checked before it takes the engine off the router, again once it is
off, and again just before the flip or the relaunch; a switch that finds one waits
(``update_wait_s``), then puts the engine back in the router in its old role
(docs/engine-agent.md).

    urls = await engine_urls("http://router:30000")       # instead of the router's /workers
    await abort_all("http://router:30000")                # instead of aborting each listed worker
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import httpx
from nats.errors import Error as NatsError, TimeoutError as NatsTimeoutError

from prorsa_runtime.bus import Credentials, connect
from prorsa_schemas import DEFAULT, Namespace, decode_event


async def router_workers(router_url: str, http: httpx.AsyncClient) -> list[str]:
    """The URLs in the router's worker list (sglang-router 0.3.2's ``GET /workers``)."""
    resp = await http.get(f"{router_url.rstrip('/')}/workers")
    resp.raise_for_status()
    return [w["url"] for w in resp.json().get("workers", []) if isinstance(w, dict) and w.get("url")]


async def _read_all(js: Any, stream: str, subject: str, timeout: float) -> list[tuple[int, Any]]:
    """Every event on ``subject`` (stream sequence, event), oldest first."""
    got: list[tuple[int, Any]] = []
    done = asyncio.get_running_loop().create_future()

    async def on_msg(msg: Any) -> None:
        got.append((msg.metadata.sequence.stream, decode_event(msg.data)))
        if msg.metadata.num_pending == 0 and not done.done():
            done.set_result(None)

    sub = await js.subscribe(subject, stream=stream, cb=on_msg, ordered_consumer=True)  # from the start
    try:
        await asyncio.wait_for(done, timeout)
    finally:
        await sub.unsubscribe()
    return got


class CoordinationError(RuntimeError):
    """The engines' announcements could not be read from the stream."""


async def announced_engines(nats_url: str | None = None, *, namespace: Namespace = DEFAULT,
                            credentials: Credentials | None = None, timeout: float = 10.0) -> dict[str, str]:
    """``engine -> URL`` of every engine the engine agents announced and did not give up,
    read from the stream (the latest ``engine.registered`` per engine, less a later
    ``engine.deregistered``).

    Reading the stream needs a NATS user allowed to create a consumer: without auth, or
    ``admin`` on deploy/nats/accounts.conf, whose ``rollout`` user (the framework's
    publishing credentials) reads nothing. A user the server refuses gets no answer, which
    is raised as :class:`CoordinationError` after ``timeout``, naming the user."""
    url = nats_url or os.environ.get("PRORSA_NATS_URL", "nats://127.0.0.1:4222")
    creds = credentials if credentials is not None else Credentials.from_env()
    nc = await connect(url, "prorsa-coordination", credentials=creds, timeout=timeout)
    try:
        js = nc.jetstream()
        events: list[tuple[int, Any]] = []
        for t in ("engine.registered", "engine.deregistered"):
            subject = namespace.subject_for_type(t)
            try:
                info = await js.stream_info(namespace.stream, subjects_filter=subject)
                if (info.state.subjects or {}).get(subject, 0):
                    events += await _read_all(js, namespace.stream, subject, timeout)
            except (asyncio.TimeoutError, NatsTimeoutError, NatsError) as exc:
                who = f"user {creds.user!r}" if creds.user else "this connection"
                raise CoordinationError(
                    f"could not read {subject} from stream {namespace.stream} as {who} within {timeout:g}s "
                    f"({type(exc).__name__}): reading the engines' announcements needs a user allowed to create "
                    "a consumer (deploy/nats/accounts.conf: admin; its rollout user reads nothing)") from None
        urls: dict[str, str] = {}
        for _, ev in sorted(events, key=lambda x: x[0]):
            if ev.type == "engine.registered" and ev.url:
                urls[ev.engine] = ev.url
            elif ev.type == "engine.deregistered":
                urls.pop(ev.engine, None)
        return urls
    finally:
        await nc.close()


async def engine_urls(router_url: str, nats_url: str | None = None, *, namespace: Namespace = DEFAULT,
                      http: httpx.AsyncClient | None = None, timeout: float = 10.0) -> list[str]:
    """Every engine a framework's abort or weight update must reach: the router's workers and
    the engines the agents announced (those a switch has taken off the router among them)."""
    own = http is None
    http = http or httpx.AsyncClient(timeout=timeout)
    try:
        listed = await router_workers(router_url, http)
    finally:
        if own:
            await http.aclose()
    announced = await announced_engines(nats_url, namespace=namespace, timeout=timeout)
    return sorted(set(listed) | {u.rstrip("/") for u in announced.values()})


async def abort_all(router_url: str, nats_url: str | None = None, *, namespace: Namespace = DEFAULT,
                    timeout: float = 10.0) -> dict[str, int | str]:
    """``POST /abort_request {"abort_all": true}`` to every engine of :func:`engine_urls`;
    returns each URL's HTTP status (or the error, for an engine that did not answer)."""
    async with httpx.AsyncClient(timeout=timeout) as http:
        urls = await engine_urls(router_url, nats_url, namespace=namespace, http=http, timeout=timeout)

        async def one(url: str) -> int | str:
            try:
                return (await http.post(f"{url}/abort_request", json={"abort_all": True})).status_code
            except httpx.HTTPError as exc:
                return f"{type(exc).__name__}: {exc}"

        return dict(zip(urls, await asyncio.gather(*(one(u) for u in urls))))


__all__ = ["CoordinationError", "abort_all", "announced_engines", "engine_urls", "router_workers"]
