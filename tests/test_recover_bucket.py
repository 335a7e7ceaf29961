"""`stratalog recover --from-bucket`: the coordinator is lost with no backup, and the cluster
is rebuilt from the object store alone. What comes back is the documented recovery point:
sealed data whole, WAL ranges whose commit the bucket proves (every flush but each
gateway's newest; never a fenced upload), and everything else (topics, configs, group
offsets) as of the newest coordinator snapshot in the bucket.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from cluster_fixtures import etcd, fault_proxy, moto_s3  # noqa: F401  (fixtures)

from stratalog.coordinator import open_coordinator
from stratalog.coordinator.model import CommittedOffset, PartitionState, SegmentEntry
from stratalog.engine.bucket_recovery import recover_from_bucket
from stratalog.engine.restore import EPOCH_MARGIN, OFFLINE
from stratalog.engine.snapshots import SnapshotWriter
from stratalog.engine.wal_writer import WalCommitFailed, WalWriter
from stratalog.tiering import layout
from stratalog.tiering.errors import CorruptObject, UnsupportedFormat
from stratalog.tiering.manifest import SegmentRecord, write_manifest
from stratalog.tiering.objectstore import open_store
from stratalog.tiering.wal import (CONFIRMATION_TOPIC_ID, SequenceSet, WalBuilder, add_confirmations,
                                   decode_confirmations, encode_confirmations, read_wal)


# ---- the formats ---------------------------------------------------------------------------

@pytest.mark.unit
def test_sequence_set_keeps_committed_sequences_as_few_intervals():
    s = SequenceSet()
    for seq in (1, 2, 3, 5, 6, 9, 4):
        s.add(seq)
    assert s.intervals == [(1, 6), (9, 9)]
    assert 4 in s and 7 not in s and 9 in s
    s.prune_below(3)
    assert s.intervals == [(3, 6), (9, 9)]
    s.update(SequenceSet([(7, 8)]))
    assert s.intervals == [(3, 9)]


@pytest.mark.unit
def test_wal_object_carries_its_confirmations_beside_ordinary_ranges():
    tid = uuid.uuid4()
    builder = WalBuilder()
    builder.add(tid, 0, 10, 12, 1000, b"batch-bytes")
    confirmed = SequenceSet([(1, 4), (6, 7)])
    add_confirmations(builder, confirmed)
    data, infos = builder.build()
    ranges = read_wal(data, "wal/1/x.wal")
    assert [(i.topic_id, i.partition, i.base_offset, i.last_offset) for i, _ in ranges] == \
        [(tid, 0, 10, 12), (CONFIRMATION_TOPIC_ID, 0, 1, 7)]
    assert bytes(ranges[0][1]) == b"batch-bytes"  # the partition's range is untouched
    assert decode_confirmations(ranges[1][1]).intervals == [(1, 4), (6, 7)]
    empty = WalBuilder()
    add_confirmations(empty, SequenceSet())
    assert empty.empty  # nothing to confirm: no range


@pytest.mark.unit
def test_confirmations_refuse_damage_and_a_newer_version():
    data = bytearray(encode_confirmations(SequenceSet([(1, 2)])))
    with pytest.raises(CorruptObject):
        decode_confirmations(bytes(data[:-1]))
    with pytest.raises(CorruptObject):
        decode_confirmations(b"XXXX" + bytes(data[4:]))
    data[5] = 2  # version 2
    with pytest.raises(UnsupportedFormat, match="version 2; this Stratalog reads version 1"):
        decode_confirmations(bytes(data), "wal/1/x.wal")


@pytest.mark.unit
def test_snapshot_keys_sort_by_time_and_parse_back():
    assert layout.snapshot_key(1_700_000_000_000) == "coordinator/00000001700000000000.backup"
    assert layout.parse_snapshot_key(layout.snapshot_key(42)) == 42
    with pytest.raises(ValueError):
        layout.parse_snapshot_key("coordinator/x.backup")


# ---- in process: the rule, with real WAL writers and an embedded coordinator ---------------

@dataclass
class _Log:
    """What WalWriter.add needs of a partition log."""

    topic_id: uuid.UUID
    partition: int
    leader_epoch: int

    @property
    def key(self):
        return (self.topic_id, self.partition)


class _KeepWal:
    """A file store whose WAL deletes fail silently: a fenced upload stays in the bucket, as
    when the gateway died before removing it."""

    def __init__(self, inner):
        self.inner = inner

    async def delete(self, keys):
        await self.inner.delete([k for k in keys if not k.startswith(layout.WAL_ROOT)])

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _writer(gw: int, objects, store) -> WalWriter:
    return WalWriter(gw, objects, store, flush_ms=0, flush_bytes=1 << 20,
                     on_committed=lambda logs, ranges: None, on_fenced=lambda keys: None)


async def _append(writer: WalWriter, plog: _Log, offset: int) -> None:
    await writer.add(plog, offset, offset, 1000 + offset, f"record-{offset}".encode())


@pytest.mark.unit
def test_recover_from_bucket_takes_only_provable_commits(tmp_path: Path):
    """Two gateways write a partition; gateway 1's upload after leadership moved is fenced
    and stays in the bucket. The rebuild takes every WAL range whose commit a later object
    of the same gateway confirms, never the fenced one and not each gateway's newest flush;
    topics and group offsets are those of the snapshot, plus a topic a manifest names."""

    async def body():
        source = open_coordinator(None, tmp_path / "source")
        objects = _KeepWal(open_store((tmp_path / "objects").as_uri()))
        t = await source.create_topic("t", 1, 1, {}, {0: PartitionState(1, 0, (1,), (1,))})
        u = await source.create_topic("u", 1, 1, {"retention.ms": "5000"}, {0: PartitionState(1, 0, (1,), (1,))})
        await source.commit_offsets("g", {("t", 0): CommittedOffset(1, -1, "", 0)})
        now = [1_000]
        snapshots = SnapshotWriter(source, objects, interval_ms=1000, retain=2, now_ms=lambda: now[0])
        assert await snapshots.maybe_write(is_controller=False) is None
        first = await snapshots.maybe_write(is_controller=True)
        assert first == layout.snapshot_key(1_000)
        assert await snapshots.maybe_write(is_controller=True) is None  # not due yet
        await source.commit_offsets("g", {("t", 0): CommittedOffset(3, -1, "", 0)})  # after it: lost

        gw1, gw2 = _writer(1, objects, source), _writer(2, objects, source)
        await gw1.start()
        await gw2.start()
        t1, u1 = _Log(t.topic_id, 0, 0), _Log(u.topic_id, 0, 0)
        await _append(gw1, t1, 0)  # gw1 seq 1
        await _append(gw1, t1, 1)  # gw1 seq 2, confirms 1
        await source.set_partition_state(t.topic_id, 0, PartitionState(2, 1, (2,), (2,)))
        with pytest.raises(WalCommitFailed):
            await _append(gw1, t1, 2)  # gw1 seq 3: fenced, left in the bucket
        assert await objects.inner.list(layout.wal_key(1, 3))
        t2 = _Log(t.topic_id, 0, 1)
        for offset in (2, 3, 4):
            await _append(gw2, t2, offset)  # gw2 seqs 1-3; 3 is gw2's newest: unprovable
        await _append(gw1, u1, 0)  # gw1 seq 4, confirms 1-2 (not the fenced 3)
        await _append(gw1, u1, 1)  # gw1 seq 5, gw1's newest
        for w in (gw1, gw2):
            await w.stop()
        acked_hw = (await source.log_state(t.topic_id, 0)).high_watermark
        assert acked_hw == 5

        # A topic created after the snapshot, with one sealed segment and its manifest.
        late = uuid.uuid4()
        base = layout.segment_key_base("late", late, 0, 0, 0, "abc")
        for ext in layout.SEGMENT_EXTENSIONS:
            await objects.put(base + ext, b"x")
        await objects.put(layout.manifest_key("late", late, 0, 1), write_manifest(
            "late", late, 0, 1, 0, [SegmentRecord(0, 6, base, 1, 0, 0, 0)]))
        await source.close()  # the coordinator is lost

        target = open_coordinator(None, tmp_path / "target")
        try:
            report = await recover_from_bucket(target, objects, tmp_path / "scratch")
            assert report.snapshot == first and report.topics_from_manifests == ["late"]
            by = {(r.topic, r.partition): r for r in report.partitions}
            assert (by[("t", 0)].log_end, by[("u", 0)].log_end, by[("late", 0)].log_end) == (4, 1, 7)
            assert "up to 4" in by[("t", 0)].lost and "not provable" in by[("t", 0)].lost
            assert (await target.log_state(t.topic_id, 0)).high_watermark == 4
            keys = [k for k, _ in await target.wal_ranges(t.topic_id, 0, 0)]
            assert keys == [layout.wal_key(1, 1), layout.wal_key(1, 2), layout.wal_key(2, 1), layout.wal_key(2, 2)]
            assert [k for k, _ in await target.wal_ranges(u.topic_id, 0, 0)] == [layout.wal_key(1, 4)]
            topics = await target.topics()
            assert topics["u"].configs == {"retention.ms": "5000"}  # from the snapshot
            assert topics["late"].topic_id == late
            assert (await target.log_state(late, 0)).high_watermark == 7
            assert (await target.fetch_offsets("g"))[("t", 0)].offset == 1  # as of the snapshot
            states = await target.all_partition_states()
            assert states[t.topic_id][0].leader_epoch == 0 + EPOCH_MARGIN  # the snapshot's, moved on
            assert not any(o.status == OFFLINE for o in report.restore.partitions)
        finally:
            await target.close()

    asyncio.run(body())


@pytest.mark.unit
def test_recover_from_bucket_without_a_snapshot_and_with_conflicting_ranges(tmp_path: Path):
    """No snapshot: topics come from manifests alone. Two confirmed ranges holding the same
    offset (a truncation since) bring the partition back offline rather than guess."""

    async def body():
        objects = open_store((tmp_path / "objects").as_uri())
        tid = uuid.uuid4()
        base = layout.segment_key_base("m", tid, 0, 0, 0, "s0")
        for ext in layout.SEGMENT_EXTENSIONS:
            await objects.put(base + ext, b"x")
        await objects.put(layout.manifest_key("m", tid, 0, 1), write_manifest(
            "m", tid, 0, 1, 0, [SegmentRecord(0, 9, base, 1, 0, 0, 0)]))

        def wal(confirm: list[tuple[int, int]], *offsets: tuple[int, int]) -> bytes:
            b = WalBuilder()
            for first, last in offsets:
                b.add(tid, 0, first, last, 0, b"r" * (last - first + 1))
            add_confirmations(b, SequenceSet(confirm))
            return b.build()[0]
        await objects.put(layout.wal_key(7, 1), wal([], (10, 12)))
        await objects.put(layout.wal_key(7, 2), wal([(1, 1)], (10, 11)))  # offsets 10-11 again
        await objects.put(layout.wal_key(7, 3), wal([(1, 2)]))

        target = open_coordinator(None, tmp_path / "target")
        try:
            report = await recover_from_bucket(target, objects, tmp_path / "scratch")
            assert report.snapshot is None and report.topics_from_manifests == ["m"]
            (outcome,) = report.restore.partitions
            assert outcome.status == OFFLINE and "two committed WAL ranges hold offset 10" in outcome.detail
            assert (await target.log_state(tid, 0)).high_watermark == 10  # the sealed part only
            segments = await target.segments(tid, 0)
            assert segments == [SegmentEntry(0, 9, base, 1, 0, 0, 0)]
        finally:
            await target.close()
            await objects.close()

    asyncio.run(body())


# ---- real gateways and clients --------------------------------------------------------------

def _e2e_imports():
    pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
    import test_coordinator_backup as helpers
    return helpers


def _losing_the_coordinator_scenario(bootstrap: str, snapshot_times, *, big_segments: str):
    """Produce sealed and WAL-only data and commit offsets; wait for a snapshot; then produce
    more (sealed, WAL-only, a new topic) and commit again. Returns the snapshot's time, the
    records acknowledged per topic and partition, and the offsets committed before it."""
    import time

    from confluent_kafka.admin import AdminClient, NewTopic

    from cluster_fixtures import QUIET, wait_for

    h = _e2e_imports()
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    for f in admin.create_topics([NewTopic("orders", 2, 1),
                                  NewTopic("walonly", 1, 1, config={"segment.bytes": big_segments})]).values():
        f.result(30)
    orders = h._records(30, 2)
    walonly = [(0, f"w{i}".encode(), f"wal-{i}".encode(), []) for i in range(10)]
    h._produce(bootstrap, "orders", orders[:20])
    h._produce(bootstrap, "walonly", walonly[:5])
    h._commit(bootstrap, "billing", "orders", {0: 5, 1: 3})
    committed_at = int(time.time() * 1000)
    wait_for(lambda: any(t >= committed_at for t in snapshot_times()), timeout=60, what="a coordinator snapshot")
    snapshot = max(snapshot_times())
    # Past the snapshot: more sealed and WAL-only records, a new topic, newer offsets.
    h._produce(bootstrap, "orders", orders[20:])
    admin.create_topics([NewTopic("late", 1, 1)])["late"].result(30)
    late = [(0, f"l{i}".encode(), b"late-" + b"x" * 300, []) for i in range(8)]
    h._produce(bootstrap, "late", late)
    h._commit(bootstrap, "billing", "orders", {0: 9, 1: 9})
    h._produce(bootstrap, "walonly", walonly[5:])  # the last flush: w9 alone
    acked = {"orders": orders, "walonly": walonly, "late": late}
    return snapshot, acked


def _watermarks(consumer, tp) -> tuple[int, int]:
    """A partition's watermarks once it has a serving leader: while restarted gateways
    share out the leaders, a partition moving answers NOT_LEADER, as Kafka's do."""
    from confluent_kafka import KafkaError, KafkaException

    moving = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE}
    deadline = time.monotonic() + 30
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=30)
        except KafkaException as e:
            if e.args[0].code() not in moving or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _check_recovery_point(bootstrap: str, acked: dict, ends: dict[tuple[str, int], int]) -> None:
    """Each partition holds exactly the acknowledged records before its provable end (all
    of them for a partition `ends` does not name), at their offsets; group offsets are
    the snapshot's."""
    from confluent_kafka import Consumer, TopicPartition

    from cluster_fixtures import QUIET

    h = _e2e_imports()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "x", "logger": QUIET})
    try:
        for topic, records in acked.items():
            for p in sorted({p for p, *_ in records}):
                mine = [(k, v) for pp, k, v, _ in records if pp == p]
                end = ends.get((topic, p), len(mine))
                assert _watermarks(consumer, TopicPartition(topic, p)) == (0, end), (topic, p)
                if end:
                    got = h._read_all(bootstrap, topic, [p], {p: end})[p]
                    assert [(o, k, v) for o, k, v, _ in got] == \
                        [(i, k, v) for i, (k, v) in enumerate(mine[:end])], (topic, p)
    finally:
        consumer.close()
    assert h._committed(bootstrap, "billing", "orders", [0, 1]) == {0: 5, 1: 3}
    # The rebuilt cluster takes new writes after the recovered ones.
    end = ends.get(("walonly", 0), 10)
    h._produce(bootstrap, "walonly", [(0, b"new", b"after", [])])
    assert h._read_all(bootstrap, "walonly", [0], {0: end + 1})[0][end][:3] == (end, b"new", b"after")


