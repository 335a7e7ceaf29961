"""Spark reads up to the high watermark: sealed segments, then the committed WAL ranges
after them, planned from the coordinator (the embedded one beside a `file://` data
directory by default, named by the `coordinator` option otherwise), on file:// and on S3.

Gateways here never roll by time (segment.ms stays at its default): segments seal by size,
so every topic has records sealed and records only in WAL objects."""

from __future__ import annotations

import shutil
from dataclasses import replace
import time
import uuid

import pytest

from conftest import GatewayProcess
from spark_helpers import (TRACE_FILE, Consumed, consume_all, create_topic, high_watermarks,
                           gateway_on_store, produce, read_slices_on_the_jvm, reader_format, reads_traced, rows_of,
                           spark_session)
from spark_helpers import fmt  # noqa: F401 - both readers, a fixture
from stratalog.spark.datasource import StratalogReader
from stratalog.spark.metadata import CoordinatorMetadata, ManifestMetadata, TopicNotFound
from stratalog.spark.objects import TRACE_ENV, ObjectNotFound, StoreSpec
from stratalog.spark.planning import SegmentSlice, WalSlice
from stratalog.spark.reading import CorruptSegment, read_input
from stratalog.tiering.txn import AbortedTxn

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition  # noqa: E402

SETTINGS = {"log.segment.bytes": 4000, "log.index.interval.bytes": 512,
            "log.retention.check.interval.ms": 300}
PARTITIONS = 2
BASE_TS = (int(time.time()) - 3600) * 1000


@pytest.fixture(scope="session")
def spark():
    return spark_session()


class Cluster:
    def __init__(self, gw: GatewayProcess, spec: StoreSpec, data, options: dict) -> None:
        self.gw, self.spec, self.data, self.options = gw, spec, data, options

    def reader(self, spark, topic: str, stream: bool = False, fmt: str = "stratalog", **options):
        reader = (spark.readStream if stream else spark.read).format(fmt).option("topic", topic)
        for k, v in {**self.options, **options}.items():
            reader = reader.option(k, v)
        return reader

    def plan_options(self, topic: str, **options) -> dict:
        return {"topic": topic, "path": self.spec.url, **self.options, **options}

    def snapshot(self, topic: str):
        return CoordinatorMetadata(str(self.data), topic).snapshot()


@pytest.fixture(scope="module", params=["file", "s3"])
def cluster(request, tmp_path_factory):
    data = tmp_path_factory.mktemp(f"wal-{request.param}") / "data"
    with gateway_on_store(request.param, data, SETTINGS, "wal") as (gw, spec, endpoint):
        # file://: no coordinator option, the embedded one beside <data>/objects is found.
        yield Cluster(gw, spec, data, {} if endpoint is None else
                      {"endpoint": endpoint, "pathStyle": "true", "coordinator": str(data)})


def _records(count: int, start: int = 0, size: int = 60):
    out = []
    for i in range(start, start + count):
        key = None if i % 11 == 0 else b"key-%d" % (i % 7)
        value = None if i % 13 == 0 else b"v%05d-" % i + b"x" * size
        headers = [[], [("a", b"1")], [("x", None), ("y", b""), ("x", b"dup")]][i % 3]
        out.append((i % PARTITIONS, key, value, headers, BASE_TS + i * 1000))
    return out


def _topic(cluster: Cluster, configs: dict | None = None) -> str:
    topic = f"wal-{uuid.uuid4().hex[:8]}"
    create_topic(cluster.gw.bootstrap, topic, PARTITIONS, configs)
    return topic


def _wait_segments(cluster: Cluster, topic: str, timeout_s: float = 30) -> None:
    """Until every partition has a sealed segment (the coordinator lists it)."""
    deadline = time.monotonic() + timeout_s
    while True:
        parts = cluster.snapshot(topic).partitions
        if all(parts[p].segments for p in range(PARTITIONS)):
            return
        assert time.monotonic() < deadline, f"{topic}: no segment sealed in {timeout_s} s"
        time.sleep(0.2)


