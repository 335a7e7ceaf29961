"""Consumer-protocol groups (KIP-848) in process on a fake clock: epochs, the uniform and
range assignors, revoke-before-assign, fencing, session and revocation timeouts, static
members, regex subscriptions and the offset checks."""

from __future__ import annotations

import uuid

import pytest

from stratalog.gateway.groups.assignors import MemberSpec, assignor_names, range_assign, uniform_assign
from stratalog.gateway.groups.consumer_coordinator import ConsumerGroups
from stratalog.gateway.groups.consumer_membership import (ConsumerGroupConfig, HeartbeatResult,
                                                          Subscription)
from stratalog.gateway.groups.consumer_group import ConsumerGroupState
from stratalog.gateway.protocol.error_codes import ErrorCode as E

pytestmark = pytest.mark.unit

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Harness:
    def __init__(self, **config) -> None:
        self.clock = FakeClock()
        self.topics: dict[str, tuple[uuid.UUID, int]] = {"t1": (T1, 6), "t2": (T2, 6)}
        ids = iter(f"m{i}" for i in range(1000))
        self.groups = ConsumerGroups(lambda: self.topics, self.clock,
                                     ConsumerGroupConfig(**{"session_timeout_ms": 10_000,
                                                            "heartbeat_interval_ms": 1000, **config}),
                                     new_id=lambda: next(ids))

    def join(self, topics=("t1",), member_id="", instance_id=None, assignor=None, regex=None
             ) -> HeartbeatResult:
        return self.groups.heartbeat("g", member_id, 0, Subscription(
            rebalance_timeout_ms=5000, topic_names=None if regex else tuple(topics),
            topic_regex=regex, server_assignor=assignor, owned={}, instance_id=instance_id))

    def beat(self, r: HeartbeatResult, owned=None, epoch=None, instance_id=None) -> HeartbeatResult:
        return self.groups.heartbeat("g", r.member_id or "", r.member_epoch if epoch is None else epoch,
                                     Subscription(owned=owned, instance_id=instance_id))

    def advance(self, seconds: float) -> None:
        self.clock.now += seconds
        self.groups.tick()


def parts(result: HeartbeatResult, topic=T1) -> set[int]:
    assert result.assignment is not None, result
    return set(result.assignment.get(topic, ()))


def test_first_member_gets_everything_with_the_group_epoch():
    h = Harness()
    a = h.join()
    assert a.error == E.NONE and a.member_id == "m0"
    assert a.member_epoch == 1 and a.heartbeat_interval_ms == 1000
    assert parts(a) == set(range(6))
    assert h.groups.group("g").state is ConsumerGroupState.STABLE
    again = h.beat(a, owned={T1: frozenset(range(6))})
    assert again.error == E.NONE and again.assignment is None  # nothing changed: nothing sent


def test_partitions_move_only_after_their_owner_revoked_them():
    h = Harness()
    a = h.join()
    owned_a = {T1: frozenset(parts(a))}
    b = h.join()
    # b joins at the new epoch but every partition is still a's: it gets none yet.
    assert b.member_epoch == 2 and parts(b) == set()
    # a is asked to revoke 3 of its 6 and keeps its epoch until it has.
    a2 = h.beat(a, owned=owned_a)
    assert a2.member_epoch == 1 and len(parts(a2)) == 3
    kept = parts(a2)
    assert h.groups.group("g").state is ConsumerGroupState.RECONCILING
    # b asks again: still nothing, a has not confirmed the revocation.
    assert h.beat(b, owned={}).assignment is None
    a3 = h.beat(a2, owned={T1: frozenset(kept)})
    assert a3.member_epoch == 2
    b2 = h.beat(b, owned={})
    assert parts(b2) == set(range(6)) - kept and b2.member_epoch == 2
    h.beat(b2, owned={T1: frozenset(parts(b2))})
    assert h.groups.group("g").state is ConsumerGroupState.STABLE


