"""Client telemetry (KIP-714): the subscription a client is given, what a push may be and
how often, the bounds on what the gateway keeps (in process, fake clock); then real
gateways: a confluent-kafka producer and consumer whose pushed metrics appear on
/metrics, and raw requests through the project's codec for every refusal."""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from types import SimpleNamespace

import pytest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import (AggregationTemporality, Gauge, Metric, MetricsData,
                                                        NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum)
from prometheus_client import CollectorRegistry, generate_latest

import raw_client
from cluster_fixtures import wait_for
from stratalog.gateway.config import BrokerConfig
from stratalog.gateway.protocol.catalog import ApiKey
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.telemetry import ClientTelemetry, Subscription, TelemetryLimits
from stratalog.gateway.telemetry.exposition import TelemetryCollector
from stratalog.gateway.telemetry.manager import ZERO_UUID
from stratalog.tiering.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, compress

INTERVAL_MS = 1000


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance_ms(self, ms: float) -> None:
        self.t += ms / 1000


def payload(*points: tuple[str, float], attrs: dict | None = None, delta: bool = False) -> bytes:
    """MetricsData with one gauge per (name, value), or one sum each when `delta` is given
    as a temporality."""
    metrics = []
    for name, value in points:
        point = NumberDataPoint(as_double=value,
                                attributes=[KeyValue(key=k, value=AnyValue(string_value=v))
                                            for k, v in (attrs or {}).items()])
        if delta:
            metrics.append(Metric(name=name, sum=Sum(
                data_points=[point], is_monotonic=True,
                aggregation_temporality=AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA)))
        else:
            metrics.append(Metric(name=name, gauge=Gauge(data_points=[point])))
    data = MetricsData(resource_metrics=[ResourceMetrics(scope_metrics=[ScopeMetrics(metrics=metrics)])])
    return data.SerializeToString()


def telemetry(clock: Clock, metrics: str = "*", **limits) -> ClientTelemetry:
    bounds = dict(max_bytes=64 * 1024, max_instances=100, max_series=1000, max_series_per_instance=100,
                  expiry_ms=60_000)
    bounds.update(limits)
    return ClientTelemetry(Subscription.parse(metrics, INTERVAL_MS), TelemetryLimits(**bounds), clock=clock)


def subscribe(t: ClientTelemetry, client_id: str = "app") -> tuple[uuid.UUID, int]:
    got = t.get_subscriptions(ZERO_UUID, client_id)
    assert got["error_code"] == 0
    return got["client_instance_id"], got["subscription_id"]


def values(t: ClientTelemetry) -> dict[tuple[str, str, tuple], float]:
    return {(inst.client_id, name, labels): value for name, labels, value, inst in t.samples()}


# ---- subscriptions --------------------------------------------------------------------------

@pytest.mark.unit
def test_a_client_sending_the_zero_id_is_given_one_and_the_subscription():
    clock = Clock()
    t = telemetry(clock, metrics="org.apache.kafka.producer., org.apache.kafka.consumer.")
    got = t.get_subscriptions(ZERO_UUID, "app")
    assert got["error_code"] == 0
    assigned = got["client_instance_id"]
    assert isinstance(assigned, uuid.UUID) and assigned != ZERO_UUID
    assert got["push_interval_ms"] == INTERVAL_MS
    assert got["telemetry_max_bytes"] == 64 * 1024
    assert got["accepted_compression_types"] == [ZSTD, LZ4, GZIP, SNAPPY]
    assert got["requested_metrics"] == ["org.apache.kafka.consumer.", "org.apache.kafka.producer."]
    assert got["delta_temporality"] is False
    # Another client gets another id; a client that names its id keeps it, with its own
    # subscription id (a hash that includes the id).
    other = t.get_subscriptions(ZERO_UUID, "app")["client_instance_id"]
    assert other != assigned
    mine = uuid.uuid4()
    again = t.get_subscriptions(mine, "app")
    assert again["client_instance_id"] == mine and again["subscription_id"] != got["subscription_id"]
    # The same settings give the same id after a restart, so clients need not ask again.
    assert Subscription.parse("org.apache.kafka.producer.,org.apache.kafka.consumer.", INTERVAL_MS).id_for(mine) \
        == t.subscription.id_for(mine)
    assert Subscription.parse("*", INTERVAL_MS).id_for(mine) != t.subscription.id_for(mine)


