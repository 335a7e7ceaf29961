"""kafka-python against a real `stratalog serve`: the shared scenario, every codec."""

from __future__ import annotations

import time
import uuid
import zlib

import pytest

pytest.importorskip("kafka", reason="kafka-python is not installed")
from kafka import ConsumerRebalanceListener, KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402
from kafka import codec as kcodec  # noqa: E402
from kafka.admin import KafkaAdminClient, NewTopic  # noqa: E402


from cluster_fixtures import etcd  # noqa: E402,F401 - a fixture
from .scenario import CODECS, records  # noqa: E402
from .stored_batches import CODEC_IDS, stored_codecs  # noqa: E402

# kafka-python compresses through optional packages; a codec whose package is absent is
# skipped with the package to install.
CODEC_PACKAGE = {"gzip": (kcodec.has_gzip, "stdlib"), "snappy": (kcodec.has_snappy, "python-snappy"),
                 "lz4": (kcodec.has_lz4, "lz4"), "zstd": (kcodec.has_zstd, "zstandard")}


def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    try:
        admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)],
                            timeout_ms=15000)
    finally:
        admin.close()


def produce(bootstrap: str, topic: str, rows, codec: str, partition: int = 0,
            timestamps: list[int] | None = None) -> list[int]:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                             compression_type=None if codec == "none" else codec)
    try:
        futures = [producer.send(topic, value=value, key=key, headers=headers or None,
                                 partition=partition,
                                 timestamp_ms=timestamps[i] if timestamps else None)
                   for i, (key, value, headers) in enumerate(rows)]
        producer.flush(30)
        return [f.get(timeout=30).offset for f in futures]
    finally:
        producer.close(timeout=10)


