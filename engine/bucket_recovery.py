"""Rebuilding a lost coordinator from the object store alone (`stratalog recover --from-bucket`).

For when the coordinator (etcd's data, or the embedded database) is gone and there is no
backup of it. The cluster is rebuilt in a scratch embedded coordinator, then written into
the empty target once, as `engine.restore` does, and finished the same way (objects
checked, leader epochs and the producer-id allocator moved forward, transactional
producers fenced). What comes back, and as of when:

1. The newest readable coordinator snapshot in the bucket (`coordinator/<time>.backup`,
   written by the controller every `coordinator.snapshot.interval.ms`; engine.snapshots),
   or nothing. Topics, topic configs, group offsets, ACLs, users, quotas, producer ids and
   transactions are as of that snapshot.
2. Sealed data: every partition's newest readable manifest replaces its segment entries
   when it reaches further than the snapshot's (so segments sealed since come back), and
   names its topic, so a topic created after the snapshot comes back too once it has a
   sealed segment (with as many partitions as have manifests, replication factor 1 and no
   config overrides: manifests carry neither). A manifest ending inside an open
   transaction brings its partition back offline (the transaction's producer state is not
   in manifests), as restore does.
3. WAL ranges past the sealed end, from WAL objects whose commit is provable from the
   bucket (engine.wal_evidence reads the objects and applies the rule). THE RULE: a WAL object is committed if the snapshot lists it, or if any WAL
   object of the same gateway confirms its sequence (tiering.wal: the confirmation range,
   written by engine.wal_writer only for objects the coordinator accepted). Nothing else
   is: a fenced upload is never confirmed (its commit was refused), and an upload whose
   commit was in flight, or the newest object of a gateway that flushed nothing after it,
   cannot be told apart from one, so neither comes back. A partition's ranges are taken in
   offset order from its sealed end while they follow one another. One exception: offsets
   just before a proven range were committed (its leader wrote only after them), so an
   unproven range that exactly fills such a gap is taken, and where several uploads hold
   those offsets, the one of the highest leader epoch (a fenced upload always carries an
   older epoch than the commit that replaced it; equal epochs are not decided). At the
   first offset no range so taken holds, the partition ends (what lies past it is reported
   as not restored); two proven ranges holding the same offset (only after an unclean
   truncation) bring the partition back offline, for `stratalog partitions recover` to
   decide.
4. Transactions: a transaction the rebuilt WAL ranges leave open comes to an end only if
   the snapshot holds its state (restore's fencing aborts it, or its markers are written
   as decided); one begun since the snapshot would hold the last stable offset back for
   ever, so its partition comes back offline too.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from stratalog.coordinator import open_coordinator
from stratalog.coordinator.backup import Backup, CorruptBackup, decode
from stratalog.coordinator.kv import UnsupportedFormat, unsupported_version
from stratalog.coordinator.model import PartitionState, SegmentEntry, TopicInfo, WalObject, WalRange
from stratalog.coordinator.store import KEYSPACE_VERSION, OLDEST_READABLE_KEYSPACE, KVClusterStore
from stratalog.coordinator.transactions import TxnStatus
from stratalog.engine.restore import RestoreReport, settle
from stratalog.engine.wal_evidence import Candidate, continue_log, open_transactions, read_evidence
from stratalog.tiering import layout
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.errors import UnsupportedFormat as UnsupportedObjectFormat
from stratalog.tiering.manifest import Manifest, read_manifest
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore
from stratalog.tiering.wal import SequenceSet

log = logging.getLogger(__name__)

TP = tuple[uuid.UUID, int]


@dataclass(frozen=True)
class PartitionRecovery:
    """One partition's log after the rebuild: sealed offsets end before `sealed_end`, WAL
    ranges take it to `log_end`; `lost` says what the bucket held past it and why it did
    not come back ("" if nothing)."""

    topic: str
    partition: int
    sealed_end: int
    log_end: int
    lost: str = ""


@dataclass
class BucketReport:
    snapshot: str | None = None  # the snapshot's key, None: rebuilt from nothing
    snapshot_time_ms: int = 0
    skipped_snapshots: list[str] = field(default_factory=list)  # unreadable ones, with why
    topics_from_manifests: list[str] = field(default_factory=list)
    partitions: list[PartitionRecovery] = field(default_factory=list)
    wal_objects: int = 0
    proven: int = 0
    unreadable: list[str] = field(default_factory=list)  # objects that could not be read, why
    orphans: int = 0  # proven ranges of topics the rebuild does not know (no name for them)
    restore: RestoreReport = field(default_factory=RestoreReport)


async def recover_from_bucket(target: KVClusterStore, objects: ObjectStore,
                              scratch_dir: Path) -> BucketReport:
    """Rebuild the empty cluster of `target` from `objects` (module docstring); `scratch_dir`
    (empty, removed by the caller) holds the scratch coordinator."""
    await target.check_empty()  # before any work, and again when writing
    report = BucketReport()
    snapshot = await _newest_snapshot(objects, report)
    scratch = open_coordinator(None, scratch_dir, target.cluster)
    try:
        snapshot_wal: dict[tuple[int, int], WalObject] = {}
        if snapshot is not None:
            await scratch.write_keyspace(snapshot.keys)
            snapshot_wal = {(o.gateway_id, o.sequence): o for o in await scratch.wal_objects()}
            # Every WAL entry is rewritten below from what the bucket proves.
            await scratch.delete_wal_objects(list(snapshot_wal))
        await _apply_manifests(scratch, objects, report)
        await _apply_wal(scratch, objects, snapshot_wal, report)
        keys = await settle(scratch, objects, report.restore)
    finally:
        await scratch.close()
    await target.write_keyspace(keys)
    return report


async def _newest_snapshot(objects: ObjectStore, report: BucketReport) -> Backup | None:
    found = []
    for info in await objects.list(layout.SNAPSHOTS_ROOT):
        try:
            found.append((layout.parse_snapshot_key(info.key), info.key))
        except ValueError:
            continue
    for _, key in sorted(found, reverse=True):
        try:
            backup = decode(await objects.get(key), key)
        except (CorruptBackup, ObjectNotFound) as e:
            report.skipped_snapshots.append(f"{key}: {e}")
            continue  # an older one may do
        if not OLDEST_READABLE_KEYSPACE <= backup.keyspace_version <= KEYSPACE_VERSION:
            raise UnsupportedFormat(unsupported_version(
                f"the keyspace of snapshot {key}", backup.keyspace_version,
                OLDEST_READABLE_KEYSPACE, KEYSPACE_VERSION))
        report.snapshot, report.snapshot_time_ms = key, backup.time_ms
        return backup
    return None


# --- sealed data ---------------------------------------------------------------------------

async def _apply_manifests(store: KVClusterStore, objects: ObjectStore, report: BucketReport) -> None:
    """Topics and partitions the manifests name, and each partition's newest segments."""
    by_partition: dict[tuple[str, uuid.UUID, int], list[str]] = {}
    for info in await objects.list(layout.MANIFESTS_ROOT):
        try:
            mk = layout.parse_manifest_key(info.key)
        except ValueError:
            continue
        by_partition.setdefault((mk.topic, mk.topic_id, mk.partition), []).append(info.key)
    by_topic: dict[tuple[str, uuid.UUID], dict[int, list[str]]] = {}
    for (topic, tid, p), keys in by_partition.items():
        by_topic.setdefault((topic, tid), {})[p] = sorted(keys)
    for (name, tid), partitions in sorted(by_topic.items()):
        known = await _topic_for(store, name, tid, max(partitions) + 1, report)
        if known is None:
            continue
        for p, keys in sorted(partitions.items()):
            manifest = await _newest_manifest(objects, keys, tid, p)
            if manifest is not None:
                await _apply_manifest(store, known, manifest)


