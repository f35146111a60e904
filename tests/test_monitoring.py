"""The monitoring files: Prometheus's own checker accepts the scrape config and the alert
rules, and every metric the dashboard's and the rules' queries name is one the services
export (names collected from the services' registries in-process)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PROM = ROOT / "deploy" / "prometheus"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "prorsa.json"
PROMTOOL = shutil.which("promtool")
NEEDS_PROMTOOL = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed (Debian: apt-get install -y prometheus; docs/deployment.md#monitoring)")

# Series Prometheus makes itself for every target.
PROMETHEUS_OWN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", ""),
             "gauge": ("",), "untyped": ("",), "info": ("_info",)}


def _names(registry) -> set[str]:
    """The series names a registry exposes: its samples, and the names its families'
    types give them (a family with no sample yet still names its series)."""
    out: set[str] = set()
    for fam in registry.collect():
        out |= {s.name for s in fam.samples}
        out |= {fam.name + sfx for sfx in _SUFFIXES.get(fam.type, ("",))}
    return out


def exported_metrics(tmp_path: Path) -> set[str]:
    """Every metric name the four services export, from their real collectors."""
    from prorsa_allocator.config import AllocatorConfig
    from prorsa_allocator.metrics import allocator_registry
    from prorsa_allocator.planner import Allocator
    from prorsa_allocator.service import ServiceState
    from prorsa_allocator.testing import THETA, forecast, registered
    from prorsa_engine_agent.agent import EngineAgent
    from prorsa_engine_agent.config import load_config
    from prorsa_forecaster.service import Forecaster
    from prorsa_forecaster.settings import ForecasterSettings
    from prorsa_runtime.consumers import DurableFigures
    from prorsa_schemas import AllocationPlan
    from prorsa_tracker.metrics import tracker_registry
    from prorsa_tracker.service import Tracker
    from prorsa_tracker.settings import TrackerSettings

    names: set[str] = set()
    # The tracker, its consumer read once (the backlog figures appear after the first read).
    tracker = Tracker(TrackerSettings(db_url=f"sqlite:///{tmp_path / 't.db'}"))
    tracker.consumer_pending = 0
    names |= _names(tracker_registry(tracker))
    # The forecaster, its consumer read once.
    fc = Forecaster(ForecasterSettings())
    fc.reader = DurableFigures("forecaster")
    fc.reader.num_pending = 0
    names |= _names(fc.registry)
    # The allocator after one plan (the plan's gauges appear with the first plan).
    alloc = Allocator(AllocatorConfig(prefill_tokens_per_s=THETA))
    state = ServiceState(alloc)
    for i in range(2):
        alloc.handle(registered(f"p{i}", "prefill"))
        alloc.handle(registered(f"d{i}", "decode"))
    state.plans += [e for e in alloc.handle(forecast(t=60.0, prefill_engines=3.0, decode_engines=1.0))
                    if isinstance(e, AllocationPlan)]
    assert state.plans
    state.reader = DurableFigures("allocator")
    state.reader.num_pending = 0
    names |= _names(allocator_registry(state))
    # The engine agent of the emulated compose profile, its command consumer read once.
    agent = EngineAgent(load_config(ROOT / "docker" / "agent-emulated.toml", state_dir=tmp_path / "agent"))
    agent.command_figures.num_pending = 0
    names |= _names(agent.metrics.registry())
    return names


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers that are not functions,
    aggregations, keywords, label names (in braces or grouping clauses) or durations."""
    e = _STRING.sub('""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)  # label matchers
    e = re.sub(r"\[[^\]]*\]", " ", e)  # range and subquery durations
    e = _GROUPING.sub(" ", e)
    e = re.sub(r"\boffset\s+\w+", " ", e)
    names = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        word, rest = m.group(), e[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in _KEYWORDS or re.fullmatch(r"\d", word[0]):
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # the exponent of a number such as 1e3
        names.add(word)
    return names


def dashboard_queries() -> list[tuple[str, str]]:
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            out.append((panel["title"], t["expr"]))
    return out


def alert_queries() -> list[tuple[str, str]]:
    rules = yaml.safe_load((PROM / "alerts.yml").read_text())
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def test_the_query_parser_finds_metric_names_only() -> None:
    expr = ('histogram_quantile(0.95, sum by (le, mode) (rate(a_bucket{job="x", mode=~"in.*"}[5m]))) '
            '> 1e3 and on (instance) b_total offset 5m or up{job="tracker"} == bool 0')
    assert metric_names(expr) == {"a_bucket", "b_total", "up"}


def test_every_dashboard_and_alert_query_names_an_exported_metric(tmp_path: Path) -> None:
    exported = exported_metrics(tmp_path) | PROMETHEUS_OWN
    # The collection itself must see each service, or the check below proves nothing.
    for prefix in ("prorsa_tracker_", "prorsa_forecaster_", "prorsa_allocator_", "prorsa_agent_"):
        assert any(n.startswith(prefix) for n in exported), prefix
    queries = dashboard_queries() + alert_queries()
    assert len(queries) > 20
    unknown = [(where, name) for where, expr in queries for name in sorted(metric_names(expr)) if name not in exported]
    assert unknown == [], f"not exported by any service: {unknown}"


def test_the_dashboard_shows_what_an_operator_needs() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "prorsa"
    queries = " ".join(e for _, e in dashboard_queries())
    for needle in ("prorsa_tracker_events_written_total", "backlog_messages", "dead_letters_total",
                   "prorsa_forecaster_wape", "prorsa_agent_engines", "prorsa_allocator_switch_duration_seconds_bucket",
                   "prorsa_agent_switch_outcomes_total", "prorsa_allocator_plans_total"):
        assert needle in queries, needle
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "prometheus", p["title"]
    ds = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "prometheus"


def test_every_alert_waits_and_explains() -> None:
    rules = [r for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    names = {r["alert"] for r in rules}
    assert {"ConsumerBacklogHigh", "ForecastWapeDrifting", "SwitchesFailing", "EnginesDown"} <= names
    for r in rules:
        assert r.get("for"), r["alert"]
        assert r["annotations"].get("description"), r["alert"]


def test_prometheus_scrapes_each_compose_service_on_its_metrics_port() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    cfg = yaml.safe_load((PROM / "prometheus.yml").read_text())
    targets = {t for job in cfg["scrape_configs"] for sc in job.get("static_configs", []) for t in sc["targets"]}
    for job in cfg["scrape_configs"]:
        for sd in job.get("file_sd_configs", []):
            for f in sd["files"]:
                targets |= {t for group in yaml.safe_load((PROM / f).read_text()) for t in group["targets"]}
    for name in ("tracker", "forecaster", "allocator", "emulated-agent"):
        port = services[name]["environment"]["PRORSA_METRICS_PORT"]
        assert f"{name}:{port}" in targets, name
    for name in ("prometheus", "grafana"):
        assert services[name]["profiles"] == ["monitoring"]
        image = services[name]["image"]
        assert re.search(r":v?\d+\.\d+\.\d+$", image), f"{name}: pin the image tag ({image})"


@NEEDS_PROMTOOL
def test_promtool_accepts_the_rules_and_the_config() -> None:
    for args in (["check", "rules", str(PROM / "alerts.yml")], ["check", "config", str(PROM / "prometheus.yml")]):
        r = subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


@NEEDS_PROMTOOL
def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    # The checker must be able to fail: a rule with a syntax error is refused.
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: Broken\n        expr: rate(up[5m]\n        for: 1m\n")
    r = subprocess.run([PROMTOOL, "check", "rules", str(bad)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
