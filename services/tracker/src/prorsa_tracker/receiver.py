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
  subscribed.

Back-pressure: when more than ``max_inflight`` forwarded messages are not yet credited
(the database is down, the parent is behind), the child drops its ordered consumer and
re-creates it after the last forwarded sequence once the parent has caught up by half,
so neither process buffers without bound. Also on a NATS reconnect the consumer is
re-created after the last forwarded sequence (nats-py's ordered consumer does not always
recover across a server restart). Messages of an old consumer are ignored.

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


def stream_seq(reply: str) -> int:
    """The stream sequence in a JetStream delivery's reply subject."""
    # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<dseq>.<ts>.<pending> (v1), or the v2
    # form with <domain>.<account hash> after $JS.ACK and a trailing token.
    parts = reply.split(".")
    return int(parts[5] if len(parts) == 9 else parts[7])


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
        self.last = cfg["start_seq"] - 1  # last stream sequence forwarded
        self.forwarded = 0
        self.credited = 0
        self.max_inflight = cfg["max_inflight"]
        self.pending: list[tuple[int, bytes, str | None, str]] = []
        self.gen = 0
        self.sub = None
        self.paused = False
        self.out = out
        self.sendq: queue.Queue = queue.Queue()
        self.flush_handle: asyncio.TimerHandle | None = None
        self.resub = asyncio.Event()
        self._tasks: set[asyncio.Task] = set()

    async def run(self) -> None:
        from prorsa_runtime import connect

        loop = asyncio.get_running_loop()
        self.loop = loop
        threading.Thread(target=self._send_loop, daemon=True).start()
        threading.Thread(target=self._credit_loop, args=(loop,), daemon=True).start()
        self.nc = await connect(self.cfg["url"], self.cfg["name"], credentials=self.cfg["credentials"],
                                on_reconnect=self._on_reconnect)
        self.js = self.nc.jetstream()
        await self._subscribe()
        self.sendq.put([])  # "subscribed"
        while True:
            await self.resub.wait()
            self.resub.clear()
            if self.paused and self.forwarded - self.credited > self.max_inflight // 2:
                continue
            try:
                await self._subscribe()
            except Exception as exc:  # the server is still coming back: try again soon
                log.warning("receiver: subscribe failed (%r); retrying", exc)
                await asyncio.sleep(0.5)
                self.resub.set()

    async def _on_reconnect(self) -> None:
        if not self.paused:
            self.resub.set()

    async def _subscribe(self) -> None:
        from prorsa_runtime.consumers import subscribe_ordered
        from prorsa_schemas import EventError, decode_event

        self.flush()
        self.gen += 1
        old, self.sub = self.sub, None
        if old is not None:
            try:
                await old.unsubscribe()
            except Exception as exc:  # the old consumer may be gone with the old server
                log.debug("unsubscribe: %r", exc)
        gen = self.gen
        ns = self.ns

        async def on_msg(msg) -> None:
            if gen != self.gen:  # a message of a consumer we dropped
                return
            seq = stream_seq(msg.reply)
            if seq <= self.last:
                return
            self.last = seq
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
            self.forwarded += 1
            if len(pending) >= FLUSH_MESSAGES:
                self.flush()
            elif self.flush_handle is None:
                self.flush_handle = self.loop.call_later(FLUSH_DELAY_S, self.flush)
            if self.forwarded - self.credited > self.max_inflight and not self.paused:
                self._pause()

        # The consumer is named (ns.durable("tracker")), so that a deployment's permissions
        # can name it; subscribe_ordered replaces the one a previous subscription left.
        self.sub = await subscribe_ordered(
            self.js, ns, ns.durable("tracker"), [ns.rollout_all(), ns.engine_all(), ns.control_all()], on_msg,
            start_seq=self.last + 1, pending_msgs_limit=200_000, pending_bytes_limit=256 * 1024 * 1024,
        )
        self.paused = False

    def _pause(self) -> None:
        self.paused = True
        self.gen += 1  # ignore whatever the dropped consumer still delivers
        sub, self.sub = self.sub, None
        if sub is not None:  # not awaited here: we run inside that subscription's own task
            task = asyncio.get_running_loop().create_task(self._drop(sub))
            self._tasks.add(task)  # the loop keeps only weak references to tasks
            task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _drop(sub) -> None:
        try:
            await sub.unsubscribe()
        except Exception as exc:
            log.debug("unsubscribe: %r", exc)

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
                loop.call_soon_threadsafe(self._credit, n)
        except (EOFError, OSError, ValueError):
            os._exit(0)  # the parent closed our stdin (or died): nothing to hand over

    def _credit(self, n: int) -> None:
        self.credited += n
        if self.paused and self.forwarded - self.credited <= self.max_inflight // 2:
            self.resub.set()


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
