"""kafka-python transactions against a real `stratalog serve`: commit, abort, commit, then
read both partitions with read_committed and read_uncommitted."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("kafka", reason="kafka-python is not installed")
from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from .test_kafka_python import consume, create_topic  # noqa: E402

from .txn_scenario import TRANSACTIONS, sent  # noqa: E402


def read(bootstrap: str, topic: str, isolation_level: str, n: int) -> dict[int, list]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             isolation_level=isolation_level)
    tps = [TopicPartition(topic, p) for p in (0, 1)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    msgs = consume(consumer, n)
    msgs += consume(consumer, 1, timeout=0.5)  # anything extra would show up here
    consumer.close()
    return {p: [m for m in msgs if m.partition == p] for p in (0, 1)}


def test_commit_abort_commit(gateway):
    topic = f"kp-txn-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic, partitions=2)
    producer = KafkaProducer(bootstrap_servers=gateway.bootstrap, transactional_id=f"t-{topic}")
    producer.init_transactions()
    for prefix, n, commit in TRANSACTIONS:
        producer.begin_transaction()
        futures = [producer.send(topic, value=f"{prefix}-{i}".encode(), partition=i % 2)
                   for i in range(n)]
        producer.flush(30)  # the aborted records too reach the log, for read_uncommitted
        assert all(f.get(timeout=30).offset >= 0 for f in futures)
        if commit:
            producer.commit_transaction()
        else:
            producer.abort_transaction()
    producer.close(timeout=10)

    for level, committed_only in (("read_committed", True), ("read_uncommitted", False)):
        expected = sent(committed_only)
        got = read(gateway.bootstrap, topic, level, sum(map(len, expected.values())))
        assert {p: [m.value for m in msgs] for p, msgs in got.items()} == expected, level
        for msgs in got.values():
            offsets = [m.offset for m in msgs]
            assert offsets == sorted(set(offsets)), level