def consume(consumer: KafkaConsumer, n: int, timeout: float = 30.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        for batch in consumer.poll(timeout_ms=500).values():
            out.extend(batch)
    return out


def as_rows(msgs):
    return [(m.key, m.value, list(m.headers or [])) for m in msgs]


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume_by_assignment(gateway, codec):
    if codec != "none":
        available, package = CODEC_PACKAGE[codec]
        if not available():
            pytest.skip(f"kafka-python needs the '{package}' package for {codec}")
    topic = f"kp-{codec}-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic)
    rows = records(codec)
    offsets = produce(gateway.bootstrap, topic, rows, codec)
    assert offsets == list(range(len(rows)))
    assert set(stored_codecs(gateway.bootstrap, topic)) == {CODEC_IDS[codec]}
    consumer = KafkaConsumer(bootstrap_servers=gateway.bootstrap, enable_auto_commit=False,
                             auto_offset_reset="earliest")
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek(tp, 0)
    msgs = consume(consumer, len(rows))
    consumer.close()
    assert [m.offset for m in msgs] == list(range(len(rows)))
    assert as_rows(msgs) == rows


def test_group_commit_and_resume(gateway):
    topic = f"kp-group-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic, partitions=3)
    rows = [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(30)]
    for p in range(3):
        produce(gateway.bootstrap, topic, rows[p::3], "none", partition=p)
    conf = dict(bootstrap_servers=gateway.bootstrap, group_id=f"g-{topic}",
                auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000,
                heartbeat_interval_ms=1000, max_poll_records=4)
    first_consumer = KafkaConsumer(topic, **conf)
    first = consume(first_consumer, 12)
    assert len(first) >= 12
    first_consumer.commit()
    committed = {tp: first_consumer.committed(tp) for tp in first_consumer.assignment()}
    first_consumer.close()
    assert sum(committed.values()) == len(first)

    second_consumer = KafkaConsumer(topic, **conf)
    rest = consume(second_consumer, 30 - len(first))
    time.sleep(0.5)  # anything past the committed offsets that would be re-read shows up here
    rest += consume(second_consumer, 1, timeout=0.5)
    second_consumer.commit()
    second_consumer.close()
    seen = sorted(m.value for m in first + rest)
    assert seen == sorted(v for _, v, _ in rows)  # nothing lost, nothing twice


def test_seek_by_timestamp(gateway):
    topic = f"kp-ts-{uuid.uuid4().hex[:6]}"
    create_topic(gateway.bootstrap, topic)
    base = 1_700_000_000_000
    rows = [(None, f"v{i}".encode(), []) for i in range(10)]
    produce(gateway.bootstrap, topic, rows, "none", timestamps=[base + i * 1000 for i in range(10)])
    consumer = KafkaConsumer(bootstrap_servers=gateway.bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    found = consumer.offsets_for_times({tp: base + 4500})
    assert found[tp].offset == 5 and found[tp].timestamp == base + 5000
    assert consumer.offsets_for_times({tp: base + 99_000})[tp] is None  # past the end
    assert consumer.beginning_offsets([tp])[tp] == 0
    assert consumer.end_offsets([tp])[tp] == 10
    consumer.assign([tp])
    consumer.seek(tp, found[tp].offset)
    msgs = consume(consumer, 5)
    consumer.close()
    assert [m.value for m in msgs] == [f"v{i}".encode() for i in range(5, 10)]
    assert [m.timestamp for m in msgs] == [base + i * 1000 for i in range(5, 10)]


def test_a_group_keeps_its_generation_when_its_coordinator_moves(gateway_factory, etcd, tmp_path):
    # Its own 2-gateway cluster on etcd: the coordinating gateway stops and comes back.
    from cluster_fixtures import start_cluster

    gws = start_cluster(gateway_factory, etcd, tmp_path, 2)
    bootstrap = ",".join(g.bootstrap for g in gws)
    # A group the second gateway coordinates while both are up (the first when alone).
    group = next(g for g in (f"kp-move-{uuid.uuid4().hex[:8]}" for _ in range(100))
                 if zlib.crc32(g.encode()) % 2 == 1)
    topic = f"kp-move-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=2)
    moves: list[tuple[str, set]] = []

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            moves.append(("revoked", set(revoked)))

        def on_partitions_assigned(self, assigned):
            moves.append(("assigned", set(assigned)))

    # A session long enough to find the other gateway after the coordinator went away.
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=30_000, heartbeat_interval_ms=1000,
                             request_timeout_ms=40_000)
    consumer.subscribe([topic], listener=Listener())
    sent = 0
    seen: list[bytes] = []

    def round_trip(n: int) -> None:
        nonlocal sent
        rows = [(None, f"v{i}".encode(), []) for i in range(sent, sent + n)]
        for p in range(2):
            produce(bootstrap, topic, rows[p::2], "none", partition=p)
        sent += n
        deadline = time.monotonic() + 60
        while len(seen) < sent and time.monotonic() < deadline:
            for msgs in consumer.poll(timeout_ms=500).values():
                seen.extend(m.value for m in msgs)
        consumer.commit()  # at the generation the coordinator must still know

    try:
        round_trip(10)
        stable = consumer._coordinator.generation_if_stable()
        generation = (stable.generation_id, stable.member_id)
        assert moves[-1] == ("assigned", {TopicPartition(topic, 0), TopicPartition(topic, 1)})
        before = len(moves)
        gws[1].stop()
        round_trip(10)
        gws[1].start()
        round_trip(10)
        stable = consumer._coordinator.generation_if_stable()
        assert (stable.generation_id, stable.member_id) == generation
        assert moves[before:] == [], "the group rebalanced while its coordinator moved"
    finally:
        consumer.close()
    assert sorted(seen) == sorted(f"v{i}".encode() for i in range(sent))


def test_log_dirs_report_each_led_partitions_size_once(gateway_factory, etcd, tmp_path):
    """DescribeLogDirs (kafka-log-dirs.sh; admin UIs' topic sizes) through kafka-python on
    two gateways: each reports the partitions it leads, with their bytes, in one log
    directory (its data directory), so the sizes add up to the topic's once."""
    from cluster_fixtures import leaders, start_cluster

    gws = start_cluster(gateway_factory, etcd, tmp_path, 2)
    bootstrap = ",".join(g.bootstrap for g in gws)
    topic, other = f"kp-dirs-{uuid.uuid4().hex[:6]}", f"kp-dirs-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, partitions=4)
    create_topic(bootstrap, other, partitions=1)
    for p in range(4):
        produce(bootstrap, topic, [(None, b"v" * 1000, [])] * (p + 1), "none", partition=p)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    try:
        reports = admin.describe_log_dirs({topic: [0, 1, 2, 3]})
        everything = admin.describe_log_dirs()
    finally:
        admin.close()
    sizes, dirs = {}, set()
    for report in reports:
        for log_dir in report["log_dirs"]:
            assert log_dir["error_code"] == 0
            dirs.add(log_dir["log_dir"])
            for t in log_dir["topics"]:
                assert t["name"] == topic
                for part in t["partitions"]:
                    assert part["partition_index"] not in sizes  # once, by its leader
                    sizes[part["partition_index"]] = part["partition_size"]
    assert dirs == {str(gw.data_dir) for gw in gws}
    assert set(sizes) == {0, 1, 2, 3}
    # Each batch of n 1000-byte records is a little over n KB; more records, more bytes.
    assert all(1000 * (p + 1) < sizes[p] < 1000 * (p + 1) + 200 for p in range(4)), sizes
    named = {t["name"] for r in everything for d in r["log_dirs"] for t in d["topics"]}
    assert {topic, other} <= named
    assert set(leaders(bootstrap, topic).values()) == {1, 2}  # both gateways answered some