def test_embedded_coordinator_lost_rebuilt_from_the_bucket(gateway_factory, tmp_path, capsys):
    from stratalog.infra.cli import main

    data_dir = tmp_path / "data"
    snapshots = data_dir / "objects" / "coordinator"
    gw = gateway_factory(data_dir=data_dir, settings={"log.segment.bytes": 1400,
                                                      "coordinator.snapshot.interval.ms": 1000,
                                                      "coordinator.snapshot.retain": 1000})

    def times():
        return [layout.parse_snapshot_key(f"coordinator/{p.name}") for p in snapshots.glob("*.backup")]
    snapshot, acked = _losing_the_coordinator_scenario(gw.bootstrap, times, big_segments=str(64 << 20))
    gw.kill9()
    # The loss happened right after that snapshot: later ones are gone with it.
    for t in times():
        if t > snapshot:
            (snapshots / layout.snapshot_key(t).split("/")[1]).unlink()
    assert snapshot in times()  # retention (1000 snapshots) kept it
    for f in data_dir.glob("coordinator.sqlite3*"):
        f.unlink()

    capsys.readouterr()
    assert main(["recover", "--from-bucket", "--data-dir", str(data_dir)]) == 0
    out = capsys.readouterr().out
    assert layout.snapshot_key(snapshot) in out and "topics from manifests: late" in out, out
    assert "OFFLINE" not in out and "not provable" in out, out
    # Into a coordinator that now holds keys: refused.
    assert main(["recover", "--from-bucket", "--data-dir", str(data_dir)]) == 1
    assert "empty cluster" in capsys.readouterr().err
    gw.start()
    _check_recovery_point(gw.bootstrap, acked, {("walonly", 0): 9})  # w9: the newest flush


