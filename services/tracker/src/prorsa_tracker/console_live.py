"""Live updates for the console: the tracker's ingest hands each committed batch to a
:class:`Hub`, which keeps a bounded queue per connected client and wakes it.

The ingest runs on the tracker's event loop and the HTTP server on its own thread and
loop, so the hub is thread-safe: a lock around the queues, and each client woken with
``call_soon_threadsafe``. A client that reads slower than the tracker commits loses the
oldest notices first; the next notice it reads says how many it lost (``dropped``).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter, deque
from collections.abc import Iterable

ENGINE_PREFIX = "engine."
MAX_TRAJS = 50  # trajectory ids named per notice (the rest are counted)


def summarize(rows: Iterable[tuple]) -> dict[str, dict]:
    """Per run, what one committed batch added: ``{run: {n, types, trajs, ts, seq}}``.
    ``rows`` are the batch's event rows ``(seq, id, run, traj, type, ts, raw)``."""
    out: dict[str, dict] = {}
    for seq, _id, run, traj, typ, ts, _raw in rows:
        s = out.get(run)
        if s is None:
            s = out[run] = {"run": run, "n": 0, "types": Counter(), "trajs": [], "ts": ts, "seq": seq}
        s["n"] += 1
        s["types"][typ] += 1
        if traj is not None and len(s["trajs"]) < MAX_TRAJS and traj not in s["trajs"]:
            s["trajs"].append(traj)
        s["ts"] = max(s["ts"], ts)
        s["seq"] = seq if seq is not None else s["seq"]
    for s in out.values():
        s["types"] = dict(s["types"])
    return out


class Client:
    """One subscriber: a queue of at most ``maxlen`` notices, oldest dropped first."""

    def __init__(self, run: str, maxlen: int, loop: asyncio.AbstractEventLoop) -> None:
        self.run = run
        self.queue: deque[dict] = deque(maxlen=maxlen)
        self.dropped = 0
        self.loop = loop
        self.wake = asyncio.Event()

    def take(self, lock: threading.Lock) -> tuple[list[dict], int]:
        with lock:
            items, dropped = list(self.queue), self.dropped
            self.queue.clear()
            self.dropped = 0
            self.wake.clear()
        return items, dropped


class Hub:
    """In-process fan-out of committed batches to console clients."""

    def __init__(self, queue_max: int = 256) -> None:
        if queue_max < 1:
            raise ValueError("queue_max must be >= 1")
        self.queue_max = queue_max
        self._lock = threading.Lock()
        self._clients: set[Client] = set()

    def subscribe(self, run: str) -> Client:
        """A client for ``run``'s notices (and every run's engine events); call on its loop."""
        c = Client(run, self.queue_max, asyncio.get_running_loop())
        with self._lock:
            self._clients.add(c)
        return c

    def unsubscribe(self, c: Client) -> None:
        with self._lock:
            self._clients.discard(c)

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._clients)

    def take(self, c: Client) -> tuple[list[dict], int]:
        """The client's queued notices and how many were dropped since it last took."""
        return c.take(self._lock)

    def publish(self, rows: Iterable[tuple]) -> None:
        """Hand a committed batch's event rows to every client it concerns: a client of run R
        gets R's notice, and a notice of each other run's engine events (they move engines)."""
        with self._lock:
            if not self._clients:
                return
            clients = list(self._clients)
        per_run = summarize(rows)
        engine_only = {}
        for run, s in per_run.items():
            eng = {t: n for t, n in s["types"].items() if t.startswith(ENGINE_PREFIX)}
            if eng:
                engine_only[run] = {**s, "n": sum(eng.values()), "types": eng, "trajs": []}
        for c in clients:
            notes = [per_run[c.run]] if c.run in per_run else []
            notes += [s for run, s in engine_only.items() if run != c.run]
            if not notes:
                continue
            with self._lock:
                for note in notes:
                    if len(c.queue) == c.queue.maxlen:
                        c.dropped += 1
                    c.queue.append(note)
            try:
                c.loop.call_soon_threadsafe(c.wake.set)
            except RuntimeError:  # the client's loop is closed: it is going away
                self.unsubscribe(c)
