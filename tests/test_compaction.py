"""Compaction on Spark: Kafka's guarantees as confluent-kafka sees them, the swap through
the leader gateway (and its 409), and the segment rewrite byte by byte."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest

from stratalog.spark.compaction import (CompactionError, Group, Settings, compact, plan_compaction, rewrite,
                              rewrite_group, swap)
from stratalog.spark.objects import StoreSpec
from stratalog.spark.planning import SegmentSlice
from stratalog.spark.reading import read_slice
from spark_helpers import consume_all, create_topic, produce, spark_session, wait_sealed
from stratalog.tiering import layout
from stratalog.tiering.batch import BatchHeader, build_batch, decode_records, scan_batches
from stratalog.tiering.compression import GZIP, LZ4
from stratalog.tiering.index import OffsetIndex, TimeIndex
from stratalog.tiering.manifest import SegmentRecord
from stratalog.tiering.segment import ActiveSegment

HOUR = 3_600_000
COMPACT = {"cleanup.policy": "compact", "segment.bytes": 3000, "delete.retention.ms": HOUR,
           "min.compaction.lag.ms": 0, "index.interval.bytes": 256}
SETTINGS = {"log.roll.ms": 400}


@pytest.fixture(scope="session")
def spark():
    return spark_session()


# ---- the rewrite of one group, without Spark -----------------------------------------


def _segment(store_root: Path, topic_id: uuid.UUID, batches: list[bytes], now_ms: int) -> SegmentRecord:
    """Write batches as a sealed segment object with sidecars, as a gateway uploads it."""
    first = BatchHeader.parse(batches[0]).base_offset
    work = store_root.parent / f"work-{first}"
    seg = ActiveSegment.create(work, first, index_interval_bytes=64, now_ms=now_ms)
    for b in batches:
        seg.append(b)
    sealed = seg.seal()
    key_base = layout.segment_key_base("t", topic_id, 0, first, 3, uuid.uuid4().hex)
    target = store_root / key_base
    target.parent.mkdir(parents=True, exist_ok=True)
    Path(str(target) + ".log").write_bytes(sealed.log_path.read_bytes())
    Path(str(target) + ".index").write_bytes(sealed.index_bytes)
    Path(str(target) + ".timeindex").write_bytes(sealed.timeindex_bytes)
    seg.close()
    return SegmentRecord(first, sealed.last_offset, key_base, sealed.size, sealed.min_timestamp,
                         sealed.max_timestamp, 3)


def test_rewrite_keeps_offsets_order_headers_codecs_and_last_offset(tmp_path):
    root = tmp_path / "objects"
    root.mkdir()
    tid = uuid.uuid4()
    t0 = 1_700_000_000_000
    headers = [("h", b"1"), ("n", None)]
    b1 = build_batch([(b"a", b"a0", headers), (b"b", b"b0", []), (b"a", b"a1", [])], base_offset=0,
                     timestamps=[t0, t0 + 1, t0 + 2], compression=GZIP, producer_id=7,
                     producer_epoch=1, base_sequence=0, partition_leader_epoch=3)
    control = build_batch([(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x00", [])], base_offset=3,
                          timestamps=[t0 + 3], is_control=True, is_transactional=True, producer_id=7)
    b2 = build_batch([(b"c", b"c0", []), (b"b", None, [])], base_offset=4, timestamps=[t0 + 4, t0 + 5],
                     compression=LZ4)
    b3 = build_batch([(b"c", b"c1", [])], base_offset=6, timestamps=[t0 + 6])
    seg1 = _segment(root, tid, [b1, control], t0)
    seg2 = _segment(root, tid, [b2, b3], t0)
    group = Group(0, 0, (seg1, seg2), layout.segment_key_base("t", tid, 0, 0, 3, "new1"))
    store = StoreSpec(root.as_uri()).open()
    keep = {1, 5}  # b0 then a1; the tombstone of b; c's newest (6) is dropped to test the tail
    row = rewrite_group(store, group, keep, 64, tmp_path, now_ms=t0)
    assert (row["base_offset"], row["last_offset"], row["records_in"], row["records_out"]) == (0, 6, 6, 2)
    assert not row["unchanged"]

    log = (root / (group.key_base + ".log")).read_bytes()
    assert len(log) == row["size"]
    batches, valid = scan_batches(log, validate_crc=True)
    assert valid == len(log)
    headers_of = [h for _, h in batches]
    # b1 rebuilt (gzip kept, last offset delta kept), control copied, b2 rebuilt (lz4),
    # b3 emptied but kept so the segment still ends at offset 6.
    assert [(h.base_offset, h.last_offset, h.records_count, h.compression) for h in headers_of] == [
        (0, 2, 1, GZIP), (3, 3, 1, 0), (4, 5, 1, LZ4), (6, 6, 0, 0)]
    assert headers_of[0].producer_id == 7 and headers_of[0].base_sequence == 0
    assert headers_of[0].partition_leader_epoch == 3
    assert log[batches[1][0]:batches[1][0] + headers_of[1].size] == control  # byte for byte
    first = decode_records(log[:headers_of[0].size])
    assert [(r.offset, r.key, r.value, r.timestamp) for r in first] == [(1, b"b", b"b0", t0 + 1)]

    # The sidecars index the new file, and the reader returns exactly the survivors.
    index = OffsetIndex.from_bytes(0, (root / (group.key_base + ".index")).read_bytes())
    starts = {pos for pos, _ in batches}
    assert all(pos in starts for _, pos in index.entries())
    TimeIndex.from_bytes(0, (root / (group.key_base + ".timeindex")).read_bytes())
    s = SegmentSlice(topic="t", partition=0, key_base=group.key_base, base_offset=0, last_offset=6,
                     size=row["size"], min_timestamp=row["min_timestamp"], start_offset=0, end_offset=7)
    rows = [r for b in read_slice(s, StoreSpec(root.as_uri())) for r in b.to_pylist()]
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [(1, b"b", b"b0"), (5, b"b", None)]


def test_rewrite_that_removes_nothing_uploads_nothing(tmp_path):
    root = tmp_path / "objects"
    root.mkdir()
    tid = uuid.uuid4()
    seg = _segment(root, tid, [build_batch([(b"k", b"v", [])], base_offset=0, timestamps=[1])], 1)
    group = Group(0, 0, (seg,), layout.segment_key_base("t", tid, 0, 0, 3, "same"))
    row = rewrite_group(StoreSpec(root.as_uri()).open(), group, {0}, 64, tmp_path, now_ms=1)
    assert row["unchanged"]
    assert not (root / (group.key_base + ".log")).exists()


def test_corrupt_input_segment_stops_the_rewrite(tmp_path):
    root = tmp_path / "objects"
    root.mkdir()
    tid = uuid.uuid4()
    seg = _segment(root, tid, [build_batch([(b"k", b"v", [])] * 3, base_offset=0, timestamps=[1, 2, 3])], 1)
    path = root / (seg.key_base + ".log")
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x55
    path.write_bytes(bytes(data))
    group = Group(0, 0, (seg,), layout.segment_key_base("t", tid, 0, 0, 3, "bad"))
    with pytest.raises(ValueError, match="CRC"):
        rewrite_group(StoreSpec(root.as_uri()).open(), group, {2}, 64, tmp_path, now_ms=1)
    assert not (root / (group.key_base + ".log")).exists()


def test_settings_refuse_non_compacted_topics():
    with pytest.raises(CompactionError, match="cleanup.policy=delete"):
        Settings.from_configs({"cleanup.policy": "delete"})
    with pytest.raises(CompactionError, match="not a whole number"):
        Settings.from_configs({"cleanup.policy": "compact", "delete.retention.ms": "soon"})
    assert Settings.from_configs({"cleanup.policy": "compact,delete"}).delete_retention_ms == 86_400_000


# ---- against a gateway ---------------------------------------------------------------


def _history(now_ms: int):
    """Keys k00..k29 rewritten six times long ago, then tombstones and fresh values.

    Expected after compaction: k00-k04 gone (old tombstones), k05-k09 only their recent
    tombstone, k10-k19 the value of round 5, k20-k29 their fresh value."""
    old = now_ms - 3 * HOUR
    records = []
    for rnd in range(6):
        for k in range(30):
            records.append((0, b"k%02d" % k, b"r%d-%02d" % (rnd, k), [("round", b"%d" % rnd)], old + rnd * 1000 + k))
    records += [(0, b"k%02d" % k, None, [], now_ms - 2 * HOUR) for k in range(5)]
    records += [(0, b"k%02d" % k, None, [], now_ms - 60_000) for k in range(5, 10)]
    records += [(0, b"k%02d" % k, b"fresh-%02d" % k, [], now_ms - 30_000) for k in range(20, 30)]
    return records


def _latest(truth):
    out = {}
    for r in truth:
        out[r.key] = r
    return out


def _consume_forever(bootstrap: str, topic: str, stop: threading.Event, problems: list, passes: list):
    """Re-read the partition from the start until told to stop; record anything invalid."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"swap-{uuid.uuid4()}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    try:
        while not stop.is_set():
            end = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[1]
            c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
            last, deadline = -1, time.monotonic() + 30
            while last + 1 < end and time.monotonic() < deadline:
                msg = c.poll(0.2)
                if msg is None:
                    continue
                if msg.error():
                    problems.append(str(msg.error()))
                    continue
                if msg.offset() <= last:
                    problems.append(f"offset {msg.offset()} after {last}")
                last = msg.offset()
            if last + 1 < end:
                problems.append(f"pass stopped at {last} of {end}")
            passes.append(last)
    finally:
        c.close()


