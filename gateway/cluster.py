"""Gateways as a cluster: registration under a lease, the live set, and the controller.

Every gateway registers `brokers/<id>` under a lease it keeps alive; a gateway that stops
renewing (killed, paused, partitioned) disappears when the lease ends. One gateway holds
the leased `controller` key and assigns partition leaders and replicas over the live set:

- a partition whose leader is gone gets a new leader, preferring live in-sync replicas;
  any live gateway is a clean leader because every committed record is in the object store;
- every leader change bumps the leader epoch, which fences the old leader's commits;
- a controller whose own lease ended moves nothing for one lease after registering again:
  what ended its lease (the coordinator paused or out of reach) ended the others' too, and
  they are coming back;
- leaders are spread evenly: a gateway that joins takes partitions from the busiest one;
- the ISR is the live replicas that report being caught up;
- an offline partition (its data could not be recovered, `stratalog.engine.offline`) keeps
  no leader until an operator recovers it: moving it would only fail again elsewhere;
- a partition whose replicas an operator assigned keeps them, led by its preferred replica
  when alive (`stratalog.gateway.assignment`); the spreading leaves it alone.

Operators change partition states too (reassignments, elections): every write here is a
compare-and-set against the state the decision started from, so neither undoes the other.

The controller only writes partition states; each gateway reads them and takes or drops
leadership itself (`Broker.sync_leadership`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from stratalog.coordinator.model import ClusterStore, Fenced, PartitionState, TopicInfo, UnknownTopic

from .assignment import decide_assigned
from .stopping import cancel_and_wait

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerAddress:
    node_id: int
    host: str  # of the first listener (what gateways without named listeners register)
    port: int
    rack: str | None = None
    # advertised (host, port) by listener name; empty: only the address above
    endpoints: dict[str, tuple[str, int]] = field(default_factory=dict, compare=False)

    def endpoint(self, listener: str | None) -> tuple[str, int] | None:
        """Where a client of `listener` reaches this gateway; None if it has no such listener."""
        if not self.endpoints or listener is None:
            return self.host, self.port
        return self.endpoints.get(listener)


class Membership:
    """This gateway's leased registration, and the live gateways as last read."""

    def __init__(self, store: ClusterStore, address: BrokerAddress, *, ttl_s: int,
                 monotonic: Callable[[], float] = time.monotonic):
        self.store = store
        self.address = address
        self.ttl_s = ttl_s
        self.monotonic = monotonic
        self.lease: int | None = None
        self.rejoined_at: float | None = None  # when our lease last ended and we registered again
        self.live: dict[int, BrokerAddress] = {address.node_id: address}
        self.lagging: set[str] = set()  # "topic_id/partition" this gateway has not caught up on
        self._registered_lagging: set[str] | None = None
        self._lagging_by_broker: dict[int, frozenset[str]] = {}
        self._task: asyncio.Task | None = None
        # One read at a time: two overlapping reads could finish out of order and leave
        # the older live set in place.
        self._refreshing = asyncio.Lock()

    async def start(self) -> None:
        await self._register()
        await self.refresh()
        self._task = asyncio.create_task(self._keepalive(), name="lease-keepalive")

    async def _register(self) -> None:
        self.lease = await self.store.grant_lease(self.ttl_s)
        await self._put()

    async def _put(self) -> None:
        a = self.address
        await self.store.register_broker(a.node_id, a.host, a.port, a.rack, self.lease,
                                         lagging=sorted(self.lagging), endpoints=a.endpoints)
        self._registered_lagging = set(self.lagging)

    async def _keepalive(self) -> None:
        interval = max(self.ttl_s / 3, 0.2)
        while True:
            await asyncio.sleep(interval)
            try:
                await self.keep_alive_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - coordinator outage: keep trying
                log.warning("lease keepalive failed: %s", e)

    async def keep_alive_once(self) -> None:
        """Renew the lease (and the lagging list when it changed); register again when it ended."""
        if not await self.store.keepalive(self.lease):
            # Our lease ended (we or the coordinator were paused, or cut off): a
            # controller that kept its lease moves our partitions with a new epoch;
            # register again as a newcomer.
            log.warning("gateway lease expired; registering again")
            self.rejoined_at = self.monotonic()  # before the new lease can claim the controller
            await self._register()
        elif self.lagging != self._registered_lagging:
            await self._put()

    def rejoining(self) -> bool:
        """Within one lease after ours ended. Whatever ended it (the coordinator paused or
        cut off from us) most likely ended the other gateways' leases too, and they are
        registering again now: their absence from the live set says nothing yet."""
        return self.rejoined_at is not None and self.monotonic() - self.rejoined_at < self.ttl_s

    async def refresh(self) -> dict[int, BrokerAddress]:
        async with self._refreshing:
            brokers = await self.store.brokers()
            live, lagging = {}, {}
            for node_id, info in brokers.items():
                endpoints = {name: (h, p) for name, (h, p) in info.get("endpoints", {}).items()}
                live[node_id] = BrokerAddress(node_id, info["host"], info["port"], info.get("rack"), endpoints)
                lagging[node_id] = frozenset(info.get("lagging", ()))
            self.live, self._lagging_by_broker = live, lagging
            return live

    def lagging_of(self, node_id: int) -> frozenset[str]:
        return self._lagging_by_broker.get(node_id, frozenset())

    def view(self) -> tuple:
        """What the controller's decisions depend on in the membership: who is live and
        what each one lags on."""
        return tuple(sorted(self.live)), tuple(sorted(self._lagging_by_broker.items()))

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
        if self.lease is not None:
            try:
                await self.store.revoke_lease(self.lease)
            except Exception:  # noqa: BLE001 - it expires on its own
                pass


