"""Writer options and the input schema of a write, checked on the driver before any task runs.

Names and rules follow Spark's Kafka sink:

    kafka.bootstrap.servers   required: gateways to produce through (host:port,...)
    kafka.*                   passed to the producer without the prefix (security.protocol,
                              sasl.*, ssl.*, linger.ms, compression.type, acks, ...)
    topic                     the topic of every row; overrides a `topic` column
    transactionalIdPrefix     streaming only: prefix of the per-task transactional ids

Columns of the written DataFrame (others are ignored, as the Kafka sink does):

    value      string or binary, required (null writes a tombstone)
    key        string or binary, optional
    topic      string, required unless the `topic` option is set
    partition  int, optional: the partition to write to (null or absent: by key)
    headers    array<struct<key: string, value: binary>>, optional
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from pyspark.sql.types import (ArrayType, BinaryType, DataType, IntegerType, StringType, StructField,
                               StructType)

from stratalog.spark.options import OptionError, _Lower

# The sink sets these itself; a user value would break idempotence or exactly-once.
RESERVED = ("transactional.id", "enable.idempotence", "key.serializer", "value.serializer")
# What the marker consumer of a streaming task needs to reach the gateways: the
# connection and security settings, not the producer's tuning.
CONNECTION_PREFIXES = ("bootstrap.", "security.", "sasl.", "ssl.", "socket.", "broker.", "client.",
                       "enable.ssl.", "reconnect.", "connections.")
DEFAULT_PREFIX = "stratalog-sink"


@dataclass(frozen=True)
class Columns:
    """Where each Kafka field comes from in the written rows (None: absent)."""

    value: str
    key: str | None
    topic: str | None
    partition: str | None
    headers: str | None


@dataclass(frozen=True)
class WriteOptions:
    producer: dict[str, str]  # librdkafka settings, bootstrap.servers included
    topic: str | None
    columns: Columns
    transactional_id_prefix: str = DEFAULT_PREFIX

    def connection(self) -> dict[str, str]:
        """The producer settings a consumer of the same gateways needs."""
        return {k: v for k, v in self.producer.items() if k.startswith(CONNECTION_PREFIXES)}


HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def _find(schema: StructType, name: str) -> StructField | None:
    for f in schema.fields:
        if f.name.lower() == name:
            return f
    return None


def _same_headers(t: DataType) -> bool:
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    fields = [(f.name.lower(), type(f.dataType)) for f in t.elementType.fields]
    return fields == [("key", StringType), ("value", BinaryType)]


def check_columns(schema: StructType, topic_option: str | None) -> Columns:
    """The columns to write; OptionError says which column is missing or mistyped."""
    value = _find(schema, "value")
    if value is None:
        raise OptionError("the written DataFrame needs a 'value' column (string or binary); "
                          f"it has {', '.join(schema.fieldNames()) or 'no columns'}")
    key, topic, partition, headers = (_find(schema, n) for n in ("key", "topic", "partition", "headers"))
    for f in (value, key):
        if f is not None and not isinstance(f.dataType, (StringType, BinaryType)):
            raise OptionError(f"column '{f.name}' must be string or binary, not {f.dataType.simpleString()}")
    if topic is not None and not isinstance(topic.dataType, StringType):
        raise OptionError(f"column 'topic' must be a string, not {topic.dataType.simpleString()}")
    if topic is None and not topic_option:
        raise OptionError("no topic: set .option(\"topic\", \"<name>\") or write a 'topic' column")
    if partition is not None and not isinstance(partition.dataType, IntegerType):
        raise OptionError(f"column 'partition' must be an int, not {partition.dataType.simpleString()}")
    if headers is not None and not _same_headers(headers.dataType):
        raise OptionError(f"column 'headers' must be {HEADERS.simpleString()}, "
                          f"not {headers.dataType.simpleString()}")
    return Columns(value=value.name, key=key.name if key else None,
                   topic=topic.name if topic and not topic_option else None,
                   partition=partition.name if partition else None, headers=headers.name if headers else None)


def parse_write_options(options: Mapping[str, str], schema: StructType) -> WriteOptions:
    """Check a write's options and columns; OptionError names the bad one.

    Examples
    --------
    >>> from pyspark.sql.types import StructType, StructField, BinaryType
    >>> opts = parse_write_options({"kafka.bootstrap.servers": "127.0.0.1:9092", "topic": "t"},
    ...                            StructType([StructField("value", BinaryType())]))
    >>> opts.topic, opts.producer["bootstrap.servers"]
    ('t', '127.0.0.1:9092')
    """
    options = _Lower(options)
    producer = {k[len("kafka."):]: str(v) for k, v in options.items() if k.startswith("kafka.")}
    if not producer.get("bootstrap.servers"):
        raise OptionError('option kafka.bootstrap.servers is required: .option("kafka.bootstrap.servers", '
                          '"host:9092")')
    for name in RESERVED:
        if name in producer:
            raise OptionError(f"option kafka.{name} is set by the sink (idempotent producer per task; "
                              "transactions per micro-batch) and cannot be given")
    topic = options.get("topic") or None
    prefix = str(options.get("transactionalIdPrefix") or DEFAULT_PREFIX)
    return WriteOptions(producer=producer, topic=topic, columns=check_columns(schema, topic),
                        transactional_id_prefix=prefix)
