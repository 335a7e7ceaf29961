"""Turning a topic snapshot, the read options and pushed-down filters into input partitions.

Each input partition is a `SegmentSlice`: one sealed segment, or one byte range of a large
segment, with the offset and timestamp bounds its reader applies. Planning prunes whole
segments; the executor (`spark.reading`) uses the `.index` and `.timeindex` sidecars to
skip byte ranges inside the segments that remain.

Filter pushdown (`Bounds.push`) takes comparisons on ``partition``, ``offset`` and
``timestamp``. Partition and offset filters, and timestamp lower bounds, prune segments;
every claimed filter is also applied record by record, so results are exact. An upper bound
on ``timestamp`` prunes nothing: a segment's ``min_timestamp`` is the smallest *first*
timestamp of its batches, and a CreateTime batch may hold an earlier record after its first.
"""

from __future__ import annotations

import datetime as dt
from bisect import bisect_left
from dataclasses import dataclass, replace

from pyspark.sql.datasource import (EqualTo, GreaterThan, GreaterThanOrEqual, In, InputPartition,
                                    LessThan, LessThanOrEqual)

from stratalog.tiering import layout
from stratalog.tiering.index import OffsetIndex

from stratalog.spark.metadata import PartitionSnapshot, TopicSnapshot
from stratalog.spark.options import EARLIEST, LATEST, ReadOptions

_INT64_MAX = 2**63 - 1
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class DataLoss(RuntimeError):
    """Records the read asked for are gone from the store (retention or a swap removed them)."""


