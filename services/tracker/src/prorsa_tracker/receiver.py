"""The tracker's receiver: a child process that consumes JetStream and forwards raw messages.

Why a process: receiving through nats-py (protocol parsing, header parsing, the ordered
consumer's bookkeeping) costs about as much Python time per message as decoding,
applying and writing it. In one process the two share one interpreter lock; split, they
run on two cores. The child is a pure transport with no state worth keeping: the
tracker's SQL position stays the only position, so the child can die (or be killed with
its parent) at any moment without losing or duplicating anything.

Protocol (length-prefixed frames: 4-byte big-endian length, then a pickle; both ends
are this module, so pickle is safe here):

* parent -> child stdin: first a config dict (``url``, ``name``, ``credentials``,
  ``prefix``, ``stream``, ``start_seq``, ``max_inflight``); then ints, the number of
  messages the parent has finished with (credit).
* child -> parent stdout: lists of ``(stream_seq, raw_bytes, invalid, subject)`` in stream
  order, where ``invalid`` is None when :func:`prorsa_schemas.decode_event` accepted the
  message (the strict validation runs here, on the receiver's core) or the reason it did
  not (whatever the bytes hold: no message can stop the receiver); an empty list once
  subscribed; every few seconds a dict of the consumer's figures from the server's consumer
  info (``num_pending``: not yet delivered; ``in_transit``: delivered and not yet handed
  over) and the reader's ``resets`` / ``gaps``.

Flow control: the child reads through :class:`prorsa_runtime.reader.OrderedReader` (an
ordered pull consumer) and asks the server for more only while fewer than
``max_inflight`` messages are requested or forwarded and not yet credited (the database
is down, the parent is behind), so neither process buffers without bound and the server
never has a reason to cut it as a slow consumer. A gap, a missed heartbeat or a reconnect
re-creates the consumer after the last forwarded sequence; nothing is skipped.

The child exits when its stdin closes and, on Linux, when its parent dies (even by
kill -9: ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import BinaryIO

log = logging.getLogger("prorsa.tracker.receiver")

_LEN = struct.Struct("!I")
FLUSH_MESSAGES = 2000  # forward at most this many per frame
FLUSH_DELAY_S = 0.002  # and at most this long after the first unsent message
STATS_EVERY_S = 2.0  # how often the consumer's backlog is read from the server and sent up


def write_frame(fh: BinaryIO, obj) -> None:
    """Pickle ``obj`` and write it as one length-prefixed frame."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    fh.write(_LEN.pack(len(data)) + data)
    fh.flush()


def read_frame(fh: BinaryIO):
    """Read one frame; raises EOFError when the other end has closed."""
    head = fh.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError
    n = _LEN.unpack(head)[0]
    data = fh.read(n)
    if len(data) < n:
        raise EOFError
    return pickle.loads(data)


# --- the parent's side ---------------------------------------------------------------


