"""Topic administration: create, auto-create, delete, configure and grow topics.

Checks come first (names, counts, configs, replication factor against live gateways) and
answer with the protocol's error; the coordinator then holds the change, and the caller's
leadership sync makes the new partitions served. Creations and deletions are serialised
on this gateway; the coordinator refuses a name taken elsewhere meanwhile.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from stratalog.coordinator.model import ClusterStore, PartitionState, TopicInfo
from stratalog.engine import LogEngine

from .assignment import assigned_states, check_assignments
from .cluster import new_topic_assignments
from . import topic_configs
from .config import BROKER_SETTINGS, BrokerConfig, ConfigError
from .errors import KafkaError
from .protocol.error_codes import ErrorCode

TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
# Kafka's controller refuses an operation of more than 10,000 records, a partition being one:
# one CreateTopics or CreatePartitions request creates at most this many partitions.
MAX_PARTITIONS_PER_REQUEST = 10_000


class PartitionBudget:
    """The partitions one request may still create (MAX_PARTITIONS_PER_REQUEST in all)."""

    def __init__(self, limit: int = MAX_PARTITIONS_PER_REQUEST):
        self.left = limit

    def take(self, count: int, topic: str) -> None:
        if count > self.left:
            raise KafkaError(ErrorCode.POLICY_VIOLATION,
                             f"topic {topic!r}: {count} new partitions would take this request past "
                             f"{MAX_PARTITIONS_PER_REQUEST} partitions; create them in several requests")
        self.left -= count

    def give_back(self, count: int) -> None:
        self.left += count


def validate_topic_name(name: str) -> None:
    if not name or name in (".", "..") or not TOPIC_NAME.match(name):
        raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION,
                         f"topic name {name!r} must be 1-249 of [a-zA-Z0-9._-], not . or ..")


@dataclass
class TopicTable:
    """The topics and partition states as this gateway last loaded them from the coordinator."""

    by_name: dict[str, TopicInfo] = field(default_factory=dict)
    by_id: dict[uuid.UUID, TopicInfo] = field(default_factory=dict)
    states: dict[uuid.UUID, dict[int, PartitionState]] = field(default_factory=dict)
    # This gateway's own puts and removes, numbered, so a load whose reads they raced can
    # apply them again (bounded: a load spans a few of them, not thousands).
    _changes: int = 0
    _recent: deque = field(default_factory=lambda: deque(maxlen=4096))

    async def load(self, store: ClusterStore) -> None:
        """Replace the table with the coordinator's. A put or remove made here while the
        reads were under way may be missing from them (a deleted topic is removed here
        before its deletion is stored), so it is applied again on top: a reload never
        brings back, until the next one, a topic this gateway just deleted."""
        start = self._changes
        topics = await store.topics()
        states = await store.all_partition_states()
        by_name = dict(topics)
        for seq, info, present in self._recent:
            if seq <= start:
                continue
            if present:
                by_name[info.name] = info
            elif info.name in by_name and by_name[info.name].topic_id == info.topic_id:
                del by_name[info.name]
        self.states = states
        self.by_name = by_name
        self.by_id = {t.topic_id: t for t in by_name.values()}

    def put(self, info: TopicInfo) -> None:
        self._note(info, True)
        self.by_name[info.name] = info
        self.by_id[info.topic_id] = info

    def remove(self, info: TopicInfo) -> None:
        self._note(info, False)
        self.by_name.pop(info.name, None)
        self.by_id.pop(info.topic_id, None)

    def _note(self, info: TopicInfo, present: bool) -> None:
        self._changes += 1
        self._recent.append((self._changes, info, present))

    def state(self, topic: str, partition: int) -> PartitionState | None:
        info = self.by_name.get(topic)
        return self.states.get(info.topic_id, {}).get(partition) if info else None


class TopicAdmin:
    """CreateTopics, DeleteTopics, AlterConfigs and CreatePartitions on one gateway."""

    def __init__(self, config: BrokerConfig, store: ClusterStore, topics: TopicTable, engine: LogEngine, *,
                 live_now: Callable[[], Awaitable[list[int]]], sync: Callable[[], Awaitable[None]]):
        self.config = config
        self.store = store
        self.topics = topics
        self.engine = engine
        # The live gateways read from the coordinator now, not as the last membership
        # refresh left them: a gateway that joined since counts for the replication factor,
        # may be named in an assignment and gets replicas.
        self.live_now = live_now
        self.sync = sync
        self._lock = asyncio.Lock()
        self._busy: str | None = None  # the creation under way, for the shutdown log

    def work_in_progress(self) -> list[str]:
        return [self._busy] if self._busy else []

    def check_topic_configs(self, configs: dict[str, str | None]) -> dict[str, str]:
        """Every Kafka topic config name is taken (`topic_configs`), its value checked."""
        out = {}
        for k, v in configs.items():
            if not topic_configs.is_topic_config(k):
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"unknown topic config {k!r}")
            if v is None:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"topic config {k!r} has no value")
            try:
                topic_configs.check(k, v)
            except ConfigError as e:
                raise KafkaError(ErrorCode.INVALID_CONFIG, str(e)) from None
            out[k] = str(v)
        return out

    async def create_topic(self, name: str, partitions: int, replication_factor: int,
                           configs: dict[str, str], *, validate_only: bool = False,
                           assignments: list[tuple[int, list[int]]] | None = None) -> TopicInfo:
        """`assignments`: the operator's replicas of each partition, (index, broker ids),
        instead of counts (both -1); the first broker id is the preferred leader."""
        validate_topic_name(name)
        live = await self.live_now()
        manual = None
        if assignments:
            if partitions != -1 or replication_factor != -1:
                raise KafkaError(ErrorCode.INVALID_REQUEST,
                                 "give either replica assignments or a partition count and replication "
                                 "factor (-1 with assignments), not both")
            manual = check_assignments(assignments, live, range(len(assignments)))
            partitions, replication_factor = len(manual), len(manual[0])
        if partitions == -1:
            partitions = self.config["num.partitions"]
        if replication_factor == -1:
            replication_factor = self.config["default.replication.factor"]
        if partitions < 1:
            raise KafkaError(ErrorCode.INVALID_PARTITIONS, f"partitions must be at least 1, not {partitions}")
        if manual is None and (replication_factor < 1 or replication_factor > len(live)):
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR,
                             f"replication factor {replication_factor} with {len(live)} live gateway(s): "
                             f"{', '.join(map(str, live))}")
        configs = self.check_topic_configs(configs)
        async with self._lock:
            if name in self.topics.by_name or await self.store.topic(name) is not None:
                raise KafkaError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
            await self._check_cluster_limit(name, partitions)
            if validate_only:
                return TopicInfo(name, uuid.uuid4(), partitions, replication_factor, configs)
            self._busy = f"creating topic {name!r} ({partitions} partitions)"
            try:
                states = (assigned_states(manual) if manual is not None else
                          new_topic_assignments(live, range(partitions), replication_factor, name))
                info = await self.store.create_topic(name, partitions, replication_factor, configs, states)
                await self.sync()  # recoveries run a few at a time (engine/leadership.py)
            finally:
                self._busy = None
        return info

    async def ensure_topic(self, name: str) -> TopicInfo | None:
        """The topic, auto-created when `auto.create.topics.enable` allows."""
        info = self.topics.by_name.get(name)
        if info is not None or not self.config["auto.create.topics.enable"]:
            return info
        try:
            return await self.create_topic(name, -1, -1, {})
        except KafkaError as e:
            if e.code == ErrorCode.TOPIC_ALREADY_EXISTS:
                # Created elsewhere since our last sync: it exists, whatever our cache says.
                return self.topics.by_name.get(name) or await self.store.topic(name)
            raise

    async def delete_topic(self, name: str) -> None:
        async with self._lock:
            info = self.topics.by_name.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            self.engine.drop_partitions(info)
            self.topics.remove(info)
            await self.store.delete_topic(name)
        await self.engine.delete_objects(info)

    async def set_topic_configs(self, name: str, configs: dict[str, str]) -> None:
        configs = self.check_topic_configs(configs)
        async with self._lock:
            if name not in self.topics.by_name:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            self.topics.put(await self.store.set_topic_configs(name, configs))

    async def add_partitions(self, name: str, total: int, *, validate_only: bool = False,
                             assignments: list[list[int]] | None = None) -> None:
        """`assignments`: the operator's replicas of each new partition, in order."""
        async with self._lock:
            info = self.topics.by_name.get(name)
            if info is None:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
            if total <= info.partitions:
                raise KafkaError(ErrorCode.INVALID_PARTITIONS,
                                 f"topic {name!r} has {info.partitions} partitions; {total} would not add any")
            new = range(info.partitions, total)
            live = await self.live_now()
            manual = None
            if assignments is not None:
                if len(assignments) != len(new):
                    raise KafkaError(ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                                     f"topic {name!r}: {len(assignments)} assignments for {len(new)} new partitions")
                manual = check_assignments(zip(new, assignments), live, new,
                                           info.replication_factor)
            await self._check_cluster_limit(name, total - info.partitions)
            if validate_only:
                return
            self._busy = f"adding {total - info.partitions} partitions to topic {name!r}"
            try:
                states = (assigned_states(manual) if manual is not None else
                          new_topic_assignments(live, new, info.replication_factor, name))
                await self.store.add_partitions(name, total, states)
                await self.sync()
            finally:
                self._busy = None

    async def _check_cluster_limit(self, name: str, adding: int) -> None:
        """max.partitions (KIP-578) bounds the partitions of every topic together."""
        limit = self.config["max.partitions"]
        if limit == BROKER_SETTINGS["max.partitions"].default:
            return  # no limit: skip reading every topic
        total = sum(t.partitions for t in (await self.store.topics()).values())
        if total + adding > limit:
            raise KafkaError(ErrorCode.POLICY_VIOLATION,
                             f"topic {name!r}: {adding} new partitions would bring the cluster to "
                             f"{total + adding} partitions, past max.partitions={limit} ({total} exist)")
