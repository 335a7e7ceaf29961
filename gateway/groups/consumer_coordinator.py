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

import asyncio
import logging
import time
from typing import Any, Callable

from stratalog.gateway.protocol.error_codes import ErrorCode

from .consumer_classic import ClassicMembers
from .consumer_group import ConsumerGroup, UnreadableGroupState, from_json, new_member_id, to_json
from .consumer_membership import ConsumerGroupConfig, HeartbeatResult, Subscription, TopicLookup
from .group import Group

log = logging.getLogger(__name__)

E = ErrorCode
# How long "the store has no such consumer group" is believed (offset commits of classic
# groups would otherwise read the store every time).
ABSENT_CACHE_S = 5.0


class ConsumerGroups(ClassicMembers):
    """Consumer-protocol groups of this gateway, in memory and (with a store) stored."""

    def __init__(self, topics: TopicLookup, clock: Callable[[], float] = time.monotonic,
                 config: ConsumerGroupConfig | None = None, *,
                 new_id: Callable[[], str] = new_member_id, store: Any = None,
                 owned: Callable[[str], bool] = lambda group_id: True):
        super().__init__(topics, clock, config, new_id=new_id)
        self._store = store  # a ClusterStore, or None: groups live in memory only
        self._owned = owned  # whether this gateway coordinates a group id
        self._stored: dict[str, bytes | None] = {}  # group -> its value in the store
        self._locks: dict[str, asyncio.Lock] = {}
        self._absent: dict[str, float] = {}  # group -> when the store had none (a cache)
        self._writes: set[asyncio.Task] = set()
        self._dirty: set[str] = set()  # groups changed since their last successful write

    async def stop(self) -> None:
        for t in list(self._writes):
            t.cancel()
        await asyncio.gather(*self._writes, return_exceptions=True)
        await super().stop()
        self._stored.clear()

    def forget(self, group_id: str) -> None:
        super().forget(group_id)
        self._stored.pop(group_id, None)
        self._dirty.discard(group_id)
        # The copy is dropped because the store may hold another: it must be read again,
        # not believed absent (each heartbeat would make a new group that fails to store).
        self._absent.pop(group_id, None)

    def _after_tick(self) -> None:
        self._drop_moved()

    def _changed(self, group_id: str) -> None:
        self._dirty.add(group_id)
        self._persist_soon(group_id)

    def _drop_moved(self) -> None:
        """Forget the groups another gateway coordinates now: if one comes back here, it
        is loaded again as that gateway left it."""
        if self._store is None:
            return
        for group_id in [g for g in self._groups if not self._owned(g)]:
            log.info("group %s: coordinated elsewhere now, dropping it from memory", group_id)
            self.forget(group_id)

    # --- the stored copy --------------------------------------------------------------

    def _lock(self, group_id: str) -> asyncio.Lock:
        lock = self._locks.get(group_id)
        if lock is None:
            if len(self._locks) > 4 * len(self._groups) + 1024:  # unused ones go
                for g in [g for g, lk in self._locks.items() if not lk.locked() and g not in self._groups]:
                    del self._locks[g]
            lock = self._locks[group_id] = asyncio.Lock()
        return lock

    async def load(self, group_id: str) -> None:
        """Bring a stored group into memory if it is not there (before a heartbeat, an
        offset commit or fetch, a describe). Store failures propagate."""
        if self._store is None or not group_id or group_id in self._groups:
            return
        seen = self._absent.get(group_id)
        if seen is not None and self._clock() - seen < ABSENT_CACHE_S:
            return
        async with self._lock(group_id):
            if group_id in self._groups:
                return
            value = await self._store.consumer_group(group_id)
            if group_id in self._groups:
                return
            if value is None:
                self._absent[group_id] = self._clock()
                if len(self._absent) > 10_000:
                    self._absent.clear()
                return
            group = from_json(group_id, value)
            self._absent.pop(group_id, None)
            self._groups[group_id] = group
            self._stored[group_id] = value
            # Its topics as stored stand for a refresh interval: this gateway may have just
            # started and not loaded every topic yet, and a topic it does not know of would
            # read as deleted and take partitions away from their members.
            self._refreshed[group_id] = self._clock()
            for member in group.members.values():
                self._arm_timers(group, member)
                self._resend.add((group_id, member.member_id))
            self._schedule_idle(group)
            log.info("group %s: loaded from the coordinator at epoch %d with %d members",
                     group_id, group.group_epoch, len(group.members))

    async def persist(self, group_id: str, expect: ConsumerGroup | None = None) -> bool:
        """Store the group's current state if it changed; False if another gateway
        changed it meanwhile (then this copy is dropped), or if `expect` (the copy a
        request changed) is no longer the one in memory. Store failures propagate."""
        if self._store is None:
            return True
        async with self._lock(group_id):
            group = self._groups.get(group_id)
            if expect is not None and group is not expect:
                return False
            if group is None:
                return True
            value = to_json(group)
            before = self._stored.get(group_id)
            if value == before and group_id in self._stored:
                self._dirty.discard(group_id)
                return True
            self._dirty.add(group_id)  # until this write is known to have landed
            if not await self._store.put_consumer_group(group_id, value, before):
                log.warning("group %s: changed by another gateway; dropping this copy", group_id)
                if self._groups.get(group_id) is group:
                    self.forget(group_id)
                return False
            if self._groups.get(group_id) is group:
                self._stored[group_id] = value
                if to_json(group) == value:
                    self._dirty.discard(group_id)
            self._absent.pop(group_id, None)
            return True

    def _persist_soon(self, group_id: str) -> None:
        """Store a change no request waits for (a timer removed a member)."""
        if self._store is None:
            return
        task = asyncio.get_running_loop().create_task(self._persist_quietly(group_id))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    async def _persist_quietly(self, group_id: str) -> None:
        try:
            await self.persist(group_id)
        except Exception as e:  # noqa: BLE001 - the next heartbeat stores it again
            log.warning("group %s: storing its state failed: %s", group_id, e)

    async def adopt(self, classic: Group) -> ConsumerGroup | str:
        """`adopt_classic`, replacing whatever the store held for the id (an Empty
        consumer group a classic one took over earlier)."""
        stored = None if self._store is None else await self._store.consumer_group(classic.group_id)
        adopted = self.adopt_classic(classic)
        if isinstance(adopted, ConsumerGroup):
            self._stored[classic.group_id] = stored
            self._dirty.add(classic.group_id)
            self._absent.pop(classic.group_id, None)
        return adopted

    async def store_changes(self, group_id: str, expect: ConsumerGroup | None) -> ErrorCode | None:
        """`persist` for requests other than ConsumerGroupHeartbeat: None once stored,
        else the error to answer."""
        try:
            stored = await self.persist(group_id, expect)
        except Exception as e:  # noqa: BLE001 - the coordinator is unreachable: retried
            log.warning("group %s: storing its state failed: %s", group_id, e)
            return E.COORDINATOR_NOT_AVAILABLE
        return None if stored else E.NOT_COORDINATOR

    async def handle_heartbeat(self, group_id: str, member_id: str, member_epoch: int,
                               sub: Subscription, *, client_id: str = "", client_host: str = ""
                               ) -> HeartbeatResult:
        """`heartbeat`, with the group loaded from and stored to the coordinator."""
        try:
            await self.load(group_id)
        except UnreadableGroupState as e:
            log.error("%s", e)
            return self._fail(E.COORDINATOR_NOT_AVAILABLE, str(e))
        except Exception as e:  # noqa: BLE001 - the coordinator is unreachable: retried
            return self._fail(E.COORDINATOR_NOT_AVAILABLE, f"loading the group failed: {e}")
        before = self._fingerprint(group_id, member_id)
        result = self.heartbeat(group_id, member_id, member_epoch, sub,
                                client_id=client_id, client_host=client_host)
        if result.error in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID) and await self._superseded(group_id):
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
        if group is None or (group_id in self._stored and group_id not in self._dirty and
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

    async def _superseded(self, group_id: str) -> bool:
        """Whether the stored state differs from the one this copy was loaded or stored as."""
        if self._store is None or group_id not in self._stored:
            return False
        try:
            value = await self._store.consumer_group(group_id)
        except Exception:  # noqa: BLE001 - unreachable: answer from the copy, as before
            return False
        return value is not None and value != self._stored[group_id]

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
        if self._store is None or (member_id is None and epoch < 0):
            return None
        value = await self._store.consumer_group(group_id)
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
