"""The coordinator: one suite run against the embedded backend and a real etcd server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stratalog.coordinator import open_coordinator
from stratalog.coordinator.embedded import DB_FILE, EmbeddedKV
from stratalog.coordinator.etcd import EtcdKV, parse_endpoints
from stratalog.coordinator.kv import (
    DEFAULT_MAX_TXN_OPS, Compare, CoordinatorError, CoordinatorUnavailable, DataDirInUse, Delete, DeletePrefix,
    Put, RequestTooLarge, absent, exists, mod_is, value_is)
from stratalog.coordinator.model import (
    CommittedOffset, Fenced, LogState, PartitionState, SegmentEntry, TopicExists,
    UnknownTopic, WalObject, WalRange)
from stratalog.coordinator.store import WAL_DELETES_PER_TXN, KVClusterStore

try:
    from tests.etcd_fixture import EtcdServer, etcd_binary, etcd_server, free_port  # noqa: F401
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    from etcd_fixture import EtcdServer, etcd_binary, etcd_server, free_port  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


class Backend:
    """Makes KVs and stores of one backend, namespaced so tests sharing an etcd never meet."""

    def __init__(self, name: str, tmp_path: Path, server=None):
        self.name = name
        self.tmp_path = tmp_path
        self.server = server
        self.cluster = f"c{uuid.uuid4().hex[:12]}"
        self.ns = f"/test-{uuid.uuid4().hex[:12]}/"

    def kv(self, clock=time.monotonic):
        if self.name == "embedded":
            # etcd's bound on operations, so both backends split large commits alike
            return EmbeddedKV(self.tmp_path / "coord", clock=clock, max_txn_ops=DEFAULT_MAX_TXN_OPS)
        return EtcdKV([self.server.endpoint])

    def store(self, clock=time.monotonic, kv=None) -> KVClusterStore:
        return KVClusterStore(kv or self.kv(clock), cluster=self.cluster)


@pytest.fixture(params=[pytest.param("embedded", marks=pytest.mark.unit),
                        pytest.param("etcd", marks=pytest.mark.integration)])
def backend(request, tmp_path):
    if request.param == "embedded":
        return Backend("embedded", tmp_path)
    return Backend("etcd", tmp_path, request.getfixturevalue("etcd_server"))


def run(coro):
    return asyncio.run(coro)


def states(n: int, leader: int = 1, epoch: int = 0) -> dict[int, PartitionState]:
    return {p: PartitionState(leader, epoch, (leader,), (leader,)) for p in range(n)}


def rng(tid, p, base, last, pos=0, length=100, ts=0) -> WalRange:
    return WalRange(tid, p, base, last, pos, length, ts)


def seg(base, last, epoch=0, key=None) -> SegmentEntry:
    return SegmentEntry(base, last, key or f"seg/{base:020d}", 1000, 1, 2, epoch,
                        {"7": {"epoch": 0, "seq": 3}})


# --- KV semantics ---------------------------------------------------------------------------

def test_kv_get_put_range_delete_and_revisions(backend):
    async def go():
        kv = backend.kv()
        ns = backend.ns
        try:
            assert await kv.get(ns + "a") is None
            r1 = await kv.put(ns + "b", b"2")
            r2 = await kv.put(ns + "a", b"1")
            r3 = await kv.put(ns + "a/x", b"3")
            assert r1 < r2 < r3
            assert await kv.get(ns + "a") == (b"1", r2)
            # sorted by key (bytes order), prefix-bounded
            assert [k for k, _, _ in await kv.range(ns)] == [ns + "a", ns + "a/x", ns + "b"]
            assert await kv.range(ns + "a") == [(ns + "a", b"1", r2), (ns + "a/x", b"3", r3)]
            r4 = await kv.put(ns + "a", b"1b")
            assert await kv.get(ns + "a") == (b"1b", r4) and r4 > r3
            assert await kv.delete(ns + "a") is True
            assert await kv.delete(ns + "a") is False
            assert await kv.delete_prefix(ns + "zzz") == 0
            assert await kv.delete_prefix(ns) == 2
            assert await kv.range(ns) == []
        finally:
            await kv.close()
    run(go())


def test_kv_txn_compares(backend):
    async def go():
        kv = backend.kv()
        ns = backend.ns
        try:
            k = ns + "k"
            # absent key: "absent" holds, a value compare fails whatever its operator
            assert await kv.txn([absent(k)], [Put(k, b"v1")]) is True
            assert await kv.txn([absent(k)], [Put(k, b"v2")]) is False
            assert await kv.txn([value_is(ns + "missing", b"")], [Put(k, b"x")]) is False
            assert await kv.txn([Compare(ns + "missing", "value", "!=", b"z")],
                                [Put(k, b"x")]) is False
            assert (await kv.get(k))[0] == b"v1"
            _, rev = await kv.get(k)
            assert await kv.txn([mod_is(k, rev), value_is(k, b"v1"), exists(k)],
                                [Put(k, b"v2"), Put(ns + "other", b"o")]) is True
            # a stale mod revision: the failure branch runs instead
            assert await kv.txn([mod_is(k, rev)], [Put(k, b"no")],
                                [Put(ns + "failed", b"yes")]) is False
            assert (await kv.get(k))[0] == b"v2"
            assert (await kv.get(ns + "failed"))[0] == b"yes"
            assert await kv.txn([Compare(k, "version", ">", 1), Compare(k, "mod", "<", 10**9)],
                                [DeletePrefix(ns + "o"), Delete(ns + "failed")]) is True
            assert await kv.get(ns + "other") is None and await kv.get(ns + "failed") is None
            assert await kv.txn([mod_is(ns + "missing", 0)], []) is True
            # refused like etcd refuses them
            with pytest.raises(ValueError, match="put twice"):
                await kv.txn([], [Put(k, b"1"), Put(k, b"2")])
            with pytest.raises(ValueError, match="both put and deleted"):
                await kv.txn([], [Put(k, b"1"), Delete(k)])
            with pytest.raises(RequestTooLarge, match="129 success ops"):
                await kv.txn([], [Put(f"{ns}n{i}", b"") for i in range(129)])
            with pytest.raises(RequestTooLarge, match="bytes"):
                await kv.put(k, b"x" * (2 * 1024 * 1024))
            assert (await kv.get(k))[0] == b"v2"
        finally:
            await kv.close()
    run(go())


def test_kv_snapshot_filters_by_mod_revision(backend):
    async def go():
        kv = backend.kv()
        ns = backend.ns
        try:
            await kv.put(ns + "a/1", b"1")
            r = await kv.put(ns + "b/1", b"2")
            await kv.put(ns + "c/1", b"ignored")
            rev, kvs = await kv.snapshot([ns + "a/", ns + "b/"])
            assert rev >= r
            assert [(k, v) for k, v, _ in kvs] == [(ns + "a/1", b"1"), (ns + "b/1", b"2")]
            r2 = await kv.put(ns + "a/2", b"3")
            rev2, kvs = await kv.snapshot([ns + "a/", ns + "b/"], rev + 1)
            assert rev2 >= r2 and [(k, m) for k, _, m in kvs] == [(ns + "a/2", r2)]
        finally:
            await kv.close()
    run(go())


def test_kv_watch_prefix_sees_changes_in_order(backend):
    async def go():
        kv = backend.kv()
        ns = backend.ns
        try:
            w = await kv.watch_prefix(ns + "w/")
            r1 = await kv.put(ns + "w/a", b"1")
            await kv.put(ns + "elsewhere", b"x")
            r2 = await kv.txn([], [Put(ns + "w/b", b"2"), Delete(ns + "w/a")])
            events = [await asyncio.wait_for(w.__anext__(), 5) for _ in range(3)]
            assert [(e.kind, e.key, e.value) for e in events] == [
                ("put", ns + "w/a", b"1"), ("put", ns + "w/b", b"2"), ("delete", ns + "w/a", b"")]
            assert events[0].mod_revision == r1 and r2 is True
            assert events[1].mod_revision == events[2].mod_revision > r1
            await w.close()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(w.__anext__(), 5)
        finally:
            await kv.close()
    run(go())


def test_kv_leases_expire_and_revoke(backend):
    async def go():
        clock = FakeClock()
        kv = backend.kv(clock)
        ns = backend.ns
        try:
            ttl = 1
            lease = await kv.grant_lease(ttl)
            other = await kv.grant_lease(30)
            await kv.put(ns + "leased", b"x", lease)
            await kv.put(ns + "kept", b"y", other)
            await kv.put(ns + "plain", b"z")
            assert await kv.keepalive(lease) is True
            if backend.name == "embedded":
                clock.t += ttl + 0.01
            else:
                deadline = time.monotonic() + 8
                while await kv.get(ns + "leased") is not None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            assert await kv.get(ns + "leased") is None
            assert await kv.keepalive(lease) is False
            assert (await kv.get(ns + "kept"))[0] == b"y"
            await kv.revoke(other)
            assert await kv.get(ns + "kept") is None
            assert await kv.keepalive(other) is False
            assert (await kv.get(ns + "plain"))[0] == b"z"
            await kv.revoke(other)  # revoking twice is harmless
            with pytest.raises(CoordinatorError, match="lease"):
                await kv.put(ns + "late", b"x", other)
            with pytest.raises(ValueError):
                await kv.grant_lease(0)
        finally:
            await kv.close()
    run(go())


# --- topics and partitions ------------------------------------------------------------------

def test_topics_crud(backend):
    async def go():
        s = backend.store()
        try:
            cid = await s.cluster_id()
            assert uuid.UUID(cid) and await s.cluster_id() == cid
            t = await s.create_topic("orders", 3, 1, {"retention.ms": "1000"}, states(3))
            with pytest.raises(TopicExists):
                await s.create_topic("orders", 1, 1, {}, states(1))
            with pytest.raises(ValueError, match="assignments"):
                await s.create_topic("bad", 2, 1, {}, states(1))
            assert await s.topic("orders") == t
            assert await s.topic("nope") is None
            other = await s.create_topic("odd/name%", 1, 1, {}, states(1))
            assert set(await s.topics()) == {"orders", "odd/name%"}
            assert (await s.topics())["odd/name%"] == other
            assert await s.partition_states(t.topic_id) == states(3)

            t2 = await s.set_topic_configs("orders", {"cleanup.policy": "compact"})
            assert t2.configs == {"cleanup.policy": "compact"} and t2.topic_id == t.topic_id
            with pytest.raises(UnknownTopic):
                await s.set_topic_configs("nope", {})

            grown = await s.add_partitions("orders", 5, {3: states(5)[3], 4: states(5)[4]})
            assert grown.partitions == 5 and (await s.topic("orders")).partitions == 5
            assert sorted(await s.partition_states(t.topic_id)) == [0, 1, 2, 3, 4]
            with pytest.raises(ValueError, match="cannot grow"):
                await s.add_partitions("orders", 4, {})

            new = PartitionState(2, 1, (2, 1), (2,))
            await s.set_partition_state(t.topic_id, 1, new, expect_epoch=0)
            assert (await s.partition_states(t.topic_id))[1] == new
            with pytest.raises(Fenced):
                await s.set_partition_state(t.topic_id, 1, new, expect_epoch=0)
            with pytest.raises(ValueError, match="cannot go back"):
                await s.set_partition_state(t.topic_id, 1, PartitionState(1, 0, (1,), (1,)))
            isr_only = PartitionState(2, 1, (2, 1), (2, 1))
            await s.set_partition_state(t.topic_id, 1, isr_only, expect_epoch=1)
            assert (await s.partition_states(t.topic_id))[1] == isr_only

            await s.commit_offsets("g1", {("orders", 0): CommittedOffset(5, 0, "", 1),
                                          ("odd/name%", 0): CommittedOffset(7, 0, "m", 2)})
            await s.commit_segment(t.topic_id, 0, seg(0, 9), 0)
            await s.set_log_start_offset(t.topic_id, 0, 3)

            removed = await s.delete_topic("orders")
            assert removed.topic_id == t.topic_id
            assert await s.topic("orders") is None
            with pytest.raises(UnknownTopic):
                await s.delete_topic("orders")
            with pytest.raises(UnknownTopic):
                await s.partition_states(t.topic_id)
            with pytest.raises(UnknownTopic):
                await s.log_state(t.topic_id, 0)
            assert await s.segments(t.topic_id, 0) == []
            for sub in ("partitions", "logs", "segments"):
                assert await s.kv.range(f"{s.prefix}{sub}/{t.topic_id}/") == []
            assert await s.fetch_offsets("g1") == {("odd/name%", 0): CommittedOffset(7, 0, "m", 2)}
            # the name is free again and gets a new id
            again = await s.create_topic("orders", 1, 1, {}, states(1))
            assert again.topic_id != t.topic_id
            assert await s.log_state(again.topic_id, 0) == LogState(0, 0)
        finally:
            await s.close()
    run(go())


def test_topic_with_many_partitions_is_created_and_grown_past_txn_limits(backend):
    async def go():
        s = backend.store()
        try:
            t = await s.create_topic("wide", 200, 1, {}, states(200))
            assert len(await s.partition_states(t.topic_id)) == 200
            more = {p: states(300)[p] for p in range(200, 300)}
            grown = await s.add_partitions("wide", 300, more)
            assert grown.partitions == 300
            assert sorted(await s.partition_states(t.topic_id)) == list(range(300))
            with pytest.raises(TopicExists):
                await s.create_topic("wide", 200, 1, {}, states(200))
            assert len(await s.kv.range(f"{s.prefix}partitions/")) == 600  # no leftovers
        finally:
            await s.close()
    run(go())


# --- WAL commits, fencing, high watermark -------------------------------------------------

def test_commit_wal_fencing_leaves_nothing(backend):
    async def go():
        s = backend.store()
        try:
            t = await s.create_topic("f", 2, 1, {}, states(2))
            tid = t.topic_id
            obj = WalObject(1, 1, "wal/1/1.wal", (rng(tid, 0, 0, 4), rng(tid, 1, 0, 2, 100)))
            await s.commit_wal(obj, {(tid, 0): 0, (tid, 1): 0})
            # the controller moves partition 1 to another leader
            await s.set_partition_state(tid, 1, PartitionState(2, 1, (2,), (2,)), expect_epoch=0)
            stale = WalObject(1, 2, "wal/1/2.wal", (rng(tid, 0, 5, 9), rng(tid, 1, 3, 5, 100)))
            with pytest.raises(Fenced, match=f"{tid}/1"):
                await s.commit_wal(stale, {(tid, 0): 0, (tid, 1): 0})
            assert [o.sequence for o in await s.wal_objects()] == [1]
            # a retry of a commit that landed (its reply lost) is not fenced: it is done
            await s.commit_wal(obj, {(tid, 0): 0, (tid, 1): 0})
            assert await s.log_state(tid, 0) == LogState(0, 5)
            assert await s.log_state(tid, 1) == LogState(0, 3)
            # the old leader cannot seal either; the new one can
            with pytest.raises(Fenced, match="leader epoch is 1, not 0"):
                await s.commit_segment(tid, 1, seg(0, 2), 0)
            assert await s.segments(tid, 1) == []
            await s.commit_segment(tid, 1, seg(0, 2, epoch=1), 1)
            assert [x.base_offset for x in await s.segments(tid, 1)] == [0]
            # a deleted topic fences everyone
            await s.delete_topic("f")
            with pytest.raises(Fenced):
                await s.commit_wal(WalObject(1, 3, "k", (rng(tid, 0, 5, 9),)), {(tid, 0): 0})
            with pytest.raises(ValueError, match="no leader epoch"):
                await s.commit_wal(WalObject(1, 4, "k", (rng(tid, 0, 5, 9),)), {})
            with pytest.raises(ValueError, match="invalid WAL range"):
                await s.commit_wal(WalObject(1, 4, "k", (rng(tid, 0, 9, 5),)), {(tid, 0): 0})
        finally:
            await s.close()
    run(go())


def test_high_watermark_is_derived(backend):
    async def go():
        s = backend.store()
        try:
            t = await s.create_topic("hw", 2, 1, {}, states(2))
            tid, ep = t.topic_id, {(t.topic_id, 0): 0, (t.topic_id, 1): 0}
            assert await s.log_state(tid, 0) == LogState(0, 0)
            await s.commit_wal(WalObject(1, 1, "a", (rng(tid, 0, 0, 9),)), ep)
            assert await s.log_state(tid, 0) == LogState(0, 10)
            assert await s.log_state(tid, 1) == LogState(0, 0)
            await s.commit_wal(WalObject(2, 1, "b", (rng(tid, 0, 10, 24), rng(tid, 1, 0, 0))), ep)
            assert await s.log_states([(tid, 0), (tid, 1)]) == {
                (tid, 0): LogState(0, 25), (tid, 1): LogState(0, 1)}
            await s.commit_segment(tid, 0, seg(0, 24), 0)
            await s.delete_wal_objects([(1, 1), (2, 1)])
            assert await s.log_state(tid, 0) == LogState(0, 25)  # the segment carries it
            await s.set_log_start_offset(tid, 0, 20)
            await s.set_log_start_offset(tid, 0, 7)  # never lowers
            assert await s.log_state(tid, 0) == LogState(20, 25)
            await s.set_log_start_offset(tid, 1, 40)
            assert await s.log_state(tid, 1) == LogState(40, 40)
            with pytest.raises(UnknownTopic):
                await s.set_log_start_offset(uuid.uuid4(), 0, 5)
            # another store (another gateway, or a restarted one) derives the same
            other = backend.store(kv=s.kv) if backend.name == "embedded" else backend.store()
            assert await other.log_state(tid, 0) == LogState(20, 25)
            if other.kv is not s.kv:
                await other.close()
        finally:
            await s.close()
    run(go())


def test_wal_ranges_order_filter_and_sealing(backend):
    async def go():
        s = backend.store()
        try:
            t = await s.create_topic("r", 2, 1, {}, states(2))
            tid, ep = t.topic_id, {(t.topic_id, 0): 0, (t.topic_id, 1): 0}
            # two gateways' objects, committed out of offset order
            await s.commit_wal(WalObject(2, 7, "w/2/7", (rng(tid, 0, 20, 29, 50),)), ep)
            await s.commit_wal(WalObject(1, 3, "w/1/3", (rng(tid, 0, 0, 9, 0),
                                                          rng(tid, 1, 0, 4, 300))), ep)
            await s.commit_wal(WalObject(1, 4, "w/1/4", (rng(tid, 0, 10, 19, 10),)), ep)
            got = await s.wal_ranges(tid, 0, 0)
            assert [(k, r.base_offset, r.position) for k, r in got] == [
                ("w/1/3", 0, 0), ("w/1/4", 10, 10), ("w/2/7", 20, 50)]
            assert [r.base_offset for _, r in await s.wal_ranges(tid, 0, 15)] == [10, 20]
            assert await s.wal_ranges(tid, 0, 30) == []
            assert [k for k, _ in await s.wal_ranges(tid, 1, 0)] == ["w/1/3"]
            await s.commit_segment(tid, 0, seg(0, 19), 0)
            assert [k for k, _ in await s.wal_ranges(tid, 0, 0)] == ["w/2/7"]
            objs = await s.wal_objects()
            assert [(o.gateway_id, o.sequence) for o in objs] == [(1, 3), (1, 4), (2, 7)]
            assert objs[0].ranges == (rng(tid, 0, 0, 9, 0), rng(tid, 1, 0, 4, 300))
        finally:
            await s.close()
    run(go())


def test_obsolete_wal_objects(backend):
    """Each step that can make a WAL object obsolete moves the settled revision, as the
    writer and a reader of the same coordinator see it; WAL commits and deletions do not."""
    async def go():
        s = backend.store()
        reader = backend.store(kv=s.kv)
        seen: list[tuple[int, int]] = []

        async def settled_moved() -> bool:
            now = (await s.wal_settled_revision(), await reader.wal_settled_revision())
            moved = [a != b for a, b in zip(now, seen[-1])] if seen else [True, True]
            seen.append(now)
            assert moved[0] == moved[1], seen
            return moved[0]

        try:
            await settled_moved()  # the first look
            a = await s.create_topic("a", 1, 1, {}, states(1))
            b = await s.create_topic("b", 1, 1, {}, states(1))
            assert await settled_moved()
            ep = {(a.topic_id, 0): 0, (b.topic_id, 0): 0}
            await s.commit_wal(WalObject(1, 1, "sealed", (rng(a.topic_id, 0, 0, 9),)), ep)
            await s.commit_wal(WalObject(1, 2, "deleted", (rng(b.topic_id, 0, 0, 9),)), ep)
            await s.commit_wal(WalObject(1, 3, "mixed", (rng(a.topic_id, 0, 10, 19),
                                                         rng(b.topic_id, 0, 10, 19))), ep)
            await s.commit_wal(WalObject(1, 4, "live", (rng(a.topic_id, 0, 20, 29),)), ep)
            assert not await settled_moved()
            assert await s.obsolete_wal_objects() == []
            await s.commit_segment(a.topic_id, 0, seg(0, 9), 0)
            assert await settled_moved()
            assert [o.key for o in await s.obsolete_wal_objects()] == ["sealed"]
            await s.delete_topic("b")
            assert await settled_moved()
            assert [o.key for o in await s.obsolete_wal_objects()] == ["sealed", "deleted"]
            await s.set_log_start_offset(a.topic_id, 0, 20)
            assert await settled_moved()
            obsolete = await s.obsolete_wal_objects()
            assert [o.key for o in obsolete] == ["sealed", "deleted", "mixed"]
            await s.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
            assert not await settled_moved()
            assert [o.key for o in await s.wal_objects()] == ["live"]
            assert await s.log_state(a.topic_id, 0) == LogState(20, 30)
        finally:
            await s.close()
    run(go())


def test_the_deleter_takes_its_deletions_out_of_its_index_and_still_sees_anothers(backend):
    """A collection pass's deleter drops what it deleted from its own index instead of
    reading every key again; a deletion by another store that its index has not seen yet
    still makes it read everything, and the other store reads this one's."""
    async def go():
        s = backend.store()
        other = backend.store(kv=s.kv) if backend.name == "embedded" else backend.store()
        try:
            t = await s.create_topic("d", 1, 1, {}, states(1))
            tid, ep = t.topic_id, {(t.topic_id, 0): 0}
            for n in range(4):
                await s.commit_wal(WalObject(1, n, f"w{n}", (rng(tid, 0, 10 * n, 10 * n + 9),)), ep)
            await s.commit_segment(tid, 0, seg(0, 19), 0)
            await other.commit_segment(tid, 0, seg(20, 29), 0)
            assert [o.key for o in await other.obsolete_wal_objects()] == ["w0", "w1", "w2"]
            await s.log_state(tid, 0)  # s's index now has all four, and no deletion
            await other.delete_wal_objects([(1, 2)])
            # s deletes without having looked since: the other's deletion must not go unseen
            await s.delete_wal_objects([(1, 0), (1, 1)])
            assert [o.key for o in await s.wal_objects()] == ["w3"]
            assert [o.key for o in await other.wal_objects()] == ["w3"]
            await s.commit_segment(tid, 0, seg(30, 39), 0)
            assert await s.log_state(tid, 0) == LogState(0, 40)
            index = s._index
            await s.delete_wal_objects([(1, 3)])
            assert await s.wal_objects() == [] and await s.log_state(tid, 0) == LogState(0, 40)
            assert s._index is index  # taken out in place: no reload
            assert await other.wal_objects() == [] and await other.log_state(tid, 0) == LogState(0, 40)
        finally:
            await s.close()
            if other.kv is not s.kv:
                await other.close()
    run(go())


