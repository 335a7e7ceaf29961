"""Per-record errors (KIP-467): a batch refused because of some of its records (no key on
a compacted topic, a timestamp outside message.timestamp.before/after.max.ms) is refused
whole, and Produce v8+ names those records, so clients fail exactly them with
INVALID_RECORD and the others with their own error; older versions get the partition's
error alone. Batches of topics that need no record check are never decoded."""

from __future__ import annotations

import socket
import struct
import time
import uuid

import pytest

from stratalog.engine import validation
from stratalog.engine.errors import InvalidRecord, InvalidTimestamp
from stratalog.engine.validation import NO_BOUND, TimestampBounds, validate_batches
from stratalog.gateway.protocol.frames import decode_response, encode_request
from stratalog.tiering.batch import build_batch, set_log_append_time, set_max_timestamp

from conftest import GatewayProcess

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

HOUR = 3_600_000
DAY = 24 * HOUR


# ---- the checks, in process ------------------------------------------------------------

@pytest.mark.unit
def test_batches_of_a_topic_without_record_checks_are_not_decoded(monkeypatch):
    def no_decoding(*_args, **_kwargs):
        raise AssertionError("records decoded on the plain produce path")

    monkeypatch.setattr(validation, "decode_records", no_decoding)
    now = 1_700_000_000_000
    batch = build_batch([(None, b"v")] * 5, timestamp_ms=now)
    assert len(validate_batches(batch, max_bytes=1 << 20, compacted=False, timestamps=None)) == 1
    # An upper bound alone is checked on the header's maxTimestamp while it fits.
    bounds = TimestampBounds.of(now, NO_BOUND, HOUR, NO_BOUND)
    assert len(validate_batches(batch, max_bytes=1 << 20, compacted=False, timestamps=bounds)) == 1


@pytest.mark.unit
def test_each_bad_record_is_named_by_its_index_across_the_partitions_batches():
    first = build_batch([(b"k", b"v"), (None, b"v")])
    second = build_batch([(None, b"v"), (b"k", b"v"), (None, b"v")])
    with pytest.raises(InvalidRecord) as refused:
        validate_batches(first + second, max_bytes=1 << 20, compacted=True, timestamps=None)
    assert [i for i, _ in refused.value.records] == [1, 2, 4]
    assert all("no key" in m for _, m in refused.value.records)
    assert not isinstance(refused.value, InvalidTimestamp)


@pytest.mark.unit
def test_timestamps_are_checked_against_before_and_after_max_ms():
    now = 1_700_000_000_000
    bounds = TimestampBounds.of(now, HOUR, HOUR, NO_BOUND)
    stamps = [now, now - 2 * HOUR, now + 2 * HOUR, now - HOUR, -1]  # -1: no timestamp, not checked
    batch = build_batch([(b"k", b"v")] * len(stamps), timestamps=stamps)
    with pytest.raises(InvalidTimestamp) as refused:
        validate_batches(batch, max_bytes=1 << 20, compacted=False, timestamps=bounds)
    assert [i for i, _ in refused.value.records] == [1, 2]
    assert str(now - HOUR) in refused.value.records[0][1]


@pytest.mark.unit
def test_a_header_without_its_max_timestamp_has_its_records_checked():
    """Sarama 1.22 sends maxTimestamp -1: an upper bound cannot trust the header then."""
    now = 1_700_000_000_000
    bounds = TimestampBounds.of(now, NO_BOUND, HOUR, NO_BOUND)
    batch = bytearray(build_batch([(b"k", b"v")] * 2, timestamps=[now, now + 2 * HOUR]))
    set_max_timestamp(batch, 0, -1)
    with pytest.raises(InvalidTimestamp) as refused:
        validate_batches(bytes(batch), max_bytes=1 << 20, compacted=False, timestamps=bounds)
    assert [i for i, _ in refused.value.records] == [1]


@pytest.mark.unit
def test_a_producer_batch_claiming_log_append_time_is_refused_whole(monkeypatch):
    monkeypatch.setattr(validation, "decode_records", None)  # the header says it all
    keyed = build_batch([(b"k", b"v")] * 2)
    stamped = bytearray(build_batch([(b"k", b"v")] * 3))
    set_log_append_time(stamped, 0, 1_700_000_000_000)
    with pytest.raises(InvalidTimestamp) as refused:
        validate_batches(keyed + bytes(stamped), max_bytes=1 << 20, compacted=False, timestamps=None)
    assert [i for i, _ in refused.value.records] == [2, 3, 4]
    assert "LogAppendTime" in refused.value.records[0][1]


