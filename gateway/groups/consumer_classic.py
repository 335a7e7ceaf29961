"""Classic members inside consumer-protocol groups: how a classic group is upgraded online
(KIP-848's mixed groups).

When the first member with `group.protocol=consumer` joins a Stable classic group, the
group becomes a consumer-protocol group (`adopt_classic`): every classic member stays, with
its member id, the generation as its epoch and the partitions the classic leader gave it,
so nothing moves. From then on the gateway assigns for everyone. Classic members keep
speaking JoinGroup/SyncGroup/Heartbeat/LeaveGroup, answered here:

- Heartbeat answers REBALANCE_IN_PROGRESS while the member has to catch up (the group
  epoch moved past it, it has partitions to revoke, or partitions it waits for are free);
- JoinGroup reconciles it with the partitions its subscription says it still owns (an
  eager member owns none when it rejoins; a cooperative one lists them) and answers at
  once, with no leader: nobody runs a client-side assignor;
- SyncGroup returns its current assignment as the consumer protocol's assignment bytes.

As classic members restart with the consumer protocol they leave and join anew, until
none is left. A group whose consumer-protocol members all leave stays a consumer-protocol
group (Kafka turns it back into a classic one; not done here).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping

from stratalog.gateway.protocol.catalog import (CONSUMER_PROTOCOL_ASSIGNMENT,
                                                CONSUMER_PROTOCOL_SUBSCRIPTION)
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.protocol.schema import Message
from stratalog.gateway.protocol.wire import DecodeError, Reader

from .assignors import Topic
from .consumer_group import ClassicMeta, ConsumerGroup, ConsumerMember, MemberState, Partitions
from .consumer_membership import ConsumerMembership
from .group import CONSUMER_PROTOCOL_TYPE, Group, GroupState

log = logging.getLogger(__name__)

E = ErrorCode


@dataclass(frozen=True)
class ClassicJoin:
    """A JoinGroup's answer to a classic member of a consumer-protocol group."""

    error: ErrorCode
    member_id: str
    generation_id: int = -1
    protocol_name: str | None = None


@dataclass(frozen=True)
class ClassicSync:
    error: ErrorCode
    assignment: bytes = b""


@dataclass(frozen=True)
class ClassicSubscription:
    topics: tuple[str, ...]
    owned: tuple[tuple[str, int], ...]
    rack_id: str | None


def parse_classic_subscription(metadata: bytes) -> ClassicSubscription:
    """A consumer protocol subscription: topics, the partitions it says it owns (v1+), its
    rack (v3+). Newer versions only append fields, so they read as the newest known."""
    r = Reader(metadata)
    version = r.int16()
    if version < 0:
        raise DecodeError(f"consumer subscription with negative version {version}")
    sub = CONSUMER_PROTOCOL_SUBSCRIPTION.decode(r, min(version, CONSUMER_PROTOCOL_SUBSCRIPTION.vmax))
    owned = tuple((tp.topic, p) for tp in sub.get("owned_partitions") or [] for p in tp.partitions or [])
    return ClassicSubscription(tuple(sub.topics or []), owned, sub.get("rack_id"))


def parse_classic_assignment(data: bytes) -> list[tuple[str, int]]:
    if not data:
        return []
    r = Reader(data)
    version = r.int16()
    if version < 0:
        raise DecodeError(f"consumer assignment with negative version {version}")
    a = CONSUMER_PROTOCOL_ASSIGNMENT.decode(r, min(version, CONSUMER_PROTOCOL_ASSIGNMENT.vmax))
    return [(tp.topic, p) for tp in a.assigned_partitions or [] for p in tp.partitions or []]


def encode_classic_assignment(partitions: Partitions, names: Mapping[Topic, str]) -> bytes:
    """Version 0 of the consumer protocol's assignment, which every client reads."""
    topics = [Message(topic=names[t], partitions=sorted(ps))
              for t, ps in sorted(partitions.items(), key=lambda kv: names.get(kv[0], ""))
              if ps and t in names]
    return b"\x00\x00" + CONSUMER_PROTOCOL_ASSIGNMENT.to_bytes(
        Message(assigned_partitions=topics, user_data=None), 0)


