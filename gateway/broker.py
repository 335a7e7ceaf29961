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
from pathlib import Path
from typing import Callable

from stratalog.coordinator.kv import CoordinatorUnavailable
from stratalog.coordinator.model import ClusterStore, Fenced, PartitionState, SegmentEntry, TopicInfo
from stratalog.tiering import layout
from stratalog.tiering.manifest import SegmentRecord, write_manifest
from stratalog.tiering.objectstore.base import ObjectNotFound, ObjectStore, ObjectStoreError
from stratalog.tiering.remote import RemoteCache
from stratalog.tiering.segment import ActiveSegment

from .cluster import BrokerAddress, Controller, Membership, coordinator_index, new_topic_assignments
from .config import TOPIC_CONFIGS, BrokerConfig, ConfigError, parse_value
from .errors import KafkaError
from .groups import GroupCoordinator
from .partition import PartitionLog
from .replica import ReplicaView
from .protocol.error_codes import ErrorCode
from .wal_writer import WalWriter

log = logging.getLogger(__name__)

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
MAINTENANCE_TICK_S = 0.25
CLUSTER_TICK_S = 0.25
MANIFESTS_KEPT = 3
SWAPPED_OBJECT_GRACE_S = 30.0
START_RETRY_S = 60.0
SEGMENT_EXTENSIONS = (layout.LOG, layout.INDEX, layout.TIMEINDEX)


def _segment_base(key: str) -> str | None:
    """The key base of a segment object key, or None for anything else."""
    for ext in SEGMENT_EXTENSIONS:
        if key.endswith(ext):
            return key[:-len(ext)]
    return None


