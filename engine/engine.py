"""`LogEngine`: the one entry point through which the gateway reads and writes partitions.

See the package docstring (`stratalog.engine`) for the operations and their contracts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterator

from stratalog.coordinator.model import ClusterStore, SegmentEntry, TopicInfo
from stratalog.tiering import layout
from stratalog.tiering.batch import BatchHeader
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.objectstore.base import ObjectStore
from stratalog.tiering.remote import RemoteCache
from stratalog.tiering.txn import AbortedTxn, marker_batch

from .cleanup import Cleaner
from .errors import (CorruptLog, CorruptRead, FencedLeaderEpoch, NotLeader,
                     PartitionOffline, StorageUnavailable, UnknownLeaderEpoch,
                     UnknownTopicOrPartition)
from .leadership import Assignment, Leadership
from .offline import Repaired, repair
from .partition import PartitionLog
from .replica import ReplicaView
from .sealing import Sealer
from .topic_settings import TopicSettings
from .validation import Batches, validate_batches
from .wal_writer import WalCommitFailed, WalWriter

REMOTE_CACHE_BYTES = 1024 * 1024 * 1024
WAL_FLUSH_MS_S3 = 200  # at most 5 WAL PUTs a second per gateway
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3
# KIP-405's tiered specs: the first offset held locally (after the sealed segments in the
# object store) and the last offset in the object store's sealed segments.
EARLIEST_LOCAL, LATEST_TIERED = -4, -5
_MAX_DAMAGE_TRACKED = 65536

log = logging.getLogger(__name__)

PartitionView = PartitionLog | ReplicaView


@dataclass
class EngineSettings:
    """The broker-wide settings the engine needs (topic configs come per topic)."""

    wal_flush_ms: int
    wal_flush_bytes: int
    upload_slots: int = 4
    remote_cache_bytes: int = -1  # -1: 1 GiB for s3://, no cache for file://
    replica_lag_max_ms: int = 30_000
    producer_id_expiration_ms: int = 86_400_000
    wal_fault_timeout_ms: int = 5_000

    @classmethod
    def from_config(cls, config) -> "EngineSettings":
        return cls(wal_flush_ms=config["wal.flush.ms"], wal_flush_bytes=config["wal.flush.bytes"],
                   upload_slots=config["remote.log.manager.copier.thread.pool.size"],
                   remote_cache_bytes=config["remote.cache.bytes"],
                   replica_lag_max_ms=config["replica.lag.time.max.ms"],
                   producer_id_expiration_ms=config["producer.id.expiration.ms"],
                   wal_fault_timeout_ms=config["wal.fault.timeout.ms"])


@dataclass
class AppendResult:
    """What an append did: where its first batch landed, and `commit`, which completes when
    every batch of it is committed (None when there was nothing new to wait for)."""

    base_offset: int
    log_start_offset: int
    bytes: int
    records: int
    commit: Awaitable[None] | None
    log_append_time: bool = False  # the topic stamps batches with the append time


def _flush_ms(spacing: int, objects: ObjectStore) -> int:
    if spacing >= 0:
        return spacing
    # A file store's flush is an fsync: flush back to back. An S3 flush is a paid PUT.
    return 0 if objects.url.startswith("file:") else WAL_FLUSH_MS_S3


def _cache_bytes(size: int, objects: ObjectStore) -> int:
    if size >= 0:
        return size
    # Reads from a file store are local disk reads already: a cache would copy them twice.
    return 0 if objects.url.startswith("file:") else REMOTE_CACHE_BYTES


class LogEngine:
    """The partitions one gateway leads or replicates, and the background work on them.

    Parameters
    ----------
    node_id : this gateway's id (names its WAL objects).
    data_dir : where local active segments and the read cache live (a cache: losing it
        loses nothing committed).
    store, objects : the coordinator and the object store.
    topic_info : ``name -> TopicInfo | None``, the topics as the gateway last loaded them.
    topic_config : ``(topic, name) -> value``, a topic's effective config.
    clock : wall clock in seconds (timestamps, segment.ms, retention).
    metrics : optional `GatewayMetrics`, told about WAL flushes.
    offline_reason : ``(topic, partition) -> str``, why the coordinator says the partition
        is offline ("" if it is not; see `offline.py`).
    """

    def __init__(self, settings: EngineSettings, *, node_id: int, data_dir: Path, store: ClusterStore,
                 objects: ObjectStore, topic_info: Callable[[str], TopicInfo | None],
                 topic_config: Callable[[str, str], Any], clock: Callable[[], float] = time.time,
                 metrics=None, offline_reason: Callable[[str, int], str] = lambda topic, p: ""):
        self.settings = settings
        self.node_id = node_id
        self.data_dir = data_dir
        self.store = store
        self.objects = objects
        self.topic_info = topic_info
        self.topic_config = topic_config
        self.topic_settings = TopicSettings(topic_info, topic_config)
        self.clock = clock
        self.offline_reason = offline_reason
        self.cache = RemoteCache(objects, data_dir / "cache",
                                 max_bytes=_cache_bytes(settings.remote_cache_bytes, objects))
        # Damaged batches refused so far, by topic (stratalog_corrupt_batches_total); each
        # (object, byte) counts once however often consumers retry it.
        self.corrupt_batches: dict[str, int] = {}
        self._damage_seen: set[tuple[str | None, int | None]] = set()
        self._hw_event = asyncio.Event()
        self.wal = WalWriter(node_id, objects, store, flush_ms=_flush_ms(settings.wal_flush_ms, objects),
                             flush_bytes=settings.wal_flush_bytes, on_committed=self._wal_committed,
                             on_fenced=self._fenced, metrics=metrics,
                             fault_timeout_ms=settings.wal_fault_timeout_ms)
        self.sealer = Sealer(objects, store, topic_config=topic_config, now_ms=self.now_ms,
                             wait_for_data=self.wait_for_data, is_led=self._is_led,
                             upload_slots=settings.upload_slots)
        self.leadership = Leadership(data_dir, store, objects, self.cache, self.wal, self.sealer,
                                     topic_config=topic_config, now_ms=self.now_ms,
                                     on_led=self._hw_event_fire)
        self.logs = self.leadership.logs
        self.cleaner = Cleaner(node_id, self.logs, objects, store, self.sealer, self.wal,
                               topic_config=topic_config, now_ms=self.now_ms)

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Continue this gateway's WAL sequence and start flushing."""
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        await self.wal.start()

    async def collect_orphan_wal_objects(self) -> None:
        """At start, before the first flush: every uncommitted WAL object of ours is garbage."""
        await self.cleaner.collect_orphan_wal_objects()

    async def stop(self, flush_timeout_s: float = 30) -> str | None:
        """Flush what is pending (for at most `flush_timeout_s`), then stop every background
        task and close the logs. Returns what the flush left uncommitted (None: nothing)."""
        await self.wal.stop(flush_timeout_s)
        await self.sealer.stop()
        await self.cleaner.stop()
        await self.leadership.stop()
        return self.wal.abandoned

    def work_in_progress(self) -> list[str]:
        """What a stop now would cut short, one phrase each (for the shutdown log)."""
        out = []
        wal = self.wal.pending_summary()
        if wal is not None:
            out.append(wal + (f" (storage failed: {self.wal.fault})" if self.wal.fault else ""))
        recovering = self.leadership.recovering()
        if recovering:
            out.append(f"{recovering} partition recoveries under way")
        return out

    # ---- leadership --------------------------------------------------------------------

    def take_leadership(self, leading: list[Assignment]) -> list[asyncio.Task]:
        """Lead exactly these partitions at their epochs, dropping the others now; returns
        the recoveries of new ones, under way in the background."""
        return self.leadership.take(leading)

    async def follow(self, replicating: list[Assignment]) -> set[str]:
        """Tail these partitions as a replica; returns "<topic id>/<partition>" of lagging ones."""
        return await self.leadership.follow(replicating, self.settings.replica_lag_max_ms / 1000)

    def found_offline(self) -> dict[tuple[str, int], str]:
        """Partitions this gateway found damaged, by (topic, partition): the reason."""
        return {key: reason for key, (_, reason) in self.leadership.offline.items()}

    async def repair(self, topic: str, topic_id: uuid.UUID, partition: int, *, truncate: bool) -> Repaired:
        """An operator's recovery of an offline partition (see `offline.repair`): recover
        it again, or with `truncate` give up what cannot be read."""
        return await repair(self.store, self.objects, self.data_dir / "repair" / f"{topic}-{partition}",
                            topic, topic_id, partition,
                            index_interval_bytes=self.topic_config(topic, "index.interval.bytes"),
                            now_ms=self.now_ms(), truncate=truncate)

    def led(self) -> dict[tuple[str, int], PartitionLog]:
        """The partitions led now, by (topic, partition)."""
        return self.logs

    # ---- the one leader check ----------------------------------------------------------

    def partition(self, topic: str, partition: int, current_leader_epoch: int = -1, *,
                  followers: bool = False) -> PartitionView:
        """The partition as served here, after the checks every request makes.

        Raises UnknownTopicOrPartition (no such partition), PartitionOffline (its data
        could not be recovered), NotLeader (not led here, nor replicated when `followers`
        allows a replica), FencedLeaderEpoch or UnknownLeaderEpoch (the client's epoch, when
        it gave one >= 0, differs from ours; a replica compares the leader's epoch).
        """
        view: PartitionView | None = self.logs.get((topic, partition))
        if view is None:
            # Before any replica: what it tailed of an offline partition is no better.
            found = self.leadership.offline.get((topic, partition))
            reason = found[1] if found else self.offline_reason(topic, partition)
            if reason:
                raise PartitionOffline(f"{topic}-{partition} is offline: {reason}")
        if view is None and followers:
            view = self.leadership.replicas.get((topic, partition))
        if view is None:
            info = self.topic_info(topic)
            if info is None or not 0 <= partition < info.partitions:
                raise UnknownTopicOrPartition(f"{topic}-{partition} does not exist")
            raise NotLeader(f"{topic}-{partition} is not led by gateway {self.node_id}")
        epoch = view.leader_epoch
        if current_leader_epoch >= 0 and current_leader_epoch != epoch:
            if current_leader_epoch < epoch:
                raise FencedLeaderEpoch(f"{topic}-{partition}: epoch {current_leader_epoch} < {epoch}")
            raise UnknownLeaderEpoch(f"{topic}-{partition}: epoch {current_leader_epoch} > {epoch}")
        return view

    def leader(self, topic: str, partition: int, current_leader_epoch: int = -1) -> PartitionLog:
        """The partition's log, if led here (see `partition` for what it raises)."""
        view = self.partition(topic, partition, current_leader_epoch)
        assert isinstance(view, PartitionLog)
        return view

    def high_watermark(self, topic: str, partition: int) -> int | None:
        plog = self.logs.get((topic, partition))
        return None if plog is None else plog.high_watermark

    # ---- write path --------------------------------------------------------------------

    def append(self, topic: str, partition: int, records: Batches | bytes | memoryview, *,
               now_ms: int) -> AppendResult:
        """Validate and append one partition's record batches (runs without awaiting, so
        requests on one connection append in order). `records` may be split already
        (`Batches.split`): their headers are then not parsed again.

        Retried idempotent batches are not appended again: they answer with their original
        offset and wait for their original commit.
        """
        plog = self.leader(topic, partition)
        self._check_storage()
        settings = self.topic_settings.append(topic)
        batches = validate_batches(records, max_bytes=settings.max_message_bytes, compacted=settings.compacted,
                                   timestamps=settings.timestamp_bounds(now_ms))
        log_append = settings.log_append_time
        commit: Awaitable[None] | None = None
        base = -1
        nbytes = nrecords = 0
        for h, view in batches:
            nbytes += len(view)
            nrecords += h.records_count
            original = plog.check_duplicate(h) if h.producer_id >= 0 else None
            if original is not None:
                if base < 0:
                    base = original.base_offset
                commit = self._committed_past(plog, original.last_offset)
                continue
            data, stored = _local_write(plog, view, h, now_ms, log_append)
            if base < 0:
                base = stored.base_offset
            commit = self.wal.add(plog, stored.base_offset, stored.last_offset, stored.max_timestamp, data)
        self.sealer.maybe_roll(plog, settings.segment_bytes)
        return AppendResult(base, plog.log_start_offset, nbytes, nrecords, commit, log_append)

    def write_marker(self, topic: str, partition: int, producer_id: int, producer_epoch: int, *,
                     commit: bool, coordinator_epoch: int = 0) -> Awaitable[None]:
        """End a producer's transaction on a partition led here with a commit or abort
        marker (fenced by the leader epoch through the WAL commit like any append); the
        result completes once the marker is committed. A marker for a transaction not open
        here (never written to, or ended already) appends nothing and completes when what
        is appended so far is committed; one from an epoch older than the producer's
        appends nothing."""
        plog = self.leader(topic, partition)
        self._check_storage()
        known = plog.producers.producers.get(producer_id)
        if producer_id not in plog.txns.open or (known is not None and producer_epoch < known.epoch):
            return self._committed_past(plog, plog.next_offset - 1)
        batch = marker_batch(producer_id, producer_epoch, commit=commit,
                             coordinator_epoch=coordinator_epoch, timestamp_ms=self.now_ms())
        h = BatchHeader.parse(batch, 0)
        data, stored = _local_write(plog, memoryview(batch), h, self.now_ms(), False)
        commit_done = self.wal.add(plog, stored.base_offset, stored.last_offset, stored.max_timestamp, data)
        self.sealer.maybe_roll(plog, self.topic_settings.append(topic).segment_bytes)
        return commit_done

    def storage_fault(self) -> str | None:
        """Why the WAL cannot be written now (past the fault bound), or None."""
        return self.wal.fault

    def _check_storage(self) -> None:
        # Refused before anything is appended: the client's retry can never duplicate it.
        if self.wal.fault is not None:
            raise StorageUnavailable(f"not appended, retry later: {self.wal.fault}")

    async def _committed_past(self, plog: PartitionLog, last_offset: int) -> None:
        """A retried batch's commit: done when the original is committed, failed when the
        partition was dropped first (the original's flush was fenced)."""
        while plog.high_watermark <= last_offset:
            if not self._is_led(plog):
                raise WalCommitFailed(f"{plog.topic}-{plog.partition}: leadership moved before "
                                      "the original batch was committed")
            await self.wait_for_data(1.0)

    def _wal_committed(self, logs: dict, ranges: list) -> None:
        ends: dict[tuple[uuid.UUID, int], int] = {}
        for r in ranges:
            k = (r.topic_id, r.partition)
            ends[k] = max(ends.get(k, 0), r.last_offset + 1)
        for k, end in ends.items():
            plog = logs.get(k)
            if plog is not None:
                plog.committed(end)
        self._hw_event_fire()

    def _fenced(self, keys: list[tuple[uuid.UUID, int]]) -> None:
        """A flush was fenced: some partition in it has a new leader. Every partition whose
        batches were in it (or queued behind it) now holds uncommitted batches in its local
        segment, so all are dropped; the next sync re-takes those still ours, rebuilding
        them from the object store."""
        self.leadership.drop_by_id(keys)
        self._hw_event_fire()  # retried batches waiting on a dropped partition fail now

    def _is_led(self, plog: PartitionLog) -> bool:
        return self.logs.get((plog.topic, plog.partition)) is plog

    # ---- read path ---------------------------------------------------------------------

    async def read(self, view: PartitionView, offset: int, max_bytes: int, *,
                   read_committed: bool = False) -> bytes:
        """Whole committed batches from the one holding `offset`: at least one, then more
        while they fit in `max_bytes`; with `read_committed`, none from the last stable
        offset on. A damaged object raises CorruptRead: its bytes are never served, and only
        this partition's read fails."""
        with self._damage_refused(view, CorruptRead):
            if read_committed:
                return await view.read(offset, max_bytes, self.cache, view.last_stable_offset)
            return await view.read(offset, max_bytes, self.cache)

    @staticmethod
    def aborted_transactions(view: PartitionView, offset: int) -> list[AbortedTxn]:
        """Aborted transactions a read_committed fetch from `offset` must skip."""
        return view.txns.aborted_between(offset, view.last_stable_offset)

    async def list_offset(self, plog: PartitionLog, timestamp: int, *,
                          read_committed: bool = False) -> tuple[int, int] | None:
        """(offset, timestamp) for ListOffsets: LATEST (-1; the last stable offset for
        read_committed), EARLIEST (-2), EARLIEST_LOCAL (-4) and LATEST_TIERED (-5; -1 when
        nothing is sealed yet) with timestamp -1, MAX_TIMESTAMP (-3), or the first record
        at or after a timestamp; None if none."""
        if timestamp == LATEST:
            return (plog.last_stable_offset if read_committed else plog.high_watermark), -1
        if timestamp == EARLIEST:
            return plog.log_start_offset, -1
        if timestamp == EARLIEST_LOCAL:
            return max(plog.log_start_offset, plog.sealed[-1].last_offset + 1 if plog.sealed else 0), -1
        if timestamp == LATEST_TIERED:
            return (plog.sealed[-1].last_offset if plog.sealed else -1), -1
        with self._damage_refused(plog, CorruptLog):
            if timestamp == MAX_TIMESTAMP:
                return await plog.max_timestamp_offset(self.cache)
            return await plog.offset_for_timestamp(timestamp, self.cache)

    @contextlib.contextmanager
    def _damage_refused(self, view: PartitionView, error: type[CorruptLog]) -> Iterator[None]:
        """A damaged object met while reading becomes `error`: its bytes are never served,
        nothing of it stays in the cache (a copy damaged on the way is fetched again next
        time), it is counted, and only this partition's request fails."""
        try:
            yield
        except CorruptObject as exc:
            if exc.key is not None:
                self.cache.invalidate(exc.key)
            where = (exc.key, exc.position)
            if where not in self._damage_seen:
                if len(self._damage_seen) >= _MAX_DAMAGE_TRACKED:
                    self._damage_seen.clear()
                self._damage_seen.add(where)
                self.corrupt_batches[view.topic] = self.corrupt_batches.get(view.topic, 0) + 1
                log.error("%s-%d: not serving damaged data (object %s, byte %s, offset %s): %s",
                          view.topic, view.partition, exc.key, exc.position, exc.offset, exc)
            else:  # a consumer retrying the same range: logged once above
                log.debug("%s-%d: still damaged: %s", view.topic, view.partition, exc)
            raise error(f"{view.topic}-{view.partition}: {exc}") from exc

    def _hw_event_fire(self) -> None:
        self._hw_event.set()
        self._hw_event = asyncio.Event()

    async def wait_for_data(self, timeout_s: float) -> None:
        """Wake on the next high-watermark advance (fetch long poll), or time out."""
        ev = self._hw_event
        try:
            await asyncio.wait_for(ev.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass

    # ---- removing data -----------------------------------------------------------------

    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move the log start offset (DeleteRecords; -1 means the high watermark); returns it."""
        try:
            plog = self.leader(topic, partition)
        except NotLeader:
            raise UnknownTopicOrPartition(f"{topic}-{partition} is not led here") from None
        return await self.cleaner.delete_records(plog, offset)

    async def replace_segments(self, topic: str, partition: int, remove: list[int],
                               add: list[SegmentEntry], expect_keys: list[str] | None = None) -> None:
        """Swap sealed segments for their compacted rewrite (see `Cleaner.replace_segments`)."""
        plog = self.logs.get((topic, partition))
        if plog is None:
            raise NotLeader(f"{topic}-{partition} is not led here")
        await self.cleaner.replace_segments(plog, remove, add, expect_keys)

    def drop_partitions(self, info: TopicInfo) -> None:
        """Stop serving a topic that is being deleted, and remove its local files."""
        self.topic_settings.forget(info.name)
        for p in range(info.partitions):
            plog = self.leadership.drop((info.name, p), forget=True)
            if plog is not None:
                shutil.rmtree(plog.directory, ignore_errors=True)

    async def delete_objects(self, info: TopicInfo) -> None:
        """Delete a deleted topic's objects (the coordinator no longer names them, so this
        may trail behind the deletion)."""
        for prefix in layout.topic_prefixes(info.name, info.topic_id):
            objs = await self.objects.list(prefix)
            if objs:
                await self.objects.delete([o.key for o in objs])
        self.cache.invalidate(layout.topic_prefixes(info.name, info.topic_id)[0])

    # ---- background work ---------------------------------------------------------------

    def roll_due(self) -> None:
        """Roll every led partition whose active segment reached segment.bytes or segment.ms."""
        for plog in list(self.logs.values()):
            self.sealer.roll_due(plog)

    async def collect_obsolete_wal_objects(self) -> None:
        """The WAL part of `clean` that a gateway runs more often: objects whose every range
        is sealed, deleted or below its log start, looked for when a segment, log start or
        topic changed since the last look."""
        await self.cleaner.collect_obsolete_wal_objects(when_settled_moved=True)

    async def clean(self) -> None:
        """Retention, WAL and segment garbage collection, idle producer expiry."""
        await self.cleaner.apply_retention()
        await self.cleaner.collect_wal_garbage()
        await self.cleaner.collect_segment_orphans()
        now_ms = self.now_ms()
        for plog in self.logs.values():
            plog.producers.expire(now_ms, self.settings.producer_id_expiration_ms, keep=plog.txns.open)
            plog.txns.forget_before(plog.log_start_offset)


def _local_write(plog: PartitionLog, batch: memoryview, h: BatchHeader, now_ms: int,
                 log_append_time: bool) -> tuple[bytearray | memoryview, BatchHeader]:
    """`plog.append`. A local segment write that fails (the data directory's disk full or
    read-only) appends nothing: the segment writes the runs of batches it holds before
    taking a new one, from its own size, so a failed write is done again by the next. The
    producer may retry."""
    try:
        return plog.append(batch, h, now_ms=now_ms, log_append_time=log_append_time)
    except OSError as e:
        raise StorageUnavailable(f"not appended, retry later: local segment write failed: {e}") from e


__all__ = ["AppendResult", "Assignment", "CorruptLog", "CorruptRead", "EngineSettings", "LogEngine",
           "PartitionView", "Repaired"]
