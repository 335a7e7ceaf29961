"""`stratalog produce TOPIC`: one record per input line, every delivery confirmed."""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import BinaryIO

from confluent_kafka import KafkaException

from stratalog.infra.cli.common import CliError, key_value, non_negative_int, note, stderr_is_terminal
from stratalog.infra.cli.kafka import Cluster, add_connection_options, reason

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "produce", help="send lines of stdin or a file as records",
        description="Send one record per line (without its newline) of stdin or --file, then wait "
                    "until the broker has confirmed every record. Exits non-zero if any was not delivered.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--file", type=Path, metavar="F", help="read lines from F instead of stdin")
    p.add_argument("--key-separator", metavar="SEP",
                   help="split each line at the first SEP into key and value (every line must contain it)")
    p.add_argument("--header", action="append", type=key_value, default=[], metavar="KEY=VALUE",
                   help="a header added to every record (repeatable)")
    p.add_argument("--partition", type=non_negative_int, metavar="N",
                   help="send every record to partition N (default: by key, or spread)")
    p.add_argument("--acks", choices=("all", "1", "0"), default="all",
                   help="acknowledgement the broker must give (default all)")
    p.add_argument("--compression", choices=COMPRESSIONS, default="none",
                   help="batch compression codec (default none)")
    add_connection_options(p)


class Deliveries:
    """Counts delivery reports and keeps the first failure, with its input line."""

    def __init__(self) -> None:
        self.sent = 0
        self.delivered = 0
        self.failed = 0
        self.first_failure: str | None = None

    def fail(self, line: int, why: str) -> None:
        self.failed += 1
        if self.first_failure is None:
            self.first_failure = f"line {line}: {why}"

    def report(self, line: int, err, _msg) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.fail(line, reason(err))

    @property
    def pending(self) -> int:
        return self.sent - self.delivered - self.failed


def _open_input(path: Path | None) -> tuple[BinaryIO, int | None]:
    if path is None:
        return sys.stdin.buffer, None
    try:
        stream = open(path, "rb")
        size = os.fstat(stream.fileno()).st_size
    except OSError as exc:
        raise CliError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    return stream, size


def run(args: argparse.Namespace) -> int:
    if args.key_separator == "":
        raise CliError("--key-separator must not be empty")
    separator = args.key_separator.encode() if args.key_separator is not None else None
    headers = [(k, v.encode()) for k, v in args.header] or None
    stream, size = _open_input(args.file)
    try:
        return _produce(args, stream, size, separator, headers)
    finally:
        if args.file is not None:
            stream.close()


def _produce(args, stream: BinaryIO, size: int | None, separator: bytes | None, headers) -> int:
    cluster = Cluster.from_args(args)
    producer = cluster.producer({
        "acks": args.acks,
        "compression.type": args.compression,
        # The Java client's partitioner, so a key lands where other Kafka tools put it.
        "partitioner": "murmur2_random",
        # A record the broker has not confirmed within the timeout counts as failed, so
        # a broker that goes away mid-stream ends the command instead of stalling it.
        "message.timeout.ms": cluster.timeout_ms,
    })
    # Asking for this topic alone creates it if the broker auto-creates topics.
    topic = cluster.topic(cluster.metadata(producer, args.topic), args.topic)
    if args.partition is not None and args.partition not in topic.partitions:
        raise CliError(f"topic {args.topic!r} has no partition {args.partition} "
                       f"(it has {len(topic.partitions)})")
    deliveries = Deliveries()
    bar = None
    if size is not None and stderr_is_terminal():
        from tqdm import tqdm

        bar = tqdm(total=size, unit="B", unit_scale=True, desc=args.topic, file=sys.stderr, leave=False)
    extra = {} if args.partition is None else {"partition": args.partition}
    try:
        for number, raw in enumerate(stream, start=1):
            if bar is not None:
                bar.update(len(raw))
            line = raw[:-1] if raw.endswith(b"\n") else raw
            key = None
            if separator is not None:
                key, found, value = line.partition(separator)
                if not found:
                    raise CliError(f"line {number} has no key separator {args.key_separator!r}; "
                                   f"nothing after line {number - 1} was sent"
                                   + _outcome(producer, cluster, deliveries))
            else:
                value = line
            _send(producer, deliveries, number, args.topic, key, value, headers, extra)
        unconfirmed = producer.flush(cluster.timeout + 5)
    except KeyboardInterrupt:
        note("interrupted" + _outcome(producer, cluster, deliveries, wait=min(cluster.timeout, 5)))
        raise
    finally:
        if bar is not None:
            bar.close()
    if deliveries.failed or unconfirmed:
        lost = deliveries.failed + unconfirmed
        detail = deliveries.first_failure or "no confirmation in time"
        raise CliError(f"{lost} of {deliveries.sent} records were not delivered to {args.topic!r} ({detail})")
    return 0


def _send(producer, deliveries: Deliveries, number: int, topic: str, key, value, headers, extra) -> None:
    callback = functools.partial(deliveries.report, number)
    while True:
        try:
            producer.produce(topic, value=value, key=key, headers=headers, on_delivery=callback, **extra)
        except BufferError:
            # The local queue is full: let deliveries drain it, then try again.
            producer.poll(0.1)
            continue
        except KafkaException as exc:
            # Rejected before sending (e.g. larger than message.max.bytes).
            deliveries.sent += 1
            deliveries.fail(number, reason(exc))
            return
        deliveries.sent += 1
        producer.poll(0)
        return


def _outcome(producer, cluster: Cluster, deliveries: Deliveries, wait: float | None = None) -> str:
    """Waits for what is in flight and says how it ended, as a clause for an error line."""
    producer.flush(cluster.timeout + 5 if wait is None else wait)
    text = f" ({deliveries.delivered} records delivered"
    if deliveries.failed:
        text += f", {deliveries.failed} failed"
    if deliveries.pending:
        text += f", {deliveries.pending} unconfirmed"
    return text + ")"
