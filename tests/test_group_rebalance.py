"""A group of 3 consumers on a 6-partition topic rebalances as members join and leave,
eagerly and cooperatively; with offsets committed nothing is lost or delivered twice."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

PARTITIONS = 6


class Member(threading.Thread):
    """A consumer that processes and commits each record synchronously, so a record counts
    as delivered exactly when its offset is committed."""

    def __init__(self, bootstrap, topic, group, strategy, sink, lock):
        super().__init__(daemon=True)
        self.conf = {"bootstrap.servers": bootstrap, "group.id": group,
                     "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "partition.assignment.strategy": strategy, "session.timeout.ms": 6000,
                     "heartbeat.interval.ms": 500, "max.poll.interval.ms": 20000}
        self.topic = topic
        self.sink = sink
        self.lock = lock
        self.stop_flag = threading.Event()
        self.assignment: set[int] = set()
        self.error: Exception | None = None

    def run(self):
        try:
            c = Consumer(self.conf)

            def on_assign(consumer, parts):
                self.assignment |= {p.partition for p in parts}
                if self.conf["partition.assignment.strategy"] == "cooperative-sticky":
                    consumer.incremental_assign(parts)
                else:
                    consumer.assign(parts)

            def on_revoke(consumer, parts):
                self.assignment -= {p.partition for p in parts}
                if self.conf["partition.assignment.strategy"] == "cooperative-sticky":
                    consumer.incremental_unassign(parts)
                else:
                    consumer.unassign()

            c.subscribe([self.topic], on_assign=on_assign, on_revoke=on_revoke)
            while not self.stop_flag.is_set():
                m = c.poll(0.2)
                if m is None or m.error():
                    continue
                try:
                    c.commit(message=m, asynchronous=False)
                except ck.KafkaException:
                    continue  # lost the partition mid-rebalance: its next owner redelivers it
                with self.lock:
                    self.sink.append((m.partition(), m.offset(), m.value()))
            c.close()
        except Exception as e:  # noqa: BLE001
            self.error = e


@pytest.mark.parametrize("strategy", ["range", "roundrobin", "cooperative-sticky"])
def test_three_members_join_and_leave_without_loss_or_duplicates(gateway, strategy):
    bootstrap = gateway.bootstrap
    topic = f"rebal-{strategy}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    total = 0

    def produce(n):
        nonlocal total
        for _ in range(n):
            producer.produce(topic, value=f"{total:06d}".encode(), partition=total % PARTITIONS)
            total += 1
        assert producer.flush(20) == 0

    sink: list = []
    lock = threading.Lock()
    group = f"g-{topic}"
    members = [Member(bootstrap, topic, group, strategy, sink, lock) for _ in range(3)]
    members[0].start()
    produce(300)
    time.sleep(2)
    members[1].start()
    produce(300)
    time.sleep(2)
    members[2].start()
    produce(300)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        if all(len(m.assignment) == 2 for m in members):
            break
        time.sleep(0.2)
    assert sorted(len(m.assignment) for m in members) == [2, 2, 2], [m.assignment for m in members]
    members[0].stop_flag.set()
    members[0].join(20)
    produce(300)
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        with lock:
            if len({v for _, _, v in sink}) >= total:
                break
        time.sleep(0.2)
    for m in members[1:]:
        m.stop_flag.set()
    for m in members[1:]:
        m.join(20)
    assert not any(m.error for m in members), [m.error for m in members]
    values = [v for _, _, v in sink]
    assert len(set(values)) == total, f"lost {total - len(set(values))} records"
    assert len(values) == total, f"{len(values) - total} records delivered twice"
