"""Pushed client metrics as Prometheus series, collected when /metrics is scraped.

`org.apache.kafka.producer.node.request.latency.avg` pushed by a client becomes
`stratalog_client_org_apache_kafka_producer_node_request_latency_avg`, a gauge holding the
latest value, labelled `client_instance_id`, `client_id` and the point's own attributes
(`node_id`, `topic`, ...). The prefix keeps clients' names apart from the gateway's own.
"""

from __future__ import annotations

import re
from typing import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .manager import ClientTelemetry

PREFIX = "stratalog_client_"
OWN_LABELS = ("client_instance_id", "client_id")
_INVALID = re.compile(r"[^a-zA-Z0-9_]")


def prometheus_name(name: str) -> str:
    return PREFIX + _INVALID.sub("_", name)


def _label_name(key: str) -> str | None:
    label = _INVALID.sub("_", key)
    if not label or label[0].isdigit():
        label = "_" + label
    if label.startswith("__") or label in OWN_LABELS:
        return None  # reserved by Prometheus, or ours
    return label


class TelemetryCollector:
    def __init__(self, telemetry: ClientTelemetry):
        self.telemetry = telemetry

    def collect(self) -> Iterator[Metric]:
        t = self.telemetry
        families: dict[str, Metric] = {}
        seen: set[tuple] = set()
        for name, labels, value, inst in t.samples():
            metric_name = prometheus_name(name)
            family = families.get(metric_name)
            if family is None:
                family = families[metric_name] = Metric(metric_name, f"Client metric {name} (KIP-714), latest pushed",
                                                        "gauge")
            tags = {"client_instance_id": str(inst.instance_id), "client_id": inst.client_id}
            for key, text in labels:
                label = _label_name(key)
                if label is not None:
                    tags.setdefault(label, text)
            identity = (metric_name, tuple(sorted(tags.items())))
            if identity in seen:
                continue  # two pushed names that read the same once made Prometheus names
            seen.add(identity)
            family.add_sample(metric_name, tags, value)
        yield from families.values()
        instances = GaugeMetricFamily("stratalog_telemetry_client_instances",
                                      "Client instances whose pushed metrics this gateway keeps")
        instances.add_metric([], len(t.instances))
        yield instances
        terminated = GaugeMetricFamily("stratalog_telemetry_terminated_instances",
                                       "Client instances kept after their terminating push (closed clients)")
        terminated.add_metric([], sum(1 for inst in t.instances.values() if inst.terminating))
        yield terminated
        series = GaugeMetricFamily("stratalog_telemetry_series", "Pushed client metric series kept")
        series.add_metric([], t.series_count)
        yield series
        dropped = CounterMetricFamily("stratalog_telemetry_dropped_series",
                                      "New pushed series dropped by client.metrics.max.series or "
                                      "client.metrics.max.series.per.instance")
        dropped.add_metric([], t.dropped_series)
        yield dropped
        evicted = CounterMetricFamily("stratalog_telemetry_evicted_instances",
                                      "Client instances forgotten before their expiry by client.metrics.max.instances")
        evicted.add_metric([], t.evicted)
        yield evicted
        refused = CounterMetricFamily("stratalog_telemetry_refused",
                                      "GetTelemetrySubscriptions and PushTelemetry requests refused, by error",
                                      labels=["error"])
        for error, count in sorted(t.refused.items()):
            refused.add_metric([error], count)
        yield refused
