"""Which partitions this gateway serves: the ones it leads (a `PartitionLog` rebuilt from the
object store at the epoch the controller gave) and the ones it replicates (a
`ReplicaView` tailing committed data).

The controller decides; `take` applies a decision: partitions no longer ours (or ours at
another epoch or topic id) are dropped at once, with their queued WAL batches; new ones are
recovered in the background, retrying while the store or coordinator is unavailable, and
installed only if the decision still stands when recovery ends. A recovery that meets
damaged or missing data is not retried: the partition goes offline (`offline.py`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from stratalog.coordinator.model import ClusterStore
from stratalog.tiering.objectstore.base import ObjectStore
from stratalog.tiering.remote import RemoteCache

from .offline import is_damage, mark_offline
from .partition import PartitionLog
from .replica import ReplicaView
from .sealing import Sealer
from .wal_writer import WalWriter

log = logging.getLogger(__name__)

Key = tuple[str, int]


@dataclass(frozen=True)
class Assignment:
    """One partition the controller gave this gateway: to lead at `epoch`, or to replicate."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    epoch: int = -1


# Recoveries run at once at most this many: a creation of thousands of partitions makes
# thousands of them, and each does some file work on the event loop between its awaits;
# all of them in one turn of the loop would hold it for seconds.
RECOVERIES_AT_ONCE = 16


