"""`stratalog coordinator backup|restore`: the coordinator is lost (the embedded database
deleted, or etcd's keys wiped), restored from a backup, and the gateways serve exactly what
was acknowledged at the backup, read back by a real client; epochs and the producer-id
allocator moved forward; a partition whose objects are gone is not served as if whole.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from stratalog.coordinator.backup import FORMAT_VERSION, Backup, CorruptBackup, decode, encode
from stratalog.coordinator.kv import UnsupportedFormat
from stratalog.engine.restore import EPOCH_MARGIN, PRODUCER_ID_MARGIN
from stratalog.infra.cli import main

from cluster_fixtures import (QUIET, coordinator_call, etcd, moto_s3,  # noqa: F401  (fixtures)
                              start_cluster, wait_for)

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402


# ---- the file format -----------------------------------------------------------------------

def _sample() -> Backup:
    return Backup("default", str(uuid.uuid4()), 1, 42, 1_700_000_000_000,
                  [("cluster_id", b'"x"'), ("topics/t", b'{"a":1}'), ("weird\nkey", bytes(range(256)))])


@pytest.mark.unit
def test_backup_file_round_trips_every_key_and_the_header():
    backup = _sample()
    data = encode(backup)
    assert data.startswith(f"STRATALOG-COORDINATOR-BACKUP {FORMAT_VERSION}\n".encode())
    got = decode(data, "b.backup")
    assert got == Backup(backup.cluster, backup.cluster_id, 1, 42, 1_700_000_000_000, sorted(backup.keys))


@pytest.mark.unit
def test_backup_file_refuses_a_newer_version_before_reading_on():
    data = encode(_sample()).replace(b"BACKUP 1\n", b"BACKUP 2\n", 1)
    with pytest.raises(UnsupportedFormat) as refused:
        decode(data, "b.backup")
    assert str(refused.value) == ("coordinator backup b.backup has format version 2; this Stratalog "
                                  "reads version 1: upgrade the gateway")


@pytest.mark.unit
@pytest.mark.parametrize("damage", ["flip", "truncate", "drop_end", "not_a_backup", "empty"])
def test_backup_file_refuses_damage_as_a_whole(damage):
    data = bytearray(encode(_sample()))
    if damage == "flip":
        data[data.index(b'"k":"topics/t"') + 6] ^= 0x01
    elif damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "drop_end":
        data = data[: data.rindex(b"\n", 0, len(data) - 1) + 1]
    elif damage == "not_a_backup":
        data = bytearray(b"SQLite format 3\x00" + bytes(100))
    else:
        data = bytearray()
    with pytest.raises(CorruptBackup):
        decode(bytes(data), "b.backup")


@pytest.mark.unit
def test_embedded_reader_reads_one_revision_beside_the_holder_and_writes_nothing(tmp_path):
    from stratalog.coordinator.embedded import EmbeddedKV, EmbeddedReader
    from stratalog.coordinator.kv import CoordinatorError

    async def body():
        kv = EmbeddedKV(tmp_path)  # holds the lock, as a gateway does
        try:
            await kv.put("/a/1", b"one")
            rev = await kv.put("/a/2", b"two")
            reader = EmbeddedReader(tmp_path)
            try:
                assert await reader.snapshot(["/a/"]) == (rev, [("/a/1", b"one", rev - 1), ("/a/2", b"two", rev)])
                await kv.put("/a/3", b"three")  # the holder goes on; the reader sees it next time
                assert len((await reader.snapshot(["/a/"]))[1]) == 3
                with pytest.raises(CoordinatorError, match="read-only"):
                    await reader.put("/a/4", b"x")
            finally:
                await reader.close()
        finally:
            await kv.close()
        with pytest.raises(CoordinatorError, match="no embedded coordinator database"):
            EmbeddedReader(tmp_path / "nowhere")

    asyncio.run(body())


@pytest.mark.unit
def test_restore_fences_what_ran_past_the_backup(tmp_path):
    """In process: after a restore, a commit at any epoch a gateway could have reached since
    the backup is fenced, producer ids continue past every block handed out since, and
    transactional producers are fenced (an open transaction restored as aborting)."""
    from stratalog.coordinator import open_coordinator
    from stratalog.coordinator.model import Fenced, PartitionState, WalObject, WalRange
    from stratalog.coordinator.transactions import TxnState, TxnStatus
    from stratalog.engine.restore import COMPLETE, restore
    from stratalog.tiering.objectstore import open_store

    async def body():
        source = open_coordinator(None, tmp_path / "source")
        try:
            info = await source.create_topic("t", 1, 1, {}, {0: PartitionState(1, 7, (1,), (1,))})
            first = await source.allocate_producer_ids(1000)
            await source.put_transaction(TxnState("open", first, 4, 60000, TxnStatus.ONGOING, (("t", 0),)), 0)
            await source.put_transaction(TxnState("idle", first + 1, 9, 60000, TxnStatus.COMPLETE_COMMIT), 0)
            revision, keys = await source.read_keyspace()
        finally:
            await source.close()
        backup = Backup("default", "id", 1, revision, 0, keys)
        target = open_coordinator(None, tmp_path / "target")
        objects = open_store((tmp_path / "objects").as_uri())
        try:
            report = await restore(backup, target, objects, tmp_path / "scratch")
            assert [(o.topic, o.status) for o in report.partitions] == [("t", COMPLETE)]
            assert (report.producers_fenced, report.transactions_aborted) == (2, 1)
            state = (await target.partition_states(info.topic_id))[0]
            assert (state.leader, state.leader_epoch) == (-1, 7 + EPOCH_MARGIN)
            tp = (info.topic_id, 0)
            wal = WalObject(1, 1, "wal/1/00000000000000000001.wal", (WalRange(*tp, 0, 0, 0, 10, 0),))
            for stale in (7, 8, 7 + EPOCH_MARGIN - 1):  # the backup's epoch, and moves since
                with pytest.raises(Fenced):
                    await target.commit_wal(wal, {tp: stale})
            assert await target.allocate_producer_ids(1000) >= first + 1000 + PRODUCER_ID_MARGIN
            txns = {s.transactional_id: s for s, _ in await target.transactions()}
            assert (txns["open"].status, txns["open"].producer_epoch, txns["open"].pending) == \
                (TxnStatus.PREPARE_ABORT, 5, (("t", 0),))
            assert (txns["idle"].producer_epoch, txns["idle"].last_producer_epoch) == (10, -1)
        finally:
            await target.close()
            await objects.close()

    asyncio.run(body())


@pytest.mark.unit
def test_restore_rebuilds_from_a_manifest_only_when_it_covers_the_backup(tmp_path):
    """A WAL object the backup needs is gone: without a manifest, or with one that ends
    before the backup's high watermark or names a missing object, the partition is restored
    offline naming the object; a manifest that covers it (retention having moved the log
    start since) rebuilds it, high watermark and log start moved, and nothing is served
    short silently."""
    from stratalog.coordinator import open_coordinator
    from stratalog.coordinator.model import PartitionState, SegmentEntry, WalObject, WalRange
    from stratalog.engine.restore import OFFLINE, REBUILT, restore
    from stratalog.tiering import layout
    from stratalog.tiering.manifest import SegmentRecord, write_manifest
    from stratalog.tiering.objectstore import open_store

    objects_dir = tmp_path / "objects"
    wal_key = layout.wal_key(1, 1)

    async def body():
        source = open_coordinator(None, tmp_path / "source")
        try:
            info = await source.create_topic("r", 1, 1, {}, {0: PartitionState(1, 0, (1,), (1,))})
            tid = info.topic_id

            def segment(base: int, last: int, name: str) -> SegmentEntry:
                return SegmentEntry(base, last, layout.segment_key_base("r", tid, 0, base, 0, name), 100, 0, 0, 0)
            a, b, c = segment(0, 9, "a"), segment(10, 19, "b"), segment(20, 29, "c")
            for s in (a, b):
                await source.commit_segment(tid, 0, s, 0)
            await source.commit_wal(WalObject(1, 1, wal_key, (WalRange(tid, 0, 20, 24, 0, 10, 0),)), {(tid, 0): 0})
            revision, keys = await source.read_keyspace()
        finally:
            await source.close()
        for s in (a, b, c):
            for ext in layout.SEGMENT_EXTENSIONS:
                path = objects_dir / (s.key_base + ext)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"x")
        backup = Backup("default", "id", 1, revision, 0, keys)
        prefix = objects_dir / layout.partition_manifest_prefix("r", tid, 0)
        prefix.mkdir(parents=True)

        def manifest(version: int, log_start: int, *segments: SegmentEntry) -> None:
            records = [SegmentRecord(s.base_offset, s.last_offset, s.key_base, s.size, 0, 0, 0) for s in segments]
            (prefix / f"{version:020d}.avro").write_bytes(write_manifest("r", tid, 0, version, log_start, records))

        async def restored(name: str):
            target = open_coordinator(None, tmp_path / name)
            objects = open_store(objects_dir.as_uri())
            try:
                (outcome,) = (await restore(backup, target, objects, tmp_path / f"scratch-{name}")).partitions
                return outcome, await target.log_state(tid, 0), await target.segments(tid, 0)
            finally:
                await target.close()
                await objects.close()

        outcome, log, _ = await restored("none")
        assert outcome.status == OFFLINE and wal_key in outcome.detail
        manifest(1, 0, a, b)  # ends at 19: the backup's offsets 20..24 are not in it
        assert (await restored("short"))[0].status == OFFLINE
        missing = segment(20, 29, "gone")
        manifest(2, 0, a, b, missing)  # covers them, but names an object that is not there
        assert (await restored("missing"))[0].status == OFFLINE
        manifest(3, 10, b, c)  # covers them; retention removed segment a since the backup
        outcome, log, segments = await restored("covered")
        assert outcome.status == REBUILT, outcome
        assert "high watermark 25 -> 30" in outcome.detail and "log start 0 -> 10" in outcome.detail
        assert (log.log_start_offset, log.high_watermark) == (10, 30)
        assert [s.key_base for s in segments] == [b.key_base, c.key_base]

    asyncio.run(body())


# ---- helpers -------------------------------------------------------------------------------

def _produce(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes, list]]) -> None:
    """Produce (partition, key, value, headers) with acks=all, one flush per record, so each
    lands in its own WAL object and segments fill record by record."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "logger": QUIET})
    errors: list = []
    for p, k, v, h in records:
        producer.produce(topic, v, k, partition=p, headers=h,
                         on_delivery=lambda err, msg: errors.append(err) if err else None)
        assert producer.flush(30) == 0
    assert not errors, errors


