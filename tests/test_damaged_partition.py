"""A partition whose committed data is damaged or missing goes offline alone: the gateway
serves every other partition, answers KAFKA_STORAGE_ERROR for it, shows it in /readyz, the
metrics and `stratalog topics describe`, and an operator brings it back (again once the
object is restored, or truncated with --truncate --accept-data-loss). In a cluster the
offline state lives in the coordinator, so the partition does not bounce between gateways.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from stratalog.coordinator.model import PartitionState
from stratalog.engine import Assignment
from stratalog.engine.errors import PartitionOffline, RepairRefused
from stratalog.gateway.cluster import decide_partition
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.error_codes import ErrorCode

from cluster_fixtures import etcd, moto_s3  # noqa: F401  (fixtures)

try:
    from tests.engine_harness import TIMEOUT_S, Backends, batch, committed, read_all, records_of, run
except ImportError:  # tests/ is not a package: pytest put it on sys.path
    from engine_harness import TIMEOUT_S, Backends, batch, committed, read_all, records_of, run  # type: ignore


def flip_range(path, position: int, length: int) -> None:
    """Flip bytes in the middle of one WAL range: its batches' CRCs no longer match."""
    data = bytearray(path.read_bytes())
    for i in range(position + length // 2, position + length // 2 + 8):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.unit
def test_metadata_gives_an_offline_partition_its_error_not_the_topic():
    """The topic's error stays NONE whichever partition is offline (the last one too):
    librdkafka takes a topic-level error for the whole topic and serves none of it."""
    from stratalog.coordinator.model import TopicInfo
    from stratalog.gateway.handlers.metadata import describe_topic

    class Broker:
        async def partition_states(self, info):
            return {0: PartitionState(1, 3, (1,), (1,)), 1: PartitionState(-1, 4, (1,), (), "gone")}

    described = asyncio.run(describe_topic(Broker(), "t", TopicInfo("t", uuid.uuid4(), 2, 1, {})))
    assert described["error_code"] == 0
    assert [p["error_code"] for p in described["partitions"]] == [0, ErrorCode.KAFKA_STORAGE_ERROR]


# ---- in process: the engine marks, refuses and repairs ------------------------------------

@pytest.mark.unit
def test_damaged_wal_range_takes_only_its_partition_offline(tmp_path):
    async def body(h):
        info = await h.create_topic("t", partitions=2)
        engine = await h.start_engine()
        await h.lead(engine)
        for p in (0, 1):
            for i in range(3):
                await committed(engine.append("t", p, batch(2, ts=1000 + i, tag=f"p{p}b{i}"), now_ms=h.clock.ms))
        await h.stop_engine(engine)
        # Damage the newest range of partition 0 only (its last two records).
        ranges = await h.store.wal_ranges(info.topic_id, 0, 0)
        key, last = ranges[-1]
        flip_range(tmp_path / "objects" / key, last.position, last.length)

        engine = await h.start_engine()
        tasks = engine.take_leadership(await h.assignments(1))
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)  # ends: no endless retry
        assert len(records_of(await read_all(engine, "t", 1))) == 6  # the other partition serves
        with pytest.raises(PartitionOffline, match="corrupt") as refused:
            engine.partition("t", 0)
        assert error_code(refused.value) == ErrorCode.KAFKA_STORAGE_ERROR
        assert "corrupt" in engine.found_offline()[("t", 0)]
        st = (await h.store.partition_states(info.topic_id))[0]
        assert st.offline and st.leader == -1 and st.leader_epoch == 1  # recorded, fenced
        # The controller leaves it alone while it is offline.
        assert decide_partition(info, 0, st, [1, 2], lambda n: frozenset()) == st

        with pytest.raises(RepairRefused, match="still damaged"):
            await engine.repair("t", info.topic_id, 0, truncate=False)
        done = await engine.repair("t", info.topic_id, 0, truncate=True)
        assert (done.high_watermark, done.lost) == (4, 2)
        st = (await h.store.partition_states(info.topic_id))[0]
        assert not st.offline
        await h.move_leadership("t", 0, leader=1)
        await h.lead(engine)
        assert [r[0] for r in records_of(await read_all(engine, "t", 0))] == [0, 1, 2, 3]
        await committed(engine.append("t", 0, batch(1, ts=2000, tag="new"), now_ms=h.clock.ms))
        assert [r[0] for r in records_of(await read_all(engine, "t", 0))] == [0, 1, 2, 3, 4]
        with pytest.raises(RepairRefused, match="not offline"):
            await engine.repair("t", info.topic_id, 0, truncate=False)

    run(Backends("embedded+file", tmp_path), body)


