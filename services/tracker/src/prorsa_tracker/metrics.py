"""Prometheus metrics of a running tracker (read from the service object at scrape time).

Exposed on ``PRORSA_TRACKER_METRICS_PORT`` (``/metrics`` and ``/health``):
``prorsa_tracker_events_written_total`` (ingest: rate() of it is the ingest rate),
``prorsa_tracker_stream_position`` (last committed stream sequence),
``prorsa_tracker_buffered_messages`` (delivered to the tracker, not yet committed; at most
``max_inflight``), ``prorsa_tracker_consumer_pending{consumer}`` (the stream's messages not
yet delivered, from the JetStream consumer info, read every 2 s),
``prorsa_tracker_backlog_messages{consumer}`` (the ingest lag in messages: those two plus the
messages the server delivered and the receiver has not yet handed over, from the same info), ``prorsa_tracker_consumer_resets_total{consumer}``,
``prorsa_tracker_lag_seconds`` (wall time minus the newest applied event time),
``prorsa_tracker_anomalies_total`` and ``prorsa_tracker_events_stored_total`` (the rows the
``anomalies`` and ``events`` tables hold: counted at start, plus what each commit adds),
``prorsa_tracker_duplicates_total`` (re-sent events skipped since start),
``prorsa_tracker_dead_letters_total{kind}`` (messages not applied since start: invalid, on
the wrong subject, a re-sent id with other content; each is also an ``anomalies`` row),
``prorsa_tracker_live_trajectories``.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from prorsa_runtime.metrics import consumer_metrics


class _ConsumerFigures:
    """The receiver's figures of the tracker's consumer, in the shape consumer_metrics reads."""

    def __init__(self, tr) -> None:
        self.name = tr.consumer
        self.num_pending = getattr(tr, "consumer_pending", None)
        self.resets = getattr(tr, "consumer_resets", 0)
        self._tr = tr

    def backlog(self):
        return self._tr.backlog()


class _TrackerCollector:
    def __init__(self, tracker) -> None:
        self.tr = tracker

    def collect(self):
        tr = self.tr
        st = tr.state
        yield CounterMetricFamily("prorsa_tracker_events_written", "messages committed to SQL by this process",
                                  value=tr.written)
        yield CounterMetricFamily("prorsa_tracker_transactions", "batches committed to SQL by this process",
                                  value=getattr(tr, "transactions", 0))
        yield GaugeMetricFamily("prorsa_tracker_stream_position", "last committed stream sequence", value=tr.position)
        yield GaugeMetricFamily("prorsa_tracker_buffered_messages", "received but not yet committed",
                                value=getattr(tr, "inflight", len(getattr(tr, "_buf", ()))))
        yield from consumer_metrics("tracker", _ConsumerFigures(tr))
        wm = getattr(st, "watermark", None)
        yield GaugeMetricFamily("prorsa_tracker_lag_seconds", "wall time minus the newest applied event ts",
                                value=max(0.0, time.time() - wm) if wm else 0.0)
        yield CounterMetricFamily("prorsa_tracker_anomalies", "rows in the anomalies table",
                                  value=getattr(tr, "anomaly_rows", 0))
        yield CounterMetricFamily("prorsa_tracker_events_stored", "rows in the events table",
                                  value=getattr(tr, "event_rows", 0))
        yield CounterMetricFamily("prorsa_tracker_duplicates", "re-sent events skipped (same id, same content)",
                                  value=getattr(tr, "duplicates", 0))
        dead = getattr(tr, "dead_letters", None)
        if dead is not None:
            yield from dead.collect()
        runs = getattr(st, "runs", {}) or {}
        live = sum(len(getattr(r, "live", ()) or ()) for r in runs.values()) if isinstance(runs, dict) else 0
        yield GaugeMetricFamily("prorsa_tracker_live_trajectories", "trajectories not yet ended", value=live)


def tracker_registry(tracker) -> CollectorRegistry:
    """A registry whose metrics are read from ``tracker`` at every scrape."""
    reg = CollectorRegistry()
    reg.register(_TrackerCollector(tracker))
    return reg


def tracker_health(tracker):
    """``/health``: healthy once the tracker consumes."""
    def health() -> tuple[bool, dict]:
        return tracker.ready.is_set(), {"position": tracker.position, "written": tracker.written}
    return health