def test_segments_replace_and_delete(backend):
    async def go():
        s = backend.store()
        try:
            t = await s.create_topic("s", 1, 1, {}, states(1))
            tid = t.topic_id
            for base, last in ((0, 9), (10, 19), (20, 29)):
                await s.commit_segment(tid, 0, seg(base, last), 0)
            got = await s.segments(tid, 0)
            assert [x.base_offset for x in got] == [0, 10, 20]
            assert got[0].producers == {"7": {"epoch": 0, "seq": 3}}
            # compaction: 0 and 10 become one segment with base 0
            await s.replace_segments(tid, 0, [0, 10], [seg(0, 19, key="compacted")])
            got = await s.segments(tid, 0)
            assert [(x.base_offset, x.last_offset, x.key_base) for x in got] == [
                (0, 19, "compacted"), (20, 29, "seg/00000000000000000020")]
            with pytest.raises(Fenced, match="already gone"):
                await s.replace_segments(tid, 0, [10], [seg(10, 19, key="late")])
            assert [x.key_base for x in await s.segments(tid, 0)] == [
                "compacted", "seg/00000000000000000020"]
            await s.delete_segments(tid, 0, [0])
            assert [x.base_offset for x in await s.segments(tid, 0)] == [20]
            with pytest.raises(RequestTooLarge):
                await s.replace_segments(tid, 0, [], [seg(100 * i, 100 * i + 9)
                                                     for i in range(200)])
        finally:
            await s.close()
    run(go())