def place_replicas(live: list[int], count: int, start: int) -> list[int]:
    """`count` distinct live gateways, starting at index `start` of the sorted live list."""
    ids = sorted(live)
    return [ids[(start + i) % len(ids)] for i in range(min(count, len(ids)))]


def coordinator_index(key: str, n: int) -> int:
    """Which of n live gateways coordinates a group: the same answer on every gateway."""
    return zlib.crc32(key.encode()) % n


Plan = tuple[TopicInfo, int, "PartitionState | None", PartitionState]


def decide_partition(info: TopicInfo, p: int, old: PartitionState | None, live: list[int],
                     lagging_of: Callable[[int], frozenset[str]], *,
                     rebalance: bool = True) -> PartitionState:
    """The state a partition should have with these live gateways: replicas topped up to
    the replication factor, the ISR without lagging replicas, and a new leader (epoch + 1)
    only when the old one is dead or no longer a replica. `lagging_of(node)` names the
    "<topic id>/<partition>" the node reported not caught up on. An offline partition
    stays as it is; one with an operator's assignment follows `decide_assigned`
    (`rebalance`: auto.leader.rebalance.enable)."""
    if old is not None and old.offline:
        return old
    if old is not None and old.assigned:
        fallback = place_replicas(live, 1, p + zlib.crc32(info.name.encode()))
        return decide_assigned(old, live, f"{info.topic_id}/{p}", lagging_of,
                               fallback[0] if fallback else -1, rebalance=rebalance)
    rf = min(info.replication_factor, len(live))
    live_set = set(live)
    epoch = old.leader_epoch if old else -1
    replicas = [r for r in (old.replicas if old else ()) if r in live_set]
    for extra in place_replicas(live, len(live), p + zlib.crc32(info.name.encode())):
        if len(replicas) >= rf:
            break
        if extra not in replicas:
            replicas.append(extra)
    # Keep dead replicas listed only while there is nobody to replace them.
    if old is not None:
        for r in old.replicas:
            if r not in live_set and len(replicas) < info.replication_factor:
                replicas.append(r)
    key = f"{info.topic_id}/{p}"
    in_sync = [r for r in replicas if r in live_set and key not in lagging_of(r)]
    leader = old.leader if old else -1
    if leader not in live_set or leader not in replicas:
        candidates = in_sync or [r for r in replicas if r in live_set]
        leader = candidates[0] if candidates else -1
    if leader >= 0 and leader not in in_sync:
        in_sync.insert(0, leader)
    if old is None or leader != old.leader:
        epoch += 1
    replicas = [leader] + [r for r in replicas if r != leader] if leader >= 0 else replicas
    isr = tuple([leader] + [r for r in in_sync if r != leader]) if leader >= 0 else ()
    return PartitionState(leader, max(epoch, 0), tuple(replicas), isr)


