"""A consume-transform-produce application, run by tests/test_transactions.py as a child
process: `python txn_pipeline.py BOOTSTRAP SOURCE SINK GROUP TOTAL TRANSACTIONAL_ID`.

It copies SOURCE (2 partitions) to SINK upper-cased, partition for partition, in
transactions of up to 10 records that also commit the group's offsets
(send_offsets_to_transaction), recovering from gateway crashes as an application must:
abort and rewind to the committed offsets on abortable errors, start over with new
clients on fatal ones. It prints "commit" after each committed transaction and "done"
once the group's committed offsets reach TOTAL.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

PARTITIONS = 2


def clients(bootstrap: str, source: str, group: str, tid: str):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed", "session.timeout.ms": 6000})
    consumer.subscribe([source])
    while True:
        try:
            producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid,
                                 "transaction.timeout.ms": 20000})
            producer.init_transactions(20)
            return consumer, producer
        except KafkaException:
            time.sleep(0.5)


def commit(producer: Producer) -> None:
    while True:
        try:
            producer.commit_transaction(20)
            return
        except KafkaException as e:
            if not e.args[0].retriable():
                raise


def abort(producer: Producer) -> None:
    for _ in range(20):
        try:
            producer.abort_transaction(20)
            return
        except KafkaException as e:
            if e.args[0].fatal():
                return
            time.sleep(0.5)


def rewind(consumer: Consumer) -> None:
    assignment = consumer.assignment()
    if assignment:
        try:
            for tp in consumer.committed(assignment, 20):
                consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
        except KafkaException:
            pass


def caught_up(consumer: Consumer, source: str, total: int) -> bool:
    try:
        committed = consumer.committed([TopicPartition(source, p) for p in range(PARTITIONS)], 10)
    except KafkaException:
        return False
    return sum(max(tp.offset, 0) for tp in committed) >= total


def main(bootstrap: str, source: str, sink: str, group: str, total: str, tid: str) -> None:
    consumer, producer = clients(bootstrap, source, group, tid)
    while True:
        msgs = [m for m in consumer.consume(10, 1.0) if not m.error()]
        if not msgs:
            if caught_up(consumer, source, int(total)):
                print("done", flush=True)
                return
            continue
        try:
            producer.begin_transaction()
            for m in msgs:
                producer.produce(sink, value=m.value().upper(), key=m.key(), partition=m.partition())
            positions = consumer.position(consumer.assignment())
            producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), 20)
            commit(producer)
            print("commit", flush=True)
        except KafkaException as e:
            if e.args[0].fatal():
                consumer.close()
                consumer, producer = clients(bootstrap, source, group, tid)
                continue
            abort(producer)
            rewind(consumer)


if __name__ == "__main__":
    main(*sys.argv[1:])
