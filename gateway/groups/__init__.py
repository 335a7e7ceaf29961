"""Consumer groups: classic ones (JoinGroup/SyncGroup: `membership.py`) and consumer-protocol
ones (KIP-848's ConsumerGroupHeartbeat: `consumer_coordinator.py`), in memory; the offsets
of both in the store (`coordinator.py`)."""

from .coordinator import (GroupCoordinator, GroupDescription, GroupListing, MemberDescription,
                          OffsetEntry)
from .group import Group, GroupState, Member
from .membership import GroupConfig, JoinResult, SyncResult

__all__ = [
    "GroupConfig", "GroupCoordinator", "GroupDescription", "GroupListing", "Group", "GroupState",
    "JoinResult", "Member", "MemberDescription", "OffsetEntry", "SyncResult",
]
