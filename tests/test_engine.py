"""The log engine in process, on a fake wall clock: every scenario runs against the embedded
coordinator with a file:// store and against a real etcd with moto's S3 server.

WAL flushes are made to happen by `wal.flush.bytes` (the harness default flushes every
append at once) and never by `wal.flush.ms`, which is a real-time timer; segment.ms and
retention follow the fake clock. Nothing here asserts on elapsed time: waits are bounded
by generous timeouts that only a broken engine reaches.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shutil
import uuid
from collections import Counter

import pytest

from moto_fixture import MotoServer, dummy_aws_env
from stratalog.coordinator.kv import CoordinatorUnavailable
from stratalog.coordinator.model import PartitionState, TopicInfo
from stratalog.engine import Batches
from stratalog.engine.errors import (CorruptLog, CorruptRead, NotLeader, OffsetOutOfRange, RecordTooLarge,
                                     StorageUnavailable)
from stratalog.engine.producers import OutOfOrderSequence
from stratalog.engine.wal_writer import WalCommitDelayed, WalCommitFailed
from stratalog.gateway.cluster import balance_leaders, decide_partition, new_topic_assignments
from stratalog.gateway.config import ConfigError, parse_value
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.tiering import layout
from stratalog.engine.validation import validate_batches
from stratalog.tiering.batch import (CREATE_TIME, LOG_APPEND_TIME, BatchHeader, CorruptBatch, UnsupportedMagic,
                                     build_batch, set_max_timestamp)
from stratalog.tiering.manifest import read_manifest
from stratalog.tiering.objectstore import ObjectNotFound
from stratalog.tiering.txn import decode_txnindex
from stratalog.engine.transactions import PartitionTxns

try:
    from tests.engine_harness import (TIMEOUT_S, WALL_START_MS, Backends, HeldUploads, assert_stored, batches_of,
                                      batch, committed, eventually, read_all, records_of, run)
    from tests.etcd_fixture import etcd_server  # noqa: F401  (fixture)
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    from engine_harness import (TIMEOUT_S, WALL_START_MS, Backends, HeldUploads,  # type: ignore
                                assert_stored, batch, batches_of, committed, eventually, read_all, records_of, run)
    from etcd_fixture import etcd_server  # type: ignore  # noqa: F401

SEGMENT_EXTENSIONS = (layout.LOG, layout.INDEX, layout.TIMEINDEX)


# --- backends ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def moto_url():
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    server = MotoServer().start()
    yield server.url
    server.stop()


@pytest.fixture(params=[pytest.param("embedded+file", marks=pytest.mark.unit),
                        pytest.param("etcd+s3", marks=pytest.mark.integration)])
def backends(request, tmp_path, monkeypatch) -> Backends:
    if request.param == "embedded+file":
        return Backends(request.param, tmp_path)
    etcd = request.getfixturevalue("etcd_server")
    s3 = request.getfixturevalue("moto_url")
    dummy_aws_env(monkeypatch, tmp_path)
    import boto3

    bucket = f"engine-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3, region_name="us-east-1").create_bucket(Bucket=bucket)
    return Backends(request.param, tmp_path, etcd_endpoint=etcd.endpoint, s3_endpoint=s3, bucket=bucket)


# --- helpers ----------------------------------------------------------------------------

async def sealed_segments(h, engine, topic: str, partition: int, count: int):
    """Wait until `count` segments are committed, nothing rolled is left to upload and the
    newest manifest lists them (the last step of sealing)."""
    plog = engine.leader(topic, partition)

    async def done():
        segs = await h.store.segments(plog.topic_id, partition)
        if len(segs) < count or plog.rolled:
            return None
        listed = await newest_manifest(h, topic, plog.topic_id, partition)
        return segs if listed and [s.key_base for s in listed.segments] == [s.key_base for s in segs] else None

    segs = await eventually(done, f"{count} sealed segment(s) of {topic}-{partition}")
    assert len(segs) == count
    return segs


async def newest_manifest(h, topic: str, topic_id, partition: int):
    keys = await h.keys(layout.partition_manifest_prefix(topic, topic_id, partition))
    try:
        return read_manifest(await h.objects.get(keys[-1])) if keys else None
    except ObjectNotFound:  # replaced by a newer one since the listing
        return None


async def send(engine, topic: str, partition: int, data: bytes, now_ms: int):
    """Append and wait for the commit (acks=all)."""
    result = engine.append(topic, partition, data, now_ms=now_ms)
    await committed(result)
    return result


async def no_wal_objects(h, node_id: int = 1) -> bool:
    return not await h.keys(layout.wal_prefix(node_id))


def expected_records(sent: list[tuple[int, bytes]]) -> list[tuple]:
    """The records of (base offset, original batch) pairs as the log must return them."""
    out = []
    for base, data in sent:
        out += [(base + off, ts, k, v, hs) for off, ts, k, v, hs in records_of(data)]
    return out


# --- 1. acks=all ------------------------------------------------------------------------

def test_acks_all_waits_for_the_wal_commit_and_not_longer(backends):
    """An append is committed with its WAL object, no sooner (nothing is visible before)
    and no later (the flush that crosses wal.flush.bytes commits every waiting append,
    of every partition, in one object)."""

    async def body(h):
        info = await h.create_topic("acks", 2)
        first = batch(3, ts=h.clock.ms, tag="a")
        second = batch(2, ts=h.clock.ms, tag="b")
        engine = await h.start_engine(wal_flush_ms=60_000, wal_flush_bytes=len(first) + 1)
        await h.lead(engine)

        r1 = engine.append("acks", 0, first, now_ms=h.clock.ms)
        assert (r1.base_offset, r1.records, r1.bytes) == (0, 3, len(first))
        await asyncio.sleep(0.3)
        p0 = engine.leader("acks", 0)
        assert not r1.commit.done()
        assert (p0.high_watermark, p0.next_offset) == (0, 3)
        assert await engine.read(p0, 0, 1 << 20) == b""
        assert await h.store.wal_objects() == []
        assert (await h.store.log_state(info.topic_id, 0)).high_watermark == 0

        # Crosses wal.flush.bytes: one WAL object commits both partitions' batches.
        r2 = engine.append("acks", 1, second, now_ms=h.clock.ms)
        await asyncio.wait_for(asyncio.gather(r1.commit, r2.commit), TIMEOUT_S)

        [obj] = await h.store.wal_objects()
        assert obj.gateway_id == 1
        assert sorted((r.partition, r.base_offset, r.last_offset) for r in obj.ranges) == [(0, 0, 2), (1, 0, 1)]
        assert await h.keys(layout.wal_prefix(1)) == [obj.key]
        for p, end, original in ((0, 3, first), (1, 2, second)):
            assert (await h.store.log_state(info.topic_id, p)).high_watermark == end
            assert engine.high_watermark("acks", p) == end
            assert_stored(original, await read_all(engine, "acks", p), base_offset=0, leader_epoch=0)

        # The next batch of partition 0 lands after the first, in the next WAL object.
        third = batch(4, ts=h.clock.ms, tag="c")
        assert (await send(engine, "acks", 0, third, h.clock.ms)).base_offset == 3
        assert_stored(third, await read_all(engine, "acks", 0, start=3), base_offset=3, leader_epoch=0)
        assert len(await h.store.wal_objects()) == 2

    run(backends, body)


def test_a_batch_in_a_writable_buffer_is_patched_in_place_and_others_are_copied(backends):
    """The gateway reads request frames into buffers of its own, and the engine assigns
    offsets in them instead of copying each batch; a batch in read-only memory, or a small
    one in a large frame (which it would keep alive until the segment is written), is
    copied first and left as it was. All land in the log and the WAL object as stored."""

    async def body(h):
        await h.create_topic("inplace", 1)
        engine = await h.start_engine()
        await h.lead(engine)
        first = batch(2, ts=h.clock.ms, tag="a")
        await send(engine, "inplace", 0, first, h.clock.ms)
        second = batch(3, ts=h.clock.ms, tag="b")
        frame = bytearray(b"head" + second + b"tail")
        view = memoryview(frame)[4:4 + len(second)]
        assert (await send(engine, "inplace", 0, view, h.clock.ms)).base_offset == 2
        assert BatchHeader.parse(frame, 4).base_offset == 2  # patched where it lay
        assert frame[:4] == b"head" and frame[-4:] == b"tail"
        stored = await read_all(engine, "inplace", 0)
        assert_stored(first, stored[:len(first)], base_offset=0, leader_epoch=0)
        assert_stored(second, stored[len(first):], base_offset=2, leader_epoch=0)
        [obj] = [o for o in await h.store.wal_objects() if o.ranges[0].base_offset == 2]
        wal = await h.objects.get(obj.key)
        r = obj.ranges[0]
        assert wal[r.position:r.position + r.length] == bytes(view)

        third = batch(1, ts=h.clock.ms, tag="c")
        large = bytearray(third + bytes(2 * len(third)))
        assert (await send(engine, "inplace", 0, memoryview(large)[:len(third)], h.clock.ms)).base_offset == 5
        assert large[:len(third)] == third  # copied, not patched
        assert_stored(third, (await read_all(engine, "inplace", 0))[len(first) + len(second):],
                      base_offset=5, leader_epoch=0)

    run(backends, body)


def test_a_stop_during_a_flush_commits_what_queued_behind_it_and_ends(backends):
    """A gateway stopped under load (a rolling restart): the stop arrives while one WAL
    object is being uploaded and more batches wait behind it. Both are committed and the
    stop ends at once, abandoning nothing (it used to wait for a wake-up that never came
    until shutdown.timeout.ms abandoned it, holding the partitions' leadership as long)."""

    async def body(h):
        await h.create_topic("stopping", 1)
        held = HeldUploads(h.objects, hold=lambda key: key.startswith(layout.wal_prefix(1)))
        engine = await h.start_engine(objects=held)
        await h.lead(engine)
        first = engine.append("stopping", 0, batch(2, ts=h.clock.ms, tag="a"), now_ms=h.clock.ms)
        await eventually(lambda: held.held, "the first WAL upload")
        second = engine.append("stopping", 0, batch(3, ts=h.clock.ms, tag="b"), now_ms=h.clock.ms)

        h.engines.remove(engine)
        stopping = asyncio.ensure_future(engine.stop(flush_timeout_s=TIMEOUT_S))
        await asyncio.sleep(0.2)
        assert not stopping.done()  # the held upload is still under way
        held.release()
        assert await asyncio.wait_for(stopping, TIMEOUT_S / 2) is None
        await committed(first)
        await committed(second)
        objs = await h.store.wal_objects()
        assert sorted((r.base_offset, r.last_offset) for o in objs for r in o.ranges) == [(0, 1), (2, 4)]

    run(backends, body)


# --- 2. fencing -------------------------------------------------------------------------

def test_fenced_flush_drops_its_partitions_and_its_object(backends):
    """The controller moved partition 0 away before this engine noticed: the flush holding
    its batches is fenced, every partition in it is dropped (their local segments hold
    uncommitted batches), the producers get a retriable error and the object is deleted."""

    async def body(h):
        info = await h.create_topic("fenced", 2)
        a = batch(2, ts=h.clock.ms, tag="a", producer=(77, 0), sequence=0)
        b = batch(2, ts=h.clock.ms, tag="b")
        engine = await h.start_engine(wal_flush_bytes=len(a) + 1)
        await h.lead(engine)
        await h.move_leadership("fenced", 0, leader=2)

        results = [engine.append("fenced", 0, a, now_ms=h.clock.ms),
                   engine.append("fenced", 0, a, now_ms=h.clock.ms),  # a retry: waits for the first
                   engine.append("fenced", 1, b, now_ms=h.clock.ms)]
        assert [r.base_offset for r in results] == [0, 0, 0]
        for r in results:
            with pytest.raises(WalCommitFailed) as failed:
                await asyncio.wait_for(r.commit, TIMEOUT_S)
            assert error_code(failed.value) == ErrorCode.NOT_LEADER_OR_FOLLOWER
        assert engine.led() == {}
        with pytest.raises(NotLeader):
            engine.append("fenced", 1, b, now_ms=h.clock.ms)
        assert await h.store.wal_objects() == []
        await eventually(lambda: no_wal_objects(h), "the fenced WAL object to be deleted")
        for p in (0, 1):
            assert (await h.store.log_state(info.topic_id, p)).high_watermark == 0

        # The next sync takes partition 1 (still ours) again, rebuilt from committed data.
        await h.lead(engine)
        assert set(engine.led()) == {("fenced", 1)}
        p1 = engine.leader("fenced", 1)
        assert (p1.high_watermark, p1.next_offset) == (0, 0)
        big = batch(2, ts=h.clock.ms, tag="c", value_size=2 * len(a))  # over wal_flush_bytes alone
        assert (await send(engine, "fenced", 1, big, h.clock.ms)).base_offset == 0
        assert_stored(big, await read_all(engine, "fenced", 1), base_offset=0, leader_epoch=0)

    run(backends, body)


class FailingCommits:
    """A coordinator whose WAL commits fail as in an outage while `failing` is set."""

    def __init__(self, inner):
        self.inner = inner
        self.failing = False

    async def commit_wal(self, obj, epochs):
        if self.failing:
            raise CoordinatorUnavailable("the test's outage")
        return await self.inner.commit_wal(obj, epochs)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def test_a_flush_fenced_after_the_storage_fault_ends_the_fault(backends):
    """The coordinator was unreachable past wal.fault.timeout.ms (the WAL is failed: new
    batches refused) and, while it was, a partition of the flush moved: the commit that
    finally reaches it is fenced. That answer ends the fault, so the partitions still ours
    take batches again once re-led (left failed, the engine refused every batch, and with
    nothing appended no flush ever came to end it)."""

    async def body(h):
        await h.create_topic("fault-fenced", 2)
        store = FailingCommits(h.store)
        engine = await h.start_engine(store=store, wal_fault_timeout_ms=50)
        await h.lead(engine)
        store.failing = True
        waiting = [engine.append("fault-fenced", p, batch(2, ts=h.clock.ms, tag=f"p{p}"), now_ms=h.clock.ms)
                   for p in (0, 1)]
        for r in waiting:
            with pytest.raises(WalCommitDelayed):
                await asyncio.wait_for(r.commit, TIMEOUT_S)
        assert engine.storage_fault() is not None
        with pytest.raises(StorageUnavailable):
            engine.append("fault-fenced", 1, batch(1, ts=h.clock.ms), now_ms=h.clock.ms)

        await h.move_leadership("fault-fenced", 0, leader=2)
        store.failing = False
        await eventually(lambda: engine.led() == {}, "the fenced flush to drop its partitions")
        assert engine.storage_fault() is None

        await h.lead(engine)
        assert set(engine.led()) == {("fault-fenced", 1)}
        again = batch(2, ts=h.clock.ms, tag="again")
        assert (await send(engine, "fault-fenced", 1, again, h.clock.ms)).base_offset == 0
        assert_stored(again, await read_all(engine, "fault-fenced", 1), base_offset=0, leader_epoch=0)

    run(backends, body)


# --- 3. sealing -------------------------------------------------------------------------

def test_segment_ms_seals_the_active_segment(backends):
    """segment.ms after the segment's first record, the timer's roll_due seals it: the
    .log/.index/.timeindex objects and a manifest are written, the segment entry replaces
    the WAL ranges it covers, and the WAL object is collected on the next clean."""

    async def body(h):
        info = await h.create_topic("roll", 1, {"segment.ms": "60000"})
        engine = await h.start_engine()
        await h.lead(engine)
        plog = engine.leader("roll", 0)

        # An idle partition does not roll however long it stays empty, and segment.ms
        # counts from the first record, not from when the empty segment was opened.
        h.clock.advance(120_000)
        engine.roll_due()
        assert not plog.rolled

        ts = h.clock.ms
        sent = [batch(2, ts=ts, tag=f"b{i}") for i in range(3)]
        for data in sent:
            await send(engine, "roll", 0, data, h.clock.ms)
        stored = await read_all(engine, "roll", 0)
        wal_keys = await h.keys(layout.wal_prefix(1))
        assert wal_keys and len(await h.store.wal_ranges(info.topic_id, 0, 0)) >= 1

        h.clock.advance(59_999)
        engine.roll_due()
        assert not plog.rolled and plog.active.size == len(stored)
        h.clock.advance(1)
        engine.roll_due()
        [entry] = await sealed_segments(h, engine, "roll", 0, 1)

        assert (entry.base_offset, entry.last_offset, entry.size) == (0, 5, len(stored))
        assert entry.min_timestamp == entry.max_timestamp == ts
        for ext in SEGMENT_EXTENSIONS:
            assert await h.exists(entry.key_base + ext)
        assert await h.objects.get(entry.key_base + layout.LOG) == stored
        manifest = await newest_manifest(h, "roll", info.topic_id, 0)
        assert (manifest.log_start_offset, manifest.version) == (0, 1)
        assert [(s.base_offset, s.last_offset, s.key_base) for s in manifest.segments] == \
            [(0, 5, entry.key_base)]
        assert await h.store.wal_ranges(info.topic_id, 0, 0) == []
        assert plog.active.size == 0 and plog.active.base_offset == 6

        # The WAL object is obsolete now, but only a collection pass deletes it.
        for key in wal_keys:
            assert await h.exists(key)
        await engine.collect_obsolete_wal_objects()
        for key in wal_keys:
            assert not await h.exists(key)
        assert await h.store.wal_objects() == []
        assert await read_all(engine, "roll", 0) == stored  # served from the sealed segment now

    run(backends, body)


def test_the_frequent_wal_collection_searches_only_after_something_settled(backends):
    """`collect_obsolete_wal_objects` (a gateway's pass every few seconds) walks every WAL
    object only when a segment, log start or topic changed since its last search: WAL
    commits alone make nothing obsolete. The retention check's `clean` always searches."""

    async def body(h):
        await h.create_topic("often", 1, {"segment.ms": "60000"})
        engine = await h.start_engine()
        await h.lead(engine)
        searches = []
        real = engine.cleaner.store.obsolete_wal_objects

        async def counted():
            searches.append(h.clock.ms)
            return await real()
        engine.cleaner.store.obsolete_wal_objects = counted

        await send(engine, "often", 0, batch(2, ts=h.clock.ms), h.clock.ms)
        await engine.collect_obsolete_wal_objects()
        assert len(searches) == 1  # the first pass searches
        await send(engine, "often", 0, batch(2, ts=h.clock.ms, tag="b"), h.clock.ms)
        await engine.collect_obsolete_wal_objects()
        assert len(searches) == 1
        wal_keys = await h.keys(layout.wal_prefix(1))
        assert len(wal_keys) == 2

        h.clock.advance(60_000)
        engine.roll_due()
        await sealed_segments(h, engine, "often", 0, 1)
        await engine.collect_obsolete_wal_objects()
        assert len(searches) == 2
        assert not any([await h.exists(k) for k in wal_keys])
        await engine.collect_obsolete_wal_objects()  # its own deletions settle nothing
        assert len(searches) == 2
        await engine.clean()
        assert len(searches) == 3

    run(backends, body)


def test_a_damaged_sealed_segment_fails_its_partition_only(backends):
    """A sealed .log damaged in the store after upload is refused on read as CorruptRead
    (CORRUPT_MESSAGE, which consumers hand to the application) and on a timestamp lookup that
    reaches it as CorruptLog (KAFKA_STORAGE_ERROR), never served, counted once however often it is read,
    and none of it stays in the read cache; the topic's other partition keeps serving."""

    async def body(h):
        await h.create_topic("dmg", 2, {"segment.ms": "60000"})
        engine = await h.start_engine()
        await h.lead(engine)
        ts = h.clock.ms
        for p in (0, 1):
            for i in range(3):
                await send(engine, "dmg", p, batch(2, ts=ts, tag=f"{p}-{i}"), h.clock.ms)
        h.clock.advance(60_000)
        engine.roll_due()
        [damaged] = await sealed_segments(h, engine, "dmg", 0, 1)
        [healthy] = await sealed_segments(h, engine, "dmg", 1, 1)
        data = bytearray(await h.objects.get(damaged.key_base + layout.LOG))
        data[-3] ^= 0xFF  # inside the last batch's records, under its CRC
        await h.objects.put(damaged.key_base + layout.LOG, bytes(data))

        plog = engine.leader("dmg", 0)
        for _ in range(2):  # a consumer retrying
            with pytest.raises(CorruptRead, match="CRC"):
                await read_all(engine, "dmg", 0, start=4)
        assert engine.corrupt_batches == {"dmg": 1}
        assert not [e for e in engine.cache._lru if e[0] == damaged.key_base + layout.LOG]
        assert (await engine.list_offset(plog, ts))[0] < 4  # found in an intact batch
        with pytest.raises(CorruptLog):
            await engine.list_offset(plog, -3)  # MAX_TIMESTAMP reads every batch
        assert error_code(CorruptRead()) == ErrorCode.CORRUPT_MESSAGE
        assert error_code(CorruptLog()) == ErrorCode.KAFKA_STORAGE_ERROR
        assert len(records_of(await read_all(engine, "dmg", 1))) == 6
        assert healthy.size == len(await h.objects.get(healthy.key_base + layout.LOG))

    run(backends, body)


def test_segment_bytes_seals_on_append(backends):
    """An append that brings the active segment to segment.bytes rolls it at once."""
    with pytest.raises(ConfigError):
        parse_value("segment.bytes", 13)  # the smallest segment.bytes is 14 bytes

    async def body(h):
        one = batch(2, ts=h.clock.ms, tag="x")
        info = await h.create_topic("bytes", 1, {"segment.bytes": str(2 * len(one))})
        engine = await h.start_engine()
        await h.lead(engine)
        plog = engine.leader("bytes", 0)

        await send(engine, "bytes", 0, batch(2, ts=h.clock.ms, tag="a"), h.clock.ms)
        assert not plog.rolled and await h.store.segments(info.topic_id, 0) == []
        # Nothing in the object store's segments yet: all of the log is local (KIP-405 specs).
        assert await engine.list_offset(plog, -4) == (0, -1)  # EARLIEST_LOCAL
        assert await engine.list_offset(plog, -5) == (-1, -1)  # LATEST_TIERED: none
        await send(engine, "bytes", 0, batch(2, ts=h.clock.ms, tag="b"), h.clock.ms)
        [entry] = await sealed_segments(h, engine, "bytes", 0, 1)
        assert (entry.base_offset, entry.last_offset, entry.size) == (0, 3, 2 * len(one))
        assert await h.store.wal_ranges(info.topic_id, 0, 0) == []

        await send(engine, "bytes", 0, batch(2, ts=h.clock.ms, tag="c"), h.clock.ms)
        assert plog.active.base_offset == 4 and plog.active.size == len(one)
        assert len(await h.store.segments(info.topic_id, 0)) == 1
        assert await engine.list_offset(plog, -5) == (3, -1)  # the sealed segment's last offset
        assert await engine.list_offset(plog, -4) == (4, -1)  # the first offset after it
        assert [r.base_offset for _, r in await h.store.wal_ranges(info.topic_id, 0, 0)] == [4]

    run(backends, body)


def test_a_topic_config_change_applies_from_the_next_append(backends):
    """An append reads its topic's configs from a snapshot, read again when the gateway's
    topic table holds a new TopicInfo for the topic (AlterConfigs, or a sync that saw
    another gateway's change): the next append applies them."""
    async def body(h):
        info = await h.create_topic("cfg", 1)
        engine = await h.start_engine()
        await h.lead(engine)
        sent = batch(3, ts=h.clock.ms, tag="a")
        await send(engine, "cfg", 0, sent, h.clock.ms)
        h.topics["cfg"] = dataclasses.replace(info, configs={"max.message.bytes": str(len(sent) - 1)})
        with pytest.raises(RecordTooLarge):
            engine.append("cfg", 0, sent, now_ms=h.clock.ms)
        h.topics["cfg"] = dataclasses.replace(info, configs={"message.timestamp.type": "LogAppendTime",
                                                             "segment.bytes": str(2 * len(sent))})
        stamped_at = h.clock.ms + 7
        result = await send(engine, "cfg", 0, sent, stamped_at)
        assert result.log_append_time and result.base_offset == 3
        stored = batches_of(await read_all(engine, "cfg", 0))
        assert [(b.timestamp_type, b.max_timestamp) for b, _ in stored] == [
            (CREATE_TIME, h.clock.ms), (LOG_APPEND_TIME, stamped_at)]
        # The new segment.bytes (reached by the second batch) rolled the segment.
        assert engine.leader("cfg", 0).active.base_offset == 6
        h.topics["cfg"] = info  # back to the defaults: the first snapshot's values again
        assert not (await send(engine, "cfg", 0, sent, h.clock.ms)).log_append_time

    run(backends, body)


@pytest.mark.unit
def test_batches_split_once_keep_a_split_error_for_the_append():
    """`Batches.split` parses each header once for the produce handler's checks and the
    append; what does not split is refused by the append with the error it always had,
    while the checks before it still see the first header when it parses."""
    good = batch(2, ts=WALL_START_MS, producer=(7, 0), sequence=0)
    split = Batches.split(good + good)
    assert split.error is None and [h.base_sequence for h, _ in split.batches] == [0, 0]
    assert split.first is split.batches[0][0] and split.first.producer_id == 7

    truncated = Batches.split(good + good[:-1])
    assert truncated.batches == [] and isinstance(truncated.error, CorruptBatch)
    assert truncated.first is not None and truncated.first.producer_id == 7
    with pytest.raises(CorruptBatch, match="claims"):
        validate_batches(truncated, max_bytes=1 << 20, compacted=False, timestamps=None)

    magic1 = bytearray(good)
    magic1[16] = 1
    old_format = Batches.split(bytes(magic1))
    assert old_format.first is None and isinstance(old_format.error, UnsupportedMagic)
    assert error_code(old_format.error) == ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT
    assert Batches.split(b"").first is None and error_code(Batches.split(None).error) == ErrorCode.CORRUPT_MESSAGE

    damaged = bytearray(good + good)
    damaged[-1] ^= 1  # the second batch's CRC no longer matches: found before any other check
    with pytest.raises(CorruptBatch, match=f"CRC mismatch in batch at position {len(good)}"):
        validate_batches(Batches.split(bytes(damaged)), max_bytes=1, compacted=False, timestamps=None)


# --- 4. retention and DeleteRecords -----------------------------------------------------

def test_retention_ms_deletes_old_segments(backends):
    async def body(h):
        # segment.bytes at its minimum: every append is a segment of its own.
        info = await h.create_topic("ret-time", 1, {"segment.bytes": "14", "retention.ms": "60000"})
        engine = await h.start_engine()
        await h.lead(engine)
        t0 = h.clock.ms
        for i in range(3):
            await send(engine, "ret-time", 0, batch(2, ts=h.clock.ms, tag=f"s{i}"), h.clock.ms)
            h.clock.advance(30_000)
        a, b, c = await sealed_segments(h, engine, "ret-time", 0, 3)
        assert (a.max_timestamp, b.max_timestamp, c.max_timestamp) == (t0, t0 + 30_000, t0 + 60_000)
        plog = engine.leader("ret-time", 0)

        h.clock.ms = t0 + 60_000  # a is exactly retention.ms old: kept
        await engine.clean()
        assert plog.log_start_offset == 0 and len(await h.store.segments(info.topic_id, 0)) == 3

        h.clock.advance(1)  # now a is older than retention.ms
        await engine.clean()
        assert plog.log_start_offset == a.last_offset + 1 == 2
        assert (await h.store.log_state(info.topic_id, 0)).log_start_offset == 2
        assert await h.store.segments(info.topic_id, 0) == [b, c]
        for ext in SEGMENT_EXTENSIONS:
            assert not await h.exists(a.key_base + ext)
            assert await h.exists(b.key_base + ext) and await h.exists(c.key_base + ext)
        assert await engine.read(plog, 0, 1 << 20) == b""
        assert [r[0] for r in records_of(await read_all(engine, "ret-time", 0))] == [2, 3, 4, 5]
        assert await engine.list_offset(plog, -2) == (2, -1)
        assert await h.store.wal_objects() == []  # sealed, then collected

        h.clock.advance(30_000)
        await engine.clean()
        assert plog.log_start_offset == 4 and await h.store.segments(info.topic_id, 0) == [c]

    run(backends, body)


def test_a_batch_without_its_max_timestamp_is_stored_with_the_records_max(backends):
    """Sarama 1.22 leaves a CreateTime batch's maxTimestamp at -1. As Kafka's broker does,
    the leader sets it from the records (new CRC), so ListOffsets by time finds them."""
    async def body(h):
        await h.create_topic("no-max", 1)
        engine = await h.start_engine()
        await h.lead(engine)
        t0 = h.clock.ms
        sent = bytearray(build_batch([(b"k", b"v", [])] * 3, timestamps=[t0, t0 + 5, t0 + 3]))
        set_max_timestamp(sent, 0, -1)
        await send(engine, "no-max", 0, bytes(sent), h.clock.ms)
        plog = engine.leader("no-max", 0)
        [(stored, _)] = batches_of(await read_all(engine, "no-max", 0))  # CRCs checked
        assert (stored.base_timestamp, stored.max_timestamp) == (t0, t0 + 5)
        assert [r[1] for r in records_of(await read_all(engine, "no-max", 0))] == [t0, t0 + 5, t0 + 3]
        assert (await engine.list_offset(plog, t0 + 4))[0] == 1
        assert await engine.list_offset(plog, t0 + 6) is None  # past the last record
        assert BatchHeader.parse(sent).max_timestamp == -1  # what the client sent is not touched

    run(backends, body)


def test_retention_bytes_keeps_the_newest_segments(backends):
    async def body(h):
        size = len(batch(2, ts=h.clock.ms, tag="s0"))
        info = await h.create_topic("ret-size", 1, {"segment.bytes": "14", "retention.bytes": str(2 * size)})
        engine = await h.start_engine()
        await h.lead(engine)
        for i in range(4):
            await send(engine, "ret-size", 0, batch(2, ts=h.clock.ms, tag=f"s{i}"), h.clock.ms)
        segs = await sealed_segments(h, engine, "ret-size", 0, 4)
        assert {s.size for s in segs} == {size}

        await engine.clean()
        plog = engine.leader("ret-size", 0)
        assert await h.store.segments(info.topic_id, 0) == segs[2:]
        assert plog.log_start_offset == (await h.store.log_state(info.topic_id, 0)).log_start_offset == 4
        for s in segs[:2]:
            for ext in SEGMENT_EXTENSIONS:
                assert not await h.exists(s.key_base + ext)
        assert [r[0] for r in records_of(await read_all(engine, "ret-size", 0))] == [4, 5, 6, 7]

        await engine.clean()  # within the limit now: nothing more goes
        assert await h.store.segments(info.topic_id, 0) == segs[2:]

    run(backends, body)


def test_delete_records_moves_the_log_start(backends):
    async def body(h):
        one = batch(3, ts=h.clock.ms, tag="x")
        info = await h.create_topic("del", 1, {"segment.bytes": str(2 * len(one))})
        engine = await h.start_engine()
        await h.lead(engine)
        sent = []
        for i in range(3):
            data = batch(3, ts=h.clock.ms, tag=f"d{i}")
            sent.append(((await send(engine, "del", 0, data, h.clock.ms)).base_offset, data))
        [seg] = await sealed_segments(h, engine, "del", 0, 1)  # offsets 0-5; 6-8 in the WAL only
        plog = engine.leader("del", 0)

        assert await engine.delete_records("del", 0, 4) == 4
        assert (await h.store.log_state(info.topic_id, 0)).log_start_offset == 4
        assert await h.store.segments(info.topic_id, 0) == [seg]  # 4 and 5 still in it
        assert await engine.read(plog, 3, 1 << 20) == b""
        # Reads return whole batches: the one holding offset 4 starts at 3.
        assert records_of(await read_all(engine, "del", 0)) == expected_records(sent[1:])

        assert await engine.delete_records("del", 0, 2) == 4  # never moves back
        assert await engine.delete_records("del", 0, 6) == 6
        assert await h.store.segments(info.topic_id, 0) == []
        for ext in SEGMENT_EXTENSIONS:
            assert not await h.exists(seg.key_base + ext)
        assert records_of(await read_all(engine, "del", 0)) == expected_records(sent[2:])

        with pytest.raises(OffsetOutOfRange) as past:
            await engine.delete_records("del", 0, 10)
        assert error_code(past.value) == ErrorCode.OFFSET_OUT_OF_RANGE
        assert await engine.delete_records("del", 0, -1) == 9  # -1: the high watermark
        assert await engine.list_offset(plog, -2) == await engine.list_offset(plog, -1) == (9, -1)
        assert await read_all(engine, "del", 0) == b""

        # Every WAL range now lies below the log start: the objects go on the next clean.
        assert await h.store.wal_objects()
        await engine.clean()
        assert await h.store.wal_objects() == [] and await no_wal_objects(h)

    run(backends, body)


# --- 5. garbage collection --------------------------------------------------------------

def test_uncommitted_wal_objects_are_collected_but_never_in_flight_ones(backends):
    async def body(h):
        await h.create_topic("gc", 1)
        # A previous run of gateway 1 uploaded sequence 7 and died before committing it;
        # gateway 2's objects are not ours to judge.
        await h.objects.put(layout.wal_key(1, 7), b"never committed")
        await h.objects.put(layout.wal_key(2, 3), b"someone else's")
        held = HeldUploads(h.objects, hold=lambda key: key.startswith(layout.wal_prefix(1)))
        engine = await h.start_engine(objects=held)
        await engine.collect_orphan_wal_objects()  # at start, before the first flush
        assert not await h.exists(layout.wal_key(1, 7))
        await h.lead(engine)

        # The next upload continues after every sequence ever used: 8. It is in the store
        # but not committed yet, and no number of cleans touches it.
        result = engine.append("gc", 0, batch(2, ts=h.clock.ms), now_ms=h.clock.ms)
        await eventually(lambda: held.held, "the WAL upload")
        assert held.held == [layout.wal_key(1, 8)]
        # An upload of ours with a lower sequence that never got committed (a fenced flush
        # whose delete failed, say) is garbage.
        await h.objects.put(layout.wal_key(1, 5), b"fenced, not deleted")
        await engine.collect_obsolete_wal_objects()  # the frequent pass lists nothing
        assert await h.exists(layout.wal_key(1, 5))
        await engine.clean()
        await engine.clean()
        assert await h.exists(layout.wal_key(1, 8))
        assert not await h.exists(layout.wal_key(1, 5))

        held.release()
        await committed(result)
        [obj] = await h.store.wal_objects()
        assert (obj.gateway_id, obj.sequence) == (1, 8)
        await engine.clean()
        assert await h.keys(layout.wal_prefix()) == [layout.wal_key(1, 8), layout.wal_key(2, 3)]

    run(backends, body)


def test_a_crash_between_a_wal_upload_and_its_commit_loses_only_unacknowledged_batches(backends):
    """The process dies after a flush wrote its WAL object and before the coordinator
    committed it: the batches in it were never acknowledged. After a restart on the same
    data directory nothing of them is served (although the local segment holds them), the
    acknowledged batch is there once, new offsets continue after it, and the object is
    collected."""

    async def body(h):
        await h.create_topic("crash", 1)
        engine = await h.start_engine()
        await h.lead(engine)
        acked = batch(2, ts=h.clock.ms, tag="acked")
        await send(engine, "crash", 0, acked, h.clock.ms)

        uploaded: list[str] = []
        commit_wal = h.store.commit_wal

        async def dies_before_committing(obj, epochs):
            uploaded.append(obj.key)
            await asyncio.Event().wait()

        h.store.commit_wal = dies_before_committing
        lost = engine.append("crash", 0, batch(3, ts=h.clock.ms, tag="lost"), now_ms=h.clock.ms)
        await eventually(lambda: uploaded, "the WAL upload")
        assert await h.exists(uploaded[0]) and not lost.commit.done()
        assert engine.leader("crash", 0).next_offset == 5  # in the local segment, uncommitted

        # kill -9: every task stops where it is; nothing is flushed or closed.
        for task in asyncio.all_tasks():
            if task is not asyncio.current_task():
                task.cancel()
        await asyncio.sleep(0)
        h.engines.remove(engine)
        h.store.commit_wal = commit_wal
        await h.reopen_clients()
        await h.move_leadership("crash", 0, leader=1)
        engine = await h.start_engine(data_dir=engine.data_dir)
        await engine.collect_orphan_wal_objects()
        await h.lead(engine)

        plog = engine.leader("crash", 0)
        assert (plog.high_watermark, plog.next_offset) == (2, 2)
        assert records_of(await read_all(engine, "crash", 0)) == records_of(acked)
        assert not await h.exists(uploaded[0])
        after = batch(1, ts=h.clock.ms, tag="after")
        assert (await send(engine, "crash", 0, after, h.clock.ms)).base_offset == 2
        assert records_of(await read_all(engine, "crash", 0)) == expected_records([(0, acked), (2, after)])

    run(backends, body)


def test_unreferenced_segment_objects_are_collected_but_never_in_flight_ones(backends):
    async def body(h):
        info = await h.create_topic("orphans", 1, {"segment.ms": "1000"})
        other = await h.create_topic("not-ours", 1, leader=2)
        held = HeldUploads(h.objects, hold=lambda key: key.endswith(layout.INDEX))
        engine = await h.start_engine(objects=held)
        await h.lead(engine)
        await send(engine, "orphans", 0, batch(2, ts=h.clock.ms), h.clock.ms)

        # Sealing: the .log and .index are uploaded, the commit has not happened yet.
        h.clock.advance(1000)
        engine.roll_due()
        await eventually(lambda: held.held, "the segment upload")
        prefix = layout.partition_segment_prefix("orphans", info.topic_id, 0)
        uploading = await h.keys(prefix)
        assert sorted(k.rsplit(".", 1)[1] for k in uploading) == ["index", "log"]
        for _ in range(3):
            await engine.clean()
        assert await h.keys(prefix) == uploading

        held.release()
        [seg] = await sealed_segments(h, engine, "orphans", 0, 1)
        committed_keys = sorted(seg.key_base + ext for ext in SEGMENT_EXTENSIONS)
        assert await h.keys(prefix) == committed_keys

        # Objects no entry names (an upload whose gateway died before committing), under a
        # partition we lead, and the same under a partition led elsewhere.
        orphan = layout.segment_key_base("orphans", info.topic_id, 0, 2, 0, "deadbeef0001")
        theirs = layout.segment_key_base("not-ours", other.topic_id, 0, 0, 0, "deadbeef0002")
        for base in (orphan, theirs):
            for ext in SEGMENT_EXTENSIONS:
                await h.objects.put(base + ext, b"uncommitted")
        await engine.clean()
        assert all([await h.exists(orphan + ext) for ext in SEGMENT_EXTENSIONS])
        await engine.clean()  # unreferenced on two passes in a row: collected
        assert await h.keys(prefix) == committed_keys
        await engine.clean()
        assert all([await h.exists(theirs + ext) for ext in SEGMENT_EXTENSIONS])

    run(backends, body)


# --- 6 and 7. recovery ------------------------------------------------------------------

async def fail_over(h, engine):
    """The gateway stops and loses its local files; the controller gives its partitions
    back to node 1 at a new epoch and a new process (new clients, same data dir path)
    recovers them from the store."""
    data_dir = engine.data_dir
    await h.stop_engine(engine)
    shutil.rmtree(data_dir)
    await h.reopen_clients()
    for name, info in h.topics.items():
        for p in range(info.partitions):
            await h.move_leadership(name, p, leader=1)
    engine = await h.start_engine(data_dir=data_dir)
    await engine.collect_orphan_wal_objects()
    await h.lead(engine)
    return engine


def test_recovery_from_sealed_segments_and_wal_ranges(backends):
    async def body(h):
        info = await h.create_topic("recover", 1, {"segment.ms": "1000"})
        engine = await h.start_engine()
        await h.lead(engine)
        sent = []

        async def produce(data):
            sent.append(((await send(engine, "recover", 0, data, h.clock.ms)).base_offset, data))
            h.clock.advance(7)

        for n, tag in ((2, "a"), (3, "b")):
            await produce(batch(n, ts=h.clock.ms, tag=tag))
        h.clock.advance(1000)
        engine.roll_due()
        await sealed_segments(h, engine, "recover", 0, 1)
        await produce(batch(1, ts=h.clock.ms, tag="c", headers=False))
        await produce(build_batch([(None, b"no key", []), (b"no value", None, [("h", b"")])],
                                  timestamps=[h.clock.ms + 5, h.clock.ms - 5]))
        h.clock.advance(1000)
        engine.roll_due()
        await sealed_segments(h, engine, "recover", 0, 2)
        for n, tag in ((2, "e"), (4, "f")):  # in WAL objects only
            await produce(batch(n, ts=h.clock.ms, tag=tag, value_size=40))
        assert await engine.delete_records("recover", 0, 3) == 3  # inside the first segment
        await engine.clean()

        plog = engine.leader("recover", 0)
        before = await read_all(engine, "recover", 0)
        state = (plog.log_start_offset, plog.high_watermark)
        assert state == (3, 14)
        assert records_of(before) == expected_records(sent[1:])
        assert len(await h.store.wal_ranges(info.topic_id, 0, 0)) >= 1
        stamps = sorted({r[1] for r in records_of(before)})
        probes = [-3, stamps[0] - 1, *stamps, stamps[-1] + 1]
        by_time = [await engine.list_offset(plog, ts) for ts in probes]

        engine = await fail_over(h, engine)
        plog = engine.leader("recover", 0)
        assert plog.leader_epoch == 1
        assert (plog.log_start_offset, plog.high_watermark, plog.next_offset) == (3, 14, 14)
        assert await read_all(engine, "recover", 0) == before
        assert await engine.list_offset(plog, -2) == (3, -1)
        assert await engine.list_offset(plog, -1) == (14, -1)
        assert [await engine.list_offset(plog, ts) for ts in probes] == by_time

        # The log goes on at the new epoch.
        more = batch(2, ts=h.clock.ms, tag="g")
        assert (await send(engine, "recover", 0, more, h.clock.ms)).base_offset == 14
        assert_stored(more, await read_all(engine, "recover", 0, start=14), base_offset=14, leader_epoch=1)
        assert await read_all(engine, "recover", 0) == before + await read_all(engine, "recover", 0, start=14)

    run(backends, body)


def test_recovery_with_the_log_start_inside_a_batch(backends):
    """DeleteRecords may put the log start inside a batch held only in WAL objects: a new
    leader serves that batch whole, as the old one did, and seals it with the rest."""

    async def body(h):
        await h.create_topic("mid", 1, {"segment.ms": "1000"})
        engine = await h.start_engine()
        await h.lead(engine)
        sent = []
        for i in range(3):
            data = batch(3, ts=h.clock.ms, tag=f"m{i}")
            sent.append(((await send(engine, "mid", 0, data, h.clock.ms)).base_offset, data))
        assert await engine.delete_records("mid", 0, 4) == 4
        before = await read_all(engine, "mid", 0)
        assert records_of(before) == expected_records(sent[1:])

        engine = await fail_over(h, engine)
        plog = engine.leader("mid", 0)
        assert (plog.log_start_offset, plog.high_watermark) == (4, 9)
        assert await read_all(engine, "mid", 0) == before
        h.clock.advance(1000)
        engine.roll_due()
        [seg] = await sealed_segments(h, engine, "mid", 0, 1)
        assert (seg.base_offset, seg.last_offset) == (3, 8)
        assert await read_all(engine, "mid", 0) == before

    run(backends, body)


@pytest.mark.parametrize("state_from", ["snapshot", "wal"])
def test_idempotent_producer_state_survives_recovery(backends, state_from):
    """After recovery, from the newest segment's producer snapshot or by replaying WAL
    ranges, a retried batch is answered with its original offset and not appended again."""
    pid, pepoch = 4242, 3
    # The records carry old CreateTime timestamps (events produced with their original
    # time): an idle producer expires by when the leader last heard from it, not by those.
    created = WALL_START_MS - 3 * 86_400_000

    def produced(seq: int, n: int = 2, tag: str = "p") -> bytes:
        return batch(n, ts=created + seq, tag=f"{tag}{seq}", producer=(pid, pepoch), sequence=seq)

    async def body(h):
        info = await h.create_topic("idem", 1, {"segment.ms": "1000"})
        engine = await h.start_engine()
        await h.lead(engine)
        sent = [produced(seq) for seq in (0, 2, 4)]  # next sequence: 6
        for i, data in enumerate(sent):
            assert (await send(engine, "idem", 0, data, h.clock.ms)).base_offset == 2 * i
        if state_from == "snapshot":
            h.clock.advance(1000)
            engine.roll_due()
            [seg] = await sealed_segments(h, engine, "idem", 0, 1)
            assert str(pid) in seg.producers
            await engine.clean()
            assert await h.store.wal_ranges(info.topic_id, 0, 0) == [] and await h.store.wal_objects() == []
        else:
            assert await h.store.segments(info.topic_id, 0) == []

        engine = await fail_over(h, engine)
        plog = engine.leader("idem", 0)
        assert (plog.high_watermark, plog.next_offset) == (6, 6)
        h.clock.advance(60_000)
        await engine.clean()  # a maintenance pass, which expires idle producers

        # Retries whose answers were lost: the original offsets, nothing appended.
        for original, data in ((4, sent[2]), (0, sent[0])):
            again = engine.append("idem", 0, data, now_ms=h.clock.ms)
            assert again.base_offset == original
            await committed(again)
            assert (plog.high_watermark, plog.next_offset) == (6, 6)

        # A gap right after recovery: the earlier batches were refused by the old
        # leadership, so the producer is told to retry (not that it is out of order).
        with pytest.raises(NotLeader) as gap:
            engine.append("idem", 0, produced(8), now_ms=h.clock.ms)
        assert error_code(gap.value) == ErrorCode.NOT_LEADER_OR_FOLLOWER
        nxt = produced(6, tag="n")
        assert (await send(engine, "idem", 0, nxt, h.clock.ms)).base_offset == 6
        # The producer appended to this leadership: now a gap is out of order.
        with pytest.raises(OutOfOrderSequence) as gap:
            engine.append("idem", 0, produced(10), now_ms=h.clock.ms)
        assert error_code(gap.value) == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER

        assert plog.high_watermark == 8
        assert records_of(await read_all(engine, "idem", 0)) == \
            expected_records([(0, sent[0]), (2, sent[1]), (4, sent[2]), (6, nxt)])

    run(backends, body)


# --- 7b. transactions -------------------------------------------------------------------

def txn_batch(pid: int, seq: int, tag: str, *, epoch: int = 0, n: int = 2) -> bytes:
    return build_batch([(f"{tag}{i}".encode(), b"v", []) for i in range(n)], timestamp_ms=WALL_START_MS,
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)


async def marker(engine, topic: str, pid: int, *, commit: bool, epoch: int = 0) -> None:
    await asyncio.wait_for(engine.write_marker(topic, 0, pid, epoch, commit=commit), TIMEOUT_S)


@pytest.mark.parametrize("state_from", ["snapshot", "wal"])
def test_transaction_state_survives_recovery(backends, state_from):
    """Open transactions, aborted ones and the last stable offset come back after a
    failover: from the segment's producer snapshot and .txnindex, or by replaying the WAL."""
    aborted, committed_, still_open = 71, 72, 73

    async def body(h):
        info = await h.create_topic("txn", 1, {"segment.ms": "1000"})
        engine = await h.start_engine()
        await h.lead(engine)
        await send(engine, "txn", 0, txn_batch(aborted, 0, "a"), h.clock.ms)         # 0-1
        await send(engine, "txn", 0, txn_batch(committed_, 0, "c"), h.clock.ms)      # 2-3
        await marker(engine, "txn", aborted, commit=False)                           # 4
        await marker(engine, "txn", committed_, commit=True)                         # 5
        await send(engine, "txn", 0, txn_batch(still_open, 0, "o"), h.clock.ms)      # 6-7
        plog = engine.leader("txn", 0)
        assert (plog.high_watermark, plog.last_stable_offset) == (8, 6)
        # A marker for a transaction that is not open here appends nothing.
        await marker(engine, "txn", aborted, commit=False)
        assert plog.next_offset == 8
        if state_from == "snapshot":
            h.clock.advance(1000)
            engine.roll_due()
            [seg] = await sealed_segments(h, engine, "txn", 0, 1)
            assert seg.aborted_txns == 1 and seg.producers[str(still_open)]["txn"] == 6
            index = decode_txnindex(await h.objects.get(seg.key_base + layout.TXNINDEX))
            assert [(a.producer_id, a.first_offset, a.last_offset) for a in index] == [(aborted, 0, 4)]
            await engine.clean()
            assert await h.store.wal_ranges(info.topic_id, 0, 0) == []

        engine = await fail_over(h, engine)
        plog = engine.leader("txn", 0)
        assert (plog.high_watermark, plog.last_stable_offset) == (8, 6)
        assert [(a.producer_id, a.first_offset, a.last_offset)
                for a in engine.aborted_transactions(plog, 0)] == [(aborted, 0, 4)]
        assert engine.aborted_transactions(plog, 5) == []
        committed_only = batches_of(await engine.read(plog, 0, 1 << 20, read_committed=True))
        assert [h_.base_offset for h_, _ in committed_only] == [0, 2, 4, 5]
        # The open transaction ends after the move; a stale epoch's marker changes nothing.
        await marker(engine, "txn", still_open, commit=False, epoch=-1)
        assert plog.last_stable_offset == 6
        await marker(engine, "txn", still_open, commit=True)
        assert plog.last_stable_offset == plog.high_watermark == 9

    run(backends, body)


@pytest.mark.unit
def test_the_last_stable_offset_waits_for_the_marker_commit():
    txns = PartitionTxns()
    txns.data(1, 10)
    txns.data(2, 12)
    txns.data(1, 14)  # a later batch of an open transaction does not move its start
    assert txns.last_stable_offset(20) == 10
    txns.marker(1, 20, commit=False)  # appended, not yet committed
    assert txns.last_stable_offset(20) == 10
    assert txns.aborted_between(0, txns.last_stable_offset(20)) == []
    txns.committed(21)
    assert txns.last_stable_offset(21) == 12
    assert [a.first_offset for a in txns.aborted_between(0, 12)] == [10]
    assert txns.aborted_between(21, 30) == []
    txns.forget_before(21)
    assert txns.aborted == []


# --- 8. controller placement, as pure functions -----------------------------------------

def topic(name: str = "t", partitions: int = 4, rf: int = 3) -> TopicInfo:
    return TopicInfo(name, uuid.UUID(int=7), partitions, rf, {})


def no_lagging(node: int) -> frozenset[str]:
    return frozenset()


@pytest.mark.unit
def test_new_topic_assignments_spread_leaders_round_robin():
    live = [3, 1, 2]
    out = new_topic_assignments(live, range(6), 2, "orders")
    assert sorted(out) == list(range(6))
    leaders = [out[p].leader for p in range(6)]
    assert Counter(leaders) == {1: 2, 2: 2, 3: 2}
    for p in range(5):  # consecutive partitions go to consecutive gateways
        assert leaders[p + 1] == sorted(live)[(sorted(live).index(leaders[p]) + 1) % 3]
    for st in out.values():
        assert st.leader_epoch == 0 and st.replicas[0] == st.leader
        assert len(set(st.replicas)) == 2 and st.isr == st.replicas
    # Never more replicas than live gateways.
    assert {len(s.replicas) for s in new_topic_assignments([1, 2], range(3), 3, "x").values()} == {2}


@pytest.mark.unit
def test_decide_partition_keeps_a_live_leader():
    old = PartitionState(2, 5, (2, 1, 3), (2, 1, 3))
    assert decide_partition(topic(), 0, old, [1, 2, 3], no_lagging) == old


@pytest.mark.unit
def test_decide_partition_moves_a_dead_leader_to_an_in_sync_replica():
    info = topic()
    old = PartitionState(2, 5, (2, 1, 3), (2, 1, 3))
    new = decide_partition(info, 0, old, [1, 3], no_lagging)
    assert (new.leader, new.leader_epoch, new.isr) == (1, 6, (1, 3))
    assert new.replicas == (1, 3, 2)  # the dead one stays listed while nobody replaces it
    # Node 1 reports lagging on this partition: the in-sync node 3 leads instead.
    lagging = {1: frozenset({f"{info.topic_id}/0"})}
    new = decide_partition(info, 0, old, [1, 3], lambda n: lagging.get(n, frozenset()))
    assert (new.leader, new.leader_epoch, new.isr) == (3, 6, (3,))
    assert set(new.replicas) == {1, 2, 3}


@pytest.mark.unit
def test_decide_partition_drops_lagging_replicas_from_the_isr_and_tops_replicas_up():
    info = topic()
    old = PartitionState(1, 4, (1, 2, 3), (1, 2, 3))
    lagging = {3: frozenset({f"{info.topic_id}/0"}), 2: frozenset({f"{info.topic_id}/1"})}
    new = decide_partition(info, 0, old, [1, 2, 3], lambda n: lagging.get(n, frozenset()))
    assert new == PartitionState(1, 4, (1, 2, 3), (1, 2))

    small = PartitionState(1, 2, (1,), (1,))
    new = decide_partition(info, 0, small, [1, 2, 3, 4], no_lagging)
    assert (new.leader, new.leader_epoch) == (1, 2)
    assert new.replicas[0] == 1 and len(set(new.replicas)) == 3 and set(new.isr) == set(new.replicas)

    fresh = decide_partition(info, 0, None, [1, 2, 3], no_lagging)
    assert fresh.leader_epoch == 0 and len(fresh.replicas) == 3 and fresh.leader == fresh.replicas[0]


def controller_pass(plans, live):
    leaders = {b: 0 for b in live}
    for _, _, _, new in plans:
        leaders[new.leader] += 1
    return balance_leaders(plans, leaders)


@pytest.mark.unit
def test_balance_leaders_moves_one_leadership_per_pass():
    info = topic("b", 4, 1)
    states = {p: PartitionState(1, 3, (1,), (1,)) for p in range(4)}
    live = [1, 2]
    passes = 0
    while True:
        plans = [(info, p, states[p], decide_partition(info, p, states[p], live, no_lagging)) for p in range(4)]
        out = controller_pass(plans, live)
        changed = {p: new for _, p, old, new in out if new != old}
        if not changed:
            break
        passes += 1
        [(p, new)] = changed.items()  # exactly one per pass
        assert states[p].leader == 1 and new.leader == 2
        assert new.leader_epoch == states[p].leader_epoch + 1 and new.replicas == new.isr == (2,)
        states[p] = new
    assert passes == 2  # 4-0, 3-1, then 2-2 is balanced
    assert Counter(s.leader for s in states.values()) == {1: 2, 2: 2}


@pytest.mark.unit
def test_balance_leaders_bumps_the_epoch_once():
    """A partition whose leader decide_partition already changed (its leader died) and that
    the balancing moves again gets one new epoch, not two."""
    info = topic("e", 4, 2)
    live = [1, 2]
    olds = [PartitionState(3, 7, (3, 1), (3, 1))] + [PartitionState(1, 0, (1, 3), (1, 3))] * 3
    plans = [(info, p, old, decide_partition(info, p, old, live, no_lagging)) for p, old in enumerate(olds)]
    assert plans[0][3].leader == 1 and plans[0][3].leader_epoch == 8
    out = controller_pass(plans, live)
    moved = [(p, new) for _, p, _, new in out if new.leader == 2]
    assert [(p, new.leader_epoch) for p, new in moved] == [(0, 8)]
    assert out[0][3].replicas[0] == 2 and 2 in out[0][3].isr


@pytest.mark.unit
def test_a_replica_refuses_a_damaged_wal_range(tmp_path):
    """A follower serving a committed WAL range (KIP-392 reads) checks the CRC of every
    batch it read back; a flipped byte is refused with the object, byte and offset."""
    from stratalog.coordinator.model import WalRange
    from stratalog.engine.replica import ReplicaView
    from stratalog.tiering.errors import CorruptObject
    from stratalog.tiering.objectstore.file import FileObjectStore
    from stratalog.tiering.remote import RemoteCache

    batches = build_batch([(b"k", b"v" * 100, [])] * 3, base_offset=0) + \
        build_batch([(b"k", b"w" * 100, [])] * 3, base_offset=3)
    key, position = "wal/1/00000000000000000001.wal", 8

    async def body():
        store = FileObjectStore(tmp_path / "objects")
        cache = RemoteCache(store, tmp_path / "cache", max_bytes=0)
        view = ReplicaView("t", uuid.uuid4(), 0)
        view.wal = [(key, WalRange(view.topic_id, 0, 0, 5, position, len(batches), 0))]
        view.high_watermark = 6
        await store.put(key, b"\0" * position + batches)
        assert await view.read(0, 1 << 20, cache) == batches
        damaged = bytearray(batches)
        damaged[-5] ^= 0x01
        await store.put(key, b"\0" * position + bytes(damaged))
        with pytest.raises(CorruptObject, match="CRC") as caught:
            await view.read(0, 1 << 20, cache)
        second = len(batches) // 2
        assert (caught.value.key, caught.value.position, caught.value.offset) == (key, position + second, 3)

    asyncio.run(body())
