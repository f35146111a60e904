"""Prometheus metrics of the running allocator (read from its state at scrape time).

``prorsa_allocator_plan_engines{role}`` and ``prorsa_allocator_plan_delta`` (the latest plan),
``prorsa_allocator_plan_feasible``, ``prorsa_allocator_commands_in_flight`` (switches in flight),
``prorsa_allocator_switch_cost_seconds{mode}`` (the learned switch durations), and the
decision counters as ``prorsa_allocator_<name>_total`` (forecasts, plans, commands, retries,
abandoned, failed, switched, ...). Also, per switch in flight,
``prorsa_allocator_switch_in_flight_seconds{engine,to_role}`` (event time since its command was
last sent) and ``prorsa_allocator_switch_attempts{engine,to_role}``; the histogram
``prorsa_allocator_switch_duration_seconds{mode}`` of completed switches
(``engine.switched.seconds``); ``prorsa_allocator_prefill_tokens_per_s`` (θᴾ);
``prorsa_allocator_event_time_seconds`` and ``prorsa_allocator_watermarks_total``;
``prorsa_allocator_objective{objective}`` (1 for the gain test's objective in force: an
'auto' objective resolved by the runs' modes, 0 for the other);
``prorsa_allocator_actuating`` (1 when plans are commanded, 0 in advisory mode, whose
planned switches count in ``prorsa_allocator_advised_total``);
``prorsa_allocator_dead_letters_total{kind}`` (messages skipped: invalid, on the wrong
subject, or failed in the planner); ``prorsa_allocator_consumer_pending{consumer}``,
``prorsa_allocator_backlog_messages{consumer}`` and ``prorsa_allocator_consumer_resets_total``
(its consumer's backlog, from the JetStream consumer info).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from prorsa_runtime.metrics import consumer_metrics

from .records import SWITCH_BUCKETS_S


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
        yield from _switches(a)
        yield GaugeMetricFamily("prorsa_allocator_prefill_tokens_per_s",
                                "theta P: full-prompt prefill tokens/s of one prefill instance", value=a.theta.value)
        objective = GaugeMetricFamily("prorsa_allocator_objective",
                                      "1 for the objective moves are judged by now ('auto' resolved by the runs' modes)",
                                      labels=["objective"])
        for name in ("capacity", "turn_latency", "saturation"):
            objective.add_metric([name], 1.0 if a.config.objective == name else 0.0)
        yield objective
        yield GaugeMetricFamily("prorsa_allocator_actuating",
                                "1 if plans are commanded, 0 in advisory mode (plans published, no engine.command)",
                                value=1.0 if a.config.actuate else 0.0)
        yield GaugeMetricFamily("prorsa_allocator_event_time_seconds",
                                "event time (largest ts seen, or the tracker watermark)", value=a.now if a.now > 0 else 0.0)
        yield CounterMetricFamily("prorsa_allocator_watermarks", "tracker watermarks applied",
                                  value=getattr(st, "watermarks", 0))
        for name, value in a.counters.__dict__.items():
            yield CounterMetricFamily(f"prorsa_allocator_{name}", f"allocator {name}", value=value)
        yield CounterMetricFamily("prorsa_allocator_invalid", "messages that were not valid events", value=st.invalid)
        dead = getattr(st, "dead_letters", None)
        if dead is not None:
            yield from dead.collect()
        yield from consumer_metrics("allocator", getattr(st, "reader", None))


def _switches(a):
    """Each switch in flight (age in event time, attempts) and completed switch durations."""
    age = GaugeMetricFamily("prorsa_allocator_switch_in_flight_seconds",
                            "event time since the switch command was last sent", labels=["engine", "to_role"])
    attempts = GaugeMetricFamily("prorsa_allocator_switch_attempts",
                                 "sends of the command in flight (1 = no retry yet)", labels=["engine", "to_role"])
    for cmd in a.table.commands.values():
        age.add_metric([cmd.engine, cmd.to_role], max(0.0, a.now - cmd.issued_ts))
        attempts.add_metric([cmd.engine, cmd.to_role], cmd.attempts)
    yield age
    yield attempts
    hist = HistogramMetricFamily("prorsa_allocator_switch_duration_seconds",
                                 "completed switches: command to engine.switched, drain included", labels=["mode"])
    sd = a.switch_durations
    for mode, counts in sd.buckets.items():
        buckets = [(str(b), c) for b, c in zip(SWITCH_BUCKETS_S, counts)] + [("+Inf", sd.count[mode])]
        hist.add_metric([mode], buckets, sum_value=sd.total_s[mode])
    yield hist


def allocator_registry(state) -> CollectorRegistry:
    """A registry whose metrics are read from the service's ``ServiceState`` at every scrape."""
    reg = CollectorRegistry()
    reg.register(_AllocatorCollector(state))
    return reg