@pytest.mark.unit
def test_the_deprecated_difference_stands_in_for_bounds_left_at_their_default():
    now = 10 * DAY
    assert TimestampBounds.of(now, NO_BOUND, NO_BOUND, NO_BOUND) is None
    assert TimestampBounds.of(now, NO_BOUND, NO_BOUND, DAY) == TimestampBounds(now - DAY, now + DAY)
    assert TimestampBounds.of(now, HOUR, NO_BOUND, DAY) == TimestampBounds(now - HOUR, now + DAY)


@pytest.mark.unit
def test_a_huge_refused_batch_answers_in_a_few_bytes_per_record():
    batch = build_batch([(None, b"")] * 5000)
    with pytest.raises(InvalidRecord) as refused:
        validate_batches(batch, max_bytes=1 << 20, compacted=True, timestamps=None)
    records = refused.value.records
    assert len(records) == 5000
    assert sum(m is not None for _, m in records) == validation.MESSAGES_KEPT


@pytest.mark.unit
def test_the_records_listed_are_bounded(monkeypatch):
    monkeypatch.setattr(validation, "RECORDS_LISTED", 1000)
    batch = build_batch([(None, b"")] * 3000)
    with pytest.raises(InvalidRecord) as refused:
        validate_batches(batch, max_bytes=1 << 20, compacted=True, timestamps=None)
    assert [i for i, _ in refused.value.records] == list(range(1000))
    assert str(refused.value).startswith("3000 record(s) refused")


# ---- through a gateway ---------------------------------------------------------------

@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    g = GatewayProcess(tmp_path_factory.mktemp("record-errors") / "data").start()
    yield g
    g.stop()


def _topic(gw, **configs) -> str:
    name = f"rec-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})  # kept alive until the result
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(15)
    return name


def _produce_one_batch(gw, topic: str, records: list[tuple[bytes | None, int | None]]) -> dict[int, KafkaError | None]:
    """Send every record in ONE batch (long linger, batch.num.messages as many) and return
    each record's delivery report error."""
    producer = Producer({"bootstrap.servers": gw.bootstrap, "linger.ms": 5000, "acks": "all",
                         "batch.num.messages": len(records), "enable.idempotence": False})
    reports: dict[int, KafkaError | None] = {}
    for i, (key, timestamp) in enumerate(records):
        extra = {} if timestamp is None else {"timestamp": timestamp}
        producer.produce(topic, value=b"value-%d" % i, key=key, partition=0,
                         on_delivery=lambda err, _msg, i=i: reports.__setitem__(i, err), **extra)
    assert producer.flush(30) == 0
    assert len(reports) == len(records)
    return reports


def _end_offset(gw, topic: str) -> int:
    consumer = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "record-errors"})
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
    finally:
        consumer.close()


def test_keyless_records_on_a_compacted_topic_fail_alone_with_invalid_record(gw):
    topic = _topic(gw, **{"cleanup.policy": "compact"})
    keyless = set(range(3, 100, 10))
    reports = _produce_one_batch(gw, topic, [(None if i in keyless else b"key-%d" % i, None) for i in range(100)])

    failed = {i for i, err in reports.items() if err is not None and err.code() == KafkaError.INVALID_RECORD}
    assert failed == keyless
    # librdkafka fails the other 90 with its own code: refused because of another record.
    others = {err.code() for i, err in reports.items() if i not in keyless}
    assert others == {KafkaError._INVALID_DIFFERENT_RECORD}
    assert _end_offset(gw, topic) == 0  # the whole batch was refused

    # The producer goes on: the same records with keys are appended.
    reports = _produce_one_batch(gw, topic, [(b"key-%d" % i, None) for i in range(100)])
    assert all(err is None for err in reports.values())
    assert _end_offset(gw, topic) == 100