class ReceiverProcess:
    """Starts the child and hands its batches to ``on_items`` (called on the event loop).

    ``on_exit`` is called on the loop if the child ends on its own. ``credit(n)`` tells the
    child that ``n`` more messages are done with.
    """

    def __init__(self, config: dict, on_items: Callable[[list], None], on_exit: Callable[[], None]) -> None:
        self.config = config
        self._on_items = on_items
        self._on_exit = on_exit
        self._proc: subprocess.Popen | None = None
        self._closing = False
        self._lock = threading.Lock()

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        """Spawn the child (``python -m prorsa_tracker.receiver``) and its reader thread."""
        self._closing = False
        proc = subprocess.Popen(
            [sys.executable, "-m", "prorsa_tracker.receiver"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._proc = proc
        write_frame(proc.stdin, self.config)  # type: ignore[arg-type]
        threading.Thread(target=self._read, args=(loop, proc), name="tracker-receiver", daemon=True).start()

    def _read(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen) -> None:
        out = proc.stdout
        try:
            while True:
                items = read_frame(out)  # type: ignore[arg-type]
                loop.call_soon_threadsafe(self._on_items, items)
        except (EOFError, OSError, ValueError):
            pass
        except RuntimeError:  # the loop is closed: the tracker is gone
            return
        if not self._closing:
            try:
                loop.call_soon_threadsafe(self._on_exit)
            except RuntimeError:
                pass

    def credit(self, n: int) -> None:
        """Tell the child ``n`` more forwarded messages are done with (never blocks long)."""
        proc = self._proc
        if proc is None or n <= 0:
            return
        try:
            with self._lock:
                write_frame(proc.stdin, n)  # type: ignore[arg-type]
        except (BrokenPipeError, OSError, ValueError):  # the child is gone: on_exit follows
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Close the child's stdin (it exits), then wait for it (killing it if it hangs)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._closing = True
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None


# --- the child ---------------------------------------------------------------------------


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


class _Child:
    def __init__(self, cfg: dict, out: BinaryIO) -> None:
        from prorsa_schemas import Namespace

        self.cfg = cfg
        self.ns = Namespace(prefix=cfg["prefix"], stream=cfg["stream"])
        self.max_inflight = cfg["max_inflight"]
        self.pending: list[tuple[int, bytes, str | None, str]] = []
        self.reader = None
        self.out = out
        self.sendq: queue.Queue = queue.Queue()
        self.flush_handle: asyncio.TimerHandle | None = None

    async def run(self) -> None:
        from prorsa_runtime import connect
        from prorsa_runtime.reader import OrderedReader

        loop = asyncio.get_running_loop()
        self.loop = loop
        threading.Thread(target=self._send_loop, daemon=True).start()
        self.nc = await connect(self.cfg["url"], self.cfg["name"], credentials=self.cfg["credentials"])
        self.js = self.nc.jetstream()
        ns = self.ns
        # The consumer is named (ns.durable("tracker")), so that a deployment's permissions
        # can name it. At most max_inflight messages are requested or forwarded and not yet
        # credited back by the parent: a slow database slows the pull requests down, it does
        # not fill a queue.
        self.reader = OrderedReader(
            self.js, ns, ns.durable("tracker"), [ns.rollout_all(), ns.engine_all(), ns.control_all()], self._on_msg,
            start_seq=self.cfg["start_seq"], max_pending=self.max_inflight,
            batch=min(FLUSH_MESSAGES * 2, max(1, self.max_inflight // 4)), info_every_s=0,
        )
        await self.reader.start()
        threading.Thread(target=self._credit_loop, args=(loop,), daemon=True).start()
        self.sendq.put([])  # "subscribed"
        while True:  # the backlog, as the server counts it, for the parent's gauges
            info = await self.reader.read_info()
            if info is not None:
                self.sendq.put({"num_pending": info.num_pending, "in_transit": self.reader.in_transit,
                                "resets": self.reader.resets, "gaps": self.reader.gaps})
            await asyncio.sleep(STATS_EVERY_S)

    def _on_msg(self, msg, seq: int) -> None:
        from prorsa_schemas import EventError, decode_event

        data = msg.data
        try:
            decode_event(data)
            invalid = None
        except EventError as exc:
            invalid = exc.reason
        except Exception as exc:  # noqa: BLE001 - decode_event raises only EventError; belt and braces
            invalid = f"cannot be decoded ({type(exc).__name__})"
        pending = self.pending
        pending.append((seq, data, invalid, msg.subject))
        if len(pending) >= FLUSH_MESSAGES:
            self.flush()
        elif self.flush_handle is None:
            self.flush_handle = self.loop.call_later(FLUSH_DELAY_S, self.flush)

    def flush(self) -> None:
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None
        if self.pending:
            self.sendq.put(self.pending)
            self.pending = []

    def _send_loop(self) -> None:
        try:
            while True:
                write_frame(self.out, self.sendq.get())
        except (BrokenPipeError, OSError, ValueError):  # the parent is gone
            os._exit(0)

    def _credit_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        stdin = sys.stdin.buffer
        try:
            while True:
                n = read_frame(stdin)
                loop.call_soon_threadsafe(self.reader.release, n)
        except (EOFError, OSError, ValueError):
            os._exit(0)  # the parent closed our stdin (or died): nothing to hand over


def main() -> None:
    """The child's entry point (``python -m prorsa_tracker.receiver``)."""
    _die_with_parent()
    # Frames go to the real stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = read_frame(sys.stdin.buffer)
    except EOFError:
        return
    try:
        asyncio.run(_Child(cfg, out).run())
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