def balance_leaders(plans: list[Plan], leaders: dict[int, int]) -> list[Plan]:
    """Move at most one leadership per pass from the busiest to the idlest gateway, so a
    newcomer fills up gradually and clients see one short move at a time. `plans` are
    (topic, partition, old state, decided state); `leaders` counts decided leaderships per
    live gateway. Partitions with an operator's assignment count but never move."""
    if len(leaders) < 2:
        return plans
    busiest = max(leaders, key=lambda b: (leaders[b], b))
    idlest = min(leaders, key=lambda b: (leaders[b], b))
    if leaders[busiest] - leaders[idlest] <= 1:
        return plans
    out = []
    moved = False
    for info, p, old, new in plans:
        if not moved and new.leader == busiest and not new.assigned:
            replicas = [idlest] + [r for r in new.replicas if r != idlest]
            replicas = replicas[:max(info.replication_factor, 1)]
            if busiest not in replicas and len(replicas) < info.replication_factor:
                replicas.append(busiest)
            isr = tuple(r for r in (idlest, *new.isr) if r in replicas)
            # decide_partition already bumped the epoch if it changed the leader itself.
            bumped = old is None or old.leader != new.leader
            epoch = new.leader_epoch if bumped else new.leader_epoch + 1
            new = PartitionState(idlest, epoch, tuple(replicas), tuple(dict.fromkeys(isr)))
            moved = True
        out.append((info, p, old, new))
    return out


class Controller:
    """Runs on every gateway; acts only while it holds the controller key."""

    def __init__(self, store: ClusterStore, membership: Membership, *,
                 on_change: Callable[[], None] | None = None, rebalance: bool = True):
        self.store = store
        self.membership = membership
        self.on_change = on_change
        self.rebalance = rebalance  # auto.leader.rebalance.enable
        self.is_controller = False
        # The inputs of the last pass that changed nothing: the same ones again would decide
        # the same, and with thousands of partitions a pass is most of an idle gateway's work.
        self._settled: tuple | None = None

    async def run_once(self) -> bool:
        """One pass; True if it changed any partition state."""
        me = self.membership.address.node_id
        holder = await self.store.claim_controller(me, self.membership.lease)
        self.is_controller = holder == me
        if not self.is_controller:
            return False
        if self.membership.rejoining():
            # Deciding on the live set now would move nearly every partition to us, and
            # back again as the others come in: a leader change per partition, twice,
            # for an outage none of them had. A gateway really gone is handled one lease late.
            return False
        live = sorted(self.membership.live)
        if not live:
            return False
        states = await self.store.all_partition_states()  # the same dict while unchanged
        view = self.membership.view()
        if self._settled is not None and self._settled[0] is states and self._settled[1] == view:
            return False
        topics = await self.store.topics()
        changed = False
        leaders: dict[int, int] = {b: 0 for b in live}
        plans: list[Plan] = []
        for info in sorted(topics.values(), key=lambda t: t.name):
            for p in range(info.partitions):
                old = states.get(info.topic_id, {}).get(p)
                new = decide_partition(info, p, old, live, self.membership.lagging_of,
                                       rebalance=self.rebalance)
                plans.append((info, p, old, new))
                if new.leader in leaders:
                    leaders[new.leader] += 1
        plans = balance_leaders(plans, leaders)
        for info, p, old, new in plans:
            if old is not None and new == old:
                continue
            try:
                await self.store.set_partition_state(info.topic_id, p, new,
                                                     expect_epoch=None if old is None else old.leader_epoch,
                                                     expect_state=old)
                changed = True
                log.info("%s-%d: leader %s -> %d (epoch %d), replicas %s, isr %s%s", info.name, p,
                         old.leader if old else None, new.leader, new.leader_epoch, list(new.replicas),
                         list(new.isr), " (reassignment complete)" if old and old.reassigning
                         and not new.reassigning else "")
            except (Fenced, UnknownTopic, ValueError) as e:
                log.info("%s-%d changed under the controller: %s", info.name, p, e)
        self._settled = None if changed else (states, view)
        if changed and self.on_change is not None:
            self.on_change()
        return changed


def new_topic_assignments(live: list[int], partitions: range, replication_factor: int,
                          name: str) -> dict[int, PartitionState]:
    """Replica placement for new partitions: round robin over live gateways."""
    offset = zlib.crc32(name.encode())
    out = {}
    for p in partitions:
        replicas = place_replicas(live, replication_factor, offset + p)
        out[p] = PartitionState(replicas[0], 0, tuple(replicas), tuple(replicas))
    return out