@pytest.mark.unit
def test_outage_is_retried_not_marked_offline(tmp_path):
    """An unreachable store is not damage: recovery keeps retrying and nothing is recorded."""
    from stratalog.tiering.objectstore import ObjectStoreError

    class Down:
        def __init__(self, inner):
            self.inner, self.up = inner, False

        async def get(self, *a, **k):
            if not self.up:
                raise ObjectStoreError("store unreachable")
            return await self.inner.get(*a, **k)

        def __getattr__(self, name):
            return getattr(self.inner, name)

    async def body(h):
        info = await h.create_topic("t")
        engine = await h.start_engine()
        await h.lead(engine)
        await committed(engine.append("t", 0, batch(2, ts=1000), now_ms=h.clock.ms))
        await h.stop_engine(engine)
        down = Down(h.objects)
        engine = await h.start_engine(objects=down)
        tasks = engine.take_leadership([Assignment("t", info.topic_id, 0, 0)])
        await asyncio.sleep(0.5)
        assert not all(t.done() for t in tasks) and not engine.found_offline()
        assert not (await h.store.partition_states(info.topic_id))[0].offline
        down.up = True
        await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)
        assert len(records_of(await read_all(engine, "t", 0))) == 2

    run(Backends("embedded+file", tmp_path), body)


@pytest.mark.unit
def test_offline_state_round_trips_through_the_coordinator(tmp_path):
    async def body(h):
        info = await h.create_topic("t")
        st = PartitionState(-1, 1, (1,), (), "WAL object wal/1/2.wal is missing")
        await h.store.set_partition_state(info.topic_id, 0, st, expect_epoch=0)
        await h.reopen_clients()
        assert (await h.store.partition_states(info.topic_id))[0] == st

    run(Backends("embedded+file", tmp_path), body)


# ---- real gateways and clients ----------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    from conftest import ROOT

    return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def _ask(bootstrap: str, api: int, version: int, body: dict):
    """One raw request to the gateway at `bootstrap`, its decoded answer."""
    from stratalog.gateway.protocol.frames import decode_response, encode_request

    host, port = bootstrap.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(encode_request(api, version, 7, body))
        (n,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        return decode_response(api, version, s.recv(n, socket.MSG_WAITALL))[1]


def storage_errors(bootstrap: str, topic: str, partition: int) -> dict[str, int]:
    """The error codes of a Produce, a Fetch, a ListOffsets and a Metadata for one partition."""
    from stratalog.tiering.batch import build_batch

    produce = _ask(bootstrap, 0, 8, {"transactional_id": None, "acks": -1, "timeout_ms": 10_000, "topic_data": [
        {"name": topic, "partition_data": [
            {"index": partition, "records": build_batch([(b"k", b"v", [])], timestamp_ms=1)}]}]})
    fetch = _ask(bootstrap, 1, 11, {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
        "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "current_leader_epoch": -1, "fetch_offset": 0, "log_start_offset": -1,
             "partition_max_bytes": 1 << 20}]}]})
    offsets = _ask(bootstrap, 2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1,
                                        "timestamp": -1}]}]})
    metadata = _ask(bootstrap, 3, 9, {"topics": [{"name": topic}], "allow_auto_topic_creation": False,
                                      "include_topic_authorized_operations": False})
    md = next(p for p in metadata.topics[0].partitions if p.partition_index == partition)
    return {"produce": produce.responses[0].partition_responses[0].error_code,
            "fetch": fetch.responses[0].partitions[0].error_code,
            "list_offsets": offsets.topics[0].partitions[0].error_code,
            "metadata": md.error_code, "metadata_leader": md.leader_id}


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def _offline_gauge(http_url: str) -> float:
    with urllib.request.urlopen(f"{http_url}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("stratalog_partitions_offline "):
                return float(line.split()[1])
    raise AssertionError("no stratalog_partitions_offline metric")


def produce(bootstrap: str, topic: str, partition: int, values: list[bytes]) -> None:
    """`values` in one batch, so in one WAL flush: the tests damage or remove the flush of
    one call. (Sent one by one, a busy machine split them over two flushes, and removing
    the last object lost fewer offsets than the test expected.)"""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 10_000})
    p.list_topics(topic, timeout=30)
    for v in values:
        p.produce(topic, value=v, partition=partition)
    assert p.flush(60) == 0