def test_three_members_uniform_then_one_leaves():
    h = Harness()
    members = [h.join() for _ in range(3)]
    owned = {m.member_id: set() for m in members}
    current = {m.member_id: m for m in members}
    for _ in range(6):  # a few rounds of heartbeats converge
        for mid in list(current):
            r = h.beat(current[mid], owned={T1: frozenset(owned[mid])})
            if r.assignment is not None:
                owned[mid] = parts(r)
            current[mid] = r
    assert sorted(len(p) for p in owned.values()) == [2, 2, 2]
    assert set().union(*owned.values()) == set(range(6))
    gone = members[0].member_id
    left = h.groups.heartbeat("g", gone, -1, Subscription())
    assert left.error == E.NONE and left.member_epoch == -1
    del current[gone], owned[gone]
    for _ in range(3):
        for mid in list(current):
            r = h.beat(current[mid], owned={T1: frozenset(owned[mid])})
            if r.assignment is not None:
                owned[mid] = parts(r)
            current[mid] = r
    assert sorted(len(p) for p in owned.values()) == [3, 3]
    assert set().union(*owned.values()) == set(range(6))


def test_fencing_and_unknown_members():
    h = Harness()
    a = h.join()
    assert h.beat(a, epoch=7).error == E.FENCED_MEMBER_EPOCH
    assert h.groups.heartbeat("g", "nobody", 1, Subscription()).error == E.UNKNOWN_MEMBER_ID
    assert h.groups.heartbeat("other", "nobody", 1, Subscription()).error == E.UNKNOWN_MEMBER_ID
    # A member that lost our answer may come back with the epoch before it.
    b = h.join()
    a2 = h.beat(a, owned={T1: frozenset(range(6))})
    a3 = h.beat(a2, owned={T1: frozenset(parts(a2))})
    assert a3.member_epoch == b.member_epoch
    lost = h.beat(a3, epoch=a2.member_epoch, owned={T1: frozenset(parts(a2))})
    assert lost.error == E.NONE
    assert h.beat(a3, epoch=a2.member_epoch, owned={T1: frozenset(range(6))}).error == \
        E.FENCED_MEMBER_EPOCH


def test_bad_requests_get_their_error_codes():
    h = Harness()
    g = h.groups
    assert g.heartbeat("", "", 0, Subscription(5000, ("t1",), owned={})).error == E.INVALID_REQUEST
    assert g.heartbeat("g", "", 0, Subscription(-1, ("t1",), owned={})).error == E.INVALID_REQUEST
    assert g.heartbeat("g", "", 0, Subscription(5000, None, owned={})).error == E.INVALID_REQUEST
    assert g.heartbeat("g", "", 5, Subscription()).error == E.INVALID_REQUEST
    assert g.heartbeat("g", "x", -3, Subscription()).error == E.INVALID_REQUEST
    assert h.join(assignor="sticky").error == E.UNSUPPORTED_ASSIGNOR
    bad = h.join(regex="(unclosed")
    assert bad.error == E.INVALID_REGULAR_EXPRESSION and "unclosed" in (bad.message or "")
    assert h.join(regex="a" * 2000).error == E.INVALID_REGULAR_EXPRESSION
    assert g.group("g") is None  # nothing was created by refused requests


def test_session_timeout_removes_a_member_and_frees_its_partitions():
    h = Harness()
    a = h.join()
    b = h.join()
    a2 = h.beat(a, owned={T1: frozenset(range(6))})
    h.beat(a2, owned={T1: frozenset(parts(a2))})
    b2 = h.beat(b, owned={})
    assert len(parts(b2)) == 3
    for _ in range(12):  # b keeps beating, a is silent past its session
        h.advance(1)
        b2 = h.beat(b2, owned={T1: frozenset(parts(b2) if b2.assignment else set())}) \
            if b2.assignment is not None else h.beat(b2)
    group = h.groups.group("g")
    assert list(group.members) == [b.member_id]
    assert group.members[b.member_id].assigned == {T1: frozenset(range(6))}


