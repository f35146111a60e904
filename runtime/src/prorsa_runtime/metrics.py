"""Prometheus metrics and a health endpoint on one small HTTP port per service.

``/metrics`` is prometheus-client's own WSGI app (:func:`prometheus_client.make_wsgi_app`:
content negotiation, OpenMetrics, gzip); ``/health`` is a small WSGI route beside it; both are
served by prometheus-client's thread-per-request ``wsgiref`` server in a daemon thread.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

HealthFn = Callable[[], tuple[bool, dict]]

_NOT_FOUND = b'{"error": "not found: try /metrics or /health"}'


class _Quiet(WSGIRequestHandler):
    """No access log on stderr: Prometheus scrapes every few seconds."""

    def log_message(self, *args: object) -> None:
        pass


def metrics_app(registry: CollectorRegistry, health: HealthFn) -> Callable:
    """The WSGI app: ``/metrics`` from ``registry``, ``/health`` from ``health()`` (JSON; 503
    when unhealthy), 404 with a hint elsewhere."""
    prometheus = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            try:
                return prometheus(environ, start_response)
            except Exception:  # noqa: BLE001 - prometheus_client fails on some malformed Accept headers
                if "HTTP_ACCEPT" not in environ:
                    raise
                # ("application/openmetrics-text; version=abc": a TypeError in its parser)
                return prometheus({k: v for k, v in environ.items() if k != "HTTP_ACCEPT"}, start_response)
        if path == "/health":
            ok, detail = health()
            status, body = ("200 OK" if ok else "503 Service Unavailable"), json.dumps({"ok": ok, **detail}).encode()
        else:
            status, body = "404 Not Found", _NOT_FOUND
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_metrics(
    registry: CollectorRegistry, port: int, health: HealthFn, host: str = "0.0.0.0"
) -> ThreadingWSGIServer:
    """Serve ``/metrics`` (Prometheus text) and ``/health`` (JSON; 503 when unhealthy).

    Returns the server (``.server_address[1]`` is the bound port when ``port`` is 0);
    ``shutdown()`` it on exit.
    """
    server = make_server(host, port, metrics_app(registry, health), ThreadingWSGIServer, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server


def consumer_metrics(service: str, *readers) -> list:
    """The backlog figures of ``service``'s consumers, read from the server's consumer info
    (an :class:`~prorsa_runtime.reader.OrderedReader` refreshes it every few seconds; a
    :class:`~prorsa_runtime.consumers.DurableFigures` when its owner reads it):

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