def consume(bootstrap: str, topic: str, partition: int, count: int, timeout: float = 60) -> list[bytes]:
    """The first `count` records of a partition (fails unless they all arrive in time)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, partition, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and not m.error():
                out.append(m.value())
        assert len(out) >= count, f"{topic}-{partition}: {len(out)} of {count} records"
        return out
    finally:
        c.close()


def wal_ranges_of(coordinator: str | None, data_dir: Path, topic: str, partition: int):
    """(object key, range) of a partition's committed WAL ranges, read from the coordinator."""
    from stratalog.coordinator import open_coordinator

    async def read():
        store = open_coordinator(coordinator, data_dir)
        try:
            info = await store.topic(topic)
            return await store.wal_ranges(info.topic_id, partition, 0)
        finally:
            await store.close()

    return asyncio.run(read())


def values(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i:04d}".encode() for i in range(n)]


def test_one_gateway_serves_the_rest_and_the_operator_recovers_both_ways(gateway_factory):
    from cluster_fixtures import create_topic, wait_for

    gw = gateway_factory()
    topic, other = f"orders-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    create_topic(gw.bootstrap, topic, 3)
    create_topic(gw.bootstrap, other, 1)
    for p in range(3):
        produce(gw.bootstrap, topic, p, values(f"p{p}", 20))
    produce(gw.bootstrap, other, 0, values("o", 5))
    produce(gw.bootstrap, topic, 0, values("p0-last", 4))  # the last flush: partition 0 alone
    gw.kill9()  # before anything is sealed: every record lives in WAL objects

    # Damage partition 0's last range; keep the original to restore it later.
    key, r = wal_ranges_of(None, gw.data_dir, topic, 0)[-1]
    path = gw.data_dir / "objects" / key
    original = path.read_bytes()
    flip_range(path, r.position, r.length)

    gw.start()  # the Kafka port opens although one partition cannot be recovered
    for p in (1, 2):
        assert consume(gw.bootstrap, topic, p, 20) == values(f"p{p}", 20)
        produce(gw.bootstrap, topic, p, values(f"p{p}-after", 3))
    assert consume(gw.bootstrap, other, 0, 5) == values("o", 5)
    offline = {"produce": 56, "fetch": 56, "list_offsets": 56, "metadata": 56, "metadata_leader": -1}
    # The produce, fetch and list_offsets answers come at once; Metadata once the gateway
    # has read the offline state back from the coordinator (its next cluster tick).
    wait_for(lambda: storage_errors(gw.bootstrap, topic, 0) == offline,
             what="KAFKA_STORAGE_ERROR for the damaged partition")
    ready = _get_json(f"{gw.http_url}/readyz")
    assert ready["ready"] and f"{topic}-0" in ready["reason"]
    assert [(o["topic"], o["partition"]) for o in ready["offline_partitions"]] == [(topic, 0)]
    assert "corrupt" in ready["offline_partitions"][0]["reason"]
    assert _offline_gauge(gw.http_url) == 1
    assert "OFFLINE" in gw.log_tail() or "OFFLINE" in gw.log_path.read_text()
    described = _cli("topics", "describe", topic, "--bootstrap", gw.bootstrap)
    assert described.returncode == 0 and "OFFLINE" in described.stdout, described
    listed = _cli("partitions", "offline", "--admin", gw.http_url)
    assert f"{topic}" in listed.stdout and "corrupt" in listed.stdout, listed

    # Retrying while the object is still damaged changes nothing; restored, every record is back.
    refused = _cli("partitions", "recover", topic, "0", "--admin", gw.http_url)
    assert refused.returncode == 1 and "still damaged" in refused.stderr, refused
    path.write_bytes(original)
    done = _cli("partitions", "recover", topic, "0", "--admin", gw.http_url)
    assert done.returncode == 0 and "no offsets lost" in done.stdout, done
    assert consume(gw.bootstrap, topic, 0, 24) == values("p0", 20) + values("p0-last", 4)
    assert _offline_gauge(gw.http_url) == 0 and not _get_json(f"{gw.http_url}/readyz")["offline_partitions"]

    # Now lose the last WAL object outright, and truncate.
    produce(gw.bootstrap, topic, 0, values("p0-gone", 6))
    gw.kill9()
    key, _ = wal_ranges_of(None, gw.data_dir, topic, 0)[-1]
    (gw.data_dir / "objects" / key).unlink()
    gw.start()
    wait_for(lambda: _offline_gauge(gw.http_url) == 1, what="the partition offline")
    assert "missing" in _get_json(f"{gw.http_url}/readyz")["offline_partitions"][0]["reason"]
    assert storage_errors(gw.bootstrap, topic, 0)["produce"] == 56
    unconfirmed = _cli("partitions", "recover", topic, "0", "--truncate", "--admin", gw.http_url)
    assert unconfirmed.returncode == 1 and "--accept-data-loss" in unconfirmed.stderr
    done = _cli("partitions", "recover", topic, "0", "--truncate", "--accept-data-loss", "--admin", gw.http_url)
    assert done.returncode == 0 and "truncated to offset 24: 6 offsets lost" in done.stdout, done
    produce(gw.bootstrap, topic, 0, values("p0-new", 2))
    assert consume(gw.bootstrap, topic, 0, 26) == values("p0", 20) + values("p0-last", 4) + values("p0-new", 2)
    assert gw.proc.poll() is None


