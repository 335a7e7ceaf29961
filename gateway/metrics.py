"""Prometheus metrics of one gateway.

What every request updates (bytes and records by topic, request latency by API) is counted
in plain dicts and lists, which cost a fraction of a prometheus_client metric's locked
update, and exported when Prometheus scrapes; so is everything that is a reading of state
(partitions led, cache and object-store counters, consumer lag). Rarer events (WAL flushes
and their failures) use prometheus_client's metrics directly.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from .telemetry.exposition import TelemetryCollector

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.bytes_in: dict[str, int] = {}  # by topic
        self.records_in: dict[str, int] = {}
        self.bytes_out: dict[str, int] = {}
        self.requests: dict[str, _Latencies] = {}  # by API name
        # Garbage-collection pauses by generation (gc_schedule observes them, from inside
        # the collector: hence these lock-free counts, never a prometheus_client metric).
        self.gc_pauses = {generation: _Latencies() for generation in (0, 1, 2)}
        self.registry.register(_HotPathCollector(self))
        self.wal_flush = Histogram("stratalog_wal_flush_seconds", "WAL object upload plus commit",
                                   buckets=LATENCY_BUCKETS, registry=self.registry)
        self.wal_commit = Histogram("stratalog_wal_commit_seconds", "Coordinator commit of a WAL object",
                                    buckets=LATENCY_BUCKETS, registry=self.registry)
        self.wal_failures = Counter("stratalog_wal_flush_failures", "Failed WAL uploads and commits (each retried)",
                                    ["step"], registry=self.registry)
        self.broker = None
        self.connection_limits = None  # the gateway's ConnectionLimits, set at start

    def observe_request(self, api: str, seconds: float) -> None:
        latencies = self.requests.get(api)
        if latencies is None:
            latencies = self.requests[api] = _Latencies()
        latencies.observe(seconds)

    def produced(self, topic: str, nbytes: int, records: int) -> None:
        self.bytes_in[topic] = self.bytes_in.get(topic, 0) + nbytes
        self.records_in[topic] = self.records_in.get(topic, 0) + records

    def fetched(self, topic: str, nbytes: int) -> None:
        self.bytes_out[topic] = self.bytes_out.get(topic, 0) + nbytes

    def attach(self, broker) -> None:
        """Collect the state readings of this broker on every scrape."""
        self.broker = broker
        self.registry.register(_StateCollector(broker, self))
        self.registry.register(TelemetryCollector(broker.telemetry))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Latencies:
    """One API's request latencies: a count per LATENCY_BUCKETS bucket (the last for more
    than the largest bound) and their sum."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, int]]:
        """Prometheus's cumulative buckets, "+Inf" last."""
        out, running = [], 0
        for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), self.counts):
            running += count
            out.append((bound, running))
        return out


class _HotPathCollector:
    """The counts the hot paths keep (see the module docstring), as Prometheus metrics."""

    def __init__(self, metrics: GatewayMetrics):
        self.metrics = metrics

    def collect(self):
        m = self.metrics
        for name, help_, counts in (("stratalog_topic_bytes_in", "Record-batch bytes appended", m.bytes_in),
                                    ("stratalog_topic_records_in", "Records appended", m.records_in),
                                    ("stratalog_topic_bytes_out", "Record-batch bytes fetched", m.bytes_out)):
            family = CounterMetricFamily(name, help_, labels=["topic"])
            for topic, value in sorted(counts.items()):
                family.add_metric([topic], value)
            yield family
        requests = HistogramMetricFamily("stratalog_request_seconds", "Request latency by API", labels=["api"])
        for api, latencies in sorted(m.requests.items()):
            requests.add_metric([api], latencies.buckets(), latencies.total)
        yield requests
        pauses = HistogramMetricFamily("stratalog_gc_pause_seconds",
                                       "Python garbage-collection pauses, by generation (2: full)",
                                       labels=["generation"])
        for generation, latencies in sorted(m.gc_pauses.items()):
            pauses.add_metric([str(generation)], latencies.buckets(), latencies.total)
        yield pauses


