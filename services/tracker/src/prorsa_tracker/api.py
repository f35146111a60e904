"""The read-only query API over HTTP (FastAPI, OpenAPI at /docs and /openapi.json).

Every route needs ``Authorization: Bearer <token>`` when a token is configured. Bad
parameters get a 4xx with a reason: 422 for a wrong type, 400 for an out-of-range or
unknown value, 404 for a trajectory that does not exist.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
import time
from collections.abc import Iterator

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import SecretStr

from . import queries
from .db import make_engine

_bearer = HTTPBearer(auto_error=False)

MAX_OFFSET = 2**63 - 1
"""The largest offset a page may start at: the databases' 64-bit integer (SQLite refuses a
larger one with an OverflowError, which would be a 500)."""


def create_app(db_url: str, token: str | SecretStr | None, hub=None) -> FastAPI:
    """The API app over ``db_url``; ``token`` None disables authentication (local use only);
    ``hub`` (a :class:`~prorsa_tracker.console_live.Hub`) feeds the console's live stream."""
    secret = token.get_secret_value() if isinstance(token, SecretStr) else token
    engine = make_engine(db_url)
    app = FastAPI(title="Prorsa tracker", version="1", description="Read-only trajectory history.")

    def auth(creds: HTTPAuthorizationCredentials | None = Depends(_bearer)) -> None:
        if secret is None:
            return
        if creds is None or not secrets.compare_digest(creds.credentials.encode(), secret.encode()):
            raise HTTPException(401, "missing or wrong bearer token", headers={"WWW-Authenticate": "Bearer"})

    def guard(fn, *args, **kw):
        try:
            return fn(*args, **kw)
        except queries.QueryError as exc:
            raise HTTPException(404 if str(exc).startswith(("no trajectory", "no run")) else 400, str(exc)) from None

    @app.get("/v1/runs", dependencies=[Depends(auth)])
    def list_runs() -> list[dict]:
        """Every run with its config and counters."""
        return queries.runs(engine)

    @app.get("/v1/runs/{run}/trajectories", dependencies=[Depends(auth)])
    def list_trajectories(
        run: str,
        state: str | None = Query(None, description=f"one of {', '.join(queries.STATES)} or 'live'"),
        since: float | None = Query(None, ge=0),
        until: float | None = Query(None, ge=0),
        limit: int = Query(100, ge=1, le=10_000),
        offset: int = Query(0, ge=0, le=MAX_OFFSET),
    ) -> dict:
        """A page of the run's trajectories (``next_offset`` is null on the last page)."""
        items = guard(queries.trajectories, engine, run, state, since, until, limit, offset)
        return {"items": items, "limit": limit, "offset": offset,
                "next_offset": offset + limit if len(items) == limit else None}

    @app.get("/v1/runs/{run}/trajectories/{traj}", dependencies=[Depends(auth)])
    def trajectory_history(run: str, traj: str) -> dict:
        """The trajectory's full timeline, requests and spans."""
        return guard(queries.history, engine, run, traj)

    @app.get("/v1/anomalies", dependencies=[Depends(auth)])
    def list_anomalies(run: str | None = None, limit: int = Query(100, ge=1, le=10_000), offset: int = Query(0, ge=0, le=MAX_OFFSET)) -> dict:
        items = guard(queries.anomalies, engine, run, limit, offset)
        return {"items": items, "limit": limit, "offset": offset,
                "next_offset": offset + limit if len(items) == limit else None}

    @app.get("/healthz")
    def healthz(request: Request) -> dict:
        return {"ok": True}

    from . import console

    console.install(app, engine, auth, guard, hub)
    return app


@contextlib.contextmanager
def serve_api(db_url: str, token, host: str, port: int, hub=None) -> Iterator["object"]:
    """Serve the API in a background thread for the duration of the ``with`` block."""
    import uvicorn

    server = uvicorn.Server(uvicorn.Config(create_app(db_url, token, hub), host=host, port=port, log_level="warning"))
    def run() -> None:
        try:
            server.run()
        except SystemExit:  # uvicorn could not bind (it logged why): reported below, not as a thread's traceback
            pass

    thread = threading.Thread(target=run, name="tracker-api", daemon=True)
    thread.start()
    # uvicorn that cannot bind logs it and ends its thread: the tracker must not go on
    # without the API it was asked for.
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise OSError(f"cannot serve the query API on {host}:{port} (the port is taken, or the address "
                          "is not this host's)")
        time.sleep(0.01)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(timeout=10)