def test_a_member_that_never_revokes_is_removed_after_its_rebalance_timeout():
    h = Harness(session_timeout_ms=60_000)
    a = h.join()
    b = h.join()
    h.beat(a, owned={T1: frozenset(range(6))})  # a is asked to revoke, and never does
    h.advance(6)  # rebalance timeout 5 s
    assert a.member_id not in h.groups.group("g").members
    assert parts(h.beat(b, owned={})) == set(range(6))


def test_range_assignor_co_partitions_topics():
    members = [MemberSpec(f"m{i}", None, frozenset({T1, T2}), {}) for i in range(3)]
    out = range_assign(members, {T1: 6, T2: 6})
    for m in members:
        assert out[m.member_id][T1] == out[m.member_id][T2]
    assert [sorted(out[f"m{i}"][T1]) for i in range(3)] == [[0, 1], [2, 3], [4, 5]]


def test_uniform_assignor_balances_and_sticks():
    members = [MemberSpec(f"m{i}", None, frozenset({T1}), {}) for i in range(2)]
    first = uniform_assign(members, {T1: 6})
    assert sorted(len(first[m.member_id][T1]) for m in members) == [3, 3]
    third = MemberSpec("m2", None, frozenset({T1}), {})
    again = uniform_assign([MemberSpec(m.member_id, None, m.topics, first[m.member_id]) for m in members]
                           + [third], {T1: 6})
    assert sorted(len(v[T1]) for v in again.values()) == [2, 2, 2]
    for m in members:  # each old member only gave partitions up
        assert again[m.member_id][T1] <= first[m.member_id][T1]
    # Different subscriptions: m1 alone reads t2, the rest of t1 is spread.
    mixed = uniform_assign([MemberSpec("a", None, frozenset({T1}), {}),
                            MemberSpec("b", None, frozenset({T1, T2}), {})], {T1: 4, T2: 4})
    assert mixed["b"][T2] == frozenset(range(4)) and mixed["a"][T1] == frozenset(range(4))


def test_assignor_is_chosen_by_the_members():
    h = Harness()
    a = h.join(topics=("t1", "t2"), assignor="range")
    h.join(topics=("t1", "t2"), assignor="range")
    h.beat(a, owned={T1: frozenset(range(6)), T2: frozenset(range(6))})
    assert h.groups.group("g").assignor == "range"
    target = h.groups.group("g").target
    for m in target.values():
        assert m[T1] == m[T2]
    assert assignor_names("org.apache.kafka.coordinator.group.assignor.RangeAssignor,uniform") == \
        ("range", "uniform")
    with pytest.raises(ValueError):
        assignor_names("sticky")


def test_static_member_restart_keeps_its_partitions():
    h = Harness()
    a = h.join(instance_id="i-a")
    b = h.join(instance_id="i-b")
    a2 = h.beat(a, owned={T1: frozenset(range(6))})
    a3 = h.beat(a2, owned={T1: frozenset(parts(a2))})
    b2 = h.beat(b, owned={})
    mine = parts(a2)
    epoch = h.groups.group("g").group_epoch
    # a leaves for a restart (-2): nothing is reassigned.
    bye = h.groups.heartbeat("g", a.member_id or "", -2, Subscription(instance_id="i-a"))
    assert bye.error == E.NONE and bye.member_epoch == -2
    assert h.beat(b2, owned={T1: frozenset(parts(b2))}).assignment is None
    # Another member may not take the instance id while it is held...
    assert h.join(instance_id="i-b").error == E.UNRELEASED_INSTANCE_ID
    # ...but the restarted one gets its place, epoch and partitions back at once.
    back = h.join(instance_id="i-a")
    assert back.error == E.NONE and back.member_id != a.member_id
    assert parts(back) == mine and back.member_epoch == a3.member_epoch
    assert h.groups.group("g").group_epoch == epoch
    # The old member id is fenced for good.
    assert h.beat(a3).error == E.UNKNOWN_MEMBER_ID


def test_static_member_that_does_not_come_back_is_removed_after_the_session():
    h = Harness()
    a = h.join(instance_id="i-a")
    h.groups.heartbeat("g", a.member_id or "", -2, Subscription(instance_id="i-a"))
    h.advance(11)
    assert h.groups.group("g").members == {}
    assert h.groups.group("g").state is ConsumerGroupState.EMPTY


