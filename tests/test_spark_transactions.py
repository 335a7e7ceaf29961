"""Spark reads of transactional topics: with `kafka.isolation.level=read_committed` Spark
returns exactly what a read_committed confluent-kafka consumer returns (aborted records
skipped through the sealed segments' .txnindex, control batches never rows, nothing past
the last stable offset), on file:// and on S3; read_uncommitted returns every record."""

from __future__ import annotations

import time
import uuid

import pytest

import spark_helpers
from spark_helpers import READERS, Consumed, create_topic, gateway_on_store, rows_of, spark_session
from stratalog.spark.metadata import ManifestMetadata, TopicNotFound
from stratalog.spark.objects import StoreSpec
from stratalog.spark.options import OptionError, parse_options

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402

SETTINGS = {"log.roll.ms": 500, "log.segment.bytes": 4000}
PARTITIONS = 2


@pytest.fixture(scope="module")
def spark():
    return spark_session()


@pytest.fixture(scope="module", params=["file", "s3"])
def store(request, tmp_path_factory):
    data = tmp_path_factory.mktemp(f"txn-{request.param}") / "data"
    with gateway_on_store(request.param, data, SETTINGS, "txn") as (gw, spec, _):
        yield gw, spec


def _read(spark, spec: StoreSpec, topic: str, isolation: str, **options):
    """The rows both readers return (the JVM one when the session has it); they must agree."""
    got = []
    for fmt in READERS:
        if fmt == "stratalog-jvm" and spark_helpers.JVM_READER_MISSING:
            continue
        reader = spark.read.format(fmt).option("topic", topic).option("kafka.isolation.level", isolation)
        for k, v in options.items():
            reader = reader.option(k, v)
        if spec.endpoint:
            reader = reader.option("endpoint", spec.endpoint).option("pathStyle", "true")
        got.append(rows_of(reader.load(spec.url)))
    assert all(rows == got[0] for rows in got), "the JVM reader and the Python reader disagree"
    return got[0]


def _consumed(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[Consumed]:
    """What a consumer reads from the start up to where it stops: the last stable offset
    for read_committed, the high watermark for read_uncommitted."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rc-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.auto.commit": False})
    out = []
    try:
        stable = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in c.position(
                [TopicPartition(topic, p) for p in range(PARTITIONS)])}
            if all(positions[p] >= stable[p] for p in range(PARTITIONS)):
                break
            m = c.poll(0.3)
            if m is None or m.error():
                continue
            ts_type, ts = m.timestamp()
            out.append(Consumed(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                ts, 1 if ts_type == 2 else 0))
        else:
            raise AssertionError(f"the {isolation} consumer did not reach its end")
    finally:
        c.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def _wait_sealed(spec: StoreSpec, bootstrap: str, topic: str) -> None:
    """Until every partition's manifest reaches its high watermark."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw"})
    ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
    c.close()
    meta = ManifestMetadata(spec.open(), topic)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            parts = meta.snapshot().partitions
            if all(p in parts and parts[p].sealed_end >= end for p, end in ends.items()):
                return
        except TopicNotFound:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{topic} was not sealed up to {ends}")


def _transactions(producer: Producer, topic: str, tag: str, pattern: str) -> None:
    """One transaction per letter: c commits, a aborts; 7 records each over both partitions."""
    for n, kind in enumerate(pattern):
        producer.begin_transaction()
        for i in range(7):
            producer.produce(topic, key=b"%s-%d" % (tag.encode(), i), value=b"%s%d-%s-%d" % (
                tag.encode(), n, kind.encode(), i), partition=i % PARTITIONS, headers=[("t", tag.encode())])
        producer.flush(30)
        if kind == "c":
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def test_spark_read_committed_matches_a_read_committed_consumer(spark, store):
    gw, spec = store
    topic = f"txn-{uuid.uuid4().hex[:6]}"
    create_topic(gw.bootstrap, topic, PARTITIONS)
    one = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": f"{topic}-1", "linger.ms": 5})
    two = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": f"{topic}-2", "linger.ms": 5})
    plain = Producer({"bootstrap.servers": gw.bootstrap, "linger.ms": 5})
    for p in (one, two):
        p.init_transactions(30)
    _transactions(one, topic, "x", "cac")
    for i in range(10):
        plain.produce(topic, value=b"plain-%d" % i, partition=i % PARTITIONS)
    plain.flush(30)
    _transactions(two, topic, "y", "aca")
    _transactions(one, topic, "z", "ac")
    # A transaction left open: read_committed stops at its first offset, in Spark too.
    two.begin_transaction()
    for i in range(6):
        two.produce(topic, value=b"open-%d" % i, partition=i % PARTITIONS)
    two.flush(30)
    for i in range(4):
        plain.produce(topic, value=b"after-open-%d" % i, partition=i % PARTITIONS)
    plain.flush(30)
    _wait_sealed(spec, gw.bootstrap, topic)

    committed = _consumed(gw.bootstrap, topic)
    assert not any(r.value.startswith((b"open", b"after-open")) or b"-a-" in r.value for r in committed)
    assert _read(spark, spec, topic, "read_committed") == committed
    assert _read(spark, spec, topic, "read_uncommitted") == _consumed(gw.bootstrap, topic, "read_uncommitted")

    two.commit_transaction(30)
    plain.produce(topic, value=b"last", partition=0)
    plain.flush(30)
    _wait_sealed(spec, gw.bootstrap, topic)
    committed = _consumed(gw.bootstrap, topic)
    assert sum(r.value.startswith(b"open") for r in committed) == 6
    assert _read(spark, spec, topic, "read_committed") == committed


def test_a_starting_timestamp_in_an_aborted_transaction_starts_there(spark, store):
    """The first record at or after startingTimestamp is an aborted one: the read starts
    at it, so every committed record after it counts, also those stamped earlier (as a
    read_committed consumer reads on from the offset offsetsForTimes gives)."""
    gw, spec = store
    topic = f"txn-ts-{uuid.uuid4().hex[:6]}"
    create_topic(gw.bootstrap, topic, PARTITIONS)
    producer = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": f"{topic}-1", "linger.ms": 5})
    producer.init_transactions(30)
    now = int(time.time() * 1000)
    for name, at, commit in (("before", now - 60_000, True), ("aborted", now, False), ("after", now - 50_000, True)):
        producer.begin_transaction()
        for i in range(6):
            producer.produce(topic, value=b"%s-%d" % (name.encode(), i), partition=i % PARTITIONS, timestamp=at)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
    _wait_sealed(spec, gw.bootstrap, topic)
    got = _read(spark, spec, topic, "read_committed", startingTimestamp=str(now - 1000))
    assert sorted(r.value for r in got) == [b"after-%d" % i for i in range(6)]


@pytest.mark.unit
def test_the_isolation_level_option_is_checked():
    base = {"topic": "t", "path": "file:///tmp/x"}
    assert parse_options(base).read_committed is False
    assert parse_options({**base, "kafka.isolation.level": "READ_COMMITTED"}).read_committed is True
    with pytest.raises(OptionError, match="kafka.isolation.level"):
        parse_options({**base, "kafka.isolation.level": "serializable"})
