"""A partition whose committed data is damaged or missing goes offline alone: the gateway
serves every other partition, answers KAFKA_STORAGE_ERROR for it, shows it in /readyz, the
metrics and `stratalog topics describe`, and an operator brings it back (again once the
object is restored, or truncated with --truncate --accept-data-loss). In a cluster the
offline state lives in the coordinator, so the partition does not bounce between gateways.
"""

from __future__ import annotations

import asyncio

import pytest

from stratalog.coordinator.model import PartitionState
from stratalog.engine import Assignment
from stratalog.engine.errors import PartitionOffline, RepairRefused
from stratalog.gateway.cluster import decide_partition
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.error_codes import ErrorCode

try:
    from tests.engine_harness import TIMEOUT_S, Backends, batch, committed, read_all, records_of, run
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    from engine_harness import TIMEOUT_S, Backends, batch, committed, read_all, records_of, run  # type: ignore


def flip_range(path, position: int, length: int) -> None:
    """Flip bytes in the middle of one WAL range: its batches' CRCs no longer match."""
    data = bytearray(path.read_bytes())
    for i in range(position + length // 2, position + length // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


# ---- in process: the engine marks, refuses and repairs ------------------------------------

@pytest.mark.unit
def test_damaged_wal_range_takes_only_its_partition_offline(tmp_path):
    async def body(h):
        info = await h.create_topic("t", partitions=2)
        engine = await h.start_engine()
        await h.lead(engine)
        for p in (0, 1):
            for i in range(3):
                await committed(engine.append("t", p, batch(2, ts=1000 + i, tag=f"p{p}b{i}"), now_ms=h.clock.ms))
        await h.stop_engine(engine)
        # Damage the newest range of partition 0 only (its last two records).
        ranges = await h.store.wal_ranges(info.topic_id, 0, 0)
        key, last = ranges[-1]
        flip_range(tmp_path / "objects" / key, last.position, last.length)

        engine = await h.start_engine()
        tasks = engine.take_leadership(await h.assignments(1))
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)  # ends: no endless retry
        assert len(records_of(await read_all(engine, "t", 1))) == 6  # the other partition serves
        with pytest.raises(PartitionOffline, match="corrupt") as refused:
            engine.partition("t", 0)
        assert error_code(refused.value) == ErrorCode.KAFKA_STORAGE_ERROR
        assert "corrupt" in engine.found_offline()[("t", 0)]
        st = (await h.store.partition_states(info.topic_id))[0]
        assert st.offline and st.leader == -1 and st.leader_epoch == 1  # recorded, fenced
        # The controller leaves it alone while it is offline.
        assert decide_partition(info, 0, st, [1, 2], lambda n: frozenset()) == st

        with pytest.raises(RepairRefused, match="still damaged"):
            await engine.repair("t", info.topic_id, 0, truncate=False)
        done = await engine.repair("t", info.topic_id, 0, truncate=True)
        assert (done.high_watermark, done.lost) == (4, 2)
        st = (await h.store.partition_states(info.topic_id))[0]
        assert not st.offline
        await h.move_leadership("t", 0, leader=1)
        await h.lead(engine)
        assert [r[0] for r in records_of(await read_all(engine, "t", 0))] == [0, 1, 2, 3]
        await committed(engine.append("t", 0, batch(1, ts=2000, tag="new"), now_ms=h.clock.ms))
        assert [r[0] for r in records_of(await read_all(engine, "t", 0))] == [0, 1, 2, 3, 4]
        with pytest.raises(RepairRefused, match="not offline"):
            await engine.repair("t", info.topic_id, 0, truncate=False)

    run(Backends("embedded+file", tmp_path), body)


@pytest.mark.unit
def test_outage_is_retried_not_marked_offline(tmp_path):
    """An unreachable store is not damage: recovery keeps retrying and nothing is recorded."""
    from stratalog.tiering.objectstore import ObjectStoreError

    class Down:
        def __init__(self, inner):
            self.inner, self.up = inner, False

        async def get(self, *a, **k):
            if not self.up:
                raise ObjectStoreError("store unreachable")
            return await self.inner.get(*a, **k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    async def body(h):
        info = await h.create_topic("t")
        engine = await h.start_engine()
        await h.lead(engine)
        await committed(engine.append("t", 0, batch(2, ts=1000), now_ms=h.clock.ms))
        await h.stop_engine(engine)
        down = Down(h.objects)
        engine = await h.start_engine(objects=down)
        tasks = engine.take_leadership([Assignment("t", info.topic_id, 0, 0)])
        await asyncio.sleep(0.5)
        assert not all(t.done() for t in tasks) and not engine.found_offline()
        assert not (await h.store.partition_states(info.topic_id))[0].offline
        down.up = True
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)
        assert len(records_of(await read_all(engine, "t", 0))) == 2

    run(Backends("embedded+file", tmp_path), body)


@pytest.mark.unit
def test_offline_state_round_trips_through_the_coordinator(tmp_path):
    async def body(h):
        info = await h.create_topic("t")
        st = PartitionState(-1, 1, (1,), (), "WAL object wal/1/2.wal is missing")
        await h.store.set_partition_state(info.topic_id, 0, st, expect_epoch=0)
        await h.reopen_clients()
        assert (await h.store.partition_states(info.topic_id))[0] == st

    run(Backends("embedded+file", tmp_path), body)