def test_regex_subscription_picks_up_new_topics():
    h = Harness()
    a = h.join(regex="t[0-9]")
    assert set(a.assignment or {}) == {T1, T2}
    t3 = uuid.UUID(int=3)
    h.topics["t3"] = (t3, 2)
    h.topics["other"] = (uuid.UUID(int=4), 2)
    owned = {t: frozenset(ps) for t, ps in (a.assignment or {}).items()}
    h.advance(2)  # past the metadata refresh interval
    r = h.beat(a, owned=owned)
    assert r.assignment is not None and set(r.assignment) == {T1, T2, t3}
    assert r.member_epoch > a.member_epoch


def test_offset_checks_use_member_epochs():
    h = Harness()
    a = h.join()
    g = h.groups
    assert g.check_commit("g", a.member_id or "", a.member_epoch, [("t1", 0)]) is None
    assert g.check_commit("g", a.member_id or "", a.member_epoch + 1, [("t1", 0)]) == E.STALE_MEMBER_EPOCH
    assert g.check_commit("g", "nobody", 1, [("t1", 0)]) == E.UNKNOWN_MEMBER_ID
    assert g.check_commit("g", "", -1, [("t1", 0)]) == E.UNKNOWN_MEMBER_ID  # the group has members
    assert g.check_commit("elsewhere", "", -1, [("t1", 0)]) is None
    assert g.check_fetch("g", a.member_id, a.member_epoch) is None
    assert g.check_fetch("g", a.member_id, 99) == E.STALE_MEMBER_EPOCH
    assert g.check_fetch("g", None, -1) is None
    # After moving on, a commit with the epoch before is fine for partitions still held.
    b = h.join()
    a2 = h.beat(a, owned={T1: frozenset(range(6))})
    a3 = h.beat(a2, owned={T1: frozenset(parts(a2))})
    assert a3.member_epoch == b.member_epoch
    held = min(parts(a2))
    given = min(set(range(6)) - parts(a2))
    assert g.check_commit("g", a.member_id or "", a.member_epoch, [("t1", held)]) is None
    assert g.check_commit("g", a.member_id or "", a.member_epoch, [("t1", given)]) == E.STALE_MEMBER_EPOCH


def test_group_size_is_bounded():
    h = Harness(max_size=2)
    assert h.join().error == E.NONE
    assert h.join().error == E.NONE
    assert h.join().error == E.GROUP_MAX_SIZE_REACHED


# --- beside classic groups: offsets, listing, describing, deleting ------------------------

def run_with_store(tmp_path, body):
    """`body(groups, harness)` on a GroupCoordinator over a real embedded store, its
    consumer-protocol groups those of a Harness."""
    import asyncio

    from stratalog.coordinator import open_coordinator
    from stratalog.gateway.groups import GroupCoordinator

    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        h = Harness()
        groups = GroupCoordinator(store, h.clock, consumer=h.groups, initial_rebalance_delay_ms=0,
                                  min_session_timeout_ms=1000)
        try:
            return await body(groups, h)
        finally:
            await groups.stop()
            await store.close()

    return asyncio.run(main())


