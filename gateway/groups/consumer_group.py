"""One consumer-protocol group (KIP-848): its epochs, members and target assignment, and
the reconciliation that moves each member towards its target without stopping the group.

Bookkeeping only, like `group.py`: no clock, no waiting, no requests.

Three epochs:
- the group epoch moves whenever what the assignment depends on changes (a member joins or
  leaves, a subscription or assignor changes, a subscribed topic gains partitions or
  appears);
- the assignment epoch is the group epoch the target assignment was computed for;
- each member's epoch is the assignment epoch it has reconciled to.

Reconciliation, for one member whose epoch is behind the assignment epoch:
- partitions it has that its target lacks are revoked first: it stays at its epoch in
  UNREVOKED_PARTITIONS, keeping only the rest, until a heartbeat no longer lists the
  revoked ones among its owned partitions;
- then it moves to the assignment epoch and gets its target's partitions that nobody
  else still owns; the others (UNRELEASED_PARTITIONS) are given on a later heartbeat,
  once their previous owner revoked them.
So a partition has at most one owner at any time (`owners`): the member that has it
assigned or is still revoking it.
"""

from __future__ import annotations

import base64
import binascii
import enum
import json
import uuid
from dataclasses import dataclass, field
from typing import Mapping

from .assignors import Topic
from .stored import UnreadableGroupState, parse_state

Partitions = dict[Topic, frozenset[int]]

# ConsumerGroupHeartbeat member epochs with a meaning of their own.
JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2


class MemberState(enum.Enum):
    STABLE = "stable"
    UNREVOKED_PARTITIONS = "unrevoked_partitions"
    UNRELEASED_PARTITIONS = "unreleased_partitions"


