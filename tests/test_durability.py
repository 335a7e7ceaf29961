"""kill -9 of `stratalog serve` loses no acknowledged record (object store + coordinator
are the truth), and an idempotent producer retrying across a restart writes no duplicate."""

from __future__ import annotations

import shutil
import signal
import threading
import time
import uuid

import pytest

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

from cluster_fixtures import etcd  # noqa: E402,F401 - a fixture

PARTITIONS = 3


def _create(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(15)


def _read_all(bootstrap, topic) -> dict[int, list[tuple[int, bytes]]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "verify", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    out: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    eof = set()
    deadline = time.monotonic() + 60
    while len(eof) < PARTITIONS and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == ck.KafkaError._PARTITION_EOF:
                eof.add(m.partition())
                continue
            raise AssertionError(m.error())
        eof.discard(m.partition())
        out[m.partition()].append((m.offset(), m.value()))
    c.close()
    return out


def _stream_across_a_kill(gw, topic, conf, before_kill=lambda: None,
                          before_restart=lambda: None) -> dict[int, list[tuple[int, bytes]]]:
    """Produce numbered values until the gateway is killed mid-stream (`before_kill` runs
    just before), then restart it (`before_restart` runs just before); returns what was
    acked. The producer is dropped only once the gateway is back: librdkafka 2.16 can
    abort the process when a handle is destroyed while its broker threads are failing
    (thrd_is_current assertion in rd_kafka_broker_destroy_final, librdkafka issue 3608)."""
    acked: dict[int, list] = {p: [] for p in range(PARTITIONS)}
    lock = threading.Lock()
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all", "linger.ms": 2,
                  "message.timeout.ms": 4000, **conf})

    def done(err, msg):
        if err is None:
            with lock:
                acked[msg.partition()].append((msg.offset(), msg.value()))

    stop = threading.Event()

    def run():
        i = 0
        while not stop.is_set():
            try:
                p.produce(topic, value=f"{i:08d}".encode(), partition=i % PARTITIONS, on_delivery=done)
            except BufferError:
                p.poll(0.05)
                continue
            i += 1
            if i % 50 == 0:
                p.poll(0.005)
        p.flush(10)

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 20
    while sum(len(v) for v in acked.values()) < 2000 and time.monotonic() < deadline:
        time.sleep(0.05)
    before_kill()
    gw.kill9()
    stop.set()
    t.join(30)
    assert sum(len(v) for v in acked.values()) >= 2000, "the producer never got going"
    before_restart()
    gw.start()
    return acked


def _check(acked, found):
    for p in range(PARTITIONS):
        log = found[p]
        offsets = [o for o, _ in log]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        by_offset = dict(log)
        values = [v for _, v in log]
        for off, val in acked[p]:
            assert by_offset.get(off) == val, f"acknowledged record {p}/{off} lost"
        acked_values = [v for _, v in sorted(acked[p])]
        assert len(set(values)) == len(values), "a record is there twice"
        positions = [values.index(v) for v in acked_values]
        assert positions == sorted(positions), "acknowledged records out of order"


@pytest.mark.parametrize("flush_ms", [-1, 30], ids=["group-commit", "flushes-30ms-apart"])
@pytest.mark.parametrize("wipe_local", [False, True], ids=["restart", "restart-without-local-files"])
def test_kill9_keeps_every_acknowledged_record(gateway_factory, wipe_local, flush_ms):
    gw = gateway_factory(settings={"wal.flush.ms": flush_ms})
    topic = f"durable-{uuid.uuid4().hex[:6]}"
    _create(gw.bootstrap, topic)

    def wipe():
        if wipe_local:
            shutil.rmtree(gw.data_dir / "logs")

    acked = _stream_across_a_kill(gw, topic, {"retries": 0}, before_restart=wipe)
    found = _read_all(gw.bootstrap, topic)
    _check(acked, found)
    # New offsets continue after what is there.
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
    got = []
    p.produce(topic, value=b"after", partition=0, on_delivery=lambda e, m: got.append(m.offset()))
    p.flush(15)
    assert got == [found[0][-1][0] + 1 if found[0] else 0]


def test_a_gateway_killed_between_writing_a_flush_and_committing_it(gateway_factory, etcd, tmp_path):
    """etcd is paused (SIGSTOP) under load, so the gateway's next flush reaches the object
    store and waits on its commit; it is killed there. Every acknowledged record is back
    once, in order, and the flush's object is either committed (etcd may still apply a
    commit request the gateway had sent) or removed, never left behind."""
    from cluster_fixtures import coordinator_snapshot, start_cluster, wait_for

    [gw] = start_cluster(gateway_factory, etcd, tmp_path, 1)
    wal_root = tmp_path / "objects"
    topic = f"uncommitted-{uuid.uuid4().hex[:6]}"
    _create(gw.bootstrap, topic)

    def wal_objects() -> set[str]:
        return {f.relative_to(wal_root).as_posix() for f in (wal_root / "wal").rglob("*") if f.is_file()}

    caught: set[str] = set()

    def pause_commits():
        # An object written after etcd stopped is one the gateway has no commit answer
        # for. If etcd stopped while it owed the gateway a reply, no flush follows: let it
        # answer, and try again.
        for _ in range(5):
            before = wal_objects()
            etcd.proc.send_signal(signal.SIGSTOP)
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                caught.update(wal_objects() - before)
                if caught:
                    return
                time.sleep(0.05)
            etcd.proc.send_signal(signal.SIGCONT)
            time.sleep(0.5)
        raise AssertionError("no flush was written while etcd was paused")

    def resume_commits():
        etcd.proc.send_signal(signal.SIGCONT)

    try:
        acked = _stream_across_a_kill(gw, topic, {"retries": 0}, before_kill=pause_commits,
                                      before_restart=resume_commits)
    finally:
        resume_commits()
    _check(acked, _read_all(gw.bootstrap, topic))

    def left_behind() -> set[str]:
        return (caught & wal_objects()) - {o.key for o in coordinator_snapshot(etcd.url)["wal"]}
    wait_for(lambda: not left_behind(), 30, "the uncommitted WAL objects to be removed")


def test_idempotent_producer_retrying_across_restart_writes_no_duplicate(gateway_factory):
    gw = gateway_factory(settings={"wal.flush.ms": 30})
    topic = f"idem-{uuid.uuid4().hex[:6]}"
    _create(gw.bootstrap, topic)
    acked: list = []
    p = Producer({"bootstrap.servers": gw.bootstrap, "enable.idempotence": True, "linger.ms": 2,
                  "message.timeout.ms": 60000})

    def done(err, msg):
        assert err is None, err
        acked.append((msg.partition(), msg.offset(), msg.value()))

    n = 3000
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=f"{i:08d}".encode(), partition=i % PARTITIONS, on_delivery=done)
                break
            except BufferError:
                p.poll(0.05)
        if i == n // 2:
            p.poll(0)
            gw.kill9()
            time.sleep(0.5)
            gw.start()
    assert p.flush(60) == 0
    assert len(acked) == n
    found = _read_all(gw.bootstrap, topic)
    values = [v for p_ in range(PARTITIONS) for _, v in found[p_]]
    assert len(values) == len(set(values)) == n, "duplicates or losses after the restart"
    for part in range(PARTITIONS):
        vals = [int(v) for _, v in found[part]]
        assert vals == sorted(vals)
