"""Consumer groups: classic ones (JoinGroup/SyncGroup: `membership.py`, in memory) and
consumer-protocol ones (KIP-848's ConsumerGroupHeartbeat: `consumer_membership.py`, kept in
the store by `consumer_coordinator.py`); the offsets of both in the store (`coordinator.py`)."""

from .coordinator import (GroupCoordinator, GroupDescription, GroupListing, MemberDescription,
                          OffsetEntry)
from .group import Group, GroupState, Member
from .membership import GroupConfig, JoinResult, SyncResult

__all__ = [
    "GroupConfig", "GroupCoordinator", "GroupDescription", "GroupListing", "Group", "GroupState",
    "JoinResult", "Member", "MemberDescription", "OffsetEntry", "SyncResult",
]
