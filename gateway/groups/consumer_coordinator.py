"""Consumer-protocol groups (KIP-848) of this gateway: `ConsumerMembership` (with classic
members: `ClassicMembers`) plus what consults the `ClusterStore`, keeping each group there
and the member checks OffsetCommit and OffsetFetch make.

With a `store`, each group's state (epochs, members, assignments; not deadlines) is kept
in the coordinator as well (`groups/<group>/consumer`), so when the group's coordinator
moves to another gateway the new one continues it where it was: members keep their member
ids, epochs and partitions. A heartbeat is answered only once the state it produced (or a
later one) is stored; writes compare against the value last read or written, so a gateway
that lost the group (it moved away and back, or two gateways briefly both thought they
coordinate it) drops its copy instead of overwriting the newer one.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from stratalog.gateway.protocol.error_codes import ErrorCode

from .consumer_classic import ClassicMembers
from .consumer_group import ConsumerGroup, UnreadableGroupState, from_json, new_member_id, to_json
from .consumer_membership import ConsumerGroupConfig, HeartbeatResult, Subscription, TopicLookup
from .group import Group
from .stored import StoredGroups

log = logging.getLogger(__name__)

E = ErrorCode


class ConsumerGroups(ClassicMembers):
    """Consumer-protocol groups of this gateway, in memory and (with a store) stored."""

    def __init__(self, topics: TopicLookup, clock: Callable[[], float] = time.monotonic,
                 config: ConsumerGroupConfig | None = None, *,
                 new_id: Callable[[], str] = new_member_id, store: Any = None,
                 owned: Callable[[str], bool] = lambda group_id: True):
        super().__init__(topics, clock, config, new_id=new_id)
        self._owned = owned  # whether this gateway coordinates a group id
        # With no store, groups live in memory only.
        self.stored: StoredGroups[ConsumerGroup] = StoredGroups(
            "consumer", self._groups, clock,
            read=None if store is None else store.consumer_group,
            write=None if store is None else store.put_consumer_group,
            encode=to_json, decode=from_json, loaded=self._armed, lost=self.forget)

    async def stop(self) -> None:
        await self.stored.stop()
        await super().stop()

    def forget(self, group_id: str) -> None:
        super().forget(group_id)
        self.stored.forget(group_id)

    def _after_tick(self) -> None:
        self.stored.drop_moved(self._owned, super().forget)

    def _changed(self, group_id: str) -> None:
        self.stored.persist_soon(group_id)

    # --- the stored copy --------------------------------------------------------------

    def _armed(self, group: ConsumerGroup) -> None:
        """A group just loaded from the store: every member gets a fresh session."""
        # Its topics as stored stand for a refresh interval: this gateway may have just
        # started and not loaded every topic yet, and a topic it does not know of would
        # read as deleted and take partitions away from their members.
        self._refreshed[group.group_id] = self._clock()
        for member in group.members.values():
            self._arm_timers(group, member)
            self._resend.add((group.group_id, member.member_id))
        self._schedule_idle(group)
        log.info("group %s: loaded from the coordinator at epoch %d with %d members",
                 group.group_id, group.group_epoch, len(group.members))

    async def load(self, group_id: str, *, cached: bool = True) -> None:
        """Bring a stored group into memory if it is not there (before a heartbeat, an
        offset commit or fetch, a describe; see `StoredGroups.load`). Store failures
        propagate."""
        await self.stored.load(group_id, cached=cached)

    async def persist(self, group_id: str, expect: ConsumerGroup | None = None) -> bool:
        """`StoredGroups.persist`."""
        return await self.stored.persist(group_id, expect)

    async def adopt(self, classic: Group) -> ConsumerGroup | str:
        """`adopt_classic`, replacing whatever the store held for the id (an Empty
        consumer group a classic one took over earlier)."""
        stored = await self.stored.read(classic.group_id)
        adopted = self.adopt_classic(classic)
        if isinstance(adopted, ConsumerGroup):
            self.stored.replaced(classic.group_id, stored)
        return adopted

    async def store_changes(self, group_id: str, expect: ConsumerGroup | None) -> ErrorCode | None:
        """`persist` for requests other than ConsumerGroupHeartbeat: None once stored,
        else the error to answer."""
        return await self.stored.store_changes(group_id, expect)

    async def handle_heartbeat(self, group_id: str, member_id: str, member_epoch: int,
                               sub: Subscription, *, client_id: str = "", client_host: str = ""
                               ) -> HeartbeatResult:
        """`heartbeat`, with the group loaded from and stored to the coordinator."""
        try:
            await self.load(group_id, cached=False)
        except UnreadableGroupState as e:
            log.error("%s", e)
            return self._fail(E.COORDINATOR_NOT_AVAILABLE, str(e))
        except Exception as e:  # noqa: BLE001 - the coordinator is unreachable: retried
            return self._fail(E.COORDINATOR_NOT_AVAILABLE, f"loading the group failed: {e}")
        before = self._fingerprint(group_id, member_id)
        result = self.heartbeat(group_id, member_id, member_epoch, sub,
                                client_id=client_id, client_host=client_host)
        if result.error in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID) and \
                await self.stored.superseded(group_id):
            # Another gateway changed the group after this one loaded it (coordination
            # follows each gateway's view of who is alive, so two can serve a group for a
            # moment): the member may be ahead of this copy, not behind. Answer from the
            # stored state instead of fencing it.
            self.forget(group_id)
            await self.load(group_id)
            before = self._fingerprint(group_id, member_id)
            result = self.heartbeat(group_id, member_id, member_epoch, sub,
                                    client_id=client_id, client_host=client_host)
        group = self._groups.get(group_id)
        if group is None or (self.stored.is_clean(group_id) and
                             self._fingerprint(group_id, result.member_id or member_id) == before):
            return result  # nothing to store: most heartbeats only say "still here"
        try:
            stored = await self.persist(group_id, group)
        except Exception as e:  # noqa: BLE001 - the coordinator is unreachable: retried
            self._owe_assignment(group_id, result)
            return self._fail(E.COORDINATOR_NOT_AVAILABLE, f"storing the group failed: {e}")
        if not stored:
            self._owe_assignment(group_id, result)
            return self._fail(E.NOT_COORDINATOR, "the group was changed by another coordinator")
        return result

    def _fingerprint(self, group_id: str, member_id: str) -> tuple | None:
        """What a heartbeat of this member can change that the store must learn: the
        group's epochs and membership, the member's state. Cheaper than serializing the
        group on every heartbeat; other changes mark the group dirty."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        m = group.members.get(member_id)
        mine = None if m is None else (
            m.epoch, m.previous_epoch, m.state, sorted(m.assigned.items()),
            sorted(m.pending_revocation.items()), m.subscribed_names, m.subscribed_regex,
            m.server_assignor, m.rebalance_timeout_ms, m.instance_id, m.rack_id, m.classic)
        return (id(group), group.group_epoch, group.assignment_epoch, len(group.members), mine)

    def _owe_assignment(self, group_id: str, result: HeartbeatResult) -> None:
        """The member did not get this answer: its next one carries its whole assignment."""
        if result.member_id and result.error == E.NONE:
            self._resend.add((group_id, result.member_id))

    # --- offsets ----------------------------------------------------------------------

    def check_commit(self, group_id: str, member_id: str, epoch: int,
                     partitions: list[tuple[str, int]]) -> ErrorCode | None:
        """OffsetCommit (and TxnOffsetCommit) against a consumer group: a member's commit
        must carry its epoch, or the epoch before it for partitions it still has. A commit
        with no member (epoch -1) is only taken while the group is Empty."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        if epoch < 0 and not member_id:
            return None if not group.members else E.UNKNOWN_MEMBER_ID
        member = group.members.get(member_id)
        if member is None:
            return E.UNKNOWN_MEMBER_ID
        if epoch == member.epoch:
            return None
        stale = E.ILLEGAL_GENERATION if member.classic is not None and epoch < member.epoch \
            else E.STALE_MEMBER_EPOCH
        if epoch == member.previous_epoch and epoch < member.epoch:
            topics = self._topics()
            held = {(t, p) for t, ps in member.assigned.items() for p in ps}
            if all(name in topics and (topics[name][0], p) in held for name, p in partitions):
                return None
        return stale

    def speaks_consumer_protocol(self, group_id: str, member_id: str) -> bool:
        """Whether the member heartbeats with ConsumerGroupHeartbeat (its commits then
        carry member epochs: OffsetCommit v9+), rather than being a classic member."""
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        return member is not None and member.classic is None

    def check_fetch(self, group_id: str, member_id: str | None, epoch: int) -> ErrorCode | None:
        """OffsetFetch v9 naming a member of a consumer group: it must be one, at its
        current epoch (classic groups do not check what a fetch names)."""
        return _check_fetch(self._groups.get(group_id), member_id, epoch)

    async def check_fetch_stored(self, group_id: str, member_id: str | None, epoch: int
                                 ) -> ErrorCode | None:
        """`check_fetch` on a gateway that does not coordinate the group: against the
        stored state, read now and not kept (the coordinator answers a heartbeat only once
        its state is stored, so a member's current epoch is there). Store failures
        propagate."""
        if member_id is None and epoch < 0:
            return None
        value = await self.stored.read(group_id)
        return None if value is None else _check_fetch(from_json(group_id, value), member_id, epoch)

    def subscribed_topic_names(self, group_id: str) -> set[str]:
        """Topics some member of the group is subscribed to (OffsetDelete's check)."""
        group = self._groups.get(group_id)
        if group is None:
            return set()
        topics = self._topics()
        out: set[str] = set()
        for m in group.members.values():
            out |= self._subscribed_topics(group, m, topics)
        return out


def _check_fetch(group: ConsumerGroup | None, member_id: str | None, epoch: int) -> ErrorCode | None:
    if group is None or (member_id is None and epoch < 0):
        return None
    member = group.members.get(member_id or "")
    if member is None:
        return E.UNKNOWN_MEMBER_ID
    return None if epoch == member.epoch else E.STALE_MEMBER_EPOCH
