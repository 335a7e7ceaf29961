"""The row shape of a read, the one Spark's Kafka source uses, in Spark and Arrow terms.

    key            binary       null for a keyless record
    value          binary       null for a tombstone
    topic          string
    partition      int
    offset         long
    timestamp      timestamp    record time (ms precision), UTC
    timestampType  int          0 CreateTime, 1 LogAppendTime
    headers        array<struct<key: string, value: binary>>, null for a record without
                   headers (as Spark's Kafka source gives them); absent with
                   includeHeaders=false

Every field is nullable, as Spark's conversion to Arrow expects; the Arrow schema here must
equal what pyspark derives from the Spark one, or Spark rejects the batches.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (ArrayType, BinaryType, IntegerType, LongType, StringType, StructField,
                               StructType, TimestampType)

SPARK_SCHEMA = StructType([
    StructField("key", BinaryType()),
    StructField("value", BinaryType()),
    StructField("topic", StringType()),
    StructField("partition", IntegerType()),
    StructField("offset", LongType()),
    StructField("timestamp", TimestampType()),
    StructField("timestampType", IntegerType()),
    StructField("headers", ArrayType(StructType([
        StructField("key", StringType()),
        StructField("value", BinaryType()),
    ]))),
])

HEADER_TYPE = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
HEADERS_TYPE = pa.list_(pa.field("element", HEADER_TYPE))
TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
HEADERS = "headers"
ARROW_SCHEMA = pa.schema([
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", TIMESTAMP_TYPE),
    pa.field("timestampType", pa.int32()),
    pa.field("headers", HEADERS_TYPE),
])


SPARK_SCHEMA_WITHOUT_HEADERS = StructType([f for f in SPARK_SCHEMA.fields if f.name != HEADERS])


def spark_schema(include_headers: bool) -> StructType:
    return SPARK_SCHEMA if include_headers else SPARK_SCHEMA_WITHOUT_HEADERS


def headers_column(list_offsets, pairs: pa.StructArray) -> pa.ListArray:
    """The headers column: record i's headers are `pairs[list_offsets[i]:list_offsets[i + 1]]`
    (one more offset than records); null for a record with none, as Spark's Kafka source
    gives it."""
    starts = np.asarray(list_offsets, dtype=np.int32)
    empty = starts[1:] == starts[:-1]
    return pa.ListArray.from_arrays(pa.array(starts), pairs, type=HEADERS_TYPE,
                                    mask=pa.array(empty) if empty.any() else None)


def without_headers(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches of a read with includeHeaders=false: the column is left out before
    the hand-over to the JVM."""
    for batch in batches:
        yield batch.drop_columns([HEADERS])


class ArrowColumns:
    """Accumulates records of one partition and hands them out as Arrow record batches."""

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self._reset()

    def _reset(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.types: list[int] = []
        self.header_starts: list[int] = [0]
        self.header_keys: list[str] = []
        self.header_values: list = []

    @property
    def rows(self) -> int:
        return len(self.offsets)

    def add(self, key, value, offset: int, timestamp_ms: int, timestamp_type: int, headers) -> None:
        self.keys.append(key)
        self.values.append(value)
        self.offsets.append(offset)
        self.timestamps.append(timestamp_ms)
        self.types.append(timestamp_type)
        for k, v in headers:
            self.header_keys.append(k)
            self.header_values.append(v)
        self.header_starts.append(len(self.header_keys))

    def extend(self, records, timestamp_type: int) -> None:
        """Add decoded records (`tiering.batch.Record`) that all pass the read's bounds."""
        self.keys += [r.key for r in records]
        self.values += [r.value for r in records]
        self.offsets += [r.offset for r in records]
        self.timestamps += [r.timestamp for r in records]
        self.types += [timestamp_type] * len(records)
        starts, names, values = self.header_starts, self.header_keys, self.header_values
        for r in records:
            for k, v in r.headers:
                names.append(k)
                values.append(v)
            starts.append(len(names))

    def flush(self):
        """Yield the accumulated rows as one batch (nothing if empty), then start over."""
        n = self.rows
        if not n:
            return
        headers = headers_column(self.header_starts, pa.StructArray.from_arrays(
            [pa.array(self.header_keys, pa.string()), pa.array(self.header_values, pa.binary())],
            fields=list(HEADER_TYPE)))
        millis = pa.array(self.timestamps, pa.int64())
        batch = pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            pc.multiply_checked(millis, 1000).cast(TIMESTAMP_TYPE),
            pa.array(self.types, pa.int32()),
            headers,
        ], schema=ARROW_SCHEMA)
        self._reset()
        yield batch
