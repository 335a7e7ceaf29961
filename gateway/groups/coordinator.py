"""The group coordinator: membership (see `membership.py`) plus everything that consults
the `ClusterStore` - committed offsets, describing, listing and deleting groups.

A group exists for these purposes when this gateway holds members or state for it in
memory, or when the store holds committed offsets for it; a group known only from its
offsets is Empty with no protocol type, like a group that only ever committed offsets.

A classic group with members is also kept in the store (`classic_state`, through
`StoredGroups`): written when its membership or generation changes (a completed join, the
leader's assignments, a member leaving or expiring; never for a heartbeat), and loaded by
the gateway that coordinates it next on first use. A Stable group goes on at its
generation with its members and assignments (each member gets a fresh session); one
caught mid-rebalance redoes the rebalance, its members keeping their ids.

Store failures are answered with COORDINATOR_NOT_AVAILABLE, which clients retry, so a
commit is either stored or reported as failed.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Mapping, TypeVar

from stratalog.coordinator.model import CommittedOffset
from stratalog.coordinator.store import GroupKeys
from stratalog.gateway.protocol.error_codes import ErrorCode

from . import classic_state
from .consumer_coordinator import ConsumerGroups
from .consumer_group import STATE_VERSION as CONSUMER_STATE_VERSION
from .consumer_group import UnreadableGroupState
from .group import CONSUMER_PROTOCOL_TYPE, Group, GroupState
from .membership import GroupConfig, JoinResult, Membership, SyncResult
from .stored import StoredGroups, parse_state

log = logging.getLogger(__name__)

E = ErrorCode
S = GroupState
GROUP_TYPE = "classic"  # the ListGroups v5 type of groups of JoinGroup/SyncGroup
CONSUMER_GROUP_TYPE = "consumer"  # ... and of groups of ConsumerGroupHeartbeat (KIP-848)
T = TypeVar("T")
TopicPartition = tuple[str, int]
# What a member is told when this copy of the group does not know it at its generation;
# the stored state may know better (another gateway changed the group meanwhile).
_MEMBER_ERRORS = (E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION, E.FENCED_INSTANCE_ID)


class StoreUnavailable(Exception):
    """The ClusterStore failed; answered as COORDINATOR_NOT_AVAILABLE."""


@dataclass(frozen=True)
class OffsetEntry:
    """One partition of an OffsetCommit."""

    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


@dataclass(frozen=True)
class MemberDescription:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class GroupDescription:
    group_id: str
    error: ErrorCode
    state: str
    protocol_type: str = ""
    protocol: str = ""
    members: tuple[MemberDescription, ...] = ()


@dataclass(frozen=True)
class GroupListing:
    group_id: str
    protocol_type: str
    state: str
    group_type: str = GROUP_TYPE


class GroupCoordinator(Membership):
    """The groups of this gateway: classic membership in memory (`Membership`), consumer-
    protocol groups in `consumer` (`ConsumerGroups`), offsets of both in the store.

    A group id names one kind of group at a time: a ConsumerGroupHeartbeat takes over the
    id of an Empty classic group and a JoinGroup that of an Empty consumer group (their
    committed offsets stay), while a group with members refuses the other protocol."""

    def __init__(self, store: Any, clock: Callable[[], float] = time.monotonic,
                 config: GroupConfig | None = None, *,
                 wall_clock: Callable[[], float] = time.time,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
                 consumer: ConsumerGroups | None = None,
                 owned: Callable[[str], bool] = lambda group_id: True,
                 keep_state: bool = True, **settings: Any):
        """`settings` are GroupConfig fields by name, e.g. initial_rebalance_delay_ms=0;
        `owned` says whether this gateway coordinates a group id; `keep_state` False keeps
        classic groups in memory only."""
        super().__init__(store, clock, config, new_uuid=new_uuid, **settings)
        self._wall_clock = wall_clock
        self._owned = owned
        self.consumer = consumer if consumer is not None else ConsumerGroups(lambda: {}, clock)
        keep = keep_state and store is not None
        self.classic: StoredGroups[Group] = StoredGroups(
            "classic", self._groups, clock,
            read=store.classic_group if keep else None,
            write=store.put_classic_group if keep else None,
            encode=classic_state.to_json, decode=classic_state.from_json,
            loaded=self._resume, lost=lambda group_id: self.release(self._groups[group_id]))

    async def start(self) -> None:
        await super().start()
        await self.consumer.start()

    async def stop(self) -> None:
        await self.classic.stop()
        await self.consumer.stop()
        await super().stop()

    # --- the stored copy of classic groups ------------------------------------------------

    def _changed(self, group: Group) -> None:
        self.classic.persist_soon(group.group_id)

    def _after_tick(self) -> None:
        self.classic.drop_moved(self._owned, lambda group_id: self.release(self._groups[group_id]))

    def forget(self, group: Group) -> None:
        super().forget(group)
        self.classic.forget(group.group_id)

    def _resume(self, group: Group) -> None:
        """A group just loaded from the store: a Stable one goes on as it was, with fresh
        sessions; one caught mid-rebalance redoes it (members rejoin, keeping their ids,
        when their heartbeats get REBALANCE_IN_PROGRESS)."""
        for member in group.members.values():
            self._schedule_session(group, member)
        log.info("group %s: loaded from the coordinator, %s at generation %d with %d members",
                 group.group_id, group.state.value, group.generation_id, len(group.members))
        if not group.is_(S.STABLE):
            group.state = S.COMPLETING_REBALANCE  # where a rebalance can start over from
            self._prepare_rebalance(group, "loaded from the coordinator mid-rebalance")

    async def _load(self, group_id: str, *, cached: bool = True) -> None:
        """Bring the group's stored classic state into memory if this gateway has none
        (`StoredGroups.load`; unreadable state and store failures propagate)."""
        if group_id and group_id not in self._groups:
            await self.classic.load(group_id, cached=cached)

    async def _reloaded(self, group_id: str, error: ErrorCode) -> bool:
        """After this copy refused a member: whether another gateway changed the group in
        the store since this one loaded or wrote it; then the copy is replaced by the
        stored state and the caller asks again."""
        if error not in _MEMBER_ERRORS or not await self.classic.superseded(group_id):
            return False
        group = self._groups.get(group_id)
        if group is not None:
            self.release(group)
        self.classic.forget(group_id)
        try:
            await self.classic.load(group_id)
        except Exception as e:  # noqa: BLE001 - answered from no copy: the member rejoins
            log.warning("group %s: reloading it failed: %s", group_id, e)
        return True

    async def _stored_join(self, group_id: str, member_id: str, kw: dict[str, Any]) -> JoinResult:
        result = await super().join_group(group_id, member_id, **kw)
        if await self._reloaded(group_id, result.error):
            result = await super().join_group(group_id, member_id, **kw)
        error = await self.classic.store_changes(group_id, self._groups.get(group_id))
        return result if error is None else JoinResult(error, member_id)

    async def _stored_sync(self, group_id: str, generation_id: int, member_id: str,
                           kw: dict[str, Any]) -> SyncResult:
        result = await super().sync_group(group_id, generation_id, member_id, **kw)
        if await self._reloaded(group_id, result.error):
            result = await super().sync_group(group_id, generation_id, member_id, **kw)
        error = await self.classic.store_changes(group_id, self._groups.get(group_id))
        return result if error is None else SyncResult(error)

    # --- the two protocols on one group id ------------------------------------------------

    async def make_way_for_consumer_protocol(self, group_id: str) -> tuple[ErrorCode, str] | None:
        """Before a ConsumerGroupHeartbeat: a classic group holding the id is forgotten if
        Empty, upgraded online if Stable (`ConsumerGroups.adopt`); otherwise the error to
        answer (COORDINATOR_NOT_AVAILABLE, retried, while it rebalances)."""
        group = self._groups.get(group_id)
        if group is None or group.is_(S.DEAD):
            return None
        if group.is_(S.EMPTY) and not group.members and not group.pending_members:
            self.forget(group)
            return None
        try:
            adopted = await self.consumer.adopt(group)
        except Exception as e:  # noqa: BLE001 - the coordinator is unreachable: retried
            return E.COORDINATOR_NOT_AVAILABLE, f"reading the group failed: {e}"
        if isinstance(adopted, str):
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                return E.GROUP_ID_NOT_FOUND, adopted
            return E.COORDINATOR_NOT_AVAILABLE, adopted
        if self._groups.get(group_id) is group:
            # Its stored classic state goes too, or a later load would find it again.
            group.transition(S.DEAD)
            error = await self.classic.store_changes(group_id, group)
            self.forget(group)
            if error is not None:
                log.warning("group %s: its classic state could not be removed (%s)",
                            group_id, error.name)
        return None

    async def _consumer_group_in_use(self, group_id: str) -> bool:
        """Whether a consumer-protocol group with members holds the id (classic requests
        are then answered as its classic members'); an Empty one is forgotten so the
        classic protocol can take over. A stored classic group is loaded first. Store
        failures propagate."""
        # Membership requests read the store past its "no such group" cache: this gateway
        # may have just become the coordinator of a group another one stored.
        await self._load(group_id, cached=False)
        classic = self._groups.get(group_id)
        if classic is not None and not classic.is_(S.DEAD):
            return False  # an id is one kind at a time: no need to look in the store
        await self.consumer.load(group_id, cached=False)
        group = self.consumer.group(group_id)
        if group is None:
            return False
        if not group.members:
            self.consumer.forget(group_id)
            return False
        return True

    async def join_group(self, group_id: str, member_id: str, **kw: Any) -> JoinResult:
        try:
            in_use = bool(group_id) and await self._consumer_group_in_use(group_id)
        except Exception:  # noqa: BLE001
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id)
        if not in_use:
            return await self._stored_join(group_id, member_id, kw)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= kw["session_timeout_ms"] <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id)
        group = self.consumer.group(group_id)
        r = self.consumer.classic_join(
            group_id, member_id, instance_id=kw.get("group_instance_id"),
            protocol_type=kw["protocol_type"],
            protocols=tuple((n, bytes(m)) for n, m in kw["protocols"]),
            session_timeout_ms=kw["session_timeout_ms"],
            rebalance_timeout_ms=kw["rebalance_timeout_ms"], client_id=kw.get("client_id", ""),
            client_host=kw.get("client_host", ""),
            require_known_member_id=kw.get("require_known_member_id", True))
        error = await self.consumer.store_changes(group_id, group)
        if error is not None:
            return JoinResult(error, member_id)
        if r.error != E.NONE:
            return JoinResult(r.error, r.member_id)
        # No leader: the gateway assigns, so no member runs a client-side assignor.
        return JoinResult(E.NONE, r.member_id, r.generation_id, CONSUMER_PROTOCOL_TYPE,
                          r.protocol_name, "", ())

    async def sync_group(self, group_id: str, generation_id: int, member_id: str, **kw: Any
                         ) -> SyncResult:
        try:
            in_use = bool(group_id) and await self._consumer_group_in_use(group_id)
        except Exception:  # noqa: BLE001
            return SyncResult(E.COORDINATOR_NOT_AVAILABLE)
        if not in_use:
            return await self._stored_sync(group_id, generation_id, member_id, kw)
        r = self.consumer.classic_sync(group_id, generation_id, member_id,
                                       instance_id=kw.get("group_instance_id"),
                                       protocol_type=kw.get("protocol_type"),
                                       protocol_name=kw.get("protocol_name"))
        if r.error != E.NONE:
            return SyncResult(r.error)
        return SyncResult(E.NONE, CONSUMER_PROTOCOL_TYPE, kw.get("protocol_name"), r.assignment)

    async def heartbeat_any(self, group_id: str, generation_id: int, member_id: str,
                            group_instance_id: str | None = None) -> ErrorCode:
        """Heartbeat of a classic member, in a classic or a consumer-protocol group."""
        try:
            in_use = bool(group_id) and await self._consumer_group_in_use(group_id)
        except Exception:  # noqa: BLE001
            return E.COORDINATOR_NOT_AVAILABLE
        if not in_use:
            error = self.heartbeat(group_id, generation_id, member_id, group_instance_id)
            if await self._reloaded(group_id, error):
                error = self.heartbeat(group_id, generation_id, member_id, group_instance_id)
            return error  # nothing to store: a heartbeat only says "still here"
        return self.consumer.classic_heartbeat(group_id, generation_id, member_id, group_instance_id)

    async def leave_any(self, group_id: str, members: list[tuple[str, str | None]],
                        reason: str | None = None) -> tuple[ErrorCode, list[ErrorCode]]:
        """LeaveGroup, from a classic or a consumer-protocol group."""
        try:
            in_use = bool(group_id) and await self._consumer_group_in_use(group_id)
        except Exception:  # noqa: BLE001
            return E.COORDINATOR_NOT_AVAILABLE, []
        if not in_use:
            outcome = self.leave_group(group_id, members, reason)
            error = await self.classic.store_changes(group_id, self._groups.get(group_id))
            return outcome if error is None else (error, [])
        group = self.consumer.group(group_id)
        errors = self.consumer.classic_leave(group_id, members)
        error = await self.consumer.store_changes(group_id, group)
        return (error, []) if error is not None else (E.NONE, errors)

    async def _store(self, what: str, call: Awaitable[T]) -> T:
        try:
            return await call
        except Exception as e:
            log.exception("group store %s failed", what)
            raise StoreUnavailable(f"{what}: {e}") from e

    # --- OffsetCommit -----------------------------------------------------------------

    async def commit_offsets(self, group_id: str, offsets: Mapping[TopicPartition, OffsetEntry],
                             *, generation_id: int = -1, member_id: str = "",
                             group_instance_id: str | None = None
                             ) -> dict[TopicPartition, ErrorCode]:
        """Store offsets for a group; one error per partition.

        A commit naming a generation, member or instance must come from a current member
        of the current generation; an anonymous one (generation -1, no member) only when
        the group has no members.
        """
        named = generation_id >= 0 or bool(member_id) or group_instance_id is not None
        try:
            await self._load(group_id, cached=not named)
            if group_id not in self._groups:  # a classic group here: no consumer one
                await self.consumer.load(group_id, cached=not named)
        except Exception as e:  # noqa: BLE001 - unreadable, or the store is unreachable
            log.warning("group %s: could not load its stored state: %s", group_id, e)
            return {tp: E.COORDINATOR_NOT_AVAILABLE for tp in offsets}
        if self.consumer.group(group_id) is not None:
            error = self.consumer.check_commit(group_id, member_id, generation_id, list(offsets))
        else:
            error = self._validate_commit(group_id, generation_id, member_id, group_instance_id)
            if error is not None and await self._reloaded(group_id, error):
                error = self._validate_commit(group_id, generation_id, member_id, group_instance_id)
        if error is not None:
            return {tp: error for tp in offsets}
        now_ms = int(self._wall_clock() * 1000)
        errors: dict[TopicPartition, ErrorCode] = {}
        accepted: dict[TopicPartition, CommittedOffset] = {}
        limit = self.config.max_metadata_bytes
        for tp, entry in offsets.items():
            metadata = entry.metadata or ""
            if len(metadata.encode()) > limit:
                errors[tp] = E.OFFSET_METADATA_TOO_LARGE
            else:
                accepted[tp] = CommittedOffset(entry.offset, entry.leader_epoch, metadata, now_ms)
        if accepted:
            try:
                await self._store("commit_offsets", self.store.commit_offsets(group_id, accepted))
                outcome = E.NONE
            except StoreUnavailable:
                outcome = E.COORDINATOR_NOT_AVAILABLE
            errors.update((tp, outcome) for tp in accepted)
        return errors

    def _validate_commit(self, group_id: str, generation_id: int, member_id: str,
                         instance_id: str | None) -> ErrorCode | None:
        group = self._groups.get(group_id)
        named = generation_id >= 0 or member_id != "" or instance_id is not None
        if group is None:
            if generation_id >= 0:
                return E.ILLEGAL_GENERATION  # from a generation this coordinator never had
            return E.UNKNOWN_MEMBER_ID if named else None
        if group.is_(S.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        if not named:
            return None if group.is_(S.EMPTY) else E.UNKNOWN_MEMBER_ID
        error = self._validate_member(group, member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        if group.is_(S.COMPLETING_REBALANCE):
            # A valid member that has its JoinGroup answer but not its assignment yet.
            return E.REBALANCE_IN_PROGRESS
        # Stable, or PreparingRebalance, where commits still count: the member learns about
        # the rebalance from its next heartbeat. A commit is also a sign of life.
        self._schedule_session(group, group.members[member_id])
        return None

    async def check_member(self, group_id: str, generation_id: int, member_id: str,
                           group_instance_id: str | None,
                           partitions: list[tuple[str, int]]) -> ErrorCode | None:
        """TxnOffsetCommit (KIP-447): the consumer a producer commits for must be a current
        member of the current generation, as for its own commits; None if it is. A stale
        member epoch of a consumer group is ILLEGAL_GENERATION here, as in Kafka:
        STALE_MEMBER_EPOCH is not among TxnOffsetCommit's errors, and Kafka's Java producer
        takes an unexpected code as fatal where ILLEGAL_GENERATION is a CommitFailedException
        the application can recover from."""
        try:
            await self._load(group_id, cached=False)
        except Exception as e:  # noqa: BLE001 - unreadable, or the store is unreachable
            log.warning("group %s: could not load its stored state: %s", group_id, e)
            return E.COORDINATOR_NOT_AVAILABLE
        if self.consumer.group(group_id) is not None:
            error = self.consumer.check_commit(group_id, member_id, generation_id, partitions)
            return E.ILLEGAL_GENERATION if error == E.STALE_MEMBER_EPOCH else error
        return self._validate_commit(group_id, generation_id, member_id, group_instance_id)

    # --- OffsetFetch ------------------------------------------------------------------

    async def unstable_partitions(self, group_id: str) -> set[TopicPartition]:
        """Partitions with offsets committed by a transaction not yet ended (OffsetFetch
        with require_stable answers them UNSTABLE_OFFSET_COMMIT, and the client retries)."""
        pending = await self._store("pending_offsets", self.store.pending_offsets(group_id))
        return {tp for offsets in pending.values() for tp in offsets}

    async def fetch_offsets(self, group_id: str, partitions: Iterable[TopicPartition] | None = None,
                            *, require_stable: bool = False
                            ) -> tuple[ErrorCode, dict[TopicPartition, CommittedOffset]]:
        """Committed offsets of a group: the given partitions that have one, or all.

        `require_stable` is answered by the handler (see `unstable_partitions`).
        """
        try:
            stored = await self._store("fetch_offsets", self.store.fetch_offsets(group_id))
        except StoreUnavailable:
            return E.COORDINATOR_NOT_AVAILABLE, {}
        if partitions is None:
            return E.NONE, dict(stored)
        return E.NONE, {tp: stored[tp] for tp in partitions if tp in stored}

    # --- OffsetDelete -----------------------------------------------------------------

    async def delete_offsets(self, group_id: str, partitions: Iterable[TopicPartition]
                             ) -> tuple[ErrorCode, dict[TopicPartition, ErrorCode]]:
        """Delete committed offsets of partitions no live member consumes."""
        if not group_id:
            return E.INVALID_GROUP_ID, {}
        partitions = list(dict.fromkeys(partitions))
        group = self._groups.get(group_id)
        if group is None and self.consumer.group(group_id) is None:
            try:
                stored = await self._store("fetch_offsets", self.store.fetch_offsets(group_id))
            except StoreUnavailable:
                return E.COORDINATOR_NOT_AVAILABLE, {}
            if not stored:
                return E.GROUP_ID_NOT_FOUND, {}
            group = self._groups.get(group_id)  # it may have gained members meanwhile
        errors: dict[TopicPartition, ErrorCode] = {}
        consumer = self.consumer.group(group_id)
        if consumer is not None and consumer.members:
            subscribed_names = self.consumer.subscribed_topic_names(group_id)
            for tp in partitions:
                if tp[0] in subscribed_names:
                    errors[tp] = E.GROUP_SUBSCRIBED_TO_TOPIC
        if group is not None and group.is_(S.DEAD):
            return E.GROUP_ID_NOT_FOUND, {}
        if group is not None and not group.is_(S.EMPTY):
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                return E.NON_EMPTY_GROUP, {}
            subscribed = group.subscribed_topics()
            for tp in partitions:
                if subscribed is None or tp[0] in subscribed:
                    errors[tp] = E.GROUP_SUBSCRIBED_TO_TOPIC
        eligible = [tp for tp in partitions if tp not in errors]
        if eligible:
            try:
                await self._store("delete_offsets", self.store.delete_offsets(group_id, eligible))
                outcome = E.NONE
            except StoreUnavailable:
                return E.COORDINATOR_NOT_AVAILABLE, {}
            errors.update((tp, outcome) for tp in eligible)
        return E.NONE, {tp: errors[tp] for tp in partitions}

    # --- DescribeGroups ---------------------------------------------------------------

    async def describe_group(self, group_id: str) -> GroupDescription:
        try:
            await self._load(group_id)
        except Exception as e:  # noqa: BLE001 - unreadable, or the store is unreachable
            log.warning("group %s: could not load its stored state: %s", group_id, e)
            return GroupDescription(group_id, E.COORDINATOR_NOT_AVAILABLE, "")
        if self.consumer.group(group_id) is not None:
            # Not a classic group: DescribeGroups up to v5 answers Dead, as Kafka does
            # (ConsumerGroupDescribe describes it).
            return GroupDescription(group_id, E.NONE, S.DEAD.value)
        group = self._groups.get(group_id)
        if group is not None and not group.is_(S.DEAD):
            return describe(group)
        if group_id:
            try:
                stored = await self._store("fetch_offsets", self.store.fetch_offsets(group_id))
            except StoreUnavailable:
                return GroupDescription(group_id, E.COORDINATOR_NOT_AVAILABLE, "")
            if stored:
                return GroupDescription(group_id, E.NONE, S.EMPTY.value)
        return GroupDescription(group_id, E.NONE, S.DEAD.value)

    # --- ListGroups -------------------------------------------------------------------

    async def list_groups(self, states: Iterable[str] | None = None,
                          types: Iterable[str] | None = None,
                          owned: Callable[[str], bool] = lambda group_id: True
                          ) -> tuple[ErrorCode, list[GroupListing]]:
        """Groups in memory and groups with committed offsets that `owned` says this
        gateway coordinates, filtered by state and type names (case-insensitive; an empty
        filter keeps everything)."""
        try:
            # Consumer-protocol groups this gateway coordinates but has not loaded yet (it
            # became their coordinator and no member has heartbeated since): loading them
            # lists them as they are, and lets the sessions of members gone meanwhile end.
            for group_id in await self.store.consumer_group_ids():
                if owned(group_id) and self.consumer.group(group_id) is None \
                        and group_id not in self._groups:
                    try:
                        await self.consumer.load(group_id, cached=False)
                    except UnreadableGroupState as e:
                        log.error("%s", e)  # listed below as a group with offsets
            # ... and classic groups likewise.
            for group_id in await self.store.classic_group_ids():
                if owned(group_id) and group_id not in self._groups:
                    try:
                        await self._load(group_id, cached=False)
                    except UnreadableGroupState as e:
                        log.error("%s", e)
        except Exception as e:  # noqa: BLE001 - the store is unreachable
            log.warning("listing consumer-protocol groups failed: %s", e)
            return E.COORDINATOR_NOT_AVAILABLE, []
        listings = {g.group_id: GroupListing(g.group_id, g.protocol_type or "", g.state.value)
                    for g in self._groups.values() if not g.is_(S.DEAD)}
        for cg in self.consumer.groups():
            listings[cg.group_id] = GroupListing(cg.group_id, CONSUMER_PROTOCOL_TYPE,
                                                 cg.state.value, CONSUMER_GROUP_TYPE)
        try:
            with_offsets = await self._store("groups_with_offsets",
                                             self.store.groups_with_offsets())
        except StoreUnavailable:
            return E.COORDINATOR_NOT_AVAILABLE, []
        for group_id in with_offsets:
            if group_id not in listings and owned(group_id):
                listings[group_id] = GroupListing(group_id, "", S.EMPTY.value)
        wanted_states = {s.lower() for s in states or ()}
        wanted_types = {t.lower() for t in types or ()}
        return E.NONE, [
            g for g in listings.values()
            if (not wanted_states or g.state.lower() in wanted_states)
            and (not wanted_types or g.group_type.lower() in wanted_types)]

    # --- DeleteGroups -----------------------------------------------------------------

    async def delete_group(self, group_id: str) -> ErrorCode:
        """Delete an Empty group and its committed offsets."""
        try:
            await self.consumer.load(group_id, cached=False)
        except Exception:  # noqa: BLE001
            return E.COORDINATOR_NOT_AVAILABLE
        consumer = self.consumer.group(group_id)
        if consumer is not None:
            if consumer.members:
                return E.NON_EMPTY_GROUP
            self.consumer.forget(group_id)
        group = self._groups.get(group_id)
        if consumer is not None:
            pass  # an Empty consumer group: only its offsets are left
        elif group is not None:
            if group.is_(S.DEAD):
                return E.GROUP_ID_NOT_FOUND
            if not group.is_(S.EMPTY):
                return E.NON_EMPTY_GROUP
            self.forget(group)
        else:
            try:
                stored = await self._store("fetch_offsets", self.store.fetch_offsets(group_id))
            except StoreUnavailable:
                return E.COORDINATOR_NOT_AVAILABLE
            if not stored:
                return E.GROUP_ID_NOT_FOUND
            group = self._groups.get(group_id)  # members may have arrived while we looked
            if group is not None:
                if not group.is_(S.EMPTY):
                    return E.NON_EMPTY_GROUP
                self.forget(group)
        try:
            await self._store("delete_offsets", self.store.delete_offsets(group_id, None))
        except StoreUnavailable:
            return E.COORDINATOR_NOT_AVAILABLE
        log.info("group %s deleted", group_id)
        return E.NONE

    # --- offset expiry (expiry.py) --------------------------------------------------------

    def has_members(self, group_id: str, keys: GroupKeys) -> bool:
        """Whether the group has members, here in memory or in its stored state (`keys`,
        read by the caller); a state this gateway cannot read counts as having some."""
        classic = self._groups.get(group_id)
        consumer = self.consumer.group(group_id)
        if classic is not None or consumer is not None:  # newer than the stored copy
            return bool((classic is not None and classic.members) or (consumer is not None and consumer.members))
        if keys.classic:
            return True  # kept only while the group has members
        if keys.consumer is None:
            return False
        try:
            return bool(parse_state("consumer", group_id, keys.consumer, CONSUMER_STATE_VERSION)["members"])
        except (UnreadableGroupState, KeyError, TypeError):
            return True

    async def expire_group(self, group_id: str) -> bool:
        """Delete a group offset expiry found idle, as DeleteGroups would; True if deleted."""
        error = await self.delete_group(group_id)
        if error is E.GROUP_ID_NOT_FOUND:  # no offsets: only its expiry clock was left
            try:
                await self._store("delete_offsets", self.store.delete_offsets(group_id, None))
            except StoreUnavailable:
                return False
            return True
        return error is E.NONE


def describe(group: Group) -> GroupDescription:
    """A group's summary; metadata, assignments and the protocol are only reported once
    the generation is Stable, as Kafka does."""
    stable = group.is_(S.STABLE)
    protocol = group.protocol_name or ""
    members = tuple(
        MemberDescription(m.member_id, m.group_instance_id, m.client_id, m.client_host,
                          m.metadata(protocol) if stable else b"",
                          m.assignment if stable else b"")
        for m in group.members.values())
    return GroupDescription(group.group_id, E.NONE, group.state.value, group.protocol_type or "",
                            protocol if stable else "", members)
