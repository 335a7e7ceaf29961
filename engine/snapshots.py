"""Coordinator snapshots in the bucket: the recovery point of what only the coordinator holds.

The controller writes the cluster's keyspace, in the coordinator backup file's format
(coordinator.backup), to `coordinator/<time-ms>.backup` in the object store every
`coordinator.snapshot.interval.ms`, and keeps the newest `coordinator.snapshot.retain`.
`stratalog recover --from-bucket` (engine.bucket_recovery) starts from the newest one
when the coordinator is lost with no backup of its own: topics and their configs, group
offsets, ACLs, users, quotas, producer ids and transactions are then as of that snapshot
(one interval at most), while sealed segments and provably committed WAL ranges come back
from the bucket itself, up to the moment of the loss.

Only the controller writes, so a cluster makes one snapshot per interval whatever its
size; a new controller continues the schedule from the newest snapshot in the bucket
rather than writing one at once.
"""

from __future__ import annotations

import logging
from typing import Callable

from stratalog.coordinator.backup import Backup, encode
from stratalog.coordinator.store import KEYSPACE_VERSION, KVClusterStore
from stratalog.tiering import layout
from stratalog.tiering.objectstore.base import ObjectStore

log = logging.getLogger(__name__)

RETRY_MS = 5000  # after a failed snapshot (store or coordinator down), the next attempt


class SnapshotWriter:
    def __init__(self, store: KVClusterStore, objects: ObjectStore, *, interval_ms: int,
                 retain: int, now_ms: Callable[[], int]):
        self.store = store
        self.objects = objects
        self.interval_ms = interval_ms  # 0: never
        self.retain = max(1, retain)
        self.now_ms = now_ms
        self._last_ms: int | None = None  # newest snapshot's time, once looked up
        self._retry_at_ms = 0  # no attempt before this after a failure

    async def maybe_write(self, is_controller: bool) -> str | None:
        """Write a snapshot if this gateway is the controller and one is due; its key, or
        None."""
        if not is_controller or self.interval_ms <= 0:
            self._last_ms = None  # a later controllership looks at the bucket again
            return None
        if self._last_ms is None:
            self._last_ms = max((t for t, _ in await self._existing()), default=0)
        if self.now_ms() - self._last_ms < self.interval_ms or self.now_ms() < self._retry_at_ms:
            return None
        try:
            return await self.write()
        except Exception:
            self._retry_at_ms = self.now_ms() + RETRY_MS  # not every maintenance tick
            raise

    async def write(self) -> str:
        """Write one snapshot now and drop the oldest past `retain`; its key."""
        revision, keys = await self.store.read_keyspace()
        when = self.now_ms()
        backup = Backup(self.store.cluster, await self.store.cluster_id(), KEYSPACE_VERSION,
                        revision, when, keys)
        key = layout.snapshot_key(when)
        await self.objects.put(key, encode(backup))
        self._last_ms = when
        old = [k for _, k in sorted(await self._existing())[:-self.retain]]
        if old:
            await self.objects.delete(old)
        log.info("coordinator snapshot %s: %d keys at revision %d", key, len(keys), revision)
        return key

    async def _existing(self) -> list[tuple[int, str]]:
        out = []
        for info in await self.objects.list(layout.SNAPSHOTS_ROOT):
            try:
                out.append((layout.parse_snapshot_key(info.key), info.key))
            except ValueError:
                continue  # not ours: left alone
        return out
