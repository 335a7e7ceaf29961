"""One classic group's membership: who is in it, who leads, which generation and protocol.

This is bookkeeping only: it never waits, never reads a clock and never answers a request.
`GroupCoordinator` drives it through Kafka's states:

    Empty --join--> PreparingRebalance --everyone rejoined--> CompletingRebalance
          --leader's SyncGroup--> Stable --join/leave/expiry--> PreparingRebalance ...
    PreparingRebalance --last member gone--> Empty;  any state --DeleteGroups--> Dead

Invariants kept here:
- `static_members` maps each group.instance.id to the member id that currently holds it,
  and every member with an instance id appears there exactly once.
- Some protocol is supported by every member: a join that would break that is refused by
  `supports_protocols` before the member is added or updated.
- The leader, when set, is a member; removing it hands leadership to another member.
- A member is awaiting join (or sync) exactly while it holds an unanswered future.
"""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field

from stratalog.gateway.protocol.catalog import CONSUMER_PROTOCOL_SUBSCRIPTION
from stratalog.gateway.protocol.wire import DecodeError, Reader

CONSUMER_PROTOCOL_TYPE = "consumer"


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState
_VALID_PREVIOUS: dict[GroupState, frozenset[GroupState]] = {
    S.PREPARING_REBALANCE: frozenset({S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}),
    S.COMPLETING_REBALANCE: frozenset({S.PREPARING_REBALANCE}),
    S.STABLE: frozenset({S.COMPLETING_REBALANCE}),
    S.EMPTY: frozenset({S.PREPARING_REBALANCE}),
    S.DEAD: frozenset(GroupState),
}

Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's preference order


@dataclass(eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = b""
    # A member added by this rebalance: it has no member id yet on the client side, so the
    # session timeout cannot apply and a longer join timeout does.
    is_new: bool = False
    join_waiter: asyncio.Future | None = field(default=None, repr=False)
    sync_waiter: asyncio.Future | None = field(default=None, repr=False)

    @property
    def awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise KeyError(f"member {self.member_id} does not support protocol {protocol!r}")

    def matches(self, protocols: Protocols) -> bool:
        return tuple(protocols) == tuple(self.protocols)

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among those every member supports."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise RuntimeError(f"member {self.member_id} supports none of {sorted(candidates)}")


class Group:
    """The state of one classic group (see the module docstring for its invariants)."""

    def __init__(self, group_id: str):
        self.group_id = group_id
        self.state = GroupState.EMPTY
        self.generation_id = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader_id: str | None = None
        self.members: dict[str, Member] = {}
        self.static_members: dict[str, str] = {}
        # Member ids handed out with MEMBER_ID_REQUIRED whose owners have not joined yet.
        self.pending_members: set[str] = set()
        # Members of the current generation that have not sent SyncGroup yet.
        self.pending_sync: set[str] = set()
        # Set by joins during the first (delayed) rebalance so the delay may be extended.
        self.new_member_added = False
        self.initial_join = False

    def __repr__(self) -> str:
        return (f"Group({self.group_id!r}, {self.state.value}, gen={self.generation_id}, "
                f"members={list(self.members)})")

    def is_(self, *states: GroupState) -> bool:
        return self.state in states

    def transition(self, target: GroupState) -> None:
        if self.state not in _VALID_PREVIOUS[target]:
            raise RuntimeError(
                f"group {self.group_id}: illegal transition {self.state.value} -> {target.value}")
        self.state = target

    # --- membership -------------------------------------------------------------------

    def add(self, member: Member) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        self.members[member.member_id] = member
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        self.pending_members.discard(member.member_id)
        if self.leader_id is None:
            self.leader_id = member.member_id

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.group_instance_id is not None:
            if self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        return member

    def update(self, member: Member, protocols: Protocols, rebalance_timeout_ms: int,
               session_timeout_ms: int) -> None:
        member.protocols = tuple(protocols)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms

    def replace_static(self, group_instance_id: str, old_id: str, new_id: str) -> Member:
        """Give a static member's slot (assignment, leadership) to a new member id."""
        member = self.members.pop(old_id)
        member.member_id = new_id
        self.members[new_id] = member
        self.static_members[group_instance_id] = new_id
        if old_id in self.pending_sync:
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        if self.leader_id == old_id:
            self.leader_id = new_id
        return member

    def all_joined(self) -> bool:
        return not self.pending_members and all(m.awaiting_join for m in self.members.values())

    def awaiting_join_count(self) -> int:
        return sum(1 for m in self.members.values() if m.awaiting_join)

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # --- protocols --------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, names: list[str],
                           excluding: str | None = None) -> bool:
        """Whether a member offering `names` can join without leaving the group with no
        protocol that everyone supports. `excluding` is the joining member's current id,
        whose old protocols must not count."""
        others = [m for mid, m in self.members.items() if mid != excluding]
        if not others:
            return bool(protocol_type) and bool(names)
        if self.protocol_type != protocol_type:
            return False
        return any(all(n in m.protocol_names() for m in others) for n in names)

    def candidate_protocols(self) -> set[str]:
        members = list(self.members.values())
        if not members:
            return set()
        common = set(members[0].protocol_names())
        for m in members[1:]:
            common &= set(m.protocol_names())
        return common

    def select_protocol(self) -> str:
        """Each member votes for its preferred common protocol; most votes wins, and a tie
        goes to the protocol the leader prefers (so the choice is deterministic)."""
        candidates = self.candidate_protocols()
        if not candidates:
            raise RuntimeError(f"group {self.group_id} has no protocol common to all members")
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        leader = self.members.get(self.leader_id or "") or next(iter(self.members.values()))
        preference = {name: i for i, name in enumerate(leader.protocol_names())}
        return max(votes, key=lambda p: (votes[p], -preference.get(p, len(preference))))

    def elect_joined_leader(self) -> bool:
        """Before completing a join: make sure the leader is a member that rejoined.
        False when no member rejoined (only static members that are away remain)."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].awaiting_join:
            return True
        for mid, m in self.members.items():
            if m.awaiting_join:
                self.leader_id = mid
                return True
        return False

    def init_next_generation(self) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(GroupState.COMPLETING_REBALANCE)
        else:
            self.protocol_name = None
            self.transition(GroupState.EMPTY)
        self.pending_sync = set(self.members)

    def member_metadata(self) -> list[tuple[str, str | None, bytes]]:
        """(member id, instance id, metadata for the chosen protocol): the leader's view."""
        assert self.protocol_name is not None
        return [(m.member_id, m.group_instance_id, m.metadata(self.protocol_name))
                for m in self.members.values()]

    def subscribed_topics(self) -> set[str] | None:
        """Topics the members of a consumer group subscribe to; None when unknown (not a
        consumer group, no protocol chosen yet, or a subscription that does not parse)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE or self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                sub = parse_subscription(m.metadata(self.protocol_name))
            except (KeyError, DecodeError):
                return None
            topics.update(sub)
        return topics


def parse_subscription(metadata: bytes) -> list[str]:
    """Topics of a consumer protocol subscription (int16 version, then the body).

    Versions newer than the ones we know only append fields, so they are read as the
    newest known version and the rest is ignored.
    """
    r = Reader(metadata)
    version = r.int16()
    if version < 0:
        raise DecodeError(f"consumer subscription with negative version {version}")
    version = min(version, CONSUMER_PROTOCOL_SUBSCRIPTION.vmax)
    sub = CONSUMER_PROTOCOL_SUBSCRIPTION.decode(r, version)
    return list(sub.topics or [])
