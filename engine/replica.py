"""Warm standby replicas: committed data of partitions this gateway replicates but does
not lead, tailed from the object store into the local cache.

A replica never writes. It follows the coordinator's view of the partition (sealed
segments, committed WAL ranges, high watermark), reads what is new through the cache so a
failover or a follower fetch finds it warm, and serves fetches from consumers in its rack
(KIP-392) up to the committed high watermark. It follows transactions as a new leader
would rebuild them (the newest segment's open transactions and the segments' .txnindex,
then the markers and transactional batches of the WAL ranges), so read_committed
consumers read from it too, up to its last stable offset.
"""

from __future__ import annotations

import uuid

from stratalog.coordinator.model import ClusterStore, SegmentEntry, WalRange
from stratalog.tiering import layout
from stratalog.tiering.batch import check_range, scan_batches
from stratalog.tiering.remote import RemoteCache
from stratalog.tiering.txn import decode_txnindex, marker_commits
from stratalog.tiering.wal import check_version as check_wal_version

from .partition import read_sealed_log, trim_batches
from .transactions import PartitionTxns


class ReplicaView:
    def __init__(self, topic: str, topic_id: uuid.UUID, partition: int, leader_epoch: int = -1):
        self.topic = topic
        self.topic_id = topic_id
        self.partition = partition
        self.leader_epoch = leader_epoch  # the leader's, as the coordinator last said
        self.log_start_offset = 0
        self.high_watermark = 0
        self.sealed: list[SegmentEntry] = []
        self.wal: list[tuple[str, WalRange]] = []
        self.caught_up_at = float("-inf")  # monotonic seconds of the last complete catch-up
        self._warmed: set[tuple[str, int]] = set()
        self.txns = PartitionTxns()
        self._txns_from: tuple[str, ...] | None = None  # the sealed segments txns start from
        self._txns_applied = 0  # WAL offsets below this are in txns

    async def catch_up(self, store: ClusterStore, cache: RemoteCache, now: float) -> None:
        """Read everything committed so far into the cache."""
        state = await store.log_state(self.topic_id, self.partition)
        sealed = await store.segments(self.topic_id, self.partition)
        start = sealed[-1].last_offset + 1 if sealed else state.log_start_offset
        wal = await store.wal_ranges(self.topic_id, self.partition, start)
        for key, r in wal:
            check_wal_version(r.format_version, key)
            if (key, r.position) not in self._warmed:
                await cache.read(key, r.position, r.position + r.length)
                self._warmed.add((key, r.position))
        live = {(k, r.position) for k, r in wal}
        self._warmed &= live
        await self._follow_transactions(sealed, wal, cache, state.log_start_offset)
        self.sealed, self.wal = sealed, wal
        self.log_start_offset = state.log_start_offset
        self.high_watermark = state.high_watermark
        self.txns.committed(self.high_watermark)
        self.caught_up_at = now

    async def _follow_transactions(self, sealed: list[SegmentEntry], wal: list[tuple[str, WalRange]],
                                   cache: RemoteCache, log_start: int) -> None:
        bases = tuple(s.key_base for s in sealed)
        if bases != self._txns_from:  # new segments (or a compaction swap): start again from them
            txns = PartitionTxns()
            aborted = []
            for seg in sealed:
                if seg.aborted_txns and seg.last_offset >= log_start:
                    key = seg.key_base + layout.TXNINDEX
                    aborted += decode_txnindex(await cache.get_small(key), key)
            last = sealed[-1].producers if sealed else {}
            txns.restore({pid: e["txn"] for pid, e in last.items() if "txn" in e}, aborted)
            self.txns, self._txns_from = txns, bases
            self._txns_applied = sealed[-1].last_offset + 1 if sealed else 0
        for key, r in sorted(wal, key=lambda kr: kr[1].base_offset):
            if r.last_offset < self._txns_applied:
                continue
            data = await cache.read(key, r.position, r.position + r.length)
            batches, _ = scan_batches(data)
            for pos, h in batches:
                if h.base_offset < self._txns_applied or h.producer_id < 0:
                    continue
                if h.is_control:
                    self.txns.marker(h.producer_id, h.base_offset,
                                     marker_commits(memoryview(data)[pos:pos + h.size], h))
                elif h.is_transactional:
                    self.txns.data(h.producer_id, h.base_offset)
            self._txns_applied = max(self._txns_applied, r.last_offset + 1)

    @property
    def last_stable_offset(self) -> int:
        return self.txns.last_stable_offset(self.high_watermark)

    async def read(self, offset: int, max_bytes: int, cache: RemoteCache, end: int | None = None) -> bytes:
        """Committed batches from the one holding `offset`, as a leader would serve them
        (none from `end` on: default the high watermark)."""
        end = self.high_watermark if end is None else min(end, self.high_watermark)
        if offset >= end or offset < self.log_start_offset:
            return b""
        data = await self._read_wal(offset, max_bytes, cache, end)
        if data is not None:
            return data
        data, offset = await read_sealed_log(cache, self.sealed, offset, max_bytes, end)
        if data or offset >= end:
            return data
        # Compaction emptied the sealed tail: what follows is in the WAL ranges.
        return await self._read_wal(offset, max_bytes, cache, end) or b""

    async def _read_wal(self, offset: int, max_bytes: int, cache: RemoteCache, end: int) -> bytes | None:
        """Batches from the committed WAL range holding `offset`; None if no range holds it."""
        for key, r in self.wal:
            if r.base_offset <= offset <= r.last_offset:
                data = await cache.read(key, r.position, r.position + r.length)
                check_range(data, key, r.position)
                return _limit(trim_batches(data, offset, end), max_bytes)
        return None

def _limit(data: bytes, max_bytes: int) -> bytes:
    """At least one whole batch, then whole batches while they fit in max_bytes."""
    if len(data) <= max_bytes:
        return data
    batches, _ = scan_batches(data)
    end = 0
    for pos, h in batches:
        if end and pos + h.size > max_bytes:
            break
        end = pos + h.size
    return data[:end]
