"""A partition this gateway leads: offsets, the local active segment, producer state.

Offsets: `log_start_offset <= high_watermark <= next_offset`. Everything below the high
watermark (HW) is committed to the coordinator and lives in the object store, as sealed
segments or WAL ranges; consumers never see past it. Between HW and `next_offset` are
batches appended locally and waiting for their WAL object to commit.

The local files are a cache: a new leader rebuilds them from the object store
(`recover`), so deleting them loses nothing that was committed.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path

from stratalog.coordinator.model import ClusterStore, SegmentEntry, WalRange
from stratalog.tiering import layout
from stratalog.tiering.batch import (HEADER_SIZE, BatchHeader, decode_records, patch_batch,
                                     scan_batches, set_log_append_time, set_max_timestamp)
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.index import TimeIndex
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore
from stratalog.tiering.remote import RemoteCache
from stratalog.tiering.sealed import Get, SegmentObject, Take, read_async, walk
from stratalog.tiering.segment import ActiveSegment
from stratalog.tiering.txn import AbortedTxn, decode_txnindex, encode_txnindex, marker_commits
from stratalog.tiering.wal import check_version as check_wal_version

from .errors import CorruptLog, NotLeader
from .producers import BatchMeta, OutOfOrderSequence, ProducerTable
from .transactions import PartitionTxns

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WalDamage:
    """The first committed WAL range a salvaging recovery could not read whole: where the
    partition's readable log ends. `kept` is its valid prefix as a shorter range of the
    same object (None when no whole batch of it is readable)."""

    key: str
    range: WalRange
    reason: str
    kept: WalRange | None


class PartitionLog:
    def __init__(self, topic: str, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                 directory: Path, *, index_interval_bytes: int, now_ms: int):
        self.topic = topic
        self.topic_id = topic_id
        self.partition = partition
        # The partition's key in the WAL buffer and the coordinator's ranges, made once:
        # (topic id, partition) never changes for a log.
        self.key: tuple[uuid.UUID, int] = (topic_id, partition)
        self.leader_epoch = leader_epoch
        self.directory = directory
        self.index_interval_bytes = index_interval_bytes
        self.log_start_offset = 0
        self.high_watermark = 0
        self.next_offset = 0
        self.sealed: list[SegmentEntry] = []
        self.rolled: list[ActiveSegment] = []  # sealed locally, waiting to be uploaded
        self.active: ActiveSegment  # set by recover(), before the log is used
        # Producer state as each rolled segment ended, committed with its segment entry.
        self.producer_snapshots: dict[int, dict] = {}
        # When the active segment got its first batch: segment.ms counts from there, not
        # from when the (possibly long idle) empty segment was opened. Replayed batches
        # count from the recovery, which is when this log first held them.
        self.active_since_ms = now_ms
        self.producers = ProducerTable()
        self.txns = PartitionTxns()
        # The .txnindex of each rolled segment that holds abort markers, by base offset.
        self.txn_indexes: dict[int, bytes] = {}
        self._appended_producers: set[int] = set()  # producer ids appended to since recovery
        # (leader epoch, first offset) in offset order, for OffsetForLeaderEpoch
        self.epochs: list[tuple[int, int]] = []
        self.now_ms = now_ms
        # Set by a salvaging recovery that met damage; with the high watermark the
        # coordinator had committed, to say how many offsets truncating there gives up.
        self.damage: WalDamage | None = None
        self.committed_end = 0

    @property
    def size_bytes(self) -> int:
        """Bytes of the log: its sealed segments in the object store plus the local ones."""
        return sum(s.size for s in self.sealed) + sum(s.size for s in self.rolled) + self.active.size

    # ---- recovery ----------------------------------------------------------------------

    @classmethod
    async def recover(cls, topic: str, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                      directory: Path, store: ClusterStore, objects: ObjectStore, *,
                      index_interval_bytes: int, now_ms: int, salvage: bool = False) -> "PartitionLog":
        """Rebuild the partition from the coordinator and the object store.

        Sealed segments stay remote; committed WAL ranges after them are replayed into a
        fresh local active segment. Whatever was on local disk is discarded first: it may
        hold batches that were never committed.

        A committed range that is missing or fails its CRCs raises CorruptLog; with
        `salvage`, replay stops there instead (after the range's valid prefix) and
        `damage` says where, for a truncation the operator asked for.
        """
        p = cls(topic, topic_id, partition, leader_epoch, directory,
                index_interval_bytes=index_interval_bytes, now_ms=now_ms)
        if directory.exists():
            shutil.rmtree(directory)
        directory.mkdir(parents=True)
        state = await store.log_state(topic_id, partition)
        p.log_start_offset = state.log_start_offset
        p.sealed = await store.segments(topic_id, partition)
        if p.sealed:
            last = p.sealed[-1]
            p.producers = ProducerTable.restore(last.producers)
            p.txns.restore({pid: e["txn"] for pid, e in last.producers.items() if "txn" in e},
                           await _sealed_aborts(p.sealed, state.log_start_offset, objects))
            start = last.last_offset + 1
            for s in p.sealed:
                p._note_epoch(s.leader_epoch, s.base_offset)
        else:
            start = state.log_start_offset
        start = max(start, state.log_start_offset)
        ranges = await store.wal_ranges(topic_id, partition, start)
        p.active = ActiveSegment.create(directory, start, index_interval_bytes=index_interval_bytes,
                                        now_ms=now_ms)
        p.next_offset = start
        p.committed_end = state.high_watermark
        for key, r in ranges:
            check_wal_version(r.format_version, key)  # header and trailer are not fetched
            try:
                data = await objects.get(key, r.position, r.position + r.length)
            except ObjectNotFound:
                data, missing = b"", True
            else:
                missing = False
            batches, valid = scan_batches(data, validate_crc=True)
            if missing or valid != r.length or valid != len(data) or not batches:
                reason = (f"WAL object {key} is missing" if missing else
                          f"WAL object {key} range at {r.position} is corrupt "
                          f"({valid} of {r.length} bytes valid)")
                if not salvage:
                    raise CorruptLog(f"{topic}-{partition}: offsets {r.base_offset}..{r.last_offset}: "
                                     f"{reason}")
                p.damage = WalDamage(key, r, reason, _valid_prefix(r, batches, valid))
            for pos, h in batches:
                if h.last_offset < p.next_offset:
                    continue  # sealed already, or below the log start
                if h.base_offset != p.next_offset and p.active.size == 0:
                    # The first replayed batch need not start where the log does:
                    # retention or DeleteRecords may have left a gap before it, or
                    # DeleteRecords put the log start inside it (whole batches are kept).
                    p.active.delete()
                    p.active = ActiveSegment.create(directory, h.base_offset,
                                                    index_interval_bytes=index_interval_bytes,
                                                    now_ms=now_ms)
                p.active.append(memoryview(data)[pos:pos + h.size], h)
                p._replayed(h, memoryview(data)[pos:pos + h.size])
                p.next_offset = h.last_offset + 1
            if p.damage is not None:
                break
        if p.next_offset < state.high_watermark and p.damage is None:
            raise CorruptLog(f"{topic}-{partition}: replayed up to offset {p.next_offset} but the "
                             f"coordinator has committed up to {state.high_watermark}")
        p.high_watermark = p.next_offset
        p.txns.committed(p.high_watermark)  # every replayed marker is committed
        p._note_epoch(leader_epoch, p.next_offset)
        return p

    def _replayed(self, h: BatchHeader, batch: memoryview) -> None:
        self._note_epoch(h.partition_leader_epoch, h.base_offset)
        # Stamped with the recovery time, not the records' timestamps: like an append (and
        # the segment snapshots), the table notes when a leader last heard from the
        # producer, which idle expiry counts from. Records may carry any CreateTime.
        self._track_producer(h, batch, h.base_offset, h.last_offset, self.now_ms)

    def _track_producer(self, h: BatchHeader, batch: memoryview, base: int, last: int, now_ms: int) -> None:
        """Producer and transaction state after a batch landed at base..last."""
        if h.producer_id < 0:
            return
        if h.is_control:
            self.producers.fence(h.producer_id, h.producer_epoch, now_ms)
            self.txns.marker(h.producer_id, base, marker_commits(batch, h))
            return
        self.producers.record(h.producer_id, h.producer_epoch, h.base_sequence,
                              h.last_offset_delta + 1, base, last, now_ms)
        if h.is_transactional:
            self.txns.data(h.producer_id, base)

    def _note_epoch(self, epoch: int, offset: int) -> None:
        if epoch < 0:
            return
        if not self.epochs or epoch > self.epochs[-1][0]:
            self.epochs.append((epoch, offset))

    # ---- write path --------------------------------------------------------------------

    def check_duplicate(self, h: BatchHeader) -> BatchMeta | None:
        """The original of a retried idempotent batch, or None; raises on a sequence error.

        A sequence gap from a producer that has not yet appended to this log instance is
        answered NOT_LEADER_OR_FOLLOWER rather than OUT_OF_ORDER_SEQUENCE_NUMBER. This log
        was just rebuilt from committed data (new leadership, or ours again after a fenced
        flush), so the batches in the gap were refused by the previous leadership with a
        retriable error (or never answered) and the producer will resend them; it must
        resend this one after them. OUT_OF_ORDER makes librdkafka bump its producer epoch,
        and a bump resends batches it is unsure of on every partition under a sequence the
        leaders cannot recognise, which duplicates records that had been committed.
        Committed data is never lost, so nothing else leaves a gap here.
        """
        if h.producer_id < 0:
            return None
        try:
            return self.producers.check(h.producer_id, h.producer_epoch, h.base_sequence,
                                        h.last_offset_delta + 1)
        except OutOfOrderSequence as e:
            if h.producer_id in self._appended_producers:
                raise
            raise NotLeader(f"leadership of {self.topic}-{self.partition} was just taken over; "
                            f"resend the earlier batches first ({e})") from None

    def append(self, batch: memoryview, h: BatchHeader, *, now_ms: int,
               log_append_time: bool) -> tuple[bytearray | memoryview, BatchHeader]:
        """Assign offsets to one validated batch (`h`: its header) and append it to the
        active segment.

        A writable batch that is most of its buffer (a request frame the gateway read into
        a buffer of its own) is patched in place and kept; any other is copied first, so
        a small batch does not keep a large frame alive until the segment writes it.
        Returns the patched bytes (for the WAL buffer) and the header as stored.
        """
        data = batch if _most_of_a_writable_buffer(batch) else bytearray(batch)
        base = self.next_offset
        if self.active.size == 0:
            self.active_since_ms = now_ms
        patch_batch(data, 0, base, self.leader_epoch)
        if log_append_time:
            set_log_append_time(data, 0, now_ms)
            stored = BatchHeader.parse(data, 0)
        elif h.max_timestamp < h.base_timestamp:
            # A header whose maxTimestamp is below its first timestamp was never filled in
            # (Sarama 1.22 sends -1). Kafka's broker sets it from the records, and
            # ListOffsets by time, retention.ms and the time index all read it.
            set_max_timestamp(data, 0, max((r.timestamp for r in decode_records(data, validate_crc=False)),
                                           default=h.base_timestamp))
            stored = BatchHeader.parse(data, 0)
        else:
            stored = h.with_offsets(base, self.leader_epoch)
        self.active.append(data, stored)
        self.next_offset = stored.last_offset + 1
        if h.producer_id >= 0:
            self._track_producer(h, batch, base, stored.last_offset, now_ms)
            self._appended_producers.add(h.producer_id)
        return data, stored

    def committed(self, end_offset: int) -> None:
        """The coordinator holds everything below end_offset."""
        if end_offset > self.high_watermark:
            self.high_watermark = end_offset
            self.txns.committed(end_offset)

    @property
    def last_stable_offset(self) -> int:
        """Where read_committed consumers stop: the first offset of the oldest transaction
        not yet decided and committed, or the high watermark."""
        return self.txns.last_stable_offset(self.high_watermark)

    def roll(self, now_ms: int) -> ActiveSegment | None:
        """Start a new active segment; the old one waits in `rolled` for upload, with the
        producer state as it ended (recovery restores it from the newest sealed segment)."""
        old = self.active
        if old.size == 0:
            return None
        self.active = ActiveSegment.create(self.directory, self.next_offset,
                                           index_interval_bytes=self.index_interval_bytes, now_ms=now_ms)
        self.rolled.append(old)
        snapshot = self.producers.snapshot()
        for pid, first in self.txns.snapshot().items():
            snapshot[pid]["txn"] = first  # kept in the table while open (see expire)
        self.producer_snapshots[old.base_offset] = snapshot
        aborted = self.txns.aborted_in(old.base_offset, old.next_offset)
        if aborted:
            self.txn_indexes[old.base_offset] = encode_txnindex(aborted)
        return old

    def segment_uploaded(self, seg: ActiveSegment, entry: SegmentEntry) -> None:
        self.sealed.append(entry)
        self.rolled.remove(seg)
        self.producer_snapshots.pop(seg.base_offset, None)
        self.txn_indexes.pop(seg.base_offset, None)
        seg.delete()

    # ---- read path ---------------------------------------------------------------------

    def local_segment_for(self, offset: int) -> ActiveSegment | None:
        for seg in (*self.rolled, self.active):
            if seg is not None and seg.base_offset <= offset < seg.next_offset:
                return seg
        return None

    async def read(self, offset: int, max_bytes: int, cache: RemoteCache, end: int | None = None) -> bytes:
        """Whole committed batches from the one containing `offset`: at least one batch,
        then more while they fit in max_bytes; none from `end` on (default: the high
        watermark; read_committed passes the last stable offset)."""
        end = self.high_watermark if end is None else min(end, self.high_watermark)
        if offset >= end or offset < self.log_start_offset:
            return b""
        seg = self.local_segment_for(offset)
        if seg is None:
            data, offset = await read_sealed_log(cache, self.sealed, offset, max_bytes, end)
            if data or offset >= end:
                return data
            seg = self.local_segment_for(offset)  # compaction emptied the sealed tail
            if seg is None:
                return b""
        return trim_batches(seg.read(offset, max_bytes), offset, end)

    async def offset_for_timestamp(self, ts: int, cache: RemoteCache) -> tuple[int, int] | None:
        """(offset, timestamp) of the first committed record with timestamp >= ts."""
        for entry in self.sealed:
            if entry.max_timestamp >= ts and entry.last_offset >= self.log_start_offset:
                idx = TimeIndex.from_bytes(entry.base_offset,
                                           await cache.get_small(entry.key_base + layout.TIMEINDEX))
                start = max(idx.lookup(ts), self.log_start_offset, entry.base_offset)
                found = await self._first_at_or_after(start, ts, cache, entry.last_offset + 1)
                if found is not None:
                    return found
        for seg in (*self.rolled, self.active):
            if seg is None or seg.size == 0 or seg.max_timestamp < ts:
                continue
            seg_start = seg.offset_for_timestamp(ts)
            if seg_start is not None:
                found = await self._first_at_or_after(max(seg_start, self.log_start_offset), ts, cache,
                                                      self.high_watermark)
                if found is not None:
                    return found
        return None

    async def _first_at_or_after(self, offset: int, ts: int, cache: RemoteCache,
                                 end: int) -> tuple[int, int] | None:
        while offset < min(end, self.high_watermark):
            data = await self.read(offset, 1024 * 1024, cache)
            if not data:
                return None
            batches, _ = scan_batches(data)
            for pos, h in batches:
                if h.max_timestamp >= ts:
                    for rec in decode_records(memoryview(data)[pos:pos + h.size]):
                        if rec.offset >= offset and rec.timestamp >= ts:
                            return rec.offset, rec.timestamp
                offset = h.last_offset + 1
        return None

    async def max_timestamp_offset(self, cache: RemoteCache) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3)."""
        best: tuple[int, int] | None = None  # (timestamp, -offset)
        offset = self.log_start_offset
        while offset < self.high_watermark:
            data = await self.read(offset, 4 * 1024 * 1024, cache)
            if not data:
                break
            batches, _ = scan_batches(data)
            for pos, h in batches:
                if best is None or h.max_timestamp > best[0]:
                    for rec in decode_records(memoryview(data)[pos:pos + h.size]):
                        if rec.timestamp == h.max_timestamp:
                            best = (rec.timestamp, -rec.offset)
                            break
                offset = h.last_offset + 1
        return None if best is None else (-best[1], best[0])

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= epoch, the offset where the next epoch starts) as Kafka defines it."""
        if not self.epochs or epoch < self.epochs[0][0]:
            return -1, -1
        if epoch >= self.epochs[-1][0]:
            return self.epochs[-1][0], self.next_offset
        for i, (e, _) in enumerate(self.epochs):
            if e > epoch:
                return self.epochs[i - 1][0], self.epochs[i][1]
        return self.epochs[-1][0], self.next_offset

    def close(self) -> None:
        for seg in (*self.rolled, self.active):
            if seg is not None:
                seg.close()


def _valid_prefix(r: WalRange, batches: list[tuple[int, BatchHeader]], valid: int) -> WalRange | None:
    """The whole, CRC-valid batches at the start of a damaged range, as a range."""
    if not batches:
        return None
    return WalRange(r.topic_id, r.partition, r.base_offset, batches[-1][1].last_offset, r.position, valid,
                    max(h.max_timestamp for _, h in batches), r.format_version)


async def _sealed_aborts(sealed: list[SegmentEntry], log_start_offset: int,
                        objects: ObjectStore) -> list[AbortedTxn]:
    """The aborted transactions listed by sealed segments' .txnindex objects."""
    out: list[AbortedTxn] = []
    for entry in sealed:
        if entry.aborted_txns and entry.last_offset >= log_start_offset:
            key = entry.key_base + layout.TXNINDEX
            out += [a for a in decode_txnindex(await objects.get(key), key)
                    if a.last_offset >= log_start_offset]
    return out


