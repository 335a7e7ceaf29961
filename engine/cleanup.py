"""Removing data: retention, DeleteRecords, compaction swaps and garbage collection.

Every removal commits to the coordinator first and deletes objects after, so a reader
never finds an entry whose object is gone (swapped-out segments even wait out a grace
period for reads already under way). Objects that no entry names, from fenced or
interrupted uploads, are collected by sweeps that never touch an upload still in flight.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

from stratalog.coordinator.model import ClusterStore, SegmentEntry, WalObject
from stratalog.tiering import layout
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore

from .errors import OffsetOutOfRange, SwapRefused
from .partition import PartitionLog
from .sealing import Sealer
from .wal_writer import WalWriter

log = logging.getLogger(__name__)

SWAPPED_OBJECT_GRACE_S = 30.0
SEGMENT_EXTENSIONS = (layout.LOG, layout.INDEX, layout.TIMEINDEX)
# Every object a segment may have: the .txnindex exists only where aborts were sealed.
SEGMENT_OBJECTS = (*SEGMENT_EXTENSIONS, layout.TXNINDEX)


def segment_base(key: str) -> str | None:
    """The key base of a segment object key, or None for anything else."""
    for ext in SEGMENT_OBJECTS:
        if key.endswith(ext):
            return key[:-len(ext)]
    return None


class Cleaner:
    """Retention, DeleteRecords, compaction swaps and garbage collection of one gateway's
    partitions (`logs`, shared with the engine) and of its own WAL objects."""

    def __init__(self, node_id: int, logs: dict[tuple[str, int], PartitionLog], objects: ObjectStore,
                 store: ClusterStore, sealer: Sealer, wal: WalWriter, *,
                 topic_config: Callable[[str, str], Any], now_ms: Callable[[], int],
                 swap_grace_s: float = SWAPPED_OBJECT_GRACE_S):
        self.node_id = node_id
        self.logs = logs
        self.objects = objects
        self.store = store
        self.sealer = sealer
        self.wal = wal
        self.topic_config = topic_config
        self.now_ms = now_ms
        self.swap_grace_s = swap_grace_s
        self._swapped_bases: set[str] = set()  # replaced segments waiting out their grace
        self._segment_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._orphan_candidates: set[str] = set()
        self._wal_settled_seen: int | None = None  # as of the last obsolete WAL search that ended
        self._tasks: set[asyncio.Task] = set()

    async def stop(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    # ---- retention and DeleteRecords ---------------------------------------------------

    async def apply_retention(self) -> None:
        """Move each `delete` partition's log start past sealed segments that are older
        than `retention.ms` or beyond `retention.bytes`."""
        now_ms = self.now_ms()
        for plog in list(self.logs.values()):
            retention_ms = self.topic_config(plog.topic, "retention.ms")
            retention_bytes = self.topic_config(plog.topic, "retention.bytes")
            if "delete" not in self.topic_config(plog.topic, "cleanup.policy"):
                continue
            new_start = plog.log_start_offset
            total = plog.size_bytes
            for s in plog.sealed:
                expired = retention_ms >= 0 and s.max_timestamp < now_ms - retention_ms
                too_big = retention_bytes >= 0 and total - s.size >= retention_bytes
                if not (expired or too_big):
                    break
                total -= s.size
                new_start = s.last_offset + 1
            if new_start > plog.log_start_offset:
                await self._move_log_start(plog, new_start)

    async def delete_records(self, plog: PartitionLog, offset: int) -> int:
        """Move the log start offset (DeleteRecords); -1 means the high watermark."""
        if offset == -1:
            offset = plog.high_watermark
        if offset < 0 or offset > plog.high_watermark:
            raise OffsetOutOfRange(f"offset {offset} is outside 0..{plog.high_watermark}")
        if offset > plog.log_start_offset:
            await self._move_log_start(plog, offset)
        return plog.log_start_offset

    async def _move_log_start(self, plog: PartitionLog, offset: int) -> None:
        await self.store.set_log_start_offset(plog.topic_id, plog.partition, offset)
        plog.log_start_offset = offset
        gone = [s for s in plog.sealed if s.last_offset < offset]
        if not gone:
            return
        await self.store.delete_segments(plog.topic_id, plog.partition, [s.base_offset for s in gone])
        plog.sealed = [s for s in plog.sealed if s.last_offset >= offset]
        await self.sealer.write_manifest(plog)
        await self.objects.delete([s.key_base + ext for s in gone for ext in SEGMENT_OBJECTS])

    # ---- compaction swaps --------------------------------------------------------------

    async def replace_segments(self, plog: PartitionLog, remove: list[int], add: list[SegmentEntry],
                               expect_keys: list[str] | None = None) -> None:
        """Swap sealed segments for their compacted rewrite, atomically.

        The rewrite must cover only offsets of the segments it replaces; the old objects are
        deleted after a grace period so that reads already under way can finish.
        """
        by_base = {s.base_offset: s for s in plog.sealed}
        missing = [b for b in remove if b not in by_base]
        if missing or not remove:
            raise SwapRefused(f"segments {missing or remove} are not (or no longer) in the log")
        removed = [by_base[b] for b in remove]
        if expect_keys is not None and sorted(expect_keys) != sorted(s.key_base for s in removed):
            raise SwapRefused("the segments were rewritten since the job read them")
        lo = min(s.base_offset for s in removed)
        hi = max(s.last_offset for s in removed)
        if any(a.base_offset < lo or a.last_offset > hi or a.base_offset > a.last_offset for a in add):
            raise SwapRefused(f"new segments must lie within offsets {lo}-{hi}")
        own = layout.partition_segment_prefix(plog.topic, plog.topic_id, plog.partition)
        foreign = [a.key_base for a in add if not a.key_base.startswith(own) or "/" in a.key_base[len(own):]]
        if foreign:
            # Another partition's or topic's objects would be served as this partition's,
            # past the topic ACLs that guard them.
            raise SwapRefused(f"new segments must be objects of this partition (under {own}), "
                              f"not {foreign[0]}")
        if removed[-1] is plog.sealed[-1] and add:
            # Recovery restores producer state from the newest segment: keep it there.
            last = max(add, key=lambda a: a.last_offset)
            add = [a if a is not last else SegmentEntry(**{**a.__dict__, "producers": removed[-1].producers})
                   for a in add]
        # Under the lock the orphan sweep holds: a rewrite it already collected (uploaded
        # too long before this swap) is refused here instead of committed as a dangling entry.
        key = (plog.topic, plog.partition)
        async with self._segment_lock(key):
            for a in add:
                for ext in SEGMENT_EXTENSIONS:
                    try:
                        await self.objects.size(a.key_base + ext)
                    except ObjectNotFound:
                        raise SwapRefused(f"segment object {a.key_base + ext} does not exist; "
                                          "upload the rewrite again") from None
            try:
                await self.store.replace_segments(plog.topic_id, plog.partition, remove, add)
            except Exception as e:  # noqa: BLE001 - a concurrent change wins; the caller retries
                raise SwapRefused(f"swap refused: {e}") from None
        plog.sealed = sorted([s for s in plog.sealed if s.base_offset not in remove] + add,
                             key=lambda s: s.base_offset)
        await self.sealer.write_manifest(plog)
        bases = [s.key_base for s in removed]
        self._swapped_bases.update(bases)
        task = asyncio.create_task(self._delete_later(bases), name="delete-swapped")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _delete_later(self, bases: list[str]) -> None:
        await asyncio.sleep(self.swap_grace_s)
        await self.objects.delete([b + ext for b in bases for ext in SEGMENT_OBJECTS])
        self._swapped_bases.difference_update(bases)

    def _segment_lock(self, key: tuple[str, int]) -> asyncio.Lock:
        return self._segment_locks.setdefault(key, asyncio.Lock())

    # ---- garbage collection ------------------------------------------------------------

    async def collect_wal_garbage(self) -> None:
        """Delete WAL objects whose every range is sealed, deleted or below the log start,
        and this gateway's uploads that were never committed."""
        await self.collect_obsolete_wal_objects()
        await self.collect_orphan_wal_objects(self.wal.settled_below())

    async def collect_obsolete_wal_objects(self, when_settled_moved: bool = False) -> None:
        """Delete WAL objects whose every range is sealed, deleted or below the log start.
        `when_settled_moved`: only if a segment, log start or topic changed since the last
        pass that ended (the search walks every WAL object the gateway knows; a frequent
        pass on an idle log would repeat it for nothing). What that skips (an object kept
        as its gateway's newest until a later one commits) waits for the next pass."""
        settled = await self.store.wal_settled_revision()
        if when_settled_moved and settled == self._wal_settled_seen:
            return
        obsolete = await self.store.obsolete_wal_objects()
        carriers = proof_carriers(await self.store.wal_objects(), obsolete)
        obsolete = [o for o in obsolete if (o.gateway_id, o.sequence) not in carriers]
        if obsolete:
            # Objects first: an obsolete entry is never read, so one left behind by a failed
            # delete below is harmless and retried next pass, whereas an object whose entry
            # went first would be referenced by nothing and never collected.
            await self.objects.delete([o.key for o in obsolete])
            await self.store.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
        self._wal_settled_seen = settled

    async def collect_orphan_wal_objects(self, below: int | None = None) -> None:
        """WAL objects of this gateway that were uploaded but never committed are invisible:
        any with a sequence under `below` (all, at start before the first flush) is garbage,
        whether its flush was fenced or the process died between upload and commit."""
        committed = {o.key for o in await self.store.wal_objects()}
        orphans = []
        for o in await self.objects.list(layout.wal_prefix(self.node_id)):
            try:
                seq = layout.parse_wal_key(o.key).sequence
            except ValueError:
                continue
            if o.key not in committed and (below is None or seq < below):
                orphans.append(o.key)
        if orphans:
            log.info("removing %d uncommitted WAL object(s)", len(orphans))
            await self.objects.delete(orphans)

    async def collect_segment_orphans(self) -> None:
        """Delete segment objects of the partitions we lead that no segment entry names:
        uploads whose commit was fenced, that failed half way, or whose gateway died before
        committing, and sealed segments whose entry was dropped but whose objects were not.

        An object is collected only when two passes in a row found it unreferenced, so a
        rewrite uploaded by a compaction job has a whole retention-check interval to be
        swapped in (and the swap, under the same lock, refuses objects already collected).
        Our own uploads in progress and swapped-out segments in their read grace are skipped."""
        previous, candidates = self._orphan_candidates, set()
        for key, plog in list(self.logs.items()):
            prefix = layout.partition_segment_prefix(plog.topic, plog.topic_id, plog.partition)
            async with self._segment_lock(key):
                if self.logs.get(key) is not plog:
                    continue
                listed = await self.objects.list(prefix)
                if not listed:
                    continue
                # Read after listing: anything committed meanwhile is seen as referenced.
                referenced = {s.key_base for s in await self.store.segments(plog.topic_id, plog.partition)}
                doomed = []
                for o in listed:
                    base = segment_base(o.key)
                    if base is None or base in referenced or base in self.sealer.uploading_bases \
                            or base in self._swapped_bases:
                        continue
                    if o.key in previous:
                        doomed.append(o.key)
                    else:
                        candidates.add(o.key)
                if doomed:
                    log.info("%s-%d: removing %d uncommitted segment object(s)", plog.topic,
                             plog.partition, len(doomed))
                    await self.objects.delete(doomed)
        self._orphan_candidates = candidates


def proof_carriers(committed: list[WalObject], obsolete: list[WalObject]) -> set[tuple[int, int]]:
    """(gateway, sequence) of each gateway's newest committed WAL object while an older one
    of the same gateway is still needed: only a later object of its gateway confirms an
    object's commit (engine.wal_writer), which `recover --from-bucket` relies on, so it is
    kept even when its own ranges are all sealed."""
    gone = {(o.gateway_id, o.sequence) for o in obsolete}
    newest: dict[int, int] = {}
    for o in committed:
        newest[o.gateway_id] = max(newest.get(o.gateway_id, -1), o.sequence)
    return {(o.gateway_id, newest[o.gateway_id]) for o in committed
            if (o.gateway_id, o.sequence) not in gone and o.sequence < newest[o.gateway_id]}