@pytest.mark.unit
def test_requested_metrics_match_by_prefix_star_is_all_and_empty_is_none():
    assert Subscription.parse("*", 1).metrics == ("*",)
    assert Subscription.parse("a., *", 1).metrics == ("*",)
    assert Subscription.parse("*", 1).wants("anything")
    assert Subscription.parse("", 1).metrics == ()
    none = telemetry(Clock(), metrics="")
    assert none.get_subscriptions(ZERO_UUID, "app")["requested_metrics"] == []
    inst, sub = subscribe(none)
    assert none.push(inst, sub, False, NONE, payload(("org.apache.kafka.producer.x", 1.0)), "app")[0] == 0
    assert values(none) == {}
    assert not Subscription.parse("", 1).wants("org.apache.kafka.producer.x")
    some = Subscription.parse("org.apache.kafka.producer.", 1)
    assert some.wants("org.apache.kafka.producer.node.request.latency.avg")
    assert not some.wants("org.apache.kafka.consumer.poll.idle.ratio.avg")


@pytest.mark.unit
def test_asking_again_within_the_interval_is_throttled_unless_a_push_said_to():
    clock = Clock()
    t = telemetry(clock)
    inst, sub = subscribe(t)
    assert t.get_subscriptions(inst, "app")["error_code"] == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    clock.advance_ms(INTERVAL_MS)
    assert t.get_subscriptions(inst, "app")["error_code"] == 0
    # A push with a stale subscription id tells the client to ask again: that is answered.
    assert t.push(inst, sub + 1, False, NONE, payload(("m", 1.0)), "app")[0] == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    assert t.get_subscriptions(inst, "app")["error_code"] == 0


# ---- pushes ------------------------------------------------------------------------------------

@pytest.mark.unit
@pytest.mark.parametrize("codec", [NONE, GZIP, SNAPPY, LZ4, ZSTD])
def test_pushed_values_are_kept_with_their_attributes_whatever_the_compression(codec):
    clock = Clock()
    t = telemetry(clock)
    inst, sub = subscribe(t)
    body = compress(codec, payload(("org.apache.kafka.producer.node.request.latency.avg", 8.5),
                                   attrs={"node_id": "1"}))
    assert t.push(inst, sub, False, codec, body, "app") == (0, None)
    assert values(t) == {("app", "org.apache.kafka.producer.node.request.latency.avg", (("node_id", "1"),)): 8.5}


@pytest.mark.unit
def test_a_later_push_replaces_a_value_and_delta_sums_add_up():
    clock = Clock()
    t = telemetry(clock)
    inst, sub = subscribe(t)
    assert t.push(inst, sub, False, NONE, payload(("g", 1.0)) + payload(("c", 5.0), delta=True), "app")[0] == 0
    clock.advance_ms(INTERVAL_MS)
    assert t.push(inst, sub, False, NONE, payload(("g", 2.0)) + payload(("c", 3.0), delta=True), "app")[0] == 0
    assert values(t) == {("app", "g", ()): 2.0, ("app", "c", ()): 8.0}


@pytest.mark.unit
def test_metrics_outside_the_subscription_are_not_kept():
    t = telemetry(Clock(), metrics="org.apache.kafka.producer.")
    inst, sub = subscribe(t)
    assert t.push(inst, sub, False, NONE, payload(("org.apache.kafka.producer.a", 1.0),
                                                  ("org.apache.kafka.consumer.b", 2.0)), "app")[0] == 0
    assert [k[1] for k in values(t)] == ["org.apache.kafka.producer.a"]


