"""The executor side of a write: rows in, records produced through the gateways.

Each Spark task has its own producer (confluent-kafka, imported here so the driver never
needs it loaded):

- `write_task` (`df.write`): an idempotent producer (acks=all), so a gateway retry never
  duplicates a record, but a task that Spark runs again writes its rows again:
  at least once.
- `write_micro_batch_task` (`writeStream`): one Kafka transaction per task and micro-batch,
  with the transactional id ``<prefix>-<query id>-<task partition>``. The transaction
  also commits an offset for the group of the same name on partition 0 of the marker
  topic (the `topic` option, or the topic of the task's first row), whose value is the
  batch id plus one. Before writing batch B the task starts its producer, which fences an
  earlier attempt and settles its transaction (commits it if it reached commit, else
  aborts it), then reads that offset: if it already says B the rows were committed once
  and are skipped. A replayed batch must give each task the same rows; Spark replays a
  micro-batch from the same source offsets, so this holds for deterministic queries.

Records are the Kafka sink's: key and value as bytes (strings encoded as UTF-8), headers
as (str, bytes) pairs, partition as given or chosen by key with the Java client's
partitioner (murmur2), so keys land where a Java producer would put them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from itertools import chain
from typing import Iterable, Iterator

from stratalog.spark.sink_options import WriteOptions

# librdkafka settings the sink relies on; the user's kafka.* come on top (but not
# over RESERVED, see sink_options). acks=all is what idempotence requires.
PRODUCER_DEFAULTS = {"acks": "all", "partitioner": "murmur2_random", "linger.ms": "5"}
OPERATION_TIMEOUT_S = 60.0  # each transaction call (init, send offsets, commit, abort)
ERRORS_KEPT = 3


class SinkError(RuntimeError):
    """A row could not be written; the message says which and why."""


@dataclass(frozen=True)
class Record:
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] | None


def _bytes(v) -> bytes | None:
    if v is None or isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)  # bytearray from Spark's row conversion


def _header_pairs(headers) -> list[tuple[str, bytes | None]] | None:
    if not headers:
        return None
    out = []
    for h in headers:
        name, value = (h["key"], h["value"])
        if name is None:
            raise SinkError("a header has a null key; header keys must be strings")
        out.append((name, _bytes(value)))
    return out


def records(batches: Iterable, options: WriteOptions) -> Iterator[Record]:
    """The records of the task's input: Arrow record batches or Spark rows."""
    cols = options.columns
    names = [cols.value, cols.key, cols.topic, cols.partition, cols.headers]
    for batch in batches:
        if hasattr(batch, "num_rows"):  # a pyarrow.RecordBatch
            n = batch.num_rows
            columns = [batch.column(name).to_pylist() if name else [None] * n for name in names]
            rows = zip(*columns)
        else:
            rows = iter([[batch[name] if name else None for name in names]])
        for value, key, topic, partition, headers in rows:
            topic = options.topic or topic
            if not topic:
                raise SinkError("a row has a null topic: give every row a topic or set the topic option")
            yield Record(topic, partition, _bytes(key), _bytes(value), _header_pairs(headers))


class _Deliveries:
    """Counts acknowledged records and keeps the first few failures."""

    def __init__(self) -> None:
        self.acked = 0
        self.errors: list[str] = []

    def __call__(self, err, msg) -> None:
        if err is None:
            self.acked += 1
        elif len(self.errors) < ERRORS_KEPT:
            self.errors.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

    def check(self) -> None:
        if self.errors:
            raise SinkError("records were not written: " + "; ".join(self.errors))


def _produce(producer, rows: Iterable[Record], deliveries: _Deliveries) -> int:
    """Hand every record to the producer and wait for all acknowledgements."""
    sent = 0
    for r in rows:
        if deliveries.errors:
            break  # a failed record fails the task; sending more only adds to undo
        kwargs: dict = {"key": r.key, "value": r.value, "on_delivery": deliveries}
        if r.partition is not None:
            kwargs["partition"] = r.partition
        if r.headers:
            kwargs["headers"] = r.headers
        while True:
            try:
                producer.produce(r.topic, **kwargs)
                break
            except BufferError:  # queue.buffering.max.messages/kbytes: wait for acks
                producer.poll(0.1)
        sent += 1
        producer.poll(0)
    # librdkafka fails each record after message.timeout.ms, so this ends.
    while producer.flush(1.0) > 0:
        pass
    deliveries.check()
    return sent


