"""`stratalog consume TOPIC`: print records, one per line, from a chosen position."""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_STORED,
    TIMESTAMP_NOT_AVAILABLE,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from stratalog.infra.cli import EXIT_INTERRUPTED
from stratalog.infra.cli.common import CliError, non_negative_int, positive_float, positive_int
from stratalog.infra.cli.kafka import DEFAULT_TIMEOUT, Cluster, add_connection_options, reason

# Errors after which waiting longer cannot help; anything else librdkafka reports while
# consuming (a dropped connection, a leader moving) it also retries by itself.
_STOP = {
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._UNKNOWN_PARTITION,
    KafkaError.TOPIC_AUTHORIZATION_FAILED,
    KafkaError.GROUP_AUTHORIZATION_FAILED,
    KafkaError.INVALID_GROUP_ID,
    KafkaError._AUTO_OFFSET_RESET,
    KafkaError.OFFSET_OUT_OF_RANGE,
    KafkaError._AUTHENTICATION,
    KafkaError.SASL_AUTHENTICATION_FAILED,
    KafkaError._SSL,
}
# Poll in short slices so Ctrl-C is noticed promptly.
_POLL_SLICE = 0.2
# How long the consumer may take to close (commit, leave its group): librdkafka's close can
# hang (confluentinc/confluent-kafka-python#1573), and Ctrl-C must still end the command.
CLOSE_TIMEOUT_S = 10.0
ISOLATION_LEVELS = ("read_uncommitted", "read_committed")
DEFAULT_ISOLATION_LEVEL = "read_uncommitted"


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "consume", help="print records of a topic",
        description="Print each record's value (and optionally key, headers, partition, offset, "
                    "timestamp) on one line. Without --group, partitions are assigned directly and "
                    "nothing is committed; with --group, the consumer joins the group (or, with "
                    "--partition, consumes that partition on the group's behalf) and commits.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--group", metavar="G", help="consumer group to join and commit offsets for")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from-beginning", action="store_true",
                       help="start at the earliest offset (with --group: where no offset is committed)")
    start.add_argument("--offset", type=non_negative_int, metavar="N",
                       help="start at offset N (out of range: an error with --partition, else that "
                            "partition's end)")
    start.add_argument("--timestamp", type=non_negative_int, metavar="MS",
                       help="start at the first record with a timestamp at or after MS (epoch millis)")
    p.add_argument("--partition", type=non_negative_int, metavar="N", help="only partition N")
    p.add_argument("--max-messages", type=positive_int, metavar="N", help="stop after N records")
    p.add_argument("--timeout", type=positive_float, metavar="S",
                   help="stop after S seconds without a record (default: keep waiting); "
                        f"also bounds the wait for the broker (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--print-key", action="store_true", help="print KEY<separator>VALUE")
    p.add_argument("--print-headers", action="store_true", help="print headers:K=V,K=V before the record")
    p.add_argument("--print-offset", action="store_true", help="print partition:P and offset:O before the record")
    p.add_argument("--print-timestamp", action="store_true", help="print timestamp:MS before the record")
    p.add_argument("--key-separator", default="\t", metavar="SEP",
                   help="between key and value with --print-key (default: a tab)")
    p.add_argument("--isolation-level", choices=ISOLATION_LEVELS, metavar="LEVEL",
                   help="read_committed: only records of committed transactions, up to the last "
                        "stable offset; read_uncommitted: every record, aborted ones included "
                        "(default read_uncommitted, as kafka-console-consumer; librdkafka's own "
                        "default is read_committed)")
    add_connection_options(p, timeout=False)


def format_record(msg, args) -> bytes:
    """One output line (without newline): tab-separated metadata fields, then the record."""
    fields: list[bytes] = []
    if args.print_offset:
        fields.append(b"partition:%d" % msg.partition())
        fields.append(b"offset:%d" % msg.offset())
    if args.print_timestamp:
        kind, ts = msg.timestamp()
        fields.append(b"timestamp:none" if kind == TIMESTAMP_NOT_AVAILABLE else b"timestamp:%d" % ts)
    if args.print_headers:
        pairs = [k.encode() + b"=" + (b"" if v is None else v) for k, v in (msg.headers() or [])]
        fields.append(b"headers:" + b",".join(pairs))
    value = _bytes_or_null(msg.value())
    if args.print_key:
        value = _bytes_or_null(msg.key()) + args.key_separator.encode() + value
    fields.append(value)
    return b"\t".join(fields)


def _bytes_or_null(data: bytes | str | None) -> bytes:
    if data is None:
        return b"null"
    return data.encode() if isinstance(data, str) else data


