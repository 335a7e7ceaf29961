"""Classic groups kept in the coordinator: two gateways' group coordinators over one real
embedded store, on fake clocks. A Stable group continues on the next coordinator at its
generation, a group caught mid-rebalance redoes it, heartbeats write nothing, and a
coordinator whose copy is out of date gives the group up instead of overwriting it."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from stratalog.coordinator import open_coordinator
from stratalog.gateway.groups import GroupCoordinator, GroupState, OffsetEntry
from stratalog.gateway.groups import classic_state
from stratalog.gateway.groups.consumer_group import UnreadableGroupState
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from tests.test_groups import FakeClock, join, settle

pytestmark = pytest.mark.unit

S = GroupState


class Gateway:
    """One gateway's classic group coordinator, with its own clock and a switch for
    whether it coordinates the group."""

    def __init__(self, store, name: str) -> None:
        self.clock = FakeClock()
        self.owns = True
        ids = itertools.count(1)
        self.groups = GroupCoordinator(store, self.clock, wall_clock=lambda: 1_700_000_000.0,
                                       new_uuid=lambda: f"{name}{next(ids)}",
                                       owned=lambda group_id: self.owns,
                                       initial_rebalance_delay_ms=0, min_session_timeout_ms=1000)

    def advance(self, ms: float) -> int:
        self.clock.advance(ms)
        fired = self.groups.tick()
        self.groups._after_tick()  # what the timer task runs after firing timers
        return fired


def run(tmp_path, body):
    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        first, second = Gateway(store, "x"), Gateway(store, "y")
        try:
            return await body(store, first, second)
        finally:
            for gw in (first, second):
                await gw.groups.stop()
            await store.close()

    return asyncio.run(main())


async def stable_pair(g: GroupCoordinator) -> tuple[str, str]:
    """A and B in a Stable group at generation 2, A leading; assignments b"A" and b"B"."""
    a = await join(g, client="a", session=10_000)
    assert (await g.sync_group("g", 1, a.member_id, assignments={a.member_id: b"A1"})).error == E.NONE
    tb = asyncio.create_task(join(g, client="b", session=10_000))
    await settle()
    ra = await join(g, a.member_id, client="a", session=10_000)
    rb = await tb
    assert ra.generation_id == rb.generation_id == 2
    ts = asyncio.create_task(g.sync_group("g", 2, rb.member_id))
    await settle()
    done = await g.sync_group("g", 2, ra.member_id,
                              assignments={ra.member_id: b"A", rb.member_id: b"B"})
    assert done.error == E.NONE and (await ts).assignment == b"B"
    return ra.member_id, rb.member_id


def test_a_stable_group_continues_on_the_next_coordinator(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        stored = json.loads(await store.classic_group("g"))
        assert (stored["state"], stored["generation"], stored["leader"]) == ("Stable", 2, a)
        # The coordinator moves: the next gateway answers the members at their generation.
        x.owns = False
        x.advance(1)
        assert x.groups.group("g") is None  # dropped from memory, left in the store
        assert await y.groups.heartbeat_any("g", 2, b) == E.NONE
        group = y.groups.group("g")
        assert (group.state, group.generation_id, group.leader_id) == (S.STABLE, 2, a)
        assert [m.assignment for m in group.members.values()] == [b"A", b"B"]
        assert await y.groups.heartbeat_any("g", 2, a) == E.NONE
        ok = await y.groups.commit_offsets("g", {("t1", 0): OffsetEntry(7)},
                                           generation_id=2, member_id=a)
        assert ok == {("t1", 0): E.NONE}
        # A non-leader rejoining with the same subscription keeps the generation.
        again = await join(y.groups, b, client="b", session=10_000)
        assert (again.error, again.generation_id) == (E.NONE, 2)
        synced = await y.groups.sync_group("g", 2, b)
        assert (synced.error, synced.assignment) == (E.NONE, b"B")
        d = await y.groups.describe_group("g")
        assert (d.state, [(m.member_id, m.client_id, m.assignment) for m in d.members]) == \
            ("Stable", [(a, "a", b"A"), (b, "b", b"B")])
        # Heartbeats wrote nothing: the stored value is the one the first gateway wrote.
        assert json.loads(await store.classic_group("g")) == stored

    run(tmp_path, body)


def test_sessions_start_afresh_at_load_and_a_silent_member_expires(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        x.owns = False
        x.advance(1)
        assert await y.groups.heartbeat_any("g", 2, a) == E.NONE  # loads it
        y.advance(6_000)
        assert await y.groups.heartbeat_any("g", 2, a) == E.NONE
        y.advance(6_000)  # b's session (10 s since the load) is over; a heartbeated
        group = y.groups.group("g")
        assert list(group.members) == [a] and group.is_(S.PREPARING_REBALANCE)
        await y.groups.classic.written()
        stored = json.loads(await store.classic_group("g"))
        assert [m["id"] for m in stored["members"]] == [a]
        assert await y.groups.heartbeat_any("g", 2, a) == E.REBALANCE_IN_PROGRESS
        r = await join(y.groups, a, client="a", session=10_000)
        assert (r.error, r.generation_id, r.leader_id) == (E.NONE, 3, a)

    run(tmp_path, body)


def test_a_group_caught_mid_rebalance_redoes_it_with_its_member_ids(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        # b leaves: the first gateway stores a rebalance under way, then stops.
        error, errors = await x.groups.leave_any("g", [(b, None)])
        assert (error, errors) == (E.NONE, [E.NONE])
        assert json.loads(await store.classic_group("g"))["state"] == "PreparingRebalance"
        await x.groups.stop()
        assert await y.groups.heartbeat_any("g", 2, a) == E.REBALANCE_IN_PROGRESS
        group = y.groups.group("g")
        assert group.is_(S.PREPARING_REBALANCE) and list(group.members) == [a]
        assert group.members[a].assignment == b""
        r = await join(y.groups, a, client="a", session=10_000)
        assert (r.error, r.member_id, r.generation_id) == (E.NONE, a, 3)
        s = await y.groups.sync_group("g", 3, a, assignments={a: b"all"})
        assert (s.error, s.assignment) == (E.NONE, b"all")
        stored = json.loads(await store.classic_group("g"))
        assert (stored["state"], stored["generation"]) == ("Stable", 3)

    run(tmp_path, body)


def test_a_completed_join_without_assignments_is_redone(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a = await join(x.groups, client="a", session=10_000)
        assert a.generation_id == 1  # CompletingRebalance: the leader never synced
        assert json.loads(await store.classic_group("g"))["state"] == "CompletingRebalance"
        await x.groups.stop()
        sync = await y.groups.sync_group("g", 1, a.member_id, assignments={a.member_id: b"x"})
        assert sync.error == E.REBALANCE_IN_PROGRESS
        r = await join(y.groups, a.member_id, client="a", session=10_000)
        assert (r.error, r.generation_id) == (E.NONE, 2)

    run(tmp_path, body)


def test_the_last_member_leaving_removes_the_stored_state(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        error, _ = await x.groups.leave_any("g", [(a, None), (b, None)])
        assert error == E.NONE and x.groups.group("g").is_(S.EMPTY)
        assert await store.classic_group("g") is None
        assert "g" not in await store.classic_group_ids()

    run(tmp_path, body)


def test_a_coordinator_with_an_outdated_copy_gives_the_group_up(tmp_path):
    # Two gateways can both serve a group for a moment while coordination moves.
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        assert await y.groups.heartbeat_any("g", 2, b) == E.NONE  # y loaded it
        error, _ = await y.groups.leave_any("g", [(b, None)])  # ... and changed it
        assert error == E.NONE
        # x, still holding generation 2 with b, cannot overwrite that: it drops its copy.
        left = await x.groups.leave_any("g", [(a, None)])
        assert left == (E.NOT_COORDINATOR, [])
        assert x.groups.group("g") is None
        stored = json.loads(await store.classic_group("g"))
        assert [m["id"] for m in stored["members"]] == [a]

    run(tmp_path, body)


def test_a_member_ahead_of_an_outdated_copy_is_answered_from_the_store(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        assert await y.groups.heartbeat_any("g", 2, a) == E.NONE  # y has its copy
        # Meanwhile x, still serving, moves the group to generation 3 and stores it.
        ta = asyncio.create_task(join(x.groups, a, client="a", session=10_000))
        tb = asyncio.create_task(join(x.groups, b, client="b", session=10_000))
        ra, rb = await ta, await tb
        assert ra.generation_id == rb.generation_id == 3
        ts = asyncio.create_task(x.groups.sync_group("g", 3, b))
        await settle()
        assert (await x.groups.sync_group("g", 3, a, assignments={a: b"A3", b: b"B3"})).error == E.NONE
        await ts
        # On y, generation 3 is not in its copy: y reads the store rather than refusing it.
        assert await y.groups.heartbeat_any("g", 3, b) == E.NONE
        assert y.groups.group("g").generation_id == 3
        assert await y.groups.heartbeat_any("g", 2, b) == E.ILLEGAL_GENERATION

    run(tmp_path, body)


def test_stored_state_round_trips_and_a_newer_version_is_refused(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a, b = await stable_pair(x.groups)
        value = await store.classic_group("g")
        copy = classic_state.from_json("g", value)
        assert classic_state.to_json(copy) == value
        newer = json.dumps({**json.loads(value), "version": classic_state.STATE_VERSION + 1}).encode()
        with pytest.raises(UnreadableGroupState, match="upgrade the gateway"):
            classic_state.from_json("g", newer)
        with pytest.raises(UnreadableGroupState, match="corrupt"):
            classic_state.from_json("g", b"{not json")
        assert await store.put_classic_group("g", newer, value)
        await x.groups.stop()
        assert await y.groups.heartbeat_any("g", 2, a) == E.COORDINATOR_NOT_AVAILABLE

    run(tmp_path, body)


def test_memory_only_when_asked(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        g = GroupCoordinator(store, x.clock, keep_state=False, initial_rebalance_delay_ms=0,
                             min_session_timeout_ms=1000)
        try:
            r = await join(g, group="m", client="a", session=10_000)
            assert (await g.sync_group("m", 1, r.member_id)).error == E.NONE
            assert await store.classic_group("m") is None
        finally:
            await g.stop()

    run(tmp_path, body)


def test_a_static_member_keeps_its_slot_across_a_move(tmp_path):
    async def body(store, x: Gateway, y: Gateway):
        a = await join(x.groups, client="a", instance="ia", session=10_000)
        assert (await x.groups.sync_group("g", 1, a.member_id, group_instance_id="ia",
                                          assignments={a.member_id: b"all"})).error == E.NONE
        await x.groups.stop()
        # On the next coordinator its heartbeat is known by instance and member id...
        assert await y.groups.heartbeat_any("g", 1, a.member_id, "ia") == E.NONE
        assert await y.groups.heartbeat_any("g", 1, "someone-else", "ia") == E.FENCED_INSTANCE_ID
        # ... and a restart with the same instance id takes its slot with no rebalance.
        again = await join(y.groups, client="a", instance="ia", session=10_000)
        assert (again.error, again.generation_id) == (E.NONE, 1) and again.member_id != a.member_id
        synced = await y.groups.sync_group("g", 1, again.member_id, group_instance_id="ia")
        assert (synced.error, synced.assignment) == (E.NONE, b"all")
        stored = json.loads(await store.classic_group("g"))
        assert [(m["id"], m["instance"]) for m in stored["members"]] == [(again.member_id, "ia")]

    run(tmp_path, body)


def test_a_group_looked_up_just_before_it_was_stored_elsewhere_is_read_again(tmp_path):
    # Seen in a 2-gateway run: the next coordinator had looked the group up a moment
    # before the previous one created it, and answered its members UNKNOWN_MEMBER_ID from
    # its "no such group" cache, so they lost their partitions and rejoined.
    async def body(store, x: Gateway, y: Gateway):
        assert (await y.groups.describe_group("g")).state == "Dead"  # y: no such group
        a, b = await stable_pair(x.groups)
        await x.groups.stop()
        assert await y.groups.heartbeat_any("g", 2, b) == E.NONE
        ok = await y.groups.commit_offsets("g", {("t1", 0): OffsetEntry(3)}, generation_id=2, member_id=a)
        assert ok == {("t1", 0): E.NONE}

    run(tmp_path, body)