class _StateCollector:
    def __init__(self, broker, metrics: GatewayMetrics):
        self.broker = broker
        self.metrics = metrics

    def collect(self):
        b = self.broker
        led = GaugeMetricFamily("stratalog_partitions_led", "Partitions this gateway leads")
        led.add_metric([], b.led_count())
        yield led
        offline = GaugeMetricFamily("stratalog_partitions_offline",
                                    "Partitions offline because their data could not be recovered "
                                    "(cluster-wide, as the coordinator records them)")
        offline.add_metric([], len(b.offline_partitions()))
        yield offline
        under = GaugeMetricFamily("stratalog_under_replicated_partitions",
                                  "Led partitions whose ISR is smaller than their replica set")
        under.add_metric([], b.under_replicated_count())
        yield under
        fault = b.engine.storage_fault()
        failed = GaugeMetricFamily("stratalog_storage_failed",
                                   "1 while the WAL cannot be written past wal.fault.timeout.ms (produce refused)")
        failed.add_metric([], 1 if fault is not None else 0)
        yield failed
        ops = CounterMetricFamily("stratalog_object_store_requests", "Object-store requests",
                                  labels=["operation"])
        nbytes = CounterMetricFamily("stratalog_object_store_bytes", "Object-store bytes",
                                     labels=["direction"])
        stats = getattr(b.objects, "stats", {})
        for op in ("put", "get", "head", "list", "delete", "errors"):
            if op in stats:
                ops.add_metric([op], stats[op])
        for direction in ("bytes_in", "bytes_out"):
            if direction in stats:
                nbytes.add_metric([direction], stats[direction])
        yield ops
        yield nbytes
        cache = getattr(b.engine.cache, "stats", {})
        hits, misses = cache.get("hits", 0), cache.get("misses", 0)
        ratio = GaugeMetricFamily("stratalog_cache_hit_ratio", "Remote-read cache hits over lookups")
        ratio.add_metric([], hits / (hits + misses) if hits + misses else 0.0)
        yield ratio
        corrupt = CounterMetricFamily("stratalog_corrupt_batches",
                                      "Damaged record batches read from the object store and refused "
                                      "(CRC-32C or framing); each object byte counted once",
                                      labels=["topic"])
        for topic, count in sorted(b.engine.corrupt_batches.items()):
            corrupt.add_metric([topic], count)
        yield corrupt
        lag = GaugeMetricFamily("stratalog_consumer_group_lag", "High watermark minus committed offset",
                                labels=["group", "topic", "partition"])
        for (group, topic, partition), value in b.group_lag.items():
            lag.add_metric([group, topic, str(partition)], value)
        yield lag
        quotas = getattr(b, "quotas", None)
        if quotas is not None:
            throttle = CounterMetricFamily("stratalog_quota_throttle_time_ms",
                                           "Throttle time given to clients, by the quota that caused it "
                                           "(produce, fetch, request, controller_mutation)", labels=["quota"])
            throttled = CounterMetricFamily("stratalog_quota_throttled_responses",
                                            "Answers that carried a quota's throttle time", labels=["quota"])
            for kind in sorted(quotas.throttled_ms):
                throttle.add_metric([kind], quotas.throttled_ms[kind])
                throttled.add_metric([kind], quotas.throttled[kind])
            yield throttle
            yield throttled
        limits = self.metrics.connection_limits
        if limits is not None:
            open_ = GaugeMetricFamily("stratalog_connections", "Open client connections")
            open_.add_metric([], limits.total)
            yield open_
            refused = CounterMetricFamily("stratalog_connections_refused",
                                          "Connections closed at once by a connection quota",
                                          labels=["limit"])
            for reason, count in sorted(limits.refused.items()):
                refused.add_metric([reason], count)
            yield refused
