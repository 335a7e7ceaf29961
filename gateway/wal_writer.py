"""The gateway's WAL buffer: batches of every led partition, flushed as ONE object.

Every `wal.flush.ms` or `wal.flush.bytes`, whichever comes first, the pending batches are
uploaded as one WAL object and its per-partition ranges committed to the coordinator in
one fenced commit. Only then does each partition's high watermark move and do `acks=all`
producers get their answer. Flushes run one at a time, in order, so a partition's
committed ranges never leave a hole.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from coordinator.model import ClusterStore, Fenced, WalObject, WalRange
from tiering import layout
from tiering.objectstore.base import ObjectStore
from tiering.wal import WalBuilder

log = logging.getLogger(__name__)


class WalCommitFailed(Exception):
    """The batches were not committed (leadership lost); the producer must retry elsewhere."""


@dataclass
class _Pending:
    builder: WalBuilder = field(default_factory=WalBuilder)
    epochs: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)
    logs: dict[tuple[uuid.UUID, int], object] = field(default_factory=dict)
    done: asyncio.Future | None = None
    first_add: float = 0.0


class WalWriter:
    def __init__(self, gateway_id: int, objects: ObjectStore, store: ClusterStore, *,
                 flush_ms: int, flush_bytes: int,
                 on_committed: Callable[[dict, list[WalRange]], None],
                 on_fenced: Callable[[list[tuple[uuid.UUID, int]]], None],
                 clock: Callable[[], float] = time.monotonic):
        self.gateway_id = gateway_id
        self.objects = objects
        self.store = store
        self.flush_ms = flush_ms
        self.flush_bytes = flush_bytes
        self.on_committed = on_committed
        self.on_fenced = on_fenced
        self.clock = clock
        self.sequence = 0
        self._pending = _Pending()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self.flushes = 0
        self.last_flush_seconds = 0.0
        self.last_commit_seconds = 0.0
        self.metrics = None

    async def start(self) -> None:
        """Continue the sequence after every WAL object this gateway id ever wrote,
        committed or not, so no key is reused."""
        seen = [o.sequence for o in await self.store.wal_objects() if o.gateway_id == self.gateway_id]
        for info in await self.objects.list(f"wal/{self.gateway_id}/"):
            try:
                seen.append(layout.parse_wal_key(info.key)[1])
            except ValueError:
                continue
        self.sequence = max(seen, default=0) + 1
        self._task = asyncio.create_task(self._run(), name="wal-flush")

    def add(self, plog, base_offset: int, last_offset: int, max_timestamp: int,
            batch: bytes | bytearray) -> asyncio.Future:
        """Queue a patched batch; the future resolves when its WAL object is committed."""
        p = self._pending
        if p.done is None:
            p.done = asyncio.get_running_loop().create_future()
            p.first_add = self.clock()
            self._wake.set()
        p.builder.add(plog.topic_id, plog.partition, base_offset, last_offset, max_timestamp, batch)
        p.epochs[plog.key] = plog.leader_epoch
        p.logs[plog.key] = plog
        if p.builder.size >= self.flush_bytes:
            self._wake.set()
        return p.done

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            p = self._pending
            if p.done is None:
                if self._closing:
                    return
                continue
            due = p.first_add + self.flush_ms / 1000
            while p.builder.size < self.flush_bytes and not self._closing:
                delay = due - self.clock()
                if delay <= 0:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    break
                self._wake.clear()
            self._pending = _Pending()
            await self._flush(p)

    async def _flush(self, p: _Pending) -> None:
        started = self.clock()
        data, infos = p.builder.build()
        key = layout.wal_key(self.gateway_id, self.sequence)
        seq = self.sequence
        self.sequence += 1
        ranges = tuple(WalRange(i.topic_id, i.partition, i.base_offset, i.last_offset,
                                i.position, i.length, i.max_timestamp) for i in infos)
        obj = WalObject(self.gateway_id, seq, key, ranges)
        try:
            await self._retry("upload", lambda: self.objects.put(key, data))
            put_done = self.clock()
            await self._retry("commit", lambda: self.store.commit_wal(obj, p.epochs))
        except Fenced as e:
            # Batches queued behind this object carry offsets that follow the failed ones:
            # committing them would leave a hole, so they fail too.
            queued, self._pending = self._pending, _Pending()
            log.warning("WAL object %s fenced: %s", key, e)
            self.on_fenced(list(p.epochs) + list(queued.epochs))
            for failed in (p, queued):
                if failed.done is not None:
                    failed.done.set_exception(WalCommitFailed(str(e)))
                    failed.done.exception()  # retrieved: not every waiter may still listen
            return
        self.flushes += 1
        self.last_commit_seconds = self.clock() - put_done
        self.last_flush_seconds = self.clock() - started
        if self.metrics is not None:
            self.metrics.wal_commit.observe(self.last_commit_seconds)
            self.metrics.wal_flush.observe(self.last_flush_seconds)
        self.on_committed(p.logs, list(ranges))
        p.done.set_result(None)

    async def _retry(self, what: str, op):
        """Retry until it works: acknowledged data must not be dropped because the store
        or the coordinator was briefly unavailable. Fencing is final and propagates."""
        delay = 0.05
        while True:
            try:
                return await op()
            except Fenced:
                raise
            except Exception as e:  # noqa: BLE001 - any store/coordinator failure is retried
                if self._closing and self._task is None:
                    raise
                log.warning("WAL %s failed, retrying in %.2fs: %s", what, delay, e)
                await asyncio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)

    async def stop(self) -> None:
        """Flush what is pending, then stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, 30)
            except asyncio.TimeoutError:
                self._task.cancel()