def _stop_rolling(cluster: Cluster, topic: str) -> None:
    """Raise the topic's segment.bytes: a segment rolls after the append that fills it, so
    without this a tail produced next could be sealed whole, nothing left in WAL objects."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    admin = AdminClient({"bootstrap.servers": cluster.gw.bootstrap})
    change = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("segment.bytes", str(1 << 20), incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change], request_timeout=15)[change].result(15)


def test_batch_read_reaches_the_high_watermark_past_sealed_segments(spark, fmt, cluster):
    topic = _topic(cluster)
    produce(cluster.gw.bootstrap, topic, _records(240), batch_size=1024)
    _wait_segments(cluster, topic)
    _stop_rolling(cluster, topic)
    produce(cluster.gw.bootstrap, topic, _records(20, 240), batch_size=1024)
    truth = consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
    hw = high_watermarks(cluster.gw.bootstrap, topic, PARTITIONS)
    snap = cluster.snapshot(topic).partitions
    for p in range(PARTITIONS):  # some records sealed, the newest only in WAL objects
        part = snap[p]
        assert part.segments and part.wal and part.high_watermark == hw[p], \
            (p, part.sealed_end, [(w.base_offset, w.last_offset) for w in part.wal], part.high_watermark, hw[p])

    rows = rows_of(cluster.reader(spark, topic, fmt=fmt).load(cluster.spec.url))
    assert rows == truth
    # endingOffsets=latest (the default) is the high watermark a consumer sees.
    assert {p: 1 + max(r.offset for r in rows if r.partition == p) for p in range(PARTITIONS)} == hw
    middle = {p: (snap[p].sealed_end + hw[p]) // 2 for p in range(PARTITIONS)}
    ending = '{"%s": {"0": %d, "1": %d}}' % (topic, middle[0], middle[1])
    assert rows_of(cluster.reader(spark, topic, fmt=fmt, endingOffsets=ending).load(cluster.spec.url)) == \
        [r for r in truth if r.offset < middle[r.partition]]


def test_wal_reads_fetch_only_the_partitions_asked_for(spark, cluster):
    if cluster.spec.url.startswith("s3"):
        pytest.skip("the read trace is checked once, on file://")
    topic = _topic(cluster, {"segment.bytes": 1 << 20})
    produce(cluster.gw.bootstrap, topic, _records(60), batch_size=1024)
    truth = consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
    parts = cluster.snapshot(topic).partitions
    mine = [(w.key, w.position, w.position + w.length) for w in parts[0].wal]
    assert mine and not parts[0].segments
    with reads_traced() as reads:
        rows = rows_of(cluster.reader(spark, topic, assign='{"%s": [0]}' % topic).load(cluster.spec.url))
    assert rows == [r for r in truth if r.partition == 0]
    wal_reads = [r for r in reads if r[0].startswith("wal/")]
    assert wal_reads
    for key, start, end in wal_reads:  # ranged GETs inside partition 0's ranges only
        assert any(key == k and lo <= start < end <= hi for k, lo, hi in mine), (key, start, end)


def test_a_topic_with_nothing_sealed_is_read_not_refused(spark, fmt, cluster):
    topic = _topic(cluster, {"segment.bytes": 1 << 20})
    produce(cluster.gw.bootstrap, topic, _records(30))
    truth = consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
    with pytest.raises(TopicNotFound):
        ManifestMetadata(cluster.spec.open(), topic).snapshot()
    assert rows_of(cluster.reader(spark, topic, fmt=fmt).load(cluster.spec.url)) == truth


def test_stream_picks_up_wal_only_records_within_a_trigger(spark, cluster):
    topic = _topic(cluster, {"segment.bytes": 1 << 20})
    produce(cluster.gw.bootstrap, topic, _records(10))
    name = f"wal_{uuid.uuid4().hex[:8]}"
    query = (cluster.reader(spark, topic, stream=True, startingOffsets="earliest").load(cluster.spec.url)
             .writeStream.format("memory").queryName(name).trigger(processingTime="200 milliseconds").start())
    try:
        query.processAllAvailable()
        assert rows_of(spark.table(name)) == consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
        produce(cluster.gw.bootstrap, topic, _records(10, 10))
        truth = consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
        deadline = time.monotonic() + 30
        while len(rows := rows_of(spark.table(name))) < len(truth) and time.monotonic() < deadline:
            time.sleep(0.3)
        assert rows == truth
    finally:
        query.stop()


def _consumed(bootstrap: str, topic: str, isolation: str) -> list[Consumed]:
    """What a consumer of `isolation` reads from the start up to where it stops."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wal-{uuid.uuid4().hex[:6]}",
                  "isolation.level": isolation, "enable.auto.commit": False})
    out = []
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 30
        while True:
            positions = {tp.partition: tp.offset for tp in c.position(
                [TopicPartition(topic, p) for p in range(PARTITIONS)])}
            if all(positions[p] >= ends[p] for p in range(PARTITIONS)):
                break
            assert time.monotonic() < deadline, f"the {isolation} consumer did not reach {ends}"
            m = c.poll(0.3)
            if m is None or m.error():
                continue
            ts_type, ts = m.timestamp()
            out.append(Consumed(m.partition(), m.offset(), m.key(), m.value(), tuple(m.headers() or ()),
                                ts, 1 if ts_type == 2 else 0))
    finally:
        c.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def _transaction(producer: Producer, topic: str, tag: str, commit: bool | None) -> None:
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, key=b"%s-%d" % (tag.encode(), i), value=b"%s-%d" % (tag.encode(), i),
                         partition=i % PARTITIONS)
    producer.flush(30)
    if commit is True:
        producer.commit_transaction(30)
    elif commit is False:
        producer.abort_transaction(30)


