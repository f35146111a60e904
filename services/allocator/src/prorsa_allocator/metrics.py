"""Prometheus metrics of the running allocator (read from its state at scrape time).

``prorsa_allocator_plan_engines{role}`` and ``prorsa_allocator_plan_delta`` (the latest plan),
``prorsa_allocator_plan_feasible``, ``prorsa_allocator_commands_in_flight`` (switches in flight),
``prorsa_allocator_switch_cost_seconds{mode}`` (the learned switch durations), and the
decision counters as ``prorsa_allocator_<name>_total`` (forecasts, plans, commands, retries,
abandoned, failed, switched, ...).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class _AllocatorCollector:
    def __init__(self, state) -> None:
        self.state = state

    def collect(self):
        st = self.state
        a = st.allocator
        engines = GaugeMetricFamily("prorsa_allocator_plan_engines", "engines per role in the latest plan", labels=["role"])
        if st.plans:
            plan = st.plans[-1]
            engines.add_metric(["prefill"], plan.n_prefill)
            engines.add_metric(["decode"], plan.n_decode)
            yield GaugeMetricFamily("prorsa_allocator_plan_delta", "headroom delta of the latest plan", value=plan.delta)
            yield GaugeMetricFamily("prorsa_allocator_plan_feasible", "1 if the latest plan is feasible",
                                    value=1.0 if plan.feasible else 0.0)
        yield engines
        yield GaugeMetricFamily("prorsa_allocator_commands_in_flight", "switch commands awaiting an outcome",
                                value=len(a.table.commands))
        cost = GaugeMetricFamily("prorsa_allocator_switch_cost_seconds", "learned switch duration", labels=["mode"])
        for mode in ("in_place", "restart"):
            est = getattr(a.switch_cost, f"{mode}_s", None)
            if isinstance(est, (int, float)):
                cost.add_metric([mode], float(est))
        yield cost
        for name, value in a.counters.__dict__.items():
            yield CounterMetricFamily(f"prorsa_allocator_{name}", f"allocator {name}", value=value)
        yield CounterMetricFamily("prorsa_allocator_invalid", "messages that were not valid events", value=st.invalid)


def allocator_registry(state) -> CollectorRegistry:
    """A registry whose metrics are read from the service's ``ServiceState`` at every scrape."""
    reg = CollectorRegistry()
    reg.register(_AllocatorCollector(state))
    return reg
