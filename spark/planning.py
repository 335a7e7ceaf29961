"""Turning a topic snapshot and the read options into input partitions.

Each input partition is a `SegmentSlice`: one sealed segment, or one byte range of a large
segment, with the offset and timestamp bounds its reader applies. Planning prunes whole
segments by the offset and timestamp options (and `assign`'s partitions); the executor
(`spark.reading`) uses the `.index` and `.timeindex` sidecars to skip byte ranges inside the
segments that remain.

Filters in queries (`where(...)`) are not pushed down: Spark evaluates them on the rows.
Every released Spark (4.1 to 4.3) keeps the read plan made for a query that pushed filters
on the DataFrame's shared data source object, and reuses it for a later query of the same
DataFrame that pushes none, so pruning by a pushed filter would leak into that query and
silently drop rows. The options prune the same way, per read, and are what Spark's Kafka
source offers too.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, replace

from pyspark.sql.datasource import InputPartition

from stratalog.tiering import layout
from stratalog.tiering.index import OffsetIndex
from stratalog.tiering.txn import AbortedTxn, decode_txnindex

from stratalog.spark.metadata import PartitionSnapshot, TopicSnapshot, open_metadata
from stratalog.spark.options import EARLIEST, LATEST, ReadOptions

class DataLoss(RuntimeError):
    """Records the read asked for are gone from the store (retention or a swap removed them)."""


@dataclass
class SegmentSlice(InputPartition):
    """One unit of work: records of one segment object, within bounds.

    Offsets: ``[start_offset, end_offset)``. Bytes: ``[byte_start, byte_end)`` of the
    ``.log``; ``byte_end`` None means the whole object and allows sidecar seeks. A
    ``seek_ts`` starts at the segment's first record with timestamp >= it (Kafka's
    startingTimestamp); a ``stop_ts`` ends before the first record with timestamp >= it.
    """

    topic: str
    partition: int
    key_base: str
    base_offset: int
    last_offset: int
    size: int
    min_timestamp: int
    start_offset: int
    end_offset: int
    byte_start: int = 0
    byte_end: int | None = None
    seek_ts: int | None = None
    stop_ts: int | None = None
    fail_on_data_loss: bool = True
    chunk_bytes: int = 8 << 20
    # read_committed: (producer id, first offset, abort marker offset) of the aborted
    # transactions with records in the slice, whose batches are skipped.
    aborted: tuple[tuple[int, int, int], ...] = ()


@dataclass
class WalSlice(InputPartition):
    """One committed WAL range of a partition: bytes ``[position, position + length)`` of
    the WAL object `key`, read with ranged GETs of `chunk_bytes`, offsets
    ``[start_offset, end_offset)`` kept (bounds and `aborted` as in `SegmentSlice`).

    `coordinator` and `topic_id` let the executor re-plan the slice from the segment that
    holds its offsets when the WAL object was collected after planning (its range sealed).
    """

    topic: str
    partition: int
    key: str
    position: int
    length: int
    base_offset: int
    last_offset: int
    format_version: int
    start_offset: int
    end_offset: int
    topic_id: str
    coordinator: str
    seek_ts: int | None = None
    stop_ts: int | None = None
    fail_on_data_loss: bool = True
    chunk_bytes: int = 8 << 20
    aborted: tuple[tuple[int, int, int], ...] = ()


def resolve_range(snap: PartitionSnapshot, options: ReadOptions, *, fail_on_data_loss: bool) -> tuple[int, int]:
    """[start, end) offsets of one partition that the offset options ask for."""
    first, end_of_sealed = snap.start, snap.end(options.read_committed)  # HW or LSO with WAL ranges
    wanted = options.starting.for_partition(snap.partition)
    if wanted == EARLIEST:
        start = first
    elif wanted == LATEST:
        start = end_of_sealed
    else:
        if wanted < first and fail_on_data_loss and snap.segments:
            raise DataLoss(f"{options.topic}-{snap.partition}: startingOffsets asks for offset "
                           f"{wanted} but the log starts at {first} (retention removed the rest); "
                           "set failOnDataLoss=false to start at the earliest offset")
        start = max(wanted, first)
    until = options.ending.for_partition(snap.partition)
    end = end_of_sealed if until == LATEST else min(until, end_of_sealed)
    return start, max(start, end)


def plan_partition(snap: PartitionSnapshot, topic: str, start: int, end: int,
                   options: ReadOptions, store=None,
                   topic_id: str = "") -> list[SegmentSlice | WalSlice]:
    """Slices of one partition covering offsets [start, end): its segments, then its
    committed WAL ranges (one slice each).

    `store` is needed only to split segments larger than maxBytesPerPartition (it reads
    their `.index`); without it every segment is one slice.
    """
    if start >= end:
        return []
    seek_ts = options.starting_timestamp.for_partition(snap.partition) if options.starting_timestamp else None
    stop_ts = options.ending_timestamp.for_partition(snap.partition) if options.ending_timestamp else None
    slices = []
    seek_pending, stop_done = seek_ts is not None, False
    aborted = (aborted_transactions(snap, start, end, store) + list(snap.wal_aborted)
               if options.read_committed else [])
    for seg in snap.segments:
        if stop_done:
            break
        if seg.last_offset < start or seg.base_offset >= end:
            continue
        seg_seek = seg_stop = None
        if seek_pending:
            # Kafka's offsetsForTimes: the first record >= seek_ts lies in the first segment
            # whose max timestamp reaches it; every later record is read whatever its time.
            if seg.max_timestamp < seek_ts:
                continue
            seg_seek, seek_pending = seek_ts, False
        if stop_ts is not None and seg.max_timestamp >= stop_ts:
            seg_stop, stop_done = stop_ts, True
        base = SegmentSlice(
            topic=topic, partition=snap.partition, key_base=seg.key_base,
            base_offset=seg.base_offset, last_offset=seg.last_offset, size=seg.size,
            min_timestamp=seg.min_timestamp, start_offset=max(start, seg.base_offset),
            end_offset=min(end, seg.last_offset + 1), seek_ts=seg_seek, stop_ts=seg_stop,
            fail_on_data_loss=options.fail_on_data_loss, chunk_bytes=options.read_chunk_bytes,
            aborted=tuple((a.producer_id, a.first_offset, a.last_offset) for a in aborted
                          if a.first_offset < min(end, seg.last_offset + 1)
                          and a.last_offset >= max(start, seg.base_offset)))
        slices.extend(_split(base, options.max_bytes_per_partition, store))
    reached = snap.sealed_end  # a range may begin inside the last segment: keep what follows it
    for part in snap.wal:
        lo, hi = max(start, part.base_offset, reached), min(end, part.last_offset + 1)
        reached = max(reached, part.last_offset + 1)
        if stop_done or lo >= hi:
            continue
        part_seek = part_stop = None
        if seek_pending:
            if part.max_timestamp < seek_ts:
                continue
            part_seek, seek_pending = seek_ts, False
        if stop_ts is not None and part.max_timestamp >= stop_ts:
            part_stop, stop_done = stop_ts, True
        slices.append(WalSlice(
            topic=topic, partition=snap.partition, key=part.key, position=part.position,
            length=part.length, base_offset=part.base_offset, last_offset=part.last_offset,
            format_version=part.format_version, start_offset=lo, end_offset=hi,
            topic_id=topic_id, coordinator=options.coordinator or "", seek_ts=part_seek,
            stop_ts=part_stop, fail_on_data_loss=options.fail_on_data_loss,
            chunk_bytes=options.read_chunk_bytes,
            aborted=tuple((a.producer_id, a.first_offset, a.last_offset) for a in aborted
                          if a.first_offset < hi and a.last_offset >= lo)))
    return slices


def aborted_transactions(snap: PartitionSnapshot, start: int, end: int, store) -> list[AbortedTxn]:
    """The aborted transactions with records in [start, end), from the .txnindex of every
    segment from the one holding `start` on (an abort's marker may lie after its records)."""
    out: list[AbortedTxn] = []
    for seg in snap.segments:
        if seg.aborted_txns and seg.last_offset >= start:
            key = seg.key_base + layout.TXNINDEX
            out += [a for a in decode_txnindex(store.get(key), key) if a.first_offset < end]
    return out


def _split(base: SegmentSlice, max_bytes: int, store) -> list[SegmentSlice]:
    """Cut a large segment into byte ranges at batch starts the `.index` names."""
    if store is None or base.size <= max_bytes or base.seek_ts is not None or base.stop_ts is not None:
        return [base]
    index = segment_index(base, store)
    if index is None:  # no usable index: read the segment whole, the reader checks everything
        return [base]
    entries = index.entries()
    offsets = [o for o, _ in entries]
    # Byte range of the offsets wanted: from the batch holding start_offset to the one
    # after the batch holding end_offset - 1.
    lo = index.lookup(base.start_offset)[1]
    after = bisect_left(offsets, base.end_offset - 1)
    hi = entries[after + 1][1] if after + 1 < len(entries) else base.size
    cuts = [lo]
    for _, position in entries:
        if lo < position < hi and position - cuts[-1] >= max_bytes:
            cuts.append(position)
    cuts.append(hi)
    if len(cuts) <= 2:
        return [replace(base, byte_start=lo, byte_end=hi)]
    return [replace(base, byte_start=a, byte_end=b) for a, b in zip(cuts, cuts[1:])]


def segment_index(s: SegmentSlice, store) -> OffsetIndex | None:
    """The slice's segment `.index`, or None when it cannot be read or parsed (a reader
    then starts at the segment's first batch and checks every batch from there)."""
    try:
        return OffsetIndex.from_bytes(s.base_offset, store.get(s.key_base + layout.INDEX))
    except Exception:
        return None


def plan_read(options: ReadOptions, store=None) -> list[SegmentSlice | WalSlice]:
    """Every slice of a batch read, from the metadata the options name (manifests or the
    coordinator)."""
    store = store or options.store.open()
    meta = open_metadata(store, options.topic, coordinator=options.coordinator,
                         topic_id=options.topic_id, read_committed=options.read_committed)
    try:
        return plan(meta.snapshot(), options, store)
    finally:
        if hasattr(meta, "close"):
            meta.close()


def plan(snapshot: TopicSnapshot, options: ReadOptions, store=None) -> list[SegmentSlice]:
    """Every slice of a batch read, partition by partition in offset order."""
    slices = []
    for _, snap in sorted(snapshot.only(options.partitions).partitions.items()):
        start, end = resolve_range(snap, options, fail_on_data_loss=options.fail_on_data_loss)
        slices.extend(plan_partition(snap, snapshot.topic, start, end, options, store,
                                     str(snapshot.topic_id)))
    return slices


def first_offset_at(snap: PartitionSnapshot, options: ReadOptions, ts: int, store) -> int:
    """Offset of the partition's first record with timestamp >= `ts` (Kafka's
    offsetsForTimes), or its end (high watermark) when there is none."""
    from stratalog.spark.reading import read_input, read_slice

    for seg in snap.segments:
        if seg.max_timestamp < ts or seg.last_offset < snap.start:
            continue
        probe = SegmentSlice(
            topic=options.topic, partition=snap.partition, key_base=seg.key_base,
            base_offset=seg.base_offset, last_offset=seg.last_offset, size=seg.size,
            min_timestamp=seg.min_timestamp, start_offset=max(snap.start, seg.base_offset),
            end_offset=seg.last_offset + 1, seek_ts=ts,
            fail_on_data_loss=options.fail_on_data_loss, chunk_bytes=1 << 20)
        for batch in read_slice(probe, options.store, store):
            return batch.column("offset")[0].as_py()
    probe_options = replace(options, starting_timestamp=None, ending_timestamp=None)
    for part in snap.wal:
        if part.max_timestamp < ts:
            continue
        for wal_slice in plan_partition(replace(snap, segments=(), wal=(part,)), options.topic,
                                        snap.sealed_end, part.last_offset + 1, probe_options, store):
            wal_slice.seek_ts = ts
            for batch in read_input(wal_slice, options.store, store):
                return batch.column("offset")[0].as_py()
    return snap.high_watermark
