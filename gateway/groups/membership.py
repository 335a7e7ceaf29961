"""Classic group membership: JoinGroup, SyncGroup, Heartbeat and LeaveGroup, in memory.

Every operation runs to completion on the event loop without awaiting in between, so a
group never changes under a request half-way through. A JoinGroup or SyncGroup that must
wait for other members gets an `asyncio.Future` parked on its member, answered when the
rebalance moves on; handlers await it shielded, so a client that goes away never cancels
the group's bookkeeping.

Time comes from the injected `clock` (seconds) through `Timers`, one named timer each for:
- ("join", group): completion of the rebalance - the initial delay of a group that was
  Empty (group.initial.rebalance.delay.ms, extended while new members keep arriving, up to
  the rebalance timeout) or the rebalance timeout, after which members that did not rejoin
  are removed;
- ("sync", group): members of a new generation that never send SyncGroup within the
  rebalance timeout are removed and the group rebalances again;
- ("member", group, member): the session timeout, reset by heartbeats (new members get the
  5-minute join timeout instead);
- ("pending", group, member): a member id handed out with MEMBER_ID_REQUIRED is forgotten
  after the session timeout if its owner never joins with it;
- ("idle", group): an Empty group is dropped from memory after a while, so short-lived
  group ids do not accumulate.

`start()` runs the timers in a background task; tests call `tick()` after moving a fake
clock instead. What needs the `ClusterStore` (offsets, listing, deletion) is in
`coordinator.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.protocol.wire import DecodeError
from stratalog.gateway.stopping import cancel_and_wait

from .group import CONSUMER_PROTOCOL_TYPE, Group, GroupState, Member, Protocols, parse_subscription
from .timers import Timers, drive

log = logging.getLogger(__name__)

E = ErrorCode
S = GroupState
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000  # Kafka's fixed timeout for a join that never completes


@dataclass(frozen=True)
class GroupConfig:
    """Coordinator settings, named after Kafka's broker settings."""

    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    max_group_size: int | None = None  # group.max.size (None: unlimited)
    max_metadata_bytes: int = 4096  # offset.metadata.max.bytes
    # How long an Empty group's in-memory state (protocol type, generation) is kept; its
    # committed offsets stay in the store regardless.
    empty_group_retention_ms: int = 600_000