def test_compaction_gives_kafka_guarantees_and_readers_see_a_valid_log(spark, gateway_factory):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "users", 1, COMPACT)
    now_ms = int(time.time() * 1000)
    produce(gw.bootstrap, "users", _history(now_ms), compression="lz4", batch_size=600)
    before = consume_all(gw.bootstrap, "users", 1)
    assert len(before) == 200
    wait_sealed(spec, "users", {0: before[-1].offset + 1})

    stop, problems, passes = threading.Event(), [], []
    reader = threading.Thread(target=_consume_forever, args=(gw.bootstrap, "users", stop, problems, passes))
    reader.start()
    try:
        report = compact(spark, spec.url, "users", gw.http_url, bootstrap=gw.bootstrap)
        time.sleep(1.0)  # let the reader make passes over the swapped log too
        passes_at_swap = len(passes)
        deadline = time.monotonic() + 30
        while len(passes) < passes_at_swap + 2 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        stop.set()
        reader.join(60)
    assert report.ok, report.results
    (result,) = report.results
    assert result.status == "compacted" and result.records_in == 200
    assert not problems, problems[:5]
    assert len(passes) >= 2

    after = consume_all(gw.bootstrap, "users", 1)
    latest = _latest(before)
    expected = [r for k, r in sorted(latest.items(), key=lambda kv: kv[1].offset)
                if not (r.value is None and r.timestamp < now_ms - HOUR)]
    assert after == expected  # same offsets, values, headers and timestamps; order kept
    assert {r.key for r in after if r.value is None} == {b"k%02d" % k for k in range(5, 10)}
    assert after[-1].offset == before[-1].offset  # the log still ends where it did

    # Spark reads the compacted segments like the consumer does.
    from spark_helpers import rows_of

    got = rows_of(spark.read.format("stratalog").option("topic", "users").load(spec.url))
    assert got == after

    # Once delete.retention.ms has passed, the remaining tombstones go too.
    later = compact(spark, spec.url, "users", gw.http_url, bootstrap=gw.bootstrap,
                    clock=lambda: time.time() + 2 * HOUR / 1000)
    assert later.ok, later.results
    assert later.results[0].segments_out < later.results[0].segments_in  # small rewrites merge
    final = consume_all(gw.bootstrap, "users", 1)
    assert final == [r for r in after if r.value is not None]

    # The log keeps working: new records append after the compacted offsets.
    produce(gw.bootstrap, "users", [(0, b"k99", b"new", [], None)])
    tail = consume_all(gw.bootstrap, "users", 1)
    assert tail[-1].key == b"k99" and tail[-1].offset == before[-1].offset + 1


