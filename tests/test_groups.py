"""Classic consumer groups: the membership state machine on a fake clock, committed offsets
in the real embedded coordinator store, and the group/offset handlers driven with encoded
requests at old, middle and flexible versions."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from stratalog.coordinator import open_coordinator
from stratalog.gateway.groups import GroupCoordinator, GroupState, JoinResult, OffsetEntry
from stratalog.gateway.groups.group import parse_subscription
from stratalog.gateway.groups.timers import Timers
from stratalog.gateway.handlers import groups as group_handlers  # noqa: F401  (registers handlers)
from stratalog.gateway.handlers import offsets as offset_handlers  # noqa: F401
from stratalog.gateway.handlers.registry import HANDLERS, RequestContext, supported_versions
from stratalog.gateway.protocol import frames
from stratalog.gateway.protocol.catalog import CONSUMER_PROTOCOL_SUBSCRIPTION
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.gateway.protocol.schema import Message
from stratalog.gateway.protocol.wire import DecodeError

pytestmark = pytest.mark.unit

S = GroupState


# --- harness --------------------------------------------------------------------------

class FakeClock:
    def __init__(self, start: float = 1000.0):
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, ms: float) -> None:
        self.now += ms / 1000.0


@dataclass
class Env:
    groups: GroupCoordinator
    clock: FakeClock
    store: Any

    def advance(self, ms: float) -> int:
        self.clock.advance(ms)
        return self.groups.tick()


WALL = 1_700_000_000.0


def run(tmp_path: Path, body, **settings) -> Any:
    """Run `body(env)` on a fresh coordinator over a real embedded store."""
    settings.setdefault("initial_rebalance_delay_ms", 0)
    settings.setdefault("min_session_timeout_ms", 1000)
    # The state machine on its own: requests here do not wait for the store to keep the
    # group (tests/test_classic_group_state.py covers that).
    settings.setdefault("keep_state", False)

    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        clock = FakeClock()
        ids = itertools.count(1)
        groups = GroupCoordinator(store, clock, wall_clock=lambda: WALL,
                                  new_uuid=lambda: str(next(ids)), **settings)
        try:
            return await body(Env(groups, clock, store))
        finally:
            await groups.stop()
            await store.close()

    return asyncio.run(main())


def sub(*topics: str) -> bytes:
    """A consumer protocol subscription (v0) to the given topics."""
    return b"\x00\x00" + CONSUMER_PROTOCOL_SUBSCRIPTION.to_bytes(
        Message(topics=list(topics), user_data=None), 0)


async def join(g: GroupCoordinator, member_id: str = "", *, group: str = "g",
               instance: str | None = None, client: str = "c", session: int = 10_000,
               rebalance: int = 5_000, ptype: str = "consumer", protocols=None,
               topics: tuple[str, ...] = ("t1",), require_known: bool = False,
               skip: bool = False) -> JoinResult:
    if protocols is None:
        protocols = (("range", sub(*topics)),)
    return await g.join_group(group, member_id, group_instance_id=instance, client_id=client,
                              client_host="/127.0.0.1", session_timeout_ms=session,
                              rebalance_timeout_ms=rebalance, protocol_type=ptype,
                              protocols=protocols, require_known_member_id=require_known,
                              supports_skip_assignment=skip)


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def state(g: GroupCoordinator, group: str = "g") -> GroupState:
    return g.group(group).state


async def two_member_group(env: Env, a_kw=None, b_kw=None) -> tuple[str, str]:
    """A joins alone (generation 1), then B joins and A rejoins: generation 2, Stable,
    A leads, assignments b"A" and b"B". Returns (a_id, b_id)."""
    g = env.groups
    a = await join(g, client="a", **(a_kw or {}))
    assert (a.error, a.generation_id, a.leader_id) == (E.NONE, 1, a.member_id)
    assert (await g.sync_group("g", 1, a.member_id)).error == E.NONE
    tb = asyncio.create_task(join(g, client="b", **(b_kw or {})))
    await settle()
    ra = await join(g, a.member_id, client="a", **(a_kw or {}))
    rb = await tb
    assert ra.generation_id == rb.generation_id == 2
    ts = asyncio.create_task(g.sync_group("g", 2, rb.member_id))
    await settle()
    await g.sync_group("g", 2, ra.member_id, assignments={ra.member_id: b"A", rb.member_id: b"B"})
    assert (await ts).assignment == b"B"
    assert state(g) is S.STABLE
    return ra.member_id, rb.member_id


# --- timers ---------------------------------------------------------------------------

def test_timers_replace_cancel_and_never_spin():
    t = Timers()
    fired = []
    t.schedule("a", 5.0, lambda: fired.append("a"))
    t.schedule("b", 3.0, lambda: fired.append("b"))
    assert t.schedule("a", 1.0, lambda: fired.append("a2")) is True  # replaced, now earliest
    t.schedule("c", 2.0, lambda: fired.append("c"))
    t.cancel("c")
    assert t.next_deadline() == 1.0
    assert t.fire_due(3.0) == 2 and fired == ["a2", "b"]
    assert len(t) == 0 and t.next_deadline() is None

    def rearm():
        fired.append("r")
        t.schedule("r", 0.0, rearm)  # due again at once: must wait for the next call

    t.schedule("r", 0.0, rearm)
    assert t.fire_due(10.0) == 1 and t.fire_due(10.0) == 1
    assert fired[-2:] == ["r", "r"]


# --- JoinGroup / SyncGroup / Heartbeat --------------------------------------------------

def test_member_id_required_then_single_member_leads(tmp_path):
    async def body(env: Env):
        g = env.groups
        first = await join(g, client="cons", require_known=True)
        assert first.error == E.MEMBER_ID_REQUIRED and first.member_id == "cons-1"
        assert first.generation_id == -1
        r = await join(g, "cons-1", client="cons", require_known=True)
        assert (r.error, r.generation_id, r.leader_id, r.protocol_name, r.protocol_type) == \
            (E.NONE, 1, "cons-1", "range", "consumer")
        assert r.members == (("cons-1", None, sub("t1")),)
        assert state(g) is S.COMPLETING_REBALANCE
        assert g.heartbeat("g", 1, "cons-1") == E.NONE  # allowed while completing
        s = await g.sync_group("g", 1, "cons-1", protocol_type="consumer", protocol_name="range",
                               assignments={"cons-1": b"\x01\x02"})
        assert (s.error, s.assignment, s.protocol_name) == (E.NONE, b"\x01\x02", "range")
        assert state(g) is S.STABLE
        d = await g.describe_group("g")
        assert (d.state, d.protocol_type, d.protocol) == ("Stable", "consumer", "range")
        assert [(m.member_id, m.metadata, m.assignment) for m in d.members] == \
            [("cons-1", sub("t1"), b"\x01\x02")]

    run(tmp_path, body)


def test_pending_member_id_expires_after_session_timeout(tmp_path):
    async def body(env: Env):
        g = env.groups
        first = await join(g, require_known=True, session=6000)
        env.advance(5999)
        assert first.member_id in g.group("g").pending_members
        env.advance(1)
        assert g.group("g").pending_members == set()
        late = await join(g, first.member_id, require_known=True)
        assert late.error == E.UNKNOWN_MEMBER_ID

    run(tmp_path, body)


def test_eager_rebalance_with_concurrent_joins(tmp_path):
    async def body(env: Env):
        g = env.groups
        a = await join(g, client="a")
        await g.sync_group("g", 1, a.member_id, assignments={a.member_id: b"all"})
        tb = asyncio.create_task(join(g, client="b"))
        await settle()
        assert not tb.done() and state(g) is S.PREPARING_REBALANCE
        # A learns about the rebalance from its heartbeat, then rejoins concurrently.
        assert g.heartbeat("g", 1, a.member_id) == E.REBALANCE_IN_PROGRESS
        ta = asyncio.create_task(join(g, a.member_id, client="a"))
        await settle()
        ra, rb = ta.result(), tb.result()
        assert ra.generation_id == rb.generation_id == 2
        assert ra.leader_id == rb.leader_id == a.member_id
        assert [m[0] for m in ra.members] == [a.member_id, rb.member_id]
        assert rb.members == ()
        # The follower's SyncGroup waits for the leader's assignments.
        follower = asyncio.create_task(g.sync_group("g", 2, rb.member_id))
        await settle()
        assert not follower.done()
        assert g.heartbeat("g", 2, rb.member_id) == E.NONE
        s = await g.sync_group("g", 2, a.member_id,
                               assignments={a.member_id: b"A", rb.member_id: b"B"})
        assert s.assignment == b"A"
        assert (await follower).assignment == b"B"
        assert state(g) is S.STABLE
        assert g.heartbeat("g", 1, rb.member_id) == E.ILLEGAL_GENERATION
        assert g.heartbeat("g", 2, "nobody") == E.UNKNOWN_MEMBER_ID
        assert (await g.sync_group("g", 1, rb.member_id)).error == E.ILLEGAL_GENERATION
        # A late follower SyncGroup in Stable gets its assignment at once.
        assert (await g.sync_group("g", 2, rb.member_id)).assignment == b"B"

    run(tmp_path, body)


def test_initial_delay_gathers_members_and_extends_while_they_arrive(tmp_path):
    async def body(env: Env):
        g = env.groups
        ta = asyncio.create_task(join(g, client="a", rebalance=60_000))
        await settle()
        env.advance(1000)
        tb = asyncio.create_task(join(g, client="b", rebalance=60_000))
        await settle()
        env.advance(1999)
        await settle()
        assert not ta.done() and not tb.done()
        env.advance(1)  # the first delay ends, but B arrived during it: wait one more delay
        await settle()
        assert not ta.done()
        env.advance(2999)
        await settle()
        assert not ta.done()
        env.advance(1)
        await settle()
        ra, rb = ta.result(), tb.result()
        assert ra.generation_id == rb.generation_id == 1
        assert len(ra.members) == 2 and rb.members == ()

    run(tmp_path, body, initial_rebalance_delay_ms=3000)


def test_rebalance_timeout_removes_members_that_do_not_rejoin(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        tc = asyncio.create_task(join(g, client="c"))
        await settle()
        ta = asyncio.create_task(join(g, a_id, client="a"))
        await settle()
        env.advance(4999)
        assert g.heartbeat("g", 2, b_id) == E.REBALANCE_IN_PROGRESS  # alive, not rejoining
        await settle()
        assert not ta.done()
        env.advance(1)
        await settle()
        ra, rc = ta.result(), tc.result()
        assert ra.generation_id == rc.generation_id == 3
        assert {m[0] for m in ra.members} == {a_id, rc.member_id}
        assert b_id not in g.group("g").members
        assert g.heartbeat("g", 3, b_id) == E.UNKNOWN_MEMBER_ID

    run(tmp_path, body)


def test_session_expiry_removes_member_and_rebalances(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        env.advance(6000)
        assert g.heartbeat("g", 2, a_id) == E.NONE
        env.advance(3999)
        assert state(g) is S.STABLE  # B's 10 s session has not run out yet
        env.advance(1)
        assert b_id not in g.group("g").members
        assert state(g) is S.PREPARING_REBALANCE
        assert g.heartbeat("g", 2, a_id) == E.REBALANCE_IN_PROGRESS
        r = await join(g, a_id, client="a")  # the only member: completes at once
        assert (r.generation_id, r.leader_id, len(r.members)) == (3, a_id, 1)

    run(tmp_path, body)


def test_new_member_that_never_completes_join_is_dropped(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        tc = asyncio.create_task(join(g, client="c", rebalance=600_000))
        await settle()
        # A and B keep heartbeating but never rejoin; the rebalance waits up to C's long
        # rebalance timeout, but C's own join gives up after Kafka's 5-minute new-member limit.
        for _ in range(60):
            env.advance(5_000)
            g.heartbeat("g", 2, a_id)
            g.heartbeat("g", 2, b_id)
        await settle()
        assert tc.done() and tc.result().error == E.UNKNOWN_MEMBER_ID

    run(tmp_path, body)


def test_leader_leaving_hands_leadership_over(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        assert g.leave_group("g", [(a_id, None)]) == (E.NONE, [E.NONE])
        assert state(g) is S.PREPARING_REBALANCE
        r = await join(g, b_id, client="b")
        assert (r.generation_id, r.leader_id) == (3, b_id)
        assert r.members == ((b_id, None, sub("t1")),)

    run(tmp_path, body)


def test_leader_that_does_not_rejoin_is_replaced_by_one_that_did(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        tb = asyncio.create_task(join(g, b_id, client="b", topics=("t1", "t2")))
        await settle()
        assert state(g) is S.PREPARING_REBALANCE
        env.advance(5000)  # A never rejoins
        await settle()
        r = tb.result()
        assert (r.generation_id, r.leader_id, [m[0] for m in r.members]) == (3, b_id, [b_id])

    run(tmp_path, body)


def test_rejoin_during_completing_rebalance(tmp_path):
    async def body(env: Env):
        g = env.groups
        a = await join(g, client="a")
        await g.sync_group("g", 1, a.member_id)
        tb = asyncio.create_task(join(g, client="b"))
        await settle()
        ra = await join(g, a.member_id, client="a")
        rb = await tb
        assert state(g) is S.COMPLETING_REBALANCE
        # Same metadata: the member just gets the current generation again.
        again = await join(g, rb.member_id, client="b")
        assert (again.error, again.generation_id, again.members) == (E.NONE, 2, ())
        lead_again = await join(g, ra.member_id, client="a")
        assert len(lead_again.members) == 2  # the leader gets the member list again
        follower = asyncio.create_task(g.sync_group("g", 2, rb.member_id))
        await settle()
        # New metadata: another rebalance; the waiting SyncGroup is told so.
        t_a = asyncio.create_task(join(g, ra.member_id, client="a", topics=("t2",)))
        await settle()
        assert (await follower).error == E.REBALANCE_IN_PROGRESS
        assert state(g) is S.PREPARING_REBALANCE
        rb3 = await join(g, rb.member_id, client="b")
        await settle()
        assert t_a.result().generation_id == rb3.generation_id == 3

    run(tmp_path, body)


def test_stable_follower_rejoin_with_same_metadata_does_not_rebalance(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        r = await join(g, b_id, client="b")
        assert (r.error, r.generation_id, r.leader_id) == (E.NONE, 2, a_id)
        assert state(g) is S.STABLE
        # The leader rejoining always rebalances (it wants to reassign).
        t = asyncio.create_task(join(g, a_id, client="a"))
        await settle()
        assert state(g) is S.PREPARING_REBALANCE and not t.done()

    run(tmp_path, body)


def test_follower_that_never_syncs_is_removed(tmp_path):
    async def body(env: Env):
        g = env.groups
        a = await join(g, client="a")
        await g.sync_group("g", 1, a.member_id)
        tb = asyncio.create_task(join(g, client="b"))
        await settle()
        await join(g, a.member_id, client="a")
        b_id = (await tb).member_id
        await g.sync_group("g", 2, a.member_id, assignments={a.member_id: b"A", b_id: b"B"})
        assert state(g) is S.STABLE
        env.advance(4999)
        assert b_id in g.group("g").members
        env.advance(1)
        assert b_id not in g.group("g").members
        assert state(g) is S.PREPARING_REBALANCE

    run(tmp_path, body)


def test_static_member_restart_takes_over_without_rebalance(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env, a_kw={"instance": "inst-a"})
        assert a_id.startswith("inst-a-")
        r = await join(g, "", client="a", instance="inst-a")
        new_id = r.member_id
        assert new_id != a_id and r.error == E.NONE and r.generation_id == 2
        # Before v9 the old leader id is returned, so the restarted leader does not assign.
        assert r.leader_id == a_id and r.members == () and not r.skip_assignment
        assert state(g) is S.STABLE and g.group("g").leader_id == new_id
        assert g.heartbeat("g", 2, a_id, "inst-a") == E.FENCED_INSTANCE_ID
        assert g.heartbeat("g", 2, new_id, "inst-a") == E.NONE
        assert g.heartbeat("g", 2, b_id) == E.NONE
        s = await g.sync_group("g", 2, new_id, group_instance_id="inst-a")
        assert s.assignment == b"A"  # the slot's assignment carried over
        # v9+: the restarted leader is told it leads but must skip the assignment.
        r9 = await join(g, "", client="a", instance="inst-a", skip=True)
        assert (r9.leader_id, r9.skip_assignment) == (r9.member_id, True)
        assert {m[0] for m in r9.members} == {r9.member_id, b_id}
        assert state(g) is S.STABLE
        # A restart that subscribes to other topics does rebalance.
        t = asyncio.create_task(join(g, "", client="a", instance="inst-a", topics=("t9",)))
        await settle()
        assert state(g) is S.PREPARING_REBALANCE and not t.done()

    run(tmp_path, body)


def test_static_member_fences_old_instance_waiting_in_join(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env, b_kw={"instance": "inst-b"})
        tc = asyncio.create_task(join(g, client="c"))
        await settle()
        old = asyncio.create_task(join(g, b_id, client="b", instance="inst-b"))
        await settle()
        assert state(g) is S.PREPARING_REBALANCE and not old.done()  # A has not rejoined
        new = asyncio.create_task(join(g, "", client="b", instance="inst-b"))
        await settle()
        assert old.result().error == E.FENCED_INSTANCE_ID
        ra = await join(g, a_id, client="a")
        await settle()
        new_b, c_id = new.result().member_id, tc.result().member_id
        assert ra.generation_id == new.result().generation_id == 3
        assert {m[0] for m in ra.members} == {a_id, new_b, c_id}
        for m in (a_id, new_b, c_id):
            asyncio.create_task(g.sync_group("g", 3, m))
        await settle()
        assert state(g) is S.STABLE
        # A static member that is away does not hold a rebalance past its timeout, and,
        # unlike a dynamic one (C), it is still a member of the next generation.
        ta = asyncio.create_task(join(g, a_id, client="a"))
        await settle()
        env.advance(5000)
        await settle()
        r = ta.result()
        assert r.generation_id == 4 and {m[0] for m in r.members} == {a_id, new_b}

    run(tmp_path, body)


def test_protocol_selection_by_votes_and_inconsistent_protocols(tmp_path):
    async def body(env: Env):
        g = env.groups
        meta = sub("t1")
        ta = asyncio.create_task(join(g, client="a", protocols=(("range", meta), ("rr", meta))))
        tb = asyncio.create_task(join(g, client="b", protocols=(("rr", meta), ("range", meta))))
        await settle()
        env.advance(100)
        await settle()
        env.advance(100)
        await settle()
        assert ta.result().protocol_name == "range"  # 1:1, the leader's preference wins
        b_id = tb.result().member_id
        bad = await join(g, client="d", protocols=(("sticky", meta),))
        assert bad.error == E.INCONSISTENT_GROUP_PROTOCOL
        bad = await join(g, client="d", ptype="connect", protocols=(("rr", meta),))
        assert bad.error == E.INCONSISTENT_GROUP_PROTOCOL
        bad = await join(g, b_id, client="b", protocols=(("sticky", meta),))
        assert bad.error == E.INCONSISTENT_GROUP_PROTOCOL
        tc = asyncio.create_task(join(g, client="c", protocols=(("rr", meta), ("range", meta))))
        await settle()
        a2 = asyncio.create_task(join(g, ta.result().member_id, client="a",
                                      protocols=(("range", meta), ("rr", meta))))
        b2 = asyncio.create_task(join(g, b_id, client="b",
                                      protocols=(("rr", meta), ("range", meta))))
        await settle()
        assert {t.result().protocol_name for t in (a2, b2, tc)} == {"rr"}  # 2 votes to 1

    run(tmp_path, body, initial_rebalance_delay_ms=100)


def test_request_validation_errors(tmp_path):
    async def body(env: Env):
        g = env.groups
        assert (await join(g, group="")).error == E.INVALID_GROUP_ID
        assert (await join(g, session=999)).error == E.INVALID_SESSION_TIMEOUT
        assert (await join(g, session=1_800_001)).error == E.INVALID_SESSION_TIMEOUT
        assert (await join(g, "ghost")).error == E.UNKNOWN_MEMBER_ID
        assert (await join(g, ptype="")).error == E.INCONSISTENT_GROUP_PROTOCOL
        assert (await join(g, protocols=())).error == E.INCONSISTENT_GROUP_PROTOCOL
        assert (await g.sync_group("", 1, "m")).error == E.INVALID_GROUP_ID
        assert (await g.sync_group("nope", 1, "m")).error == E.UNKNOWN_MEMBER_ID
        assert g.heartbeat("", 1, "m") == E.INVALID_GROUP_ID
        assert g.heartbeat("nope", 1, "m") == E.UNKNOWN_MEMBER_ID
        assert g.leave_group("", [("m", None)]) == (E.INVALID_GROUP_ID, [])
        assert g.leave_group("nope", [("m", None)]) == (E.NONE, [E.UNKNOWN_MEMBER_ID])
        a = await join(g)
        assert (await g.sync_group("g", 1, a.member_id, protocol_name="rr")).error == \
            E.INCONSISTENT_GROUP_PROTOCOL
        assert (await g.sync_group("g", 1, a.member_id, protocol_type="connect")).error == \
            E.INCONSISTENT_GROUP_PROTOCOL
        assert (await g.sync_group("g", 1, a.member_id, group_instance_id="x")).error == \
            E.UNKNOWN_MEMBER_ID

    run(tmp_path, body)


def test_leave_group_batch_with_static_members(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env, a_kw={"instance": "s"})
        assert g.leave_group("g", [("wrong", "s")]) == (E.NONE, [E.FENCED_INSTANCE_ID])
        error, errors = g.leave_group("g", [("", "s"), ("nobody", None), ("", "unknown"),
                                            (b_id, None)])
        assert (error, errors) == (E.NONE, [E.NONE, E.UNKNOWN_MEMBER_ID, E.UNKNOWN_MEMBER_ID,
                                            E.NONE])
        assert state(g) is S.EMPTY and g.group("g").generation_id == 3
        assert g.group("g").static_members == {}

    run(tmp_path, body)


def test_empty_group_is_dropped_from_memory_after_retention(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        await g.commit_offsets("g", {("t1", 0): OffsetEntry(1)}, generation_id=2,
                               member_id=a_id)
        g.leave_group("g", [(a_id, None), (b_id, None)])
        assert state(g) is S.EMPTY
        env.advance(599_999)
        assert (await g.describe_group("g")).protocol_type == "consumer"
        env.advance(1)
        assert g.group("g") is None
        # Its offsets remain, so it is still listed and described, as Empty.
        assert (await g.list_groups())[1][0].state == "Empty"
        assert (await g.describe_group("g")).state == "Empty"
        # A MEMBER_ID_REQUIRED round trip that is never finished leaves nothing behind.
        await join(g, group="h", require_known=True, session=6000)
        env.advance(6000)
        env.advance(600_000)
        assert g.group("h") is None
        # A group that gets members again before the retention ends is kept.
        k = await join(g, group="k")
        g.leave_group("k", [(k.member_id, None)])
        env.advance(300_000)
        k = await join(g, group="k")
        await g.sync_group("k", k.generation_id, k.member_id)
        for _ in range(70):
            env.advance(5000)
            assert g.heartbeat("k", k.generation_id, k.member_id) == E.NONE
        assert state(g, "k") is S.STABLE

    run(tmp_path, body)


def test_group_max_size(tmp_path):
    async def body(env: Env):
        g = env.groups
        await join(g, client="a")
        assert (await join(g, client="b")).error == E.GROUP_MAX_SIZE_REACHED

    run(tmp_path, body, max_group_size=1)


def test_stop_answers_waiting_requests(tmp_path):
    async def body(env: Env):
        g = env.groups
        a_id, b_id = await two_member_group(env)
        t = asyncio.create_task(join(g, a_id, client="a"))
        await settle()
        await g.stop()
        assert (await t).error == E.NOT_COORDINATOR
        assert g.group("g") is None

    run(tmp_path, body)


def test_timer_task_expires_sessions_on_the_real_clock(tmp_path):
    async def main():
        store = open_coordinator(None, tmp_path / "c")
        g = GroupCoordinator(store, time.monotonic, initial_rebalance_delay_ms=0,
                             min_session_timeout_ms=10)
        await g.start()
        try:
            r = await join(g, session=50)
            await g.sync_group("g", 1, r.member_id)
            for _ in range(100):
                if r.member_id not in g.group("g").members:
                    break
                await asyncio.sleep(0.01)
            assert r.member_id not in g.group("g").members
            assert g.group("g").state is S.EMPTY
        finally:
            await g.stop()
            await store.close()

    asyncio.run(main())


def test_subscription_parsing_and_bad_metadata():
    assert parse_subscription(sub("a", "b")) == ["a", "b"]
    v3 = b"\x00\x03" + CONSUMER_PROTOCOL_SUBSCRIPTION.to_bytes(
        Message(topics=["x"], user_data=b"u", owned_partitions=[], generation_id=4,
                rack_id="r1"), 3)
    assert parse_subscription(v3) == ["x"]
    assert parse_subscription(b"\x00\x09" + v3[2:] + b"future fields") == ["x"]
    for bad in (b"", b"\x00", b"\xff\xff" + v3[2:], b"\x00\x00\x00\x00\x00\x05ab"):
        with pytest.raises(DecodeError):
            parse_subscription(bad)


# --- offsets ----------------------------------------------------------------------------

def test_offset_commit_generation_rules_and_fetch(tmp_path):
    async def body(env: Env):
        g = env.groups
        tp = ("t1", 0)
        # No members: anonymous commits are fine, anything naming a generation is not.
        assert await g.commit_offsets("g", {tp: OffsetEntry(5, 2, "m")}) == {tp: E.NONE}
        assert await g.commit_offsets("g", {tp: OffsetEntry(6)}, generation_id=3) == \
            {tp: E.ILLEGAL_GENERATION}
        assert await g.commit_offsets("g", {tp: OffsetEntry(6)}, member_id="x") == \
            {tp: E.UNKNOWN_MEMBER_ID}
        err, got = await g.fetch_offsets("g", [tp, ("t1", 1)])
        assert err == E.NONE and list(got) == [tp]
        assert (got[tp].offset, got[tp].leader_epoch, got[tp].metadata,
                got[tp].commit_timestamp) == (5, 2, "m", int(WALL * 1000))

        a_id, b_id = await two_member_group(env)
        assert await g.commit_offsets("g", {tp: OffsetEntry(7)}) == {tp: E.UNKNOWN_MEMBER_ID}
        assert await g.commit_offsets("g", {tp: OffsetEntry(7)}, generation_id=1,
                                      member_id=a_id) == {tp: E.ILLEGAL_GENERATION}
        assert await g.commit_offsets("g", {tp: OffsetEntry(7)}, generation_id=2,
                                      member_id="ghost") == {tp: E.UNKNOWN_MEMBER_ID}
        big = {("t1", 1): OffsetEntry(1, -1, "x" * 4097), tp: OffsetEntry(8, -1, None)}
        assert await g.commit_offsets("g", big, generation_id=2, member_id=a_id) == \
            {("t1", 1): E.OFFSET_METADATA_TOO_LARGE, tp: E.NONE}
        _, got = await g.fetch_offsets("g")
        assert list(got) == [tp] and (got[tp].offset, got[tp].metadata) == (8, "")
        # A commit keeps the member alive like a heartbeat.
        env.advance(9000)
        await g.commit_offsets("g", {tp: OffsetEntry(9)}, generation_id=2, member_id=b_id)
        g.heartbeat("g", 2, a_id)
        env.advance(9000)
        assert b_id in g.group("g").members
        # Rebalancing: commits from the current generation still count...
        tc = asyncio.create_task(join(g, client="c"))
        await settle()
        assert await g.commit_offsets("g", {tp: OffsetEntry(10)}, generation_id=2,
                                      member_id=a_id) == {tp: E.NONE}
        # ...but not between JoinGroup and SyncGroup.
        ta = asyncio.create_task(join(g, a_id, client="a"))
        tb = asyncio.create_task(join(g, b_id, client="b"))
        await settle()
        assert tc.done() and ta.done() and tb.done() and state(g) is S.COMPLETING_REBALANCE
        assert await g.commit_offsets("g", {tp: OffsetEntry(11)}, generation_id=3,
                                      member_id=a_id) == {tp: E.REBALANCE_IN_PROGRESS}
        _, got = await g.fetch_offsets("g", [tp])
        assert got[tp].offset == 10

    run(tmp_path, body)


def test_offset_delete_respects_subscriptions(tmp_path):
    async def body(env: Env):
        g = env.groups
        assert await g.delete_offsets("g", [("t1", 0)]) == (E.GROUP_ID_NOT_FOUND, {})
        assert await g.delete_offsets("", [("t1", 0)]) == (E.INVALID_GROUP_ID, {})
        a_id, _ = await two_member_group(env)
        offsets = {("t1", 0): OffsetEntry(1), ("t2", 0): OffsetEntry(2)}
        await g.commit_offsets("g", offsets, generation_id=2, member_id=a_id)
        err, per = await g.delete_offsets("g", [("t1", 0), ("t2", 0), ("t2", 5)])
        assert err == E.NONE
        assert per == {("t1", 0): E.GROUP_SUBSCRIBED_TO_TOPIC, ("t2", 0): E.NONE,
                       ("t2", 5): E.NONE}
        _, got = await g.fetch_offsets("g")
        assert list(got) == [("t1", 0)]
        # Once empty, anything may be deleted.
        g.leave_group("g", [(m, None) for m in list(g.group("g").members)])
        assert await g.delete_offsets("g", [("t1", 0)]) == (E.NONE, {("t1", 0): E.NONE})
        assert (await g.fetch_offsets("g"))[1] == {}

    run(tmp_path, body)


def test_offset_delete_unparseable_subscription_and_other_protocols(tmp_path):
    async def body(env: Env):
        g = env.groups
        r = await join(g, protocols=(("range", b"\x00\x00garbage"),))
        await g.sync_group("g", 1, r.member_id)
        await g.commit_offsets("g", {("t1", 0): OffsetEntry(1)}, generation_id=1,
                               member_id=r.member_id)
        # The subscription cannot be read, so every topic counts as subscribed.
        assert await g.delete_offsets("g", [("zz", 0)]) == \
            (E.NONE, {("zz", 0): E.GROUP_SUBSCRIBED_TO_TOPIC})
        c = await join(g, group="conn", ptype="connect", protocols=(("v1", b"x"),))
        assert c.error == E.NONE
        await g.commit_offsets("conn", {("t1", 0): OffsetEntry(1)}, generation_id=1,
                               member_id=c.member_id)
        assert await g.delete_offsets("conn", [("t1", 0)]) == (E.NON_EMPTY_GROUP, {})

    run(tmp_path, body)


def test_list_describe_delete_groups(tmp_path):
    async def body(env: Env):
        g = env.groups
        await g.commit_offsets("offsets-only", {("t1", 0): OffsetEntry(3)})
        a_id, b_id = await two_member_group(env)
        err, listed = await g.list_groups()
        assert err == E.NONE
        assert {(x.group_id, x.state, x.protocol_type, x.group_type) for x in listed} == \
            {("g", "Stable", "consumer", "classic"), ("offsets-only", "Empty", "", "classic")}
        _, listed = await g.list_groups(states=["empty"])
        assert [x.group_id for x in listed] == ["offsets-only"]
        _, listed = await g.list_groups(types=["consumer"])
        assert listed == []
        _, listed = await g.list_groups(types=["Classic"], states=["Stable", "Empty"])
        assert len(listed) == 2
        _, listed = await g.list_groups(owned=lambda gid: gid != "offsets-only")
        assert [x.group_id for x in listed] == ["g"]

        d = await g.describe_group("offsets-only")
        assert (d.error, d.state, d.members) == (E.NONE, "Empty", ())
        assert (await g.describe_group("never")).state == "Dead"
        # During a rebalance members are listed without metadata or protocol.
        t = asyncio.create_task(join(g, a_id, client="a"))
        await settle()
        d = await g.describe_group("g")
        assert (d.state, d.protocol) == ("PreparingRebalance", "")
        assert {(m.member_id, m.metadata, m.assignment) for m in d.members} == \
            {(a_id, b"", b""), (b_id, b"", b"")}

        assert await g.delete_group("g") == E.NON_EMPTY_GROUP
        assert await g.delete_group("offsets-only") == E.NONE
        assert await g.delete_group("offsets-only") == E.GROUP_ID_NOT_FOUND
        assert await g.delete_group("never") == E.GROUP_ID_NOT_FOUND
        assert "offsets-only" not in await env.store.groups_with_offsets()
        # An in-memory Empty group with offsets: both go.
        await g.commit_offsets("g", {("t1", 0): OffsetEntry(1)}, generation_id=2,
                               member_id=a_id)
        g.leave_group("g", [(a_id, None), (b_id, None)])
        assert (await t).error == E.UNKNOWN_MEMBER_ID
        assert state(g) is S.EMPTY
        assert await g.delete_group("g") == E.NONE
        assert g.group("g") is None and await env.store.groups_with_offsets() == []

    run(tmp_path, body)


def test_store_failure_is_coordinator_not_available(tmp_path):
    async def body(env: Env):
        g = env.groups
        await env.store.close()  # a real store that now refuses every call
        tp = ("t1", 0)
        assert await g.commit_offsets("g", {tp: OffsetEntry(1)}) == \
            {tp: E.COORDINATOR_NOT_AVAILABLE}
        assert await g.fetch_offsets("g") == (E.COORDINATOR_NOT_AVAILABLE, {})
        assert await g.list_groups() == (E.COORDINATOR_NOT_AVAILABLE, [])
        assert await g.delete_group("g") == E.COORDINATOR_NOT_AVAILABLE
        assert (await g.describe_group("g")).error == E.COORDINATOR_NOT_AVAILABLE

    run(tmp_path, body)


# --- handlers -----------------------------------------------------------------------------

class Gateway:
    """The broker surface the group and offset handlers use, around a real coordinator."""

    def __init__(self, groups: GroupCoordinator, store: Any, topics: dict[str, int],
                 owns: bool = True):
        self.groups = groups
        self.store = store
        self.node_id = 7
        self.topics = topics
        self.owns = owns

    def coordinator_for(self, key: str, listener: str | None = None) -> tuple[int, str, int]:
        return self.node_id, "127.0.0.1", 19092

    def is_coordinator_for(self, key: str) -> bool:
        return self.owns

    def partition_count(self, topic: str) -> int | None:
        return self.topics.get(topic)

    def high_watermark(self, topic: str, partition: int) -> int | None:
        return 0 if topic in self.topics else None


async def call(gw: Gateway, api_key: int, version: int, body: dict) -> Message:
    """Encode a request, decode it as the server does, run the handler, and round-trip the
    response through the codec at the same version."""
    frame = frames.encode_request(api_key, version, 41, body, client_id="cli")
    req = frames.decode_request(frame[4:], supported_versions())
    assert (req.api_key, req.api_version) == (api_key, version)
    ctx = RequestContext(gw, api_key, version, req.client_id, "127.0.0.1:50123")
    resp = await HANDLERS[api_key].fn(ctx, req.body)
    out = frames.encode_response(api_key, version, 41, resp)
    correlation_id, decoded = frames.decode_response(api_key, version, out[4:])
    assert correlation_id == 41
    return decoded


def run_gw(tmp_path: Path, body, topics=None, owns=True, **settings):
    async def wrapped(env: Env):
        return await body(Gateway(env.groups, env.store, topics or {"t1": 2, "t2": 1}, owns))
    return run(tmp_path, wrapped, **settings)


FIND, JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST, DELETE = 10, 11, 12, 13, 14, 15, 16, 42
COMMIT, FETCH, OFFSET_DELETE = 8, 9, 47


def test_find_coordinator_versions(tmp_path):
    async def body(gw: Gateway):
        for v in (0, 1, 3):
            r = await call(gw, FIND, v, {"key": "g", "key_type": 0})
            assert (r.error_code, r.node_id, r.host, r.port) == (0, 7, "127.0.0.1", 19092)
        r = await call(gw, FIND, 3, {"key": "txn", "key_type": 1})
        assert (r.error_code, r.node_id) == (0, 7)
        r = await call(gw, FIND, 2, {"key": "g", "key_type": 5})
        assert (r.error_code, r.node_id, r.port) == (E.INVALID_REQUEST, -1, -1)
        assert r.error_message
        for v in (4, 6):
            r = await call(gw, FIND, v, {"key_type": 0, "coordinator_keys": ["a", "b"]})
            assert [(c.key, c.node_id, c.host, c.port, c.error_code, c.error_message)
                    for c in r.coordinators] == \
                [("a", 7, "127.0.0.1", 19092, 0, None), ("b", 7, "127.0.0.1", 19092, 0, None)]

    run_gw(tmp_path, body)


PROFILES = {
    # api: version, for an old client, a middle one and a current (flexible) one
    "old": dict(join=0, sync=0, hb=0, leave=0, commit=2, fetch=1, describe=0, list=0),
    "mid": dict(join=5, sync=3, hb=3, leave=3, commit=6, fetch=5, describe=3, list=2),
    "flex": dict(join=9, sync=5, hb=4, leave=5, commit=9, fetch=9, describe=5, list=5),
}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_consumer_lifecycle_through_handlers(tmp_path, profile):
    v = PROFILES[profile]

    async def body(gw: Gateway):
        meta = sub("t1")
        join_req = {"group_id": "g", "session_timeout_ms": 10_000,
                    "rebalance_timeout_ms": 5_000, "member_id": "",
                    "protocol_type": "consumer",
                    "protocols": [{"name": "range", "metadata": meta}]}
        r = await call(gw, JOIN, v["join"], join_req)
        if v["join"] >= 4:
            assert r.error_code == E.MEMBER_ID_REQUIRED and r.member_id == "cli-1"
            r = await call(gw, JOIN, v["join"], {**join_req, "member_id": r.member_id})
        member = r.member_id
        assert (r.error_code, r.generation_id, r.leader, r.protocol_name) == \
            (0, 1, member, "range")
        assert [(m.member_id, m.metadata) for m in r.members] == [(member, meta)]
        if v["join"] >= 7:
            assert r.protocol_type == "consumer"
        assert gw.groups.group("g").members[member].client_host == "/127.0.0.1"

        sync_req = {"group_id": "g", "generation_id": 1, "member_id": member,
                    "protocol_type": "consumer", "protocol_name": "range",
                    "assignments": [{"member_id": member, "assignment": b"\x00\x01assign"}]}
        s = await call(gw, SYNC, v["sync"], sync_req)
        assert (s.error_code, s.assignment) == (0, b"\x00\x01assign")
        if v["sync"] >= 5:
            assert (s.protocol_type, s.protocol_name) == ("consumer", "range")
        h = await call(gw, HEARTBEAT, v["hb"], {"group_id": "g", "generation_id": 1,
                                                "member_id": member})
        assert h.error_code == 0
        h = await call(gw, HEARTBEAT, v["hb"], {"group_id": "g", "generation_id": 0,
                                                "member_id": member})
        assert h.error_code == E.ILLEGAL_GENERATION

        commit = {"group_id": "g", "generation_id_or_member_epoch": 1, "member_id": member,
                  "topics": [{"name": "t1", "partitions": [
                      {"partition_index": 0, "committed_offset": 42,
                       "committed_leader_epoch": 3, "committed_metadata": "meta"},
                      {"partition_index": 9, "committed_offset": 1}]},
                      {"name": "nope", "partitions": [{"partition_index": 0}]}]}
        c = await call(gw, COMMIT, v["commit"], commit)
        assert [[(p.partition_index, p.error_code) for p in t.partitions] for t in c.topics] == \
            [[(0, 0), (9, E.UNKNOWN_TOPIC_OR_PARTITION)], [(0, E.UNKNOWN_TOPIC_OR_PARTITION)]]

        wanted = [{"name": "t1", "partition_indexes": [0, 1]}]
        epoch = 3 if v["fetch"] >= 5 else -1
        if v["fetch"] >= 8:
            f = await call(gw, FETCH, v["fetch"], {"groups": [
                {"group_id": "g", "topics": wanted}, {"group_id": "other", "topics": None}]})
            first, other = f.groups
            assert (first.group_id, first.error_code, other.error_code) == ("g", 0, 0)
            topics = first.topics
            assert other.topics == []
        else:
            f = await call(gw, FETCH, v["fetch"], {"group_id": "g", "topics": wanted})
            topics = f.topics
        assert [(t.name, [(p.partition_index, p.committed_offset, p.committed_leader_epoch,
                           p.metadata, p.error_code) for p in t.partitions]) for t in topics] == \
            [("t1", [(0, 42, epoch, "meta", 0), (1, -1, -1, "", 0)])]

        d = await call(gw, DESCRIBE, v["describe"], {"groups": ["g", "absent"],
                                                     "include_authorized_operations": True})
        got, absent = d.groups
        assert (got.error_code, got.group_state, got.protocol_type, got.protocol_data) == \
            (0, "Stable", "consumer", "range")
        assert [(m.member_id, m.client_id, m.client_host, m.member_metadata,
                 m.member_assignment) for m in got.members] == \
            [(member, "cli", "/127.0.0.1", meta, b"\x00\x01assign")]
        assert absent.group_state == "Dead"
        if v["describe"] >= 3:
            assert got.authorized_operations == (1 << 3) | (1 << 6) | (1 << 8)

        ls = await call(gw, LIST, v["list"], {})
        assert [(x.group_id, x.protocol_type) for x in ls.groups] == [("g", "consumer")]
        if v["list"] >= 4:
            assert ls.groups[0].group_state == "Stable"

        if v["leave"] >= 3:
            lv = await call(gw, LEAVE, v["leave"], {"group_id": "g", "members": [
                {"member_id": member, "reason": "bye"}, {"member_id": "ghost"}]})
            assert lv.error_code == 0
            assert [(m.member_id, m.error_code) for m in lv.members] == \
                [(member, 0), ("ghost", E.UNKNOWN_MEMBER_ID)]
        else:
            lv = await call(gw, LEAVE, v["leave"], {"group_id": "g", "member_id": "ghost"})
            assert lv.error_code == E.UNKNOWN_MEMBER_ID
            lv = await call(gw, LEAVE, v["leave"], {"group_id": "g", "member_id": member})
            assert lv.error_code == 0
        assert gw.groups.group("g").state is S.EMPTY

        dg = await call(gw, DELETE, 2 if profile == "flex" else 0, {"groups_names": ["g", "x"]})
        assert [(x.group_id, x.error_code) for x in dg.results] == \
            [("g", 0), ("x", E.GROUP_ID_NOT_FOUND)]

    run_gw(tmp_path, body)


def test_handlers_answer_not_coordinator(tmp_path):
    async def body(gw: Gateway):
        j = await call(gw, JOIN, 6, {"group_id": "g", "session_timeout_ms": 10_000,
                                     "member_id": "", "protocol_type": "consumer",
                                     "protocols": [{"name": "range", "metadata": b""}]})
        assert (j.error_code, j.protocol_name, j.generation_id) == (E.NOT_COORDINATOR, "", -1)
        sync = {"group_id": "g", "member_id": "m", "protocol_type": "consumer", "protocol_name": "r"}
        for api, ver, req in ((SYNC, 5, sync), (HEARTBEAT, 4, {"group_id": "g", "member_id": "m"})):
            r = await call(gw, api, ver, req)
            assert r.error_code == E.NOT_COORDINATOR
        lv = await call(gw, LEAVE, 4, {"group_id": "g", "members": [{"member_id": "m"}]})
        assert (lv.error_code, lv.members) == (E.NOT_COORDINATOR, [])
        c = await call(gw, COMMIT, 8, {"group_id": "g", "topics": [
            {"name": "t1", "partitions": [{"partition_index": 0}]}]})
        assert c.topics[0].partitions[0].error_code == E.NOT_COORDINATOR
        d = await call(gw, DESCRIBE, 5, {"groups": ["g"]})
        assert d.groups[0].error_code == E.NOT_COORDINATOR
        assert d.groups[0].authorized_operations == -(2**31)
        dg = await call(gw, DELETE, 1, {"groups_names": ["g"]})
        assert dg.results[0].error_code == E.NOT_COORDINATOR
        od = await call(gw, OFFSET_DELETE, 0, {"group_id": "g", "topics": []})
        assert od.error_code == E.NOT_COORDINATOR

    run_gw(tmp_path, body, owns=False)


def test_a_gateway_not_coordinating_the_group_answers_offset_fetches_from_the_store(tmp_path):
    # librdkafka does not retry an OffsetFetch refused NOT_COORDINATOR (the partitions it
    # asked for then never start), and a client may ask the old coordinator just after
    # the group moved: every gateway answers fetches from the store they share.
    async def body(gw: Gateway):
        c = await call(gw, COMMIT, 8, {"group_id": "g", "topics": [
            {"name": "t1", "partitions": [{"partition_index": 0, "committed_offset": 42}]}]})
        assert c.topics[0].partitions[0].error_code == 0
        gw.owns = False
        f = await call(gw, FETCH, 1, {"group_id": "g", "topics": [
            {"name": "t1", "partition_indexes": [0, 1]}]})
        assert [(p.error_code, p.committed_offset) for p in f.topics[0].partitions] == \
            [(0, 42), (0, -1)]
        f = await call(gw, FETCH, 7, {"group_id": "g", "topics": None})
        assert (f.error_code, [(t.name, [p.committed_offset for p in t.partitions])
                               for t in f.topics]) == (0, [("t1", [42])])
        f = await call(gw, FETCH, 8, {"groups": [{"group_id": "g", "topics": None}]})
        assert f.groups[0].error_code == 0 and f.groups[0].topics[0].partitions[0].committed_offset == 42

    run_gw(tmp_path, body)


def test_offset_fetch_all_partitions_and_sync_protocol_checks(tmp_path):
    async def body(gw: Gateway):
        await gw.groups.commit_offsets("g", {("t2", 0): OffsetEntry(9), ("t1", 1): OffsetEntry(4),
                                             ("t1", 0): OffsetEntry(3, 1, "x")})
        f = await call(gw, FETCH, 6, {"group_id": "g", "topics": None, "require_stable": True})
        assert [(t.name, [(p.partition_index, p.committed_offset) for p in t.partitions])
                for t in f.topics] == [("t1", [(0, 3), (1, 4)]), ("t2", [(0, 9)])]
        f = await call(gw, FETCH, 9, {"groups": [{"group_id": "g", "member_id": None,
                                                  "topics": None}], "require_stable": True})
        assert sum(len(t.partitions) for t in f.groups[0].topics) == 3

        join_req = {"group_id": "g", "session_timeout_ms": 10_000,
                    "rebalance_timeout_ms": 5000, "member_id": "", "protocol_type": "consumer",
                    "protocols": [{"name": "range", "metadata": sub("t1")}]}
        r = await call(gw, JOIN, 5, join_req)
        r = await call(gw, JOIN, 5, {**join_req, "member_id": r.member_id})
        assert r.error_code == 0
        base = {"group_id": "g", "generation_id": 1, "member_id": r.member_id}
        s = await call(gw, SYNC, 5, {**base, "protocol_type": "consumer"})
        assert (s.error_code, s.protocol_name) == (E.INCONSISTENT_GROUP_PROTOCOL, None)
        s = await call(gw, SYNC, 5, {**base, "protocol_type": "consumer", "protocol_name": "rr"})
        assert s.error_code == E.INCONSISTENT_GROUP_PROTOCOL
        s = await call(gw, SYNC, 4, base)  # before v5 the names are optional
        assert s.error_code == 0

        od = await call(gw, OFFSET_DELETE, 0, {"group_id": "g", "topics": [
            {"name": "t1", "partitions": [{"partition_index": 0}]},
            {"name": "t2", "partitions": [{"partition_index": 0}, {"partition_index": 3}]}]})
        assert od.error_code == 0
        assert [[(p.partition_index, p.error_code) for p in t.partitions] for t in od.topics] == \
            [[(0, E.GROUP_SUBSCRIBED_TO_TOPIC)], [(0, 0), (3, E.UNKNOWN_TOPIC_OR_PARTITION)]]
        od = await call(gw, OFFSET_DELETE, 0, {"group_id": "", "topics": []})
        assert od.error_code == E.INVALID_GROUP_ID
        ls = await call(gw, LIST, 4, {"states_filter": ["Dead"]})
        assert ls.groups == []
        ls = await call(gw, LIST, 5, {"types_filter": ["classic"], "states_filter": ["stable"]})
        assert [(x.group_id, x.group_state, x.group_type) for x in ls.groups] == \
            [("g", "Stable", "classic")]

    run_gw(tmp_path, body)


def test_truncated_group_requests_are_rejected_by_the_codec():
    frame = frames.encode_request(JOIN, 9, 1, {"group_id": "g", "protocol_type": "consumer",
                                              "protocols": [{"name": "r", "metadata": b"xy"}]})
    for cut in (12, len(frame) - 3):
        with pytest.raises(DecodeError):
            frames.decode_request(frame[4:cut], supported_versions())
