"""serve_metrics over real HTTP: /metrics (prometheus-client's WSGI app), /health, anything else."""

from __future__ import annotations

import httpx
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families

from prorsa_runtime.metrics import serve_metrics


def test_metrics_health_and_unknown_paths_over_http() -> None:
    reg = CollectorRegistry()
    Gauge("prorsa_test_backlog", "b", ["consumer"], registry=reg).labels("c1").set(7)
    Counter("prorsa_test_events", "n", registry=reg).inc(2)
    state = {"ok": True}
    server = serve_metrics(reg, 0, lambda: (state["ok"], {"lag": 3}), host="127.0.0.1")
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        r = httpx.get(f"{base}/metrics?x=1", timeout=5)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        samples = {(s.name, tuple(s.labels.items())): s.value
                   for fam in text_string_to_metric_families(r.text) for s in fam.samples}
        assert samples[("prorsa_test_backlog", (("consumer", "c1"),))] == 7.0
        assert samples[("prorsa_test_events_total", ())] == 2.0

        # A malformed Accept header (prometheus-client's parser fails on it) gets the text format.
        r = httpx.get(f"{base}/metrics", headers={"Accept": "application/openmetrics-text; version=abc"}, timeout=5)
        assert r.status_code == 200 and "prorsa_test_events_total 2.0" in r.text

        r = httpx.get(f"{base}/health", timeout=5)
        assert (r.status_code, r.json()) == (200, {"ok": True, "lag": 3})
        state["ok"] = False
        r = httpx.get(f"{base}/health?verbose", timeout=5)
        assert (r.status_code, r.json()) == (503, {"ok": False, "lag": 3})

        r = httpx.get(f"{base}/", timeout=5)
        assert r.status_code == 404 and "try /metrics or /health" in r.json()["error"]
    finally:
        server.shutdown()
        server.server_close()
    try:
        httpx.get(f"{base}/health", timeout=2)
    except httpx.TransportError:
        pass
    else:
        raise AssertionError("still serving after shutdown()")