class InterleavingKV:
    """A real KV that, once, lets another party act right before a chosen transaction,
    the way a controller may act while a gateway is between two transactions."""

    def __init__(self, inner, when, action):
        self.inner, self.when, self.action = inner, when, action
        self.txns: list[list] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def txn(self, compares, success, failure=()):
        self.txns.append(success)
        if self.action is not None and self.when(self.txns):
            action, self.action = self.action, None
            await action()
        return await self.inner.txn(compares, success, failure)


def _part_txns(txns: list[list]) -> int:
    return sum(1 for ops in txns if any(isinstance(o, Put) and o.key.count("/") == 6
                                         and "/wal/" in o.key for o in ops))


def test_fingerprint_changes_with_every_put_and_delete_under_a_prefix(backend):
    async def go():
        kv = backend.kv()
        try:
            a, b = f"{backend.ns}a/", f"{backend.ns}b/"
            empty = await kv.fingerprint([a, b])
            assert empty == ((0, 0), (0, 0))
            await kv.put(a + "1", b"x")
            one = await kv.fingerprint([a, b])
            assert one[0][1] == 1 and one[1] == (0, 0)
            await kv.put(b + "1", b"y")  # another prefix: a's part stays
            assert (await kv.fingerprint([a, b]))[0] == one[0]
            # Every change shows; a delete may bring back an earlier fingerprint, and then the
            # contents are the earlier ones too (revisions only grow, so a key written since
            # would have a greater one).
            previous = one[0]
            for change in (kv.put(a + "1", b"x"), kv.put(a + "2", b"z"), kv.delete(a + "2"),
                           kv.delete(a + "1")):
                await change
                now = (await kv.fingerprint([a]))[0]
                assert now != previous
                previous = now
            assert previous == (0, 0)
        finally:
            await kv.close()
    run(go())