def test_offsets_listing_and_deleting_a_consumer_group(tmp_path):
    from stratalog.gateway.groups import OffsetEntry

    async def body(groups, h):
        a = h.join()
        mid = a.member_id or ""
        ok = await groups.commit_offsets("g", {("t1", 0): OffsetEntry(5)}, generation_id=a.member_epoch,
                                         member_id=mid)
        assert ok == {("t1", 0): E.NONE}
        stale = await groups.commit_offsets("g", {("t1", 1): OffsetEntry(5)},
                                            generation_id=a.member_epoch + 3, member_id=mid)
        assert stale == {("t1", 1): E.STALE_MEMBER_EPOCH}
        assert await groups.check_member("g", a.member_epoch, "nobody", None, []) == E.UNKNOWN_MEMBER_ID
        # TxnOffsetCommit has no STALE_MEMBER_EPOCH: a stale epoch is ILLEGAL_GENERATION there
        # (Kafka's Java producer took 113 as fatal; it recovers from ILLEGAL_GENERATION).
        assert await groups.check_member("g", a.member_epoch + 3, mid, None, [("t1", 0)]) == E.ILLEGAL_GENERATION
        assert await groups.check_member("g", a.member_epoch, mid, None, [("t1", 0)]) is None
        error, found = await groups.fetch_offsets("g")
        assert error == E.NONE and found[("t1", 0)].offset == 5
        error, listed = await groups.list_groups(types=["consumer"])
        assert [(g.group_id, g.group_type, g.state, g.protocol_type) for g in listed] == \
            [("g", "consumer", "Stable", "consumer")]
        error, listed = await groups.list_groups(types=["classic"])
        assert listed == []
        # DescribeGroups (up to v5) answers Dead for a group that is not classic, as Kafka.
        described = await groups.describe_group("g")
        assert (described.error, described.state) == (E.NONE, "Dead")
        assert await groups.delete_group("g") == E.NON_EMPTY_GROUP
        error, deleted = await groups.delete_offsets("g", [("t1", 0)])
        assert deleted == {("t1", 0): E.GROUP_SUBSCRIBED_TO_TOPIC}
        # A JoinGroup joins as a classic member while the group has members...
        assert await groups._consumer_group_in_use("g")
        h.groups.heartbeat("g", mid, -1, Subscription())
        # ...and once Empty, DeleteGroups removes it with its offsets.
        assert await groups.delete_group("g") == E.NONE
        assert h.groups.group("g") is None
        assert (await groups.fetch_offsets("g"))[1] == {}

    run_with_store(tmp_path, body)


def classic_sub(*topics: str, owned=()) -> bytes:
    """A consumer protocol subscription (v1: with owned partitions)."""
    from stratalog.gateway.protocol.catalog import CONSUMER_PROTOCOL_SUBSCRIPTION
    from stratalog.gateway.protocol.schema import Message
    return b"\x00\x01" + CONSUMER_PROTOCOL_SUBSCRIPTION.to_bytes(Message(
        topics=list(topics), user_data=None,
        owned_partitions=[Message(topic=t, partitions=list(ps)) for t, ps in owned]), 1)


def classic_assignment(data: bytes) -> set[int]:
    from stratalog.gateway.groups.consumer_classic import parse_classic_assignment
    return {p for _, p in parse_classic_assignment(data)}


async def classic_join(groups, member_id="", owned=()):
    return await groups.join_group(
        "g", member_id, group_instance_id=None, client_id="c", client_host="/127.0.0.1",
        session_timeout_ms=10_000, rebalance_timeout_ms=5000, protocol_type="consumer",
        protocols=[("cooperative-sticky", classic_sub("t1", owned=owned))],
        require_known_member_id=False)


def test_the_consumer_protocol_takes_over_an_empty_classic_group(tmp_path):
    from stratalog.gateway.groups import OffsetEntry

    async def body(groups, h):
        joined = await classic_join(groups)
        synced = await groups.sync_group("g", joined.generation_id, joined.member_id,
                                         assignments={joined.member_id: b""})
        assert synced.error == E.NONE
        await groups.commit_offsets("g", {("t1", 0): OffsetEntry(7)},
                                    generation_id=joined.generation_id, member_id=joined.member_id)
        await groups.leave_any("g", [(joined.member_id, None)])
        assert await groups.make_way_for_consumer_protocol("g") is None  # Empty: forgotten
        assert groups.group("g") is None
        a = h.join()
        assert a.error == E.NONE
        assert (await groups.fetch_offsets("g"))[1][("t1", 0)].offset == 7

    run_with_store(tmp_path, body)