@pytest.mark.unit
def test_refused_pushes_get_kafkas_errors():
    clock = Clock()
    t = telemetry(clock, max_bytes=1024)
    inst, sub = subscribe(t)
    ok = payload(("m", 1.0))
    assert t.push(ZERO_UUID, sub, False, NONE, ok, "app")[0] == ErrorCode.INVALID_REQUEST
    assert t.push(uuid.UUID(int=1), sub, False, NONE, ok, "app")[0] == ErrorCode.INVALID_REQUEST  # reserved
    assert t.push(inst, sub ^ 1, False, NONE, ok, "app")[0] == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    assert t.push(inst, sub, False, 7, ok, "app")[0] == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    assert t.push(inst, sub, False, NONE, b"\0" * 1025, "app")[0] == ErrorCode.TELEMETRY_TOO_LARGE
    # Undecodable pushes are pushes all the same: each waits its interval.
    assert t.push(inst, sub, False, NONE, b"\xff\xff\xff", "app")[0] == ErrorCode.INVALID_RECORD
    clock.advance_ms(INTERVAL_MS)
    assert t.push(inst, sub, False, GZIP, b"not gzip", "app")[0] == ErrorCode.INVALID_RECORD
    clock.advance_ms(INTERVAL_MS)
    # A bomb: small compressed, huge inflated (past ten times telemetry.max.bytes).
    assert t.push(inst, sub, False, ZSTD, compress(ZSTD, b"\0" * 1_000_000), "app")[0] == ErrorCode.INVALID_RECORD
    assert values(t) == {}
    assert t.refused["INVALID_RECORD"] == 3


@pytest.mark.unit
def test_pushing_sooner_than_the_interval_is_throttled_but_a_terminating_push_is_not():
    clock = Clock()
    t = telemetry(clock)
    inst, sub = subscribe(t)
    assert t.push(inst, sub, False, NONE, payload(("m", 1.0)), "app")[0] == 0
    clock.advance_ms(INTERVAL_MS / 2)
    assert t.push(inst, sub, False, NONE, payload(("m", 2.0)), "app")[0] == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert t.push(inst, sub, False, NONE, payload(("m", 2.0)), "app")[0] == ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert t.push(inst, sub, True, NONE, payload(("m", 3.0)), "app")[0] == 0  # the client's last words
    assert values(t) == {("app", "m", ()): 3.0}
    clock.advance_ms(INTERVAL_MS)
    assert t.push(inst, sub, False, NONE, payload(("m", 4.0)), "app")[0] == ErrorCode.INVALID_REQUEST
    assert t.push(inst, sub, True, NONE, payload(("m", 4.0)), "app")[0] == ErrorCode.INVALID_REQUEST
    # A refused terminating push still says the client is leaving: nothing after it is taken.
    other, other_sub = subscribe(t, "other")
    assert t.push(other, other_sub + 1, True, NONE, payload(("m", 1.0)), "other")[0] == \
        ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    assert t.push(other, other_sub, False, NONE, payload(("m", 1.0)), "other")[0] == ErrorCode.INVALID_REQUEST


@pytest.mark.unit
def test_the_handler_decodes_a_big_payload_off_the_loop_and_keeps_it(monkeypatch):
    from stratalog.gateway.handlers import load_handlers
    from stratalog.gateway.handlers.registry import HANDLERS, RequestContext
    from stratalog.gateway.handlers.telemetry import INLINE_BYTES

    load_handlers()
    clock = Clock()
    t = telemetry(clock, max_bytes=1024 * 1024, max_series=5000, max_series_per_instance=5000)
    inst, sub = subscribe(t)
    body = payload(*[(f"org.apache.kafka.producer.m{i}", float(i)) for i in range(2000)])
    assert len(body) > INLINE_BYTES
    ctx = RequestContext(SimpleNamespace(telemetry=t), ApiKey.PUSH_TELEMETRY, 0, "app", "127.0.0.1:5000")
    req = SimpleNamespace(client_instance_id=inst, subscription_id=sub, terminating=False,
                          compression_type=NONE, metrics=body)
    threads = []

    async def to_thread(fn, *args):
        threads.append(fn)
        return await real_to_thread(fn, *args)

    real_to_thread = asyncio.to_thread
    monkeypatch.setattr(asyncio, "to_thread", to_thread)
    got = asyncio.run(HANDLERS[ApiKey.PUSH_TELEMETRY].fn(ctx, req))
    assert threads == [t.decode]
    assert got["error_code"] == 0
    assert t.series_count == 2000 and values(t)[("app", "org.apache.kafka.producer.m7", ())] == 7.0