@dataclass(frozen=True)
class JoinResult:
    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # only the leader gets these
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncResult:
    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class Membership:
    """Membership and rebalances of every classic group this gateway coordinates."""

    def __init__(self, store: Any, clock: Callable[[], float] = time.monotonic,
                 config: GroupConfig | None = None, *,
                 new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()), **settings: Any):
        self.store = store
        # Keyword settings (GroupConfig field names) override `config`.
        self.config = dataclasses.replace(config or GroupConfig(), **settings)
        self._clock = clock
        self._new_uuid = new_uuid
        self._groups: dict[str, Group] = {}
        self._timers = Timers()
        self._task: asyncio.Task | None = None
        self._wakeup = asyncio.Event()

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="group-timers")

    async def stop(self) -> None:
        """Stop the timers and answer every waiting request with NOT_COORDINATOR, as Kafka
        does when a coordinator gives its groups up."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        for group in list(self._groups.values()):
            for member in group.members.values():
                self._answer_join(member, JoinResult(E.NOT_COORDINATOR, member.member_id))
                self._answer_sync(member, SyncResult(E.NOT_COORDINATOR))
            group.transition(S.DEAD)
        self._groups.clear()
        self._timers = Timers()

    def tick(self) -> int:
        """Fire every timer that is due on the clock; returns how many fired."""
        return self._timers.fire_due(self._clock())

    async def _run(self) -> None:
        await drive(lambda: self._timers, self._clock, self._wakeup, "group timer",
                    self._after_tick)

    def _after_tick(self) -> None:
        """Periodic work of a subclass, run with the timers."""

    def _changed(self, group: Group) -> None:
        """A group's membership or generation changed, maybe with no request waiting for
        it (a timer removed a member): a subclass may store it."""

    def _schedule(self, key: tuple, delay_ms: float, action: Callable[[], None]) -> None:
        if self._timers.schedule(key, self._clock() + delay_ms / 1000.0, action):
            self._wakeup.set()

    # --- lookups ----------------------------------------------------------------------

    def group(self, group_id: str) -> Group | None:
        """The in-memory group (None if this coordinator has no members or state for it)."""
        return self._groups.get(group_id)

    def groups(self) -> list[Group]:
        return list(self._groups.values())

    # --- JoinGroup --------------------------------------------------------------------

    async def join_group(self, group_id: str, member_id: str, *,
                         group_instance_id: str | None = None, client_id: str = "",
                         client_host: str = "", session_timeout_ms: int,
                         rebalance_timeout_ms: int, protocol_type: str,
                         protocols: Protocols, require_known_member_id: bool = True,
                         supports_skip_assignment: bool = False,
                         reason: str | None = None) -> JoinResult:
        """Join (or rejoin) a group; returns when the rebalance has chosen a generation."""
        outcome = self._join(group_id, member_id, group_instance_id, client_id, client_host,
                             session_timeout_ms, rebalance_timeout_ms, protocol_type,
                             tuple((n, bytes(m)) for n, m in protocols),
                             require_known_member_id, supports_skip_assignment, reason)
        if isinstance(outcome, JoinResult):
            return outcome
        return await asyncio.shield(outcome)

    def _join(self, group_id, member_id, instance_id, client_id, client_host, session_ms,
              rebalance_ms, protocol_type, protocols, require_known, skip_ok, reason):
        if not group_id:
            return JoinResult(E.INVALID_GROUP_ID, member_id)
        cfg = self.config
        if not cfg.min_session_timeout_ms <= session_ms <= cfg.max_session_timeout_ms:
            return JoinResult(E.INVALID_SESSION_TIMEOUT, member_id)
        unknown = member_id == ""
        group = self._groups.get(group_id)
        if group is None:
            if not unknown:
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)
            group = self._groups[group_id] = Group(group_id)
        if not self._accepts_joining(group, member_id):
            if member_id in group.members:
                self._remove_member(group, group.members[member_id], "group is full")
            return JoinResult(E.GROUP_MAX_SIZE_REACHED, member_id)
        args = (client_id, client_host, session_ms, rebalance_ms, protocol_type, protocols, reason)
        if unknown:
            result = self._join_new(group, instance_id, require_known, skip_ok, *args)
        else:
            result = self._join_known(group, member_id, instance_id, *args)
        self._maybe_complete_join(group)
        self._schedule_idle(group)
        return result

    def _accepts_joining(self, group: Group, member_id: str) -> bool:
        limit = self.config.max_group_size
        if limit is None or group.is_(S.EMPTY, S.DEAD):
            return True
        member = group.members.get(member_id)
        if group.is_(S.PREPARING_REBALANCE):
            return (member is not None and member.awaiting_join) or \
                group.awaiting_join_count() < limit
        return member is not None or len(group.members) < limit

    def _join_new(self, group, instance_id, require_known, skip_ok, client_id, client_host,
                  session_ms, rebalance_ms, protocol_type, protocols, reason):
        if group.is_(S.DEAD):
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, "")
        replaced = group.static_members.get(instance_id) if instance_id is not None else None
        names = [n for n, _ in protocols]
        if not group.supports_protocols(protocol_type, names, excluding=replaced):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, "")
        new_id = f"{instance_id if instance_id is not None else client_id}-{self._new_uuid()}"
        if replaced is not None:
            return self._replace_static_member(group, instance_id, replaced, new_id, protocols,
                                               session_ms, rebalance_ms, skip_ok, reason)
        if instance_id is None and require_known:
            # The client must come back with this id, so a client that retries a join it
            # gave up on cannot leave defunct members behind.
            group.pending_members.add(new_id)
            self._schedule(("pending", group.group_id, new_id), session_ms,
                           lambda: self._expire_pending(group, new_id))
            return JoinResult(E.MEMBER_ID_REQUIRED, new_id)
        return self._add_member(group, new_id, instance_id, client_id, client_host, session_ms,
                                rebalance_ms, protocol_type, protocols, reason)

    def _join_known(self, group, member_id, instance_id, client_id, client_host, session_ms,
                    rebalance_ms, protocol_type, protocols, reason):
        if group.is_(S.DEAD):
            return JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id)
        names = [n for n, _ in protocols]
        if not group.supports_protocols(protocol_type, names, excluding=member_id):
            return JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if member_id in group.pending_members:
            if instance_id is not None:
                # Pending ids are only given to dynamic members.
                return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)
            self._timers.cancel(("pending", group.group_id, member_id))
            return self._add_member(group, member_id, None, client_id, client_host, session_ms,
                                    rebalance_ms, protocol_type, protocols, reason)
        error = self._validate_member(group, member_id, instance_id)
        if error is not None:
            return JoinResult(error, member_id)
        member = group.members[member_id]
        if group.is_(S.PREPARING_REBALANCE):
            return self._update_member(group, member, protocols, session_ms, rebalance_ms,
                                       f"member {member_id} rejoined")
        if group.is_(S.COMPLETING_REBALANCE):
            if member.matches(protocols):
                # It probably lost the first JoinGroup response: answer it again.
                return self._generation_result(group, member_id,
                                               with_members=member_id == group.leader_id)
            return self._update_member(group, member, protocols, session_ms, rebalance_ms,
                                       f"member {member_id} changed its metadata")
        if group.is_(S.STABLE):
            if member_id == group.leader_id:
                # The leader rejoins to have assignments redone (e.g. topic metadata changed).
                return self._update_member(group, member, protocols, session_ms, rebalance_ms,
                                           f"leader {member_id} rejoined")
            if not member.matches(protocols):
                return self._update_member(group, member, protocols, session_ms, rebalance_ms,
                                           f"member {member_id} changed its metadata")
            return self._generation_result(group, member_id, with_members=False)
        return JoinResult(E.UNKNOWN_MEMBER_ID, member_id)  # Empty: it must start over

    def _generation_result(self, group: Group, member_id: str, with_members: bool,
                           skip_assignment: bool = False) -> JoinResult:
        return JoinResult(
            E.NONE, member_id, group.generation_id, group.protocol_type, group.protocol_name,
            group.leader_id, tuple(group.member_metadata()) if with_members else (),
            skip_assignment)

    def _new_waiter(self) -> asyncio.Future:
        return asyncio.get_running_loop().create_future()

    def _add_member(self, group, member_id, instance_id, client_id, client_host, session_ms,
                    rebalance_ms, protocol_type, protocols, reason) -> asyncio.Future:
        member = Member(member_id, instance_id, client_id, client_host, session_ms,
                        rebalance_ms, protocol_type, protocols, is_new=True)
        waiter = member.join_waiter = self._new_waiter()
        if group.is_(S.PREPARING_REBALANCE) and group.generation_id == 0:
            group.new_member_added = True
        group.add(member)
        self._schedule_session(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(
            group, f"new member {member_id} joined" + (f" ({reason})" if reason else ""))
        return waiter

    def _update_member(self, group, member, protocols, session_ms, rebalance_ms,
                       why) -> asyncio.Future:
        # A second JoinGroup from the same member replaces the first, which its client
        # has given up on.
        self._answer_join(member, JoinResult(E.REBALANCE_IN_PROGRESS, member.member_id))
        group.update(member, protocols, rebalance_ms, session_ms)
        waiter = member.join_waiter = self._new_waiter()
        self._maybe_prepare_rebalance(group, why)
        return waiter

    def _replace_static_member(self, group, instance_id, old_id, new_id, protocols,
                               session_ms, rebalance_ms, skip_ok, reason):
        """A static member restarted: it takes over its old slot under a new member id,
        and whoever still uses the old id is fenced."""
        old = group.members[old_id]
        old_leader = group.leader_id
        old_topics = _topics_of(old, group.protocol_name)
        self._answer_join(old, JoinResult(E.FENCED_INSTANCE_ID, old_id))
        self._answer_sync(old, SyncResult(E.FENCED_INSTANCE_ID))
        self._timers.cancel(("member", group.group_id, old_id))
        member = group.replace_static(instance_id, old_id, new_id)
        group.update(member, protocols, rebalance_ms, session_ms)
        self._schedule_session(group, member)
        waiter = member.join_waiter = self._new_waiter()
        log.info("group %s: static member %s replaced %s by %s", group.group_id, instance_id,
                 old_id, new_id)
        if group.is_(S.STABLE):
            same_protocol = group.protocol_name == group.select_protocol()
            # Beyond Kafka, which only checks the protocol: a restarted consumer that now
            # subscribes to other topics needs new assignments.
            same_topics = not same_protocol or old_topics is None or \
                old_topics == _topics_of(member, group.protocol_name)
            if same_protocol and same_topics:
                is_leader = group.leader_id == new_id
                if skip_ok and is_leader:
                    # v9+: tell the leader it leads, without having it assign again.
                    result = self._generation_result(group, new_id, True, skip_assignment=True)
                else:
                    # The old leader id keeps the restarted leader from assigning: a Stable
                    # group would ignore its SyncGroup assignments anyway.
                    result = JoinResult(E.NONE, new_id, group.generation_id, group.protocol_type,
                                        group.protocol_name, old_leader)
                self._answer_join(member, result)
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {instance_id} rejoined with a new subscription")
        elif group.is_(S.COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"static member {instance_id} rejoined mid-sync")
        return waiter

    # --- rebalance ------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: Group, why: str) -> None:
        if group.is_(S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY):
            self._prepare_rebalance(group, why)

    def _prepare_rebalance(self, group: Group, why: str) -> None:
        if group.is_(S.COMPLETING_REBALANCE):
            self._reset_assignments(group, E.REBALANCE_IN_PROGRESS)
        self._timers.cancel(("sync", group.group_id))
        was_empty = group.is_(S.EMPTY)
        group.transition(S.PREPARING_REBALANCE)
        log.info("group %s: preparing rebalance of generation %d: %s", group.group_id,
                 group.generation_id, why)
        timeout = group.rebalance_timeout_ms()
        delay = self.config.initial_rebalance_delay_ms
        if was_empty and delay > 0:
            group.initial_join = True
            group.new_member_added = False
            first = min(delay, timeout)
            self._schedule_initial_join(group, first, max(timeout - delay, 0))
        else:
            group.initial_join = False
            self._schedule(("join", group.group_id), timeout, lambda: self._complete_join(group))
            self._maybe_complete_join(group)

    def _schedule_initial_join(self, group: Group, delay_ms: int, remaining_ms: int) -> None:
        def expire() -> None:
            if not group.is_(S.PREPARING_REBALANCE):
                return
            if group.new_member_added and remaining_ms > 0:
                # Members are still arriving: wait a little longer, within the timeout.
                group.new_member_added = False
                step = min(self.config.initial_rebalance_delay_ms, remaining_ms)
                self._schedule_initial_join(group, step, remaining_ms - step)
            else:
                group.initial_join = False
                self._complete_join(group)

        self._schedule(("join", group.group_id), delay_ms, expire)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.is_(S.PREPARING_REBALANCE) and not group.initial_join and group.all_joined():
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        if not group.is_(S.PREPARING_REBALANCE):
            return
        self._timers.cancel(("join", group.group_id))
        for member in [m for m in group.members.values()
                       if not m.awaiting_join and m.group_instance_id is None]:
            log.info("group %s: member %s did not rejoin in time, removing it",
                     group.group_id, member.member_id)
            self._drop(group, member)
        if not group.elect_joined_leader() and group.members:
            # Only static members that are away remain: wait for them (their session
            # timeout removes them if they never come back).
            self._schedule(("join", group.group_id), group.rebalance_timeout_ms(),
                           lambda: self._complete_join(group))
            return
        group.init_next_generation()
        self._changed(group)
        if group.is_(S.EMPTY):
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            self._schedule_idle(group)
            return
        log.info("group %s: generation %d with %d members, protocol %s, leader %s",
                 group.group_id, group.generation_id, len(group.members), group.protocol_name,
                 group.leader_id)
        for member in group.members.values():
            self._answer_join(member, self._generation_result(
                group, member.member_id, with_members=member.member_id == group.leader_id))
            self._schedule_session(group, member)
            member.is_new = False
        generation = group.generation_id
        self._schedule(("sync", group.group_id), group.rebalance_timeout_ms(),
                       lambda: self._expire_sync(group, generation))

    def _expire_sync(self, group: Group, generation: int) -> None:
        if group.generation_id != generation or not group.is_(S.COMPLETING_REBALANCE, S.STABLE):
            return
        if not group.pending_sync:
            return
        missing = sorted(group.pending_sync)
        for member_id in missing:
            member = group.members.get(member_id)
            if member is not None:
                self._drop(group, member)
        self._prepare_rebalance(group, f"members {missing} never sent SyncGroup")
        self._changed(group)

    def _reset_assignments(self, group: Group, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
            self._answer_sync(member, SyncResult(error))

    # --- SyncGroup --------------------------------------------------------------------

    async def sync_group(self, group_id: str, generation_id: int, member_id: str, *,
                         group_instance_id: str | None = None, protocol_type: str | None = None,
                         protocol_name: str | None = None,
                         assignments: Mapping[str, bytes] | None = None) -> SyncResult:
        """Deliver the leader's assignments; followers wait for them."""
        outcome = self._sync(group_id, generation_id, member_id, group_instance_id,
                             protocol_type, protocol_name, assignments or {})
        if isinstance(outcome, SyncResult):
            return outcome
        return await asyncio.shield(outcome)

    def _sync(self, group_id, generation_id, member_id, instance_id, protocol_type,
              protocol_name, assignments):
        if not group_id:
            return SyncResult(E.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if group.is_(S.DEAD):
            return SyncResult(E.COORDINATOR_NOT_AVAILABLE)
        error = self._validate_member(group, member_id, instance_id)
        if error is not None:
            return SyncResult(error)
        if generation_id != group.generation_id:
            return SyncResult(E.ILLEGAL_GENERATION)
        if (protocol_type is not None and protocol_type != group.protocol_type) or \
                (protocol_name is not None and protocol_name != group.protocol_name):
            return SyncResult(E.INCONSISTENT_GROUP_PROTOCOL)
        if group.is_(S.EMPTY):
            return SyncResult(E.UNKNOWN_MEMBER_ID)
        if group.is_(S.PREPARING_REBALANCE):
            return SyncResult(E.REBALANCE_IN_PROGRESS)
        member = group.members[member_id]
        self._sync_received(group, member_id)
        if group.is_(S.STABLE):
            self._schedule_session(group, member)
            return self._assignment_result(group, member)
        # CompletingRebalance: wait for the leader's assignments.
        self._answer_sync(member, SyncResult(E.REBALANCE_IN_PROGRESS))
        waiter = member.sync_waiter = self._new_waiter()
        if member_id == group.leader_id:
            unknown = set(assignments) - set(group.members)
            missing = set(group.members) - set(assignments)
            if unknown or missing:
                log.warning("group %s: leader's assignment skips %s and names non-members %s",
                            group.group_id, sorted(missing), sorted(unknown))
            for mid, m in group.members.items():
                m.assignment = bytes(assignments.get(mid, b""))
            group.transition(S.STABLE)
            log.info("group %s: generation %d is stable", group.group_id, group.generation_id)
            for m in group.members.values():
                if m.awaiting_sync:
                    self._answer_sync(m, self._assignment_result(group, m))
                    self._schedule_session(group, m)
        return waiter

    def _sync_received(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self._timers.cancel(("sync", group.group_id))

    @staticmethod
    def _assignment_result(group: Group, member: Member) -> SyncResult:
        return SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment)

    # --- Heartbeat --------------------------------------------------------------------

    def heartbeat(self, group_id: str, generation_id: int, member_id: str,
                  group_instance_id: str | None = None) -> ErrorCode:
        if not group_id:
            return E.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.is_(S.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        if group.is_(S.EMPTY):
            return E.UNKNOWN_MEMBER_ID
        self._schedule_session(group, group.members[member_id])
        if group.is_(S.PREPARING_REBALANCE):
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    # --- LeaveGroup -------------------------------------------------------------------

    def leave_group(self, group_id: str, members: list[tuple[str, str | None]],
                    reason: str | None = None) -> tuple[ErrorCode, list[ErrorCode]]:
        """Remove members given as (member id, instance id); a static member may be named
        by instance id alone (empty member id). Returns the group error and one error per
        member, in order."""
        if not group_id:
            return E.INVALID_GROUP_ID, []
        group = self._groups.get(group_id)
        if group is None:
            return E.NONE, [E.UNKNOWN_MEMBER_ID] * len(members)
        if group.is_(S.DEAD):
            return E.COORDINATOR_NOT_AVAILABLE, []
        why = f"member left ({reason})" if reason else "member left"
        errors = []
        for member_id, instance_id in members:
            if member_id == "":
                current = group.static_members.get(instance_id) if instance_id else None
                if current is None:
                    errors.append(E.UNKNOWN_MEMBER_ID)
                else:
                    self._remove_member(group, group.members[current], why)
                    errors.append(E.NONE)
            elif member_id in group.pending_members:
                self._expire_pending(group, member_id)
                errors.append(E.NONE)
            else:
                error = self._validate_member(group, member_id, instance_id)
                if error is None:
                    self._remove_member(group, group.members[member_id], why)
                errors.append(error or E.NONE)
        return E.NONE, errors

    # --- member bookkeeping -----------------------------------------------------------

    @staticmethod
    def _validate_member(group: Group, member_id: str, instance_id: str | None) -> ErrorCode | None:
        if instance_id is not None:
            current = group.static_members.get(instance_id)
            if current is None:
                return E.UNKNOWN_MEMBER_ID
            if current != member_id:
                return E.FENCED_INSTANCE_ID
            return None
        return None if member_id in group.members else E.UNKNOWN_MEMBER_ID

    def _schedule_session(self, group: Group, member: Member, timeout_ms: int | None = None
                          ) -> None:
        member_id = member.member_id
        self._schedule(("member", group.group_id, member_id),
                       member.session_timeout_ms if timeout_ms is None else timeout_ms,
                       lambda: self._expire_session(group, member_id))

    def _expire_session(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None or group.is_(S.DEAD):
            return
        if not member.is_new and (member.awaiting_join or member.awaiting_sync):
            # Waiting on the group counts as alive; the rebalance and sync timeouts bound it.
            return
        log.info("group %s: member %s session expired", group.group_id, member_id)
        self._remove_member(group, member, "session timeout")

    def _expire_pending(self, group: Group, member_id: str) -> None:
        self._timers.cancel(("pending", group.group_id, member_id))
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._maybe_complete_join(group)
            self._schedule_idle(group)

    def _drop(self, group: Group, member: Member) -> None:
        """Take a member out without any rebalance decision (the caller makes it)."""
        self._answer_join(member, JoinResult(E.UNKNOWN_MEMBER_ID, ""))
        self._answer_sync(member, SyncResult(E.UNKNOWN_MEMBER_ID))
        self._timers.cancel(("member", group.group_id, member.member_id))
        group.remove(member.member_id)

    def _remove_member(self, group: Group, member: Member, why: str) -> None:
        self._drop(group, member)
        if group.is_(S.STABLE, S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"{member.member_id} removed: {why}")
        elif group.is_(S.PREPARING_REBALANCE):
            self._maybe_complete_join(group)
        self._changed(group)

    @staticmethod
    def _answer_join(member: Member, result: JoinResult) -> None:
        waiter, member.join_waiter = member.join_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    @staticmethod
    def _answer_sync(member: Member, result: SyncResult) -> None:
        waiter, member.sync_waiter = member.sync_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(result)

    # --- forgetting groups -------------------------------------------------------------

    def _schedule_idle(self, group: Group) -> None:
        if group.is_(S.EMPTY) and not group.members and not group.pending_members:
            self._schedule(("idle", group.group_id), self.config.empty_group_retention_ms,
                           lambda: self._drop_if_idle(group))

    def _drop_if_idle(self, group: Group) -> None:
        if group.is_(S.EMPTY) and not group.members and not group.pending_members:
            log.info("group %s: empty for %d ms, dropping its in-memory state", group.group_id,
                     self.config.empty_group_retention_ms)
            self.forget(group)

    def release(self, group: Group) -> None:
        """Give up a group another gateway coordinates now, whatever its state: waiting
        requests are answered NOT_COORDINATOR and the members go to find the new one."""
        for member in group.members.values():
            self._answer_join(member, JoinResult(E.NOT_COORDINATOR, member.member_id))
            self._answer_sync(member, SyncResult(E.NOT_COORDINATOR))
            self._timers.cancel(("member", group.group_id, member.member_id))
        self.forget(group)

    def forget(self, group: Group) -> None:
        """Mark an Empty group Dead and drop it (DeleteGroups)."""
        for key in [("join", group.group_id), ("sync", group.group_id), ("idle", group.group_id)]:
            self._timers.cancel(key)
        for member_id in list(group.pending_members):
            self._timers.cancel(("pending", group.group_id, member_id))
        group.transition(S.DEAD)
        if self._groups.get(group.group_id) is group:
            del self._groups[group.group_id]


def _topics_of(member: Member, protocol: str | None) -> set[str] | None:
    if member.protocol_type != CONSUMER_PROTOCOL_TYPE or protocol is None:
        return None
    try:
        return set(parse_subscription(member.metadata(protocol)))
    except (KeyError, DecodeError):  # an unparseable subscription: nothing to compare
        return None