def test_a_classic_group_is_upgraded_online(tmp_path):
    from stratalog.gateway.protocol.catalog import CONSUMER_PROTOCOL_ASSIGNMENT
    from stratalog.gateway.protocol.schema import Message

    async def body(groups, h):
        a = await classic_join(groups)
        everything = b"\x00\x00" + CONSUMER_PROTOCOL_ASSIGNMENT.to_bytes(Message(
            assigned_partitions=[Message(topic="t1", partitions=list(range(6)))], user_data=None), 0)
        # A rebalancing classic group is not upgraded yet: the new member retries.
        refused = await groups.make_way_for_consumer_protocol("g")
        assert refused is not None and refused[0] == E.COORDINATOR_NOT_AVAILABLE
        synced = await groups.sync_group("g", a.generation_id, a.member_id,
                                         assignments={a.member_id: everything})
        assert synced.error == E.NONE
        assert await groups.store.classic_group("g") is not None  # kept for a coordinator move
        # Stable: the first consumer-protocol member upgrades it, keeping A's partitions.
        assert await groups.make_way_for_consumer_protocol("g") is None
        assert groups.group("g") is None
        # Its classic state goes from the store, or the next coordinator would load it.
        assert await groups.store.classic_group("g") is None
        cg = h.groups.group("g")
        assert cg.members[a.member_id].assigned == {T1: frozenset(range(6))}
        assert cg.members[a.member_id].epoch == a.generation_id
        b = h.join()
        assert b.error == E.NONE and parts(b) == set()  # A still owns everything
        error, listed = await groups.list_groups()
        assert [(g.group_id, g.group_type) for g in listed] == [("g", "consumer")]
        # A learns from its heartbeat that it must rejoin; it rejoins still owning all six
        # (cooperative), is told what it keeps, revokes the rest and rejoins again.
        assert await groups.heartbeat_any("g", a.generation_id, a.member_id) == E.REBALANCE_IN_PROGRESS
        a2 = await classic_join(groups, a.member_id, owned=[("t1", range(6))])
        assert a2.error == E.NONE and a2.leader_id == "" and a2.generation_id == a.generation_id
        s2 = await groups.sync_group("g", a2.generation_id, a.member_id, protocol_type="consumer",
                                     protocol_name="cooperative-sticky")
        kept = classic_assignment(s2.assignment)
        assert s2.error == E.NONE and len(kept) == 3
        assert await groups.heartbeat_any("g", a2.generation_id, a.member_id) == E.REBALANCE_IN_PROGRESS
        a3 = await classic_join(groups, a.member_id, owned=[("t1", kept)])
        assert a3.generation_id == b.member_epoch
        assert await groups.heartbeat_any("g", a3.generation_id, a.member_id) == E.NONE
        # Now B gets the three A gave up.
        b2 = h.beat(b, owned={})
        assert parts(b2) == set(range(6)) - kept
        # Commits: A at its generation, B at its epoch.
        from stratalog.gateway.groups import OffsetEntry
        ok = await groups.commit_offsets("g", {("t1", min(kept)): OffsetEntry(1)},
                                         generation_id=a3.generation_id, member_id=a.member_id)
        assert set(ok.values()) == {E.NONE}
        # A restarts with the consumer protocol: it leaves as a classic member...
        error, errors = await groups.leave_any("g", [(a.member_id, None)])
        assert (error, errors) == (E.NONE, [E.NONE])
        b3 = h.beat(b2, owned={T1: frozenset(parts(b2))})
        assert parts(b3) == set(range(6))
        assert all(m.classic is None for m in h.groups.group("g").members.values())

    run_with_store(tmp_path, body)


# --- the stored copy: a coordinator move continues the group ----------------------------

def two_coordinators(store) -> tuple[ConsumerGroups, ConsumerGroups]:
    """Two gateways' consumer groups over one store, seeing the same topics."""
    first, second = Harness(), Harness()
    for h in (first, second):
        h.groups = ConsumerGroups(lambda: first.topics, h.clock, h.groups.config, store=store,
                                  new_id=h.groups._new_id)
    return first.groups, second.groups


def run_with_two_coordinators(tmp_path, body) -> None:
    """`body(g1, g2)`: `two_coordinators` over a real embedded store."""
    import asyncio

    from stratalog.coordinator import open_coordinator

    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        try:
            await body(*two_coordinators(store))
        finally:
            await store.close()

    asyncio.run(main())