@pytest.mark.unit
def test_an_instance_forgotten_while_its_payload_decodes_keeps_nothing():
    clock = Clock()
    t = telemetry(clock, max_instances=1)
    inst, sub = subscribe(t, "first")
    code, _, admitted = t.admit_push(inst, sub, False, NONE, payload(("m", 1.0)), "first")
    assert code == 0 and admitted is not None
    subscribe(t, "second")  # evicts the first
    assert t.finish_push(admitted, t.decode(NONE, payload(("m", 1.0)))) == (0, None)
    assert t.series_count == 0 and values(t) == {}


# ---- bounds ------------------------------------------------------------------------------------

@pytest.mark.unit
def test_past_max_instances_the_least_recently_heard_from_is_forgotten():
    clock = Clock()
    t = telemetry(clock, max_instances=3)
    subscribed = [subscribe(t, f"c{i}") for i in range(3)]
    for inst, sub in subscribed:
        assert t.push(inst, sub, False, NONE, payload(("m", 1.0)), "x")[0] == 0
    clock.advance_ms(INTERVAL_MS)
    first, sub0 = subscribed[0]
    assert t.push(first, sub0, False, NONE, payload(("m", 2.0)), "x")[0] == 0  # c0 is now the freshest
    subscribe(t, "c3")
    assert len(t.instances) == 3 and t.evicted == 1
    assert {i.client_id for i in t.instances.values()} == {"c0", "c2", "c3"}
    assert t.series_count == 2  # c1's series went with it


@pytest.mark.unit
def test_series_caps_drop_new_series_and_count_them():
    clock = Clock()
    t = telemetry(clock, max_series=5, max_series_per_instance=3)
    a, sub_a = subscribe(t, "a")
    assert t.push(a, sub_a, False, NONE, payload(*[(f"m{i}", 1.0) for i in range(5)]), "a")[0] == 0
    assert t.series_count == 3 and t.dropped_series == 2
    b, sub_b = subscribe(t, "b")
    assert t.push(b, sub_b, False, NONE, payload(*[(f"m{i}", 1.0) for i in range(5)]), "b")[0] == 0
    assert t.series_count == 5 and t.dropped_series == 5
    clock.advance_ms(INTERVAL_MS)
    # Series already kept still take new values.
    assert t.push(a, sub_a, False, NONE, payload(("m0", 9.0)), "a")[0] == 0
    assert values(t)[("a", "m0", ())] == 9.0


@pytest.mark.unit
def test_long_names_and_many_attributes_are_cut_to_size():
    from stratalog.gateway.telemetry.payload import MAX_LABELS, MAX_TEXT

    t = telemetry(Clock())
    inst, sub = subscribe(t)
    attrs = {f"k{i:02d}" + "x" * 500: "v" * 500 for i in range(20)}
    assert t.push(inst, sub, False, NONE, payload(("m" * 500, 1.0), attrs=attrs), "app")[0] == 0
    [(name, labels, _, _)] = list(t.samples())
    assert name == "m" * MAX_TEXT and len(labels) == MAX_LABELS
    assert all(len(k) == MAX_TEXT and len(v) == MAX_TEXT for k, v in labels)


