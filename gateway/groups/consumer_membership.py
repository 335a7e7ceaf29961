"""Consumer-protocol group membership (KIP-848) in memory: ConsumerGroupHeartbeat, the
target assignment and the timers. What consults the store (keeping each group there,
offset checks) is in `consumer_coordinator.py`.

The gateway computes assignments (`assignors.py`) and reconciles members towards them
(`consumer_group.py`); a member only heartbeats, reporting what it owns. Every operation
runs to completion on the event loop without awaiting, so a group never changes under a
request half-way through.

Time comes from the injected `clock` through `Timers`, one named timer each for:
- ("session", group, member): group.consumer.session.timeout.ms without a heartbeat
  removes the member (a static member that left with epoch -2 too, if it is not back);
- ("revoke", group, member): a member asked to revoke partitions that still owns them
  after its rebalance timeout is removed, so the partitions can move on;
- ("idle", group): an Empty group is dropped from memory after a while (its committed
  offsets stay in the store).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import re2

from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.stopping import cancel_and_wait

from .assignors import ASSIGNORS, MemberSpec, Topic
from .consumer_group import (JOIN_EPOCH, LEAVE_EPOCH, STATIC_LEAVE_EPOCH, ConsumerGroup,
                             ConsumerMember, MemberState, Partitions, new_member_id)
from .timers import Timers, drive

log = logging.getLogger(__name__)

E = ErrorCode
# Bounds on what one member may make the coordinator keep and evaluate.
MAX_SUBSCRIBED_TOPICS = 10_000
MAX_REGEX_CHARS = 1_000
REGEX_MEMORY = 1 << 20  # RE2's memory budget for one compiled subscription regex
# A group's subscribed topics are looked up again at most this often (or at once when a
# subscription changes), so new topics matching a regex or new partitions are picked up.
METADATA_REFRESH_S = 1.0

# name -> (topic id, partition count): what the gateway knows of the cluster's topics.
TopicLookup = Callable[[], Mapping[str, tuple[Topic, int]]]


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """Settings, named after Kafka's broker settings."""

    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors
    max_size: int = 2**31 - 1  # group.consumer.max.size
    empty_group_retention_ms: int = 600_000


@dataclass(frozen=True)
class Subscription:
    """The fields of a heartbeat that may be left out (None) when unchanged."""

    rebalance_timeout_ms: int = -1
    topic_names: tuple[str, ...] | None = None
    topic_regex: str | None = None
    server_assignor: str | None = None
    owned: Partitions | None = None
    instance_id: str | None = None
    rack_id: str | None = None


@dataclass(frozen=True)
class HeartbeatResult:
    error: ErrorCode
    message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Partitions | None = None  # None: unchanged since the last answer