def test_a_new_coordinator_continues_the_group_from_the_store(tmp_path):
    async def body(g1, g2):
        sub0 = Subscription(5000, ("t1",), owned={})
        a = await g1.handle_heartbeat("g", "a", 0, sub0)
        b = await g1.handle_heartbeat("g", "b", 0, sub0)
        a = await g1.handle_heartbeat("g", "a", a.member_epoch, Subscription(owned={T1: frozenset(range(6))}))
        kept = frozenset(parts(a))
        a = await g1.handle_heartbeat("g", "a", a.member_epoch, Subscription(owned={T1: kept}))
        b = await g1.handle_heartbeat("g", "b", b.member_epoch, Subscription(owned={}))
        assert (a.member_epoch, b.member_epoch) == (2, 2) and len(parts(b)) == 3
        # The coordinator moves: the second gateway loads the group as it was.
        again = await g2.handle_heartbeat("g", "b", b.member_epoch,
                                          Subscription(owned={T1: frozenset(parts(b))}))
        assert again.error == E.NONE and again.member_epoch == 2
        assert parts(again) == parts(b)  # its whole assignment once, nothing moved
        group = g2.group("g")
        assert group.group_epoch == 2 and group.state is ConsumerGroupState.STABLE
        assert group.members["a"].assigned == {T1: kept}
        # A third member joins through the new coordinator; the old one, still holding
        # its copy, cannot overwrite that: it drops its copy and says so.
        c = await g2.handle_heartbeat("g", "c", 0, sub0)
        assert c.error == E.NONE and c.member_epoch == 3
        stale = await g1.handle_heartbeat("g", "a", 0, Subscription(5000, ("t1", "t2"), owned={}))
        assert stale.error == E.NOT_COORDINATOR
        assert g1.group("g") is None
        # Moving back, it loads the newer state.
        back = await g1.handle_heartbeat("g", "a", 2, Subscription(owned={T1: kept}))
        assert back.error == E.NONE and g1.group("g").group_epoch == 3
        assert set(g1.group("g").members) == {"a", "b", "c"}

    run_with_two_coordinators(tmp_path, body)


def test_a_member_ahead_of_a_new_coordinators_copy_is_not_fenced(tmp_path):
    # Two gateways can both serve a group for a moment while coordination moves: the new one
    # loaded it, then the old one still let a member join and stored that. The member then
    # comes to the new one, which must answer from the stored state, not fence it.
    async def body(g1, g2):
        sub0 = Subscription(5000, ("t1",), owned={})
        a = await g1.handle_heartbeat("g", "a", 0, sub0)
        loaded = await g2.handle_heartbeat("g", "a", a.member_epoch, Subscription(owned={T1: frozenset(parts(a))}))
        assert loaded.error == E.NONE  # the new coordinator has its copy now
        b = await g1.handle_heartbeat("g", "b", 0, sub0)  # the old one still serves
        assert b.error == E.NONE and b.member_epoch == 2
        moved = await g2.handle_heartbeat("g", "b", b.member_epoch, Subscription(owned={}))
        assert moved.error == E.NONE and moved.member_epoch == 2
        assert set(g2.group("g").members) == {"a", "b"}
        # An epoch the stored state does not have either is still fenced.
        behind = await g2.handle_heartbeat("g", "a", 7, Subscription(owned={}))
        assert behind.error == E.FENCED_MEMBER_EPOCH

    run_with_two_coordinators(tmp_path, body)


