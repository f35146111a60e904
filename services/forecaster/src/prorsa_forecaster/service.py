"""The forecaster service: contract events in, one ``forecast.window`` per window out.

Shell around the pure core. It reads the stream from its first message with an ordered
pull consumer (rollout and engine events; :class:`~prorsa_runtime.reader.OrderedReader`:
at most ``max_pending`` messages requested or waiting to be folded in, never a skipped
one, re-created after a gap, a missed heartbeat or a reconnect), passes every event through the tracker's core (the
same canonical lifecycle the tracker records), folds it into the live state and closes
windows by event time (:class:`~prorsa_forecaster.windows.WindowLoop`). A tracker
watermark on ``ns.watermark()`` (``{"ts": ...}``) closes windows when the bus is quiet.

Forecasts go out through a :class:`~prorsa_runtime.ReliablePublisher`: buffered and
re-sent until the stream acknowledges them, so a publish that times out (a busy or
restarting server) never stops the service.

Restarts: the state is a fold of the stream, so a restarted forecaster replays it and
comes back to the same state. Forecast ids are deterministic (run, horizon and t), so a
re-publish inside the stream's duplicate window is dropped, and windows at or before the
last ``forecast.window`` already in the stream are not published again.

A message it cannot handle (not a valid event, on a subject its type does not belong to,
one stamped more than ``max_clock_ahead_s`` ahead of this host's clock, which would close
every window up to its ``ts`` at once: :mod:`prorsa_runtime.clock`, or one the core fails
on) is dead-lettered (:mod:`prorsa_runtime.deadletter`: a log line
with subject, stream sequence, reason, size and hash; ``prorsa_forecaster_dead_letters_total``)
and skipped, so a restart's replay passes it again without stopping.

It tracks its own WAPE online (``prorsa_forecaster_wape{series=...}``) on the metrics
port, with ``/health``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections import deque

from nats.js.errors import NotFoundError
from prometheus_client import CollectorRegistry, Counter, Gauge

from prorsa_runtime import ReliablePublisher, connect, open_stream
from prorsa_runtime.clock import ahead_of_clock
from prorsa_runtime.metrics import consumer_metrics
from prorsa_runtime.reader import OrderedReader
from prorsa_runtime.deadletter import DeadLetters
from prorsa_schemas import EventError, ForecastBlend, ForecastWindow, SubjectMismatch, decode_event, decode_message

from .config import ForecastConfig
from .settings import ForecasterSettings
from .windows import WindowLoop, WindowResult

log = logging.getLogger("prorsa.forecaster")

DRAIN_BATCH = 2000
"""Messages handled between two returns to the event loop (the loop answers the server's
pings and the pull requests' heartbeats in between)."""


class OnlineWape:
    """Cumulative WAPE of one series: sum |f - a| / sum a over closed windows."""

    def __init__(self) -> None:
        self.err = 0.0
        self.total = 0.0

    def add(self, forecast: float, actual: float) -> None:
        self.err += abs(forecast - actual)
        self.total += actual

    @property
    def value(self) -> float | None:
        return self.err / self.total if self.total > 0 else None


def _stream_seq(msg) -> int | None:
    # Only for dead letters: parsing a delivery's metadata costs ~10 us a message.
    if msg is None:
        return None
    try:
        return msg.metadata.sequence.stream
    except Exception:  # noqa: BLE001 - not a JetStream delivery (tests feed plain messages)
        return None


def window_event(w_t: float, f, run: str) -> ForecastWindow:
    """The contract event for a forecast (deterministic id: a re-publish de-duplicates)."""
    return ForecastWindow(
        id=f"forecast-{run}-{f.horizon:g}-{w_t:.3f}",
        ts=w_t,
        run=run,
        t=w_t,
        horizon=f.horizon,
        prefill_tokens=f.prefill_tokens,
        decode_admit_tokens=f.decode_admit_tokens,
        decode_kv_tokens=f.decode_kv_tokens,
        decode_kv_now=f.decode_kv_now,
        components=f.contract_components(),
        blend=ForecastBlend(**{k: v for k, v in f.weights.items() if k in ("prefill", "decode", "new")}) if f.weights else None,
    )


class _ConsumerCollector:
    """The backlog of the forecaster's consumer, from the server's consumer info."""

    def __init__(self, svc: "Forecaster") -> None:
        self.svc = svc

    def collect(self):
        return consumer_metrics("forecaster", self.svc.reader)


class Forecaster:
    """The service; ``run(stop)`` until ``stop`` is set. ``published`` counts windows sent."""

    def __init__(self, settings: ForecasterSettings) -> None:
        self.settings = settings
        self.ns = settings.namespace()
        self.config = ForecastConfig(horizon=settings.horizon, steps=settings.steps).time_scaled(settings.time_scale)
        self.loop = WindowLoop(self.config, gate=settings.tracker_gate, max_gap_windows=settings.max_catch_up_windows)
        self.registry = CollectorRegistry()
        self.m_wape = Gauge("prorsa_forecaster_wape", "cumulative WAPE of closed windows", ["series"], registry=self.registry)
        self.m_windows = Counter("prorsa_forecaster_windows", "windows closed", registry=self.registry)
        self.m_skipped = Counter("prorsa_forecaster_windows_skipped",
                                 "windows a long jump of event time passed over without a forecast "
                                 "(max_catch_up_windows)", registry=self.registry)
        self._skipped_seen = 0
        self.m_events = Counter("prorsa_forecaster_events", "events applied", registry=self.registry)
        self.m_invalid = Counter("prorsa_forecaster_invalid", "messages that are not valid events", registry=self.registry)
        self.m_forecast = Gauge("prorsa_forecaster_forecast_tokens", "latest forecast", ["series"], registry=self.registry)
        self.m_correction = Gauge(
            "prorsa_forecaster_correction",
            "online correction factor of the latest forecast (1 = none): prefill per source, decode, admitted share",
            ["kind"], registry=self.registry,
        )
        self.m_blend = Gauge(
            "prorsa_forecaster_blend_weight",
            "weight of each predictor in the latest forecast (series prefill / decode: the lifecycle forecast and "
            "the naive ones; new: the sampler term and the level of new trajectories' arrivals)",
            ["series", "predictor"], registry=self.registry,
        )
        self.dead_letters = DeadLetters("forecaster", log)
        self.clock = time.time  # the host's clock, which no event's ts may run too far ahead of
        self.registry.register(self.dead_letters)
        self.registry.register(_ConsumerCollector(self))
        self.wape = {"prefill": OnlineWape(), "decode": OnlineWape()}
        self.published = 0
        self.run_id = settings.run_label
        self._last_published_t = float("-inf")
        self._buf: deque[tuple[str, object]] = deque()
        self._wake = asyncio.Event()
        self.ready = asyncio.Event()
        self.reader: OrderedReader | None = None
        self.pub: ReliablePublisher | None = None

    # -- window handling --------------------------------------------------------------
    def _closed(self, windows: list[WindowResult]) -> None:
        if self.loop.skipped > self._skipped_seen:
            log.warning("forecaster: event time jumped; %d windows skipped without a forecast",
                        self.loop.skipped - self._skipped_seen)
            self.m_skipped.inc(self.loop.skipped - self._skipped_seen)
            self._skipped_seen = self.loop.skipped
        for w in windows:
            self.m_windows.inc()
            for series, f, a in (
                ("prefill", w.forecast.prefill_tokens, w.prefill_actual),
                ("decode", w.forecast.decode_admit_tokens, w.decode_actual),
            ):
                self.wape[series].add(f, a)
                v = self.wape[series].value
                if v is not None:
                    self.m_wape.labels(series).set(v)

    def _publish_opened(self) -> None:
        """Publish every forecast the loop made since the last call, in window order."""
        while self.loop.opened:
            f = self.loop.opened.popleft()
            if f.t <= self._last_published_t:
                continue  # published before a restart
            # Buffered and re-sent until the stream acknowledges it (same id: de-duplicated),
            # so a publish that times out under load never stops the forecaster.
            self.pub.submit(window_event(f.t, f, self.run_id or "prorsa"), key="forecasts")
            self._last_published_t = f.t
            self.published += 1
            self.m_forecast.labels("prefill").set(f.prefill_tokens)
            self.m_forecast.labels("decode").set(f.decode_admit_tokens)
            self._set_corrections(f)

    def _set_corrections(self, f) -> None:
        """The correction factors a forecast was made with: far from 1 for long, the
        model itself is off in that part (an operator's first look when WAPE drifts)."""
        corr = self.loop.state.history.correction
        for name, factor in corr.factors().items():
            self.m_correction.labels(f"prefill_{name}").set(factor)
        self.m_correction.labels("decode").set(f.model_decode / f.raw_decode if f.raw_decode > 0 else 1.0)
        self.m_correction.labels("admitted_share").set(f.share_factor)
        for series, weights in f.weights.items():
            for predictor, w in weights.items():
                self.m_blend.labels(series, predictor).set(w)

    def apply_bytes(self, data: bytes, subject: str | None = None, msg=None) -> list[WindowResult]:
        """Decode and fold one message; one it cannot handle is dead-lettered, never fatal.

        With ``subject``, the event's type must belong on it (see
        :meth:`prorsa_schemas.Namespace.subject_mismatch`); ``msg`` (the JetStream delivery)
        gives a dead letter its stream sequence.
        """
        try:
            ev = decode_event(data) if subject is None else decode_message(data, subject, self.ns)
        except SubjectMismatch as exc:
            self.dead_letters.record("subject", subject, _stream_seq(msg), data, exc.reason)
            return []
        except EventError as exc:
            self.m_invalid.inc()
            self.dead_letters.record("invalid", subject, _stream_seq(msg), data, exc.reason)
            return []
        if ev.type.startswith(("forecast.", "allocation.", "engine.command")):
            return []
        future = ahead_of_clock(ev.ts, self.clock(), self.settings.max_clock_ahead_s)
        if future is not None:
            self.dead_letters.record("future", subject, _stream_seq(msg), data, future)
            return []
        if self.run_id is None and hasattr(ev, "traj"):
            self.run_id = ev.run
        self.m_events.inc()
        try:
            return self.loop.feed(ev)
        except Exception as exc:  # a bug on one event must not stop the forecasts
            log.exception("forecaster: failed on %s %s", ev.type, ev.id)
            self.dead_letters.record("handler", subject, _stream_seq(msg), data, f"the forecaster failed on it: {exc!r}")
            return []

    # -- I/O --------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        s = self.settings
        nc = await connect(s.nats_url, "prorsa-forecaster", credentials=s.credentials())
        try:
            js = nc.jetstream()
            await open_stream(js, self.ns, s.nats_url, s.credentials())
            self.pub = await ReliablePublisher(s.nats_url, "prorsa-forecaster-pub", self.ns,
                                               credentials=s.credentials()).start()
            try:
                # A direct get by subject ($JS.API.DIRECT.GET.<stream>.<subject>): the one read a
                # permission can pin to the forecasts' subject.
                last = await js.get_last_msg(self.ns.stream, self.ns.forecasts(), direct=True)
                self._last_published_t = json.loads(last.data)["t"]
            except NotFoundError:  # none yet: publish from the start
                pass
            except Exception as exc:  # unreadable or refused: publish from the start (de-duplicated by id)
                log.warning("forecaster: cannot read the last forecast (%r); publishing every window", exc)

            def on_msg(msg, seq: int) -> None:
                self._buf.append(("event", msg))
                self._wake.set()

            async def on_watermark(msg) -> None:
                try:
                    ts = float(json.loads(msg.data)["ts"])
                    if not math.isfinite(ts):
                        raise ValueError(f"ts {ts} is not finite")
                except Exception as exc:  # noqa: BLE001 - any bad watermark (even one nested too deep) is skipped
                    log.warning("forecaster: invalid watermark ignored: %s", str(exc)[:200])
                    return
                future = ahead_of_clock(ts, self.clock(), s.max_clock_ahead_s)
                if future is not None:
                    self.dead_letters.record("future", msg.subject, None, msg.data, f"watermark {future}")
                    return
                self._buf.append(("watermark", ts))
                self._wake.set()

            self.reader = await OrderedReader(
                js, self.ns, self.ns.durable("forecaster"), [self.ns.rollout_all(), self.ns.engine_all()], on_msg,
                max_pending=s.max_pending,
            ).start()
            await nc.subscribe(self.ns.watermark(), cb=on_watermark)
            self.ready.set()
            stopper = asyncio.ensure_future(stop.wait())
            try:
                while not stop.is_set():
                    if not self._buf:
                        self._wake.clear()
                        waiter = asyncio.ensure_future(self._wake.wait())
                        await asyncio.wait([waiter, stopper], return_when=asyncio.FIRST_COMPLETED)
                        waiter.cancel()
                        continue
                    await self._drain()
            finally:
                stopper.cancel()
                if self.reader is not None:
                    await self.reader.stop()
                try:
                    await self.pub.close(timeout=5.0)  # what the stream has not acknowledged yet: 5 s
                except TimeoutError as exc:  # not stored: a restart publishes those windows again
                    log.warning("forecaster: %s", exc)
        finally:
            await nc.close()

    async def _drain(self) -> None:
        n = events = 0
        try:
            while self._buf and n < DRAIN_BATCH:
                kind, item = self._buf.popleft()
                n += 1
                if kind == "watermark":
                    closed = self.loop.advance(item)
                else:
                    events += 1
                    closed = self.apply_bytes(item.data, item.subject, item)
                if closed:
                    self._closed(closed)
                if self.loop.opened:
                    self._publish_opened()
        finally:
            if self.reader is not None:
                self.reader.release(events)  # room for as many more in the pull requests
        await asyncio.sleep(0)  # let the subscription callbacks run between batches

    def health(self) -> tuple[bool, dict]:
        return self.ready.is_set(), {
            "published": self.published,
            "window": self.loop.window_start,
            "live": self.loop.state.live,
            "wape_prefill": self.wape["prefill"].value,
            "wape_decode": self.wape["decode"].value,
        }


async def main(stack, stop: asyncio.Event, settings: ForecasterSettings | None = None) -> None:
    """Service entry point for :func:`prorsa_runtime.lifecycle.run_until_stopped`."""
    from prorsa_runtime.metrics import serve_metrics

    s = settings or ForecasterSettings()
    svc = Forecaster(s)
    if s.metrics_port is not None:
        server = serve_metrics(svc.registry, s.metrics_port, svc.health)
        stack.callback(server.shutdown)
    await svc.run(stop)