def test_min_compaction_lag_protects_recent_segments(spark, gateway_factory):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "lagged", 1, {**COMPACT, "min.compaction.lag.ms": HOUR})
    now_ms = int(time.time() * 1000)
    old = [(0, b"k%d" % (i % 5), b"old-%d" % i, [], now_ms - 3 * HOUR + i) for i in range(60)]
    produce(gw.bootstrap, "lagged", old, batch_size=400)
    wait_sealed(spec, "lagged", {0: 60})
    time.sleep(1)  # the next records go into later segments
    recent = [(0, b"k%d" % (i % 5), b"new-%d" % i, [], now_ms - 1000 + i) for i in range(40)]
    produce(gw.bootstrap, "lagged", recent, batch_size=400)
    before = consume_all(gw.bootstrap, "lagged", 1)
    wait_sealed(spec, "lagged", {0: before[-1].offset + 1})

    report = compact(spark, spec.url, "lagged", gw.http_url, bootstrap=gw.bootstrap)
    assert report.ok, report.results
    after = consume_all(gw.bootstrap, "lagged", 1)
    recent_truth = [r for r in before if r.value.startswith(b"new-")]
    assert [r for r in after if r.value.startswith(b"new-")] == recent_truth  # none touched
    old_after = [r for r in after if r.value.startswith(b"old-")]
    assert 5 <= len(old_after) < 60  # old ones compacted (per key, within the old segments)
    assert all(r in before for r in after)


