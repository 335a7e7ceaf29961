"""The gateway's state: the partitions it leads, the WAL writer, the groups, and the
background work that seals segments, applies retention and collects garbage.

Handlers reach everything through one `Broker`; only `server.py` touches sockets.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from coordinator.model import ClusterStore, PartitionState, SegmentEntry, TopicInfo, UnknownTopic
from tiering import layout
from tiering.manifest import SegmentRecord, write_manifest
from tiering.objectstore.base import ObjectStore
from tiering.remote import RemoteCache
from tiering.segment import ActiveSegment

from .config import BrokerConfig, ConfigError, parse_value, TOPIC_CONFIGS
from .errors import KafkaError
from .groups import GroupCoordinator
from .partition import PartitionLog
from .protocol.error_codes import ErrorCode
from .wal_writer import WalWriter

log = logging.getLogger(__name__)

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
MAINTENANCE_TICK_S = 0.25
MANIFESTS_KEPT = 3


@dataclass(frozen=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int
    rack: str | None = None


def validate_topic_name(name: str) -> None:
    if not name or name in (".", "..") or not TOPIC_NAME.match(name):
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"topic name {name!r} must be 1-249 of [a-zA-Z0-9._-], not . or ..")


class Broker:
    def __init__(self, config: BrokerConfig, *, node_id: int, advertised: tuple[str, int],
                 data_dir: Path, store: ClusterStore, objects: ObjectStore,
                 rack: str | None = None, clock: Callable[[], float] = time.time):
        self.config = config
        self.node_id = node_id
        self.address = BrokerAddress(node_id, advertised[0], advertised[1], rack)
        self.data_dir = data_dir
        self.store = store
        self.objects = objects
        self.clock = clock  # wall clock in seconds: timestamps, retention, segment.ms
        self.cluster_id = ""
        self.cache = RemoteCache(objects, data_dir / "cache", max_bytes=config["remote.cache.bytes"])
        self.topics: dict[str, TopicInfo] = {}
        self.topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self.wal = WalWriter(node_id, objects, store, flush_ms=config["wal.flush.ms"],
                             flush_bytes=config["wal.flush.bytes"],
                             on_committed=self._wal_committed, on_fenced=self._fenced)
        self.groups = GroupCoordinator(
            store, initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"])
        self._hw_event = asyncio.Event()
        self._tasks: list[asyncio.Task] = []
        self._uploading: dict[tuple[str, int], asyncio.Task] = {}
        self._manifest_versions: dict[tuple[str, int], int] = {}
        self._topic_lock = asyncio.Lock()
        self._producer_ids = (0, 0)  # next, end of the reserved block
        self._last_retention = 0.0

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.cluster_id = await self.store.cluster_id()
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        for info in (await self.store.topics()).values():
            await self._lead_topic(info)
        await self.wal.start()
        await self.groups.start()
        await self._collect_orphan_wal_objects()
        self._tasks.append(asyncio.create_task(self._maintenance(), name="maintenance"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.wal.stop()
        await self.groups.stop()
        for t in list(self._uploading.values()):
            t.cancel()
        await asyncio.gather(*self._uploading.values(), return_exceptions=True)
        for plog in self.logs.values():
            plog.close()
        await self.objects.close()

    async def _lead_topic(self, info: TopicInfo) -> None:
        """Take leadership of every partition of a topic (one gateway: all of them)."""
        self.topics[info.name] = info
        self.topics_by_id[info.topic_id] = info
        states = await self.store.partition_states(info.topic_id)
        for p in range(info.partitions):
            old = states.get(p)
            epoch = (old.leader_epoch + 1) if old else 0
            state = PartitionState(self.node_id, epoch, (self.node_id,), (self.node_id,))
            await self.store.set_partition_state(info.topic_id, p, state)
            directory = self.data_dir / "logs" / f"{info.name}-{p}"
            self.logs[(info.name, p)] = await PartitionLog.recover(
                info.name, info.topic_id, p, epoch, directory, self.store, self.objects,
                index_interval_bytes=self.topic_config(info.name, "index.interval.bytes"),
                now_ms=self.now_ms())

    # ---- lookups used by handlers ------------------------------------------------------

    def log_for(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    def topic_config(self, topic: str, name: str):
        info = self.topics.get(topic)
        return self.config.topic_config(info.configs if info else {}, name)

    def partition_count(self, topic: str) -> int | None:
        info = self.topics.get(topic)
        return None if info is None else info.partitions

    def high_watermark(self, topic: str, partition: int) -> int | None:
        plog = self.logs.get((topic, partition))
        return None if plog is None else plog.high_watermark

    def live_brokers(self) -> list[BrokerAddress]:
        return [self.address]

    def coordinator_for(self, key: str) -> tuple[int, str, int]:
        a = self.address
        return a.node_id, a.host, a.port

    def is_coordinator_for(self, key: str) -> bool:
        return True

    def partition_leader(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    async def partition_states(self, info: TopicInfo) -> dict[int, PartitionState]:
        """Leader, epoch, replicas and ISR as Metadata reports them."""
        out = {}
        for p in range(info.partitions):
            plog = self.logs.get((info.name, p))
            if plog is not None:
                out[p] = PartitionState(self.node_id, plog.leader_epoch, (self.node_id,), (self.node_id,))
        return out

    def controller_id(self) -> int:
        return self.node_id

    # ---- topics ------------------------------------------------------------------------

    def check_topic_configs(self, configs: dict[str, str | None]) -> dict[str, str]:
        out = {}
        for k, v in configs.items():
            if k not in TOPIC_CONFIGS:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"unknown topic config {k!r}")
            if v is None:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"topic config {k!r} has no value")
            try:
                parse_value(k, v)
            except ConfigError as e:
                raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
            out[k] = str(v)
        return out

    async def create_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: dict[str, str], *, validate_only: bool = False) -> TopicInfo:
        validate_topic_name(name)
        if partitions == -1:
            partitions = self.config["num.partitions"]
        if replication_factor == -1:
            replication_factor = self.config["default.replication.factor"]
        if partitions < 1:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"partitions must be at least 1, not {partitions}")
        if replication_factor < 1 or replication_factor > len(self.live_brokers()):
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             f"replication factor {replication_factor} with "
                             f"{len(self.live_brokers())} live gateway(s)")
        configs = self.check_topic_configs(configs)
        async with self._topic_lock:
            if name in self.topics:
                raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            if validate_only:
                return TopicInfo(name, uuid.uuid4(), partitions, replication_factor, configs)
            assignments = {p: PartitionState(self.node_id, 0, (self.node_id,), (self.node_id,))
                           for p in range(partitions)}
            info = await self.store.create_topic(name, partitions, replication_factor, configs, assignments)
            await self._lead_topic(info)
            self._hw_event_fire()
            return info

    async def ensure_topic(self, name: str) -> TopicInfo | None:
        """The topic, auto-created when `auto.create.topics.enable` allows."""
        info = self.topics.get(name)
        if info is not None or not self.config["auto.create.topics.enable"]:
            return info
        try:
            return await self.create_topic(name, -1, -1, {})
        except KafkaError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                return self.topics.get(name)
            raise

    async def delete_topic(self, name: str) -> None:
        async with self._topic_lock:
            info = self.topics.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            for p in range(info.partitions):
                task = self._uploading.pop((name, p), None)
                if task is not None:
                    task.cancel()
                plog = self.logs.pop((name, p), None)
                if plog is not None:
                    plog.close()
                    shutil.rmtree(plog.directory, ignore_errors=True)
            del self.topics[name]
            self.topics_by_id.pop(info.topic_id, None)
            await self.store.delete_topic(name)
        # The coordinator no longer names these objects: removing them can trail behind.
        for prefix in layout.topic_prefixes(name, info.topic_id):
            objs = await self.objects.list(prefix)
            if objs:
                await self.objects.delete([o.key for o in objs])
        self.cache.invalidate(layout.topic_prefixes(name, info.topic_id)[0])

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        configs = self.check_topic_configs(configs)
        async with self._topic_lock:
            if name not in self.topics:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            info = await self.store.set_topic_configs(name, configs)
            self.topics[name] = info
            self.topics_by_id[info.topic_id] = info

    async def add_partitions(self, name: str, total: int, *, validate_only: bool = False) -> None:
        async with self._topic_lock:
            info = self.topics.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            if total <= info.partitions:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                                 f"topic {name!r} has {info.partitions} partitions; {total} would not add any")
            if validate_only:
                return
            assignments = {p: PartitionState(self.node_id, 0, (self.node_id,), (self.node_id,))
                           for p in range(info.partitions, total)}
            info = await self.store.add_partitions(name, total, assignments)
            self.topics[name] = info
            self.topics_by_id[info.topic_id] = info
            for p in range(total):
                if (name, p) not in self.logs:
                    directory = self.data_dir / "logs" / f"{name}-{p}"
                    self.logs[(name, p)] = await PartitionLog.recover(
                        name, info.topic_id, p, 0, directory, self.store, self.objects,
                        index_interval_bytes=self.topic_config(name, "index.interval.bytes"),
                        now_ms=self.now_ms())

    async def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """Move the log start offset (DeleteRecords); -1 means the high watermark."""
        plog = self.logs.get((topic, partition))
        if plog is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if offset == -1:
            offset = plog.high_watermark
        if offset < 0 or offset > plog.high_watermark:
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE,
                             f"offset {offset} is outside 0..{plog.high_watermark}")
        if offset > plog.log_start_offset:
            await self.store.set_log_start_offset(plog.topic_id, partition, offset)
            plog.log_start_offset = offset
            await self._drop_segments_below(plog, offset)
        return plog.log_start_offset

    # ---- producer ids ------------------------------------------------------------------

    async def next_producer_id(self) -> int:
        nxt, end = self._producer_ids
        if nxt >= end:
            first = await self.store.allocate_producer_ids(1000)
            nxt, end = first, first + 1000
        self._producer_ids = (nxt + 1, end)
        return nxt

    # ---- write path glue ---------------------------------------------------------------

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
        """Leadership was taken away: stop serving those partitions until reassigned."""
        for tid, p in keys:
            info = self.topics_by_id.get(tid)
            if info is not None:
                plog = self.logs.pop((info.name, p), None)
                if plog is not None:
                    plog.close()

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

    def maybe_roll(self, plog: PartitionLog) -> None:
        if plog.active.size >= self.topic_config(plog.topic, "segment.bytes"):
            self._roll(plog)

    def _roll(self, plog: PartitionLog) -> None:
        seg = plog.roll(self.now_ms())
        if seg is None:
            return
        seg.producer_snapshot = plog.producers.snapshot()
        key = (plog.topic, plog.partition)
        if key not in self._uploading or self._uploading[key].done():
            self._uploading[key] = asyncio.create_task(self._upload_rolled(plog), name=f"seal-{key}")

    async def _upload_rolled(self, plog: PartitionLog) -> None:
        """Seal, upload and commit rolled segments of one partition, oldest first."""
        while plog.rolled:
            seg = plog.rolled[0]
            while plog.high_watermark < seg.next_offset:
                await self.wait_for_data(1.0)  # its last batches are still in the WAL buffer
                if self.logs.get((plog.topic, plog.partition)) is not plog:
                    return
            try:
                entry = await self._upload_segment(plog, seg)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - retried on the next pass
                log.warning("sealing %s-%d at %d failed: %s", plog.topic, plog.partition,
                            seg.base_offset, e)
                await asyncio.sleep(1.0)
                continue
            plog.segment_uploaded(seg, entry)
            await self._write_manifest(plog)

    async def _upload_segment(self, plog: PartitionLog, seg: ActiveSegment) -> SegmentEntry:
        sealed = seg.seal()
        key_base = layout.segment_key_base(plog.topic, plog.topic_id, plog.partition,
                                           sealed.base_offset, plog.leader_epoch, uuid.uuid4().hex[:12])
        data = await asyncio.to_thread(Path(sealed.log_path).read_bytes)
        await self.objects.put(key_base + layout.LOG, data)
        await self.objects.put(key_base + layout.INDEX, sealed.index_bytes)
        await self.objects.put(key_base + layout.TIMEINDEX, sealed.timeindex_bytes)
        entry = SegmentEntry(sealed.base_offset, sealed.last_offset, key_base, sealed.size,
                             sealed.min_timestamp, sealed.max_timestamp, plog.leader_epoch,
                             getattr(seg, "producer_snapshot", {}))
        await self.store.commit_segment(plog.topic_id, plog.partition, entry, plog.leader_epoch)
        return entry

    async def _write_manifest(self, plog: PartitionLog) -> None:
        """An Avro snapshot of the partition's segments, for Spark and disaster recovery."""
        key = (plog.topic, plog.partition)
        prefix = layout.partition_manifest_prefix(plog.topic, plog.topic_id, plog.partition)
        if key not in self._manifest_versions:
            existing = await self.objects.list(prefix)
            self._manifest_versions[key] = len(existing) and max(
                int(o.key.rsplit("/", 1)[1].split(".")[0]) for o in existing)
        version = self._manifest_versions[key] + 1
        self._manifest_versions[key] = version
        records = [SegmentRecord(s.base_offset, s.last_offset, s.key_base, s.size, s.min_timestamp,
                                 s.max_timestamp, s.leader_epoch) for s in plog.sealed]
        data = write_manifest(plog.topic, plog.topic_id, plog.partition, version,
                              plog.log_start_offset, records)
        await self.objects.put(layout.manifest_key(plog.topic, plog.topic_id, plog.partition, version), data)
        old = [o.key for o in await self.objects.list(prefix)]
        if len(old) > MANIFESTS_KEPT:
            await self.objects.delete(sorted(old)[:-MANIFESTS_KEPT])

    # ---- background maintenance --------------------------------------------------------

    async def _maintenance(self) -> None:
        while True:
            await asyncio.sleep(MAINTENANCE_TICK_S)
            try:
                await self.maintain_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - maintenance is retried next tick
                log.exception("maintenance failed")

    async def maintain_once(self, force_retention: bool = False) -> None:
        now_ms = self.now_ms()
        for plog in list(self.logs.values()):
            seg = plog.active
            if seg.size and now_ms - seg.created_ms >= self.topic_config(plog.topic, "segment.ms"):
                self._roll(plog)
            elif seg.size >= self.topic_config(plog.topic, "segment.bytes"):
                self._roll(plog)
        interval = self.config["log.retention.check.interval.ms"] / 1000
        if force_retention or self.clock() - self._last_retention >= interval:
            self._last_retention = self.clock()
            await self.apply_retention()
            await self.collect_wal_garbage()
            for plog in self.logs.values():
                plog.producers.expire(now_ms, self.config["producer.id.expiration.ms"])

    async def apply_retention(self) -> None:
        now_ms = self.now_ms()
        for plog in list(self.logs.values()):
            retention_ms = self.topic_config(plog.topic, "retention.ms")
            retention_bytes = self.topic_config(plog.topic, "retention.bytes")
            if "delete" not in self.topic_config(plog.topic, "cleanup.policy"):
                continue
            new_start = plog.log_start_offset
            total = sum(s.size for s in plog.sealed) + sum(s.size for s in plog.rolled) + plog.active.size
            for s in plog.sealed:
                expired = retention_ms >= 0 and s.max_timestamp < now_ms - retention_ms
                too_big = retention_bytes >= 0 and total - s.size >= retention_bytes
                if not (expired or too_big):
                    break
                total -= s.size
                new_start = s.last_offset + 1
            if new_start > plog.log_start_offset:
                await self.store.set_log_start_offset(plog.topic_id, plog.partition, new_start)
                plog.log_start_offset = new_start
                await self._drop_segments_below(plog, new_start)

    async def _drop_segments_below(self, plog: PartitionLog, offset: int) -> None:
        gone = [s for s in plog.sealed if s.last_offset < offset]
        if not gone:
            return
        await self.store.delete_segments(plog.topic_id, plog.partition, [s.base_offset for s in gone])
        plog.sealed = [s for s in plog.sealed if s.last_offset >= offset]
        await self._write_manifest(plog)
        await self.objects.delete([s.key_base + ext for s in gone
                                   for ext in (layout.LOG, layout.INDEX, layout.TIMEINDEX)])

    async def collect_wal_garbage(self) -> None:
        """Delete WAL objects whose every range is sealed, deleted or below the log start."""
        obsolete = await self.store.obsolete_wal_objects()
        if not obsolete:
            return
        await self.store.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
        await self.objects.delete([o.key for o in obsolete])

    async def _collect_orphan_wal_objects(self) -> None:
        """WAL objects of this gateway that were uploaded but never committed are invisible;
        at start, before the first flush, any such object is garbage."""
        committed = {o.key for o in await self.store.wal_objects()}
        orphans = [o.key for o in await self.objects.list(f"wal/{self.node_id}/")
                   if o.key not in committed]
        if orphans:
            log.info("removing %d uncommitted WAL object(s)", len(orphans))
            await self.objects.delete(orphans)
