"""Offset expiry: Kafka's `offsets.retention.minutes` (KIP-211). A group with no members
for that long, and no offset committed in that time, is deleted with its offsets, so
groups that consumers made once (console consumers, tests, jobs with a fresh group id)
do not stay in the coordinator for ever.

Each gateway looks, every `offsets.retention.check.interval.ms`, at the groups it
coordinates. When it first finds one without members it starts the group's clock in the
store (`groups/<group>/empty_since`), so neither a restart nor a move of coordination
restarts it; finding members again stops it. The group goes once both its clock and its
newest commit are older than the retention: Kafka's two rules, counted from when the
group became Empty and, for offsets committed without membership, from each commit.
Here the second is counted per group, from its newest commit, so such offsets are kept at
least as long as Kafka keeps them, never less; and the clock starts when a check first
sees the group empty, up to one interval after it became so.

A group with offsets that an open transaction committed is kept until it ends.
"""

from __future__ import annotations

import logging
from typing import Callable

from stratalog.coordinator.store import GroupKeys

log = logging.getLogger(__name__)


class OffsetExpiry:
    """
    Parameters
    ----------
    store : the `KVClusterStore`.
    groups : the gateway's `GroupCoordinator` (who has members now, and deleting a group).
    coordinates : whether this gateway coordinates a group id now.
    now_ms : the wall clock in milliseconds (commit timestamps are wall-clock too).
    retention_ms : offsets.retention.minutes, in milliseconds.
    """

    def __init__(self, store, groups, *, coordinates: Callable[[str], bool],
                 now_ms: Callable[[], int], retention_ms: int):
        self.store = store
        self.groups = groups
        self.coordinates = coordinates
        self.now_ms = now_ms
        self.retention_ms = retention_ms

    async def sweep_once(self) -> list[str]:
        """One look at the groups coordinated here; returns those deleted."""
        deleted = []
        now = self.now_ms()
        for group_id, keys in (await self.store.group_keys()).items():
            if not self.coordinates(group_id):
                continue
            if self.groups.has_members(group_id, keys):
                if keys.empty_since_ms is not None:
                    await self.store.unmark_group_empty(group_id)
            elif keys.empty_since_ms is None:
                await self.store.mark_group_empty(group_id, now)
            elif self._expired(keys, now) and await self.groups.expire_group(group_id):
                log.info("group %s expired: no members and no commit for %d minutes (offsets.retention.minutes)",
                         group_id, self.retention_ms // 60_000)
                deleted.append(group_id)
        return deleted

    def _expired(self, keys: GroupKeys, now_ms: int) -> bool:
        assert keys.empty_since_ms is not None
        return (not keys.pending_txn
                and now_ms - max(keys.empty_since_ms, keys.newest_commit_ms) >= self.retention_ms)