def test_read_committed_hides_aborted_and_open_transactions_in_wal_ranges(spark, fmt, cluster):
    topic = _topic(cluster, {"segment.bytes": 1 << 20})
    bootstrap = cluster.gw.bootstrap
    one = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-1", "linger.ms": 5})
    two = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-2", "linger.ms": 5})
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for p in (one, two):
        p.init_transactions(30)
    _transaction(one, topic, "committed", True)
    _transaction(two, topic, "aborted", False)
    for i in range(4):
        plain.produce(topic, value=b"plain-%d" % i, partition=i % PARTITIONS)
    plain.flush(30)
    _transaction(two, topic, "open", None)  # left open: read_committed stops at its first offset
    for i in range(4):
        plain.produce(topic, value=b"after-open-%d" % i, partition=i % PARTITIONS)
    plain.flush(30)
    assert not any(s.segments for s in cluster.snapshot(topic).partitions.values())

    def spark_rows(isolation: str):
        return rows_of(cluster.reader(spark, topic, fmt=fmt, **{"kafka.isolation.level": isolation})
                       .load(cluster.spec.url))

    committed = _consumed(bootstrap, topic, "read_committed")
    values = {r.value for r in committed}
    assert b"committed-0" in values and b"plain-0" in values
    assert not any(v.startswith((b"aborted", b"open", b"after-open")) for v in values)
    assert spark_rows("read_committed") == committed
    assert spark_rows("read_uncommitted") == _consumed(bootstrap, topic, "read_uncommitted")

    two.commit_transaction(30)
    committed = _consumed(bootstrap, topic, "read_committed")
    assert sum(r.value.startswith(b"open") for r in committed) == 6
    assert spark_rows("read_committed") == committed


def _collect_planned_wal(cluster: Cluster, topic: str):
    """Plans a read of a topic whose records are all in WAL objects, then produces until
    those objects are collected (their ranges sealed); returns the Python reader's plan
    and its WAL slices."""
    produce(cluster.gw.bootstrap, topic, _records(16))
    planned = StratalogReader(cluster.plan_options(topic)).partitions()
    wal_slices = [s for s in planned if isinstance(s, WalSlice)]
    assert wal_slices and not any(isinstance(s, SegmentSlice) for s in planned)
    # More records roll the segments by size: the planned ranges seal and their WAL
    # objects are collected.
    produce(cluster.gw.bootstrap, topic, _records(120, 16))
    store = cluster.spec.open()
    deadline = time.monotonic() + 60
    for key in {s.key for s in wal_slices}:
        while True:
            try:
                store.get(key, 0, 1)
            except ObjectNotFound:
                break
            assert time.monotonic() < deadline, f"WAL object {key} was never collected"
            time.sleep(0.2)
    return planned, wal_slices


