"""The storage lifecycle through a real gateway: object layout and `segments dump`,
retention, DeleteRecords, topic deletion, WAL garbage collection and batch validation."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid

import pytest

from conftest import ROOT

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

FAST = {"log.roll.ms": 300, "log.retention.check.interval.ms": 200}
SEGMENT_KEY = re.compile(r"^topics/([a-zA-Z0-9._-]+)-([0-9a-f-]{36})/(\d+)/(\d{20})-(\d+)-(\w+)\.(log|index|timeindex)$")
WAL_KEY = re.compile(r"^wal/(\d+)/(\d{20})\.wal$")
MANIFEST_KEY = re.compile(r"^manifests/([a-zA-Z0-9._-]+)-([0-9a-f-]{36})/(\d+)/(\d{20})\.avro$")
SNAPSHOT_KEY = re.compile(r"^coordinator/(\d{20})\.backup$")  # the controller's coordinator snapshots


def objects(gw) -> list[str]:
    root = gw.data_dir / "objects"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".tmp" not in p.name)


def create(gw, topic, partitions=1, config=None):
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])[topic].result(15)


def produce(gw, topic, n, partition=0, size=100, **kw):
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all", "linger.ms": 2, **kw})
    for i in range(n):
        p.produce(topic, value=f"{i:06d}".encode() + b"x" * size, key=f"k{i}".encode(), partition=partition)
    assert p.flush(30) == 0


def wait_for(pred, timeout=30, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def consume_all(gw, topic, partition=0, start=0, timeout=20):
    c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "e2e", "enable.auto.commit": False,
                  "enable.partition.eof": True, "auto.offset.reset": "earliest"})
    c.assign([TopicPartition(topic, partition, start)])
    out = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.error().code() == KafkaError._PARTITION_EOF:
                break
            raise KafkaException(m.error())
        out.append((m.offset(), m.value()))
    c.close()
    return out


def test_objects_follow_the_layout_and_segments_dump_decodes_them(gateway_factory):
    gw = gateway_factory(settings=FAST)
    topic = f"layout-{uuid.uuid4().hex[:6]}"
    create(gw, topic, partitions=2)
    produce(gw, topic, 200, partition=0)
    produce(gw, topic, 50, partition=1)
    keys = wait_for(lambda: (lambda k: k if any(x.endswith(".timeindex") for x in k)
                             and any(x.startswith("manifests/") for x in k) else None)(objects(gw)),
                    what="a sealed segment and its manifest")
    for key in keys:
        assert SEGMENT_KEY.match(key) or WAL_KEY.match(key) or MANIFEST_KEY.match(key) \
            or SNAPSHOT_KEY.match(key), key
    seg = next(k for k in keys if k.endswith(".log"))
    m = SEGMENT_KEY.match(seg)
    assert m.group(1) == topic and int(m.group(4)) == 0
    for ext in (".index", ".timeindex"):
        assert seg[:-4] + ext in keys
    store = (gw.data_dir / "objects").as_uri()
    for key in [seg, seg[:-4] + ".index", seg[:-4] + ".timeindex",
                next(k for k in keys if k.startswith("manifests/"))]:
        proc = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "segments", "dump", key,
                               "--object-store", store, "--deep"], cwd=ROOT, capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()
        assert proc.stdout
    proc = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "segments", "dump", seg, "--print-records",
                           "--object-store", store], cwd=ROOT, capture_output=True)
    assert b"000199" in proc.stdout and b"k199" in proc.stdout
    # Records read back from the sealed segment (through its .index) are the ones written.
    got = consume_all(gw, topic)
    assert [o for o, _ in got] == list(range(200))


def test_wal_objects_are_collected_once_sealed(gateway_factory):
    gw = gateway_factory(settings=FAST)
    topic = f"walgc-{uuid.uuid4().hex[:6]}"
    create(gw, topic)
    produce(gw, topic, 100)
    wait_for(lambda: any(k.endswith(".log") for k in objects(gw)), what="a sealed segment")
    wait_for(lambda: not any(k.startswith("wal/") for k in objects(gw)), what="WAL garbage collection")
    assert len(consume_all(gw, topic)) == 100


def test_retention_bytes_drops_oldest_segments(gateway_factory):
    gw = gateway_factory(settings=FAST)
    topic = f"ret-{uuid.uuid4().hex[:6]}"
    create(gw, topic, config={"retention.bytes": "4000", "segment.ms": "200"})
    for _ in range(4):
        produce(gw, topic, 20, size=200)
        time.sleep(0.6)  # each round seals into its own segment
    wait_for(lambda: consume_all(gw, topic)[:1] and consume_all(gw, topic)[0][0] > 0,
             what="the oldest segments to be deleted")
    got = consume_all(gw, topic)
    assert got[-1][0] == 79
    offsets = [o for o, _ in got]
    assert offsets == list(range(offsets[0], 80))
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "lw"})
    low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    c.close()
    assert low == offsets[0] and high == 80
    del admin


def test_delete_records_moves_the_log_start(gateway_factory):
    gw = gateway_factory(settings=FAST)
    topic = f"delrec-{uuid.uuid4().hex[:6]}"
    create(gw, topic)
    produce(gw, topic, 50)
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    fut = admin.delete_records([TopicPartition(topic, 0, 30)])
    res = list(fut.values())[0].result(15)
    assert res.low_watermark == 30
    got = consume_all(gw, topic)  # auto.offset.reset=earliest after OFFSET_OUT_OF_RANGE at 0
    assert [o for o, _ in got] == list(range(30, 50))
    fut = admin.delete_records([TopicPartition(topic, 0, 99)])
    with pytest.raises(KafkaException):
        list(fut.values())[0].result(15)
    # After a restart the log start offset is still 30.
    gw.stop()
    gw.start()
    got = consume_all(gw, topic)
    assert got[0][0] == 30


def test_deleting_a_topic_removes_its_objects(gateway_factory):
    gw = gateway_factory(settings=FAST)
    topic = f"gone-{uuid.uuid4().hex[:6]}"
    create(gw, topic)
    produce(gw, topic, 50)
    wait_for(lambda: any(topic in k and k.endswith(".log") for k in objects(gw)), what="a segment")
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    admin.delete_topics([topic])[topic].result(15)
    wait_for(lambda: not any(topic in k for k in objects(gw)), what="the topic's objects to go")
    md = admin.list_topics(timeout=10)
    assert topic not in md.topics
    # The name can be used again, starting from offset 0.
    create(gw, topic)
    produce(gw, topic, 3)
    assert [o for o, _ in consume_all(gw, topic)] == [0, 1, 2]


def _produce_error(gw, topic, **kw):
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all", "message.timeout.ms": 10000,
                  "retries": 0, **{k: v for k, v in kw.items() if k != "records"}})
    errors = []
    for key, value in kw.get("records", [(None, b"v")]):
        p.produce(topic, value=value, key=key, on_delivery=lambda e, m: errors.append(e))
    p.flush(20)
    return errors


def test_batch_validation_errors(gateway_factory):
    gw = gateway_factory(settings={"message.max.bytes": 20000})
    compacted = f"compacted-{uuid.uuid4().hex[:6]}"
    create(gw, compacted, config={"cleanup.policy": "compact"})
    errors = _produce_error(gw, compacted, records=[(None, b"no key")])
    assert errors[0] is not None and errors[0].code() == KafkaError.INVALID_RECORD
    errors = _produce_error(gw, compacted, records=[(b"k", b"keyed")])
    assert errors == [None]
    big = f"big-{uuid.uuid4().hex[:6]}"
    create(gw, big)
    errors = _produce_error(gw, big, records=[(None, b"x" * 50000)], **{"message.max.bytes": 1000000})
    assert errors[0] is not None and errors[0].code() == KafkaError.MSG_SIZE_TOO_LARGE


def test_log_append_time(gateway_factory):
    gw = gateway_factory()
    topic = f"lat-{uuid.uuid4().hex[:6]}"
    create(gw, topic, config={"message.timestamp.type": "LogAppendTime"})
    p = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all"})
    before = int(time.time() * 1000)
    p.produce(topic, value=b"v", timestamp=1000)
    assert p.flush(15) == 0
    c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "lat"})
    c.assign([TopicPartition(topic, 0, 0)])
    m = wait_for(lambda: (lambda m: m if m is not None and not m.error() else None)(c.poll(0.5)))
    c.close()
    ts_type, ts = m.timestamp()
    assert ts_type == ck.TIMESTAMP_LOG_APPEND_TIME
    assert before - 1000 <= ts <= int(time.time() * 1000) + 1000
