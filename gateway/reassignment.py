"""Operators' changes to replicas and leaders: AlterPartitionReassignments,
ListPartitionReassignments and ElectLeaders, on any gateway.

A change reads the partition's state from the coordinator, decides the new one with
`stratalog.gateway.assignment` and writes it with a compare-and-set against what it read:
a controller pass (or another operator) in between makes it read and decide again. The
controller then carries it out (moves the leader, completes the reassignment), at once
when it runs on this gateway (`settle`), else within its next pass.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Collection, Iterable

from stratalog.coordinator.model import ClusterStore, Fenced, PartitionState, TopicInfo, UnknownTopic

from .assignment import cancel_reassignment, check_replicas, elect_preferred, elect_unclean, start_reassignment
from .errors import KafkaError
from .protocol.error_codes import ErrorCode
from .topic_admin import TopicTable

# A partition whose state changes under every one of these attempts is busy with the
# controller; the operator may retry.
CAS_ATTEMPTS = 5

PREFERRED, UNCLEAN = 0, 1  # ElectLeaders election types


class ReplicaAdmin:
    """Reassignments and elections on one gateway."""

    def __init__(self, store: ClusterStore, topics: TopicTable, *,
                 live_now: Callable[[], Awaitable[list[int]]], settle: Callable[[], Awaitable[None]]):
        self.store = store
        self.topics = topics
        # The live gateways read from the coordinator now, not as the membership last read
        # them: a gateway that just came back (or stopped) counts as such at once.
        self.live_now = live_now
        self.settle = settle

    async def _topic(self, name: str, partition: int) -> TopicInfo:
        info = self.topics.by_name.get(name) or await self.store.topic(name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {name!r} does not exist")
        if not 0 <= partition < info.partitions:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                             f"topic {name!r} has partitions 0..{info.partitions - 1}, not {partition}")
        return info

    async def _change(self, name: str, partition: int, decide: Callable[[PartitionState], PartitionState],
                      known: PartitionState | None = None) -> PartitionState:
        """Write decide(state) over the state it was decided from; `known` is a state
        already read (the first attempt's)."""
        info = await self._topic(name, partition)
        for _ in range(CAS_ATTEMPTS):
            old = known
            if old is None:
                try:
                    old = (await self.store.partition_states(info.topic_id)).get(partition)
                except UnknownTopic:
                    old = None
                if old is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{name}-{partition} does not exist")
            known = None
            new = decide(old)
            try:
                await self.store.set_partition_state(info.topic_id, partition, new, expect_state=old)
                return new
            except Fenced:
                continue
            except UnknownTopic:
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"{name}-{partition} does not exist") from None
        raise KafkaError(ErrorCode.REQUEST_TIMED_OUT,
                         f"{name}-{partition} changed under each of {CAS_ATTEMPTS} attempts; try again")

    async def reassign(self, name: str, partition: int, replicas: list[int] | None, live: Collection[int],
                       known: PartitionState | None = None) -> None:
        """Start a reassignment to `replicas` (gateways in `live`, read by `live_now`; the
        first preferred), or cancel the one under way with None."""
        if replicas is None:
            await self._change(name, partition, cancel_reassignment, known)
            return
        target = check_replicas(replicas, live, f"{name}-{partition}")
        await self._change(name, partition, lambda old: start_reassignment(old, target), known)

    async def elect(self, name: str, partition: int, election: int, live: Collection[int],
                    known: PartitionState | None = None) -> None:
        """ElectLeaders for one partition, `live` being the live gateways (`live_now`);
        ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE and ELIGIBLE_LEADERS_NOT_AVAILABLE
        as Kafka answers them."""
        if election == PREFERRED:
            await self._change(name, partition, lambda old: elect_preferred(old, live), known)
        elif election == UNCLEAN:
            await self._change(name, partition, lambda old: elect_unclean(old, live), known)
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"unknown election type {election}")

    async def states(self) -> dict[tuple[str, int], PartitionState]:
        """Every partition's state by (topic, partition), read at once: a request naming
        many partitions decides from these, and reads one again only when it changed."""
        return {(name, p): st for name, p, st in await self.every_partition()}

    async def every_partition(self) -> Iterable[tuple[str, int, PartitionState]]:
        """(topic, partition, state) of every partition, by topic name, read at once."""
        topics = await self.store.topics()
        states = await self.store.all_partition_states()
        out = []
        for name in sorted(topics):
            info = topics[name]
            for p, st in sorted(states.get(info.topic_id, {}).items()):
                out.append((name, p, st))
        return out

    async def ongoing(self, wanted: dict[str, list[int]] | None) -> list[tuple[str, int, PartitionState]]:
        """The reassignments under way, of the partitions named in `wanted` (None: all);
        partitions that do not exist are left out, as Kafka does."""
        out = []
        for name, p, st in await self.every_partition():
            if st.reassigning and (wanted is None or p in wanted.get(name, ())):
                out.append((name, p, st))
        return out
