"""Classic consumer groups: membership and rebalances in memory, offsets in the store."""

from .coordinator import (GroupCoordinator, GroupDescription, GroupListing, MemberDescription,
                          OffsetEntry)
from .group import Group, GroupState, Member
from .membership import GroupConfig, JoinResult, SyncResult

__all__ = [
    "GroupConfig", "GroupCoordinator", "GroupDescription", "GroupListing", "Group", "GroupState",
    "JoinResult", "Member", "MemberDescription", "OffsetEntry", "SyncResult",
]
