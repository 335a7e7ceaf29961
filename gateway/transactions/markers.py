"""Markers: what Kafka's WriteTxnMarkers does, done by every gateway for the partitions it
leads.

Every gateway follows the transaction states (an etcd watch, or the embedded store's) and
keeps the latest of each. For a decided transaction (PrepareCommit or PrepareAbort) it
appends the marker to each pending partition it leads, waits for the marker's WAL commit
(fenced by the leader epoch like any append), and removes those partitions from
`pending` by compare-and-swap. Whoever empties `pending` completes the transaction: the
group offsets it committed are applied (commit) or dropped (abort), then the state becomes
CompleteCommit or CompleteAbort. So a transaction decided by a gateway that then died is
finished by the leaders of its partitions; a partition whose leader died gets its marker
from the next leader, which sees the transaction still pending (a sweep every
SWEEP_INTERVAL_S looks again at every undecided state).

The sweep also aborts transactions open past their timeout, and forgets transactional ids
idle past transactional.id.expiration.ms, on the gateway coordinating the id.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from stratalog.coordinator.transactions import TopicPartition, TxnState, TxnStatus
from stratalog.engine.errors import EngineError

from .coordinator import TransactionCoordinator, TxnError

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 1.0
WATCH_RETRY_S = 1.0


class MarkerWriter:
    """
    Parameters
    ----------
    store : the `KVClusterStore`.
    engine : the gateway's `LogEngine` (markers are appended through it).
    coordinator : the gateway's `TransactionCoordinator` (timeouts).
    coordinates : whether this gateway coordinates a transactional id now.
    partition_exists : whether (topic, partition) still exists (a deleted one needs no marker).
    now_ms : the wall clock in milliseconds.
    abort_check_ms : transaction.abort.timed.out.transaction.cleanup.interval.ms.
    expiration_ms : transactional.id.expiration.ms.
    expiration_check_ms : transaction.remove.expired.transaction.cleanup.interval.ms.
    """

    def __init__(self, store, engine, coordinator: TransactionCoordinator, *,
                 coordinates: Callable[[str], bool],
                 partition_exists: Callable[[str, int], bool],
                 now_ms: Callable[[], int], abort_check_ms: int,
                 expiration_ms: int = 604_800_000, expiration_check_ms: int = 3_600_000):
        self.store = store
        self.engine = engine
        self.coordinator = coordinator
        self.coordinates = coordinates
        self.partition_exists = partition_exists
        self.now_ms = now_ms
        self.abort_check_ms = abort_check_ms
        self.expiration_ms = expiration_ms
        self.expiration_check_ms = expiration_check_ms
        self.states: dict[str, TxnState] = {}
        self._busy: set[tuple[str, int, int, str]] = set()
        self._tasks: set[asyncio.Task] = set()
        self._loops: list[asyncio.Task] = []
        self._loaded = asyncio.Event()
        self._last_abort_check = 0
        self._last_expiration_check = 0

    async def start(self) -> None:
        self._loops = [asyncio.create_task(self._follow(), name="txn-watch"),
                       asyncio.create_task(self._sweep(), name="txn-sweep")]
        await self._loaded.wait()

    async def stop(self) -> None:
        for t in (*self._loops, *self._tasks):
            t.cancel()
        await asyncio.gather(*self._loops, *self._tasks, return_exceptions=True)

    # ---- following the states ----------------------------------------------------------

    async def _follow(self) -> None:
        while True:
            watch = None
            try:
                watch = await self.store.watch_transactions()
                self.states = {s.transactional_id: s for s, _ in await self.store.transactions()}
                self._loaded.set()
                for state in self.states.values():
                    self.kick(state)
                async for event in watch:
                    if event.kind == "delete":
                        self.states.pop(self.store.transactional_id_of(event.key), None)
                        continue
                    try:
                        state = TxnState.from_json(event.key, event.value)
                    except Exception as e:  # noqa: BLE001 - one bad value must not stop the rest
                        log.error("skipping a transaction state: %s", e)
                        continue
                    self.states[state.transactional_id] = state
                    self.kick(state)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - coordinator outage: follow again
                log.warning("following transaction states failed: %s", e)
                self._loaded.set()  # serve meanwhile; the next load catches up
                await asyncio.sleep(WATCH_RETRY_S)
            finally:
                if watch is not None:
                    await watch.close()

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            try:
                await self.sweep_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - retried next sweep
                log.exception("transaction sweep failed")

    async def sweep_once(self) -> None:
        """Markers still pending anywhere we lead, (every abort_check_ms) timeouts, and
        (every expiration_check_ms) idle transactional ids."""
        for state in list(self.states.values()):
            self.kick(state)
        now = self.now_ms()
        if now - self._last_abort_check >= self.abort_check_ms:
            self._last_abort_check = now
            for state in list(self.states.values()):
                if state.status is TxnStatus.ONGOING and now - state.start_ms > state.timeout_ms \
                        and self.coordinates(state.transactional_id):
                    try:
                        await self.coordinator.abort_if_expired(state.transactional_id)
                    except TxnError as e:
                        log.warning("could not abort %s: %s", state.transactional_id, e)
        if now - self._last_expiration_check >= self.expiration_check_ms:
            self._last_expiration_check = now
            for state in list(self.states.values()):
                tid = state.transactional_id
                if state.forgettable(now, self.expiration_ms) and self.coordinates(tid) \
                        and await self.coordinator.forget_if_idle(tid, self.expiration_ms):
                    log.info("forgot transactional id %s: idle for %d ms", tid, now - state.update_ms)

    # ---- writing markers ---------------------------------------------------------------

    def kick(self, state: TxnState) -> asyncio.Task | None:
        """Do this gateway's part for a decided transaction, in the background; returns
        the task doing it (None: nothing to do, or under way already)."""
        if not state.status.preparing:
            return None
        key = (state.transactional_id, state.producer_id, state.producer_epoch, state.status.value)
        if key in self._busy:
            return None
        self._busy.add(key)
        task = asyncio.create_task(self._finish(state), name=f"txn-markers-{state.transactional_id}")
        self._tasks.add(task)

        def done(t: asyncio.Task) -> None:
            self._tasks.discard(t)
            self._busy.discard(key)
            if not t.cancelled() and t.exception() is not None:
                log.warning("markers of %s: %s", state.transactional_id, t.exception())

        task.add_done_callback(done)
        return task

    async def _finish(self, state: TxnState) -> None:
        commit = state.status is TxnStatus.PREPARE_COMMIT
        done: list[TopicPartition] = []
        waits = []
        for topic, p in state.pending:
            if not self.partition_exists(topic, p):
                done.append((topic, p))
                continue
            try:
                waits.append(((topic, p), self.engine.write_marker(
                    topic, p, state.producer_id, state.producer_epoch, commit=commit)))
            except EngineError:
                continue  # not led here: its leader writes it
        for tp, wait in waits:
            try:
                await wait
                done.append(tp)
            except Exception as e:  # noqa: BLE001 - the partition moved: its next leader writes it
                log.info("marker for %s on %s-%d not committed: %s", state.transactional_id, *tp, e)
        if done or not state.pending:
            await self._remove_pending(state, set(done))

    async def _remove_pending(self, seen: TxnState, done: set[TopicPartition]) -> None:
        while True:
            got = await self.store.transaction(seen.transactional_id)
            if got is None:
                return
            state, revision = got
            if (state.producer_id, state.producer_epoch, state.status) != \
                    (seen.producer_id, seen.producer_epoch, seen.status):
                return  # completed by someone else already
            pending = tuple(tp for tp in state.pending if tp not in done)
            if pending:
                if pending == state.pending or await self.store.put_transaction(
                        state.with_(pending=pending, update_ms=self.now_ms()), revision):
                    return
                continue
            commit = state.status is TxnStatus.PREPARE_COMMIT
            for group in state.groups:
                await self.store.end_pending_offsets(group, state.producer_id, commit)
            complete = state.with_(status=TxnStatus.COMPLETE_COMMIT if commit else TxnStatus.COMPLETE_ABORT,
                                   pending=(), partitions=(), groups=(), update_ms=self.now_ms())
            if await self.store.put_transaction(complete, revision):
                return
