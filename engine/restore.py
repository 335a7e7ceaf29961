"""Restoring a coordinator backup (coordinator.backup) into an empty cluster.

The backup's keys are first loaded into a scratch embedded coordinator, where they are
brought in line with today's object store and moved forward through the cluster model's
own operations; only the result is written to the target, once, topics last
(`KVClusterStore.write_keyspace`). What changes on the way, and why:

- Objects. Every object a partition still needs (the `.log`, `.index`, `.timeindex` and
  `.txnindex` of its segments from the log start on, the WAL objects of its unsealed
  ranges) must be in the store: since the backup was taken, WAL objects may have been
  collected after their ranges were sealed, and segments removed by retention or
  compaction. A partition missing some is rebuilt from its newest readable Avro manifest
  when that lists segments, all present, up to the backup's high watermark or beyond
  (sealed records acknowledged after the backup come back too); otherwise it is restored
  offline (engine.offline) with a reason naming the missing object, never served as if
  whole. `stratalog partitions recover` then decides, as for any damaged partition.
- Leader epochs. Every partition's epoch (its epoch key and its state's) moves forward by
  EPOCH_MARGIN and its leader is cleared (the controller elects one), which rewrites
  `fence_generation`: a gateway still leading from after the backup compares an older
  epoch and is fenced, unless its partition changed leader EPOCH_MARGIN times since.
- Producer ids. The allocator moves forward by PRODUCER_ID_MARGIN, so no producer id
  handed out after the backup is handed out again.
- Transactional ids. Their producers are fenced: each epoch moves forward by one with no
  earlier epoch accepted, so a producer that ran on past the backup gets PRODUCER_FENCED
  instead of continuing a history the restored cluster does not have; a transaction open
  in the backup is restored as aborting (the gateways write its abort markers, as for a
  timed-out one). A transaction already deciding (Prepare*) is left to finish as decided.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.coordinator import open_coordinator
from stratalog.coordinator.backup import Backup
from stratalog.coordinator.kv import UnsupportedFormat, unsupported_version
from stratalog.coordinator.model import PartitionState, SegmentEntry, TopicInfo
from stratalog.coordinator.store import KEYSPACE_VERSION, OLDEST_READABLE_KEYSPACE, KVClusterStore
from stratalog.coordinator.transactions import TxnStatus
from stratalog.tiering import layout
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.errors import UnsupportedFormat as UnsupportedObjectFormat
from stratalog.tiering.manifest import Manifest, read_manifest
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore

EPOCH_MARGIN = 100_000  # leader epochs are int32: room for some 21,000 restores
PRODUCER_ID_MARGIN = 1 << 32  # producer ids are int64
MAX_PRODUCER_EPOCH = 0x7FFF - 1  # past it a producer takes a new id (Kafka's rule)

COMPLETE, REBUILT, OFFLINE = "complete", "rebuilt", "offline"


@dataclass(frozen=True)
class PartitionOutcome:
    """What the restore did with one partition: COMPLETE (every object there), REBUILT
    (from a manifest) or OFFLINE (with the reason), and the details."""

    topic: str
    partition: int
    status: str
    detail: str = ""


@dataclass
class RestoreReport:
    partitions: list[PartitionOutcome] = field(default_factory=list)
    producers_fenced: int = 0
    transactions_aborted: int = 0
    next_producer_id: int = 0


async def restore(backup: Backup, target: KVClusterStore, objects: ObjectStore,
                  scratch_dir: Path) -> RestoreReport:
    """Restore `backup` into the empty cluster of `target`, checking the objects it needs
    in `objects`; `scratch_dir` (empty, removed by the caller) holds the scratch
    coordinator."""
    if not OLDEST_READABLE_KEYSPACE <= backup.keyspace_version <= KEYSPACE_VERSION:
        raise UnsupportedFormat(unsupported_version(
            "the backup's coordinator keyspace", backup.keyspace_version,
            OLDEST_READABLE_KEYSPACE, KEYSPACE_VERSION))
    await target.check_empty()  # before any work, and again when writing
    scratch = open_coordinator(None, scratch_dir, target.cluster)
    try:
        await scratch.write_keyspace(backup.keys)
        report = RestoreReport()
        keys = await settle(scratch, objects, report)
    finally:
        await scratch.close()
    await target.write_keyspace(keys)
    return report


async def settle(scratch: KVClusterStore, objects: ObjectStore, report: RestoreReport
                 ) -> list[tuple[str, bytes]]:
    """Check the scratch cluster's objects, move epochs and producer ids forward and fence
    transactional producers (module docstring); the keys to write into the target."""
    offline = await _check_partitions(scratch, objects, report)
    await _move_epochs(scratch, offline)
    report.next_producer_id = await scratch.allocate_producer_ids(PRODUCER_ID_MARGIN) + PRODUCER_ID_MARGIN
    await _fence_producers(scratch, report)
    _, keys = await scratch.read_keyspace()
    return keys


class _Present:
    """Which objects exist, by listing each folder once (a LIST per partition rather than
    a HEAD per object)."""

    def __init__(self, objects: ObjectStore):
        self.objects = objects
        self._folders: dict[str, set[str]] = {}

    async def __call__(self, key: str) -> bool:
        folder = key.rsplit("/", 1)[0] + "/"
        if folder not in self._folders:
            self._folders[folder] = {o.key for o in await self.objects.list(folder)}
        return key in self._folders[folder]


def _segment_keys(s: SegmentEntry) -> list[str]:
    keys = [s.key_base + ext for ext in layout.SEGMENT_EXTENSIONS]
    return keys + [s.key_base + layout.TXNINDEX] if s.aborted_txns else keys


async def _first_missing(segments: list[SegmentEntry], wal_keys: list[str], log_start: int,
                         present: _Present) -> str | None:
    for s in segments:
        if s.last_offset < log_start:
            continue  # below the log start: never read, and retention removes it anyway
        for key in _segment_keys(s):
            if not await present(key):
                return key
    for key in wal_keys:
        if not await present(key):
            return key
    return None


async def _check_partitions(store: KVClusterStore, objects: ObjectStore,
                            report: RestoreReport) -> dict[tuple[uuid.UUID, int], str]:
    """Check every partition's objects, rebuilding from manifests where needed; returns
    the reasons of the partitions to restore offline."""
    present = _Present(objects)
    offline: dict[tuple[uuid.UUID, int], str] = {}
    for info in sorted((await store.topics()).values(), key=lambda t: t.name):
        states = await store.partition_states(info.topic_id)
        for p in range(info.partitions):
            if p in states and states[p].offline:  # stays offline (_move_epochs keeps it)
                report.partitions.append(PartitionOutcome(info.name, p, OFFLINE,
                                                          f"offline at the backup: {states[p].offline}"))
                continue
            state = await store.log_state(info.topic_id, p)
            segments = await store.segments(info.topic_id, p)
            wal = sorted({key for key, _ in await store.wal_ranges(info.topic_id, p, state.log_start_offset)})
            missing = await _first_missing(segments, wal, state.log_start_offset, present)
            if missing is None:
                report.partitions.append(PartitionOutcome(info.name, p, COMPLETE))
                continue
            rebuilt = await _rebuild(store, objects, present, info, p, segments,
                                     state.log_start_offset, state.high_watermark)
            if rebuilt is not None:
                report.partitions.append(PartitionOutcome(info.name, p, REBUILT, f"{missing} missing; {rebuilt}"))
                continue
            reason = (f"restored from a backup whose object {missing} is no longer in the object "
                      f"store, and no manifest covers the partition's offsets "
                      f"{state.log_start_offset}..{state.high_watermark - 1} at the backup")
            offline[(info.topic_id, p)] = reason
            report.partitions.append(PartitionOutcome(info.name, p, OFFLINE, reason))
    return offline


async def _rebuild(store: KVClusterStore, objects: ObjectStore, present: _Present, info: TopicInfo,
                   p: int, segments: list[SegmentEntry], log_start: int, high_watermark: int) -> str | None:
    """Replace the partition's segment entries with those of its newest readable manifest
    when it covers every offset committed at the backup and all its objects are there;
    what was done, or None."""
    prefix = layout.partition_manifest_prefix(info.name, info.topic_id, p)
    for obj in reversed(await objects.list(prefix)):
        try:
            manifest = read_manifest(await objects.get(obj.key), obj.key)
        except (ObjectNotFound, CorruptObject, UnsupportedObjectFormat):
            continue  # an older snapshot may still do
        if manifest.topic_id != info.topic_id or manifest.partition != p:
            continue
        return await _apply_manifest(store, present, manifest, obj.key, segments, log_start, high_watermark)
    return None


async def _apply_manifest(store: KVClusterStore, present: _Present, manifest: Manifest, key: str,
                          segments: list[SegmentEntry], log_start: int, high_watermark: int) -> str | None:
    new_start = max(log_start, manifest.log_start_offset)
    records = manifest.segments
    if not records or records[-1].last_offset < high_watermark - 1:
        return None
    if records[-1].open_txn_offset >= 0:
        # The open transaction's producer state is in segment entries, not in manifests.
        return None
    known = {s.key_base: s for s in segments}
    entries = []
    for r in records:
        old = known.get(r.key_base)
        entry = SegmentEntry(r.base_offset, r.last_offset, r.key_base, r.size, r.min_timestamp,
                             r.max_timestamp, r.leader_epoch, old.producers if old else {},
                             r.aborted_txns)
        if entry.last_offset >= new_start and await _first_missing([entry], [], new_start, present):
            return None
        entries.append(entry)
    await store.replace_segments(manifest.topic_id, manifest.partition,
                                 [s.base_offset for s in segments], entries)
    if new_start > log_start:
        await store.set_log_start_offset(manifest.topic_id, manifest.partition, new_start)
    end = records[-1].last_offset + 1
    done = f"rebuilt from manifest {key}: high watermark {high_watermark} -> {end}"
    if new_start > log_start:
        done += f", log start {log_start} -> {new_start} (removed by retention since the backup)"
    return done


async def _move_epochs(store: KVClusterStore, offline: dict[tuple[uuid.UUID, int], str]) -> None:
    states = [(tid, p, st) for tid, by_p in (await store.all_partition_states()).items()
              for p, st in by_p.items()]
    for tid, p, st in states:
        reason = offline.get((tid, p), st.offline)  # offline in the backup: still offline
        await store.set_partition_state(
            tid, p, PartitionState(-1, st.leader_epoch + EPOCH_MARGIN, st.replicas, (), reason))


async def _fence_producers(store: KVClusterStore, report: RestoreReport) -> None:
    for state, revision in await store.transactions():
        if state.status.preparing:
            continue  # decided before the backup: its markers are written as decided
        epoch = state.producer_epoch + 1
        new = state.with_(producer_epoch=min(epoch, MAX_PRODUCER_EPOCH), last_producer_epoch=-1)
        if state.status is TxnStatus.ONGOING:
            new = new.with_(status=TxnStatus.PREPARE_ABORT, pending=state.partitions)
            report.transactions_aborted += 1
        elif epoch > MAX_PRODUCER_EPOCH:
            new = new.with_(producer_id=await store.allocate_producer_ids(1), producer_epoch=0)
        await store.put_transaction(new, revision)
        report.producers_fenced += 1