async def _topic_for(store: KVClusterStore, name: str, tid: uuid.UUID, partitions: int,
                     report: BucketReport) -> TopicInfo | None:
    """The topic with this id, created or grown to `partitions` as its manifests need."""
    topics = await store.topics()
    info = next((t for t in topics.values() if t.topic_id == tid), None)
    empty = PartitionState(-1, 0, (), ())
    if info is None:
        if name in topics:  # the name now belongs to another id: the snapshot's wins
            log.warning("manifests of %s (id %s) skipped: the snapshot has %s with id %s", name,
                        tid, name, topics[name].topic_id)
            return None
        report.topics_from_manifests.append(name)
        return await store.create_topic(name, partitions, 1, {}, dict.fromkeys(range(partitions), empty),
                                        topic_id=tid)
    if partitions > info.partitions:
        return await store.add_partitions(name, partitions,
                                          dict.fromkeys(range(info.partitions, partitions), empty))
    return info


async def _newest_manifest(objects: ObjectStore, keys: list[str], tid: uuid.UUID, p: int) -> Manifest | None:
    for key in reversed(keys):
        try:
            manifest = read_manifest(await objects.get(key), key)
        except (ObjectNotFound, CorruptObject, UnsupportedObjectFormat) as e:
            log.warning("manifest %s unreadable, trying an older one: %s", key, e)
            continue
        if manifest.topic_id == tid and manifest.partition == p:
            return manifest
    return None


