"""A hostile environment: a disk that fills up, a store that fails, SIGTERM at any moment,
and a CreateTopics of thousands of partitions. The gateway answers clearly, keeps
serving what it can, ends when told to, and loses nothing it acknowledged."""

from __future__ import annotations

import asyncio
import errno

import pytest

from engine_harness import Backends, batch, committed, eventually, read_all, records_of, run
from store_faults import FailingWrites
from stratalog.engine.errors import StorageUnavailable
from stratalog.engine.wal_writer import WalCommitDelayed
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.error_codes import ErrorCode

WAL = "wal/"


# ---- the engine: a WAL that cannot be written -------------------------------------------

@pytest.mark.unit
def test_a_full_disk_refuses_new_batches_and_keeps_every_appended_one(tmp_path):
    """Past wal.fault.timeout.ms of ENOSPC, new batches are refused before they are
    appended (KAFKA_STORAGE_ERROR), acks=all waiters hear REQUEST_TIMED_OUT (their batches
    may still be committed), and once the disk has room everything appended is committed
    once, in order, with an idempotent producer's retry answered from its original."""
    fault: list = []

    async def body(h):
        await h.create_topic("disk", 1)
        store = FailingWrites(h.objects, lambda: fault[0] if fault else None)
        engine = await h.start_engine(objects=store, wal_fault_timeout_ms=300)
        await h.lead(engine)
        pid = (901, 0)

        def append(seq: int, tag: str):
            return engine.append("disk", 0, batch(1, ts=h.clock.ms, tag=tag, producer=pid, sequence=seq),
                                 now_ms=h.clock.ms)

        await committed(append(0, "a"))
        fault.append((errno.ENOSPC, WAL))
        waiting = append(1, "b")  # appended (and answered, for acks=1) before the fault is known
        with pytest.raises(WalCommitDelayed) as delayed:
            await committed(waiting)
        assert error_code(delayed.value) == ErrorCode.REQUEST_TIMED_OUT
        reason = engine.storage_fault()
        assert reason is not None and "No space left on device" in reason
        with pytest.raises(StorageUnavailable) as refused:
            append(2, "c")
        assert error_code(refused.value) == ErrorCode.KAFKA_STORAGE_ERROR
        assert engine.leader("disk", 0).next_offset == 2, "a refused batch must not be appended"

        fault.clear()
        await eventually(lambda: engine.leader("disk", 0).high_watermark == 2, "the kept batch committed")
        assert engine.storage_fault() is None
        retried = append(1, "b")  # the producer's retry of the timed-out batch
        assert retried.base_offset == 1
        await committed(retried)
        await committed(append(2, "c"))
        values = [r[3][:3] for r in records_of(await read_all(engine, "disk", 0))]
        assert values == [b"a-v", b"b-v", b"c-v"]
        assert [r[0] for r in records_of(await read_all(engine, "disk", 0))] == [0, 1, 2]
        assert store.failed > 0

    run(Backends("embedded+file", tmp_path), body)


# ---- many partitions at once ----------------------------------------------------------

@pytest.mark.unit
def test_recoveries_of_many_new_partitions_leave_the_event_loop_turns(tmp_path):
    """A creation of thousands of partitions makes thousands of recoveries; on a local store
    one may never suspend, so unbounded they would all run in one turn of the event loop
    and starve every connection. At most RECOVERIES_AT_ONCE finish per turn."""
    from stratalog.engine.leadership import RECOVERIES_AT_ONCE

    async def body(h):
        await h.create_topic("many", 200)
        engine = await h.start_engine()
        led_per_turn: list[int] = []
        done = asyncio.Event()

        async def watch():
            while not done.is_set():
                led_per_turn.append(len(engine.led()))
                await asyncio.sleep(0)

        watcher = asyncio.create_task(watch())
        await h.lead(engine)
        done.set()
        await watcher
        assert len(engine.led()) == 200
        steps = [b - a for a, b in zip(led_per_turn, led_per_turn[1:])]
        assert max(steps) <= RECOVERIES_AT_ONCE, f"{max(steps)} recoveries finished in one turn of the loop"
        assert len(led_per_turn) >= 200 // RECOVERIES_AT_ONCE

    run(Backends("embedded+file", tmp_path), body)
