"""Prometheus metrics of a running engine agent (read from the agent at scrape time).

``prorsa_agent_engines{role,up}`` (the instances and their roles),
``prorsa_agent_switches_in_flight``, ``prorsa_agent_switch_outcomes_total{outcome}``,
``prorsa_agent_switch_seconds_sum`` / ``_count`` (durations of completed switches),
``prorsa_agent_router_reregistrations_total`` (engines registered again because the
router did not list them, :mod:`.reconcile`), ``prorsa_agent_dead_letters_total{kind}`` (command messages acknowledged without being
carried out: invalid, on the wrong subject, or failed in the agent),
``prorsa_agent_consumer_pending{consumer}`` / ``prorsa_agent_backlog_messages{consumer}``
(commands not yet delivered / not yet acknowledged, and the registrations not yet read,
from the JetStream consumer info) and ``prorsa_agent_consumer_resets_total{consumer}``.
"""

from __future__ import annotations

from collections import Counter

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from prorsa_runtime.metrics import consumer_metrics


class AgentMetrics:
    """Switch outcomes recorded by the agent, plus a collector over its engine table."""

    def __init__(self) -> None:
        self.outcomes: Counter[str] = Counter()
        self.seconds_sum = 0.0
        self.reregistrations = 0
        self.agent = None

    def record(self, outcome: str, seconds: float | None = None) -> None:
        self.outcomes[outcome] += 1
        if seconds is not None:
            self.seconds_sum += seconds

    def collect(self):
        agent = self.agent
        engines = GaugeMetricFamily("prorsa_agent_engines", "instances by role", labels=["role", "up"])
        if agent is not None:
            seen: Counter[tuple[str, str]] = Counter(
                (st.role or "unknown", "1" if st.up else "0") for st in agent.engines.values())
            for (role, up), n in seen.items():
                engines.add_metric([role, up], n)
            yield GaugeMetricFamily("prorsa_agent_switches_in_flight", "switches being carried out",
                                    value=sum(1 for st in agent.engines.values() if st.lock.locked()))
        yield engines
        out = CounterMetricFamily("prorsa_agent_switch_outcomes", "switch outcomes", labels=["outcome"])
        for k, v in self.outcomes.items():
            out.add_metric([k], v)
        yield out
        yield CounterMetricFamily("prorsa_agent_switch_seconds_sum", "total seconds of completed switches",
                                  value=self.seconds_sum)
        yield CounterMetricFamily("prorsa_agent_switch_seconds_count", "completed switches",
                                  value=self.outcomes.get("switched", 0))
        yield CounterMetricFamily("prorsa_agent_router_reregistrations",
                                  "engines registered with the router again because it did not list them",
                                  value=self.reregistrations)
        dead = getattr(agent, "dead_letters", None)
        if dead is not None:
            yield from dead.collect()
        yield from consumer_metrics("agent", getattr(agent, "command_figures", None),
                                    getattr(agent, "registry_reader", None))

    def registry(self) -> CollectorRegistry:
        reg = CollectorRegistry()
        reg.register(self)
        return reg