def _producer(options: WriteOptions, **extra):
    from confluent_kafka import KafkaException, Producer

    try:
        return Producer({**PRODUCER_DEFAULTS, **options.producer, "enable.idempotence": True, **extra})
    except KafkaException as exc:
        raise SinkError(f"the kafka.* options do not make a producer: {exc.args[0].str()}") from None


def check_producer_settings(options: WriteOptions) -> None:
    """Make (and drop) the producer the tasks will make, so a setting librdkafka does not
    know fails on the driver, before any row is written."""
    _producer(options, **{"transactional.id": "stratalog-sink-settings-check"})


@dataclass(frozen=True)
class TaskResult:
    """What one task did (Spark hands these to the driver's commit)."""

    partition: int
    records: int
    skipped: bool = False  # a streaming batch this task had already committed


def write_task(batches: Iterable, options: WriteOptions, partition: int) -> TaskResult:
    """`df.write`: produce every row with an idempotent producer; raises if any fails."""
    rows = records(batches, options)
    first = next(rows, None)
    if first is None:
        return TaskResult(partition, 0)
    return TaskResult(partition, _produce(_producer(options), chain([first], rows), _Deliveries()))


def transactional_id(options: WriteOptions, query_id: str, partition: int) -> str:
    return f"{options.transactional_id_prefix}-{query_id}-{partition}"


def _call(operation, what: str):
    """Run a transaction call, retrying what librdkafka calls retriable."""
    from confluent_kafka import KafkaException

    deadline = time.monotonic() + OPERATION_TIMEOUT_S
    while True:
        try:
            return operation()
        except KafkaException as exc:
            err = exc.args[0]
            if not err.retriable() or time.monotonic() > deadline:
                raise SinkError(f"{what} failed: {err.str()}") from exc
            time.sleep(0.2)


def _last_batch(consumer, marker) -> int | None:
    """The batch id the marker group's offset records, or None if it has none."""
    [committed] = _call(lambda: consumer.committed([marker], timeout=OPERATION_TIMEOUT_S),
                        "reading the last committed batch")
    if committed.error is not None:
        raise SinkError(f"reading the last committed batch failed: {committed.error.str()}")
    return committed.offset - 1 if committed.offset > 0 else None


def write_micro_batch_task(batches: Iterable, options: WriteOptions, query_id: str, batch_id: int,
                           partition: int) -> TaskResult:
    """`writeStream`: write the task's rows of batch `batch_id` in one transaction, unless an
    earlier attempt committed them already (see the module docstring)."""
    from confluent_kafka import Consumer, TopicPartition

    rows = records(batches, options)
    first = next(rows, None)
    if first is None:
        return TaskResult(partition, 0)
    txn_id = transactional_id(options, query_id, partition)
    producer = _producer(options, **{"transactional.id": txn_id})
    _call(lambda: producer.init_transactions(OPERATION_TIMEOUT_S), f"starting transactional producer {txn_id}")
    consumer = Consumer({**options.connection(), "group.id": txn_id, "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        marker = TopicPartition(options.topic or first.topic, 0)
        done = _last_batch(consumer, marker)
        if done is not None and done >= batch_id:
            for _ in rows:  # Spark expects the task to read its input
                pass
            return TaskResult(partition, 0, skipped=True)
        producer.begin_transaction()
        try:
            sent = _produce(producer, chain([first], rows), _Deliveries())
            offset = TopicPartition(marker.topic, 0, batch_id + 1,
                                    metadata=f"stratalog sink: query {query_id} batch {batch_id}")
            _call(lambda: producer.send_offsets_to_transaction([offset], consumer.consumer_group_metadata(),
                                                               OPERATION_TIMEOUT_S),
                  f"recording batch {batch_id} in transaction {txn_id}")
            _call(lambda: producer.commit_transaction(OPERATION_TIMEOUT_S),
                  f"committing batch {batch_id} in transaction {txn_id}")
        except BaseException:
            try:
                producer.abort_transaction(OPERATION_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the next attempt's init aborts it anyway
                pass
            raise
        return TaskResult(partition, sent)
    finally:
        consumer.close()
