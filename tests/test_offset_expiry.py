"""offsets.retention.minutes: a group coordinator over a real embedded store, on a wall
clock of the test's. A group without members for the retention, with no commit in that
time, goes with its offsets; members, a recent commit, an open transaction's offsets or
another gateway's coordination keep it; its clock survives in the store."""

from __future__ import annotations

import asyncio

import pytest

from stratalog.coordinator import open_coordinator
from stratalog.coordinator.model import CommittedOffset
from stratalog.gateway.groups import GroupCoordinator, OffsetEntry
from stratalog.gateway.groups.consumer_membership import Subscription
from stratalog.gateway.groups.expiry import OffsetExpiry
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from tests.test_consumer_group_state import Harness
from tests.test_groups import join

pytestmark = pytest.mark.unit

RETENTION_MS = 60_000
T0 = 1_700_000_000.0


class World:
    def __init__(self, store):
        self.store = store
        self.wall = T0
        self.foreign: set[str] = set()  # groups another gateway coordinates
        self.h = Harness()
        self.groups = GroupCoordinator(store, self.h.clock, consumer=self.h.groups,
                                       wall_clock=lambda: self.wall, initial_rebalance_delay_ms=0,
                                       min_session_timeout_ms=1000)
        self.expiry = OffsetExpiry(store, self.groups, coordinates=lambda g: g not in self.foreign,
                                   now_ms=lambda: int(self.wall * 1000), retention_ms=RETENTION_MS)

    def later(self, ms: int) -> None:
        self.wall += ms / 1000

    async def commit(self, group: str, offset: int = 5, **member) -> None:
        assert await self.groups.commit_offsets(group, {("t1", 0): OffsetEntry(offset)}, **member) == \
            {("t1", 0): E.NONE}

    async def clock_of(self, group: str) -> int | None:
        keys = (await self.store.group_keys()).get(group)
        return None if keys is None else keys.empty_since_ms


def run(tmp_path, body):
    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        world = World(store)
        try:
            await body(world)
        finally:
            await world.groups.stop()
            await store.close()
    asyncio.run(main())


def test_a_classic_group_goes_a_retention_after_its_last_member_left(tmp_path):
    async def body(w: World):
        a = await join(w.groups, client="a", session=10_000)
        assert (await w.groups.sync_group("g", 1, a.member_id, assignments={a.member_id: b"A"})).error == E.NONE
        await w.commit("g", generation_id=1, member_id=a.member_id)
        w.later(2 * RETENTION_MS)
        assert await w.expiry.sweep_once() == []  # members: no clock
        assert await w.clock_of("g") is None
        assert w.groups.leave_group("g", [(a.member_id, None)])[0] == E.NONE
        assert await w.expiry.sweep_once() == []  # the clock starts now
        assert await w.clock_of("g") == int(w.wall * 1000)
        w.later(RETENTION_MS - 1)
        assert await w.expiry.sweep_once() == []
        w.later(1)
        assert await w.expiry.sweep_once() == ["g"]
        assert (await w.groups.fetch_offsets("g"))[1] == {}
        assert "g" not in await w.store.group_keys()
        assert [g.group_id for g in (await w.groups.list_groups())[1]] == []
    run(tmp_path, body)


def test_offsets_committed_without_membership_last_a_retention_after_the_newest(tmp_path):
    async def body(w: World):
        await w.commit("s")
        assert await w.expiry.sweep_once() == []
        w.later(RETENTION_MS // 2)
        await w.commit("s", offset=9)  # still in use
        w.later(RETENTION_MS // 2 + 1)
        assert await w.expiry.sweep_once() == []
        assert (await w.groups.fetch_offsets("s"))[1][("t1", 0)].offset == 9
        w.later(RETENTION_MS // 2)
        assert await w.expiry.sweep_once() == ["s"]
    run(tmp_path, body)


def test_members_stop_the_clock_and_leaving_starts_it_afresh(tmp_path):
    async def body(w: World):
        await w.commit("g")
        await w.expiry.sweep_once()
        assert await w.clock_of("g") is not None
        w.later(2 * RETENTION_MS)
        a = await join(w.groups, client="a", session=10_000)
        assert await w.expiry.sweep_once() == []
        assert await w.clock_of("g") is None
        w.groups.leave_group("g", [(a.member_id, None)])
        assert await w.expiry.sweep_once() == []
        assert await w.clock_of("g") == int(w.wall * 1000)
    run(tmp_path, body)


def test_a_consumer_protocol_group_goes_once_empty_with_its_state(tmp_path):
    async def body(w: World):
        r = w.h.join()
        await w.commit("g", generation_id=r.member_epoch, member_id=r.member_id)
        assert await w.expiry.sweep_once() == [] and await w.clock_of("g") is None
        w.h.groups.heartbeat("g", r.member_id, -1, Subscription())  # leaves
        await w.expiry.sweep_once()
        w.later(RETENTION_MS)
        assert await w.expiry.sweep_once() == ["g"]
        assert w.h.groups.group("g") is None and "g" not in await w.store.group_keys()
    run(tmp_path, body)


def test_an_open_transactions_offsets_and_another_coordinator_keep_a_group(tmp_path):
    async def body(w: World):
        await w.commit("txn")
        await w.store.put_pending_offsets("txn", 42, {("t1", 0): CommittedOffset(7, -1, "", 0)})
        await w.commit("elsewhere")
        w.foreign.add("elsewhere")
        await w.expiry.sweep_once()
        w.later(2 * RETENTION_MS)
        assert await w.expiry.sweep_once() == []
        assert await w.clock_of("elsewhere") is None
        await w.store.end_pending_offsets("txn", 42, commit=True)  # committed long ago
        assert await w.expiry.sweep_once() == ["txn"]
    run(tmp_path, body)