def _read_all(bootstrap: str, topic: str, partitions: list[int], ends: dict[int, int]) -> dict:
    """Every record of the partitions up to `ends` (exclusive), as (offset, key, value, headers)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4().hex[:6]}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "logger": QUIET})
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    got: dict[int, list] = {p: [] for p in partitions}
    try:
        def done():
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                got[msg.partition()].append((msg.offset(), msg.key(), msg.value(), msg.headers() or []))
            return all(len(got[p]) >= ends[p] for p in partitions)
        wait_for(done, timeout=60, what=f"records of {topic}", interval=0)
    finally:
        consumer.close()
    return got


def _commit(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "logger": QUIET})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def _committed(bootstrap: str, group: str, topic: str, partitions: list[int]) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "logger": QUIET})
    try:
        return {tp.partition: tp.offset
                for tp in consumer.committed([TopicPartition(topic, p) for p in partitions], timeout=30)}
    finally:
        consumer.close()


def _store_call(coordinator: str | None, data_dir: Path, fn):
    from stratalog.coordinator import open_coordinator

    async def run():
        store = open_coordinator(coordinator, data_dir)
        try:
            return await fn(store)
        finally:
            await store.close()
    return asyncio.run(run())


async def _partition_view(store) -> dict:
    """Per partition of every topic: epoch, segments and unsealed WAL object keys."""
    out = {}
    for info in (await store.topics()).values():
        states = await store.partition_states(info.topic_id)
        for p in range(info.partitions):
            out[(info.name, p)] = (states[p], await store.segments(info.topic_id, p),
                                   [k for k, _ in await store.wal_ranges(info.topic_id, p, 0)],
                                   await store.log_state(info.topic_id, p))
    return out


def _records(n: int, partitions: int, size: int = 300) -> list:
    return [(i % partitions, f"k{i}".encode(), f"v{i}-".encode() + b"x" * size,
             [("h", f"{i}".encode()), ("dup", b"1"), ("dup", b"2")]) for i in range(n)]


# ---- the embedded coordinator --------------------------------------------------------------

def test_embedded_backup_restore_serves_what_was_acknowledged(gateway_factory, tmp_path, capsys):
    data_dir = tmp_path / "data"
    gw = gateway_factory(data_dir=data_dir, settings={"log.segment.bytes": 1400})
    topic = "orders"
    admin = AdminClient({"bootstrap.servers": gw.bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(30)
    records = _records(20, 2)  # 10 a partition: two sealed segments, two records in the WAL
    _produce(gw.bootstrap, topic, records)
    _commit(gw.bootstrap, "billing", topic, {0: 5, 1: 3})
    before = _read_all(gw.bootstrap, topic, [0, 1], {0: 10, 1: 10})
    gw.stop()
    view = _store_call(None, data_dir, _partition_view)
    assert all(segs and wal for _, segs, wal, _ in view.values()), view  # sealed and WAL-only both
    pids_before = _store_call(None, data_dir, lambda s: s.kv.get(s._k("producer_ids/next")))

    backup = tmp_path / "meta.backup"
    assert main(["coordinator", "backup", str(backup), "--data-dir", str(data_dir)]) == 0
    assert "backed up cluster default" in capsys.readouterr().out

    # Lose the embedded database, then restore it.
    for f in data_dir.glob("coordinator.sqlite3*"):
        f.unlink()
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert out.count("COMPLETE") == 2 and "OFFLINE" not in out, out

    # A second restore into the now non-empty coordinator is refused, changing nothing.
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(data_dir)]) == 1
    assert "a restore goes only into an empty cluster" in capsys.readouterr().err

    restored = _store_call(None, data_dir, _partition_view)
    for tp, (state, segs, wal, log) in restored.items():
        old_state, old_segs, old_wal, old_log = view[tp]
        assert state.leader_epoch == old_state.leader_epoch + EPOCH_MARGIN and state.leader == -1
        assert (segs, wal, log) == (old_segs, old_wal, old_log)
    pids_after = _store_call(None, data_dir, lambda s: s.kv.get(s._k("producer_ids/next")))
    assert json.loads(pids_after[0]) == json.loads(pids_before[0]) + PRODUCER_ID_MARGIN

    gw.start()
    after = _read_all(gw.bootstrap, topic, [0, 1], {0: 10, 1: 10})
    assert after == before
    assert [r[1:] for p in (0, 1) for r in after[p]] == \
        [(k, v, h) for p in (0, 1) for (pp, k, v, h) in records if pp == p]
    assert _committed(gw.bootstrap, "billing", topic, [0, 1]) == {0: 5, 1: 3}
    # The restored cluster takes new writes after the restored ones.
    _produce(gw.bootstrap, topic, [(0, b"new", b"after", [])])
    assert _read_all(gw.bootstrap, topic, [0], {0: 11})[0][10][:3] == (10, b"new", b"after")


def test_backup_beside_a_running_gateway_and_refusals(gateway_factory, tmp_path, capsys):
    data_dir = tmp_path / "data"
    gw = gateway_factory(data_dir=data_dir)
    admin = AdminClient({"bootstrap.servers": gw.bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic("t", 1, 1)])["t"].result(30)
    records = _records(3, 1, size=10)
    _produce(gw.bootstrap, "t", records)
    backup = tmp_path / "meta.backup"
    # The embedded coordinator is read beside the gateway that holds it.
    assert main(["coordinator", "backup", str(backup), "--data-dir", str(data_dir)]) == 0
    assert "backed up cluster default" in capsys.readouterr().out

    target = tmp_path / "target"
    newer = tmp_path / "newer.backup"
    newer.write_bytes(backup.read_bytes().replace(b"BACKUP 1\n", b"BACKUP 9\n", 1))
    assert main(["coordinator", "restore", str(newer), "--data-dir", str(target)]) == 1
    assert f"coordinator backup {newer} has format version 9; this Stratalog reads version 1: " \
           "upgrade the gateway" in capsys.readouterr().err
    corrupt = tmp_path / "corrupt.backup"
    corrupt.write_bytes(backup.read_bytes().replace(b'"k":"topics/t"', b'"k":"topics/u"'))
    assert main(["coordinator", "restore", str(corrupt), "--data-dir", str(target)]) == 1
    assert "SHA-256 does not match" in capsys.readouterr().err
    assert not target.exists()  # refused before anything was opened or made

    # Not into a coordinator a gateway runs on, nor into one that holds keys.
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(data_dir)]) == 1
    assert "a gateway is running on" in capsys.readouterr().err
    gw.stop()
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(data_dir)]) == 1
    assert "a restore goes only into an empty cluster" in capsys.readouterr().err

    # The backup taken while serving restores whole into a new coordinator.
    objects = ["--object-store", (data_dir / "objects").as_uri()]
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(target), *objects]) == 0
    assert "COMPLETE" in capsys.readouterr().out
    restored = gateway_factory(data_dir=target, extra_args=objects)
    got = _read_all(restored.bootstrap, "t", [0], {0: 3})[0]
    assert [r[1:] for r in got] == [(k, v, h) for _, k, v, h in records]


# ---- etcd and S3 ---------------------------------------------------------------------------

def test_etcd_backup_while_serving_then_wipe_restore_and_a_missing_object(
        gateway_factory, etcd, moto_s3, tmp_path, capsys):  # noqa: F811
    gws = start_cluster(gateway_factory, etcd, tmp_path, 1, s3=moto_s3)
    bootstrap = gws[0].bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    topic = "events"
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    # Partition 2's records are produced on their own, so its WAL objects hold nothing else.
    records = _records(12, 2, size=50) + [(2, b"lonely", b"only-p2", [])]
    _produce(bootstrap, topic, records)
    _commit(bootstrap, "g", topic, {0: 4, 1: 6, 2: 1})
    before = _read_all(bootstrap, topic, [0, 1, 2], {0: 6, 1: 6, 2: 1})

    backup = tmp_path / "etcd.backup"
    where = ["--coordinator", etcd.url]
    assert main(["coordinator", "backup", str(backup), *where]) == 0  # while the gateway runs
    capsys.readouterr()
    # Acknowledged after the backup: not part of the recovery point.
    _produce(bootstrap, topic, [(0, b"late", b"after-backup", [])])
    _commit(bootstrap, "g", topic, {0: 6})

    async def p2_only_objects(store):
        info = await store.topic(topic)
        keys = {p: {k for k, _ in await store.wal_ranges(info.topic_id, p, 0)} for p in range(3)}
        return sorted(keys[2] - keys[0] - keys[1])
    lost = coordinator_call(etcd.url, p2_only_objects)
    assert lost
    gws[0].kill9()
    coordinator_call(etcd.url, lambda s: s.kv.delete_prefix(s.prefix))
    moto_s3.client().delete_objects(Bucket=moto_s3.bucket, Delete={
        "Objects": [{"Key": f"{moto_s3.prefix}/{k}"} for k in lost]})

    store_args = ["--object-store", moto_s3.url, "--s3-endpoint", moto_s3.endpoint, "--s3-path-style"]
    assert main(["coordinator", "restore", str(backup), *where, *store_args]) == 0
    out = capsys.readouterr()
    assert out.out.count("COMPLETE") == 2 and "OFFLINE" in out.out and lost[0] in out.out, out.out
    assert "1 partition(s) restored offline" in out.err

    gws[0].start(timeout=60)
    after = _read_all(bootstrap, topic, [0, 1], {0: 6, 1: 6})
    assert after == {p: before[p] for p in (0, 1)}  # "late" is past the recovery point
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "x", "logger": QUIET})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        assert (low, high) == (0, 6)
    finally:
        consumer.close()
    assert _committed(bootstrap, "g", topic, [0, 1, 2]) == {0: 4, 1: 6, 2: 1}

    # Partition 2 is not served as if whole: offline, with its reason.
    def p2_error():
        described = admin.list_topics(topic, timeout=10).topics[topic]
        md = described.partitions[2]
        return described.error is None and md.error is not None and md.error.code() == KafkaError.KAFKA_STORAGE_ERROR and md.leader == -1
    wait_for(p2_error, timeout=30, what="partition 2 offline")
    states = coordinator_call(etcd.url, lambda s: s.all_partition_states())
    (by_p,) = states.values()
    assert lost[0] in by_p[2].offline
    assert all(st.leader_epoch >= EPOCH_MARGIN for st in by_p.values())

    # The operator's way out, as for any damaged partition: without the object, only by
    # accepting the loss; the partition then continues from what can be read.
    admin_url = ["--admin", gws[0].http_url]
    assert main(["partitions", "recover", topic, "2", *admin_url]) == 1
    assert "still damaged" in capsys.readouterr().err
    assert main(["partitions", "recover", topic, "2", "--truncate", "--accept-data-loss", *admin_url]) == 0
    assert "1 offsets lost" in capsys.readouterr().out
    _produce(bootstrap, topic, [(2, b"fresh", b"after-recover", [])])
    assert [r[:3] for r in _read_all(bootstrap, topic, [2], {2: 1})[2]] == [(0, b"fresh", b"after-recover")]


def test_restore_rebuilds_a_partition_from_its_manifest(gateway_factory, tmp_path, capsys):
    """WAL objects collected after their ranges were sealed since the backup: the newest
    manifest lists segments covering them, so the partition comes back whole, with the
    records sealed after the backup too."""
    data_dir = tmp_path / "data"
    gw = gateway_factory(data_dir=data_dir, settings={"log.segment.bytes": 1400,
                                                      "log.retention.check.interval.ms": 500})
    admin = AdminClient({"bootstrap.servers": gw.bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic("m", 1, 1)])["m"].result(30)
    _produce(gw.bootstrap, "m", _records(3, 1))
    gw.stop()
    backup = tmp_path / "m.backup"
    assert main(["coordinator", "backup", str(backup), "--data-dir", str(data_dir)]) == 0
    wal_at_backup = _store_call(None, data_dir, _partition_view)[("m", 0)][2]
    assert wal_at_backup
    gw.start()
    _produce(gw.bootstrap, "m", _records(12, 1)[3:])  # seals past the backup's WAL ranges

    def collected():
        return not any((data_dir / "objects" / k).exists() for k in wal_at_backup)
    wait_for(collected, timeout=60, what="the backup's WAL objects collected")
    gw.stop()
    # What the newest manifest lists (it is written after each seal's commit).
    from stratalog.tiering.manifest import read_manifest
    newest = sorted((data_dir / "objects" / "manifests").rglob("*.avro"))[-1]
    sealed_end = read_manifest(newest.read_bytes()).segments[-1].last_offset + 1
    assert sealed_end >= 4
    for f in data_dir.glob("coordinator.sqlite3*"):
        f.unlink()
    capsys.readouterr()
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert "REBUILT" in out and f"high watermark 3 -> {sealed_end}" in out, out
    gw.start()
    got = _read_all(gw.bootstrap, "m", [0], {0: sealed_end})[0]
    assert [(o, k) for o, k, _, _ in got] == [(i, f"k{i}".encode()) for i in range(sealed_end)]



def test_restore_fences_transactional_producers_and_aborts_open_transactions(gateway_factory, tmp_path, capsys):
    from test_transactions import read_values

    data_dir = tmp_path / "data"
    gw = gateway_factory(data_dir=data_dir)
    admin = AdminClient({"bootstrap.servers": gw.bootstrap, "logger": QUIET})  # alive until answered
    admin.create_topics([NewTopic("tx", 1, 1)])["tx"].result(30)
    done = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": "done", "logger": QUIET})
    done.init_transactions(30)
    done.begin_transaction()
    done.produce("tx", b"committed", partition=0)
    done.commit_transaction(30)
    left_open = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": "open", "logger": QUIET})
    left_open.init_transactions(30)
    left_open.begin_transaction()
    left_open.produce("tx", b"never-committed", partition=0)
    assert left_open.flush(30) == 0
    gw.stop()  # the transaction of "open" stays Ongoing in the backup

    backup = tmp_path / "tx.backup"
    assert main(["coordinator", "backup", str(backup), "--data-dir", str(data_dir)]) == 0
    for f in data_dir.glob("coordinator.sqlite3*"):
        f.unlink()
    assert main(["coordinator", "restore", str(backup), "--data-dir", str(data_dir)]) == 0
    assert "2 transactional producer(s) fenced, 1 open transaction(s) aborted" in capsys.readouterr().out
    gw.start()

    # The open transaction is aborted by the gateway: read_committed never shows it.
    wait_for(lambda: read_values(gw.bootstrap, "tx", 1, "read_committed", timeout=5) == {0: [b"committed"]},
             timeout=30, what="the open transaction aborted")
    # The producer that ran before the restore is fenced, fatally, as a zombie is.
    done.begin_transaction()
    done.produce("tx", b"zombie", partition=0)
    with pytest.raises(ck.KafkaException) as fenced:
        done.commit_transaction(30)
    assert fenced.value.args[0].fatal()
    again = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": "done", "logger": QUIET})
    again.init_transactions(30)
    again.begin_transaction()
    again.produce("tx", b"again", partition=0)
    again.commit_transaction(30)
    assert read_values(gw.bootstrap, "tx", 1, "read_committed") == {0: [b"committed", b"again"]}