class Session:
    """One consume run: its consumer, where it starts, and when it stops."""

    def __init__(self, args: argparse.Namespace, cluster: Cluster, consumer) -> None:
        self.args = args
        self.cluster = cluster
        self.consumer = consumer
        self.count = 0
        self.deadline = None if args.timeout is None else time.monotonic() + args.timeout

    def positions(self, partitions: list[int]) -> list[TopicPartition]:
        topic, args = self.args.topic, self.args
        if args.offset is not None:
            return [TopicPartition(topic, p, args.offset) for p in partitions]
        if args.timestamp is not None:
            return self._positions_at(partitions, args.timestamp)
        if args.group is not None:
            # The committed offset, or auto.offset.reset where there is none.
            return [TopicPartition(topic, p, OFFSET_STORED) for p in partitions]
        start = OFFSET_BEGINNING if args.from_beginning else OFFSET_END
        return [TopicPartition(topic, p, start) for p in partitions]

    def _positions_at(self, partitions: list[int], timestamp: int) -> list[TopicPartition]:
        query = [TopicPartition(self.args.topic, p, timestamp) for p in partitions]
        try:
            found = self.consumer.offsets_for_times(query, timeout=self.cluster.timeout)
        except KafkaException as exc:
            raise CliError(f"cannot look up offsets for timestamp {timestamp}: {reason(exc)}") from None
        out = []
        for tp in found:
            if tp.error is not None:
                raise CliError(f"cannot look up offsets for timestamp {timestamp} in partition "
                               f"{tp.partition}: {reason(tp.error)}")
            # -1: no record at or after the timestamp, so start at the end.
            out.append(TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END))
        return out

    def on_assign(self, consumer, assigned: list[TopicPartition]) -> None:
        if self.args.offset is not None or self.args.timestamp is not None:
            consumer.assign(self.positions([tp.partition for tp in assigned]))
        if self.deadline is not None:
            # Joining the group took time that was not spent waiting for records.
            self.deadline = time.monotonic() + self.args.timeout

    def loop(self) -> None:
        out = sys.stdout.buffer
        interactive = sys.stdout.isatty()
        limit = self.args.max_messages
        while limit is None or self.count < limit:
            wait = _POLL_SLICE
            if self.deadline is not None:
                left = self.deadline - time.monotonic()
                if left <= 0:
                    break
                wait = min(wait, left)
            msg = self.consumer.poll(wait)
            if msg is None:
                out.flush()
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._AUTO_OFFSET_RESET:
                    raise CliError(f"offset {self.args.offset} is out of range in partition "
                                   f"{msg.partition()} of {self.args.topic!r}")
                if err.fatal() or err.code() in _STOP:
                    raise CliError(f"cannot consume {self.args.topic!r}: {reason(err)}")
                continue
            out.write(format_record(msg, self.args) + b"\n")
            if interactive:
                out.flush()
            self.count += 1
            if self.deadline is not None:
                self.deadline = time.monotonic() + self.args.timeout
        out.flush()

    def commit(self) -> None:
        if self.args.group is None or self.count == 0:
            return
        try:
            self.consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                raise CliError(f"cannot commit offsets for group {self.args.group!r}: {reason(exc)}") from None


def _reset_policy(args: argparse.Namespace) -> str:
    if args.offset is not None and args.partition is not None:
        # An explicit position outside the log is the user's mistake: report it rather
        # than silently starting somewhere else. Across all partitions one offset rarely
        # fits every log, so there a partition it does not fit starts at its end.
        return "error"
    return "earliest" if args.from_beginning else "latest"


def _isolation_level(args: argparse.Namespace, cluster: Cluster) -> str:
    """--isolation-level, else isolation.level from --command-config, else the default."""
    configured = cluster.properties.get("isolation.level")
    if args.isolation_level is None:
        return configured or DEFAULT_ISOLATION_LEVEL
    if configured is not None and configured != args.isolation_level:
        raise CliError(f"--isolation-level {args.isolation_level} contradicts --command-config "
                       f"isolation.level={configured}")
    return args.isolation_level


def run(args: argparse.Namespace) -> int:
    if args.key_separator == "":
        raise CliError("--key-separator must not be empty")
    cluster = Cluster.from_args(args, timeout=args.timeout or DEFAULT_TIMEOUT)
    grouped = args.group is not None
    if grouped and not args.group.strip():
        raise CliError("--group must not be empty")
    consumer = cluster.consumer({
        # librdkafka wants a group id even for assigned partitions; without --group it is
        # a throwaway that never joins or commits.
        "group.id": args.group if grouped else f"stratalog-cli-{uuid.uuid4().hex}",
        "enable.auto.commit": grouped,
        "auto.offset.reset": _reset_policy(args),
        "enable.partition.eof": False,
        "isolation.level": _isolation_level(args, cluster),
    })
    session = Session(args, cluster, consumer)
    try:
        topic = cluster.topic(cluster.metadata(consumer), args.topic)
        if args.partition is not None and args.partition not in topic.partitions:
            raise CliError(f"topic {args.topic!r} has no partition {args.partition} "
                           f"(it has {len(topic.partitions)})")
        if grouped and args.partition is None:
            consumer.subscribe([args.topic], on_assign=session.on_assign)
        else:
            partitions = [args.partition] if args.partition is not None else sorted(topic.partitions)
            consumer.assign(session.positions(partitions))
        try:
            session.loop()
        finally:
            session.commit()
    finally:
        _close(consumer)
    return 0


def _close(consumer) -> None:
    """Close the consumer on a thread of its own; past CLOSE_TIMEOUT_S, leave it there and
    end the process at once (its finalizer would only try again) with the status the
    command was ending with."""
    closed = threading.Event()
    failed: list[BaseException] = []

    def close() -> None:
        try:
            consumer.close()
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread
            failed.append(exc)
        finally:
            closed.set()

    threading.Thread(target=close, name="consumer-close", daemon=True).start()
    if closed.wait(CLOSE_TIMEOUT_S):
        if failed:
            raise failed[0]
        return
    ending = sys.exc_info()[1]
    status = EXIT_INTERRUPTED if isinstance(ending, KeyboardInterrupt) else (0 if ending is None else 1)
    sys.stdout.flush()
    print(f"stratalog: the consumer did not close within {CLOSE_TIMEOUT_S:g}s; exiting without it",
          file=sys.stderr, flush=True)
    os._exit(status)
