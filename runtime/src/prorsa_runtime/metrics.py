"""Prometheus metrics and a health endpoint on one small HTTP port per service."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

HealthFn = Callable[[], tuple[bool, dict]]


def serve_metrics(
    registry: CollectorRegistry, port: int, health: HealthFn, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` (Prometheus text) and ``/health`` (JSON; 503 when unhealthy).

    Returns the server (``.server_address[1]`` is the bound port when ``port`` is 0);
    ``shutdown()`` it on exit.
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's API
            if self.path.split("?")[0] == "/metrics":
                body = generate_latest(registry)
                self._send(200, CONTENT_TYPE_LATEST, body)
            elif self.path.split("?")[0] == "/health":
                ok, detail = health()
                body = json.dumps({"ok": ok, **detail}).encode()
                self._send(200 if ok else 503, "application/json", body)
            else:
                self._send(404, "application/json", b'{"error": "not found: try /metrics or /health"}')

        def _send(self, code: int, ctype: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server


def consumer_metrics(service: str, *readers) -> list:
    """The backlog figures of ``service``'s consumers, read from the server's consumer info
    (an :class:`~prorsa_runtime.reader.OrderedReader` refreshes it every few seconds; a
    :class:`~prorsa_runtime.reader.DurableFigures` when its owner reads it):

    ``prorsa_<service>_consumer_pending{consumer}`` (the stream's messages not yet delivered:
    ``num_pending``), ``prorsa_<service>_backlog_messages{consumer}`` (not yet processed:
    ``num_pending`` + ``num_ack_pending`` + delivered and not yet handed over + handed over and
    not yet released) and
    ``prorsa_<service>_consumer_resets_total{consumer}`` (re-creations after a gap, a missed
    heartbeat, a reconnect or a lost consumer). A consumer not read yet is left out.
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    read = [r for r in readers if r is not None and r.num_pending is not None]
    if not read:
        return []
    pending = GaugeMetricFamily(f"prorsa_{service}_consumer_pending",
                                "messages of the stream not yet delivered to the consumer (JetStream num_pending)",
                                labels=["consumer"])
    backlog = GaugeMetricFamily(f"prorsa_{service}_backlog_messages",
                                "messages not yet processed: num_pending + num_ack_pending + delivered, not yet handled",
                                labels=["consumer"])
    resets = CounterMetricFamily(f"prorsa_{service}_consumer_resets",
                                 "consumer re-created (a gap, a missed heartbeat, a reconnect, a lost consumer)",
                                 labels=["consumer"])
    for r in read:
        pending.add_metric([r.name], r.num_pending)
        backlog.add_metric([r.name], r.backlog())
        resets.add_metric([r.name], r.resets)
    return [pending, backlog, resets]