def test_embedded_coordinator_commits_a_flush_of_many_partitions_in_one_transaction(tmp_path):
    # etcd's 128-operation bound does not apply to SQLite: a gateway leading thousands of
    # partitions pays one transaction per flush, not one per 127 partitions.
    async def go():
        store = KVClusterStore(EmbeddedKV(tmp_path / "coord"), "c")
        try:
            tid = (await store.create_topic("big", 1000, 1, {}, states(1000))).topic_id
            obj = WalObject(1, 1, "wal/1/1.wal", tuple(rng(tid, p, 0, 9, p * 100) for p in range(1000)))
            await store.commit_wal(obj, {(tid, p): 0 for p in range(1000)})
            assert len(await store.kv.range(f"{store.prefix}wal/")) == 1
            (o,) = await store.wal_objects()
            assert o.ranges == obj.ranges
        finally:
            await store.close()
    run(go())


def test_large_wal_commit_is_split_and_stays_fenced(backend):
    async def go():
        base = backend.kv()
        admin = backend.store(kv=base)
        try:
            big = await admin.create_topic("big", 300, 1, {}, states(300))
            side = await admin.create_topic("side", 1, 1, {}, states(1))
            tid = big.topic_id
            epochs = {(tid, p): 0 for p in range(300)}

            def obj(seq):
                return WalObject(1, seq, f"wal/1/{seq}.wal",
                                 tuple(rng(tid, p, 0, 9, p * 100) for p in range(300)))

            # 1. plain: 300 partitions need several transactions, all within the limits
            await admin.commit_wal(obj(1), epochs)
            raw = await base.range(f"{admin.prefix}wal/")
            assert len(raw) == 1 + 3  # header + 3 parts of at most 127 partitions
            (o,) = await admin.wal_objects()
            assert o.ranges == obj(1).ranges
            assert (await admin.log_states([(tid, p) for p in range(300)]))[(tid, 299)] == \
                LogState(0, 10)

            # 2. an unrelated leader change mid-commit: retried, then committed
            async def move_side():
                await admin.set_partition_state(side.topic_id, 0,
                                                PartitionState(2, 1, (2,), (2,)))
            kv = InterleavingKV(base, lambda t: _part_txns(t) == 2, move_side)
            gw = backend.store(kv=kv)
            await gw.commit_wal(obj(2), epochs)
            assert _part_txns(kv.txns) > 3
            assert [x.sequence for x in await gw.wal_objects()] == [1, 2]

            # 3. one of its own partitions moves mid-commit (after its part landed): fenced,
            #    and neither the header nor any part stays behind
            async def move_p0():
                await admin.set_partition_state(tid, 0, PartitionState(2, 1, (2,), (2,)))
            kv = InterleavingKV(base, lambda t: _part_txns(t) == 2, move_p0)
            gw = backend.store(kv=kv)
            with pytest.raises(Fenced, match=f"{tid}/0 "):
                await gw.commit_wal(obj(3), epochs)
            assert [x.sequence for x in await gw.wal_objects()] == [1, 2]
            assert not [k for k, _, _ in await base.range(f"{admin.prefix}wal/1/")
                        if "00000000000000000003" in k]
            # retrying the already committed object 1 after p0 moved: done, parts intact
            await admin.commit_wal(obj(1), epochs)
            assert (await admin.wal_objects())[0].ranges == obj(1).ranges
        finally:
            await base.close()
    run(go())