def test_a_group_believed_absent_is_read_again_once_another_gateway_stored_it(tmp_path):
    # The first gateway found no group in the store (and remembers that for a while, for
    # offset commits of classic groups); the second then made one. A heartbeat at the
    # first continues the stored group rather than make a new one that cannot be stored,
    # and a copy dropped for a newer one is not believed absent either.
    async def body(g1, g2):
        sub0 = Subscription(5000, ("t1",), owned={})
        await g1.load("g")
        b = await g2.handle_heartbeat("g", "b", 0, sub0)
        assert b.error == E.NONE
        a = await g1.handle_heartbeat("g", "a", 0, sub0)
        assert a.error == E.NONE and a.member_epoch == 2
        assert set(g1.group("g").members) == {"a", "b"}
        await g2.load("h")  # none: believed absent for a while
        c = await g1.handle_heartbeat("h", "c", 0, sub0)
        assert c.error == E.NONE
        g2.forget("h")  # as when a write of its own was refused
        await g2.load("h")
        assert g2.group("h") is not None

    run_with_two_coordinators(tmp_path, body)


def test_a_gateway_not_coordinating_checks_fetches_against_the_stored_group(tmp_path):
    async def body(g1, g2):
        a = await g1.handle_heartbeat("g", "a", 0, Subscription(5000, ("t1",), owned={}))
        assert await g2.check_fetch_stored("g", "a", a.member_epoch) is None
        assert await g2.check_fetch_stored("g", "a", a.member_epoch + 1) == E.STALE_MEMBER_EPOCH
        assert await g2.check_fetch_stored("g", "ghost", 1) == E.UNKNOWN_MEMBER_ID
        assert await g2.check_fetch_stored("g", None, -1) is None  # no member named
        assert await g2.check_fetch_stored("classic", "m", 3) is None  # not a consumer group
        assert g2.group("g") is None  # nothing kept by the gateway that only answered

    run_with_two_coordinators(tmp_path, body)


def test_a_stored_group_from_a_newer_gateway_is_refused(tmp_path):
    import asyncio
    import json

    from stratalog.coordinator import open_coordinator

    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        try:
            await store.put_consumer_group("g", json.dumps({"version": 99}).encode(), None)
            h = Harness()
            groups = ConsumerGroups(lambda: h.topics, h.clock, store=store)
            r = await groups.handle_heartbeat("g", "a", 0, Subscription(5000, ("t1",), owned={}))
            assert r.error == E.COORDINATOR_NOT_AVAILABLE and "version 99" in (r.message or "")
            assert await store.consumer_group("g") == b'{"version": 99}'
        finally:
            await store.close()

    asyncio.run(main())


def test_plain_heartbeats_do_not_write_to_the_store(tmp_path):
    import asyncio

    from stratalog.coordinator import open_coordinator

    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        writes = []
        real = store.put_consumer_group

        async def counting(group, value, expected):
            writes.append(group)
            return await real(group, value, expected)

        store.put_consumer_group = counting
        try:
            h = Harness()
            groups = ConsumerGroups(lambda: h.topics, h.clock, store=store)
            a = await groups.handle_heartbeat("g", "a", 0, Subscription(5000, ("t1",), owned={}))
            assert writes == ["g"]
            for _ in range(5):
                h.clock.now += 1
                r = await groups.handle_heartbeat("g", "a", a.member_epoch, Subscription())
                assert r.error == E.NONE
            assert writes == ["g"]
            await groups.handle_heartbeat("g", "a", -1, Subscription())
            assert writes == ["g", "g"]
        finally:
            await store.close()

    asyncio.run(main())


def test_list_groups_loads_stored_consumer_groups(tmp_path):
    import asyncio

    from stratalog.coordinator import open_coordinator
    from stratalog.gateway.groups import GroupCoordinator

    async def main():
        store = open_coordinator(None, tmp_path / "coordinator")
        try:
            h = Harness()
            before = ConsumerGroups(lambda: h.topics, h.clock, store=store)
            assert (await before.handle_heartbeat("g", "a", 0, Subscription(5000, ("t1",), owned={}))).error == E.NONE
            # Another gateway, which has seen no heartbeat yet, lists it as it is.
            after = GroupCoordinator(store, h.clock, consumer=ConsumerGroups(lambda: h.topics, h.clock, store=store))
            error, listed = await after.list_groups()
            assert [(g.group_id, g.group_type, g.state) for g in listed] == [("g", "consumer", "Stable")]
            await after.stop()
        finally:
            await store.close()

    asyncio.run(main())
