"""A classic group as the coordinator keeps it (`groups/<group>/classic`), so a gateway
that takes over the group's coordination continues it without a rebalance.

Compact JSON, sorted keys, with its own `version` (STATE_VERSION; a newer one is refused,
naming both):

    {"version": 1, "state": "Stable" | "PreparingRebalance" | "CompletingRebalance",
     "generation": int, "protocol_type": str | null, "protocol": str | null,
     "leader": str | null,
     "members": [{"id": str, "instance": str | null, "client": str, "host": str,
                  "session_ms": int, "rebalance_ms": int, "protocol_type": str,
                  "protocols": [[name, base64 metadata], ...], "assignment": base64}]}

Members keep their order (the leader's view of the group lists them in it). Deadlines,
waiting requests and member ids handed out but not joined yet are left out: a gateway that
loads a group gives every member a fresh session, and a join or sync under way is redone.
An Empty group is not kept (its key is deleted): its committed offsets are what matters.
"""

from __future__ import annotations

import base64
import binascii
import json

from .group import Group, GroupState, Member
from .stored import UnreadableGroupState, parse_state

STATE_VERSION = 1  # of the JSON above; a newer one is refused, naming both
S = GroupState
_KEPT_STATES = (S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def to_json(group: Group) -> bytes | None:
    """The group's durable part; None for a group with nothing to keep (Empty, Dead)."""
    if not group.is_(*_KEPT_STATES) or not group.members:
        return None
    members = [{
        "id": m.member_id, "instance": m.group_instance_id, "client": m.client_id,
        "host": m.client_host, "session_ms": m.session_timeout_ms,
        "rebalance_ms": m.rebalance_timeout_ms, "protocol_type": m.protocol_type,
        "protocols": [[n, _b64(meta)] for n, meta in m.protocols],
        "assignment": _b64(m.assignment),
    } for m in group.members.values()]
    return json.dumps({
        "version": STATE_VERSION, "state": group.state.value, "generation": group.generation_id,
        "protocol_type": group.protocol_type, "protocol": group.protocol_name,
        "leader": group.leader_id, "members": members}, separators=(",", ":"), sort_keys=True).encode()


def from_json(group_id: str, value: bytes) -> Group:
    """The stored group, in the state it was stored in (the coordinator decides how it
    goes on from there)."""
    d = parse_state("classic", group_id, value, STATE_VERSION)
    try:
        group = Group(group_id)
        state = GroupState(d["state"])
        if state not in _KEPT_STATES:
            raise ValueError(f"state {state.value} is never stored")
        group.generation_id = int(d["generation"])
        for md in d["members"]:
            group.add(Member(
                str(md["id"]), md["instance"], str(md["client"]), str(md["host"]),
                int(md["session_ms"]), int(md["rebalance_ms"]), str(md["protocol_type"]),
                tuple((str(n), base64.b64decode(meta)) for n, meta in md["protocols"]),
                base64.b64decode(md["assignment"])))
        if not group.members:
            raise ValueError("no members")
        group.protocol_type = d["protocol_type"]
        group.protocol_name = d["protocol"]
        leader = d["leader"]
        if leader is not None and leader not in group.members:
            raise ValueError(f"leader {leader!r} is not a member")
        group.leader_id = leader
        group.state = state
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as e:
        raise UnreadableGroupState(f"classic group {group_id}: corrupt stored state: {e!r}") from None
    return group