def _provable_ends(get, keys, snapshot: bytes, topic_ids: dict[str, uuid.UUID]) -> dict[tuple[str, int], int]:
    """Where THE RULE says each partition's rebuilt log ends, worked out from the bucket
    independently of the rebuild (no upload is fenced here): at the first offset past its
    newest manifest that lies in a gateway's newest WAL object, unless the snapshot lists
    that object or a later proven range of the partition follows it (partitions not named:
    every acknowledged record)."""
    from stratalog.coordinator.backup import decode
    from stratalog.tiering.manifest import read_manifest

    listed = {k for k, _ in decode(snapshot).keys if k.startswith("wal/")}
    sealed: dict[tuple[uuid.UUID, int], int] = {}
    for key in keys(layout.MANIFESTS_ROOT):
        m = read_manifest(get(key))
        if m.segments:
            sealed[(m.topic_id, m.partition)] = max(sealed.get((m.topic_id, m.partition), 0),
                                                    m.segments[-1].last_offset + 1)
    newest: dict[int, int] = {}
    found = []
    for key in keys(layout.WAL_ROOT):
        gw, seq = layout.parse_wal_key(key)
        newest[gw] = max(newest.get(gw, -1), seq)
        found += [((gw, seq), info) for info, _ in read_wal(get(key)) if info.topic_id != CONFIRMATION_TOPIC_ID]

    def proven(ws) -> bool:
        return ws[1] < newest[ws[0]] or f"wal/{ws[0]}/{ws[1]:020d}" in listed
    ends: dict[tuple[str, int], int] = {}
    name_of = {tid: name for name, tid in topic_ids.items()}
    for ws, info in found:
        tp = (info.topic_id, info.partition)
        if proven(ws) or info.last_offset < sealed.get(tp, 0):
            continue
        if any(proven(w) and (i.topic_id, i.partition) == tp and i.base_offset > info.last_offset
               for w, i in found):
            continue  # a later proven range of the partition shows it was committed
        end = max(info.base_offset, sealed.get(tp, 0))
        key = (name_of[info.topic_id], info.partition)
        ends[key] = min(ends.get(key, end), end)
    return ends