def test_a_wal_object_collected_after_planning_is_read_from_its_segment(cluster):
    topic = _topic(cluster, {"segment.bytes": 3000})
    planned, wal_slices = _collect_planned_wal(cluster, topic)
    truth = consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
    ends = {s.partition: s.end_offset for s in wal_slices}
    rows = [row for s in planned for batch in read_input(s, cluster.spec) for row in batch.to_pylist()]
    assert sorted((r["partition"], r["offset"], r["value"]) for r in rows) == \
        [(r.partition, r.offset, r.value) for r in truth if r.offset < ends.get(r.partition, 0)]


def test_the_jvm_reader_replans_a_collected_wal_object_from_its_segment(spark, cluster):
    """The JVM reader meets the same race: its slices (planned by `jvm_plan` before the
    collection) are read afterwards by `ReadSlices`, the reader without Spark."""
    from stratalog.spark.jvm_plan import describe

    reader_format("stratalog-jvm")
    topic = _topic(cluster, {"segment.bytes": 3000})
    options = cluster.plan_options(topic)
    store = cluster.spec.open()
    planned, wal_slices = _collect_planned_wal(cluster, topic)
    out = read_slices_on_the_jvm([describe(s, store) for s in planned], options)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    rows = []
    for line in out.stdout.decode().splitlines():
        partition, offset, _, value = line.split()
        rows.append((int(partition), int(offset), None if value == "-" else bytes.fromhex(value)))
    truth = consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
    ends = {s.partition: s.end_offset for s in wal_slices}
    assert rows and sorted(rows) == [(r.partition, r.offset, r.value) for r in truth
                                     if r.offset < ends.get(r.partition, 0)]


def test_a_corrupt_wal_range_raises_naming_object_and_offset(cluster, tmp_path):
    if cluster.spec.url.startswith("s3"):
        pytest.skip("the damaged copy is made on file://")
    topic = _topic(cluster, {"segment.bytes": 1 << 20})
    produce(cluster.gw.bootstrap, topic, _records(10))
    consume_all(cluster.gw.bootstrap, topic, PARTITIONS)
    part = cluster.snapshot(topic).partitions[0].wal[0]
    copy = tmp_path / "objects"
    shutil.copytree(cluster.data / "objects", copy)
    path = copy / part.key
    raw = bytearray(path.read_bytes())
    raw[part.position + part.length - 3] ^= 0x40  # inside the range's last record
    path.write_bytes(bytes(raw))
    spec = StoreSpec(copy.as_uri())
    reader = StratalogReader({"topic": topic, "path": spec.url, "coordinator": str(cluster.data),
                              "assign": '{"%s": [0]}' % topic})
    with pytest.raises(CorruptSegment, match=rf"{part.key} batch at byte \d+ \(offset \d+\)"):
        for s in reader.partitions():
            for _ in read_input(s, spec):
                pass


@pytest.mark.unit
def test_the_coordinator_option_is_found_named_or_refused(tmp_path):
    from stratalog.coordinator.embedded import DB_FILE
    from stratalog.spark.options import OptionError, parse_options

    objects = tmp_path / "data" / "objects"
    objects.mkdir(parents=True)
    base = {"topic": "t", "path": objects.as_uri()}
    assert parse_options(base).coordinator is None  # no embedded coordinator beside the objects
    (tmp_path / "data" / DB_FILE).write_bytes(b"")
    assert parse_options(base).coordinator == str(tmp_path / "data")
    assert parse_options({**base, "coordinator": "none"}).coordinator is None
    assert parse_options({**base, "coordinator": "etcd://127.0.0.1:2379"}).coordinator == "etcd://127.0.0.1:2379"
    assert parse_options({**base, "coordinator": (tmp_path / "x").as_uri()}).coordinator == str(tmp_path / "x")
    s3 = {"topic": "t", "path": "s3://bucket/prefix"}
    assert parse_options(s3).coordinator is None
    for bad in ("http://host:1", "relative/dir"):
        with pytest.raises(OptionError, match="option coordinator"):
            parse_options({**s3, "coordinator": bad})