class ConsumerGroupState(enum.Enum):
    """As ListGroups and ConsumerGroupDescribe name them."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class ClassicMeta:
    """A member of a consumer-protocol group that still speaks the classic protocol
    (JoinGroup/SyncGroup/Heartbeat): a group upgraded online while it runs (KIP-848's
    mixed groups). The gateway assigns for it too."""

    session_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, subscription), its preference order


@dataclass(eq=False)
class ConsumerMember:
    member_id: str
    instance_id: str | None = None
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = 0
    subscribed_names: tuple[str, ...] = ()
    subscribed_regex: str | None = None
    server_assignor: str | None = None
    epoch: int = 0
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: Partitions = field(default_factory=dict)
    pending_revocation: Partitions = field(default_factory=dict)
    classic: ClassicMeta | None = None

    def owns(self) -> set[tuple[Topic, int]]:
        """Partitions this member holds: assigned, or still revoking."""
        return _pairs(self.assigned) | _pairs(self.pending_revocation)


def _pairs(partitions: Partitions) -> set[tuple[Topic, int]]:
    return {(t, p) for t, ps in partitions.items() for p in ps}


def _group(pairs: set[tuple[Topic, int]]) -> Partitions:
    out: dict[Topic, set[int]] = {}
    for t, p in pairs:
        out.setdefault(t, set()).add(p)
    return {t: frozenset(ps) for t, ps in out.items()}


class ConsumerGroup:
    """The state of one consumer-protocol group (see the module docstring)."""

    def __init__(self, group_id: str):
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        self.assignor: str = ""
        self.members: dict[str, ConsumerMember] = {}
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.target: dict[str, Partitions] = {}  # member id -> its target partitions
        self.owners: dict[tuple[Topic, int], str] = {}
        # What the last target was computed from: each subscribed topic's partition count.
        self.subscribed_partitions: dict[Topic, int] = {}
        self.dead = False

    def __repr__(self) -> str:
        return (f"ConsumerGroup({self.group_id!r}, epoch={self.group_epoch}, "
                f"assignment={self.assignment_epoch}, members={list(self.members)})")

    # --- state ------------------------------------------------------------------------

    @property
    def state(self) -> ConsumerGroupState:
        if self.dead:
            return ConsumerGroupState.DEAD
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.assignment_epoch < self.group_epoch:
            return ConsumerGroupState.ASSIGNING
        for m in self.members.values():
            if m.epoch != self.assignment_epoch or m.state is not MemberState.STABLE:
                return ConsumerGroupState.RECONCILING
        return ConsumerGroupState.STABLE

    def bump(self) -> None:
        self.group_epoch += 1

    # --- membership -------------------------------------------------------------------

    def add(self, member: ConsumerMember) -> None:
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id

    def remove(self, member_id: str) -> ConsumerMember | None:
        """Take a member out and free what it owned; the caller bumps the epoch."""
        member = self.members.pop(member_id, None)
        if member is None:
            return None
        if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        self.target.pop(member_id, None)
        for tp in member.owns():
            if self.owners.get(tp) == member_id:
                del self.owners[tp]
        return member

    def replace_static(self, old: ConsumerMember, new_id: str) -> ConsumerMember:
        """A static member back under a new member id: it takes the old one's place,
        epoch and partitions, so nothing is reassigned."""
        del self.members[old.member_id]
        if old.member_id in self.target:
            self.target[new_id] = self.target.pop(old.member_id)
        for tp in old.owns():
            if self.owners.get(tp) == old.member_id:
                self.owners[tp] = new_id
        old.member_id = new_id
        self.add(old)
        return old

    # --- reconciliation ---------------------------------------------------------------

    def reconcile(self, member: ConsumerMember,
                  owned: Mapping[Topic, frozenset[int]] | None) -> None:
        """Move `member` as far towards its target as the protocol allows now. `owned`
        is what its heartbeat reported owning (None: not reported, nothing changed)."""
        if member.state is MemberState.UNREVOKED_PARTITIONS:
            if owned is None or _pairs(dict(owned)) & _pairs(member.pending_revocation):
                return  # still revoking
            for tp in _pairs(member.pending_revocation):
                if self.owners.get(tp) == member.member_id:
                    del self.owners[tp]
            member.pending_revocation = {}
            member.state = MemberState.STABLE
        elif member.state is MemberState.STABLE and member.epoch == self.assignment_epoch:
            return
        self._next_assignment(member, owned)

    def _next_assignment(self, member: ConsumerMember,
                         owned: Mapping[Topic, frozenset[int]] | None) -> None:
        current = _pairs(member.assigned)
        target = _pairs(self.target.get(member.member_id, {}))
        keep = current & target
        revoke = current - target
        if revoke and (owned is None or _pairs(dict(owned)) & revoke):
            member.assigned = _group(keep)
            member.pending_revocation = _group(revoke)
            member.state = MemberState.UNREVOKED_PARTITIONS
            return
        for tp in revoke:  # it already let them go (an eager member rejoining owns nothing)
            if self.owners.get(tp) == member.member_id:
                del self.owners[tp]
        free = {tp for tp in target - current if self.owners.get(tp) in (None, member.member_id)}
        for tp in free:
            self.owners[tp] = member.member_id
        member.assigned = _group(keep | free)
        if member.epoch != self.assignment_epoch:
            member.previous_epoch, member.epoch = member.epoch, self.assignment_epoch
        member.state = (MemberState.UNRELEASED_PARTITIONS if target - keep - free
                        else MemberState.STABLE)

    def set_target(self, epoch: int, target: dict[str, Partitions],
                   subscribed_partitions: dict[Topic, int]) -> None:
        self.assignment_epoch = epoch
        self.target = target
        self.subscribed_partitions = subscribed_partitions


# --- stored form (coordinator key groups/<group>/consumer) -----------------------------

STATE_VERSION = 1  # of the JSON below; a newer one is refused, naming both


def _parts_json(partitions: Partitions) -> dict[str, list[int]]:
    return {str(t): sorted(ps) for t, ps in sorted(partitions.items()) if ps}


def _parts(d: Mapping[str, list[int]]) -> Partitions:
    return {uuid.UUID(t): frozenset(int(p) for p in ps) for t, ps in d.items()}


def to_json(group: ConsumerGroup) -> bytes:
    """The group as the coordinator keeps it: everything but deadlines (a gateway that
    loads a group gives every member a fresh session)."""
    members = [{
        "id": m.member_id, "instance": m.instance_id, "rack": m.rack_id, "client": m.client_id,
        "host": m.client_host, "rebalance_ms": m.rebalance_timeout_ms,
        "topics": list(m.subscribed_names), "regex": m.subscribed_regex,
        "assignor": m.server_assignor, "epoch": m.epoch, "previous": m.previous_epoch,
        "state": m.state.value, "assigned": _parts_json(m.assigned),
        "revoking": _parts_json(m.pending_revocation),
        "target": _parts_json(group.target.get(m.member_id, {})),
        **({"classic": {"session_ms": m.classic.session_timeout_ms,
                        "protocols": [[n, base64.b64encode(meta).decode()]
                                      for n, meta in m.classic.protocols]}}
           if m.classic is not None else {}),
    } for m in group.members.values()]
    return json.dumps({
        "version": STATE_VERSION, "group_epoch": group.group_epoch,
        "assignment_epoch": group.assignment_epoch, "assignor": group.assignor,
        "subscribed": {str(t): n for t, n in sorted(group.subscribed_partitions.items())},
        "members": members}, separators=(",", ":"), sort_keys=True).encode()


def from_json(group_id: str, value: bytes) -> ConsumerGroup:
    d = parse_state("consumer", group_id, value, STATE_VERSION)
    try:
        group = ConsumerGroup(group_id)
        group.group_epoch = int(d["group_epoch"])
        group.assignment_epoch = int(d["assignment_epoch"])
        group.assignor = str(d["assignor"])
        group.subscribed_partitions = {uuid.UUID(t): int(n) for t, n in d["subscribed"].items()}
        for md in d["members"]:
            m = ConsumerMember(
                md["id"], instance_id=md["instance"], rack_id=md["rack"], client_id=md["client"],
                client_host=md["host"], rebalance_timeout_ms=int(md["rebalance_ms"]),
                subscribed_names=tuple(md["topics"]), subscribed_regex=md["regex"],
                server_assignor=md["assignor"], epoch=int(md["epoch"]),
                previous_epoch=int(md["previous"]), state=MemberState(md["state"]),
                assigned=_parts(md["assigned"]), pending_revocation=_parts(md["revoking"]),
                classic=None if md.get("classic") is None else ClassicMeta(
                    int(md["classic"]["session_ms"]),
                    tuple((str(n), base64.b64decode(meta)) for n, meta in md["classic"]["protocols"])))
            group.add(m)
            group.target[m.member_id] = _parts(md["target"])
            for tp in m.owns():
                group.owners[tp] = m.member_id
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as e:
        raise UnreadableGroupState(f"consumer group {group_id}: corrupt stored state: {e!r}") from None
    return group


def new_member_id() -> str:
    """A member id as Kafka makes them: a random UUID, base64 without padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