def test_etcd_lost_rebuilt_from_s3_with_two_gateways(gateway_factory, etcd, moto_s3, tmp_path, capsys):  # noqa: F811
    """Two gateways: each one's newest flush is what the bucket cannot prove; every other
    acknowledged record is back, checked against ends worked out from the bucket."""
    from cluster_fixtures import coordinator_call, start_cluster
    from stratalog.infra.cli import main

    gws = start_cluster(gateway_factory, etcd, tmp_path, 2, s3=moto_s3, **{
        "log.segment.bytes": 1400, "coordinator.snapshot.interval.ms": 1000,
        "coordinator.snapshot.retain": 1000})

    def times():
        return [layout.parse_snapshot_key(k) for k in moto_s3.keys(layout.SNAPSHOTS_ROOT)]
    snapshot, acked = _losing_the_coordinator_scenario(gws[0].bootstrap, times, big_segments=str(64 << 20))
    topic_ids = coordinator_call(etcd.url, lambda s: s.topics())
    topic_ids = {name: t.topic_id for name, t in topic_ids.items()}
    for gw in gws:
        gw.kill9()
    newer = [layout.snapshot_key(t) for t in times() if t > snapshot]
    if newer:
        moto_s3.client().delete_objects(Bucket=moto_s3.bucket, Delete={
            "Objects": [{"Key": f"{moto_s3.prefix}/{k}"} for k in newer]})
    assert snapshot in times()  # retention (1000 snapshots) kept it
    coordinator_call(etcd.url, lambda s: s.kv.delete_prefix(s.prefix))

    client = moto_s3.client()

    def get(key: str) -> bytes:
        return client.get_object(Bucket=moto_s3.bucket, Key=f"{moto_s3.prefix}/{key}")["Body"].read()
    ends = _provable_ends(get, moto_s3.keys, get(layout.snapshot_key(snapshot)), topic_ids)
    assert ("walonly", 0) in ends  # w9, its gateway's newest flush

    capsys.readouterr()
    store_args = ["--object-store", moto_s3.url, "--s3-endpoint", moto_s3.endpoint, "--s3-path-style"]
    assert main(["recover", "--from-bucket", "--coordinator", etcd.url, *store_args]) == 0
    out = capsys.readouterr().out
    assert layout.snapshot_key(snapshot) in out and "OFFLINE" not in out, out
    for gw in gws:
        gw.start(timeout=60)
    _check_recovery_point(gws[0].bootstrap, acked, ends)