async def _apply_manifest(store: KVClusterStore, info: TopicInfo, manifest: Manifest) -> None:
    p = manifest.partition
    segments = await store.segments(info.topic_id, p)
    sealed_last = max((s.last_offset for s in segments), default=-1)
    records = manifest.segments
    if not records or records[-1].last_offset <= sealed_last:
        return  # the snapshot already has as much
    known = {s.key_base: s for s in segments}
    entries = [SegmentEntry(r.base_offset, r.last_offset, r.key_base, r.size, r.min_timestamp,
                            r.max_timestamp, r.leader_epoch,
                            known[r.key_base].producers if r.key_base in known else {}, r.aborted_txns)
               for r in records]
    await store.replace_segments(info.topic_id, p, [s.base_offset for s in segments], entries)
    if manifest.log_start_offset > (await store.log_state(info.topic_id, p)).log_start_offset:
        await store.set_log_start_offset(info.topic_id, p, manifest.log_start_offset)
    if records[-1].open_txn_offset >= 0:
        await _set_offline(store, info.topic_id, p,
                           f"rebuilt from the bucket: its newest manifest ends inside a transaction "
                           f"open at offset {records[-1].open_txn_offset}, whose producer state only "
                           f"the lost coordinator held")


async def _set_offline(store: KVClusterStore, tid: uuid.UUID, p: int, reason: str) -> None:
    state = (await store.partition_states(tid)).get(p, PartitionState(-1, 0, (), ()))
    await store.set_partition_state(tid, p, replace(state, leader=-1, isr=(), offline=reason))


# --- WAL ranges ----------------------------------------------------------------------------

async def _apply_wal(store: KVClusterStore, objects: ObjectStore,
                     snapshot_wal: dict[tuple[int, int], WalObject], report: BucketReport) -> None:
    found = await read_evidence(objects)
    report.wal_objects, report.unreadable = found.read, found.unreadable
    proven: dict[TP, list[Candidate]] = {}
    unproven: dict[TP, list[Candidate]] = {}
    for ws, (key, ranges) in sorted(found.ranges.items()):
        listed = snapshot_wal.get(ws)
        if listed is not None or ws[1] in found.confirmed.get(ws[0], SequenceSet()):
            report.proven += 1
            # The snapshot's entry is the coordinator's word (a truncation shortens it).
            for r in (listed.ranges if listed is not None else ranges):
                proven.setdefault((r.topic_id, r.partition), []).append((ws, key, r))
        else:
            for r in ranges:
                unproven.setdefault((r.topic_id, r.partition), []).append((ws, key, r))
    topics = {t.topic_id: t for t in (await store.topics()).values()}
    report.orphans = sum(len(rs) for (tid, p), rs in proven.items()
                         if tid not in topics or p >= topics[tid].partitions)
    chosen: dict[tuple[int, int], tuple[str, list[WalRange]]] = {}
    for info in sorted(topics.values(), key=lambda t: t.name):
        for p in range(info.partitions):
            tp = (info.topic_id, p)
            segments = await store.segments(info.topic_id, p)
            start = (await store.log_state(info.topic_id, p)).log_start_offset
            sealed_end = max([s.last_offset + 1 for s in segments] + [start])
            c = continue_log(sealed_end, proven.get(tp, []), unproven.get(tp, []), found.epoch)
            report.partitions.append(PartitionRecovery(info.name, p, sealed_end, c.log_end, c.lost))
            for ws, key, r in c.taken:
                chosen.setdefault(ws, (key, []))[1].append(r)
            if c.conflict:
                await _set_offline(store, info.topic_id, p, f"rebuilt from the bucket: {c.lost}")
            elif c.taken:
                await _check_open_transactions(store, info, p, open_transactions(c.taken, found))
    for (gw, seq), (key, ranges) in sorted(chosen.items()):
        epochs = {}
        for r in ranges:
            tp = (r.topic_id, r.partition)
            if tp not in epochs:
                epochs[tp] = (await store.partition_states(r.topic_id))[r.partition].leader_epoch
        await store.commit_wal(WalObject(gw, seq, key, tuple(ranges), ranges[0].format_version), epochs)


async def _check_open_transactions(store: KVClusterStore, info: TopicInfo, p: int,
                                   open_at: dict[int, int]) -> None:
    """A transaction left open by the rebuilt WAL ranges is aborted only if the snapshot
    holds its state (restore's fencing aborts it); one begun since has its state only in the
    lost coordinator, would hold the last stable offset back for ever, and so brings the
    partition back offline for `stratalog partitions recover` to decide."""
    if not open_at:
        return
    tp = (info.name, p)
    known = {s.producer_id for s, _ in await store.transactions()  # markers will close these
             if (s.status is TxnStatus.ONGOING and tp in s.partitions)
             or (s.status.preparing and tp in s.pending)}
    unknown = {pid: offset for pid, offset in open_at.items() if pid not in known}
    if unknown:
        pid, offset = min(unknown.items(), key=lambda kv: kv[1])
        await _set_offline(store, info.topic_id, p,
                           f"rebuilt from the bucket: a transaction of producer id {pid} is open from "
                           f"offset {offset}, and its state was only in the lost coordinator")
