"""confluent-kafka (librdkafka 2.x) against a real `stratalog serve`."""

from __future__ import annotations

import time
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from .scenario import CODECS, records  # noqa: E402


def create_topic(bootstrap: str, name: str, partitions: int = 1, config: dict | None = None) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    fs = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1,
                                       config=config or {})], request_timeout=15)
    fs[name].result(15)


def produce(bootstrap: str, topic: str, rows, codec: str, partition: int = 0, **conf) -> list[int]:
    p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 5,
                  "acks": "all", **conf})
    offsets: list[int] = []
    errors = []

    def done(err, msg):
        if err is not None:
            errors.append(err)
        else:
            offsets.append(msg.offset())

    for key, value, headers in rows:
        p.produce(topic, value=value, key=key, headers=headers or None, partition=partition,
                  on_delivery=done)
    assert p.flush(30) == 0
    assert not errors, errors
    return offsets


def consume(consumer, n: int, timeout: float = 30.0) -> list:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                continue
            raise AssertionError(msg.error())
        out.append(msg)
    return out


def as_rows(msgs):
    return [(m.key(), m.value(), [(k, v) for k, v in (m.headers() or [])]) for m in msgs]


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume_by_assignment(gateway, codec):
    topic = f"ck-{codec}-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic)
    rows = records(codec)
    offsets = produce(gateway.bootstrap, topic, rows, codec)
    assert sorted(offsets) == list(range(len(rows)))
    c = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "unused",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    msgs = consume(c, len(rows))
    c.close()
    assert [m.offset() for m in msgs] == list(range(len(rows)))
    assert as_rows(msgs) == rows


def test_group_commit_and_resume(gateway):
    topic = f"ck-group-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic, partitions=3)
    rows = [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(30)]
    for p in range(3):
        produce(gateway.bootstrap, topic, rows[p::3], "none", partition=p)
    conf = {"bootstrap.servers": gateway.bootstrap, "group.id": f"g-{topic}",
            "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": 6000}
    c = Consumer(conf)
    c.subscribe([topic])
    first = consume(c, 12)
    assert len(first) == 12
    c.commit(asynchronous=False)
    c.close()
    c2 = Consumer(conf)
    c2.subscribe([topic])
    rest = consume(c2, 18)
    c2.commit(asynchronous=False)
    c2.close()
    seen = sorted(m.value() for m in first + rest)
    assert seen == sorted(v for _, v, _ in rows)  # nothing lost, nothing twice


def test_seek_by_timestamp(gateway):
    topic = f"ck-ts-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic)
    p = Producer({"bootstrap.servers": gateway.bootstrap, "acks": "all"})
    base = 1_700_000_000_000
    for i in range(10):
        p.produce(topic, value=f"v{i}".encode(), partition=0, timestamp=base + i * 1000)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": gateway.bootstrap, "group.id": "ts"})
    found = c.offsets_for_times([TopicPartition(topic, 0, base + 4500)], timeout=15)
    assert found[0].offset == 5
    found = c.offsets_for_times([TopicPartition(topic, 0, base + 99_000)], timeout=15)
    assert found[0].offset == -1  # past the last record: the end (Kafka answers -1)
    c.assign([TopicPartition(topic, 0, 5)])
    msgs = consume(c, 5)
    c.close()
    assert [m.value() for m in msgs] == [f"v{i}".encode() for i in range(5, 10)]
    assert [m.timestamp()[1] for m in msgs] == [base + i * 1000 for i in range(5, 10)]