def test_conflicting_swap_is_refused_and_cleans_up(spark, gateway_factory):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "raced", 1, COMPACT)
    for start in (0, 30, 60):  # three sealed segments
        produce(gw.bootstrap, "raced", [(0, b"k%d" % (i % 3), b"v%d" % i, [], None)
                                        for i in range(start, start + 30)])
        wait_sealed(spec, "raced", {0: start + 30})
    before = consume_all(gw.bootstrap, "raced", 1)
    # Room for every segment in one rewrite: the winner's swap removes base offsets the
    # loser still names.
    settings = Settings.from_configs({**COMPACT, "segment.bytes": 10**6})
    now = int(time.time() * 1000) + 1000
    first = plan_compaction(spec, "raced", settings, now_ms=now)
    second = plan_compaction(spec, "raced", settings, now_ms=now)
    first_rows, second_rows = rewrite(spark, first), rewrite(spark, second)
    assert [r.status for r in swap(first, first_rows, gw.http_url)] == ["compacted"]
    (lost,) = swap(second, second_rows, gw.http_url)
    assert lost.status == "conflict", lost
    store = spec.open()
    for g in second.groups:
        assert all(not (gw.data_dir / "objects" / k).exists() for k in g.new_keys())
    after = consume_all(gw.bootstrap, "raced", 1)
    assert {r.key: r.value for r in after} == {r.key: r.value for r in before}
    assert len(after) == 3
    assert store.list("topics/")  # the winner's segments are in place


def test_swap_refuses_a_plan_whose_segments_were_rewritten_since(spark, gateway_factory):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "stale", 1, COMPACT)
    produce(gw.bootstrap, "stale", [(0, b"k%d" % (i % 3), b"v%d" % i, [], None) for i in range(30)])
    wait_sealed(spec, "stale", {0: 30})
    settings = Settings.from_configs(COMPACT)
    now = int(time.time() * 1000) + 1000
    first = plan_compaction(spec, "stale", settings, now_ms=now)
    second = plan_compaction(spec, "stale", settings, now_ms=now)
    assert [len(g.inputs) for g in first.groups] == [1]  # the rewrite keeps the base offset
    assert [r.status for r in swap(first, rewrite(spark, first), gw.http_url)] == ["compacted"]
    (lost,) = swap(second, rewrite(spark, second), gw.http_url)
    assert lost.status == "conflict" and "no longer" in lost.message
    assert all(not (gw.data_dir / "objects" / k).exists() for g in second.groups for k in g.new_keys())


def test_compacting_a_delete_topic_is_refused(spark, gateway_factory):
    gw = gateway_factory(settings=SETTINGS)
    create_topic(gw.bootstrap, "plain", 1)
    produce(gw.bootstrap, "plain", [(0, b"k", b"v", [], None)])
    wait_sealed(StoreSpec((gw.data_dir / "objects").as_uri()), "plain", {0: 1})
    with pytest.raises(CompactionError, match="cleanup.policy=delete"):
        compact(spark, (gw.data_dir / "objects").as_uri(), "plain", gw.http_url, bootstrap=gw.bootstrap)
    with pytest.raises(CompactionError, match="cannot tell"):
        compact(spark, (gw.data_dir / "objects").as_uri(), "plain", gw.http_url)


def test_cli_compact(spark, gateway_factory, capsys):
    from stratalog.infra.cli import main

    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "via-cli", 1, COMPACT)
    produce(gw.bootstrap, "via-cli", [(0, b"k%d" % (i % 4), b"v%d" % i, [], None) for i in range(80)],
            batch_size=400)
    wait_sealed(spec, "via-cli", {0: 80})
    code = main(["compact", "--topic", "via-cli", "--object-store", spec.url, "--admin", gw.http_url,
                 "--bootstrap", gw.bootstrap])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "compacted" in out.out and "80->" in out.out
    assert len(consume_all(gw.bootstrap, "via-cli", 1)) == 4
    code = main(["compact", "--topic", "nope", "--object-store", spec.url, "--admin", gw.http_url,
                 "--bootstrap", gw.bootstrap])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("stratalog: error:")


