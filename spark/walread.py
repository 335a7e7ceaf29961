"""Reading committed WAL ranges: the records after a partition's last sealed segment.

A WAL object (`tiering.wal`) holds one flush's batches of many partitions; the coordinator
names, per partition, the object and the byte range of its batches. A `WalSlice` is one
such range, read with ranged GETs of that range only, walked and checked like a sealed
segment's bytes (`tiering.sealed.walk`: framing and offsets; every batch's CRC-32C when
decoded), so a damaged range raises `CorruptSegment` naming the object, byte and offset.

Gateways collect a WAL object once every range in it is sealed. When that happens between
planning and reading, the slice is re-planned on the executor: the coordinator now lists a
segment holding its offsets, and the rest of the slice is read from there, after the last
offset already returned, so nothing is lost or repeated.

For read_committed, `scan_transactions` reads the ranges' batch headers and markers on the
driver (WAL ranges have no `.txnindex`): the transactions aborted there and the oldest one
still open at the high watermark, which is where read_committed reads stop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterator

from stratalog.tiering.batch import BatchHeader
from stratalog.tiering.sealed import SegmentObject, Take, read_sync, walk
from stratalog.tiering.txn import AbortedTxn, marker_commits
from stratalog.tiering.wal import check_version

from stratalog.spark.metadata import CoordinatorMetadata, PartitionSnapshot, WalPart
from stratalog.spark.objects import ObjectNotFound, StoreSpec
from stratalog.spark.planning import DataLoss, SegmentSlice, WalSlice


class WalObjectGone(Exception):
    """A WAL object named by a snapshot was collected (its ranges sealed): plan again."""


def _walk_part(part: WalPart | WalSlice, take, chunk_bytes: int):
    check_version(part.format_version, part.key)
    end = part.position + part.length
    seg = SegmentObject(part.key, part.base_offset, part.last_offset, end, object_key=part.key)
    return walk(seg, take, position=part.position, end=end, chunk_bytes=chunk_bytes)


def read_wal_slice(s: WalSlice, spec: StoreSpec, store=None) -> Iterator:
    """Arrow record batches of one WAL range; re-planned from segments if it was collected."""
    from stratalog.spark.reading import Seek, _Missing, batch_filter, getter, records_of

    store = store or spec.open()
    last = s.start_offset - 1  # the last offset returned so far
    seek = Seek(s.seek_ts)
    try:
        for batch in records_of(s, read_sync(_walk_part(s, batch_filter(s, seek), s.chunk_bytes),
                                             getter(store)), s.key, seek):
            if batch.num_rows:
                last = batch.column("offset")[-1].as_py()
            yield batch
    except _Missing:
        # Batches walked but not yet decoded are read again: the position too, if its
        # records were among them.
        yield from _from_segments(replace(s, start_offset=max(s.start_offset, last + 1), seek_ts=seek.rows),
                                  spec, store)


def _from_segments(s: WalSlice, spec: StoreSpec, store) -> Iterator:
    """The slice's offsets read from the segments the coordinator lists now, as one read
    (the position, once reached in one segment, is not sought again in the next)."""
    from stratalog.spark.reading import Seek, read_slice

    seek = Seek(s.seek_ts)
    for piece in segment_slices(s):
        yield from read_slice(piece, spec, store, seek)


def segment_slices(s: WalSlice) -> list[SegmentSlice]:
    """The slices of the segments the coordinator lists now that hold the WAL slice's
    offsets (all with its seek timestamp, which only the first record at or past it
    reaches); DataLoss if some were deleted rather than sealed."""
    if s.start_offset >= s.end_offset:
        return []
    snap = CoordinatorMetadata(s.coordinator, s.topic).partition(s.topic_id, s.partition) \
        if s.coordinator else None
    segments = [seg for seg in (snap.segments if snap else ())
                if seg.last_offset >= s.start_offset and seg.base_offset < s.end_offset]
    reached = s.start_offset
    for seg in segments:
        if seg.base_offset > reached:
            break
        reached = seg.last_offset + 1
    if reached < s.end_offset:  # the offsets were deleted, not sealed
        if s.fail_on_data_loss:
            raise DataLoss(f"{s.topic}-{s.partition}: WAL object {s.key} is gone and no segment "
                           f"holds offsets {s.start_offset}..{s.end_offset - 1} (retention or a "
                           "topic deletion removed them); run the query again, or set "
                           "failOnDataLoss=false to skip them")
    return [SegmentSlice(
        topic=s.topic, partition=s.partition, key_base=seg.key_base,
        base_offset=seg.base_offset, last_offset=seg.last_offset, size=seg.size,
        min_timestamp=seg.min_timestamp, start_offset=max(s.start_offset, seg.base_offset),
        end_offset=min(s.end_offset, seg.last_offset + 1), seek_ts=s.seek_ts, stop_ts=s.stop_ts,
        fail_on_data_loss=s.fail_on_data_loss, chunk_bytes=s.chunk_bytes, aborted=s.aborted)
        for seg in segments]


def scan_transactions(snap: PartitionSnapshot, store,
                      previous: PartitionSnapshot | None = None) -> PartitionSnapshot:
    """The snapshot with what read_committed needs from its WAL ranges: transactions
    aborted there and the first offset of the oldest one still open at the end.

    Starts from the transactions open where the sealed data ends (`open_txns`); a
    producer has one transaction at a time, so its first transactional batch opens one
    and its next marker ends it. `previous`, this partition's last scanned snapshot (a
    stream's previous trigger), is continued when nothing sealed since: only the WAL
    ranges committed after it are read. Raises `WalObjectGone` if an object was collected."""
    if not snap.wal:
        return snap
    open_txns = dict(snap.open_txns)
    aborted: list[AbortedTxn] = []
    done = snap.sealed_end  # batches below this were seen in the segments
    parts = snap.wal
    if (previous is not None and previous.wal and previous.sealed_end == snap.sealed_end
            and previous.open_txns == snap.open_txns and snap.wal[:len(previous.wal)] == previous.wal):
        open_txns = dict(previous.wal_open_txns)
        aborted = list(previous.wal_aborted)
        done = previous.high_watermark
        parts = snap.wal[len(previous.wal):]

    def take(h: BatchHeader) -> Take:
        if h.base_offset < done or h.producer_id < 0 or not h.is_transactional:
            return Take.SKIP
        if h.is_control:
            return Take.TAKE  # a marker: its body says commit or abort
        open_txns.setdefault(h.producer_id, h.base_offset)
        return Take.SKIP

    # Imported here: planners (the driver's, the JVM reader's) import this module for
    # this function alone, and the readers pull in NumPy and Arrow.
    from stratalog.spark.reading import _Missing, getter

    get = getter(store)
    for part in parts:
        try:
            for batch in read_sync(_walk_part(part, take, part.length), get):
                h = batch.header
                first = open_txns.pop(h.producer_id, None)
                if first is not None and not marker_commits(batch.data, h):
                    aborted.append(AbortedTxn(h.producer_id, first, h.base_offset))
        except (_Missing, ObjectNotFound):
            raise WalObjectGone(part.key) from None
        done = max(done, part.last_offset + 1)
    return replace(snap, wal_aborted=tuple(aborted), wal_open_txns=tuple(sorted(open_txns.items())),
                   wal_open_txn_offset=min(open_txns.values(), default=-1))
