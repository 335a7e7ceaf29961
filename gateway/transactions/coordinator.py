"""The transaction coordinator: Kafka's transaction state machine (KIP-98, KIP-360, KIP-447)
for the transactional ids this gateway coordinates, with every state kept in the
coordinator KV (`coordinator.transactions`) so any gateway can take over.

Each operation reads the id's state, decides, and writes the new state with a
compare-and-swap; a lost race reads again and decides again. Nothing is cached between
requests, so a gateway that just became coordinator for an id needs no loading.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Awaitable, Callable, Iterable

from stratalog.coordinator.model import CommittedOffset
from stratalog.coordinator.transactions import TopicPartition, TxnState, TxnStatus
from stratalog.gateway.protocol.error_codes import ErrorCode

log = logging.getLogger(__name__)

E = ErrorCode
MAX_EPOCH = 0x7FFF - 1  # an epoch past this takes a new producer id (Kafka's rule)
CAS_ATTEMPTS = 20
END_TXN_WAIT_S = 1.0


class TxnError(Exception):
    """An operation answered with a Kafka error code."""

    def __init__(self, code: ErrorCode, message: str = ""):
        super().__init__(message or code.name)
        self.code = code


@dataclass(frozen=True)
class ProducerIdAndEpoch:
    producer_id: int
    producer_epoch: int


class TransactionCoordinator:
    """
    Parameters
    ----------
    store : the `KVClusterStore` (transaction states and pending group offsets).
    new_producer_id : allocates a producer id.
    now_ms : the wall clock in milliseconds.
    max_timeout_ms : transaction.max.timeout.ms.
    prepared : told of every state that entered PrepareCommit/PrepareAbort, so markers
        are written at once where this gateway leads partitions; returns the work (a
        task) when there is some here, or None.
    """

    def __init__(self, store, *, new_producer_id: Callable[[], Awaitable[int]],
                 now_ms: Callable[[], int], max_timeout_ms: int,
                 prepared: Callable[[TxnState], "asyncio.Future | None"] = lambda s: None):
        self.store = store
        self.new_producer_id = new_producer_id
        self.now_ms = now_ms
        self.max_timeout_ms = max_timeout_ms
        self.prepared = prepared

    async def _update(self, transactional_id: str,
                      decide: Callable[[TxnState | None], TxnState | None]) -> TxnState | None:
        """Read, decide, compare-and-swap, until the swap holds. `decide` returns the new
        state, None to write nothing, or raises TxnError."""
        return (await self._update_marking(transactional_id, decide))[0]

    async def _update_marking(self, transactional_id: str,
                              decide: Callable[[TxnState | None], TxnState | None]
                              ) -> tuple[TxnState | None, "asyncio.Future | None"]:
        """`_update`, also returning the marker work it started here (if any)."""
        for _ in range(CAS_ATTEMPTS):
            got = await self.store.transaction(transactional_id)
            state, revision = got if got is not None else (None, 0)
            new = decide(state)
            if new is None:
                return state, None
            new = new.with_(update_ms=self.now_ms())
            if await self.store.put_transaction(new, revision):
                return new, (self.prepared(new) if new.status.preparing else None)
        raise TxnError(E.CONCURRENT_TRANSACTIONS, f"{transactional_id}: too many concurrent changes")

    # ---- InitProducerId ------------------------------------------------------------------

    async def init_producer_id(self, transactional_id: str, timeout_ms: int,
                               expected: ProducerIdAndEpoch | None) -> ProducerIdAndEpoch:
        if not 0 < timeout_ms <= self.max_timeout_ms:
            raise TxnError(E.INVALID_TRANSACTION_TIMEOUT,
                           f"transaction.timeout.ms {timeout_ms} is not in 1..{self.max_timeout_ms}")
        fresh_id = await self.new_producer_id()
        ongoing_aborted = False

        def decide(state: TxnState | None) -> TxnState | None:
            nonlocal ongoing_aborted
            ongoing_aborted = False
            if state is None:
                # Also when the producer names the id and epoch it had: its transactional
                # id was forgotten (transactional.id.expiration.ms), and as Kafka's
                # coordinator does, a fresh producer id lets it go on.
                return TxnState(transactional_id, fresh_id, 0, timeout_ms)
            if expected is not None and not _is_current(state, expected):
                raise TxnError(E.PRODUCER_FENCED, f"{transactional_id}: producer {expected.producer_id} "
                               f"epoch {expected.producer_epoch} is not the current one")
            if state.status.preparing:
                raise TxnError(E.CONCURRENT_TRANSACTIONS, "the previous transaction is being completed")
            if state.status is TxnStatus.ONGOING:
                # A new instance of the producer: fence the old one (the markers carry the
                # bumped epoch) and abort what it left open; the client retries meanwhile.
                ongoing_aborted = True
                # The old epoch may not recover (KIP-360) from this fence: it is a zombie.
                return _fenced(state).with_(status=TxnStatus.PREPARE_ABORT, pending=state.partitions,
                                            last_producer_epoch=-1)
            if expected is not None and expected.producer_epoch == state.last_producer_epoch \
                    and expected.producer_epoch != state.producer_epoch:
                return None  # a retry of the bump that made the current epoch
            return _bumped(state, fresh_id).with_(timeout_ms=timeout_ms, status=TxnStatus.EMPTY,
                                                  partitions=(), groups=(), start_ms=-1)

        state = await self._update(transactional_id, decide)
        assert state is not None
        if ongoing_aborted:
            raise TxnError(E.CONCURRENT_TRANSACTIONS, "aborting the previous instance's transaction")
        return ProducerIdAndEpoch(state.producer_id, state.producer_epoch)

    # ---- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------------

    def _check_producer(self, state: TxnState | None, transactional_id: str, producer_id: int,
                        epoch: int) -> TxnState:
        if state is None or state.producer_id != producer_id:
            raise TxnError(E.INVALID_PRODUCER_ID_MAPPING,
                           f"{transactional_id} is not held by producer {producer_id}")
        if epoch != state.producer_epoch:
            raise TxnError(E.PRODUCER_FENCED, f"{transactional_id}: epoch {epoch} is not the "
                           f"current epoch {state.producer_epoch}")
        return state

    def _begin(self, state: TxnState) -> TxnState:
        """The state with a transaction open (a checked producer's state)."""
        if state.status.preparing:
            raise TxnError(E.CONCURRENT_TRANSACTIONS, "the previous transaction is being completed")
        if state.status.open_for_new:
            return state.with_(status=TxnStatus.ONGOING, partitions=(), groups=(), pending=(),
                               start_ms=self.now_ms())
        return state

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int,
                             partitions: Iterable[TopicPartition], *, verify_only: bool = False) -> None:
        wanted = tuple(sorted(set(partitions)))

        def decide(state: TxnState | None) -> TxnState | None:
            state = self._check_producer(state, transactional_id, producer_id, epoch)
            if verify_only:
                if state.status is not TxnStatus.ONGOING or not set(wanted) <= set(state.partitions):
                    raise TxnError(E.INVALID_TXN_STATE, "not every partition is in the transaction")
                return None
            began = self._begin(state)
            merged = tuple(sorted(set(began.partitions) | set(wanted)))
            if began is state and merged == state.partitions:
                return None  # nothing new: no write
            return began.with_(partitions=merged)

        await self._update(transactional_id, decide)

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int, group_id: str) -> None:
        def decide(state: TxnState | None) -> TxnState | None:
            state = self._begin(self._check_producer(state, transactional_id, producer_id, epoch))
            return state.with_(groups=tuple(sorted(set(state.groups) | {group_id})))

        await self._update(transactional_id, decide)

    async def check_offsets_allowed(self, transactional_id: str, producer_id: int, epoch: int,
                                    group_id: str) -> None:
        """TxnOffsetCommit: the producer is current and added the group to its transaction."""
        got = await self.store.transaction(transactional_id)
        state = self._check_producer(got[0] if got else None, transactional_id, producer_id, epoch)
        if state.status is not TxnStatus.ONGOING or group_id not in state.groups:
            raise TxnError(E.INVALID_TXN_STATE, f"group {group_id} is not in an ongoing transaction "
                           f"of {transactional_id} (AddOffsetsToTxn first)")

    async def commit_offsets(self, transactional_id: str, producer_id: int, epoch: int, group_id: str,
                             offsets: dict[TopicPartition, CommittedOffset]) -> None:
        await self.check_offsets_allowed(transactional_id, producer_id, epoch, group_id)
        await self.store.put_pending_offsets(group_id, producer_id, offsets)

    # ---- EndTxn --------------------------------------------------------------------------

    async def end_txn(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> None:
        def decide(state: TxnState | None) -> TxnState | None:
            state = self._check_producer(state, transactional_id, producer_id, epoch)
            s = state.status
            if s is TxnStatus.ONGOING:
                return state.with_(status=TxnStatus.PREPARE_COMMIT if commit else TxnStatus.PREPARE_ABORT,
                                   pending=state.partitions)
            if s.preparing:
                if (s is TxnStatus.PREPARE_COMMIT) == commit:
                    raise TxnError(E.CONCURRENT_TRANSACTIONS, "the transaction is being completed")
            elif s in (TxnStatus.COMPLETE_COMMIT, TxnStatus.COMPLETE_ABORT):
                if (s is TxnStatus.COMPLETE_COMMIT) == commit:
                    return None  # a retry of an EndTxn that completed
            raise TxnError(E.INVALID_TXN_STATE, f"{transactional_id} is {s.value}: cannot "
                           f"{'commit' if commit else 'abort'}")

        _, marking = await self._update_marking(transactional_id, decide)
        if marking is not None:
            # Kafka answers once the decision is durable, as this does; waiting briefly for
            # the markers written here lets the producer's next AddPartitionsToTxn find
            # the transaction complete instead of retrying after CONCURRENT_TRANSACTIONS.
            await asyncio.wait([marking], timeout=END_TXN_WAIT_S)

    # ---- timeouts ------------------------------------------------------------------------

    async def abort_if_expired(self, transactional_id: str) -> bool:
        """Abort a transaction open past its timeout, bumping the epoch so the producer
        that left it cannot add to it; True if this call aborted it."""
        now = self.now_ms()
        aborted = False

        def decide(state: TxnState | None) -> TxnState | None:
            nonlocal aborted
            aborted = False
            if state is None or state.status is not TxnStatus.ONGOING \
                    or now - state.start_ms <= state.timeout_ms:
                return None
            aborted = True
            return _fenced(state).with_(status=TxnStatus.PREPARE_ABORT, pending=state.partitions)

        await self._update(transactional_id, decide)
        if aborted:
            log.info("transaction %s was open longer than its timeout: aborting it", transactional_id)
        return aborted


    async def forget_if_idle(self, transactional_id: str, expiration_ms: int) -> bool:
        """Forget a transactional id that has no transaction open and was not changed for
        `expiration_ms` (transactional.id.expiration.ms); True if this call forgot it. A
        producer of it that comes back is answered INVALID_PRODUCER_ID_MAPPING, as
        Kafka's coordinator answers it, until it calls InitProducerId again."""
        got = await self.store.transaction(transactional_id)
        if got is None:
            return False
        state, revision = got
        if not state.forgettable(self.now_ms(), expiration_ms):
            return False
        # A change since the read means it is in use again: the swap fails and it stays.
        return await self.store.delete_transaction(transactional_id, revision)


def _is_current(state: TxnState, expected: ProducerIdAndEpoch) -> bool:
    return state.producer_id == expected.producer_id and expected.producer_epoch in (
        state.producer_epoch, state.last_producer_epoch)


def _fenced(state: TxnState) -> TxnState:
    """The epoch bumped under the same producer id: the abort markers carry it, so the
    partitions refuse the old epoch's batches from then on."""
    epoch = min(state.producer_epoch + 1, MAX_EPOCH)
    return state.with_(producer_epoch=epoch, last_producer_epoch=state.producer_epoch)


def _bumped(state: TxnState, fresh_id: int) -> TxnState:
    if state.producer_epoch >= MAX_EPOCH:
        return state.with_(producer_id=fresh_id, producer_epoch=0, last_producer_epoch=-1)
    return state.with_(producer_epoch=state.producer_epoch + 1, last_producer_epoch=state.producer_epoch)