def test_compaction_on_s3(spark, gateway_factory):
    import os

    from spark_helpers import S3_ENV, make_bucket, moto_s3

    for k, v in S3_ENV.items():
        os.environ.setdefault(k, v)
    with moto_s3() as endpoint:
        make_bucket(endpoint, "compacted")
        gw = gateway_factory(settings=SETTINGS, extra_args=[
            "--object-store", "s3://compacted/c1", "--s3-endpoint", endpoint, "--s3-path-style"])
        spec = StoreSpec("s3://compacted/c1", endpoint=endpoint, path_style=True)
        create_topic(gw.bootstrap, "on-s3", 1, COMPACT)
        produce(gw.bootstrap, "on-s3", [(0, b"k%d" % (i % 5), b"v%d" % i, [("i", b"%d" % i)], None)
                                        for i in range(100)], compression="zstd", batch_size=400)
        before = consume_all(gw.bootstrap, "on-s3", 1)
        wait_sealed(spec, "on-s3", {0: 100})
        report = compact(spark, spec.url, "on-s3", gw.http_url, endpoint=endpoint, path_style=True,
                         bootstrap=gw.bootstrap)
        assert report.ok, report.results
        after = consume_all(gw.bootstrap, "on-s3", 1)
        assert after == sorted(_latest(before).values(), key=lambda r: r.offset)
        from spark_helpers import rows_of

        reader = (spark.read.format("stratalog").option("topic", "on-s3").option("endpoint", endpoint)
                  .option("pathStyle", "true"))
        assert rows_of(reader.load(spec.url)) == after
        # Every segment object, the gateway's and the compaction's, carries a CRC32C.
        import boto3

        s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        logs = [o["Key"] for o in s3.list_objects_v2(Bucket="compacted", Prefix="c1/topics/")["Contents"]
                if o["Key"].endswith(".log")]
        assert len(logs) >= 2, logs
        for key in logs:
            assert s3.head_object(Bucket="compacted", Key=key, ChecksumMode="ENABLED").get("ChecksumCRC32C"), key


def test_compaction_removes_aborted_records_and_leaves_open_transactions_alone(spark, gateway_factory):
    from confluent_kafka import Consumer, Producer, TopicPartition

    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "txn-users", 1, COMPACT)
    p = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": "txn-users-app", "linger.ms": 5})
    p.init_transactions(30)

    def transaction(tag: str, keys: range, end) -> None:
        p.begin_transaction()
        for k in keys:
            p.produce("txn-users", key=b"k%d" % k, value=b"%s-%d" % (tag.encode(), k), partition=0)
        p.flush(30)
        if end is not None:
            end(30)

    transaction("c1", range(10), p.commit_transaction)
    transaction("a", range(10), p.abort_transaction)
    transaction("c2", range(5), p.commit_transaction)
    time.sleep(1)  # the open transaction starts in a later segment
    transaction("open", range(5, 10), None)
    c = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": "hw"})
    _, end = c.get_watermark_offsets(TopicPartition("txn-users", 0), timeout=10)
    c.close()
    wait_sealed(spec, "txn-users", {0: end})

    report = compact(spark, spec.url, "txn-users", gw.http_url, bootstrap=gw.bootstrap)
    assert report.ok, report.results
    committed = {r.key: r.value for r in consume_all(gw.bootstrap, "txn-users", 1)}  # read_committed
    assert committed == {**{b"k%d" % k: b"c1-%d" % k for k in range(5, 10)},
                         **{b"k%d" % k: b"c2-%d" % k for k in range(5)}}
    everything = _read_uncommitted(gw.bootstrap, "txn-users")
    assert not any(v.startswith(b"a-") for v in everything)  # aborted records are gone
    assert [v for v in everything if v.startswith(b"open-")] == [b"open-%d" % k for k in range(5, 10)]

    p.commit_transaction(30)
    committed = {r.key: r.value for r in consume_all(gw.bootstrap, "txn-users", 1)}
    assert {k: v for k, v in committed.items() if v.startswith(b"open-")} == {
        b"k%d" % k: b"open-%d" % k for k in range(5, 10)}


def _read_uncommitted(bootstrap: str, topic: str):
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"ru-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_uncommitted", "enable.partition.eof": True})
    c.assign([TopicPartition(topic, 0, 0)])
    out = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            out.append(m.value())
        raise AssertionError("no end of partition")
    finally:
        c.close()
