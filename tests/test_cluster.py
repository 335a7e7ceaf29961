"""Several gateways on one real etcd and one shared object store: leaders spread over the
live gateways, move when one dies (epoch bumped), and clients follow through metadata."""

from __future__ import annotations

import time
import uuid

from cluster_fixtures import etcd, leaders, start_cluster, wait_for  # noqa: F401 - etcd is a fixture
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def spread_cluster(gateway_factory, etcd, tmp_path, stem: str, **settings):
    """Three gateways and a topic of six partitions, two led by each: (gateways,
    bootstrap, topic)."""
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, **settings)
    bootstrap = ",".join(g.bootstrap for g in gws)
    topic = f"{stem}-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 6, 1)])[topic].result(20)
    wait_for(lambda: sorted(leaders(bootstrap, topic).values()) == [1, 1, 2, 2, 3, 3],
             what="two leaders on each of the three gateways")
    return gws, bootstrap, topic


def test_leaders_spread_and_fail_over(gateway_factory, etcd, tmp_path):
    gws, bootstrap, topic = spread_cluster(gateway_factory, etcd, tmp_path, "cluster")

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                  "message.timeout.ms": 60000})
    acked = []
    for i in range(600):
        p.produce(topic, value=f"{i:05d}".encode(), partition=i % 6,
                  on_delivery=lambda e, m: e is None and acked.append(m.value()))
        if i == 300:
            p.flush(30)
            gws[1].kill9()  # broker 2 dies; its partitions must move
    assert p.flush(60) == 0
    assert len(acked) == 600
    after = wait_for(lambda: (lambda m: m if 2 not in m.values() and -1 not in m.values() else None)(
        leaders(gws[0].bootstrap, topic)), what="leadership to leave the dead gateway")
    assert set(after.values()) <= {1, 3}

    c = Consumer({"bootstrap.servers": gws[0].bootstrap, "group.id": "v", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, part, 0) for part in range(6)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 600 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(m.value())
    c.close()
    assert sorted(got) == sorted(acked) and len(set(got)) == 600

    # The dead gateway comes back and gets a share of the leaders again.
    gws[1].start()
    wait_for(lambda: 2 in leaders(bootstrap, topic).values(), what="the restarted gateway to lead again")


def test_a_topic_created_through_one_gateway_is_known_to_the_others_at_once(gateway_factory, etcd, tmp_path):
    # Each gateway reloads its topic table every cluster tick; a request naming a topic the
    # table lacks reloads it at once, so a client that creates through one gateway and then
    # asks another is never told the topic does not exist.
    from raw_client import Raw
    from stratalog.gateway.protocol.catalog import ApiKey

    gws = start_cluster(gateway_factory, etcd, tmp_path, 2)
    first, other = Raw(gws[0].bootstrap), Raw(gws[1].bootstrap)
    try:
        for i in range(5):
            topic = f"seen-{i}-{uuid.uuid4().hex[:6]}"
            created = first.call(ApiKey.CREATE_TOPICS, 5, {
                "topics": [{"name": topic, "num_partitions": 2, "replication_factor": 1,
                            "assignments": [], "configs": []}], "timeout_ms": 30000, "validate_only": False})
            assert created.topics[0].error_code == 0
            meta = other.call(ApiKey.METADATA, 9, {"topics": [{"name": topic}],
                                                   "allow_auto_topic_creation": False,
                                                   "include_topic_authorized_operations": False})
            assert meta.topics[0].error_code == 0 and len(meta.topics[0].partitions) == 2
            grown = other.call(ApiKey.CREATE_PARTITIONS, 2, {
                "topics": [{"name": topic, "count": 3, "assignments": None}], "timeout_ms": 30000,
                "validate_only": False})
            assert grown.results[0].error_code == 0, grown.results[0].error_message
    finally:
        first.close()
        other.close()


def test_a_gateway_started_without_a_broker_id_keeps_the_one_it_was_given(gateway_factory, etcd, tmp_path):
    """The cluster gives an id to a gateway started without --broker-id; its data directory
    remembers it, so a restart comes back as the same broker (its partitions, replica
    lists and WAL objects name that id), as Kafka's generated broker.id does."""
    import re

    def node(gw) -> int:
        return int(re.search(r"node (\d+)\)", gw.banner).group(1))

    store = ["--coordinator", etcd.url, "--object-store", (tmp_path / "objects").as_uri()]
    first = gateway_factory(extra_args=store)
    second = gateway_factory(extra_args=store)
    ids = (node(first), node(second))
    assert ids[0] != ids[1]
    first.stop()
    first.start()
    second.kill9()
    second.start()
    assert (node(first), node(second)) == ids
    # A data directory that served another cluster is given a new id by this one.
    (second.data_dir / "broker.id").write_text(f"{ids[1]} another-cluster\n")
    second.stop()
    second.start()
    assert node(second) not in ids


def test_an_etcd_pause_past_every_lease_moves_no_leader(gateway_factory, etcd, tmp_path):
    """etcd paused (SIGSTOP) past the gateways' lease ends every lease when it resumes, and
    each gateway registers again; gateway 2, paused with it, comes back a moment later, so
    the controller first sees itself and one other. It waits a lease before judging who is
    gone: every partition keeps its leader and epoch (no client sees a move for an outage
    of the coordinator)."""
    import signal

    from cluster_fixtures import coordinator_snapshot

    lease_s = 6
    gws, _, topic = spread_cluster(gateway_factory, etcd, tmp_path, "pause",
                                   **{"broker.session.timeout.ms": lease_s * 1000})

    def states():
        snap = coordinator_snapshot(etcd.url)
        [info] = [i for i in snap["topics"].values() if i.name == topic]
        return {p: (st.leader, st.leader_epoch) for p, st in snap["states"][info.topic_id].items()}

    before = states()
    late = gws[1]
    late.proc.send_signal(signal.SIGSTOP)
    etcd.proc.send_signal(signal.SIGSTOP)
    try:
        time.sleep(lease_s + 2)
        etcd.proc.send_signal(signal.SIGCONT)
        wait_for(lambda: all("registering again" in g.log_path.read_text() for g in gws if g is not late), 30,
                 "gateways 1 and 3 to register again")
        time.sleep(0.5)  # the controller's passes see gateways 1 and 3 only
    finally:
        late.proc.send_signal(signal.SIGCONT)
    wait_for(lambda: "registering again" in late.log_path.read_text(), 30, "gateway 2 to register again")
    time.sleep(lease_s)  # past the controller's wait, and its passes after
    assert states() == before
    for gw in gws:
        assert gw.proc.poll() is None, gw.log_tail()


def test_a_group_left_empty_starts_its_offset_expiry_clock(gateway_factory, etcd, tmp_path):
    """The gateway runs offset expiry (tests/test_offset_expiry.py has its rules): a group
    whose consumer closed gets its clock in the coordinator, and one with a member does not."""
    from cluster_fixtures import coordinator_call

    [gw] = start_cluster(gateway_factory, etcd, tmp_path, 1, **{"offsets.retention.check.interval.ms": 200})
    topic = f"expiry-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    p = Producer({"bootstrap.servers": gw.bootstrap})
    p.produce(topic, value=b"x")
    assert p.flush(15) == 0

    def member(group: str) -> Consumer:
        c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False})
        c.subscribe([topic])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                c.commit(m, asynchronous=False)
                return c
        raise AssertionError("no record")
    gone, staying = f"gone-{topic}", f"staying-{topic}"
    member(gone).close()
    stays = member(staying)
    try:
        def clocks():
            keys = coordinator_call(etcd.url, lambda s: s.group_keys())
            return {g: k.empty_since_ms for g, k in keys.items() if g in (gone, staying)}
        wait_for(lambda: clocks().get(gone) is not None, 20, "the closed group's expiry clock")
        assert clocks()[staying] is None
    finally:
        stays.close()