@dataclass
class SegmentSlice(InputPartition):
    """One unit of work: records of one segment object, within bounds.

    Offsets: ``[start_offset, end_offset)``. Bytes: ``[byte_start, byte_end)`` of the
    ``.log``; ``byte_end`` None means the whole object and allows sidecar seeks. A
    ``seek_ts`` starts at the segment's first record with timestamp >= it (Kafka's
    startingTimestamp); a ``stop_ts`` ends before the first record with timestamp >= it.
    ``ts_lo_us``/``ts_hi_us`` are inclusive record filters in microseconds.
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
    ts_lo_us: int | None = None
    ts_hi_us: int | None = None
    fail_on_data_loss: bool = True
    chunk_bytes: int = 8 << 20


def _micros(value) -> int | None:
    """A pushed timestamp literal as microseconds since the epoch (None if it is not one)."""
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # Spark hands session-zone wall time; the JVM runs in UTC here
            value = value.replace(tzinfo=dt.timezone.utc)
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    return None


def _whole(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Bounds:
    """What pushed filters allow: partitions, an offset range and a timestamp range."""

    partitions: frozenset[int] | None = None
    partition_lo: int = 0
    partition_hi: int = 2**31 - 1
    offset_lo: int = 0
    offset_hi: int = _INT64_MAX  # exclusive
    ts_lo_us: int | None = None  # inclusive
    ts_hi_us: int | None = None  # inclusive

    def allows_partition(self, p: int) -> bool:
        return (self.partition_lo <= p <= self.partition_hi
                and (self.partitions is None or p in self.partitions))

    def push(self, f) -> tuple["Bounds", bool]:
        """Narrow the bounds by one filter; returns (bounds, claimed). Unclaimed filters stay
        with Spark (they may still have narrowed the bounds, as `offset IN (...)` does)."""
        column = f.attribute if hasattr(f, "attribute") else None
        if column == ("partition",):
            return self._push_partition(f)
        if column == ("offset",):
            return self._push_offset(f)
        if column == ("timestamp",):
            return self._push_timestamp(f)
        return self, False

    def _push_partition(self, f) -> tuple["Bounds", bool]:
        if isinstance(f, In):
            values = [_whole(v) for v in f.value]
            if any(v is None for v in values):
                return self, False
            allowed = frozenset(values) if self.partitions is None else self.partitions & frozenset(values)
            return replace(self, partitions=allowed), True
        v = _whole(getattr(f, "value", None))
        if v is None:
            return self, False
        if isinstance(f, EqualTo):
            allowed = frozenset([v]) if self.partitions is None else self.partitions & {v}
            return replace(self, partitions=allowed), True
        if isinstance(f, GreaterThan):
            return replace(self, partition_lo=max(self.partition_lo, v + 1)), True
        if isinstance(f, GreaterThanOrEqual):
            return replace(self, partition_lo=max(self.partition_lo, v)), True
        if isinstance(f, LessThan):
            return replace(self, partition_hi=min(self.partition_hi, v - 1)), True
        if isinstance(f, LessThanOrEqual):
            return replace(self, partition_hi=min(self.partition_hi, v)), True
        return self, False

    def _push_offset(self, f) -> tuple["Bounds", bool]:
        if isinstance(f, In):
            values = [_whole(v) for v in f.value]
            if not values or any(v is None for v in values):
                return self, False
            # Narrow to the span; Spark still checks membership.
            return replace(self, offset_lo=max(self.offset_lo, min(values)),
                           offset_hi=min(self.offset_hi, max(values) + 1)), False
        v = _whole(getattr(f, "value", None))
        if v is None:
            return self, False
        if isinstance(f, EqualTo):
            return replace(self, offset_lo=max(self.offset_lo, v), offset_hi=min(self.offset_hi, v + 1)), True
        if isinstance(f, GreaterThan):
            return replace(self, offset_lo=max(self.offset_lo, v + 1)), True
        if isinstance(f, GreaterThanOrEqual):
            return replace(self, offset_lo=max(self.offset_lo, v)), True
        if isinstance(f, LessThan):
            return replace(self, offset_hi=min(self.offset_hi, v)), True
        if isinstance(f, LessThanOrEqual):
            return replace(self, offset_hi=min(self.offset_hi, v + 1)), True
        return self, False

    def _push_timestamp(self, f) -> tuple["Bounds", bool]:
        v = _micros(getattr(f, "value", None))
        if v is None or isinstance(f, In):
            return self, False
        lo, hi = self.ts_lo_us, self.ts_hi_us
        if isinstance(f, EqualTo):
            lo, hi = v, v
        elif isinstance(f, GreaterThan):
            lo = v + 1
        elif isinstance(f, GreaterThanOrEqual):
            lo = v
        elif isinstance(f, LessThan):
            hi = v - 1
        elif isinstance(f, LessThanOrEqual):
            hi = v
        else:
            return self, False
        lo = lo if self.ts_lo_us is None or lo is None else max(lo, self.ts_lo_us)
        hi = hi if self.ts_hi_us is None or hi is None else min(hi, self.ts_hi_us)
        return replace(self, ts_lo_us=lo, ts_hi_us=hi), True

    @property
    def empty(self) -> bool:
        return (self.offset_lo >= self.offset_hi or self.partition_lo > self.partition_hi
                or (self.partitions is not None and not self.partitions)
                or (self.ts_lo_us is not None and self.ts_hi_us is not None and self.ts_lo_us > self.ts_hi_us))


def _ceil_ms(us: int) -> int:
    return -((-us) // 1000)


def resolve_range(snap: PartitionSnapshot, options: ReadOptions, *, fail_on_data_loss: bool) -> tuple[int, int]:
    """[start, end) offsets of one partition that the offset options ask for."""
    first, end_of_sealed = snap.start, snap.sealed_end
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


def plan_partition(snap: PartitionSnapshot, topic: str, start: int, end: int, bounds: Bounds,
                   options: ReadOptions, store=None) -> list[SegmentSlice]:
    """Slices of one partition covering offsets [start, end) within the bounds.

    `store` is needed only to split segments larger than maxBytesPerPartition (it reads
    their `.index`); without it every segment is one slice.
    """
    start = max(start, bounds.offset_lo)
    end = min(end, bounds.offset_hi)
    if start >= end or bounds.empty or not bounds.allows_partition(snap.partition):
        return []
    seek_ts = options.starting_timestamp.for_partition(snap.partition) if options.starting_timestamp else None
    stop_ts = options.ending_timestamp.for_partition(snap.partition) if options.ending_timestamp else None
    lo_ms = None if bounds.ts_lo_us is None else _ceil_ms(bounds.ts_lo_us)
    slices = []
    seek_pending, stop_done = seek_ts is not None, False
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
        if lo_ms is not None and seg.max_timestamp < lo_ms:
            continue
        base = SegmentSlice(
            topic=topic, partition=snap.partition, key_base=seg.key_base,
            base_offset=seg.base_offset, last_offset=seg.last_offset, size=seg.size,
            min_timestamp=seg.min_timestamp, start_offset=max(start, seg.base_offset),
            end_offset=min(end, seg.last_offset + 1), seek_ts=seg_seek, stop_ts=seg_stop,
            ts_lo_us=bounds.ts_lo_us, ts_hi_us=bounds.ts_hi_us,
            fail_on_data_loss=options.fail_on_data_loss, chunk_bytes=options.read_chunk_bytes)
        slices.extend(_split(base, options.max_bytes_per_partition, store))
    return slices


def _split(base: SegmentSlice, max_bytes: int, store) -> list[SegmentSlice]:
    """Cut a large segment into byte ranges at batch starts the `.index` names."""
    if store is None or base.size <= max_bytes or base.seek_ts is not None or base.stop_ts is not None:
        return [base]
    try:
        index = OffsetIndex.from_bytes(base.base_offset, store.get(base.key_base + layout.INDEX))
    except Exception:  # no usable index: read the segment whole, the reader checks everything
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


def plan(snapshot: TopicSnapshot, options: ReadOptions, bounds: Bounds, store=None) -> list[SegmentSlice]:
    """Every slice of a batch read, partition by partition in offset order."""
    slices = []
    for p, snap in sorted(snapshot.partitions.items()):
        if not bounds.allows_partition(p):
            continue
        start, end = resolve_range(snap, options, fail_on_data_loss=options.fail_on_data_loss)
        slices.extend(plan_partition(snap, snapshot.topic, start, end, bounds, options, store))
    return slices


def first_offset_at(snap: PartitionSnapshot, options: ReadOptions, ts: int, store) -> int:
    """Offset of the partition's first sealed record with timestamp >= `ts` (Kafka's
    offsetsForTimes), or the end of its sealed data when there is none."""
    from stratalog.spark.reading import read_slice

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
    return snap.sealed_end
