"""Headless Chromium against the console: the DOM a page renders (tests) and screenshots of
the demo run (``scripts/console-screenshots`` -> ``docs/img/console-*.png``).

Uses Debian's ``chromium`` (``apt-get install chromium``) two ways:

- ``--dump-dom`` / ``--screenshot`` with a virtual time budget, so the page's fetches finish
  before the capture. That suits pages whose requests all end (the API served without the
  ingest answers the live stream 503 at once).
- :class:`Browser`, the DevTools protocol over ``--remote-debugging-pipe``, for a page that
  keeps a stream open: Chromium's virtual clock does not wait for a stream's messages, which
  arrive in real time, so :meth:`Tab.wait_for` polls the page in real time until it shows
  what is awaited.
"""

from __future__ import annotations

import argparse
import json
import os
import select
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


# Headless, no sandbox (runs as root in CI containers), no GPU, no first-run or extension noise.
_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run", "--disable-extensions")


def chromium(*args: str, budget_ms: int = 8000, timeout: float = 60) -> str:
    """Run headless Chromium with ``args``; its stdout."""
    if not Path(CHROMIUM).exists():
        raise FileNotFoundError(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PRORSA_CHROMIUM)")
    with tempfile.TemporaryDirectory(prefix="prorsa-chromium-") as profile:
        cmd = [CHROMIUM, *_FLAGS, f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", *args]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"chromium exited {res.returncode}: {res.stderr[-2000:]}")
    return res.stdout


class Browser:
    """Headless Chromium driven by the DevTools protocol over a pipe (``--remote-debugging-pipe``:
    the browser reads commands on its fd 3 and answers on fd 4, one JSON message per NUL).
    A context manager; :meth:`open` gives a :class:`Tab`."""

    def __init__(self, timeout: float = 60.0) -> None:
        if not Path(CHROMIUM).exists():
            raise FileNotFoundError(f"no Chromium at {CHROMIUM} (apt-get install chromium, or set PRORSA_CHROMIUM)")
        self.timeout = timeout
        self._profile = tempfile.TemporaryDirectory(prefix="prorsa-chromium-")
        self._stderr = tempfile.TemporaryFile()
        cmd_r, self._cmd_w = os.pipe()  # we write commands, the browser reads fd 3
        self._ans_r, ans_w = os.pipe()  # the browser answers on fd 4, we read

        def fds() -> None:  # in the child, before exec: the pipe ends become its fds 3 and 4
            os.dup2(cmd_r, 3)
            os.dup2(ans_w, 4)

        self._proc = subprocess.Popen(
            [CHROMIUM, *_FLAGS, f"--user-data-dir={self._profile.name}", "--remote-debugging-pipe", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._stderr, preexec_fn=fds, pass_fds=(3, 4))
        os.close(cmd_r)
        os.close(ans_w)
        self._buf, self._next_id = b"", 0

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                self.call("Browser.close", timeout=10)
            except (OSError, RuntimeError, TimeoutError):
                pass
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait(timeout=10)
        for fd in (self._cmd_w, self._ans_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._stderr.close()
        self._profile.cleanup()

    def _died(self) -> RuntimeError:
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:].decode(errors="replace")
        return RuntimeError(f"chromium closed its DevTools pipe (exit {self._proc.poll()}): {tail}")

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float | None = None) -> dict:
        """Send one DevTools command; its result (events that arrive meanwhile are skipped)."""
        self._next_id += 1
        ident = self._next_id
        msg: dict = {"id": ident, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        try:
            os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        except BrokenPipeError:
            raise self._died() from None
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            while b"\0" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self._ans_r], [], [], left)[0]:
                    raise TimeoutError(f"chromium did not answer {method} within {limit:.0f}s")
                chunk = os.read(self._ans_r, 1 << 16)
                if not chunk:
                    raise self._died()
                self._buf += chunk
            raw, self._buf = self._buf.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == ident:
                if "error" in answer:
                    raise RuntimeError(f"chromium refused {method}: {answer['error']}")
                return answer.get("result", {})

    def open(self, url: str) -> Tab:
        """A new tab loading ``url``."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        return Tab(self, session)


class Tab:
    """One page of a :class:`Browser`."""

    def __init__(self, browser: Browser, session: str) -> None:
        self.browser, self.session = browser, session

    def eval(self, expression: str) -> object:
        """The value of a JavaScript expression in the page (None while the page cannot run it yet)."""
        res = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        return None if "exceptionDetails" in res else res["result"].get("value")

    def dom(self) -> str:
        """The page's DOM as HTML, as ``--dump-dom`` prints it."""
        return self.eval("document.documentElement ? document.documentElement.outerHTML : ''") or ""

    def wait_for(self, text: str, timeout: float = 60.0, interval: float = 0.05) -> str:
        """Poll the page until its DOM contains ``text``; that DOM. TimeoutError (with the DOM's
        end) when it does not within ``timeout`` seconds of real time."""
        deadline = time.monotonic() + timeout
        probe = f"!!document.documentElement && document.documentElement.outerHTML.includes({json.dumps(text)})"
        while not self.eval(probe):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the page did not show {text!r} within {timeout:.0f}s; it shows: {self.dom()[-1500:]}")
            time.sleep(interval)
        return self.dom()


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