class ClassicMembers(ConsumerMembership):
    """Consumer-protocol groups that also host classic members (see the module docstring)."""

    def _ids(self, pairs) -> Partitions:
        topics = self._topics()
        out: dict[Topic, set[int]] = {}
        for name, p in pairs:
            if name in topics and 0 <= p < topics[name][1]:
                out.setdefault(topics[name][0], set()).add(p)
        return {t: frozenset(ps) for t, ps in out.items()}

    def _names(self) -> dict[Topic, str]:
        return {tid: name for name, (tid, _) in self._topics().items()}

    # --- the upgrade --------------------------------------------------------------------

    def adopt_classic(self, classic: Group) -> ConsumerGroup | str:
        """Turn a Stable classic group of consumers into a consumer-protocol group with the
        same members, epochs and partitions; a reason instead when it cannot be."""
        if classic.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return f"Group {classic.group_id} is not a consumer group."
        if not classic.is_(GroupState.STABLE) or classic.protocol_name is None:
            return f"Group {classic.group_id} is rebalancing; it is upgraded once it is stable."
        if len(classic.members) >= self.config.max_size:
            return f"Group {classic.group_id} is full."
        group = ConsumerGroup(classic.group_id)
        group.group_epoch = group.assignment_epoch = classic.generation_id
        group.assignor = self.config.assignors[0]
        try:
            for m in classic.members.values():
                sub = parse_classic_subscription(m.metadata(classic.protocol_name))
                assigned = self._ids(parse_classic_assignment(m.assignment))
                member = ConsumerMember(
                    m.member_id, instance_id=m.group_instance_id, rack_id=sub.rack_id,
                    client_id=m.client_id, client_host=m.client_host,
                    rebalance_timeout_ms=m.rebalance_timeout_ms,
                    subscribed_names=tuple(sorted(set(sub.topics))), epoch=classic.generation_id,
                    previous_epoch=classic.generation_id, assigned=assigned,
                    classic=ClassicMeta(m.session_timeout_ms, tuple(m.protocols)))
                group.add(member)
                group.target[member.member_id] = assigned
                for tp in member.owns():
                    group.owners.setdefault(tp, member.member_id)
        except (KeyError, DecodeError) as e:
            return f"Group {classic.group_id} has a member whose subscription does not parse: {e}"
        self._groups[group.group_id] = group
        self._refresh_topics(group, force=True)
        for member in group.members.values():
            self._arm_timers(group, member)
        log.info("group %s: upgraded from the classic protocol at generation %d with %d members",
                 group.group_id, classic.generation_id, len(group.members))
        return group

    # --- JoinGroup ----------------------------------------------------------------------

    def classic_join(self, group_id: str, member_id: str, *, instance_id: str | None,
                     protocol_type: str, protocols: tuple[tuple[str, bytes], ...],
                     session_timeout_ms: int, rebalance_timeout_ms: int, client_id: str,
                     client_host: str, require_known_member_id: bool) -> ClassicJoin:
        group = self._groups.get(group_id)
        if group is None:
            return ClassicJoin(E.UNKNOWN_MEMBER_ID, member_id)
        if protocol_type != CONSUMER_PROTOCOL_TYPE or not protocols:
            return ClassicJoin(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        try:
            sub = parse_classic_subscription(protocols[0][1])
        except DecodeError:
            return ClassicJoin(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        member: ConsumerMember | None
        if instance_id is not None and instance_id in group.static_members:
            held = group.members[group.static_members[instance_id]]
            if member_id and held.member_id != member_id:
                return ClassicJoin(E.FENCED_INSTANCE_ID, member_id)
            member = held if member_id else group.replace_static(held, self._new_id())
        elif member_id:
            member = group.members.get(member_id)
        else:
            member = None
            new_id = self._new_id()
            if instance_id is None and require_known_member_id:
                return ClassicJoin(E.MEMBER_ID_REQUIRED, new_id)
            member_id = new_id
        joined = member is None
        if member is None:
            if len(group.members) >= self.config.max_size:
                return ClassicJoin(E.GROUP_MAX_SIZE_REACHED, member_id)
            member = ConsumerMember(member_id, instance_id=instance_id)
            group.add(member)
        elif member.classic is None:
            return ClassicJoin(E.UNKNOWN_MEMBER_ID, member_id)  # it speaks the consumer protocol
        names = tuple(sorted(set(sub.topics)))
        changed = joined or names != member.subscribed_names
        member.subscribed_names = names
        member.rack_id = sub.rack_id
        member.client_id, member.client_host = client_id, client_host
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.classic = ClassicMeta(session_timeout_ms, tuple(protocols))
        if member.epoch < 0:  # a static member back from a restart
            member.epoch = member.previous_epoch
        if changed:
            group.bump()
        self._refresh_topics(group, force=False)
        self._ensure_target(group)
        group.reconcile(member, self._ids(sub.owned))
        self._arm_timers(group, member)
        return ClassicJoin(E.NONE, member.member_id, member.epoch, protocols[0][0])

    # --- SyncGroup and Heartbeat ----------------------------------------------------------

    def _classic_member(self, group_id: str, member_id: str, instance_id: str | None,
                        generation_id: int) -> ConsumerMember | ErrorCode:
        group = self._groups.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None or member.classic is None:
            return E.UNKNOWN_MEMBER_ID
        if instance_id is not None and group.static_members.get(instance_id) != member_id:
            return E.FENCED_INSTANCE_ID
        if generation_id != member.epoch:
            return E.ILLEGAL_GENERATION
        return member

    def classic_sync(self, group_id: str, generation_id: int, member_id: str, *,
                     instance_id: str | None, protocol_type: str | None,
                     protocol_name: str | None) -> ClassicSync:
        found = self._classic_member(group_id, member_id, instance_id, generation_id)
        if isinstance(found, ErrorCode):
            return ClassicSync(found)
        member = found
        group = self._groups[group_id]
        assert member.classic is not None
        if (protocol_type is not None and protocol_type != CONSUMER_PROTOCOL_TYPE) or (
                protocol_name is not None and protocol_name not in dict(member.classic.protocols)):
            return ClassicSync(E.INCONSISTENT_GROUP_PROTOCOL)
        if group.group_epoch > member.epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
            # It must rejoin to catch up; one still revoking syncs at its epoch to learn
            # what it keeps.
            return ClassicSync(E.REBALANCE_IN_PROGRESS)
        self._arm_timers(group, member)
        return ClassicSync(E.NONE, encode_classic_assignment(member.assigned, self._names()))

    def classic_heartbeat(self, group_id: str, generation_id: int, member_id: str,
                          instance_id: str | None) -> ErrorCode:
        found = self._classic_member(group_id, member_id, instance_id, generation_id)
        if isinstance(found, ErrorCode):
            return found
        member = found
        group = self._groups[group_id]
        self._arm_timers(group, member)
        if member.epoch < group.group_epoch or member.state is MemberState.UNREVOKED_PARTITIONS:
            return E.REBALANCE_IN_PROGRESS
        if member.state is MemberState.UNRELEASED_PARTITIONS:
            wanted = {(t, p) for t, ps in group.target.get(member_id, {}).items() for p in ps}
            if any(group.owners.get(tp) is None for tp in wanted):
                return E.REBALANCE_IN_PROGRESS  # what it waits for is free: come and get it
        return E.NONE

    # --- LeaveGroup ---------------------------------------------------------------------

    def classic_leave(self, group_id: str, members: list[tuple[str, str | None]]) -> list[ErrorCode]:
        group = self._groups.get(group_id)
        errors = []
        for member_id, instance_id in members:
            if group is None:
                errors.append(E.UNKNOWN_MEMBER_ID)
                continue
            if not member_id and instance_id is not None:
                member_id = group.static_members.get(instance_id, "")
            member = group.members.get(member_id)
            if member is None or member.classic is None:
                errors.append(E.UNKNOWN_MEMBER_ID)
            elif instance_id is not None and group.static_members.get(instance_id) != member_id:
                errors.append(E.FENCED_INSTANCE_ID)
            else:
                self._remove(group, member, "left the group (classic protocol)")
                errors.append(E.NONE)
        return errors