class Leadership:
    """The led partitions (`logs`) and the replicated ones (`replicas`) of one gateway."""

    def __init__(self, data_dir: Path, store: ClusterStore, objects: ObjectStore, cache: RemoteCache,
                 wal: WalWriter, sealer: Sealer, *, topic_config: Callable[[str, str], Any],
                 now_ms: Callable[[], int], on_led: Callable[[], None],
                 monotonic: Callable[[], float] = time.monotonic):
        self.logs_dir = data_dir / "logs"
        self.store = store
        self.objects = objects
        self.cache = cache
        self.wal = wal
        self.sealer = sealer
        self.topic_config = topic_config
        self.now_ms = now_ms
        self.on_led = on_led
        self.monotonic = monotonic
        self.logs: dict[Key, PartitionLog] = {}
        self.replicas: dict[Key, ReplicaView] = {}
        self._becoming: dict[Key, asyncio.Task] = {}
        self._wanted: dict[Key, Assignment] = {}
        # Partitions found damaged here, with the assignment and the reason: not retried
        # while the controller's decision stands (it soon says offline, with no leader).
        self.offline: dict[Key, tuple[Assignment, str]] = {}
        self._recovery_slots = asyncio.Semaphore(RECOVERIES_AT_ONCE)

    async def stop(self) -> None:
        for t in list(self._becoming.values()):
            t.cancel()
        await asyncio.gather(*self._becoming.values(), return_exceptions=True)
        for plog in self.logs.values():
            plog.close()

    def recovering(self) -> int:
        """How many partitions are being recovered (leadership taken, not yet served)."""
        return sum(not t.done() for t in self._becoming.values())

    def take(self, leading: list[Assignment]) -> list[asyncio.Task]:
        """Lead exactly these partitions at these epochs; returns the recoveries under way."""
        self._wanted = {(a.topic, a.partition): a for a in leading}
        for key, (a, _) in list(self.offline.items()):
            if self._wanted.get(key) != a:
                del self.offline[key]
        for key, plog in list(self.logs.items()):
            want = self._wanted.get(key)
            if want is None or want.epoch != plog.leader_epoch or want.topic_id != plog.topic_id:
                log.info("%s-%d: no longer leader (epoch %d)", key[0], key[1], plog.leader_epoch)
                self.drop(key)
        for key, a in self._wanted.items():
            if key not in self.logs and key not in self._becoming and key not in self.offline:
                self._becoming[key] = asyncio.create_task(self._become_leader(a), name=f"lead-{key}")
        return list(self._becoming.values())

    def drop(self, key: Key, *, forget: bool = False) -> PartitionLog | None:
        """Stop leading a partition now; its queued, uncommitted batches fail. `forget`
        also cancels a recovery under way (the partition is gone, not just moved)."""
        if forget:
            self._wanted.pop(key, None)
        self.sealer.cancel(key)
        plog = self.logs.pop(key, None)
        if plog is not None:
            self.wal.discard(plog.key)
            plog.close()
        return plog

    def drop_by_id(self, keys: list[tuple[uuid.UUID, int]]) -> None:
        """Drop the led partitions named by (topic id, partition)."""
        wanted = set(keys)
        for key, plog in list(self.logs.items()):
            if plog.key in wanted:
                self.drop(key)

    async def _become_leader(self, a: Assignment) -> None:
        key = (a.topic, a.partition)
        try:
            delay = 0.1
            while True:
                try:
                    async with self._recovery_slots:
                        plog = await PartitionLog.recover(
                            a.topic, a.topic_id, a.partition, a.epoch,
                            self.logs_dir / f"{a.topic}-{a.partition}", self.store, self.objects,
                            index_interval_bytes=self.topic_config(a.topic, "index.interval.bytes"),
                            now_ms=self.now_ms())
                        # Hold the slot over one turn of the loop: on a local store a
                        # recovery may never suspend, and the slots then bound nothing.
                        await asyncio.sleep(0)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # noqa: BLE001 - store or coordinator hiccup: retry
                    if is_damage(e):
                        await self._went_offline(a, str(e))
                        return
                    log.warning("%s-%d: recovery failed, retrying: %s", a.topic, a.partition, e)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 2.0)
            if self._wanted.get(key) != a:
                plog.close()
                return
            self.logs[key] = plog
            log.info("%s-%d: leader at epoch %d, offsets %d..%d", a.topic, a.partition, a.epoch,
                     plog.log_start_offset, plog.high_watermark)
            self.on_led()
        finally:
            self._becoming.pop(key, None)

    async def _went_offline(self, a: Assignment, reason: str) -> None:
        """Serve the partition no more and record it offline in the coordinator (retried
        while the coordinator is unreachable), so no gateway tries it again."""
        key = (a.topic, a.partition)
        self.offline[key] = (a, reason)
        log.error("%s-%d: OFFLINE, its committed data cannot be recovered: %s. The other partitions "
                  "are served; after restoring the object run `stratalog partitions recover %s %d`, or "
                  "add --truncate --accept-data-loss to continue from the last readable offset",
                  a.topic, a.partition, reason, a.topic, a.partition)
        delay = 0.1
        while self._wanted.get(key) == a:
            try:
                await mark_offline(self.store, a.topic_id, a.partition, a.epoch, reason)
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - coordinator outage: retry
                log.warning("%s-%d: could not record it offline, retrying: %s", a.topic, a.partition, e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    async def follow(self, replicating: list[Assignment], max_lag_s: float) -> set[str]:
        """Keep the partitions we replicate (but do not lead) warm; returns the ones not
        caught up within `max_lag_s` as "<topic id>/<partition>", which leaves us out of
        their ISR."""
        now = self.monotonic()
        wanted = {(a.topic, a.partition): a for a in replicating}
        for key in list(self.replicas):
            if key not in wanted or self.replicas[key].topic_id != wanted[key].topic_id:
                del self.replicas[key]
        for key, a in wanted.items():
            view = self.replicas.get(key)
            if view is None:
                view = self.replicas[key] = ReplicaView(a.topic, a.topic_id, a.partition)
            view.leader_epoch = a.epoch
            try:
                await view.catch_up(self.store, self.cache, now)
            except Exception as e:  # noqa: BLE001 - stays lagging until the next pass works
                log.debug("replica %s-%d: catch-up failed: %s", key[0], key[1], e)
        return {f"{v.topic_id}/{v.partition}" for v in self.replicas.values()
                if now - v.caught_up_at > max_lag_s}