@pytest.mark.unit
def test_instances_that_stopped_pushing_expire_with_their_series():
    clock = Clock()
    t = telemetry(clock, expiry_ms=10_000)
    old, sub = subscribe(t, "old")
    assert t.push(old, sub, False, NONE, payload(("m", 1.0)), "old")[0] == 0
    clock.advance_ms(6_000)
    subscribe(t, "new")
    clock.advance_ms(6_000)
    assert values(t) == {}  # a scrape (or any request) forgets the expired
    assert [i.client_id for i in t.instances.values()] == ["new"]
    assert t.series_count == 0


@pytest.mark.unit
def test_the_settings_have_kafkas_and_documented_defaults():
    config = BrokerConfig()
    t = ClientTelemetry.from_config(config)
    assert config["telemetry.max.bytes"] == 1024 * 1024
    assert t.subscription == Subscription(("*",), 300_000)
    assert t.limits.max_instances > 0 and t.limits.max_series > 0 and t.limits.expiry_ms > 0


@pytest.mark.unit
def test_the_collector_names_series_after_the_metric_and_labels_them():
    clock = Clock()
    t = telemetry(clock)
    inst, sub = subscribe(t, "billing")
    body = payload(("org.apache.kafka.producer.node.request.latency.avg", 8.5),
                   attrs={"node_id": "1", "client_id": "spoofed", "__name__": "x", "9lives": "y"})
    assert t.push(inst, sub, False, NONE, body, "billing")[0] == 0
    registry = CollectorRegistry()
    registry.register(TelemetryCollector(t))
    text = generate_latest(registry).decode()
    assert ('stratalog_client_org_apache_kafka_producer_node_request_latency_avg{'
            f'_9lives="y",client_id="billing",client_instance_id="{inst}",node_id="1"}} 8.5') in text
    assert "stratalog_telemetry_client_instances 1.0" in text
    assert "stratalog_telemetry_series 1.0" in text


# ---- real gateways and clients -------------------------------------------------------------------

def _metrics(gateway) -> str:
    with urllib.request.urlopen(gateway.http_url + "/metrics", timeout=10) as r:
        return r.read().decode()


def _series(text: str, prefix: str, client_id: str) -> list[str]:
    return [line for line in text.splitlines()
            if line.startswith(prefix) and f'client_id="{client_id}"' in line]


def test_metrics_pushed_by_confluent_kafka_appear_on_metrics(gateway_factory):
    ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    if ck.libversion()[1] < 0x020500FF:
        pytest.skip(f"librdkafka {ck.libversion()[0]} predates KIP-714 (2.5.0)")
    gw = gateway_factory({"client.metrics.interval.ms": INTERVAL_MS})
    topic = f"telemetry-{uuid.uuid4().hex[:6]}"
    producer = ck.Producer({"bootstrap.servers": gw.bootstrap, "client.id": "tele-producer",
                            "enable.metrics.push": True})
    for i in range(20):
        producer.produce(topic, value=b"v%d" % i)
    assert producer.flush(30) == 0
    consumer = ck.Consumer({"bootstrap.servers": gw.bootstrap, "client.id": "tele-consumer",
                            "group.id": f"g-{topic}", "auto.offset.reset": "earliest", "enable.metrics.push": True})
    try:
        consumer.subscribe([topic])
        got = 0

        def pushed():
            nonlocal got
            producer.poll(0)
            for m in consumer.consume(100, timeout=0.2):
                got += m.error() is None
            text = _metrics(gw)
            return (got == 20 and _series(text, "stratalog_client_org_apache_kafka_producer_", "tele-producer")
                    and _series(text, "stratalog_client_org_apache_kafka_consumer_", "tele-consumer") and text)

        text = wait_for(pushed, timeout=30, what="the records, and both clients' pushed metrics on /metrics")
        latency = _series(text, "stratalog_client_org_apache_kafka_producer_node_request_latency_avg",
                          "tele-producer")
        assert latency and 'node_id="1"' in latency[0]
        assert float(latency[0].rsplit(" ", 1)[1]) > 0  # it produced, so requests took time
        assert "stratalog_telemetry_client_instances 2.0" in text
        # A few more push cycles, then the consumer's terminating push as it closes: a
        # well-behaved client is never refused (not throttled for timer jitter either).
        deadline = time.monotonic() + 3.5 * INTERVAL_MS / 1000
        while time.monotonic() < deadline:
            producer.poll(0.1)
            consumer.poll(0.1)
    finally:
        consumer.close()
        producer.flush(5)
    wait_for(lambda: "stratalog_telemetry_terminated_instances 1.0" in _metrics(gw), timeout=10,
             what="the consumer's terminating push")
    assert "stratalog_telemetry_refused_total{" not in _metrics(gw)


