"""One gateway's state, wired together: the topics as last loaded, membership and the
controller, the log engine, topic administration, the group and transaction coordinators
and the transaction markers.

`Broker` owns the loops that keep them in step (cluster sync, maintenance timers) and the
lookups handlers need; the work itself lives in the parts: `stratalog.engine` (partitions:
append, read, sealing, retention, recovery), `topic_admin`, `cluster` and `groups`.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Callable

from stratalog.coordinator.kv import CoordinatorUnavailable
from stratalog.coordinator.model import ClusterStore, PartitionState, TopicInfo, UnknownTopic
from stratalog.coordinator.store import KVClusterStore
from stratalog.engine import Assignment, EngineSettings, LogEngine
from stratalog.engine.snapshots import SnapshotWriter
from stratalog.tiering.objectstore.base import ObjectStore, ObjectStoreError

from .auth.acls import Authorizer, parse_super_users
from .auth.oauth import JwtValidator
from .cluster import BrokerAddress, Controller, Membership, coordinator_index
from .config import EMBEDDED_WAL_COLLECTION_MS, BrokerConfig
from .groups import GroupCoordinator
from .groups.assignors import assignor_names
from .groups.consumer_coordinator import ConsumerGroups
from .groups.consumer_membership import ConsumerGroupConfig
from .groups.expiry import OffsetExpiry
from .quotas import ClientQuotas
from .telemetry import ClientTelemetry
from .reassignment import ReplicaAdmin
from .stopping import cancel_and_wait
from .topic_admin import TopicAdmin, TopicTable
from .transactions import MarkerWriter, TransactionCoordinator

log = logging.getLogger(__name__)

MAINTENANCE_TICK_S = 0.25
CLUSTER_TICK_S = 0.25
START_RETRY_S = 60.0
PRODUCER_ID_BLOCK = 1000


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


async def every_tick(seconds: float, step, failed: Callable[[Exception], None]) -> None:
    """Run `step` every `seconds` until cancelled; a failure goes to `failed` and the step
    is run again next tick."""
    while True:
        await asyncio.sleep(seconds)
        try:
            await step()
        except Exception as e:  # noqa: BLE001 - periodic work is retried next tick
            failed(e)


class Broker:
    def __init__(self, config: BrokerConfig, *, node_id: int, advertised: tuple[str, int],
                 data_dir: Path, store: ClusterStore, objects: ObjectStore,
                 rack: str | None = None, clock: Callable[[], float] = time.time,
                 lease_ttl_s: int = 6, metrics=None,
                 endpoints: dict[str, tuple[str, int]] | None = None):
        self.config = config
        self.node_id = node_id
        self.address = BrokerAddress(node_id, advertised[0], advertised[1], rack, endpoints or {})
        self.sasl_mechanisms = tuple(m.strip() for m in config["sasl.enabled.mechanisms"].split(",") if m.strip())
        mechanisms = self.sasl_mechanisms
        self.oauth = JwtValidator(config) if "OAUTHBEARER" in mechanisms else None
        self.authorizer = (Authorizer(store, super_users=parse_super_users(config["super.users"]),
                                      allow_if_no_acl=config["allow.everyone.if.no.acl.found"])
                           if config["authorizer.class.name"] else None)
        self.quotas = ClientQuotas(store, samples=config["quota.window.num"],
                                   window_s=config["quota.window.size.seconds"],
                                   mutation_samples=config["controller.quota.window.num"],
                                   mutation_window_s=config["controller.quota.window.size.seconds"])
        self.telemetry = ClientTelemetry.from_config(config)
        self.data_dir = data_dir
        self.store = store
        self.objects = objects
        self.clock = clock  # wall clock in seconds: timestamps, retention, segment.ms
        self.metrics = metrics  # GatewayMetrics, or None
        self.cluster_id = ""
        self.table = TopicTable()
        self.membership = Membership(store, self.address, ttl_s=lease_ttl_s)
        self.controller = Controller(store, self.membership, rebalance=config["auto.leader.rebalance.enable"])
        self._sync_lock = asyncio.Lock()
        self._topic_reload: asyncio.Future | None = None  # look_up_topics' reload under way
        self.engine = LogEngine(EngineSettings.from_config(config), node_id=node_id, data_dir=data_dir,
                                store=store, objects=objects, topic_info=lambda name: self.table.by_name.get(name),
                                topic_config=self.topic_config, clock=clock, metrics=metrics,
                                offline_reason=self._offline_reason)
        self.admin = TopicAdmin(config, store, self.table, self.engine,
                                live_now=self.live_ids_now, sync=lambda: self.sync_leadership(wait=True))
        self.replicas = ReplicaAdmin(store, self.table, live_now=self.live_ids_now, settle=self.settle)
        self.consumer_groups = ConsumerGroups(self._topic_ids, config=ConsumerGroupConfig(
            session_timeout_ms=config["group.consumer.session.timeout.ms"],
            heartbeat_interval_ms=config["group.consumer.heartbeat.interval.ms"],
            assignors=assignor_names(config["group.consumer.assignors"]),
            max_size=config["group.consumer.max.size"]),
            store=store, owned=self.is_coordinator_for)
        self.groups = GroupCoordinator(
            store, consumer=self.consumer_groups, owned=self.is_coordinator_for,
            initial_rebalance_delay_ms=config["group.initial.rebalance.delay.ms"],
            min_session_timeout_ms=config["group.min.session.timeout.ms"],
            max_session_timeout_ms=config["group.max.session.timeout.ms"])
        self.transactions = TransactionCoordinator(
            store, new_producer_id=self.next_producer_id, now_ms=self.now_ms,
            max_timeout_ms=config["transaction.max.timeout.ms"],
            prepared=lambda state: self.markers.kick(state))
        self.offset_expiry = OffsetExpiry(store, self.groups, coordinates=self.is_coordinator_for,
                                          now_ms=self.now_ms,
                                          retention_ms=config["offsets.retention.minutes"] * 60_000)
        self.markers = MarkerWriter(
            store, self.engine, self.transactions, coordinates=self.is_coordinator_for,
            partition_exists=lambda topic, p: 0 <= p < (self.partition_count(topic) or 0),
            now_ms=self.now_ms,
            abort_check_ms=config["transaction.abort.timed.out.transaction.cleanup.interval.ms"],
            expiration_ms=config["transactional.id.expiration.ms"],
            expiration_check_ms=config["transaction.remove.expired.transaction.cleanup.interval.ms"])
        self.snapshots = (SnapshotWriter(store, objects, now_ms=self.now_ms,
                                         interval_ms=config["coordinator.snapshot.interval.ms"],
                                         retain=config["coordinator.snapshot.retain"])
                          if isinstance(store, KVClusterStore) else None)
        self._tasks: list[asyncio.Task] = []
        self._producer_ids = (0, 0)  # next, end of the reserved block
        self._last_cleaning = self._last_wal_collection = 0.0
        # The first look comes one interval after start, not in the middle of it.
        self._last_offset_expiry = clock()
        self.group_lag: dict[tuple[str, str, int], int] = {}
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
        if self.authorizer is not None:
            await self._starting("load the ACLs", self.authorizer.start)
        await self._starting("load the client quotas", self.quotas.start)
        await self._starting("register", self.membership.start)
        await self._starting("start the WAL", self.engine.start)
        await self.groups.start()
        await self._starting("collect uncommitted WAL objects", self.engine.collect_orphan_wal_objects)
        await self._starting("run the controller", self.controller.run_once)
        await self._starting("take leadership", lambda: self.sync_leadership(wait=True))
        await self.markers.start()
        self._tasks.append(asyncio.create_task(every_tick(
            MAINTENANCE_TICK_S, self.maintain_once,
            lambda e: log.error("maintenance failed", exc_info=e)), name="maintenance"))
        # Apart from the maintenance tick: a WAL collection pass there takes seconds, and the
        # WAL commits made meanwhile would otherwise be decoded at once when it ends.
        self._tasks.append(asyncio.create_task(every_tick(
            MAINTENANCE_TICK_S, self.store.catch_up,
            lambda e: log.debug("log index catch-up failed, retrying next tick: %s", e)),
            name="log index catch-up"))
        self._tasks.append(asyncio.create_task(every_tick(
            CLUSTER_TICK_S, self._cluster_tick, lambda e: log.warning("cluster sync failed: %s", e)),
            name="cluster"))
        self.started = True

    async def _starting(self, what: str, step):
        return await start_step(what, step)

    async def stop(self, flush_timeout_s: float = 30) -> str | None:
        """Stop; returns what the WAL flush left uncommitted (None: nothing)."""
        await cancel_and_wait(self._tasks)
        await self.markers.stop()
        abandoned = await self.engine.stop(flush_timeout_s)
        await self.groups.stop()
        if self.authorizer is not None:
            await self.authorizer.stop()
        await self.quotas.stop()
        await self.membership.stop()
        await self.objects.close()
        return abandoned

    def work_in_progress(self) -> list[str]:
        """What a stop now would cut short: engine work and topic creations."""
        return self.engine.work_in_progress() + self.admin.work_in_progress()

    # ---- keeping in step with the controller -------------------------------------------

    async def _cluster_tick(self) -> None:
        """Every CLUSTER_TICK_S: membership, the controller's pass, leadership, replicas."""
        await self.membership.refresh()
        await self.controller.run_once()
        await self.sync_leadership()
        await self.tail_replicas()

    async def _load_topics(self) -> None:
        await self.table.load(self.store)

    def _assignments(self, leading: bool) -> list[Assignment]:
        """The partitions the coordinator says we lead (or replicate without leading); an
        offline partition is neither: nothing of it is read until an operator recovers it."""
        out = []
        for info in self.table.by_name.values():
            for p, st in self.table.states.get(info.topic_id, {}).items():
                mine = st.leader == self.node_id if leading else (
                    self.node_id in st.replicas and st.leader != self.node_id and not st.offline)
                if mine:
                    out.append(Assignment(info.name, info.topic_id, p, st.leader_epoch))
        return out

    async def sync_leadership(self, wait: bool = False) -> None:
        """Take the partitions the controller gave us, drop the ones it took away."""
        async with self._sync_lock:
            await self._load_topics()
            pending = self.engine.take_leadership(self._assignments(leading=True))
        if wait and pending:
            await asyncio.gather(*pending, return_exceptions=True)

    async def live_ids_now(self) -> list[int]:
        """The live gateways as the coordinator says now (the membership refreshed)."""
        return sorted(await self.membership.refresh())

    async def settle(self) -> None:
        """After an operator's change: the controller's pass and our leadership sync now,
        when we are the controller (others see it within their next tick). The change is
        already stored: a failure here only leaves it to the next tick."""
        try:
            if await self.controller.run_once():
                await self.sync_leadership()
        except Exception as e:  # noqa: BLE001 - coordinator outage: the cluster loop retries
            log.warning("applying an operator's change now failed, the next pass will: %s", e)

    async def tail_replicas(self) -> None:
        """Keep the partitions we replicate warm; lagging ones leave our ISR membership."""
        self.membership.lagging = await self.engine.follow(self._assignments(leading=False))

    # ---- periodic work -----------------------------------------------------------------

    async def maintain_once(self, force_cleaning: bool = False) -> None:
        """Roll due segments; every log.retention.check.interval.ms also apply retention,
        collect garbage and refresh group lag, and every wal.collection.interval.ms delete
        the obsolete WAL objects."""
        self.engine.roll_due()
        now = self.clock()
        if force_cleaning or now - self._last_cleaning >= self.config["log.retention.check.interval.ms"] / 1000:
            self._last_cleaning = self._last_wal_collection = now
            await self.engine.clean()
            await self.refresh_group_lag()
        elif now - self._last_wal_collection >= self.wal_collection_interval_s:
            self._last_wal_collection = now
            await self.engine.collect_obsolete_wal_objects()
        if self.clock() - self._last_offset_expiry >= self.config["offsets.retention.check.interval.ms"] / 1000:
            self._last_offset_expiry = self.clock()
            try:
                await self.offset_expiry.sweep_once()
            except CoordinatorUnavailable as e:
                log.warning("offset expiry not run, retrying next interval: %s", e)
        if self.snapshots is not None:
            try:
                await self.snapshots.maybe_write(self.controller.is_controller)
            except (CoordinatorUnavailable, ObjectStoreError) as e:
                log.warning("coordinator snapshot not written, retrying next tick: %s", e)

    @property
    def wal_collection_interval_s(self) -> float:
        ms = self.config["wal.collection.interval.ms"]
        if ms < 0:
            ms = (EMBEDDED_WAL_COLLECTION_MS if self.store.in_process
                  else self.config["log.retention.check.interval.ms"])
        return ms / 1000

    async def refresh_group_lag(self) -> None:
        lag = {}
        for group in await self.store.groups_with_offsets():
            for (topic, p), committed in (await self.store.fetch_offsets(group)).items():
                hw = self.engine.high_watermark(topic, p)
                if hw is not None:
                    lag[(group, topic, p)] = max(0, hw - committed.offset)
        self.group_lag = lag

    # ---- producer ids ------------------------------------------------------------------

    async def next_producer_id(self) -> int:
        nxt, end = self._producer_ids
        if nxt >= end:
            first = await self.store.allocate_producer_ids(PRODUCER_ID_BLOCK)
            nxt, end = first, first + PRODUCER_ID_BLOCK
        self._producer_ids = (nxt + 1, end)
        return nxt

    # ---- lookups used by handlers ------------------------------------------------------

    @property
    def topics(self) -> dict[str, TopicInfo]:
        return self.table.by_name

    @property
    def topics_by_id(self):
        return self.table.by_id

    def topic_config(self, topic: str, name: str):
        info = self.table.by_name.get(topic)
        return self.config.topic_config(info.configs if info else {}, name)

    def _topic_ids(self) -> dict[str, tuple[uuid.UUID, int]]:
        """Every topic's id and partition count (consumer-protocol assignments)."""
        return {name: (info.topic_id, info.partitions) for name, info in self.table.by_name.items()}

    def partition_count(self, topic: str) -> int | None:
        info = self.table.by_name.get(topic)
        return None if info is None else info.partitions

    async def look_up_topics(self, names, ids=()) -> None:
        """Reload the topic table when a request names a topic (or topic id) it lacks: one
        created through another gateway since this one's last sync is then known at once,
        instead of UNKNOWN_TOPIC_OR_PARTITION until the next tick. Requests that arrive while
        a reload runs share it (a reload with nothing changed reads two small coordinator
        ranges and decodes nothing)."""
        def known() -> bool:
            return all(n is None or n in self.table.by_name for n in names) and \
                all(i in self.topics_by_id for i in ids)
        if known():
            return
        joined = self._topic_reload is not None
        await self._shared_topic_reload()
        if joined and not known():
            # The reload joined may have read the coordinator before the topic was made.
            await self._shared_topic_reload()

    async def _shared_topic_reload(self) -> None:
        if self._topic_reload is None:
            self._topic_reload = asyncio.ensure_future(self._load_topics())
            self._topic_reload.add_done_callback(self._topic_reload_done)
        try:
            await asyncio.shield(self._topic_reload)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - the table stays as it was; the tick retries
            log.warning("topic table reload failed: %s", e)

    def _topic_reload_done(self, done: asyncio.Future) -> None:
        self._topic_reload = None
        if not done.cancelled():
            done.exception()  # retrieved here: every waiter may have gone

    def live_brokers(self) -> list[BrokerAddress]:
        live = self.membership.live
        return [live[i] for i in sorted(live)] or [self.address]

    def coordinator_for(self, key: str, listener: str | None = None) -> tuple[int, str, int] | None:
        """The gateway coordinating a group: a hash over the live set, the same everywhere;
        its address on `listener` (None: if it has no such listener)."""
        live = self.live_brokers()
        if not live:
            return None
        a = live[coordinator_index(key, len(live))]
        where = a.endpoint(listener)
        return None if where is None else (a.node_id, *where)

    def is_coordinator_for(self, key: str) -> bool:
        c = self.coordinator_for(key)
        return c is not None and c[0] == self.node_id

    def preferred_read_replica(self, topic: str, partition: int, client_rack: str | None) -> int:
        """KIP-392: an in-sync replica in the client's rack, when the leader is not in it."""
        if not client_rack or client_rack == self.address.rack:
            return -1
        st = self.table.state(topic, partition)
        if st is None:
            return -1
        live = self.membership.live
        for r in st.isr:
            if r != self.node_id and r in live and live[r].rack == client_rack:
                return r
        return -1

    async def see_leaders(self, infos) -> None:
        """Read the live gateways again when a partition of `infos` is led by a gateway this
        one has not seen register: the membership is otherwise read once per cluster tick,
        which a tick busy recovering partitions can stretch to seconds. A Metadata answer
        then names the new leader instead of none, which librdkafka keeps: its watermark
        and offset lookups do not ask again for a partition it holds leaderless. With the
        coordinator out of reach the answer uses the live set last read: failing the request
        would close the client's connection, and with it every produce request waiting on it."""
        live = self.membership.live
        for info in infos:
            for st in self.table.states.get(info.topic_id, {}).values():
                if st.leader >= 0 and st.leader not in live:
                    try:
                        await self.membership.refresh()
                    except CoordinatorUnavailable as e:
                        log.debug("Metadata answered with the live gateways last read: %s", e)
                    return

    async def partition_states(self, info: TopicInfo) -> dict[int, PartitionState]:
        """Leader, epoch, replicas and ISR as Metadata reports them: a dead leader is -1."""
        live = self.membership.live
        out = {}
        for p, st in self.table.states.get(info.topic_id, {}).items():
            if st.leader not in live:
                st = replace(st, leader=-1, isr=tuple(r for r in st.isr if r in live))
            out[p] = st
        return out

    def _offline_reason(self, topic: str, partition: int) -> str:
        st = self.table.state(topic, partition)
        return st.offline if st is not None else ""

    def offline_partitions(self) -> list[tuple[str, int, str]]:
        """(topic, partition, reason) of every offline partition: those the coordinator
        records offline, and those found damaged here and not yet recorded."""
        out = dict(self.engine.found_offline())
        for info in self.table.by_name.values():
            for p, st in self.table.states.get(info.topic_id, {}).items():
                if st.offline:
                    out[(info.name, p)] = st.offline
        return [(t, p, reason) for (t, p), reason in sorted(out.items())]

    async def repair_partition(self, topic: str, partition: int, *, truncate: bool):
        """The operator's recovery of an offline partition (`LogEngine.repair`); the
        controller then elects a leader, at once if it runs here."""
        await self._load_topics()
        info = self.table.by_name.get(topic)
        if info is None:
            raise UnknownTopic(topic)
        repaired = await self.engine.repair(topic, info.topic_id, partition, truncate=truncate)
        if await self.controller.run_once():
            await self.sync_leadership()
        return repaired

    def controller_id(self) -> int:
        return self.node_id if self.controller.is_controller else min(self.membership.live, default=-1)

    def led_count(self) -> int:
        return len(self.engine.led())

    def under_replicated_count(self) -> int:
        count = 0
        for (_topic, p), plog in self.engine.led().items():
            st = self.table.states.get(plog.topic_id, {}).get(p)
            if st is not None and len(st.isr) < len(st.replicas):
                count += 1
        return count