@pytest.mark.unit
def test_garbage_collection_keeps_the_object_that_proves_an_older_needed_one():
    """Gateway 1's newest object has only sealed ranges but confirms its older, still needed
    one: it stays until that one goes. Gateway 2's are all obsolete: all go."""
    from stratalog.coordinator.model import WalObject
    from stratalog.engine.cleanup import proof_carriers

    def obj(gw: int, seq: int) -> WalObject:
        return WalObject(gw, seq, layout.wal_key(gw, seq), ())
    committed = [obj(1, 3), obj(1, 4), obj(1, 5), obj(2, 7), obj(2, 8)]
    obsolete = [obj(1, 4), obj(1, 5), obj(2, 7), obj(2, 8)]
    assert proof_carriers(committed, obsolete) == {(1, 5)}
    assert proof_carriers(committed, obsolete + [obj(1, 3)]) == set()


@pytest.mark.unit
def test_snapshots_keep_the_newest_and_a_new_controller_continues_the_schedule(tmp_path: Path):
    async def body():
        store = open_coordinator(None, tmp_path / "coord")
        objects = open_store((tmp_path / "objects").as_uri())
        try:
            await store.create_topic("t", 1, 1, {}, {0: PartitionState(1, 0, (1,), (1,))})
            now = [10_000]
            writer = SnapshotWriter(store, objects, interval_ms=1000, retain=2, now_ms=lambda: now[0])
            written = []
            for _ in range(4):
                written.append(await writer.maybe_write(is_controller=True))
                now[0] += 1000
            assert [k for k in written if k] == [layout.snapshot_key(t) for t in (10_000, 11_000, 12_000, 13_000)]
            assert [o.key for o in await objects.list(layout.SNAPSHOTS_ROOT)] == \
                [layout.snapshot_key(12_000), layout.snapshot_key(13_000)]
            # Another gateway becomes controller half an interval after the newest one.
            now[0] = 13_500
            successor = SnapshotWriter(store, objects, interval_ms=1000, retain=2, now_ms=lambda: now[0])
            assert await successor.maybe_write(is_controller=True) is None
            now[0] = 14_000
            assert await successor.maybe_write(is_controller=True) == layout.snapshot_key(14_000)
            from stratalog.coordinator.backup import decode
            snap = decode(await objects.get(layout.snapshot_key(14_000)))
            assert any(k == "topics/t" for k, _ in snap.keys) and snap.cluster_id == await store.cluster_id()
        finally:
            await store.close()
            await objects.close()

    asyncio.run(body())