async def start_step(what: str, step):
    """Run one start-up step, retrying while the coordinator or the store is briefly
    unreachable (a restart during an outage, or a loaded machine) for up to
    START_RETRY_S; then the error ends the start. Each step may be run again: nothing
    in it commits anything before it can fail."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + START_RETRY_S
    delay = 0.1
    while True:
        try:
            return await step()
        except (CoordinatorUnavailable, ObjectStoreError) as e:
            if loop.time() + delay > deadline:
                raise
            log.warning("start: could not %s, retrying in %.1fs: %s", what, delay, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def validate_topic_name(name: str) -> None:
    if not name or name in (".", "..") or not TOPIC_NAME.match(name):
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"topic name {name!r} must be 1-249 of [a-zA-Z0-9._-], not . or ..")


REMOTE_CACHE_BYTES = 1024 * 1024 * 1024


def _cache_bytes(config: BrokerConfig, objects: ObjectStore) -> int:
    size = config["remote.cache.bytes"]
    if size >= 0:
        return size
    # Reads from a file store are local disk reads already: a cache would copy them twice.
    return 0 if objects.url.startswith("file:") else REMOTE_CACHE_BYTES


class Broker:
    def __init__(self, config: BrokerConfig, *, node_id: int, advertised: tuple[str, int],
                 data_dir: Path, store: ClusterStore, objects: ObjectStore,
                 rack: str | None = None, clock: Callable[[], float] = time.time,
                 lease_ttl_s: int = 6):
        self.config = config
        self.node_id = node_id
        self.address = BrokerAddress(node_id, advertised[0], advertised[1], rack)
        self.data_dir = data_dir
        self.store = store
        self.objects = objects
        self.clock = clock  # wall clock in seconds: timestamps, retention, segment.ms
        self.cluster_id = ""
        self.cache = RemoteCache(objects, data_dir / "cache", max_bytes=_cache_bytes(config, objects))
        self.topics: dict[str, TopicInfo] = {}
        self.topics_by_id: dict[uuid.UUID, TopicInfo] = {}
        self.states: dict[uuid.UUID, dict[int, PartitionState]] = {}
        self.logs: dict[tuple[str, int], PartitionLog] = {}
        self._becoming: dict[tuple[str, int], asyncio.Task] = {}
        self.replicas: dict[tuple[str, int], ReplicaView] = {}
        self.membership = Membership(store, self.address, ttl_s=lease_ttl_s)
        self.controller = Controller(store, self.membership)
        self._sync_lock = asyncio.Lock()
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
        self._uploading_bases: set[str] = set()  # segment key bases being uploaded/committed
        # However many partitions roll at once, only this many segments stream to the store.
        self._upload_slots = asyncio.Semaphore(config["remote.log.manager.copier.thread.pool.size"])
        self._swapped_bases: set[str] = set()  # replaced segments waiting out their grace
        self._segment_locks: dict[tuple[str, int], asyncio.Lock] = {}
        self._orphan_candidates: set[str] = set()
        self._manifest_versions: dict[tuple[str, int], int] = {}
        self._topic_lock = asyncio.Lock()
        self._producer_ids = (0, 0)  # next, end of the reserved block
        self._last_retention = 0.0
        self.group_lag: dict[tuple[str, str, int], int] = {}
        self.metrics = None  # GatewayMetrics, when the app attaches one
        self.started = False

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ---- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        self.cluster_id = await self._starting("read the cluster id", self.store.cluster_id)
        # The listener is already accepting (app.py binds before starting the broker), and
        # recovering led partitions below can take a while: load the topic list first so a
        # restarted gateway answers Metadata for an existing topic with "no leader yet"
        # (retriable) instead of "unknown topic", which clients treat as final.
        await self._starting("load topics", self._load_topics)
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        await self._starting("register", self.membership.start)
        await self._starting("start the WAL", self.wal.start)
        await self.groups.start()
        await self._starting("collect uncommitted WAL objects", self._collect_orphan_wal_objects)
        await self._starting("run the controller", self.controller.run_once)
        await self._starting("take leadership", lambda: self.sync_leadership(wait=True))
        self._tasks.append(asyncio.create_task(self._maintenance(), name="maintenance"))
        self._tasks.append(asyncio.create_task(self._cluster_loop(), name="cluster"))
        self.started = True

    async def _starting(self, what: str, step):
        return await start_step(what, step)

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.wal.stop()
        await self.groups.stop()
        for t in list(self._uploading.values()):
            t.cancel()
        await asyncio.gather(*self._uploading.values(), return_exceptions=True)
        for t in list(self._becoming.values()):
            t.cancel()
        await asyncio.gather(*self._becoming.values(), return_exceptions=True)
        for plog in self.logs.values():
            plog.close()
        await self.membership.stop()
        await self.objects.close()

    # ---- leadership ----------------------------------------------------------------------

    async def _cluster_loop(self) -> None:
        while True:
            await asyncio.sleep(CLUSTER_TICK_S)
            try:
                await self.membership.refresh()
                await self.controller.run_once()
                await self.sync_leadership()
                await self.tail_replicas()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - coordinator outage: retried next tick
                log.warning("cluster sync failed: %s", e)

    async def _load_topics(self) -> tuple[dict[str, TopicInfo], dict]:
        topics = await self.store.topics()
        states = await self.store.all_partition_states()
        self.topics = dict(topics)
        self.topics_by_id = {t.topic_id: t for t in topics.values()}
        self.states = states
        return topics, states

    async def sync_leadership(self, wait: bool = False) -> None:
        """Take the partitions the controller gave us, drop the ones it took away."""
        async with self._sync_lock:
            topics, states = await self._load_topics()
            desired: dict[tuple[str, int], tuple[TopicInfo, int]] = {}
            for info in topics.values():
                for p, st in states.get(info.topic_id, {}).items():
                    if st.leader == self.node_id:
                        desired[(info.name, p)] = (info, st.leader_epoch)
            for key, plog in list(self.logs.items()):
                want = desired.get(key)
                if want is None or want[1] != plog.leader_epoch or want[0].topic_id != plog.topic_id:
                    log.info("%s-%d: no longer leader (epoch %d)", key[0], key[1], plog.leader_epoch)
                    self._drop(key)
            for key, (info, epoch) in desired.items():
                if key not in self.logs and key not in self._becoming:
                    self._becoming[key] = asyncio.create_task(self._become_leader(info, key[1], epoch),
                                                              name=f"lead-{key}")
            pending = list(self._becoming.values())
        if wait and pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def tail_replicas(self) -> None:
        """Keep the partitions we replicate (but do not lead) warm, and report the ones we
        have not caught up on within replica.lag.time.max.ms, which leaves us out of their ISR."""
        now = time.monotonic()
        wanted: dict[tuple[str, int], TopicInfo] = {}
        for info in self.topics.values():
            for p, st in self.states.get(info.topic_id, {}).items():
                if self.node_id in st.replicas and st.leader != self.node_id:
                    wanted[(info.name, p)] = info
        for key in list(self.replicas):
            if key not in wanted or self.replicas[key].topic_id != wanted[key].topic_id:
                del self.replicas[key]
        for key, info in wanted.items():
            view = self.replicas.get(key)
            if view is None:
                view = self.replicas[key] = ReplicaView(info.name, info.topic_id, key[1])
            try:
                await view.catch_up(self.store, self.cache, now)
            except Exception as e:  # noqa: BLE001 - stays lagging until the next pass works
                log.debug("replica %s-%d: catch-up failed: %s", key[0], key[1], e)
        max_lag = self.config["replica.lag.time.max.ms"] / 1000
        self.membership.lagging = {f"{v.topic_id}/{v.partition}" for v in self.replicas.values()
                                   if now - v.caught_up_at > max_lag}

    def replica_view(self, topic: str, partition: int) -> ReplicaView | None:
        return self.replicas.get((topic, partition))

    def leader_epoch(self, topic: str, partition: int) -> int:
        info = self.topics.get(topic)
        st = self.states.get(info.topic_id, {}).get(partition) if info else None
        return st.leader_epoch if st else -1

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        """KIP-392: an in-sync replica in the client's rack, when the leader is not in it."""
        if not client_rack or client_rack == self.address.rack:
            return -1
        info = self.topics.get(topic)
        st = self.states.get(info.topic_id, {}).get(partition) if info else None
        if st is None:
            return -1
        live = self.membership.live
        for r in st.isr:
            if r != self.node_id and r in live and live[r].rack == client_rack:
                return r
        return -1

    async def _become_leader(self, info: TopicInfo, partition: int, epoch: int) -> None:
        key = (info.name, partition)
        try:
            delay = 0.1
            while True:
                try:
                    plog = await PartitionLog.recover(
                        info.name, info.topic_id, partition, epoch,
                        self.data_dir / "logs" / f"{info.name}-{partition}", self.store, self.objects,
                        index_interval_bytes=self.topic_config(info.name, "index.interval.bytes"),
                        now_ms=self.now_ms())
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - store or coordinator hiccup: retry
                    log.warning("%s-%d: recovery failed, retrying: %s", info.name, partition, e)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            current = self.states.get(info.topic_id, {}).get(partition)
            if current is None or current.leader != self.node_id or current.leader_epoch != epoch:
                plog.close()
                return
            self.logs[key] = plog
            log.info("%s-%d: leader at epoch %d, offsets %d..%d", info.name, partition, epoch,
                     plog.log_start_offset, plog.high_watermark)
            self._hw_event_fire()
        finally:
            self._becoming.pop(key, None)

    def _drop(self, key: tuple[str, int]) -> None:
        task = self._uploading.pop(key, None)
        if task is not None:
            task.cancel()
        plog = self.logs.pop(key, None)
        if plog is not None:
            self.wal.discard(plog.key)
            plog.close()

    # ---- lookups used by handlers ------------------------------------------------------

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
        live = self.membership.live
        return [live[i] for i in sorted(live)] or [self.address]

    def coordinator_for(self, key: str) -> tuple[int, str, int] | None:
        """The gateway coordinating a group: a hash over the live set, the same everywhere."""
        live = self.live_brokers()
        if not live:
            return None
        a = live[coordinator_index(key, len(live))]
        return a.node_id, a.host, a.port

    def is_coordinator_for(self, key: str) -> bool:
        c = self.coordinator_for(key)
        return c is not None and c[0] == self.node_id

    def partition_leader(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))

    async def partition_states(self, info: TopicInfo) -> dict[int, PartitionState]:
        """Leader, epoch, replicas and ISR as Metadata reports them: a dead leader is -1."""
        live = self.membership.live
        out = {}
        for p, st in self.states.get(info.topic_id, {}).items():
            if st.leader not in live:
                st = PartitionState(-1, st.leader_epoch, st.replicas, tuple(r for r in st.isr if r in live))
            out[p] = st
        return out

    def controller_id(self) -> int:
        return self.node_id if self.controller.is_controller else min(self.membership.live, default=-1)

    def under_replicated_count(self) -> int:
        count = 0
        for (topic, p), plog in self.logs.items():
            st = self.states.get(plog.topic_id, {}).get(p)
            if st is not None and len(st.isr) < len(st.replicas):
                count += 1
        return count

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
            if name in self.topics or await self.store.topic(name) is not None:
                raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            if validate_only:
                return TopicInfo(name, uuid.uuid4(), partitions, replication_factor, configs)
            live = [b.node_id for b in self.live_brokers()]
            assignments = new_topic_assignments(live, range(partitions), replication_factor, name)
            info = await self.store.create_topic(name, partitions, replication_factor, configs, assignments)
        await self.sync_leadership(wait=True)
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
                # Created elsewhere since our last sync: it exists, whatever our cache says.
                return self.topics.get(name) or await self.store.topic(name)
            raise

    async def delete_topic(self, name: str) -> None:
        async with self._topic_lock:
            info = self.topics.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            for p in range(info.partitions):
                plog = self.logs.get((name, p))
                self._drop((name, p))
                if plog is not None:
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
            live = [b.node_id for b in self.live_brokers()]
            assignments = new_topic_assignments(live, range(info.partitions, total),
                                                info.replication_factor, name)
            await self.store.add_partitions(name, total, assignments)
        await self.sync_leadership(wait=True)

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

    async def replace_segments(self, topic: str, partition: int, remove: list[int],
                               add: list[SegmentEntry], expect_keys: list[str] | None = None) -> None:
        """Swap sealed segments for their compacted rewrite, atomically.

        The rewrite must cover only offsets of the segments it replaces; the old objects are
        deleted after a grace period so that reads already under way can finish.
        """
        plog = self.logs.get((topic, partition))
        if plog is None:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, f"{topic}-{partition} is not led here")
        by_base = {s.base_offset: s for s in plog.sealed}
        missing = [b for b in remove if b not in by_base]
        if missing or not remove:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             f"segments {missing or remove} are not (or no longer) in the log")
        removed = [by_base[b] for b in remove]
        if expect_keys is not None and sorted(expect_keys) != sorted(s.key_base for s in removed):
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             "the segments were rewritten since the job read them")
        lo = min(s.base_offset for s in removed)
        hi = max(s.last_offset for s in removed)
        if any(a.base_offset < lo or a.last_offset > hi or a.base_offset > a.last_offset for a in add):
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"new segments must lie within offsets {lo}-{hi}")
        if removed[-1] is plog.sealed[-1] and add:
            # Recovery restores producer state from the newest segment: keep it there.
            last = max(add, key=lambda a: a.last_offset)
            add = [a if a is not last else SegmentEntry(**{**a.__dict__, "producers": removed[-1].producers})
                   for a in add]
        # Under the lock the orphan sweep holds: a rewrite it already collected (uploaded
        # too long before this swap) is refused here instead of committed as a dangling entry.
        async with self._segment_lock((topic, partition)):
            for a in add:
                for ext in SEGMENT_EXTENSIONS:
                    try:
                        await self.objects.size(a.key_base + ext)
                    except ObjectNotFound:
                        raise KafkaError(ErrorCode.INVALID_REQUEST,
                                         f"segment object {a.key_base + ext} does not exist; "
                                         "upload the rewrite again") from None
            try:
                await self.store.replace_segments(plog.topic_id, partition, remove, add)
            except Exception as e:  # noqa: BLE001 - a concurrent change wins; the caller retries
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"swap refused: {e}") from None
        plog.sealed = sorted([s for s in plog.sealed if s.base_offset not in remove] + add,
                             key=lambda s: s.base_offset)
        await self._write_manifest(plog)
        bases = [s.key_base for s in removed]
        self._swapped_bases.update(bases)
        self._tasks.append(asyncio.create_task(self._delete_later(bases), name="delete-swapped"))

    async def _delete_later(self, bases: list[str]) -> None:
        await asyncio.sleep(SWAPPED_OBJECT_GRACE_S)
        await self.objects.delete([b + ext for b in bases for ext in SEGMENT_EXTENSIONS])
        self._swapped_bases.difference_update(bases)

    def _segment_lock(self, key: tuple[str, int]) -> asyncio.Lock:
        return self._segment_locks.setdefault(key, asyncio.Lock())

    async def refresh_group_lag(self) -> None:
        lag = {}
        for group in await self.store.groups_with_offsets():
            for (topic, p), committed in (await self.store.fetch_offsets(group)).items():
                hw = self.high_watermark(topic, p)
                if hw is not None:
                    lag[(group, topic, p)] = max(0, hw - committed.offset)
        self.group_lag = lag

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
        """A flush was fenced: some partition in it has a new leader. Every partition whose
        batches were in it (or queued behind it) now holds uncommitted batches in its local
        segment, so all are dropped; the next sync re-takes those still ours, rebuilding
        them from the object store."""
        for tid, p in keys:
            info = self.topics_by_id.get(tid)
            if info is not None:
                self._drop((info.name, p))

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
            await self._write_manifest(plog)

    async def _upload_segment(self, plog: PartitionLog, seg: ActiveSegment) -> SegmentEntry:
        sealed = seg.seal()
        key_base = layout.segment_key_base(plog.topic, plog.topic_id, plog.partition,
                                           sealed.base_offset, plog.leader_epoch, uuid.uuid4().hex[:12])
        # Until committed these objects are unreferenced: keep the orphan sweep off them.
        self._uploading_bases.add(key_base)
        try:
            async with self._upload_slots:
                await self.objects.put_file(key_base + layout.LOG, Path(sealed.log_path))
                await self.objects.put(key_base + layout.INDEX, sealed.index_bytes)
                await self.objects.put(key_base + layout.TIMEINDEX, sealed.timeindex_bytes)
            entry = SegmentEntry(sealed.base_offset, sealed.last_offset, key_base, sealed.size,
                                 sealed.min_timestamp, sealed.max_timestamp, plog.leader_epoch,
                                 getattr(seg, "producer_snapshot", {}))
            await self.store.commit_segment(plog.topic_id, plog.partition, entry, plog.leader_epoch)
        finally:
            self._uploading_bases.discard(key_base)
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
            else:
                self.maybe_roll(plog)
        interval = self.config["log.retention.check.interval.ms"] / 1000
        if force_retention or self.clock() - self._last_retention >= interval:
            self._last_retention = self.clock()
            await self.apply_retention()
            await self.collect_wal_garbage()
            await self.collect_segment_orphans()
            for plog in self.logs.values():
                plog.producers.expire(now_ms, self.config["producer.id.expiration.ms"])
            await self.refresh_group_lag()

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
        """Delete WAL objects whose every range is sealed, deleted or below the log start,
        and this gateway's uploads that were never committed."""
        obsolete = await self.store.obsolete_wal_objects()
        if obsolete:
            # Objects first: an obsolete entry is never read, so one left behind by a failed
            # delete below is harmless and retried next pass, whereas an object whose entry
            # went first would be referenced by nothing and never collected.
            await self.objects.delete([o.key for o in obsolete])
            await self.store.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
        await self._collect_orphan_wal_objects(self.wal.settled_below())

    async def _collect_orphan_wal_objects(self, below: int | None = None) -> None:
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
                    base = _segment_base(o.key)
                    if base is None or base in referenced or base in self._uploading_bases \
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
