"""Headless Chromium against the console: the DOM a page renders (tests) and screenshots of
the demo run (``scripts/console-screenshots`` -> ``docs/img/console-*.png``).

Uses Debian's ``chromium`` (``apt-get install chromium``) with ``--dump-dom`` /
``--screenshot`` and a virtual time budget, so the page's fetches finish before the capture
(the API is served without the ingest, so the live stream answers 503 at once and no
request stays open).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

CHROMIUM = os.environ.get("PRORSA_CHROMIUM", "/usr/bin/chromium")
SHOTS = [  # (file, fragment, width, height)
    ("console-runs.png", "#/", 1280, 420),
    ("console-run.png", "#/run/{run}", 1400, 1500),
    ("console-trajectory.png", "#/run/{run}/traj/{traj}", 1400, 1100),
]


def chromium(*args: str, budget_ms: int = 8000, timeout: float = 60) -> str:
    """Run headless Chromium with ``args``; its stdout."""
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PRORSA_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="prorsa-chromium-") as profile:
        cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
               "--disable-extensions", f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"chromium exited {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout


def page_url(base: str, fragment: str, token: str | None) -> str:
    return f"{base}/console/" + (f"?token={quote(token)}" if token else "") + fragment


def dump_dom(base: str, fragment: str, token: str | None, budget_ms: int = 8000) -> str:
    """The page's DOM after its scripts ran (``budget_ms`` of Chromium's virtual time)."""
    return chromium("--dump-dom", page_url(base, fragment, token), budget_ms=budget_ms)


def screenshot(base: str, fragment: str, token: str | None, out: Path, width: int, height: int) -> None:
    chromium(f"--window-size={width},{height}", f"--screenshot={out}", page_url(base, fragment, token))
    if not out.exists():
        raise RuntimeError(f"chromium wrote no {out}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 30.0) -> None:
    """Poll ``url`` until it answers 200 (the API thread is up)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")
        time.sleep(0.1)


def build_demo_db(directory: Path, until: float | None = None) -> str:
    """A SQLite tracker database holding the demo run (:mod:`console_demo`), its events up to
    ``until`` seconds after its start (None: all of them); its URL."""
    from prorsa_schemas import LogWriter

    from .console_demo import T0, demo_events
    from .db import make_engine, migrate
    from .tools import load

    log = directory / "demo.jsonl"
    with LogWriter(log) as w:
        for e in demo_events():
            if until is None or e.ts <= T0 + until:
                w.write(e)
    url = f"sqlite:///{directory}/demo.db"
    eng = make_engine(url)
    migrate(eng)
    load(eng, log)
    eng.dispose()
    return url


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="console-screenshots", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("docs/img"), help="where console-*.png go (default docs/img)")
    ap.add_argument("--db", help="a tracker database URL (default: a fresh SQLite file with the demo run)")
    ap.add_argument("--run", default="demo", help="the run to show (default demo)")
    ap.add_argument("--traj", default="t3", help="the trajectory to show (default t3)")
    ap.add_argument("--until", type=float, default=57.0,
                    help="the demo run as it stands this many seconds after its start (default 57: mid-run)")
    a = ap.parse_args(argv)
    from .api import serve_api

    if not Path(CHROMIUM).exists():
        print(f"error: no Chromium at {CHROMIUM} (apt-get install chromium, or set PRORSA_CHROMIUM)", file=sys.stderr)
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prorsa-console-") as tmp:
        db = a.db or build_demo_db(Path(tmp), until=a.until)
        port, token = free_port(), "screenshot-token"
        with serve_api(db, token, "127.0.0.1", port):
            base = f"http://127.0.0.1:{port}"
            wait_http(f"{base}/healthz")
            for name, frag, w, h in SHOTS:
                out = a.out / name
                screenshot(base, frag.format(run=quote(a.run, safe=""), traj=quote(a.traj, safe="")), token, out, w, h)
                print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