@pytest.mark.unit
def test_read_committed_planning_finds_wal_transactions(tmp_path, monkeypatch):
    """A transaction open where the sealed data ended and aborted in a WAL range, one
    aborted and one committed inside the WAL ranges, one still open: planning skips the
    aborted ones' batches, stops at the open one's first offset, and reads only the
    partition's byte range of each WAL object."""
    from stratalog.spark.metadata import PartitionSnapshot, TopicSnapshot, WalPart
    from stratalog.spark.options import parse_options
    from stratalog.spark.planning import first_offset_at, plan
    from stratalog.tiering.batch import build_batch
    from stratalog.tiering.txn import marker_batch
    from stratalog.tiering.wal import WalBuilder

    topic_id = uuid.uuid4()
    next_offset = 10

    def batch(pid: int, *, commit: bool | None = None, txn: bool = True) -> tuple[int, bytes]:
        nonlocal next_offset
        if commit is not None:
            data = marker_batch(pid, 0, commit=commit, coordinator_epoch=0,
                                timestamp_ms=BASE_TS + next_offset * 1000)
        else:
            data = build_batch([(b"k", b"p%d-%d" % (pid, next_offset))], base_offset=next_offset,
                               timestamp_ms=BASE_TS + next_offset * 1000, producer_id=pid, producer_epoch=0,
                               base_sequence=0, is_transactional=txn)
        data = bytearray(data)
        data[0:8] = next_offset.to_bytes(8, "big")  # the offset a leader assigns (outside the CRC)
        next_offset += 1
        return next_offset - 1, bytes(data)

    flushes = [[batch(5), batch(7), batch(-1, txn=False)],           # 5 open since the segments
               [batch(7, commit=False), batch(8), batch(5, commit=False)],
               [batch(8, commit=True), batch(9), batch(-1, txn=False)]]  # 9 left open
    objects = tmp_path / "objects"
    parts = []
    for n, flush in enumerate(flushes):
        wal = WalBuilder()
        other = build_batch([(b"o", b"other partition")], base_offset=n)
        wal.add(topic_id, 1, n, n, BASE_TS, other)  # another partition's range in the same object
        for offset, data in flush:
            wal.add(topic_id, 0, offset, offset, BASE_TS + offset * 1000, data)
        raw, infos = wal.build()
        key = f"wal/1/{n:020d}.wal"
        (objects / "wal" / "1").mkdir(parents=True, exist_ok=True)
        (objects / key).write_bytes(raw)
        mine = next(i for i in infos if i.partition == 0)
        parts.append(WalPart(key, mine.base_offset, mine.last_offset, mine.position, mine.length,
                             mine.max_timestamp))
    snap = PartitionSnapshot(0, 10, (), wal=tuple(parts), open_txns=((5, 3),))
    options = parse_options({"topic": "t", "path": objects.as_uri(), "coordinator": str(tmp_path),
                             "kafka.isolation.level": "read_committed"})
    from stratalog.spark.walread import scan_transactions

    store = options.store.open()
    scanned = scan_transactions(snap, store)
    assert scanned.wal_aborted == (AbortedTxn(7, 11, 13), AbortedTxn(5, 3, 15))
    assert scanned.wal_open_txn_offset == 17 and scanned.stable_end == 17
    assert scanned.high_watermark == 19
    # A stream's next trigger continues its last scan: only the newly committed range is read.
    monkeypatch.setenv(TRACE_ENV, str(TRACE_FILE))
    earlier = scan_transactions(replace(snap, wal=tuple(parts[:2])), store)
    assert earlier.wal_open_txn_offset == 14
    with reads_traced() as reads:
        assert scan_transactions(snap, store, earlier) == scanned
    assert reads and {key for key, _, _ in reads} == {parts[2].key}
    with reads_traced() as reads:
        rows = [r for s in plan(TopicSnapshot("t", topic_id, {0: scanned}), options, store)
                for b in read_input(s, options.store) for r in b.to_pylist()]
    assert [(r["offset"], r["value"]) for r in rows] == [(12, b"p-1-12"), (14, b"p8-14")]
    assert reads
    for key, start, end in reads:
        part = next(p for p in parts if p.key == key)
        assert part.position <= start < end <= part.position + part.length
    # A stream's startingTimestamp finds its offset in the WAL ranges too.
    assert first_offset_at(scanned, options, BASE_TS + 13_500, store) == 14  # 13 is a marker
    uncommitted = replace(options, read_committed=False)
    assert first_offset_at(scanned, uncommitted, BASE_TS + 10_500, store) == 11
    assert first_offset_at(scanned, uncommitted, BASE_TS + 99_000, store) == 19
