"""The executor side of a read: one `SegmentSlice` in, Arrow record batches out.

The slice's `.log` object is read through tiering's one sealed-segment reader
(`stratalog.tiering.sealed`) with ranged GETs of `chunk_bytes`: the sidecars move the start
forward (the `.index` to the batch holding the first wanted offset, the `.timeindex` past
batches older than a timestamp lower bound), and batch headers let whole batches be
skipped without fetching or decoding them (offsets out of range, control batches, batches
wholly before a startingTimestamp position, and for read_committed the batches of aborted transactions:
a producer has one transaction at a time, so its transactional batches between an aborted
transaction's first offset and its abort marker are that transaction's). Every decoded batch has its CRC checked; a torn or corrupt
object raises `CorruptSegment`, never yields garbage.

A timestamp lower bound (startingTimestamp) is a position, as Kafka's offsetsForTimes
gives it: the read starts at the first record at or after it, and every later record
counts whatever its time (`Seek`).
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stratalog.tiering import layout
from stratalog.tiering.batch import LOG_APPEND_TIME, BatchHeader, CorruptBatch, decode_records
from stratalog.tiering.sealed import Batch, CorruptSegment, Get, SegmentObject, Take, read_sync, walk

from stratalog.spark.objects import ObjectNotFound, StoreSpec
from stratalog.spark.planning import DataLoss, SegmentSlice, WalSlice
from stratalog.spark.columns import BatchColumns, Decoded, NotVectorisable
from stratalog.spark.schema import ARROW_SCHEMA, TIMESTAMP_TYPE, ArrowColumns, without_headers

__all__ = ["CorruptSegment", "read_input", "read_rows", "read_slice"]

# Rows (or decompressed bytes) decoded together and handed to Spark as one Arrow batch.
ROWS_PER_BATCH = 8192
BYTES_PER_BATCH = 16 << 20


def _gone(s: SegmentSlice, key: str) -> DataLoss:
    return DataLoss(f"{s.topic}-{s.partition}: segment object {key} is gone (retention "
                    "or a compaction swap removed it after the query was planned); run the query "
                    "again, or set failOnDataLoss=false to skip missing segments")


class Seek:
    """A slice's startingTimestamp while it is read, until the first record at or after it.

    The walk runs ahead of decoding, so the position is found in two steps: the batch
    filter skips batches wholly older than it up to the one holding it (`batches`), and the
    selection drops that batch's records before it (`rows`). After it nothing is dropped
    for its time. A batch holding it that is skipped anyway (an aborted transaction's,
    read_committed) passes the position too. One `Seek` may span the slices of one read
    (a collected WAL range re-read from its segments)."""

    __slots__ = ("batches", "rows")

    def __init__(self, ts: int | None) -> None:
        self.batches = self.rows = ts


class _Missing(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def read_rows(partition, options) -> Iterator:
    """The Arrow record batches a read hands Spark for one input partition: `read_input`'s,
    without the headers column when the read's options leave it out."""
    batches = read_input(partition, options.store)
    return batches if options.include_headers else without_headers(batches)


def read_input(partition, spec: StoreSpec, store=None) -> Iterator:
    """Arrow record batches of one planned input partition, segment or WAL range."""
    if isinstance(partition, SegmentSlice):
        return read_slice(partition, spec, store)
    if isinstance(partition, WalSlice):
        from stratalog.spark.walread import read_wal_slice

        return read_wal_slice(partition, spec, store)
    return iter(())  # Spark's stand-in partition when nothing matched


def getter(store):
    """A `Get` driver over a blocking store; a missing object raises `_Missing`."""
    def get(g: Get) -> bytes:
        try:
            return store.get(g.key) if g.start is None else store.get(g.key, g.start, g.end)
        except ObjectNotFound:
            raise _Missing(g.key) from None
    return get


def read_slice(s: SegmentSlice, spec: StoreSpec, store=None, seek: Seek | None = None) -> Iterator:
    """Arrow record batches (the Kafka-source schema) of one slice (`seek`: the read's
    position still to be reached, when it spans slices; else the slice's own)."""
    store = store or spec.open()
    seek = seek or Seek(s.seek_ts)
    try:
        yield from records_of(s, read_sync(_walk(s, seek), getter(store)), s.key_base + layout.LOG, seek)
    except _Missing as missing:
        if s.fail_on_data_loss:
            raise _gone(s, missing.key) from None


def batch_filter(s: SegmentSlice | WalSlice, seek: Seek):
    """The walk's `take` for a slice: which batches to fetch, skip, or stop before."""
    start_offset, end_offset, aborted = s.start_offset, s.end_offset, s.aborted

    def take(h: BatchHeader) -> Take:
        if h.base_offset >= end_offset:
            return Take.STOP
        if h.last_offset < start_offset or h.is_control:
            return Take.SKIP
        if seek.batches is not None and h.max_timestamp < seek.batches:
            return Take.SKIP  # wholly before the position
        dropped = bool(aborted) and h.is_transactional and any(
            pid == h.producer_id and first <= h.base_offset <= marker for pid, first, marker in aborted)
        if seek.batches is not None:  # the batch holding the position
            seek.batches = None
            if dropped:
                seek.rows = None
        return Take.SKIP if dropped else Take.TAKE  # an aborted transaction's batch (read_committed)

    return take