def test_out_of_range_timestamps_fail_their_records(gw):
    topic = _topic(gw, **{"message.timestamp.before.max.ms": str(HOUR),
                          "message.timestamp.after.max.ms": str(HOUR)})
    now = int(time.time() * 1000)
    stamps = [now] * 20
    stamps[4], stamps[11] = now - DAY, now + DAY
    reports = _produce_one_batch(gw, topic, [(b"k", ts) for ts in stamps])
    assert {i for i, err in reports.items() if err.code() == KafkaError.INVALID_RECORD} == {4, 11}
    assert {err.code() for i, err in reports.items() if i not in (4, 11)} == {KafkaError._INVALID_DIFFERENT_RECORD}

    # One bad record alone: librdkafka (2.x) then gives every record of the batch the
    # partition's error, here INVALID_TIMESTAMP (its interceptor step overwrites the
    # per-record codes unless more than one record error came back).
    stamps = [now] * 5
    stamps[2] = now - DAY
    reports = _produce_one_batch(gw, topic, [(b"k", ts) for ts in stamps])
    assert {err.code() for err in reports.values()} == {KafkaError.INVALID_TIMESTAMP}
    assert _end_offset(gw, topic) == 0

    reports = _produce_one_batch(gw, topic, [(b"k", now - 60_000)] * 5)
    assert all(err is None for err in reports.values())


def test_the_deprecated_difference_bounds_a_topic_and_log_append_time_is_not_checked(gw):
    now = int(time.time() * 1000)
    bounded = _topic(gw, **{"message.timestamp.difference.max.ms": str(HOUR)})
    reports = _produce_one_batch(gw, bounded, [(b"k", now), (b"k", now + DAY), (b"k", now - DAY)])
    assert {i: err.code() for i, err in reports.items()} == {
        0: KafkaError._INVALID_DIFFERENT_RECORD, 1: KafkaError.INVALID_RECORD, 2: KafkaError.INVALID_RECORD}

    stamped = _topic(gw, **{"message.timestamp.type": "LogAppendTime",
                            "message.timestamp.before.max.ms": str(HOUR)})
    reports = _produce_one_batch(gw, stamped, [(b"k", now - DAY)] * 3)
    assert all(err is None for err in reports.values())


def test_kafka_python_fails_the_keyless_records_alone_like_the_java_client(gw):
    kafka = pytest.importorskip("kafka", reason="kafka-python is not installed")
    from kafka.errors import InvalidRecordError, KafkaError as KpError

    topic = _topic(gw, **{"cleanup.policy": "compact"})
    producer = kafka.KafkaProducer(bootstrap_servers=gw.bootstrap, linger_ms=5000, batch_size=1 << 20, retries=0)
    try:
        keyless = {3, 13}
        futures = [producer.send(topic, value=b"v", key=None if i in keyless else b"k", partition=0)
                   for i in range(20)]
        producer.flush(30)
        outcomes = {}
        for i, future in enumerate(futures):
            with pytest.raises(KpError) as failed:
                future.get(10)
            outcomes[i] = failed.value
    finally:
        producer.close()
    assert {i for i, e in outcomes.items() if isinstance(e, InvalidRecordError)} == keyless
    assert "record 3 has no key" in str(outcomes[3])
    # The others: refused because of another record of their batch (Kafka's Java client says the same).
    assert all("part of a batch" in str(e) for i, e in outcomes.items() if i not in keyless)
    assert _end_offset(gw, topic) == 0


# ---- Produce versions, with the protocol codec as the client -------------------------

def _produce_raw(gw, version: int, topic: str, batch: bytes):
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 10_000,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(encode_request(0, version, 1, body))
        size = struct.unpack(">i", _read(s, 4))[0]
        _, response = decode_response(0, version, _read(s, size))
    return response.responses[0].partition_responses[0]


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


@pytest.mark.parametrize("version", [8, 9, 11])
def test_produce_v8_and_later_list_the_records_to_blame(gw, version):
    topic = _topic(gw, **{"cleanup.policy": "compact"})
    part = _produce_raw(gw, version, topic, build_batch([(b"k", b"v"), (None, b"v"), (b"k", b"v"), (None, b"v")]))
    assert part.error_code == KafkaError.INVALID_RECORD
    assert [e.batch_index for e in part.record_errors] == [1, 3]
    assert all("no key" in e.batch_index_error_message for e in part.record_errors)
    assert "2 record(s) refused" in part.error_message
    assert part.base_offset == -1


@pytest.mark.parametrize("version", [3, 7])
def test_older_produce_versions_get_the_partition_error_alone(gw, version):
    topic = _topic(gw, **{"cleanup.policy": "compact"})
    part = _produce_raw(gw, version, topic, build_batch([(b"k", b"v"), (None, b"v")]))
    assert part.error_code == KafkaError.INVALID_RECORD
    assert "record_errors" not in part.__dict__ or not part.record_errors
    # The gateway still serves the topic.
    assert _produce_raw(gw, version, topic, build_batch([(b"k", b"v")])).error_code == 0