def _offline_lines(gws) -> int:
    return sum(g.log_path.read_text(errors="replace").count("OFFLINE, its committed data") for g in gws)


def test_three_gateways_keep_a_damaged_partition_offline_in_one_place(gateway_factory, etcd, moto_s3, tmp_path):
    """etcd + S3: the damaged partition is recorded offline once, no other gateway tries it
    (nor the restarted old leader), the others serve, and the operator's retry through any
    gateway brings every record back."""
    from cluster_fixtures import bootstrap_of, create_topic, leaders, start_cluster, wait_for

    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, s3=moto_s3)
    bootstrap = bootstrap_of(gws)
    topic = f"orders-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 3)
    wait_for(lambda: all(v >= 0 for v in leaders(bootstrap, topic).values()), what="leaders")
    for p in range(3):
        produce(bootstrap, topic, p, values(f"p{p}", 10))
    produce(bootstrap, topic, 0, values("p0-last", 4))

    key, r = wal_ranges_of(etcd.url, tmp_path, topic, 0)[-1]
    s3 = moto_s3.client()
    name = f"{moto_s3.prefix}/{key}"
    original = s3.get_object(Bucket=moto_s3.bucket, Key=name)["Body"].read()
    damaged = bytearray(original)
    for i in range(r.position + r.length // 2, r.position + r.length // 2 + 8):
        damaged[i] ^= 0xFF
    s3.put_object(Bucket=moto_s3.bucket, Key=name, Body=bytes(damaged))
    old_leader = next(g for g in gws if g.banner and f"node {leaders(bootstrap, topic)[0]})" in g.banner)
    old_leader.kill9()  # its successor rebuilds partition 0 from the store, and meets the damage
    alive = [g for g in gws if g is not old_leader]
    bootstrap = bootstrap_of(alive)
    offline = {"produce": 56, "fetch": 56, "list_offsets": 56, "metadata": 56, "metadata_leader": -1}
    wait_for(lambda: storage_errors(bootstrap, topic, 0) == offline, timeout=60, what="partition 0 offline")
    for p in (1, 2):
        assert consume(bootstrap, topic, p, 10) == values(f"p{p}", 10)
    old_leader.start(timeout=120)
    gws_up = alive + [old_leader]
    bootstrap = bootstrap_of(gws_up)
    for p in (1, 2):
        produce(bootstrap, topic, p, values(f"p{p}-after", 2))
    # It stays where it is: one gateway found it damaged, and none tries it again.
    time.sleep(3)  # several controller passes and cluster ticks on every gateway
    assert _offline_lines(gws) == 1
    assert storage_errors(bootstrap, topic, 0) == offline
    for g in gws_up:
        ready = _get_json(f"{g.http_url}/readyz")
        assert ready["ready"] and [o["partition"] for o in ready["offline_partitions"]] == [0]

    s3.put_object(Bucket=moto_s3.bucket, Key=name, Body=original)
    done = _cli("partitions", "recover", topic, "0", "--admin", alive[0].http_url)
    assert done.returncode == 0 and "no offsets lost" in done.stdout, done
    assert consume(bootstrap, topic, 0, 14, timeout=90) == values("p0", 10) + values("p0-last", 4)
    produce(bootstrap, topic, 0, values("p0-new", 2))
    assert consume(bootstrap, topic, 0, 16, timeout=90)[-2:] == values("p0-new", 2)