def trim_batches(data: bytes, offset: int, high_watermark: int) -> bytes:
    """Drop whole batches that end before `offset` or start at or after the HW."""
    if not data:
        return b""
    batches, valid = scan_batches(data)
    start = end = None
    for pos, h in batches:
        if h.last_offset < offset:
            continue
        if h.base_offset >= high_watermark:
            break
        if start is None:
            start = pos
        end = pos + h.size
    if start is None:
        return b""
    if start == 0 and end == len(data) and isinstance(data, bytes):
        return data
    return bytes(memoryview(data)[start:end])


async def read_sealed_log(cache: RemoteCache, sealed: list[SegmentEntry], offset: int, max_bytes: int,
                          high_watermark: int) -> tuple[bytes, int]:
    """Committed batches from the sealed segments, from the one holding `offset` (or the next
    one, where compaction left a gap); (b"", where the sealed segments end) if none remain."""
    for entry in sealed:
        if entry.last_offset < offset:
            continue
        data = await read_sealed(cache, entry, offset, max_bytes, high_watermark)
        if data:
            return data, offset
        # Compaction removed every batch from `offset` to the end of this segment:
        # the reader continues at the next one.
        offset = entry.last_offset + 1
    return b"", offset


async def read_sealed(cache: RemoteCache, entry: SegmentEntry, offset: int, max_bytes: int,
                      high_watermark: int) -> bytes:
    """Whole batches of a sealed segment from the one holding `offset`: at least one, then
    more while they fit in max_bytes; CRCs checked: damage in the first batch raises
    CorruptSegment, damage after it ends the read before it."""
    taken = 0

    def take(h: BatchHeader) -> Take:
        nonlocal taken
        if h.last_offset < offset:
            return Take.SKIP
        if h.base_offset >= high_watermark or (taken and taken + h.size > max_bytes):
            return Take.STOP
        taken += h.size
        return Take.TAKE

    async def get(g: Get) -> bytes:
        if g.start is None:
            return await cache.get_small(g.key)
        return await cache.read(g.key, g.start, g.end if g.end is not None else g.start)

    seg = SegmentObject(entry.key_base, entry.base_offset, entry.last_offset, entry.size)
    steps = walk(seg, take, seek_offset=offset, chunk_bytes=max(max_bytes, HEADER_SIZE), check_crc=True)
    intact: list[memoryview] = []
    try:
        async for b in read_async(steps, get):
            intact.append(b.data)
    except CorruptObject:
        if not intact:
            raise
        # The batches before the damage are served; the consumer's next fetch starts at
        # the damaged one and gets the error for it alone.
    return b"".join(intact)


def _most_of_a_writable_buffer(batch: memoryview) -> bool:
    """A batch to patch where it lies: a writable view of at least half of the buffer it
    is in. A kept view keeps its whole buffer alive while the active segment holds it
    unwritten (up to ActiveSegment.UNWRITTEN_LIMIT bytes of views), so that memory stays
    at most twice what the views hold."""
    if not isinstance(batch, memoryview) or batch.readonly:
        return False
    return 2 * batch.nbytes >= memoryview(batch.obj).nbytes
