"""The executor side of a read: one `SegmentSlice` in, Arrow record batches out.

The slice's `.log` object is read through tiering's one sealed-segment reader
(`stratalog.tiering.sealed`) with ranged GETs of `chunk_bytes`: the sidecars move the start
forward (the `.index` to the batch holding the first wanted offset, the `.timeindex` past
batches older than a timestamp lower bound), and batch headers let whole batches be
skipped without fetching or decoding them (offsets out of range, control batches, max
timestamp below the bound, and for read_committed the batches of aborted transactions:
a producer has one transaction at a time, so its transactional batches between an aborted
transaction's first offset and its abort marker are that transaction's). Every decoded batch has its CRC checked; a torn or corrupt
object raises `CorruptSegment`, never yields garbage.
"""

from __future__ import annotations

from typing import Iterator

from stratalog.tiering import layout
from stratalog.tiering.batch import LOG_APPEND_TIME, BatchHeader, CorruptBatch, decode_records
from stratalog.tiering.sealed import Batch, CorruptSegment, Get, SegmentObject, Take, read_sync, walk

from stratalog.spark.objects import ObjectNotFound, StoreSpec
from stratalog.spark.planning import DataLoss, SegmentSlice, WalSlice
from stratalog.spark.schema import ArrowColumns

__all__ = ["CorruptSegment", "read_input", "read_slice"]

ROWS_PER_BATCH = 8192


def _gone(s: SegmentSlice, key: str) -> DataLoss:
    return DataLoss(f"{s.topic}-{s.partition}: segment object {key} is gone (retention "
                    "or a compaction swap removed it after the query was planned); run the query "
                    "again, or set failOnDataLoss=false to skip missing segments")


class _Missing(Exception):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


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


def read_slice(s: SegmentSlice, spec: StoreSpec, store=None) -> Iterator:
    """Arrow record batches (the Kafka-source schema) of one slice."""
    store = store or spec.open()
    try:
        yield from records_of(s, read_sync(_walk(s), getter(store)), s.key_base + layout.LOG)
    except _Missing as missing:
        if s.fail_on_data_loss:
            raise _gone(s, missing.key) from None


def batch_filter(s: SegmentSlice | WalSlice):
    """The walk's `take` for a slice: which batches to fetch, skip, or stop before."""
    start_offset, end_offset, seek_ts, aborted = s.start_offset, s.end_offset, s.seek_ts, s.aborted

    def take(h: BatchHeader) -> Take:
        if h.base_offset >= end_offset:
            return Take.STOP
        if h.last_offset < start_offset or h.is_control or (seek_ts is not None and h.max_timestamp < seek_ts):
            return Take.SKIP
        if aborted and h.is_transactional and any(
                pid == h.producer_id and first <= h.base_offset <= marker for pid, first, marker in aborted):
            return Take.SKIP  # a batch of an aborted transaction (read_committed)
        return Take.TAKE

    return take


def _walk(s: SegmentSlice):
    seg = SegmentObject(s.key_base, s.base_offset, s.last_offset, s.size)
    seek_ts, take = s.seek_ts, batch_filter(s)
    if s.byte_end is not None:  # planned byte ranges already start where they should
        return walk(seg, take, position=s.byte_start, end=s.byte_end, chunk_bytes=s.chunk_bytes)
    return walk(seg, take, position=s.byte_start, chunk_bytes=s.chunk_bytes,
                seek_offset=s.start_offset,
                seek_ts=seek_ts if seek_ts is not None and seek_ts > s.min_timestamp else None)


def records_of(s: SegmentSlice | WalSlice, batches: Iterator[Batch], key: str) -> Iterator:
    """Arrow record batches of the slice's records in `batches` (read from object `key`),
    each batch's CRC checked as it is decoded."""
    out = ArrowColumns(s.topic, s.partition)
    seek_ts, stop_ts = s.seek_ts, s.stop_ts
    start_offset, end_offset = s.start_offset, s.end_offset
    for batch in batches:
        h = batch.header
        try:
            records = decode_records(batch.data)
        except CorruptBatch as exc:
            raise CorruptSegment(f"{key} batch at byte {batch.position} "
                                 f"(offset {h.base_offset}): {exc}", key=key,
                                 position=batch.position, offset=h.base_offset) from exc
        timestamp_type = 1 if h.timestamp_type == LOG_APPEND_TIME else 0
        if stop_ts is None and seek_ts is None and start_offset <= h.base_offset and h.last_offset < end_offset:
            out.extend(records, timestamp_type)  # the common case: every record counts
        else:
            stopped, seek_ts = _add_filtered(out, records, timestamp_type, s, seek_ts, stop_ts)
            if stopped:
                yield from out.flush()
                return
        if out.rows >= ROWS_PER_BATCH:
            yield from out.flush()
    yield from out.flush()


def _add_filtered(out: ArrowColumns, records, timestamp_type: int, s: SegmentSlice | WalSlice,
                  seek_ts: int | None, stop_ts: int | None) -> tuple[bool, int | None]:
    """Add the records of one batch within the slice's offsets and timestamps.

    Returns whether `stop_ts` was reached, and the seek timestamp still pending (None once
    the first record at or after it was seen: every later record counts whatever its time).
    """
    start_offset, end_offset = s.start_offset, s.end_offset
    for r in records:
        offset, ts = r.offset, r.timestamp
        if seek_ts is not None:
            if ts < seek_ts:
                continue
            seek_ts = None
        if stop_ts is not None and ts >= stop_ts:
            return True, seek_ts
        if offset < start_offset or offset >= end_offset:
            continue
        out.add(r.key, r.value, offset, ts, timestamp_type, r.headers)
    return False, seek_ts
