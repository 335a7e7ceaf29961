"""Kafka 4 consumer groups (KIP-848, `group.protocol=consumer`) with real confluent-kafka
consumers against a real gateway: a group of 3 on 6 partitions with members joining and
leaving under the uniform and range assignors, nothing lost or delivered twice with offsets
committed; ListGroups types and ConsumerGroupDescribe; a regex subscription picking up a
new topic; a static member restarting without a reassignment; the group continuing when
its coordinator moves to another gateway and back (state kept in etcd); a classic group
upgraded online as its members restart with the consumer protocol one by one."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, ConsumerGroupState, ConsumerGroupType  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

if tuple(int(x) for x in ck.libversion()[0].split(".")[:2]) < (2, 12):
    pytest.skip(f"librdkafka {ck.libversion()[0]} has no GA group.protocol=consumer (2.12+)",
                allow_module_level=True)

from cluster_fixtures import etcd, start_cluster  # noqa: E402,F401 - etcd is a fixture
from group_scenarios import CoordinatorMove, Records, assert_delivered_once, stop_all, wait_for  # noqa: E402

PARTITIONS = 6
SETTINGS = {"group.consumer.heartbeat.interval.ms": 500, "group.consumer.session.timeout.ms": 6000}


@pytest.fixture
def gw(gateway_factory):
    return gateway_factory(settings=SETTINGS)


def consumer_conf(bootstrap: str, group: str, **extra) -> dict:
    return {"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": "consumer",
            "auto.offset.reset": "earliest", "enable.auto.commit": False, **extra}


def make_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(15)



class Member(threading.Thread):
    """A consumer that commits what it read synchronously; a record counts as delivered
    when a commit covering its offset succeeded. Records of a partition revoked before
    their commit succeeded are left to the next owner, who reads them again from the
    committed offset."""

    def __init__(self, conf: dict, topics: list[str], sink: list, lock: threading.Lock):
        super().__init__(daemon=True)
        self.conf = conf
        self.topics = topics
        self.sink = sink
        self.lock = lock
        self.stop_flag = threading.Event()
        self.assignment: set[tuple[str, int]] = set()
        self.events: list[tuple[str, frozenset]] = []  # ("assign"|"revoke", partitions)
        self.error: Exception | None = None
        # The consumer protocol and cooperative classic assignors move partitions one by
        # one; eager classic assignors hand out the whole assignment each time.
        self.incremental = conf.get("group.protocol") == "consumer" or \
            conf.get("partition.assignment.strategy") == "cooperative-sticky"

    def run(self) -> None:
        try:
            c = Consumer(self.conf)

            def on_assign(consumer, parts):
                got = frozenset((p.topic, p.partition) for p in parts)
                self.events.append(("assign", got))
                if self.incremental:
                    self.assignment |= got
                    consumer.incremental_assign(parts)
                else:  # a classic member with an eager assignor: the whole assignment
                    self.assignment = set(got)
                    consumer.assign(parts)

            def on_revoke(consumer, parts):
                gone = frozenset((p.topic, p.partition) for p in parts)
                self.events.append(("revoke", gone))
                self.assignment -= gone
                if self.incremental:
                    consumer.incremental_unassign(parts)
                else:
                    consumer.unassign()

            c.subscribe(self.topics, on_assign=on_assign, on_revoke=on_revoke)
            waiting: dict[tuple[str, int], list] = {}
            while not self.stop_flag.is_set():
                m = c.poll(0.2)
                if m is not None and not m.error():
                    waiting.setdefault((m.topic(), m.partition()), []).append(m)
                for tp in [tp for tp in waiting if tp not in self.assignment]:
                    del waiting[tp]
                if not waiting:
                    continue
                offsets = [ck.TopicPartition(t, p, ms[-1].offset() + 1) for (t, p), ms in waiting.items()]
                try:
                    result = c.commit(offsets=offsets, asynchronous=False)
                except ck.KafkaException:
                    continue
                with self.lock:
                    for tp in result or ():
                        key = (tp.topic, tp.partition)
                        if tp.error is None and key in waiting:
                            self.sink.extend((r.topic(), r.partition(), r.value()) for r in waiting.pop(key))
            c.close()
        except Exception as e:  # noqa: BLE001
            self.error = e




@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_three_members_join_and_leave_without_loss_or_duplicates(gw, assignor):
    topic = f"cg-{assignor}-{uuid.uuid4().hex[:6]}"
    make_topic(gw.bootstrap, topic)
    records = Records(gw.bootstrap, PARTITIONS, flush_timeout=20)
    sink: list = []
    lock = threading.Lock()
    conf = consumer_conf(gw.bootstrap, f"g-{topic}", **{"group.remote.assignor": assignor})
    members = [Member(conf, [topic], sink, lock) for _ in range(3)]
    members[0].start()
    records.produce(topic, 300)
    wait_for(lambda: len(members[0].assignment) == 6, 20, "the first member to get all 6")
    members[1].start()
    records.produce(topic, 300)
    members[2].start()
    records.produce(topic, 300)
    wait_for(lambda: sorted(len(m.assignment) for m in members) == [2, 2, 2], 30,
             "2 partitions each")
    assert set().union(*(m.assignment for m in members)) == {(topic, p) for p in range(6)}
    members[0].stop_flag.set()
    members[0].join(20)
    records.produce(topic, 300)
    wait_for(lambda: sorted(len(m.assignment) for m in members[1:]) == [3, 3], 30,
             "3 partitions each after one left")
    wait_for(lambda: records.all_in(sink, lock), 40, "every record delivered")
    # Taken before anyone stops: the member that closes last is given the other's
    # partitions if it is still polling when that one leaves.
    settled = sorted(sorted(p for _, p in set(m.assignment)) for m in members[1:])
    stop_all(members[1:])
    assert not any(m.error for m in members), [m.error for m in members]
    assert_delivered_once(sink, records.total)
    if assignor == "range":
        # Range hands out contiguous ranges.
        assert settled == [[0, 1, 2], [3, 4, 5]], settled


def test_list_groups_types_and_consumer_group_describe(gw):
    topic = f"cg-describe-{uuid.uuid4().hex[:6]}"
    make_topic(gw.bootstrap, topic)
    sink: list = []
    lock = threading.Lock()
    group = f"g-{topic}"
    members = [Member(consumer_conf(gw.bootstrap, group, **{"client.id": f"member-{i}"}), [topic],
                      sink, lock) for i in range(2)]
    for m in members:
        m.start()
    classic_group = f"classic-{topic}"
    classic = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": classic_group,
                        "auto.offset.reset": "earliest"})
    classic.subscribe([topic])
    try:
        wait_for(lambda: sorted(len(m.assignment) for m in members) == [3, 3], 30, "3 each")
        for _ in range(50):
            classic.poll(0.1)
            if classic.assignment():
                break
        admin = AdminClient({"bootstrap.servers": gw.bootstrap})
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(15)
        ids = {g.group_id: g for g in listed.valid}
        assert group in ids and classic_group not in ids
        assert ids[group].type == ConsumerGroupType.CONSUMER
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CLASSIC}).result(15)
        assert {g.group_id for g in listed.valid} >= {classic_group}
        assert group not in {g.group_id for g in listed.valid}

        def stable():
            d = admin.describe_consumer_groups([group])[group].result(15)
            return d.state == ConsumerGroupState.STABLE
        wait_for(stable, 20, "a Stable group")
        d = admin.describe_consumer_groups([group])[group].result(15)
        assert d.type == ConsumerGroupType.CONSUMER
        assert d.partition_assignor == "uniform"
        assert sorted(m.client_id for m in d.members) == ["member-0", "member-1"]
        assigned = sorted(p.partition for m in d.members for p in m.assignment.topic_partitions)
        assert assigned == list(range(6))
        assert all(p.topic == topic for m in d.members for p in m.assignment.topic_partitions)
    finally:
        classic.close()
        stop_all(members)


def test_regex_subscription_picks_up_a_new_topic(gw):
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    first, second, other = f"{prefix}-a", f"{prefix}-b", f"x{prefix}-c"
    make_topic(gw.bootstrap, first, 2)
    make_topic(gw.bootstrap, other, 2)
    records = Records(gw.bootstrap, PARTITIONS, flush_timeout=20)
    records.produce(first, 10, 2)
    records.produce(other, 10, 2)
    sink: list = []
    lock = threading.Lock()
    member = Member(consumer_conf(gw.bootstrap, f"g-{prefix}"), [f"^{prefix}-.*"], sink, lock)
    member.start()
    try:
        wait_for(lambda: len(sink) >= 10, 20, "the first topic's records")
        make_topic(gw.bootstrap, second, 2)
        records.produce(second, 10, 2)
        wait_for(lambda: len(sink) >= 20, 30, "the new topic's records")
        time.sleep(1)
    finally:
        member.stop_flag.set()
        member.join(20)
    assert member.error is None
    assert {t for t, _, _ in sink} == {first, second}
    assert len(sink) == 20


def test_static_member_restart_keeps_its_partitions(gw):
    topic = f"cg-static-{uuid.uuid4().hex[:6]}"
    make_topic(gw.bootstrap, topic)
    group = f"g-{topic}"
    sink: list = []
    lock = threading.Lock()

    def static(instance: str) -> Member:
        return Member(consumer_conf(gw.bootstrap, group, **{"group.instance.id": instance}),
                      [topic], sink, lock)

    a, b = static("static-a"), static("static-b")
    a.start()
    b.start()
    wait_for(lambda: sorted(len(m.assignment) for m in (a, b)) == [3, 3], 30, "3 each")
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    wait_for(lambda: admin.describe_consumer_groups([group])[group].result(15).state
             == ConsumerGroupState.STABLE, 20, "a Stable group")
    mine = set(a.assignment)
    b_events = len(b.events)
    a.stop_flag.set()
    a.join(20)
    again = static("static-a")
    again.start()
    try:
        wait_for(lambda: again.assignment == mine, 20, "the same partitions back")
        time.sleep(2)  # a few heartbeats: nothing moves
        assert b.events[b_events:] == [], b.events[b_events:]
        assert again.events == [("assign", frozenset(mine))]
    finally:
        stop_all((again, b))
    assert not any(m.error for m in (a, b, again))



def test_the_group_continues_when_its_coordinator_is_killed(gateway_factory, etcd, tmp_path):
    # A session long enough for a client to find the gateway back: librdkafka's reconnect
    # backoff to a gateway that was down grows to seconds.
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3,
                        **{**SETTINGS, "group.consumer.session.timeout.ms": 30_000})
    move = CoordinatorMove(gws)
    move.wait_until_agreed()
    topic = f"cg-move-{uuid.uuid4().hex[:6]}"
    make_topic(move.bootstrap, topic)
    records = Records(move.bootstrap, PARTITIONS)
    sink: list = []
    lock = threading.Lock()
    members = [Member(consumer_conf(move.bootstrap, move.group, **{"reconnect.backoff.max.ms": 1000}),
                      [topic], sink, lock) for _ in range(2)]
    for m in members:
        m.start()
    try:
        records.produce(topic, 300)
        wait_for(lambda: sorted(len(m.assignment) for m in members) == [3, 3], 30, "3 each")
        before = move.wait_until_stable()
        events = [len(m.events) for m in members]
        # Another gateway loads the group from etcd and carries on with the same members,
        # epochs and partitions; and back.
        move.there_and_back(before, lambda: records.produce(topic, 300))
        wait_for(lambda: records.all_in(sink, lock), 60, "every record delivered")
        assert [m.events[n:] for m, n in zip(members, events)] == [[], []], \
            "a member's partitions moved while the coordinator did"
    finally:
        stop_all(members)
    assert not any(m.error for m in members), [m.error for m in members]
    assert_delivered_once(sink, records.total)


@pytest.mark.parametrize("strategy", ["cooperative-sticky", "range"])
def test_a_classic_group_is_upgraded_online_member_by_member(gw, strategy):
    topic = f"cg-upgrade-{uuid.uuid4().hex[:6]}"
    make_topic(gw.bootstrap, topic)
    group = f"g-{topic}"
    records = Records(gw.bootstrap, PARTITIONS, flush_timeout=20)
    sink: list = []
    lock = threading.Lock()
    classic_conf = {"bootstrap.servers": gw.bootstrap, "group.id": group, "group.protocol": "classic",
                    "partition.assignment.strategy": strategy,
                    "auto.offset.reset": "earliest", "enable.auto.commit": False,
                    "session.timeout.ms": 6000, "heartbeat.interval.ms": 500}
    members = [Member(classic_conf, [topic], sink, lock) for _ in range(3)]
    for m in members:
        m.start()
    all_members = list(members)
    try:
        records.produce(topic, 300)
        wait_for(lambda: sorted(len(m.assignment) for m in members) == [2, 2, 2], 30,
                 "3 classic members with 2 each")
        for i in range(3):
            # A rolling restart: the classic member stops, and comes back on the new protocol.
            members[i].stop_flag.set()
            members[i].join(20)
            members[i] = Member(consumer_conf(gw.bootstrap, group), [topic], sink, lock)
            all_members.append(members[i])
            members[i].start()
            records.produce(topic, 200)
            wait_for(lambda: sorted(len(m.assignment) for m in members) == [2, 2, 2], 40,
                     f"2 each after {i + 1} restarted")
            assert set().union(*(m.assignment for m in members)) == {(topic, p) for p in range(6)}
        admin = AdminClient({"bootstrap.servers": gw.bootstrap})
        listed = admin.list_consumer_groups(types={ConsumerGroupType.CONSUMER}).result(15)
        assert group in {g.group_id for g in listed.valid}
        d = admin.describe_consumer_groups([group])[group].result(15)
        assert d.type == ConsumerGroupType.CONSUMER and len(d.members) == 3
        wait_for(lambda: records.all_in(sink, lock), 60, "every record delivered")
    finally:
        stop_all(members)
    assert not any(m.error for m in all_members), [m.error for m in all_members]
    assert_delivered_once(sink, records.total)