class ConsumerMembership:
    """Every consumer-protocol group this gateway coordinates, in memory."""

    def __init__(self, topics: TopicLookup, clock: Callable[[], float] = time.monotonic,
                 config: ConsumerGroupConfig | None = None, *,
                 new_id: Callable[[], str] = new_member_id):
        self.config = config or ConsumerGroupConfig()
        self._resend: set[tuple[str, str]] = set()  # members owed their whole assignment
        self._topics = topics
        self._clock = clock
        self._new_id = new_id
        self._groups: dict[str, ConsumerGroup] = {}
        self._refreshed: dict[str, float] = {}  # group -> when its topics were looked up
        self._timers = Timers()
        self._task: asyncio.Task | None = None
        self._wakeup = asyncio.Event()

    # --- lifecycle --------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="consumer-group-timers")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
        for group in self._groups.values():
            group.dead = True
        self._groups.clear()
        self._timers = Timers()

    def tick(self) -> int:
        """Fire every timer that is due on the clock; returns how many fired."""
        return self._timers.fire_due(self._clock())

    async def _run(self) -> None:
        await drive(lambda: self._timers, self._clock, self._wakeup, "consumer group timer",
                    self._after_tick)

    def _after_tick(self) -> None:
        """Periodic work of a subclass, run with the timers."""

    def _changed(self, group_id: str) -> None:
        """A timer changed a group (no request waits for it): a subclass may store it."""

    def _schedule(self, key: tuple, delay_ms: float, action: Callable[[], None]) -> None:
        if self._timers.schedule(key, self._clock() + delay_ms / 1000.0, action):
            self._wakeup.set()

    # --- lookups ----------------------------------------------------------------------

    def group(self, group_id: str) -> ConsumerGroup | None:
        return self._groups.get(group_id)

    def groups(self) -> list[ConsumerGroup]:
        return list(self._groups.values())

    def forget(self, group_id: str) -> None:
        """Drop a group from memory (DeleteGroups, a classic group taking the id over, or
        another gateway coordinating it now); what is stored stays."""
        group = self._groups.pop(group_id, None)
        self._refreshed.pop(group_id, None)
        self._timers.cancel(("idle", group_id))
        if group is not None:
            group.dead = True
            for member_id in group.members:
                self._timers.cancel(("session", group_id, member_id))
                self._timers.cancel(("revoke", group_id, member_id))

    # --- ConsumerGroupHeartbeat ---------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, member_epoch: int, sub: Subscription, *,
                  client_id: str = "", client_host: str = "") -> HeartbeatResult:
        error = self._check_request(group_id, member_id, member_epoch, sub)
        if error is not None:
            return error
        group = self._groups.get(group_id)
        if member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(group, member_id, member_epoch, sub.instance_id)
        if group is None:
            if member_epoch != JOIN_EPOCH:
                return self._fail(E.UNKNOWN_MEMBER_ID, f"unknown member {member_id}")
            group = self._groups[group_id] = ConsumerGroup(group_id)
            self._timers.cancel(("idle", group_id))
        size = len(group.members)
        if member_epoch == JOIN_EPOCH:
            outcome = self._join(group, member_id, sub, client_id, client_host)
        else:
            outcome = self._known(group, member_id, member_epoch, sub)
        if isinstance(outcome, HeartbeatResult):
            self._schedule_idle(group)
            return outcome
        member = outcome
        before = (member.epoch, dict(member.assigned))
        joined = len(group.members) > size
        if self._update_subscription(group, member, sub, client_id, client_host) or joined:
            group.bump()
        self._refresh_topics(group, force=False)
        self._ensure_target(group)
        group.reconcile(member, sub.owned)
        self._arm_timers(group, member)
        full = member_epoch == JOIN_EPOCH or (
            sub.rebalance_timeout_ms != -1 and sub.owned is not None
            and (sub.topic_names is not None or sub.topic_regex is not None))
        changed = (member.epoch, member.assigned) != before
        if (group.group_id, member.member_id) in self._resend:
            self._resend.discard((group.group_id, member.member_id))
            full = True
        return HeartbeatResult(E.NONE, None, member.member_id, member.epoch,
                               self.config.heartbeat_interval_ms,
                               dict(member.assigned) if full or changed else None)

    def _fail(self, error: ErrorCode, message: str) -> HeartbeatResult:
        return HeartbeatResult(error, message, None, 0, 0, None)

    def _check_request(self, group_id: str, member_id: str, epoch: int, sub: Subscription
                       ) -> HeartbeatResult | None:
        """What Kafka refuses with INVALID_REQUEST and friends before looking at the group."""
        if not group_id:
            return self._fail(E.INVALID_REQUEST, "GroupId can't be empty.")
        if sub.instance_id is not None and not sub.instance_id:
            return self._fail(E.INVALID_REQUEST, "InstanceId can't be empty.")
        if epoch < STATIC_LEAVE_EPOCH:
            return self._fail(E.INVALID_REQUEST, f"MemberEpoch {epoch} is not valid.")
        if epoch != JOIN_EPOCH and not member_id:
            return self._fail(E.INVALID_REQUEST, "MemberId can't be empty.")
        if epoch == JOIN_EPOCH:
            if sub.rebalance_timeout_ms == -1:
                return self._fail(E.INVALID_REQUEST, "RebalanceTimeoutMs must be provided in first request.")
            if sub.owned is None or sub.owned:
                return self._fail(E.INVALID_REQUEST, "TopicPartitions must be empty when (re-)joining.")
            if sub.topic_names is None and sub.topic_regex is None:
                return self._fail(E.INVALID_REQUEST, "SubscribedTopicNames or SubscribedTopicRegex "
                                  "must be set in first request.")
        if epoch == STATIC_LEAVE_EPOCH and sub.instance_id is None:
            return self._fail(E.INVALID_REQUEST, "InstanceId can't be null when leaving with "
                              "MemberEpoch -2.")
        if sub.rebalance_timeout_ms < -1:
            return self._fail(E.INVALID_REQUEST, "RebalanceTimeoutMs can't be negative.")
        if sub.server_assignor is not None and sub.server_assignor not in self.config.assignors:
            return self._fail(E.UNSUPPORTED_ASSIGNOR, f"ServerAssignor {sub.server_assignor} is not "
                              f"supported. Supported assignors: {', '.join(self.config.assignors)}.")
        if sub.topic_names is not None and len(sub.topic_names) > MAX_SUBSCRIBED_TOPICS:
            return self._fail(E.INVALID_REQUEST, f"at most {MAX_SUBSCRIBED_TOPICS} subscribed topics")
        if sub.topic_regex:
            try:
                compile_regex(sub.topic_regex)
            except ValueError as e:
                return self._fail(E.INVALID_REGULAR_EXPRESSION, str(e))
        return None

    def _join(self, group: ConsumerGroup, member_id: str, sub: Subscription, client_id: str,
              client_host: str) -> ConsumerMember | HeartbeatResult:
        instance = sub.instance_id
        if instance is not None and instance in group.static_members:
            holder = group.members[group.static_members[instance]]
            if holder.member_id == member_id and member_id:
                return holder  # a rejoin after being fenced: it keeps its place
            if holder.epoch != STATIC_LEAVE_EPOCH:
                return self._fail(E.UNRELEASED_INSTANCE_ID, f"Static member {holder.member_id} "
                                  f"with instance id {instance} is present in the consumer group.")
            # Back from a restart: the new member id takes the old one's place and
            # partitions, so the group does not rebalance.
            self._timers.cancel(("session", group.group_id, holder.member_id))
            self._timers.cancel(("revoke", group.group_id, holder.member_id))
            member = group.replace_static(holder, member_id or self._new_id())
            member.epoch = member.previous_epoch
            log.info("group %s: static member %s is back as %s", group.group_id, instance,
                     member.member_id)
            return member
        if member_id and member_id in group.members:
            return group.members[member_id]  # rejoining after a fence: its state stands
        if len(group.members) >= self.config.max_size:
            return self._fail(E.GROUP_MAX_SIZE_REACHED, f"The consumer group has reached its "
                              f"maximum capacity of {self.config.max_size} members.")
        member = ConsumerMember(member_id or self._new_id(), instance_id=instance,
                                client_id=client_id, client_host=client_host)
        group.add(member)  # the caller bumps the group epoch, once for this and the subscription
        log.info("group %s: member %s joined", group.group_id, member.member_id)
        return member

    def _known(self, group: ConsumerGroup, member_id: str, epoch: int, sub: Subscription
               ) -> ConsumerMember | HeartbeatResult:
        member = group.members.get(member_id)
        if member is None:
            return self._fail(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of "
                              f"group {group.group_id}.")
        if sub.instance_id is not None and group.static_members.get(sub.instance_id) != member_id:
            return self._fail(E.FENCED_INSTANCE_ID, f"Instance id {sub.instance_id} is held by "
                              "another member.")
        if epoch == member.epoch:
            return member
        # A member that missed our last answer still has the epoch before it; that is
        # fine as long as it owns nothing it should not.
        lost_answer = (epoch == member.previous_epoch and epoch < member.epoch and (
            sub.owned is None or _subset(sub.owned, member.assigned)))
        if lost_answer:
            return member
        return self._fail(E.FENCED_MEMBER_EPOCH, f"The consumer group member has a greater or "
                          f"smaller epoch ({epoch}) than expected ({member.epoch}).")

    def _leave(self, group: ConsumerGroup | None, member_id: str, epoch: int,
               instance_id: str | None) -> HeartbeatResult:
        member = group.members.get(member_id) if group is not None else None
        if instance_id is not None and group is not None:
            holder = group.static_members.get(instance_id)
            if holder is None:
                member = None
            elif holder != member_id:
                return self._fail(E.FENCED_INSTANCE_ID, f"Instance id {instance_id} is held by "
                                  "another member.")
        if group is None or member is None:
            return self._fail(E.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of "
                              "the group.")
        if epoch == STATIC_LEAVE_EPOCH:
            # Away for a restart: it keeps its partitions until its session ends.
            if member.epoch != STATIC_LEAVE_EPOCH:
                member.previous_epoch, member.epoch = member.epoch, STATIC_LEAVE_EPOCH
            self._timers.cancel(("revoke", group.group_id, member.member_id))
            log.info("group %s: static member %s left for a restart", group.group_id, instance_id)
        else:
            self._remove(group, member, "left the group")
        return HeartbeatResult(E.NONE, None, member_id, epoch, 0, None)

    def _update_subscription(self, group: ConsumerGroup, m: ConsumerMember, sub: Subscription,
                             client_id: str, client_host: str) -> bool:
        """Apply the fields the heartbeat carries; True if the target must be redone."""
        m.client_id, m.client_host = client_id, client_host
        if sub.rack_id is not None:
            m.rack_id = sub.rack_id
        if sub.rebalance_timeout_ms != -1:
            m.rebalance_timeout_ms = sub.rebalance_timeout_ms
        changed = False
        names = None if sub.topic_names is None else tuple(sorted(set(sub.topic_names)))
        if names is not None and names != m.subscribed_names:
            m.subscribed_names = names
            changed = True
        if sub.topic_regex is not None and (sub.topic_regex or None) != m.subscribed_regex:
            m.subscribed_regex = sub.topic_regex or None
            changed = True
        if sub.server_assignor is not None and sub.server_assignor != m.server_assignor:
            m.server_assignor = sub.server_assignor
            changed = True
        if changed:
            self._refreshed.pop(group.group_id, None)
        return changed

    # --- target assignment ------------------------------------------------------------

    def _subscribed_topics(self, group: ConsumerGroup, member: ConsumerMember,
                           topics: Mapping[str, tuple[Topic, int]]) -> set[str]:
        names = {t for t in member.subscribed_names if t in topics}
        if member.subscribed_regex:
            pattern = compile_regex(member.subscribed_regex)
            names.update(t for t in topics if pattern.fullmatch(t))
        return names

    def _refresh_topics(self, group: ConsumerGroup, force: bool) -> None:
        """Bump the group epoch when its subscribed topics changed (a topic made or
        deleted, partitions added, a new topic matching a regex)."""
        now = self._clock()
        last = self._refreshed.get(group.group_id)
        if not force and last is not None and now - last < METADATA_REFRESH_S:
            return
        self._refreshed[group.group_id] = now
        topics = self._topics()
        counts: dict[Topic, int] = {}
        for member in group.members.values():
            for name in self._subscribed_topics(group, member, topics):
                topic_id, partitions = topics[name]
                counts[topic_id] = partitions
        if counts != group.subscribed_partitions:
            group.subscribed_partitions = counts
            if group.assignment_epoch == group.group_epoch:
                group.bump()

    def _choose_assignor(self, group: ConsumerGroup) -> str:
        """The assignor most members ask for; the first configured one otherwise."""
        votes = Counter(m.server_assignor for m in group.members.values() if m.server_assignor)
        if not votes:
            return self.config.assignors[0]
        order = {name: i for i, name in enumerate(self.config.assignors)}
        return max(votes, key=lambda a: (votes[a], -order.get(a, len(order))))

    def _ensure_target(self, group: ConsumerGroup) -> None:
        if group.assignment_epoch >= group.group_epoch:
            return
        self._refresh_topics(group, force=True)
        topics = self._topics()
        specs = []
        for m in group.members.values():
            ids = frozenset(topics[n][0] for n in self._subscribed_topics(group, m, topics))
            specs.append(MemberSpec(m.member_id, m.instance_id, ids, group.target.get(m.member_id, {})))
        group.assignor = self._choose_assignor(group)
        counts = dict(group.subscribed_partitions)
        target = ASSIGNORS[group.assignor](specs, counts)
        group.set_target(group.group_epoch, target, counts)
        log.info("group %s: target assignment of epoch %d by %s for %d members",
                 group.group_id, group.group_epoch, group.assignor, len(specs))

    # --- timers -----------------------------------------------------------------------

    def _arm_timers(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        gid, mid = group.group_id, member.member_id
        # A member still on the classic protocol keeps the session timeout it asked for.
        session_ms = member.classic.session_timeout_ms if member.classic else self.config.session_timeout_ms
        self._schedule(("session", gid, mid), session_ms,
                       lambda: self._expire(gid, mid, "session timeout"))
        key = ("revoke", gid, mid)
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if self._timers.deadline(key) is None:
                self._schedule(key, member.rebalance_timeout_ms,
                               lambda: self._expire(gid, mid, "did not revoke in time"))
        else:
            self._timers.cancel(key)

    def _expire(self, group_id: str, member_id: str, why: str) -> None:
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return
        log.info("group %s: removing member %s: %s", group_id, member_id, why)
        self._remove(group, member, why)
        self._changed(group_id)

    def _remove(self, group: ConsumerGroup, member: ConsumerMember, why: str) -> None:
        group.remove(member.member_id)
        self._timers.cancel(("session", group.group_id, member.member_id))
        self._timers.cancel(("revoke", group.group_id, member.member_id))
        group.bump()
        log.info("group %s: member %s removed (%s), epoch %d", group.group_id, member.member_id,
                 why, group.group_epoch)
        if group.members:
            self._ensure_target(group)
        else:
            group.set_target(group.group_epoch, {}, {})
        self._resend.discard((group.group_id, member.member_id))
        self._schedule_idle(group)

    def _schedule_idle(self, group: ConsumerGroup) -> None:
        if not group.members:
            self._schedule(("idle", group.group_id), self.config.empty_group_retention_ms,
                           lambda: self._drop_if_idle(group))

    def _drop_if_idle(self, group: ConsumerGroup) -> None:
        if not group.members and self._groups.get(group.group_id) is group:
            self.forget(group.group_id)


def _subset(owned: Partitions, assigned: Partitions) -> bool:
    return all(ps <= assigned.get(t, frozenset()) for t, ps in owned.items())


def compile_regex(pattern: str) -> Any:
    """A subscription regex in RE2 syntax, as Kafka evaluates it (the whole name must
    match); ValueError if it does not parse or is too large."""
    if len(pattern) > MAX_REGEX_CHARS:
        raise ValueError(f"SubscribedTopicRegex is longer than {MAX_REGEX_CHARS} characters.")
    return _compile(pattern)


_compiled: dict[str, object] = {}


def _compile(pattern: str):
    found = _compiled.get(pattern)
    if found is None:
        options = re2.Options()
        options.log_errors = False
        options.max_mem = REGEX_MEMORY
        try:
            found = re2.compile(pattern, options)
        except re2.error as e:
            reason = e.args[0].decode(errors="replace") if e.args and isinstance(e.args[0], bytes) else str(e)
            raise ValueError(f"SubscribedTopicRegex {pattern!r} is not a valid regular expression: "
                             f"{reason}") from None
        if len(_compiled) >= 1024:  # a cache, not a store: keep it small
            _compiled.clear()
        _compiled[pattern] = found
    return found