# --- groups and producer ids ----------------------------------------------------------------

def test_offsets_commit_fetch_delete(backend):
    async def go():
        s = backend.store()
        try:
            o = {("t", p): CommittedOffset(p * 10, 1, f"m{p}", 1700 + p) for p in range(3)}
            await s.commit_offsets("group/one%", o)
            await s.commit_offsets("g2", {("t", 0): CommittedOffset(1, -1, "", 5)})
            assert await s.fetch_offsets("group/one%") == o
            assert await s.fetch_offsets("nobody") == {}
            assert await s.groups_with_offsets() == ["g2", "group/one%"]
            await s.commit_offsets("group/one%", {("t", 0): CommittedOffset(99, 2, "", 9)})
            assert (await s.fetch_offsets("group/one%"))[("t", 0)].offset == 99
            await s.delete_offsets("group/one%", [("t", 1), ("t", 7)])
            assert sorted(await s.fetch_offsets("group/one%")) == [("t", 0), ("t", 2)]
            await s.delete_offsets("group/one%")
            assert await s.fetch_offsets("group/one%") == {}
            assert await s.groups_with_offsets() == ["g2"]
            many = {(f"t{i}", 0): CommittedOffset(i, 0, "", 0) for i in range(300)}
            await s.commit_offsets("big", many)
            assert await s.fetch_offsets("big") == many
        finally:
            await s.close()
    run(go())