@pytest.mark.unit
def test_recover_cli_from_an_empty_bucket_and_into_a_cluster_that_holds_keys(tmp_path: Path, capsys):
    from stratalog.infra.cli import main

    data_dir = tmp_path / "data"
    (data_dir / "objects").mkdir(parents=True)
    assert main(["recover", "--from-bucket", "--data-dir", str(data_dir)]) == 0
    assert "no snapshot" in capsys.readouterr().out
    # It wrote the (empty) cluster's keys: a second run is refused, changing nothing.
    assert main(["recover", "--from-bucket", "--data-dir", str(data_dir)]) == 1
    assert "empty cluster" in capsys.readouterr().err


@pytest.mark.unit
def test_a_failed_snapshot_is_retried_after_a_pause_not_every_tick(tmp_path: Path):
    import errno

    from stratalog.engine.snapshots import RETRY_MS
    from stratalog.tiering.objectstore.base import ObjectStoreError
    from store_faults import FailingWrites

    async def body():
        store = open_coordinator(None, tmp_path / "coord")
        fault = [(errno.ENOSPC, layout.SNAPSHOTS_ROOT)]
        objects = FailingWrites(open_store((tmp_path / "objects").as_uri()), lambda: fault[0])
        try:
            now = [50_000]
            writer = SnapshotWriter(store, objects, interval_ms=1000, retain=2, now_ms=lambda: now[0])
            with pytest.raises(ObjectStoreError):
                await writer.maybe_write(is_controller=True)
            now[0] += RETRY_MS - 1
            assert await writer.maybe_write(is_controller=True) is None and objects.failed == 1
            fault[0] = None
            now[0] += 1
            assert await writer.maybe_write(is_controller=True) == layout.snapshot_key(now[0])
        finally:
            await store.close()
            await objects.close()

    asyncio.run(body())


