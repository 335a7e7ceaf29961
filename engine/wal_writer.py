"""The WAL buffer of one gateway: batches of every led partition, flushed as ONE object.

Group commit: a flush starts as soon as batches are waiting and the previous flush has
finished, but no sooner than `wal.flush.ms` after the previous flush (or the writer)
started, unless the buffer already holds `wal.flush.bytes`. So a quiet gateway uploads a lone batch at once, a
busy one merges everything that arrives during a flush into the next, and `wal.flush.ms`
caps the object (PUT) rate: on S3 each flush is a paid request, on a file store only an
fsync, which is why the default spacing depends on the store. A flush uploads the pending
batches as one WAL object and commits its per-partition ranges to the coordinator in one
fenced commit; only then does each partition's high watermark move and do `acks=all`
producers get their answer. Flushes run one at a time, in order, so a partition's
committed ranges never leave a hole.

A flush that fails (no space, no permission, the store or the coordinator down) is retried
until it works: its batches are in partitions' local segments with offsets assigned, and
acks=1 producers were answered, so dropping them would lose acknowledged data. Once it has
failed for `fault_timeout_ms`, the writer is *failed* (`fault` says why): the engine
refuses new batches (never appended, so a client's retry cannot duplicate them), and the
acks=all producers waiting for batches already appended are told `WalCommitDelayed` (the
batches may still be committed once the store is back, so the answer must be a timeout,
which an idempotent producer's retry and sequence check cover). The first flush that
succeeds or is fenced (an answer too) ends the fault.

Every object also confirms the commits before it (tiering.wal: the confirmation range):
the sequences of this gateway's objects the coordinator accepted and has not collected,
which the writer learns from the coordinator at start and from each commit after. So
every committed object but a gateway's newest is proven committed by the bucket alone,
which is what `stratalog recover --from-bucket` restores WAL ranges from; a fenced object
is never confirmed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from stratalog.coordinator.model import ClusterStore, Fenced, WalObject, WalRange
from stratalog.tiering import layout
from stratalog.tiering.objectstore.base import ObjectStore
from stratalog.tiering.wal import CONFIRMATION_TOPIC_ID, SequenceSet, add_confirmations
from stratalog.tiering.wal import FORMAT_VERSION as WAL_FORMAT_VERSION
from stratalog.tiering.wal import WalBuilder

log = logging.getLogger(__name__)

PRUNE_CONFIRMATIONS_S = 60.0  # how often the confirmed set drops collected objects


class WalCommitFailed(Exception):
    """The batches were not committed (leadership lost); the producer must retry elsewhere."""


class WalCommitDelayed(Exception):
    """The WAL has been failing too long to wait for these batches; they are not committed
    yet and may still be (the store may come back), so the producer sees a timeout."""


@dataclass
class _Pending:
    """One future WAL object: its batches, and per partition its log and a future that
    resolves when the object is committed (or fails, for a partition discarded before the
    flush). One entry per partition, whatever the number of batches: an `add` looks it up
    once."""

    builder: WalBuilder = field(default_factory=WalBuilder)
    # (topic id, partition) -> [log, future]
    partitions: dict[tuple[uuid.UUID, int], list] = field(default_factory=dict)

    @property
    def epochs(self) -> dict[tuple[uuid.UUID, int], int]:
        """The leader epoch of each partition, which the commit is fenced by."""
        return {key: entry[0].leader_epoch for key, entry in self.partitions.items()}

    @property
    def logs(self) -> dict[tuple[uuid.UUID, int], object]:
        return {key: entry[0] for key, entry in self.partitions.items()}

    def waits(self) -> list[asyncio.Future]:
        return [entry[1] for entry in self.partitions.values()]

    def fail(self, key, exc: Exception) -> None:
        entry = self.partitions.pop(key, None)
        if entry is not None and not entry[1].done():
            entry[1].set_exception(exc)
            entry[1].exception()  # retrieved: an acks=1 producer never waits for it

    def fail_all(self, exc: Exception) -> None:
        for key in list(self.partitions):
            self.fail(key, exc)

    def stop_waiting(self, exc: Exception) -> int:
        """Fail the waits but keep the batches: they are still flushed (and `add` gives
        later batches a new future). Returns how many waits were failed."""
        failed = 0
        for fut in self.waits():
            if not fut.done():
                fut.set_exception(exc)
                fut.exception()
                failed += 1
        return failed


class WalWriter:
    def __init__(self, gateway_id: int, objects: ObjectStore, store: ClusterStore, *,
                 flush_ms: int, flush_bytes: int,
                 on_committed: Callable[[dict, list[WalRange]], None],
                 on_fenced: Callable[[list[tuple[uuid.UUID, int]]], None],
                 clock: Callable[[], float] = time.monotonic, metrics=None,
                 fault_timeout_ms: int = 5000):
        self.gateway_id = gateway_id
        self.objects = objects
        self.store = store
        self.flush_ms = flush_ms
        self.flush_bytes = flush_bytes
        self.on_committed = on_committed
        self.on_fenced = on_fenced
        self.clock = clock
        self.sequence = 0
        self.inflight: int | None = None  # sequence of the object being uploaded/committed
        self._pending = _Pending()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._closing = False
        self.last_flush_seconds = 0.0
        self.last_commit_seconds = 0.0
        self.metrics = metrics
        self.fault_timeout_ms = fault_timeout_ms
        self._flushing: _Pending | None = None  # the object being uploaded/committed
        self._failing_since: float | None = None  # first failure of the flush under way
        self.fault: str | None = None  # why the WAL is failed, once past fault_timeout_ms
        self.abandoned: str | None = None  # what a stop past its timeout left uncommitted
        self.confirmed = SequenceSet()  # our committed, uncollected objects (module docstring)
        self._pruned_at = 0.0
        self._prune_floor = 0

    async def start(self) -> None:
        """Continue the sequence after every WAL object this gateway id ever wrote,
        committed or not, so no key is reused."""
        seen = [o.sequence for o in await self.store.wal_objects() if o.gateway_id == self.gateway_id]
        for seq in seen:  # committed by an earlier run of this gateway id
            self.confirmed.add(seq)
        self._pruned_at = self.clock()
        for info in await self.objects.list(f"wal/{self.gateway_id}/"):
            try:
                seen.append(layout.parse_wal_key(info.key)[1])
            except ValueError:
                continue
        self.sequence = max(seen, default=0) + 1
        self._task = asyncio.create_task(self._run(), name="wal-flush")

    def add(self, plog, base_offset: int, last_offset: int, max_timestamp: int,
            batch: bytes | bytearray | memoryview) -> asyncio.Future:
        """Queue a patched batch, which the caller hands over (a bytearray or view is kept, not
        copied, and must not change again); the future resolves when its WAL object is
        committed."""
        p = self._pending
        if not p.partitions:
            self._wake.set()
        p.builder.add(plog.topic_id, plog.partition, base_offset, last_offset, max_timestamp, batch, copy=False)
        entry = p.partitions.get(plog.key)
        if entry is None:
            fut = asyncio.get_running_loop().create_future()
            p.partitions[plog.key] = [plog, fut]
        else:
            entry[0] = plog
            fut = entry[1]
            if fut.done():  # its waiters were told WalCommitDelayed
                fut = entry[1] = asyncio.get_running_loop().create_future()
        if p.builder.size >= self.flush_bytes:
            self._wake.set()
        return fut

    def discard(self, key: tuple[uuid.UUID, int]) -> None:
        """Forget a partition's queued batches: it is no longer ours, so committing them
        would be fenced and fail every other partition of the same object."""
        p = self._pending
        if key in p.partitions:
            p.builder.discard(*key)
            p.fail(key, WalCommitFailed("leadership moved before the batches were committed"))

    async def _run(self) -> None:
        previous_start = self.clock()  # the spacing also counts from the start
        while True:
            # Once closing, nothing wakes this loop any more (stop's wake may already have
            # been used by a flush it interrupted): flush what is left, then end.
            if not self._closing:
                await self._wake.wait()
                self._wake.clear()
            p = self._pending
            if not p.partitions:
                if self._closing:
                    return
                continue
            due = previous_start + self.flush_ms / 1000
            while p.builder.size < self.flush_bytes and not self._closing:
                delay = due - self.clock()
                if delay <= 0:
                    break
                try:
                    await asyncio.wait_for(self._wake.wait(), delay)
                except asyncio.TimeoutError:
                    break
                self._wake.clear()
            previous_start = self.clock()
            self._pending = _Pending()
            await self._flush(p)

    async def _flush(self, p: _Pending) -> None:
        if p.builder.empty:
            return  # every partition in it was discarded
        started = self.clock()
        await self._prune_confirmed()
        add_confirmations(p.builder, self.confirmed)
        data, infos = p.builder.build_parts()
        key = layout.wal_key(self.gateway_id, self.sequence)
        seq = self.sequence
        self.sequence += 1
        ranges = tuple(WalRange(i.topic_id, i.partition, i.base_offset, i.last_offset,
                                i.position, i.length, i.max_timestamp, WAL_FORMAT_VERSION)
                       for i in infos if i.topic_id != CONFIRMATION_TOPIC_ID)
        obj = WalObject(self.gateway_id, seq, key, ranges, WAL_FORMAT_VERSION)
        self.inflight = seq
        self._flushing = p
        try:
            await self._retry("upload", lambda: self.objects.put(key, data))
            put_done = self.clock()
            epochs = p.epochs
            await self._retry("commit", lambda: self.store.commit_wal(obj, epochs))
        except Fenced as e:
            # The coordinator answered, so the storage works: a fault declared while this
            # flush was retried ends here. Left standing, it would refuse every batch, and
            # with none appended no flush would ever come to end it.
            self._recovered()
            # Batches queued behind this object carry offsets that follow the failed ones:
            # committing them would leave a hole, so they fail too.
            queued, self._pending = self._pending, _Pending()
            log.warning("WAL object %s fenced: %s", key, e)
            self.on_fenced(list(p.epochs) + list(queued.epochs))
            for failed in (p, queued):
                failed.fail_all(WalCommitFailed(str(e)))
            # Nothing will ever commit this object: remove it now rather than leave it for
            # the next start. If that fails, `settled_below` lets the periodic sweep do it.
            try:
                await self.objects.delete([key])
            except Exception as de:  # noqa: BLE001 - the sweep retries it
                log.warning("could not delete fenced WAL object %s: %s", key, de)
            return
        finally:
            self.inflight = None
            self._flushing = None
        self.confirmed.add(seq)
        self._recovered()
        self.last_commit_seconds = self.clock() - put_done
        self.last_flush_seconds = self.clock() - started
        if self.metrics is not None:
            self.metrics.wal_commit.observe(self.last_commit_seconds)
            self.metrics.wal_flush.observe(self.last_flush_seconds)
        self.on_committed(p.logs, list(ranges))
        for fut in p.waits():
            if not fut.done():
                fut.set_result(None)

    async def _prune_confirmed(self) -> None:
        """Now and then, forget confirmations of objects the coordinator has collected
        (their ranges are sealed), so the confirmation range stays a few intervals."""
        if self.clock() - self._pruned_at < PRUNE_CONFIRMATIONS_S:
            return
        self._pruned_at = self.clock()
        # With none of ours in the index, only what was flushed before the previous prune
        # is surely collected (a newer commit may not have reached the index yet).
        floor, self._prune_floor = self._prune_floor, self.sequence
        try:
            oldest = await self.store.oldest_wal_sequence(self.gateway_id)
        except Exception as e:  # noqa: BLE001 - only an optimisation: next time
            log.debug("could not read WAL objects to prune confirmations: %s", e)
            return
        self.confirmed.prune_below(floor if oldest is None else oldest)

    def settled_below(self) -> int:
        """Every object of this gateway with a lower sequence is either committed or will
        never be (its flush is over): an uncommitted one is garbage."""
        return self.inflight if self.inflight is not None else self.sequence

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
                now = self.clock()
                if self._failing_since is None:
                    self._failing_since = now
                if self.metrics is not None:
                    self.metrics.wal_failures.labels(what).inc()
                failing_for = now - self._failing_since
                if self.fault is None and failing_for >= self.fault_timeout_ms / 1000:
                    self._declare_fault(f"WAL {what} failing for {failing_for:.1f}s: {e}")
                elif self.fault is not None:
                    self.fault = f"WAL {what} failing for {failing_for:.1f}s: {e}"
                # Sleep no later than the fault's deadline, so waiting producers hear of it then.
                pause = delay * (0.5 + random.random())
                if self.fault is None:
                    pause = min(pause, max(0.01, self._failing_since + self.fault_timeout_ms / 1000 - now))
                log.warning("WAL %s failed, retrying in %.2fs: %s", what, pause, e)
                await asyncio.sleep(pause)
                delay = min(delay * 2, 2.0)

    def _declare_fault(self, reason: str) -> None:
        self.fault = reason
        exc = WalCommitDelayed(f"the batch is not committed yet and may still be: {reason}")
        waits = sum(p.stop_waiting(exc) for p in (self._flushing, self._pending) if p is not None)
        log.error("storage failed: %s; refusing produce with KAFKA_STORAGE_ERROR until a flush "
                  "succeeds or is fenced (%d waiting producers told to retry; their batches are kept)", reason, waits)

    def _recovered(self) -> None:
        if self._failing_since is not None:
            if self.fault is not None:
                log.warning("storage back: the WAL's store and coordinator answer again after %.1fs",
                            self.clock() - self._failing_since)
            self._failing_since = None
            self.fault = None

    def pending_summary(self) -> str | None:
        """What a stop now would leave uncommitted, for the shutdown log (None: nothing)."""
        parts = [p for p in (self._flushing, self._pending) if p is not None and not p.builder.empty]
        if not parts:
            return None
        partitions = {k for p in parts for k in p.epochs}
        size = sum(p.builder.size for p in parts)
        return f"{size} bytes of WAL batches of {len(partitions)} partition(s) not committed"

    async def stop(self, timeout_s: float = 30) -> None:
        """Flush what is pending, then stop; past `timeout_s` (a store still failing) the
        flush is abandoned: its batches stay uncommitted, so only acks=1 producers (answered
        before the commit) can lose them, as in a crash."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            done, _ = await asyncio.wait({self._task}, timeout=timeout_s)
            if not done:
                self.abandoned = self.pending_summary() or "a flush under way"
                log.error("WAL stop: abandoned after %.1fs: %s", timeout_s, self.abandoned)
                self._task.cancel()
                await asyncio.wait({self._task}, timeout=1.0)