def test_producer_ids_are_unique_under_concurrency(backend):
    async def go():
        first = backend.store()
        # on etcd a second client competes too; the embedded store is single-process
        second = backend.store() if backend.name == "etcd" else first
        try:
            starts = await asyncio.gather(*[
                (first if i % 2 else second).allocate_producer_ids(5) for i in range(20)])
            assert sorted(starts) == list(range(0, 100, 5))
            assert await first.allocate_producer_ids(1) == 100
            with pytest.raises(ValueError):
                await first.allocate_producer_ids(0)
        finally:
            await first.close()
            if second is not first:
                await second.close()
    run(go())


# --- bad input --------------------------------------------------------------------------------

def test_corrupt_values_raise_clear_errors(backend):
    async def go():
        s = backend.store()
        try:
            t = await s.create_topic("ok", 1, 1, {}, states(1))
            await s.kv.put(f"{s.prefix}topics/broken", b"{not json")
            with pytest.raises(CoordinatorError, match="corrupt coordinator value at .*/broken"):
                await s.topics()
            await s.kv.delete(f"{s.prefix}topics/broken")
            await s.kv.put(f"{s.prefix}wal/1/{5:020d}", b'{"key":"x","ranges":[{"topic_id":1}]}')
            with pytest.raises(CoordinatorError, match="corrupt WAL ranges"):
                await s.log_state(t.topic_id, 0)
            await s.delete_wal_objects([(1, 5)])
            assert await s.log_state(t.topic_id, 0) == LogState(0, 0)
            await s.kv.put(f"{s.prefix}producer_ids/next", b'"many"')
            with pytest.raises(CoordinatorError, match="expected an integer"):
                await s.allocate_producer_ids(1)
        finally:
            await s.close()
    run(go())


def test_open_coordinator_urls(tmp_path):
    with pytest.raises(ValueError, match="unsupported coordinator URL 'zk://x'"):
        open_coordinator("zk://x", tmp_path)
    with pytest.raises(ValueError, match="names no etcd endpoint"):
        open_coordinator("etcd://", tmp_path)
    with pytest.raises(ValueError, match="bad etcd endpoint 'host'"):
        open_coordinator("etcd://host", tmp_path)
    assert parse_endpoints("a:1, b:2") == [("a", 1), ("b", 2)]
    with pytest.raises(ValueError, match="cluster name"):
        KVClusterStore(None, "a/b")  # type: ignore[arg-type]

    async def go():
        s = open_coordinator("embedded", tmp_path / "d", cluster="x")
        assert isinstance(s.kv, EmbeddedKV) and s.prefix == "/stratalog/x/"
        await s.close()
        e = open_coordinator("etcd://127.0.0.1:1,127.0.0.1:2", tmp_path)
        assert isinstance(e.kv, EtcdKV) and e.kv.endpoints == [("127.0.0.1", 1), ("127.0.0.1", 2)]
        await e.close()
    run(go())


# --- embedded only ----------------------------------------------------------------------------

def test_embedded_persists_across_reopen(tmp_path):
    async def write():
        s = open_coordinator(None, tmp_path)
        t = await s.create_topic("p", 2, 1, {"a": "b"}, states(2))
        await s.commit_wal(WalObject(1, 1, "k", (rng(t.topic_id, 1, 0, 41),)),
                           {(t.topic_id, 0): 0, (t.topic_id, 1): 0})
        await s.commit_offsets("g", {("p", 1): CommittedOffset(17, 0, "x", 3)})
        lease = await s.kv.grant_lease(60)
        await s.register_broker(1, "127.0.0.1", 9092, None, lease)
        assert await s.brokers() == {1: {"host": "127.0.0.1", "port": 9092, "rack": None, "lagging": []}}
        rev = await s.kv.put("/other", b"1")
        cid = await s.cluster_id()
        await s.close()
        return t, rev, cid

    async def read(t, rev, cid):
        s = open_coordinator(None, tmp_path)
        assert await s.cluster_id() == cid
        assert await s.topic("p") == t
        assert await s.log_state(t.topic_id, 1) == LogState(0, 42)
        assert await s.fetch_offsets("g") == {("p", 1): CommittedOffset(17, 0, "x", 3)}
        assert await s.brokers() == {}  # leases do not outlive their process
        assert await s.kv.put("/other", b"2") > rev
        await s.close()

    run(read(*run(write())))


