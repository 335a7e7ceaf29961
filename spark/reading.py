"""The executor side of a read: one `SegmentSlice` in, Arrow record batches out.

The slice's `.log` object is fetched with ranged GETs of `chunk_bytes`. Before the first
GET the sidecars move the start forward: the `.index` to the batch holding the first
wanted offset, the `.timeindex` past batches whose records are all older than a timestamp
lower bound. Batch headers then let whole batches be skipped without decoding (offsets
out of range, control batches, max timestamp below the bound). Every decoded batch has its
CRC checked; a torn or corrupt object raises `CorruptSegment`, never yields garbage.
"""

from __future__ import annotations

from typing import Iterator

from stratalog.tiering import layout
from stratalog.tiering.batch import HEADER_SIZE, LOG_APPEND_TIME, BatchHeader, CorruptBatch, decode_records
from stratalog.tiering.index import OffsetIndex, TimeIndex

from stratalog.spark.objects import ObjectNotFound, StoreSpec
from stratalog.spark.planning import DataLoss, SegmentSlice
from stratalog.spark.schema import ArrowColumns

ROWS_PER_BATCH = 8192


class CorruptSegment(RuntimeError):
    """A segment object fails its checks (CRC, framing, offsets outside the segment)."""


def _start_position(store, s: SegmentSlice) -> int:
    """Where to begin reading: the greatest position the sidecars prove safe."""
    position = s.byte_start
    if s.byte_end is not None:
        return position  # planned byte ranges already start where they should
    index = None
    if s.start_offset > s.base_offset:
        index = _offset_index(store, s)
        position = max(position, index.lookup(s.start_offset)[1])
    lo_ms = s.seek_ts
    if lo_ms is not None and lo_ms > s.min_timestamp:
        # A time index entry (T, O) says every batch before the one holding O is below T.
        times = TimeIndex.from_bytes(s.base_offset, _sidecar(store, s, layout.TIMEINDEX))
        offset = times.lookup(lo_ms)
        if offset > s.base_offset:
            index = index or _offset_index(store, s)
            position = max(position, index.lookup(offset)[1])
    return position


def _sidecar(store, s: SegmentSlice, ext: str) -> bytes:
    try:
        return store.get(s.key_base + ext)
    except ObjectNotFound:
        raise _gone(s, ext) from None


def _offset_index(store, s: SegmentSlice) -> OffsetIndex:
    try:
        return OffsetIndex.from_bytes(s.base_offset, _sidecar(store, s, layout.INDEX))
    except ValueError as exc:
        raise CorruptSegment(f"{s.key_base}{layout.INDEX}: {exc}") from exc


def _gone(s: SegmentSlice, ext: str) -> DataLoss:
    return DataLoss(f"{s.topic}-{s.partition}: segment object {s.key_base}{ext} is gone (retention "
                    "or a compaction swap removed it after the query was planned); run the query "
                    "again, or set failOnDataLoss=false to skip missing segments")


class _Chunks:
    """Sequential access to [start, end) of one object through ranged GETs."""

    def __init__(self, store, key: str, start: int, end: int, chunk: int) -> None:
        self.store, self.key, self.end, self.chunk = store, key, end, chunk
        self.buf = b""
        self.buf_start = start  # object position of buf[0]

    def ensure(self, position: int, length: int) -> memoryview | None:
        """`length` bytes at `position`, or None if the range ends first."""
        if position + length > self.end:
            return None
        offset = position - self.buf_start
        if offset + length > len(self.buf):
            keep = self.buf[offset:] if offset < len(self.buf) else b""
            fetch_from = position + len(keep)
            fetch_to = min(self.end, max(position + length, fetch_from + self.chunk))
            data = self.store.get(self.key, fetch_from, fetch_to)
            if len(data) != fetch_to - fetch_from:
                raise CorruptSegment(f"{self.key}: object ends at {fetch_from + len(data)}, "
                                     f"the manifest says {self.end}")
            self.buf = keep + data
            self.buf_start = position
            offset = 0
        return memoryview(self.buf)[offset:offset + length]


def read_slice(s: SegmentSlice, spec: StoreSpec, store=None) -> Iterator:
    """Arrow record batches (the Kafka-source schema) of one slice."""
    store = store or spec.open()
    key = s.key_base + layout.LOG
    try:
        position = _start_position(store, s)
        end = s.size if s.byte_end is None else s.byte_end
        yield from _read_records(store, s, key, position, end)
    except ObjectNotFound:
        if s.fail_on_data_loss:
            raise _gone(s, layout.LOG) from None


def _read_records(store, s: SegmentSlice, key: str, position: int, end: int) -> Iterator:
    chunks = _Chunks(store, key, position, end, s.chunk_bytes)
    out = ArrowColumns(s.topic, s.partition)
    seek_ts, stop_ts = s.seek_ts, s.stop_ts
    start_offset, end_offset = s.start_offset, s.end_offset
    previous_end = s.base_offset
    while position < end:
        view = chunks.ensure(position, HEADER_SIZE)
        if view is None:
            raise CorruptSegment(f"{key}: {end - position} trailing bytes at {position} are not a batch")
        try:
            h = BatchHeader.parse(view)
        except CorruptBatch as exc:
            raise CorruptSegment(f"{key} at byte {position}: {exc}") from exc
        if h.base_offset < previous_end or h.last_offset > s.last_offset or h.last_offset_delta < 0:
            raise CorruptSegment(f"{key} at byte {position}: batch offsets {h.base_offset}..{h.last_offset} "
                                 f"do not follow {previous_end - 1} within segment "
                                 f"{s.base_offset}..{s.last_offset}")
        previous_end = h.last_offset + 1
        batch_at, position = position, position + h.size
        if h.base_offset >= end_offset:
            break
        if (h.last_offset < start_offset or h.is_control
                or (seek_ts is not None and h.max_timestamp < seek_ts)):
            continue
        whole = chunks.ensure(batch_at, h.size)
        if whole is None:
            raise CorruptSegment(f"{key}: batch at byte {batch_at} runs past the end ({end})")
        try:
            records = decode_records(whole)
        except CorruptBatch as exc:
            raise CorruptSegment(f"{key} batch at byte {batch_at} (offset {h.base_offset}): {exc}") from exc
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


def _add_filtered(out: ArrowColumns, records, timestamp_type: int, s: SegmentSlice,
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