@pytest.mark.unit
def test_a_transaction_begun_after_the_snapshot_and_left_open_brings_its_partition_back_offline(tmp_path: Path):
    """Its state was only in the lost coordinator, so nothing could ever end it; a
    transaction that a marker closes, on the other partition, does not hold anything back."""
    from stratalog.tiering.batch import build_batch
    from stratalog.tiering.txn import marker_batch

    async def body():
        source = open_coordinator(None, tmp_path / "source")
        objects = open_store((tmp_path / "objects").as_uri())
        t = await source.create_topic("tx", 2, 1, {}, {p: PartitionState(1, 0, (1,), (1,)) for p in (0, 1)})
        await SnapshotWriter(source, objects, interval_ms=1, retain=1, now_ms=lambda: 5).write()
        await source.close()

        def txn_batch(offset: int, pid: int) -> bytes:
            return build_batch([(b"k", b"v")], base_offset=offset, timestamp_ms=1, producer_id=pid,
                               producer_epoch=0, base_sequence=0, is_transactional=True)

        def marker(offset: int, pid: int) -> bytes:
            data = bytearray(marker_batch(pid, 0, commit=True, coordinator_epoch=0, timestamp_ms=1))
            data[0:8] = offset.to_bytes(8, "big")
            return bytes(data)
        b = WalBuilder()
        b.add(t.topic_id, 0, 0, 0, 1, txn_batch(0, 77))  # never closed
        b.add(t.topic_id, 1, 0, 0, 1, txn_batch(0, 88))
        b.add(t.topic_id, 1, 1, 1, 1, marker(1, 88))
        await objects.put(layout.wal_key(1, 1), b.build()[0])
        later = WalBuilder()
        add_confirmations(later, SequenceSet([(1, 1)]))
        await objects.put(layout.wal_key(1, 2), later.build()[0])

        target = open_coordinator(None, tmp_path / "target")
        try:
            report = await recover_from_bucket(target, objects, tmp_path / "scratch")
            outcome = {o.partition: o for o in report.restore.partitions}
            assert outcome[0].status == OFFLINE and "producer id 77 is open from offset 0" in outcome[0].detail
            assert outcome[1].status != OFFLINE
            assert (await target.log_state(t.topic_id, 1)).high_watermark == 2
        finally:
            await target.close()
            await objects.close()

    asyncio.run(body())


def test_a_fenced_upload_left_in_s3_does_not_come_back(etcd, moto_s3, fault_proxy, gateway_factory,  # noqa: F811
                                                        tmp_path, capsys):
    """Gateway 2's WAL upload is held in the network while it is frozen; its partition
    moves to gateway 1, which acknowledges the producer's retry; the upload then lands,
    gateway 2's commit is fenced and its delete is undone (as if it had died first). The
    rebuild does not take that object: the records are gateway 1's, at their offsets."""
    import signal
    import threading

    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from cluster_fixtures import QUIET, bootstrap_of, coordinator_call, start_cluster, try_leaders, wait_for
    from s3_fault_proxy import FaultRule
    from stratalog.infra.cli import main

    gws = start_cluster(gateway_factory, etcd, tmp_path, 2, s3=moto_s3, s3_endpoints={2: fault_proxy.endpoint},
                        **{"coordinator.snapshot.interval.ms": 1000})
    bootstrap = bootstrap_of(gws)
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic("fence", 1, replica_assignment=[[2, 1]])])["fence"].result(30)
    wait_for(lambda: try_leaders(bootstrap, "fence").get(0) == 2, what="gateway 2 to lead fence-0")
    acked: list[tuple[int, bytes]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 0, "request.timeout.ms": 3000, "logger": QUIET})

    def send(value: bytes) -> None:
        producer.produce("fence", value, partition=0,
                         on_delivery=lambda err, msg: acked.append((msg.offset(), msg.value())) if not err else None)
        assert producer.flush(90) == 0
    for i in range(3):
        send(f"before-{i}".encode())

    fault_proxy.set_rules(FaultRule(("PUT",), "hold", key_contains="wal/"))
    held_send = threading.Thread(target=send, args=(b"held",))
    held_send.start()
    wait_for(lambda: fault_proxy.held() >= 1, what="gateway 2's WAL upload to be held")
    held_key = next(r.key for r, action in fault_proxy.log if action == "hold")[len(moto_s3.prefix) + 1:]
    gws[1].proc.send_signal(signal.SIGSTOP)
    try:
        wait_for(lambda: try_leaders(gws[0].bootstrap, "fence").get(0) == 1, timeout=60,
                 what="fence-0 to move to gateway 1")
        held_send.join(90)
        assert not held_send.is_alive() and (3, b"held") in acked, acked
        fault_proxy.clear()
        fault_proxy.release()
        wait_for(lambda: held_key in moto_s3.keys("wal/"), what="the held upload to land")
        s3 = moto_s3.client()
        fenced = s3.get_object(Bucket=moto_s3.bucket, Key=f"{moto_s3.prefix}/{held_key}")["Body"].read()
    finally:
        gws[1].proc.send_signal(signal.SIGCONT)
    wait_for(lambda: held_key not in moto_s3.keys("wal/"), timeout=30, what="gateway 2 to remove its fenced upload")
    s3.put_object(Bucket=moto_s3.bucket, Key=f"{moto_s3.prefix}/{held_key}", Body=fenced)
    # Later records, so the fenced object is no gateway's newest.
    wait_for(lambda: try_leaders(bootstrap, "fence").get(0) == 2, timeout=60, what="gateway 2 to lead again")
    for i in range(3):
        send(f"after-{i}".encode())
    for gw in gws:
        gw.kill9()
    coordinator_call(etcd.url, lambda s: s.kv.delete_prefix(s.prefix))

    capsys.readouterr()
    store_args = ["--object-store", moto_s3.url, "--s3-endpoint", moto_s3.endpoint, "--s3-path-style"]
    assert main(["recover", "--from-bucket", "--coordinator", etcd.url, *store_args]) == 0
    out = capsys.readouterr().out
    assert "OFFLINE" not in out, out

    async def restored(store):
        info = await store.topic("fence")
        return [k for k, _ in await store.wal_ranges(info.topic_id, 0, 0)], \
            (await store.log_state(info.topic_id, 0)).high_watermark
    keys, end = coordinator_call(etcd.url, restored)
    assert held_key not in keys and end >= 4  # offset 3 ("held") is gateway 1's
    gws[0].start(timeout=60)
    h = _e2e_imports()
    got = h._read_all(gws[0].bootstrap, "fence", [0], {0: end})[0]
    assert [(o, v) for o, _, v, _ in got] == sorted(acked)[:end]