def test_embedded_lock_and_kill9_durability(tmp_path):
    data = tmp_path / "d"
    child = subprocess.Popen(
        [sys.executable, "-c", (
            "import asyncio, sys\n"
            "from pathlib import Path\n"
            "from stratalog.coordinator.embedded import EmbeddedKV\n"
            "from stratalog.coordinator.kv import Put, absent\n"
            "async def main():\n"
            "    kv = EmbeddedKV(Path(sys.argv[1]))\n"
            "    await kv.put('/a', b'1')\n"
            "    assert await kv.txn([absent('/b')], [Put('/b', b'2'), Put('/c', b'3')])\n"
            "    print('ready', flush=True)\n"
            "    await asyncio.sleep(60)\n"
            "asyncio.run(main())\n"), str(data)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.strip() == "ready", child.stderr.read()
        with pytest.raises(DataDirInUse, match=f"data directory {data} is in use by another "
                                                "stratalog process"):
            EmbeddedKV(data)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()

    async def check():
        kv = EmbeddedKV(data)
        try:
            assert [(k, v) for k, v, _ in await kv.range("/")] == [
                ("/a", b"1"), ("/b", b"2"), ("/c", b"3")]
        finally:
            await kv.close()
    run(check())


def test_embedded_rejects_a_corrupt_database(tmp_path):
    (tmp_path / DB_FILE).write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(CoordinatorError, match="not a usable stratalog coordinator database"):
        EmbeddedKV(tmp_path)
    # the failed open released the lock
    (tmp_path / DB_FILE).unlink()
    run(EmbeddedKV(tmp_path).close())


# --- etcd only --------------------------------------------------------------------------------

def test_etcd_enforces_its_own_txn_limit(etcd_server):
    async def go():
        # with our own guard lifted, etcd's server-side limit answers instead
        kv = EtcdKV([etcd_server.endpoint], max_txn_ops=10_000)
        try:
            with pytest.raises(RequestTooLarge, match="too many operations"):
                await kv.txn([], [Put(f"/limit/{i}", b"") for i in range(129)])
        finally:
            await kv.close()
    run(go())


def test_etcd_moves_to_the_next_endpoint(etcd_server):
    async def go():
        dead = ("127.0.0.1", free_port())
        kv = EtcdKV([dead, etcd_server.endpoint])
        try:
            with pytest.raises(CoordinatorUnavailable, match=f"127.0.0.1:{dead[1]}"):
                await kv.get("/x")
            await kv.put("/x", b"1")
            assert (await kv.get("/x"))[0] == b"1"
        finally:
            await kv.close()
    run(go())


def test_etcd_restart(tmp_path):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (/usr/bin/etcd or the venv's etcd)")
    server = EtcdServer(binary, tmp_path / "etcd")
    server.start()
    try:
        async def go():
            s = open_coordinator(server.url, tmp_path, cluster="restart")
            try:
                t = await s.create_topic("t", 1, 1, {}, states(1))
                await s.commit_wal(WalObject(1, 1, "k", (rng(t.topic_id, 0, 0, 9),)),
                                   {(t.topic_id, 0): 0})
                assert await s.log_state(t.topic_id, 0) == LogState(0, 10)
                watch = await s.kv.watch_prefix(s.prefix)
                server.stop()
                with pytest.raises(CoordinatorUnavailable):
                    await asyncio.wait_for(watch.__anext__(), 10)
                for call in (s.topics(), s.log_state(t.topic_id, 0),
                             s.commit_wal(WalObject(1, 2, "k2", (rng(t.topic_id, 0, 10, 19),)),
                                          {(t.topic_id, 0): 0})):
                    with pytest.raises(CoordinatorUnavailable, match="unavailable"):
                        await call
                server.start()
                deadline = time.monotonic() + 15
                while True:
                    try:
                        topics = await s.topics()
                        break
                    except CoordinatorUnavailable:
                        assert time.monotonic() < deadline, "etcd did not come back"
                        await asyncio.sleep(0.1)
                assert topics == {"t": t}
                assert await s.log_state(t.topic_id, 0) == LogState(0, 10)
                await s.commit_wal(WalObject(1, 2, "k2", (rng(t.topic_id, 0, 10, 19),)),
                                   {(t.topic_id, 0): 0})
                assert await s.log_state(t.topic_id, 0) == LogState(0, 20)
            finally:
                await s.close()
        run(go())
    finally:
        server.kill()


def test_client_quotas_are_stored_changed_removed_and_watched(backend):
    """KIP-546 entities: set, change, remove one value, forget an entity left empty; names
    with '/', '=' and '<default>' itself never collide with a default; a watch sees it."""
    async def scenario():
        s = backend.store()
        watch = await s.watch_client_quotas()
        alice = (("user", "alice"),)
        tricky = (("client-id", "<default>"), ("user", "a/b=c"))
        default_pair = (("client-id", None), ("user", None))
        await s.alter_client_quota(alice, {"producer_byte_rate": 1024, "consumer_byte_rate": 2048})
        await s.alter_client_quota(tricky, {"request_percentage": 50})
        await s.alter_client_quota(default_pair, {"controller_mutation_rate": 2})
        await s.alter_client_quota(alice, {"consumer_byte_rate": None, "producer_byte_rate": 4096})
        got = {q.entity: q.values for q in await s.client_quotas()}
        assert got == {alice: {"producer_byte_rate": 4096.0}, tricky: {"request_percentage": 50.0},
                       default_pair: {"controller_mutation_rate": 2.0}}
        await s.alter_client_quota(tricky, {"request_percentage": None})
        assert {q.entity for q in await s.client_quotas()} == {alice, default_pair}
        event = await asyncio.wait_for(watch.__anext__(), 10)
        assert "client_quotas/" in event.key
        await watch.close()
        await s.close()
    run(scenario())


def test_a_transaction_state_is_deleted_only_at_its_revision_and_the_watch_names_it(backend):
    from stratalog.coordinator.transactions import TxnState

    async def body():
        store = backend.store()
        watch = await store.watch_transactions()
        tid = "orders/eu ingest%1"  # quoted inside the key
        assert await store.put_transaction(TxnState(tid, 7, 0, 60_000), 0)
        _, revision = await store.transaction(tid)
        assert not await store.delete_transaction(tid, revision + 1)
        assert await store.delete_transaction(tid, revision)
        assert await store.transaction(tid) is None
        seen = []
        async for event in watch:
            seen.append((event.kind, store.transactional_id_of(event.key)))
            if len(seen) == 2:
                break
        await watch.close()
        assert seen == [("put", tid), ("delete", tid)]
    run(body())


@pytest.mark.unit
def test_the_log_index_after_deletions_is_what_a_fresh_read_makes_of_the_same_keys(tmp_path):
    # A deletion makes the index read every key again, and it then decodes only what
    # changed onto a copy of itself: after any mix of WAL commits (split ones too),
    # seals, collections, truncations, log-start moves and topic changes, what it answers
    # is what a store that decoded everything anew answers.
    import random

    async def go():
        kv = EmbeddedKV(tmp_path / "coord", max_txn_ops=8)  # objects of 8+ ranges are split
        live = KVClusterStore(kv, "c")
        rnd = random.Random(7)
        topics = {}
        sequence, ends = 0, {}

        async def add_topic(name, n):
            t = await live.create_topic(name, n, 1, {}, states(n))
            topics[name] = t
            for p in range(n):
                ends[(t.topic_id, p)] = 0

        async def same():
            fresh = KVClusterStore(kv, "c")  # shares the KV: never closed
            tps = sorted(ends, key=lambda tp: (str(tp[0]), tp[1]))
            assert await live.wal_objects() == await fresh.wal_objects()
            assert await live.log_states(tps) == await fresh.log_states(tps)
            assert await live.obsolete_wal_objects() == await fresh.obsolete_wal_objects()
            for tp in tps:
                assert await live.segments(*tp) == await fresh.segments(*tp)
                assert await live.wal_ranges(*tp, 0) == await fresh.wal_ranges(*tp, 0)

        await add_topic("a", 12)
        await add_topic("b", 3)
        for step in range(160):
            op = rnd.random()
            if op < 0.5:  # a WAL commit over some partitions
                chosen = rnd.sample(sorted(ends, key=lambda tp: (str(tp[0]), tp[1])), rnd.randint(1, 10))
                ranges = []
                for i, tp in enumerate(chosen):
                    n = rnd.randint(1, 5)
                    ranges.append(rng(tp[0], tp[1], ends[tp], ends[tp] + n - 1, i * 100))
                    ends[tp] += n
                sequence += 1
                await live.commit_wal(WalObject(1, sequence, f"wal/1/{sequence}.wal", tuple(ranges)),
                                      {tp: 0 for tp in chosen})
            elif op < 0.65:  # a seal of what one partition has
                tp = rnd.choice(sorted(ends, key=lambda tp: (str(tp[0]), tp[1])))
                done = (await live.segments(*tp))
                start = done[-1].last_offset + 1 if done else 0
                if ends[tp] > start:
                    await live.commit_segment(*tp, seg(start, ends[tp] - 1, 0, f"seg/{step}"), 0)
            elif op < 0.8:  # a collection pass
                obsolete = await live.obsolete_wal_objects()
                await live.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
            elif op < 0.88:  # a truncation of one partition's unsealed tail
                tp = rnd.choice(sorted(ends, key=lambda tp: (str(tp[0]), tp[1])))
                done = await live.segments(*tp)
                sealed_end = done[-1].last_offset + 1 if done else 0
                if ends[tp] > sealed_end + 1:
                    cut = rnd.randint(max(sealed_end + 1, ends[tp] - 4), ends[tp] - 1)  # a few entries
                    ranges = await live.wal_ranges(*tp, 0)
                    kept = [(k, r) for k, r in ranges if r.base_offset < cut]
                    shortened = None
                    if kept and kept[-1][1].last_offset >= cut:
                        key, r = kept[-1]
                        shortened = (key, WalRange(r.topic_id, r.partition, r.base_offset, cut - 1,
                                                   r.position, r.length, r.max_timestamp))
                    await live.truncate_wal(*tp, cut, 0, shortened)
                    ends[tp] = cut
            elif op < 0.95:  # the log start moves up
                tp = rnd.choice(sorted(ends, key=lambda tp: (str(tp[0]), tp[1])))
                start = (await live.log_state(*tp)).log_start_offset
                if ends[tp] > start:
                    await live.set_log_start_offset(*tp, rnd.randint(start, ends[tp]))
            else:  # a topic comes and goes
                if "c" in topics:
                    gone = topics.pop("c")
                    await live.delete_topic("c")
                    for p in range(gone.partitions):
                        ends.pop((gone.topic_id, p))
                else:
                    await add_topic("c", 2)
            await same()
        await live.close()

    run(go())


def test_a_collection_pass_makes_each_reader_read_every_key_once_after_its_last_transaction(tmp_path):
    # Every deletion mark makes a reader's index read every key again (but the deleter's,
    # which takes out what it deleted); a pass deletes in many transactions and marks once,
    # after the last. Between them a reader still lists the obsolete objects but serves
    # none of their ranges.
    async def go():
        kv = EmbeddedKV(tmp_path / "coord")
        store = KVClusterStore(kv, "c")
        t = await store.create_topic("t", 1, 1, {}, states(1))
        n = 3 * WAL_DELETES_PER_TXN + 5
        for i in range(n):
            await store.commit_wal(WalObject(1, i + 1, f"wal/1/{i + 1}.wal", (rng(t.topic_id, 0, i, i),)),
                                   {(t.topic_id, 0): 0})
        await store.commit_segment(t.topic_id, 0, seg(0, n - 1), 0)
        reader = KVClusterStore(kv, "c")
        assert len(await reader.wal_objects()) == len(await store.wal_objects()) == n
        full_reads, listed, served = [], [], []
        real_snapshot, real_txn = kv.snapshot, kv.txn

        async def snapshot(prefixes, min_mod_revision=0):
            if min_mod_revision == 0:
                full_reads.append(min_mod_revision)
            return await real_snapshot(prefixes, min_mod_revision)

        async def txn(compares, ops, failure=()):
            ok = await real_txn(compares, ops, failure)
            listed.append(len(await reader.wal_objects()))
            served.extend(await reader.wal_ranges(t.topic_id, 0, 0))
            return ok

        kv.snapshot, kv.txn = snapshot, txn
        obsolete = await store.obsolete_wal_objects()
        assert len(obsolete) == n
        await store.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
        assert listed == [n, n, n, n, 0] and served == []
        assert await store.wal_objects() == [] and len(full_reads) == 1  # the reader's
        await kv.close()

    asyncio.run(go())


def test_a_partitions_wal_entries_without_dropped_objects_say_whether_its_last_offset_went():
    from stratalog.coordinator.store import _without

    tid = uuid.uuid4()
    found = {(1, i): (f"wal/{i}", [rng(tid, 0, 10 * i, 10 * i + 9)]) for i in range(10)}
    last = 99  # held by (1, 9)
    for dropped, held in (({(1, 9)}, True), ({(1, 0)}, False), ({(1, i) for i in range(2, 10)}, True),
                          ({(1, i) for i in range(1, 9)}, False), (set(), False), ({(2, 9)}, False)):
        for most in (False, True):  # either way of finding what is kept
            kept, said = _without(found, dropped, most, last)
            assert said == held, (dropped, most)
            assert kept == {ws: e for ws, e in found.items() if ws not in dropped}
            assert kept is not found