class Raw(raw_client.Raw):
    """One connection speaking the telemetry APIs through the project's codec."""

    def call(self, api: ApiKey, body: dict):  # type: ignore[override] - the telemetry APIs have v0 only
        return super().call(api, 0, body)

    def subscribe(self, instance: uuid.UUID = ZERO_UUID):
        return self.call(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, {"client_instance_id": instance})

    def push(self, instance, subscription, metrics: bytes, *, compression=NONE, terminating=False) -> int:
        return self.call(ApiKey.PUSH_TELEMETRY, {"client_instance_id": instance, "subscription_id": subscription,
                                                 "terminating": terminating, "compression_type": compression,
                                                 "metrics": metrics}).error_code


def test_raw_pushes_get_each_refusal_and_the_gateway_keeps_serving(gateway_factory):
    gw = gateway_factory({"client.metrics.interval.ms": 60_000, "telemetry.max.bytes": 4096})
    raw = Raw(gw.bootstrap, "raw-client")
    try:
        got = raw.subscribe()
        assert got.error_code == 0 and got.push_interval_ms == 60_000 and got.telemetry_max_bytes == 4096
        inst, sub = got.client_instance_id, got.subscription_id
        assert inst != ZERO_UUID
        assert raw.subscribe(inst).error_code == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        ok = payload(("org.apache.kafka.producer.record.queue.time.avg", 2.5))
        assert raw.push(ZERO_UUID, sub, ok) == ErrorCode.INVALID_REQUEST
        assert raw.push(inst, sub + 1, ok) == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
        assert raw.push(inst, sub, ok, compression=9) == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
        assert raw.push(inst, sub, b"x" * 4097) == ErrorCode.TELEMETRY_TOO_LARGE
        assert raw.push(inst, sub, compress(LZ4, ok), compression=LZ4) == 0
        assert raw.push(inst, sub, ok) == ErrorCode.THROTTLING_QUOTA_EXCEEDED
        last = payload(("org.apache.kafka.producer.record.queue.time.avg", 7.0))
        assert raw.push(inst, sub, compress(GZIP, last), compression=GZIP, terminating=True) == 0
        assert raw.push(inst, sub, ok, terminating=True) == ErrorCode.INVALID_REQUEST
        # Garbage (another instance: an undecodable push counts as its push of the interval).
        other = raw.subscribe()
        garbage = b"\x0a\xff\xff\xff\xff"
        assert raw.push(other.client_instance_id, other.subscription_id, garbage) == ErrorCode.INVALID_RECORD
        text = _metrics(gw)
        assert ('stratalog_client_org_apache_kafka_producer_record_queue_time_avg{'
                f'client_id="raw-client",client_instance_id="{inst}"}} 7.0') in text
        assert 'stratalog_telemetry_refused_total{error="INVALID_RECORD"} 1.0' in text
        # The same connection still gets answers.
        assert raw.call(ApiKey.API_VERSIONS, {}).error_code == 0
    finally:
        raw.close()


def test_a_gateway_restart_keeps_subscription_ids_valid(gateway_factory):
    gw = gateway_factory({"client.metrics.interval.ms": 60_000})
    raw = Raw(gw.bootstrap)
    got = raw.subscribe()
    raw.close()
    gw.stop()
    gw.start()
    raw = Raw(gw.bootstrap)
    try:
        # A client keeps pushing across a restart without asking again.
        assert raw.push(got.client_instance_id, got.subscription_id, payload(("m", 1.0))) == 0
    finally:
        raw.close()

