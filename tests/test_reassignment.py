"""Manual replica assignment, reassignment and leader elections.

Unit tier: the pure placement functions (`gateway.assignment`, `decide_partition`,
`balance_leaders`), the compare-and-set on partition states and the controller over the
embedded coordinator. Integration: a 3-gateway cluster on etcd and moto's S3 driven by
confluent-kafka (create_topics with replica_assignment, elect_leaders) and kafka-python
(alter/list_partition_reassignments, requests librdkafka would refuse to send), with
records produced and consumed across every leader move.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import replace

import cluster_fixtures as cf
import pytest

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.model import Fenced, PartitionState, TopicInfo
from stratalog.coordinator.store import KVClusterStore
from stratalog.gateway.assignment import (
    assigned_states, cancel_reassignment, check_assignments, elect_preferred, elect_unclean, start_reassignment)
from stratalog.gateway.cluster import BrokerAddress, Controller, Membership, balance_leaders, decide_partition
from stratalog.gateway.errors import KafkaError
from stratalog.gateway.protocol.error_codes import ErrorCode

from cluster_fixtures import etcd, moto_s3  # noqa: F401  (fixtures)

INFO = TopicInfo("orders", uuid.UUID(int=11), 3, 2, {})
KEY0 = f"{INFO.topic_id}/0"


def no_lagging(node: int) -> frozenset[str]:
    return frozenset()


def code_of(fn, *args) -> tuple[ErrorCode, str]:
    with pytest.raises(KafkaError) as e:
        fn(*args)
    return e.value.code, str(e.value)


# ---- validation -----------------------------------------------------------------------------

@pytest.mark.unit
def test_check_assignments_accepts_a_complete_even_assignment():
    got = check_assignments([(1, [3, 1]), (0, [2, 3])], {1, 2, 3}, range(2))
    assert got == {0: (2, 3), 1: (3, 1)}
    states = assigned_states(got)
    assert states[0] == PartitionState(2, 0, (2, 3), (2, 3), assigned=(2, 3))
    assert states[1].leader == 3  # the first replica is the preferred leader


@pytest.mark.unit
@pytest.mark.parametrize("assignments, partitions, rf, says", [
    ([(0, [1, 1])], range(1), None, "broker 1 is listed more than once"),
    ([(0, [1, 9])], range(1), None, "broker 9 is not a live gateway (live: 1,2,3)"),
    ([(0, [])], range(1), None, "the replica list is empty"),
    ([(0, [1]), (2, [2])], range(2), None, "partition 2 is outside 0..1"),
    ([(0, [1]), (0, [2])], range(2), None, "partition 0 is assigned more than once"),
    ([(0, [1])], range(2), None, "partition 1 has no assignment"),
    ([(0, [1, 2]), (1, [3])], range(2), None, "partition 1 has 1 replicas where the others have 2"),
    ([(4, [1])], range(4, 5), 2, "partition 4 has 1 replicas where the others have 2"),
])
def test_check_assignments_refuses_bad_ones(assignments, partitions, rf, says):
    code, message = code_of(check_assignments, assignments, {1, 2, 3}, partitions, rf)
    assert code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert says in message


# ---- the controller's decisions -------------------------------------------------------------

def assigned(leader: int, epoch: int, replicas: tuple[int, ...], isr=None) -> PartitionState:
    return PartitionState(leader, epoch, replicas, replicas if isr is None else isr, assigned=replicas)


def decide(old, live, lagging=no_lagging, rebalance=True):
    new = decide_partition(INFO, 0, old, live, lagging, rebalance=rebalance)
    # A decision is a fixed point: the next pass over the same inputs changes nothing, so
    # Controller._settled holds.
    assert decide_partition(INFO, 0, new, live, lagging, rebalance=rebalance) == new
    return new


@pytest.mark.unit
def test_the_preferred_replica_leads_while_alive():
    old = assigned(2, 4, (2, 3))
    assert decide(old, [1, 2, 3]) == old
    # Preferred gone: the other assigned replica, with a new epoch; the dead one stays listed.
    down = decide(old, [1, 3])
    assert (down.leader, down.leader_epoch, down.replicas, down.isr) == (3, 5, (2, 3), (3,))
    # Back: leadership returns to it (auto.leader.rebalance.enable), or stays put without.
    back = decide(down, [1, 2, 3])
    assert (back.leader, back.leader_epoch, back.isr) == (2, 6, (2, 3))
    stays = decide(down, [1, 2, 3], rebalance=False)
    assert (stays.leader, stays.leader_epoch, stays.isr) == (3, 5, (3, 2))


@pytest.mark.unit
def test_caught_up_replicas_lead_before_lagging_ones():
    old = assigned(1, 0, (1, 2, 3))
    lagging = {2: frozenset({KEY0})}
    new = decide(old, [2, 3], lambda n: lagging.get(n, frozenset()))
    assert (new.leader, new.isr) == (3, (3,))


@pytest.mark.unit
def test_with_no_assigned_replica_alive_any_live_gateway_leads():
    old = assigned(2, 1, (2, 3))
    new = decide(old, [1])
    assert (new.leader, new.leader_epoch, new.replicas, new.isr) == (1, 2, (2, 3, 1), (1,))
    assert new.assigned == (2, 3)
    back = decide(new, [1, 3])  # an assigned replica is back: it leads, the stand-in goes
    assert (back.leader, back.replicas) == (3, (2, 3))


@pytest.mark.unit
def test_balance_leaders_never_moves_an_assigned_partition():
    info = TopicInfo("m", uuid.UUID(int=12), 4, 1, {})
    olds = [assigned(1, 0, (1,)) for _ in range(4)]
    plans = [(info, p, old, decide_partition(info, p, old, [1, 2], no_lagging)) for p, old in enumerate(olds)]
    out = balance_leaders(plans, {1: 4, 2: 0})
    assert [new for *_, new in out] == olds


@pytest.mark.unit
def test_a_reassignment_completes_once_the_added_replicas_are_alive():
    old = assigned(2, 4, (2, 3))
    moving = start_reassignment(old, (1, 3))
    assert (moving.assigned, moving.adding, moving.removing) == ((1, 3), (1,), (2,))
    assert moving.replicas == (2, 3, 1) and moving.leader == 2 and moving.reassigning
    done = decide(moving, [1, 2, 3])
    assert (done.leader, done.leader_epoch, done.replicas, done.isr) == (1, 5, (1, 3), (1, 3))
    assert not done.reassigning
    # The added gateway is not alive (or still catching up): under way, the leader stays.
    waiting = decide(moving, [2, 3])
    assert waiting.reassigning and waiting.leader == 2 and waiting.replicas == (2, 3, 1)
    lagging = {1: frozenset({KEY0})}
    assert decide(moving, [1, 2, 3], lambda n: lagging.get(n, frozenset())).reassigning
    # Cancelled: the replicas before it, kept as the assignment.
    back = cancel_reassignment(waiting)
    assert (back.assigned, back.replicas, back.reassigning) == ((2, 3), (2, 3), False)
    assert code_of(cancel_reassignment, back)[0] == ErrorCode.NO_REASSIGNMENT_IN_PROGRESS


@pytest.mark.unit
def test_a_reassignment_of_a_placed_partition_and_a_new_order():
    placed = PartitionState(3, 2, (3, 1), (3, 1))
    again = start_reassignment(placed, (1, 3))  # the same replicas: only the preferred changes
    assert not again.reassigning and again.assigned == (1, 3)
    new = decide(again, [1, 2, 3])
    assert (new.leader, new.leader_epoch, new.replicas) == (1, 3, (1, 3))
    # A second reassignment while one is under way keeps the original replicas' view.
    first = start_reassignment(placed, (2, 1))
    second = start_reassignment(first, (2,))
    assert (second.adding, second.removing, second.replicas) == ((2,), (3, 1), (3, 1, 2))


@pytest.mark.unit
def test_elections():
    live = {1, 2, 3}
    st = assigned(3, 5, (2, 3), isr=(3, 2))
    new = elect_preferred(st, live)
    assert (new.leader, new.leader_epoch, new.isr) == (2, 6, (2, 3))
    assert code_of(elect_preferred, new, live)[0] == ErrorCode.ELECTION_NOT_NEEDED
    assert code_of(elect_preferred, st, {1, 3})[0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    offline = PartitionState(-1, 6, (2, 3), (), "bad CRC", assigned=(2, 3))
    assert code_of(elect_preferred, offline, live)[0] == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE
    code, message = code_of(elect_unclean, offline, live)
    assert code == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE and "partitions recover" in message
    assert code_of(elect_unclean, st, live)[0] == ErrorCode.ELECTION_NOT_NEEDED
    leaderless = PartitionState(-1, 7, (2, 3), ())
    assert elect_unclean(leaderless, {3}).leader == 3
    stand_in = elect_unclean(leaderless, {1})
    assert (stand_in.leader, stand_in.replicas, stand_in.leader_epoch) == (1, (1, 2, 3), 8)


# ---- the coordinator's compare-and-set, and the controller ----------------------------------

@pytest.mark.unit
def test_partition_state_writes_compare_and_set(tmp_path):
    async def run():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        try:
            info = await store.create_topic("t", 1, 2, {}, assigned_states({0: (1, 2)}))
            [read] = (await store.partition_states(info.topic_id)).values()
            assert read.assigned == (1, 2)  # kept by the coordinator
            operator = start_reassignment(read, (3, 2))
            await store.set_partition_state(info.topic_id, 0, operator, expect_state=read)
            # The controller decided from the state before the operator's change: refused,
            # though the epoch is the same.
            stale = PartitionState(1, 0, (1, 2), (1,), assigned=(1, 2))
            with pytest.raises(Fenced):
                await store.set_partition_state(info.topic_id, 0, stale, expect_epoch=0, expect_state=read)
            [now] = (await store.partition_states(info.topic_id)).values()
            assert now == operator and now.adding == (3,) and now.removing == (1,)
        finally:
            await store.close()

    asyncio.run(run())


@pytest.mark.unit
def test_an_assignment_outlives_the_partition_going_offline(tmp_path):
    from stratalog.engine.offline import mark_offline

    async def run():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        try:
            info = await store.create_topic("t", 1, 2, {}, assigned_states({0: (2, 1)}))
            assert await mark_offline(store, info.topic_id, 0, 0, "bad CRC")
            st = (await store.partition_states(info.topic_id))[0]
            assert (st.leader, st.offline, st.assigned) == (-1, "bad CRC", (2, 1))
            recovered = decide_partition(info, 0, replace(st, offline=""), [1, 2], no_lagging)
            assert (recovered.leader, recovered.replicas) == (2, (2, 1))
        finally:
            await store.close()

    asyncio.run(run())


@pytest.mark.unit
def test_the_controller_completes_a_reassignment_when_the_new_gateway_registers(tmp_path):
    async def run():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        membership = Membership(store, BrokerAddress(1, "127.0.0.1", 1), ttl_s=30)
        try:
            await membership._register()
            await membership.refresh()
            controller = Controller(store, membership)
            info = await store.create_topic("t", 1, 1, {}, assigned_states({0: (1,)}))
            [read] = (await store.partition_states(info.topic_id)).values()
            await store.set_partition_state(info.topic_id, 0, start_reassignment(read, (2,)), expect_state=read)
            assert not await controller.run_once()  # gateway 2 is not alive: under way
            [st] = (await store.partition_states(info.topic_id)).values()
            assert (st.leader, st.adding, st.removing) == (1, (2,), (1,))
            assert not await controller.run_once()  # nothing changed: the pass is skipped
            lease = await store.grant_lease(30)
            await store.register_broker(2, "127.0.0.1", 2, None, lease)
            await membership.refresh()
            assert await controller.run_once()
            [st] = (await store.partition_states(info.topic_id)).values()
            assert (st.leader, st.leader_epoch, st.replicas, st.reassigning) == (2, 1, (2,), False)
        finally:
            await membership.stop()
            await store.close()

    asyncio.run(run())


@pytest.mark.unit
def test_a_controller_whose_own_lease_ended_waits_a_lease_before_moving_leaders(tmp_path):
    """The coordinator was paused past every lease (the others' ended with ours). Back, the
    controller registers again before the others do: for one lease it moves nobody's
    partitions, so a gateway that comes back in that time keeps them at the same epoch;
    one still gone after it loses them."""
    async def run():
        now = [1000.0]
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        membership = Membership(store, BrokerAddress(1, "127.0.0.1", 1), ttl_s=30, monotonic=lambda: now[0])
        try:
            await membership._register()
            others = {b: await store.grant_lease(30) for b in (2, 3)}
            for b, lease in others.items():
                await store.register_broker(b, "127.0.0.1", b, None, lease)
            await membership.refresh()
            controller = Controller(store, membership)
            info = await store.create_topic("t", 3, 1, {}, {
                p: PartitionState(p + 1, 0, (p + 1,), (p + 1,)) for p in range(3)})
            assert not await controller.run_once()

            def leaders_and_epochs(states):
                return {p: (st.leader, st.leader_epoch) for p, st in states.items()}

            for lease in (membership.lease, *others.values()):  # etcd resuming ends them all
                await store.revoke_lease(lease)
            await membership.keep_alive_once()  # ours ended: registered again, alone so far
            await membership.refresh()
            assert sorted(membership.live) == [1] and membership.rejoining()
            assert not await controller.run_once()
            await store.register_broker(2, "127.0.0.1", 2, None, await store.grant_lease(30))
            await membership.refresh()
            assert not await controller.run_once()
            before = {0: (1, 0), 1: (2, 0), 2: (3, 0)}
            assert leaders_and_epochs(await store.partition_states(info.topic_id)) == before

            now[0] += 31  # a lease later: gateway 3, still not back, loses its partition
            assert not membership.rejoining()
            assert await controller.run_once()
            after = leaders_and_epochs(await store.partition_states(info.topic_id))
            assert {p: after[p] for p in (0, 1)} == {0: (1, 0), 1: (2, 0)}
            assert after[2][0] in (1, 2) and after[2][1] == 1
        finally:
            await membership.stop()
            await store.close()

    asyncio.run(run())


def with_late_registrations(tmp_path, check, etcd_server=None) -> None:
    """Run `check(broker, store)` on gateway 1 (embedded coordinator, or `etcd_server`) after
    gateways 2 and 3 registered without gateway 1 reading the live set since."""
    from stratalog.coordinator import open_coordinator
    from stratalog.gateway.broker import Broker
    from stratalog.gateway.config import BrokerConfig
    from stratalog.tiering.objectstore import open_store

    async def run():
        store = open_coordinator(etcd_server.url if etcd_server else None, tmp_path / "coord")
        broker = Broker(BrokerConfig(), node_id=1, advertised=("127.0.0.1", 1), data_dir=tmp_path / "data",
                        store=store, objects=open_store((tmp_path / "objects").as_uri()))
        try:
            await broker.membership.start()
            for node in (2, 3):
                await store.register_broker(node, "127.0.0.1", node, None, await store.grant_lease(30))
            await check(broker, store)
        finally:
            await broker.membership.stop()
            await store.close()

    asyncio.run(run())


@pytest.mark.unit
def test_create_topic_counts_a_gateway_registered_since_the_last_refresh(tmp_path):
    """CreateTopics decides on the live set as the coordinator has it now: a gateway that
    registered a moment ago (no membership refresh since) counts for the replication
    factor, as soon as a client could see it in Metadata from any gateway."""
    async def check(broker, store):
        assert sorted(broker.membership.live) == [1]  # not refreshed since
        info = await broker.admin.create_topic("t", 1, 3, {}, validate_only=True)
        assert info.replication_factor == 3
        with pytest.raises(KafkaError) as refused:
            await broker.admin.create_topic("t", 1, 4, {}, validate_only=True)
        assert refused.value.code == ErrorCode.INVALID_REPLICATION_FACTOR
        assert str(refused.value).endswith("3 live gateway(s): 1, 2, 3")

    with_late_registrations(tmp_path, check)


@pytest.mark.unit
def test_metadata_names_a_leader_registered_since_the_last_refresh(tmp_path):
    """A partition led by a gateway that registered after this one last read the live set
    is answered with that leader and its address (it was answered leaderless: librdkafka
    keeps that, and its watermark lookups failed "Unknown partition" for minutes after
    every gateway restarted, in test_chaos)."""
    from stratalog.gateway.protocol.catalog import ApiKey
    from test_dispatch import answer  # type: ignore

    async def check(broker, store):
        # Made through another gateway: one partition led by each of 1, 2 and 3.
        await store.create_topic("t", 3, 1, {}, assigned_states({0: (1,), 1: (2,), 2: (3,)}))
        assert sorted(broker.membership.live) == [1]  # not refreshed since
        resp = await answer(broker, ApiKey.METADATA, 12, {"topics": [{"name": "t"}]})
        assert sorted(b.node_id for b in resp.brokers) == [1, 2, 3]
        (topic,) = resp.topics
        assert sorted((p.leader_id, p.error_code) for p in topic.partitions) == [(1, 0), (2, 0), (3, 0)]

    with_late_registrations(tmp_path, check)


def test_metadata_is_answered_while_the_coordinator_is_down(tmp_path, etcd):
    """A partition led by a gateway missing from the live set last read makes Metadata read
    it again; with etcd stopped the answer uses the live set it has (that leader unnamed)
    instead of failing, which closed the client's connection and with it every produce
    request in flight there (seen in test_chaos's etcd outage)."""
    from stratalog.gateway.protocol.catalog import ApiKey
    from test_dispatch import answer  # type: ignore

    async def check(broker, store):
        await store.create_topic("t", 2, 1, {}, assigned_states({0: (1,), 1: (2,)}))
        await broker.look_up_topics(["t"])
        etcd.stop()
        assert sorted(broker.membership.live) == [1]
        resp = await answer(broker, ApiKey.METADATA, 12, {"topics": [{"name": "t"}]})
        assert [b.node_id for b in resp.brokers] == [1]
        (topic,) = resp.topics
        assert topic.error_code == 0
        assert sorted((p.partition_index, p.leader_id) for p in topic.partitions) == [(0, 1), (1, -1)]

    with_late_registrations(tmp_path, check, etcd_server=etcd)


@pytest.mark.unit
def test_overlapping_membership_reads_leave_the_newer_live_set(tmp_path):
    """A read that answered before a gateway registered but returns late (a slow
    coordinator) never replaces the live set a later read found."""
    async def run():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"))
        first_read_back = asyncio.Event()

        class SlowFirstRead:
            def __init__(self):
                self.calls = 0

            def __getattr__(self, name):
                return getattr(store, name)

            async def brokers(self):
                self.calls += 1
                answer = await store.brokers()
                if self.calls == 1:
                    first_read_back.set()
                    await asyncio.sleep(0.2)
                return answer

        membership = Membership(SlowFirstRead(), BrokerAddress(1, "127.0.0.1", 1), ttl_s=30)
        try:
            await membership._register()
            older = asyncio.create_task(membership.refresh())
            await first_read_back.wait()
            await store.register_broker(2, "127.0.0.1", 2, None, await store.grant_lease(30))
            newer = await membership.refresh()
            await older
            assert sorted(newer) == sorted(membership.live) == [1, 2]
        finally:
            await membership.stop()
            await store.close()

    asyncio.run(run())


# ---- a 3-gateway cluster: etcd, moto's S3, real clients -------------------------------------

def describe(bootstrap: str, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """partition -> (leader, replicas, isr) as Metadata says."""
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": bootstrap, "logger": cf.QUIET}).list_topics(topic, timeout=10)
    return {p: (pm.leader, list(pm.replicas), list(pm.isrs)) for p, pm in md.topics[topic].partitions.items()}


def produce(bootstrap: str, topic: str, partitions: int, tag: str) -> list[bytes]:
    from confluent_kafka import Producer

    failures: list[str] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 5, "message.timeout.ms": 60_000, "logger": cf.QUIET,
                         "topic.metadata.refresh.interval.ms": 1000})
    values = [f"{tag}-{p}-{i}".encode() for p in range(partitions) for i in range(5)]
    for v in values:
        producer.produce(topic, value=v, partition=int(v.split(b"-")[1]),
                         on_delivery=lambda err, msg: failures.append(str(err)) if err else None)
    assert producer.flush(60) == 0 and not failures, failures
    return values


def consume_all(bootstrap: str, topic: str, partitions: int) -> dict[int, list[bytes]]:
    return {p: [v for _, v in records] for p, records in cf.read_everything(bootstrap, topic, partitions).items()}


def kafka_python_admin(bootstrap: str):
    kafka_admin = pytest.importorskip("kafka.admin", reason="kafka-python is not installed")
    return kafka_admin.KafkaAdminClient(bootstrap_servers=bootstrap.split(","), request_timeout_ms=30_000)


def test_assignments_reassignments_and_elections_on_three_gateways(gateway_factory, etcd, moto_s3, tmp_path):
    from confluent_kafka import KafkaError as CKError
    from confluent_kafka import ElectionType, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
    from kafka import TopicPartition as KTopicPartition
    from kafka.errors import InvalidReplicationAssignmentError, NoReassignmentInProgressError

    # Without auto.leader.rebalance.enable a returning preferred replica waits for
    # ElectLeaders, which is what this test drives.
    gws = cf.start_cluster(gateway_factory, etcd, tmp_path, 3, s3=moto_s3,
                           **{"auto.leader.rebalance.enable": "false"})
    boot = cf.bootstrap_of(gws)
    admin = AdminClient({"bootstrap.servers": boot, "logger": cf.QUIET})
    kp = kafka_python_admin(boot)
    topic = cf.unique_topic("assigned")

    # CreateTopics with an assignment: those replicas, the first of each leads.
    admin.create_topics([NewTopic(topic, 3, replica_assignment=[[2, 3], [3, 1], [1, 2]])])[topic].result(30)
    want = {0: (2, [2, 3]), 1: (3, [3, 1]), 2: (1, [1, 2])}
    cf.wait_for(lambda: {p: (lead, reps) for p, (lead, reps, _) in describe(boot, topic).items()} == want,
                what="the assigned leaders and replicas")
    first = produce(boot, topic, 3, "first")

    # Bad assignments are refused with the protocol's codes and a reason.
    bad = cf.unique_topic("bad")
    with pytest.raises(KafkaException) as e:
        admin.create_topics([NewTopic(bad, 1, replica_assignment=[[1, 9]])])[bad].result(30)
    assert e.value.args[0].code() == CKError.INVALID_REPLICA_ASSIGNMENT
    assert "broker 9 is not a live gateway" in e.value.args[0].str()
    for options, code, says in [
        ({"assignments": {0: [1, 1]}}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "more than once"),
        ({"assignments": {0: [1, 2], 1: [3]}}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "the others have 2"),
        ({"assignments": {0: [1], 2: [2]}}, ErrorCode.INVALID_REPLICA_ASSIGNMENT, "outside 0..1"),
        ({"num_partitions": 2, "assignments": {0: [1], 1: [2]}}, ErrorCode.INVALID_REQUEST, "not both"),
    ]:
        got = kp.create_topics({bad: options}, raise_errors=False)
        [row] = got["topics"]
        assert (row["error_code"], says in row["error_message"]) == (code, True), (options, row)
    assert bad not in admin.list_topics(timeout=10).topics
    # CreatePartitions with assignments: the new partitions' replicas.
    admin.create_partitions([NewPartitions(topic, 4, replica_assignment=[[3, 2]])])[topic].result(30)
    cf.wait_for(lambda: describe(boot, topic).get(3, (None, None))[:2] == (3, [3, 2]), what="partition 3")
    with pytest.raises(KafkaException) as e:
        admin.create_partitions([NewPartitions(topic, 5, replica_assignment=[[3]])])[topic].result(30)
    assert e.value.args[0].code() == CKError.INVALID_REPLICA_ASSIGNMENT

    # A reassignment: partition 0 from [2, 3] to [1, 3]; it completes as soon as gateway 1
    # tails the partition, and gateway 1 leads it (its preferred replica).
    result = kp.alter_partition_reassignments({KTopicPartition(topic, 0): [1, 3]})
    assert result == {KTopicPartition(topic, 0): None}
    cf.wait_for(lambda: not kp.list_partition_reassignments({topic: [0, 1, 2, 3]}), what="the reassignment to end")
    cf.wait_for(lambda: describe(boot, topic)[0][:2] == (1, [1, 3]), what="partition 0 on [1, 3]")
    result = kp.alter_partition_reassignments({KTopicPartition(topic, 0): None})
    assert result[KTopicPartition(topic, 0)] is NoReassignmentInProgressError
    result = kp.alter_partition_reassignments({KTopicPartition(topic, 1): [3, 7]})
    assert result[KTopicPartition(topic, 1)] is InvalidReplicationAssignmentError
    assert describe(boot, topic)[1][1] == [3, 1]

    # A reassignment whose added gateway died once it was accepted stays under way: written
    # here as a gateway writes one, to a broker 9 that is not alive. It is listed with its
    # adding and removing replicas until cancelled, which restores the replicas before it.
    async def accepted(store):
        info = await store.topic(topic)
        st = (await store.partition_states(info.topic_id))[2]
        await store.set_partition_state(info.topic_id, 2, start_reassignment(st, (9, 1)), expect_state=st)

    cf.coordinator_call(etcd.url, accepted)
    assert kp.list_partition_reassignments() == {
        KTopicPartition(topic, 2): {"replicas": [1, 2, 9], "adding_replicas": [9], "removing_replicas": [2]}}
    cf.wait_for(lambda: describe(boot, topic)[2][:2] == (1, [1, 2, 9]), what="partition 2 on 1, 2 and 9")
    listed = cli("topics", "reassignments", topic, "--bootstrap", boot).splitlines()
    assert listed[0].split() == ["TOPIC", "PARTITION", "REPLICAS", "ADDING", "REMOVING"]
    assert listed[1].split() == [topic, "2", "1,2,9", "9", "2"]
    assert kp.alter_partition_reassignments({KTopicPartition(topic, 2): None}) == {KTopicPartition(topic, 2): None}
    assert kp.list_partition_reassignments() == {}
    cf.wait_for(lambda: describe(boot, topic)[2][:2] == (1, [1, 2]), what="partition 2 back on [1, 2]")

    # Gateway 3 stops: its partitions move to their other replica; its preferred
    # leadership is not available until it is back, and then ElectLeaders returns it.
    gws[2].stop()
    live = ",".join(g.bootstrap for g in gws[:2])
    cf.wait_for(lambda: cf.try_leaders(live, topic).get(1) == 1, what="partition 1 led by gateway 1")
    tp1 = TopicPartition(topic, 1)
    got = admin.elect_leaders(ElectionType.PREFERRED, [tp1]).result(30)
    assert got[tp1].code() == CKError.PREFERRED_LEADER_NOT_AVAILABLE
    during = produce(live, topic, 4, "during")
    gws[2].start(timeout=60)
    cf.wait_for(lambda: 3 in describe(boot, topic)[1][2], what="gateway 3 back in partition 1's ISR")
    assert describe(boot, topic)[1][0] == 1  # no automatic move back: auto.leader.rebalance.enable=false
    got = admin.elect_leaders(ElectionType.PREFERRED, [tp1]).result(30)
    assert got[tp1] is None
    cf.wait_for(lambda: describe(boot, topic)[1][0] == 3, what="gateway 3 leading partition 1 again")
    got = admin.elect_leaders(ElectionType.PREFERRED, [tp1]).result(30)
    assert got[tp1].code() == CKError.ELECTION_NOT_NEEDED
    got = admin.elect_leaders(ElectionType.UNCLEAN, [tp1]).result(30)
    assert got[tp1].code() == CKError.ELECTION_NOT_NEEDED
    # All partitions: gateway 3 takes partition 3 back too; then none needs it, none is listed.
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(30) == {TopicPartition(topic, 3): None}
    cf.wait_for(lambda: describe(boot, topic)[3][0] == 3, what="gateway 3 leading partition 3 again")
    assert admin.elect_leaders(ElectionType.PREFERRED, None).result(30) == {}

    # Records flowed through every move: all of them are there, in order.
    after = produce(boot, topic, 4, "after")
    log = consume_all(boot, topic, 4)
    for p in range(4):
        expected = [v for v in first + during + after if int(v.split(b"-")[1]) == p]
        assert log[p] == expected, p
    kp.close()

    # The same through `stratalog topics`.
    other = cf.unique_topic("cli")
    assert "created" in cli("topics", "create", other, "--replica-assignment", "2:1,1:2", "--bootstrap", boot)
    cli("topics", "alter", other, "--partitions", "3", "--replica-assignment", "3:2", "--bootstrap", boot)
    cf.wait_for(lambda: {p: (lead, reps) for p, (lead, reps, _) in describe(boot, other).items()}
                == {0: (2, [2, 1]), 1: (1, [1, 2]), 2: (3, [3, 2])}, what="the CLI's assignment")
    assert "reassigning" in cli("topics", "reassign", other, "0", "--replicas", "3,1", "--bootstrap", boot)
    cf.wait_for(lambda: describe(boot, other)[0][:2] == (3, [3, 1]), what="partition 0 moved by the CLI")
    assert cli("topics", "reassignments", "--bootstrap", boot) == "no reassignment under way\n"
    failed = cli("topics", "reassign", other, "0", "--cancel", "--bootstrap", boot, code=1)
    assert "no reassignment of this partition is under way" in failed
    failed = cli("topics", "reassign", other, "1", "--replicas", "1,9", "--bootstrap", boot, code=1)
    assert "broker 9 is not a live gateway" in failed
    assert "not needed" in cli("topics", "elect", other, "0", "--bootstrap", boot)
    assert cli("topics", "elect", "--all", "--bootstrap", boot) == "every partition is led by its preferred replica\n"


def cli(*args: str, code: int = 0) -> str:
    """Run `stratalog ARGS`; its stdout, or its stderr when it is expected to fail."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "STRATALOG_BOOTSTRAP"}
    proc = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", *args], capture_output=True,
                          timeout=60, env=env)
    assert proc.returncode == code, (args, proc.stdout.decode(), proc.stderr.decode())
    return (proc.stdout if code == 0 else proc.stderr).decode()


def test_the_preferred_replica_gets_its_leadership_back_by_default(gateway_factory, etcd, tmp_path):
    """auto.leader.rebalance.enable (the default): a preferred replica that comes back leads
    again without ElectLeaders, and producers and consumers follow."""
    from confluent_kafka.admin import AdminClient, NewTopic

    gws = cf.start_cluster(gateway_factory, etcd, tmp_path, 2)
    boot = cf.bootstrap_of(gws)
    topic = cf.unique_topic("preferred")
    admin = AdminClient({"bootstrap.servers": boot, "logger": cf.QUIET})
    admin.create_topics([NewTopic(topic, 2, replica_assignment=[[2, 1], [1, 2]])])[topic].result(30)
    cf.wait_for(lambda: cf.try_leaders(boot, topic) == {0: 2, 1: 1}, what="the preferred leaders")
    before = produce(boot, topic, 2, "before")
    gws[1].stop()
    cf.wait_for(lambda: cf.try_leaders(gws[0].bootstrap, topic) == {0: 1, 1: 1}, what="gateway 1 leading both")
    during = produce(gws[0].bootstrap, topic, 2, "during")
    gws[1].start(timeout=60)
    cf.wait_for(lambda: cf.try_leaders(boot, topic) == {0: 2, 1: 1}, what="gateway 2 leading partition 0 again")
    epoch = describe(boot, topic)
    assert epoch[0][1] == [2, 1] and epoch[1][1] == [1, 2]
    after = produce(boot, topic, 2, "after")
    log = consume_all(boot, topic, 2)
    for p in range(2):
        assert log[p] == [v for v in before + during + after if int(v.split(b"-")[1]) == p], p