@pytest.mark.unit
def test_a_gap_before_a_proven_range_is_filled_by_the_upload_of_the_highest_epoch(tmp_path: Path):
    """Offset 2 is in gateway 1's newest flush (epoch 1, committed) and in gateway 2's
    fenced upload (epoch 0); gateway 2's proven range at 3 (epoch 2) shows offset 2 was
    committed: gateway 1's is taken, never the fenced one. Without a later proven range,
    a gateway's newest flush stays out."""
    from stratalog.tiering.batch import build_batch

    async def body():
        objects = open_store((tmp_path / "objects").as_uri())
        tid = uuid.uuid4()
        base = layout.segment_key_base("g", tid, 0, 0, 0, "s0")
        for ext in layout.SEGMENT_EXTENSIONS:
            await objects.put(base + ext, b"x")
        await objects.put(layout.manifest_key("g", tid, 0, 1), write_manifest(
            "g", tid, 0, 1, 0, [SegmentRecord(0, 1, base, 1, 0, 0, 0)]))

        async def put(gw: int, seq: int, confirm, *batches: tuple[int, int]) -> None:
            b = WalBuilder()
            for offset, epoch in batches:
                b.add(tid, 0, offset, offset, 1, build_batch([(b"k", f"{gw}-{offset}".encode())], base_offset=offset,
                                                             timestamp_ms=1, partition_leader_epoch=epoch))
            add_confirmations(b, SequenceSet(confirm))
            await objects.put(layout.wal_key(gw, seq), b.build()[0])
        await put(2, 1, [], (2, 0))  # fenced: never confirmed
        await put(1, 1, [], (2, 1))  # committed, gateway 1's newest
        await put(2, 2, [], (3, 2))  # committed ...
        await put(2, 3, [(2, 2)], (4, 2))  # ... and proven by this one, gateway 2's newest

        target = open_coordinator(None, tmp_path / "target")
        try:
            report = await recover_from_bucket(target, objects, tmp_path / "scratch")
            (outcome,) = report.partitions
            assert (outcome.sealed_end, outcome.log_end) == (2, 4), outcome
            assert [k for k, _ in await target.wal_ranges(tid, 0, 0)] == [layout.wal_key(1, 1), layout.wal_key(2, 2)]
        finally:
            await target.close()
            await objects.close()

    asyncio.run(body())
