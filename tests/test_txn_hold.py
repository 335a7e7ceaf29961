"""The transaction coordinator's hold (gateway/transactions/held.py), in process against
the embedded coordinator store: EndTxn is answered once its decision is durable; the
producer's next request waits for the markers instead of being told
CONCURRENT_TRANSACTIONS, and its state is written together with the completion.

The markers themselves (and a real producer going through the hold) are covered by
tests/test_transactions.py; here the completion is the MarkerWriter's own, called as it is
once every marker is committed."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.store import KVClusterStore
from stratalog.coordinator.transactions import TxnStatus
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.gateway.transactions import MarkerWriter, TransactionCoordinator, TxnError
from stratalog.gateway.transactions import coordinator as coordinator_module

pytestmark = pytest.mark.unit

TID = "app-1"


async def _setup(tmp_path):
    store = KVClusterStore(EmbeddedKV(tmp_path / "coord"), "c")
    ids = itertools.count(1000)

    async def new_producer_id() -> int:
        return next(ids)

    prepared = []
    coord = TransactionCoordinator(store, new_producer_id=new_producer_id, now_ms=lambda: 1_000,
                                   max_timeout_ms=60_000, prepared=prepared.append)
    markers = MarkerWriter(store, None, coord, coordinates=lambda tid: True,
                           partition_exists=lambda topic, p: True, now_ms=lambda: 2_000,
                           abort_check_ms=10_000)
    return store, coord, markers, prepared


async def _markers_written(store, markers: MarkerWriter) -> None:
    """What the marker writer does once the markers of every pending partition committed."""
    state, _ = await store.transaction(TID)
    assert state.status.preparing
    await markers._remove_pending(state, set(state.pending))


def test_end_txn_answers_at_the_decision_and_the_next_add_is_held_then_written_with_the_completion(tmp_path):
    async def go():
        store, coord, markers, prepared = await _setup(tmp_path)
        try:
            p = await coord.init_producer_id(TID, 30_000, None)
            await coord.add_partitions(TID, p.producer_id, p.producer_epoch, [("t", 0), ("t", 1)])
            await coord.end_txn(TID, p.producer_id, p.producer_epoch, commit=True)
            state, _ = await store.transaction(TID)
            assert state.status is TxnStatus.PREPARE_COMMIT and state.pending == (("t", 0), ("t", 1))
            assert [s.status for s in prepared] == [TxnStatus.PREPARE_COMMIT]

            # The next transaction's first request waits: no CONCURRENT_TRANSACTIONS.
            add = asyncio.create_task(coord.add_partitions(TID, p.producer_id, p.producer_epoch, [("t", 1)]))
            await asyncio.sleep(0.05)
            assert not add.done()

            writes = []
            put = store.put_transaction

            async def counted(new, revision):
                writes.append(new.status)
                return await put(new, revision)
            store.put_transaction = counted
            await _markers_written(store, markers)
            await asyncio.wait_for(add, 5)
            state, _ = await store.transaction(TID)
            # One write completed the transaction and began the next one.
            assert writes == [TxnStatus.ONGOING]
            assert state.status is TxnStatus.ONGOING and state.partitions == (("t", 1),)
            assert state.pending == () and state.start_ms == 1_000

            # The folded state is a real Ongoing transaction: it commits like any other.
            await coord.end_txn(TID, p.producer_id, p.producer_epoch, commit=True)
            assert (await store.transaction(TID))[0].status is TxnStatus.PREPARE_COMMIT
        finally:
            await store.close()
    asyncio.run(go())


def test_held_requests_the_completion_refuses_get_their_own_answers(tmp_path):
    async def go():
        store, coord, markers, _ = await _setup(tmp_path)
        try:
            await coord.init_producer_id(TID, 30_000, None)
            p = await coord.init_producer_id(TID, 30_000, None)  # epoch 1: epoch 0 is a zombie's
            await coord.add_offsets(TID, p.producer_id, p.producer_epoch, "g")
            await coord.end_txn(TID, p.producer_id, p.producer_epoch, commit=False)
            # A retried EndTxn is answered once the transaction completed, as a retry of a
            # completed one; a zombie's request (an older epoch) is held like any other,
            # then fenced.
            retry = asyncio.create_task(coord.end_txn(TID, p.producer_id, p.producer_epoch, commit=False))
            zombie = asyncio.create_task(coord.add_offsets(TID, p.producer_id, p.producer_epoch - 1, "g"))
            await asyncio.sleep(0.1)
            await _markers_written(store, markers)
            with pytest.raises(TxnError) as e:
                await asyncio.wait_for(zombie, 5)
            assert e.value.code is E.PRODUCER_FENCED
            await asyncio.wait_for(retry, 5)
            assert (await store.transaction(TID))[0].status is TxnStatus.COMPLETE_ABORT
            # The group is already in the transaction: AddOffsetsToTxn again writes nothing.
            await coord.add_offsets(TID, p.producer_id, p.producer_epoch, "g")
            _, revision = await store.transaction(TID)
            await coord.add_offsets(TID, p.producer_id, p.producer_epoch, "g")
            assert (await store.transaction(TID))[1] == revision
        finally:
            await store.close()
    asyncio.run(go())


def test_a_request_held_past_the_bound_is_told_concurrent_transactions(tmp_path, monkeypatch):
    monkeypatch.setattr(coordinator_module, "PREPARED_HOLD_S", 0.1)

    async def go():
        store, coord, _, _ = await _setup(tmp_path)
        try:
            p = await coord.init_producer_id(TID, 30_000, None)
            await coord.add_partitions(TID, p.producer_id, p.producer_epoch, [("t", 0)])
            await coord.end_txn(TID, p.producer_id, p.producer_epoch, commit=True)
            # No marker is ever written (the partition's leader is gone, say).
            with pytest.raises(TxnError) as e:
                await coord.add_partitions(TID, p.producer_id, p.producer_epoch, [("t", 0)])
            assert e.value.code is E.CONCURRENT_TRANSACTIONS
            assert not coord.held._holds  # nothing left behind
            assert (await store.transaction(TID))[0].status is TxnStatus.PREPARE_COMMIT
        finally:
            await store.close()
    asyncio.run(go())
