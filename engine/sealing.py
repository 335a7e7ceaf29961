"""Sealing: rolled local segments uploaded with their sidecars, committed, and described
in a partition manifest.

A partition rolls its active segment at `segment.bytes`, or `segment.ms` after its first
record. The rolled segment waits until the WAL has committed all of it (the high watermark
passed its end), is uploaded as `<base>.log`, `.index`, `.timeindex` (and `.txnindex` when it holds abort
markers) under a unique key base, and its segment entry is committed under the leader epoch, which replaces the WAL
ranges it covers. Only then is it dropped locally and a new manifest written. Uploads that
are never committed are invisible; `cleanup.Cleaner` collects them.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

from stratalog.coordinator.model import ClusterStore, Fenced, SegmentEntry
from stratalog.tiering import layout
from stratalog.tiering.manifest import SegmentRecord, write_manifest
from stratalog.tiering.objectstore.base import ObjectStore
from stratalog.tiering.segment import ActiveSegment
from stratalog.tiering.txn import ENTRY_SIZE

from .partition import PartitionLog

log = logging.getLogger(__name__)

MANIFESTS_KEPT = 3


class Sealer:
    """Rolls, uploads and commits the segments of the partitions this gateway leads.

    Parameters
    ----------
    objects, store : the object store and the coordinator.
    topic_config : ``(topic, name) -> value`` of the topic's effective configs.
    now_ms : the wall clock in milliseconds.
    wait_for_data : waits (up to a timeout in seconds) for the next high-watermark advance.
    is_led : whether a PartitionLog is still the one this gateway leads.
    upload_slots : how many segments may stream to the store at once.
    """

    def __init__(self, objects: ObjectStore, store: ClusterStore, *,
                 topic_config: Callable[[str, str], Any], now_ms: Callable[[], int],
                 wait_for_data: Callable[[float], Awaitable[None]],
                 is_led: Callable[[PartitionLog], bool], upload_slots: int):
        self.objects = objects
        self.store = store
        self.topic_config = topic_config
        self.now_ms = now_ms
        self.wait_for_data = wait_for_data
        self.is_led = is_led
        self.uploading: dict[tuple[str, int], asyncio.Task] = {}
        self.uploading_bases: set[str] = set()  # segment key bases being uploaded/committed
        # However many partitions roll at once, only this many segments stream to the store.
        self._upload_slots = asyncio.Semaphore(upload_slots)
        self._manifest_versions: dict[tuple[str, int], int] = {}

    def maybe_roll(self, plog: PartitionLog, segment_bytes: int) -> None:
        """Roll when the active segment reached `segment_bytes` (the topic's segment.bytes)."""
        if plog.active.size >= segment_bytes:
            self.roll(plog)

    def roll_due(self, plog: PartitionLog) -> None:
        """Roll when `segment.bytes` or `segment.ms` (since the segment's first batch) says
        so (the timer's check)."""
        seg = plog.active
        if seg.size and self.now_ms() - plog.active_since_ms >= self.topic_config(plog.topic, "segment.ms"):
            self.roll(plog)
        else:
            self.maybe_roll(plog, self.topic_config(plog.topic, "segment.bytes"))

    def roll(self, plog: PartitionLog) -> None:
        if plog.roll(self.now_ms()) is None:
            return
        key = (plog.topic, plog.partition)
        if key not in self.uploading or self.uploading[key].done():
            self.uploading[key] = asyncio.create_task(self._upload_rolled(plog), name=f"seal-{key}")

    def cancel(self, key: tuple[str, int]) -> None:
        """Stop sealing a partition that is no longer ours."""
        task = self.uploading.pop(key, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        for t in list(self.uploading.values()):
            t.cancel()
        await asyncio.gather(*self.uploading.values(), return_exceptions=True)

    async def _upload_rolled(self, plog: PartitionLog) -> None:
        """Seal, upload and commit rolled segments of one partition, oldest first."""
        while plog.rolled:
            seg = plog.rolled[0]
            while plog.high_watermark < seg.next_offset:
                await self.wait_for_data(1.0)  # its last batches are still in the WAL buffer
                if not self.is_led(plog):
                    return
            try:
                entry = await self._upload_segment(plog, seg)
            except asyncio.CancelledError:
                raise
            except Fenced as e:
                # Leadership moved: the next sync drops this log; uploading again under the
                # old epoch would only make more objects that can never be committed.
                log.info("sealing %s-%d at %d fenced: %s", plog.topic, plog.partition,
                         seg.base_offset, e)
                return
            except Exception as e:  # noqa: BLE001 - retried on the next pass
                log.warning("sealing %s-%d at %d failed: %s", plog.topic, plog.partition,
                            seg.base_offset, e)
                await asyncio.sleep(1.0)
                continue
            plog.segment_uploaded(seg, entry)
            await self.write_manifest(plog)

    async def _upload_segment(self, plog: PartitionLog, seg: ActiveSegment) -> SegmentEntry:
        sealed = seg.seal()
        key_base = layout.segment_key_base(plog.topic, plog.topic_id, plog.partition,
                                           sealed.base_offset, plog.leader_epoch, uuid.uuid4().hex[:12])
        # Until committed these objects are unreferenced: keep the orphan sweep off them.
        self.uploading_bases.add(key_base)
        try:
            async with self._upload_slots:
                await self.objects.put_file(key_base + layout.LOG, Path(sealed.log_path))
                await self.objects.put(key_base + layout.INDEX, sealed.index_bytes)
                await self.objects.put(key_base + layout.TIMEINDEX, sealed.timeindex_bytes)
                txnindex = plog.txn_indexes.get(seg.base_offset, b"")
                if txnindex:
                    await self.objects.put(key_base + layout.TXNINDEX, txnindex)
            entry = SegmentEntry(sealed.base_offset, sealed.last_offset, key_base, sealed.size,
                                 sealed.min_timestamp, sealed.max_timestamp, plog.leader_epoch,
                                 plog.producer_snapshots.get(seg.base_offset, {}),
                                 aborted_txns=len(txnindex) // ENTRY_SIZE)
            await self.store.commit_segment(plog.topic_id, plog.partition, entry, plog.leader_epoch)
        finally:
            self.uploading_bases.discard(key_base)
        return entry

    async def write_manifest(self, plog: PartitionLog) -> None:
        """An Avro snapshot of the partition's segments, for Spark and disaster recovery."""
        key = (plog.topic, plog.partition)
        prefix = layout.partition_manifest_prefix(plog.topic, plog.topic_id, plog.partition)
        if key not in self._manifest_versions:
            existing = await self.objects.list(prefix)
            self._manifest_versions[key] = len(existing) and max(
                int(o.key.rsplit("/", 1)[1].split(".")[0]) for o in existing)
        version = self._manifest_versions[key] + 1
        self._manifest_versions[key] = version
        records = [segment_record(s) for s in plog.sealed]
        data = write_manifest(plog.topic, plog.topic_id, plog.partition, version,
                              plog.log_start_offset, records)
        await self.objects.put(layout.manifest_key(plog.topic, plog.topic_id, plog.partition, version), data)
        old = [o.key for o in await self.objects.list(prefix)]
        if len(old) > MANIFESTS_KEPT:
            await self.objects.delete(sorted(old)[:-MANIFESTS_KEPT])


def segment_record(s: SegmentEntry) -> SegmentRecord:
    """A segment entry as manifests describe it (with its transaction fields)."""
    open_txns = [e["txn"] for e in s.producers.values() if isinstance(e, dict) and "txn" in e]
    return SegmentRecord(s.base_offset, s.last_offset, s.key_base, s.size, s.min_timestamp,
                         s.max_timestamp, s.leader_epoch, s.aborted_txns, min(open_txns, default=-1))