def _walk(s: SegmentSlice, seek: Seek):
    seg = SegmentObject(s.key_base, s.base_offset, s.last_offset, s.size)
    seek_ts, take = seek.batches, batch_filter(s, seek)
    if s.byte_end is not None:  # planned byte ranges already start where they should
        return walk(seg, take, position=s.byte_start, end=s.byte_end, chunk_bytes=s.chunk_bytes)
    return walk(seg, take, position=s.byte_start, chunk_bytes=s.chunk_bytes,
                seek_offset=s.start_offset,
                seek_ts=seek_ts if seek_ts is not None and seek_ts > s.min_timestamp else None)


def records_of(s: SegmentSlice | WalSlice, batches: Iterator[Batch], key: str, seek: Seek) -> Iterator:
    """Arrow record batches of the slice's records in `batches` (read from object `key`,
    walked with `seek`), each batch's CRC checked as it is decoded.

    Batches are decoded column-wise (`spark.columns`) in groups of about ROWS_PER_BATCH
    records; the offset and timestamp bounds then select rows with NumPy.
    """
    select = _Selection(s, seek)
    pending = BatchColumns()
    held: list[Batch] = []  # the batches in `pending`, for the reference decoder
    for batch in batches:
        h = batch.header
        if not pending.continues(batch.data):  # the next read buffer: decode what lies in the last
            yield from select.rows(_decoded(pending, held, key))
            if select.stopped:
                return
            pending.clear()
            held = []
        try:
            pending.add(h, batch.data)
        except (CorruptBatch, NotVectorisable):
            yield from select.rows(_decoded(pending, held, key))
            if select.stopped:
                return
            pending.clear()
            held = []
            yield from select.rows(_reference([batch], key))
            if select.stopped:
                return
            continue
        held.append(batch)
        # A batch that may hold the stop timestamp is decoded at once, so the read stops
        # where it did when every batch was decoded as it came.
        reaches_stop = select.stop_ts is not None and h.max_timestamp >= select.stop_ts
        if pending.rows >= ROWS_PER_BATCH or pending.nbytes >= BYTES_PER_BATCH or reaches_stop:
            yield from select.rows(_decoded(pending, held, key))
            if select.stopped:
                return
            pending.clear()
            held = []
    yield from select.rows(_decoded(pending, held, key))


def _decoded(pending: BatchColumns, held: list[Batch], key: str) -> Decoded | None:
    if not pending.rows:
        return None
    try:
        return pending.decode()
    except NotVectorisable:
        return _reference(held, key)


def _reference(batches: list[Batch], key: str) -> Decoded | None:
    """The batches read by `tiering.batch.decode_records`, which names what is wrong."""
    out = ArrowColumns("", 0)
    for batch in batches:
        h = batch.header
        try:
            records = decode_records(batch.data)
        except CorruptBatch as exc:
            raise CorruptSegment(f"{key} batch at byte {batch.position} "
                                 f"(offset {h.base_offset}): {exc}", key=key,
                                 position=batch.position, offset=h.base_offset) from exc
        out.extend(records, 1 if h.timestamp_type == LOG_APPEND_TIME else 0)
    if not out.rows:
        return None
    rows = next(out.flush())
    micros = rows.column("timestamp").cast(pa.int64()).to_numpy()
    return Decoded(rows.column("offset").to_numpy(), micros // 1000, rows.column("timestampType").to_numpy(),
                   rows.column("key"), rows.column("value"), rows.column("headers"))


class _Selection:
    """The slice's bounds applied to decoded rows, in log order: offsets in
    [start_offset, end_offset); with a position still to reach (`Seek`), rows from the
    first of them at or after it (every later row counts whatever its time); with a stop
    timestamp, rows before the first at or after it, where the read ends (`stopped`)."""

    def __init__(self, s: SegmentSlice | WalSlice, seek: Seek) -> None:
        self.topic, self.partition = s.topic, s.partition
        self.start_offset, self.end_offset = s.start_offset, s.end_offset
        self.seek, self.stop_ts = seek, s.stop_ts
        self.stopped = False

    def rows(self, d: Decoded | None) -> Iterator:
        if d is None or not len(d):
            return
        wanted = (d.offsets >= self.start_offset) & (d.offsets < self.end_offset)
        lo, hi = 0, len(d)
        if self.seek.rows is not None:
            reached = np.flatnonzero(wanted & (d.timestamps >= self.seek.rows))
            if not len(reached):
                return
            lo, self.seek.rows = int(reached[0]), None
        if self.stop_ts is not None:
            past = np.flatnonzero(d.timestamps[lo:] >= self.stop_ts)
            if len(past):
                hi, self.stopped = lo + int(past[0]), True
        wanted[:lo] = False
        wanted[hi:] = False
        if not wanted.any():
            return
        yield self.batch(d, None if wanted.all() else pa.array(np.flatnonzero(wanted)))

    def batch(self, d: Decoded, rows) -> pa.RecordBatch:
        columns = [d.keys, d.values, d.offsets, d.timestamps, d.timestamp_types, d.headers]
        if rows is not None:
            columns = [c.take(rows) if isinstance(c, pa.Array) else c[rows.to_numpy()] for c in columns]
        keys, values, offsets, millis, types, headers = columns
        n = len(offsets)
        return pa.RecordBatch.from_arrays([
            keys, values,
            pa.repeat(pa.scalar(self.topic, pa.string()), n),
            pa.repeat(pa.scalar(self.partition, pa.int32()), n),
            pa.array(offsets, pa.int64()),
            pc.multiply_checked(pa.array(millis, pa.int64()), 1000).cast(TIMESTAMP_TYPE),
            pa.array(types, pa.int32()),
            headers,
        ], schema=ARROW_SCHEMA)
