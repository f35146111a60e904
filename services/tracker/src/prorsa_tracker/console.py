"""The web console: static pages under ``/console/`` and the JSON and live endpoints they read.

The HTML, JS and CSS (``console/static/``, shipped in the package) hold no data and are
served without a token; every endpoint under ``/console/api/`` needs the API's bearer
token, which the page keeps in ``sessionStorage`` and sends as ``Authorization: Bearer``
(the live stream too: it is read with ``fetch``, not ``EventSource``, so the token never
goes into a URL).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import FileResponse, RedirectResponse, StreamingResponse
from fastapi.staticfiles import StaticFiles
from sqlalchemy import Engine

from . import console_queries as cq
from . import queries
from .console_live import Hub

STATIC = Path(__file__).parent / "console" / "static"
RUN_RE = re.compile(r"[A-Za-z0-9_.-]{1,128}")
KEEPALIVE_S = 10.0


def _sse(event: str, data: dict) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def install(app: FastAPI, engine: Engine, auth, guard, hub: Hub | None) -> None:
    """Add the console's pages and endpoints to ``app`` (``auth``: the API's token check;
    ``guard``: its QueryError -> 4xx mapping; ``hub``: the live feed, None when this API
    runs without the tracker's ingest)."""
    app.mount("/console/static", StaticFiles(directory=STATIC), name="console-static")
    deps = [Depends(auth)]

    @app.get("/console", include_in_schema=False)
    def console_redirect() -> RedirectResponse:
        return RedirectResponse("/console/")

    @app.get("/console/", include_in_schema=False)
    def console_page() -> FileResponse:
        """The console's single page (no data: everything comes from /console/api with the token)."""
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/console/api/runs", dependencies=deps)
    def console_runs() -> dict:
        """Every run, each flagged ``rollout`` (declared or with a dispatched trajectory)."""
        rows = queries.runs(engine)
        for r in rows:
            r["rollout"] = bool(r.get("declared")) or (r.get("dispatched") or 0) > 0
        return {"runs": rows, "live": hub is not None}

    @app.get("/console/api/runs/{run}", dependencies=deps)
    def console_run(run: str) -> dict:
        """The run's counters and its trajectories counted by state."""
        return guard(cq.overview, engine, run)

    @app.get("/console/api/runs/{run}/windows", dependencies=deps)
    def console_windows(run: str, horizon: float = Query(10.0, gt=0, le=86_400,
                                                         description="window length when no forecast names one")) -> dict:
        """Actual demand per window next to the forecast published for it."""
        return guard(cq.windows, engine, run, horizon)

    @app.get("/console/api/runs/{run}/engines", dependencies=deps)
    def console_engines(run: str) -> dict:
        """Engines per role over the run (a step series)."""
        return guard(cq.engine_roles, engine, run)

    @app.get("/console/api/runs/{run}/switches", dependencies=deps)
    def console_switches(run: str) -> dict:
        """The run's role switches: engine, from -> to, reason, outcome, duration."""
        return {"switches": guard(cq.switches, engine, run)}

    @app.get("/console/api/runs/{run}/trajectories/{traj}", dependencies=deps)
    def console_trajectory(run: str, traj: str) -> dict:
        """The trajectory's history (as ``/v1``) plus its events in the order applied."""
        out = guard(queries.history, engine, run, traj)
        out["events"] = cq.trajectory_events(engine, run, traj)
        return out

    @app.get("/console/api/runs/{run}/stream", dependencies=deps)
    async def console_stream(run: str, request: Request) -> StreamingResponse:
        """Server-sent events: ``hello`` once, then a ``batch`` per committed batch that
        touches the run (its counts by type, up to 50 trajectory ids, last ts and stream
        seq; other runs' engine events too), ``dropped`` with how many notices a slow
        reader lost, and a comment every 10 s to keep the connection open."""
        if not RUN_RE.fullmatch(run):
            raise HTTPException(400, "run must be 1..128 characters of A-Z a-z 0-9 _ . -")
        if hub is None:
            raise HTTPException(503, "no live stream: this API runs without the tracker's ingest "
                                     "(start it with `prorsa tracker run --http-port ...`)")
        client = hub.subscribe(run)

        async def events():
            try:
                yield _sse("hello", {"run": run, "queue_max": hub.queue_max})
                while not await request.is_disconnected():
                    try:
                        await asyncio.wait_for(client.wake.wait(), KEEPALIVE_S)
                    except TimeoutError:
                        yield ": keepalive\n\n"
                        continue
                    items, dropped = hub.take(client)
                    if dropped:
                        yield _sse("dropped", {"dropped": dropped})
                    for item in items:
                        yield _sse("batch", item)
            finally:
                hub.unsubscribe(client)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
