"""Sarama 1.22.1 (Debian's golang-github-shopify-sarama-dev) against a real `stratalog serve`.

tests/clients/go is one Go program, built once per session in GOPATH mode from Debian's
sources (no network), that runs the scenarios named on its command line and prints JSON
lines: produced records (SyncProducer, acks=all, idempotent or not, every codec; a record
over max.message.bytes), records read by a PartitionConsumer from an offset and with a
fetch size smaller than a record, a ConsumerGroup whose two members join and leave (range
and round-robin) or one of which is SIGKILLed, the ClusterAdmin's topic life (configs,
partitions, DeleteRecords, groups), offsets by timestamp, ReadCommitted over another
client's aborted transaction, a member riding through a gateway restart, two gateways;
then produce, consume and a group again over SASL_SSL with SCRAM-SHA-512 (xdg-go/scram
from Debian) and PLAIN, and a wrong password.

Found by Sarama and fixed in the gateway: its batches carry maxTimestamp -1, which the
gateway stored as is: ListOffsets by time found none of their records, and retention.ms
deleted their segment as soon as it was sealed.

Sarama 1.22's own limits, worked around in the Go program and not the gateway's to fix:
- it speaks Kafka up to 2.2; `config.Version = V2_1_0_0` (zstd needs 2.1);
- it commits with OffsetCommit v1 unless `Consumer.Offsets.Retention` is set, and Kafka
  4.0 removed v0-v1 (KIP-896) as the gateway does, so the members set a retention (v2);
- ClusterAdmin.DescribeCluster sends Metadata v0, which carries no controller id: it
  reports -1 whatever the gateway would say;
- its BrokerResource config type is 5, which Kafka's DescribeConfigs has not (BROKER is 4,
  Sarama's ClusterResource): the broker's configs are described with ClusterResource;
- ClusterAdmin.ListAcls drops the response's error code (SECURITY_DISABLED without an
  authorizer), so it is not tested here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from cluster_fixtures import etcd  # noqa: F401 (a fixture)
from conftest import GatewayProcess
from stratalog.infra.processes import free_port
from tests.compat.stored_batches import CODEC_IDS, stored_codecs

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "tests" / "clients" / "go"
# Debian's golang-*-dev packages put their sources in /usr/share/gocode; a GOPATH of your
# own with the same packages (Sarama 1.22's API) comes first.
GOPATHS = [*filter(None, os.environ.get("GOPATH", "").split(os.pathsep)), "/usr/share/gocode"]
GO = shutil.which("go")
if GO is None:
    pytest.skip("go is not installed (Debian: golang-go)", allow_module_level=True)
for package, deb in (("github.com/Shopify/sarama", "golang-github-shopify-sarama-dev"),
                     ("github.com/xdg-go/scram", "golang-github-xdg-go-scram-dev")):
    if not any((Path(root) / "src" / package).is_dir() for root in GOPATHS):
        pytest.skip(f"{package} is not installed (Debian: {deb})", allow_module_level=True)

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka (topic creation) is not installed")
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]
USER, PASSWORD = "gopher", "gopher-secret-1"
PARTITIONS = 4


@pytest.fixture(scope="session")
def gokafka(tmp_path_factory) -> Path:
    """The program, compiled once: GOPATH mode on Debian's sources, no module proxy."""
    binary = tmp_path_factory.mktemp("go") / "gokafka"
    env = {**os.environ, "GOPATH": os.pathsep.join(GOPATHS), "GO111MODULE": "off", "GOPROXY": "off",
           "GOFLAGS": ""}
    if not any(env.get(k) for k in ("GOCACHE", "XDG_CACHE_HOME", "HOME")):
        env["GOCACHE"] = str(binary.parent / "cache")  # go refuses to build without a cache
    built = subprocess.run([GO, "build", "-o", str(binary), "."], cwd=SOURCE, env=env,
                           capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, f"go build failed:\n{built.stderr[-3000:]}"
    return binary


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    """One plaintext gateway for the module (started once: the file must stay fast)."""
    g = GatewayProcess(tmp_path_factory.mktemp("go-gw") / "data").start()
    yield g
    g.stop()


def run(binary: Path, bootstrap: str, *args: str, ok: bool = True, timeout: float = 90) -> list[dict]:
    proc = subprocess.run([str(binary), "-brokers", bootstrap, *args], capture_output=True, text=True,
                          timeout=timeout)
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if ok:
        assert proc.returncode == 0, f"{args}: exit {proc.returncode}: {events[-1:]}\n{proc.stderr[-3000:]}"
    return events


def of(events: list[dict], kind: str) -> list[dict]:
    return [e for e in events if e["ev"] == kind]


def new_topic(bootstrap: str, partitions: int = PARTITIONS) -> str:
    """A topic made by the gateway's auto-creation rules would not have our partition count."""
    topic = f"go-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)
    return topic


def expected(index: int, codec: str) -> dict:
    """Record number `index` as the Go program's `message` makes it."""
    return {"key": f"key-{index}", "value": f"value-{index}-{codec}-" + "stratalog " * (1 + index % 4),
            "headers": [["index", str(index)], ["codec", codec], ["empty", ""]]}


def assert_records_match(produced: list[dict], consumed: list[dict], codec: str) -> None:
    """Every produced record read back exactly once, at its partition and offset, intact."""
    at = Counter((r["p"], r["o"]) for r in consumed)
    assert [k for k, n in at.items() if n > 1] == [], "records read more than once"
    by_place = {(r["p"], r["o"]): r for r in consumed}
    assert set(by_place) == {(p["p"], p["o"]) for p in produced}
    for p in produced:
        got = by_place[(p["p"], p["o"])]
        assert {k: got[k] for k in ("key", "value", "headers")} == expected(p["index"], codec)


# --- producing and reading back ------------------------------------------------------------

@pytest.mark.parametrize("idempotent", [False, True], ids=["acks-all", "idempotent"])
@pytest.mark.parametrize("codec", CODECS)
def test_sync_producer_codecs_and_partition_consumer(gw, gokafka, codec, idempotent):
    topic = new_topic(gw.bootstrap)
    flags = ["-topic", topic, "-codec", codec, "-count", "40"] + (["-idempotent"] if idempotent else [])
    produced = of(run(gokafka, gw.bootstrap, *flags, "produce"), "produced")
    assert len(produced) == 40
    partitions = Counter(p["p"] for p in produced)
    assert len(partitions) == PARTITIONS, f"keys should spread over every partition: {partitions}"
    for partition, n in partitions.items():
        # Offsets of one partition are dense from 0, in the order the records were sent.
        mine = [p for p in produced if p["p"] == partition]
        assert [p["o"] for p in mine] == list(range(n))
        assert [p["index"] for p in mine] == sorted(p["index"] for p in mine)
        # Every batch Sarama sent (one per partition, flushed per SendMessages) has the codec.
        codecs = stored_codecs(gw.bootstrap, topic, partition)
        assert codecs and set(codecs) == {CODEC_IDS[codec]}

    consumed = []
    for partition, n in partitions.items():
        events = run(gokafka, gw.bootstrap, "-topic", topic, "-partition", str(partition), "-offset", "0",
                     "-count", str(n), "consume")
        consumed += of(events, "record")
        assert of(events, "hwm") == [{"ev": "hwm", "p": partition, "o": n}]
    assert_records_match(produced, consumed, codec)


def test_async_producer_pipelined_requests_keep_their_order(gw, gokafka):
    """Sarama's AsyncProducer keeps up to 5 Produce requests in flight on one connection and
    does not retry here: the offsets follow the sends only if the gateway answers in order."""
    topic = new_topic(gw.bootstrap, partitions=1)
    produced = of(run(gokafka, gw.bootstrap, "-topic", topic, "-codec", "lz4", "-count", "500", "async"),
                  "produced")
    assert sorted((p["index"], p["o"]) for p in produced) == [(i, i) for i in range(500)]
    batches = stored_codecs(gw.bootstrap, topic)
    assert len(batches) > 1 and set(batches) == {CODEC_IDS["lz4"]}, "expected several Produce requests"
    tail = of(run(gokafka, gw.bootstrap, "-topic", topic, "-offset", "495", "-count", "5", "consume"), "record")
    assert [r["key"] for r in tail] == [f"key-{i}" for i in range(495, 500)]


def test_partition_consumer_from_an_offset(gw, gokafka):
    topic = new_topic(gw.bootstrap, partitions=1)
    produced = of(run(gokafka, gw.bootstrap, "-topic", topic, "-codec", "lz4", "-count", "30", "produce"),
                  "produced")
    events = run(gokafka, gw.bootstrap, "-topic", topic, "-offset", "17", "-count", "13", "consume")
    got = of(events, "record")
    assert [r["o"] for r in got] == list(range(17, 30))
    assert [r["key"] for r in got] == [f"key-{p['index']}" for p in produced[17:]]
    assert of(events, "hwm")[0]["o"] == 30


def test_a_record_over_max_message_bytes_is_refused_and_the_producer_goes_on(gw, gokafka):
    """Sarama's own size check raised past the topic's max.message.bytes (1048588): the
    gateway answers MESSAGE_TOO_LARGE, and the next records land from offset 0."""
    topic = new_topic(gw.bootstrap, partitions=1)
    refused = run(gokafka, gw.bootstrap, "-topic", topic, "-count", "1", "-value-bytes", "2000000",
                  "-max-message-bytes", "5000000", "produce", ok=False)
    assert "Message was too large" in refused[-1]["error"] and not of(refused, "produced")
    produced = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "2", "produce"), "produced")
    assert [p["o"] for p in produced] == [0, 1]


def test_sealed_records_outlive_a_retention_check(gateway_factory, gokafka):
    """Segments roll every 300 ms and retention runs every 200 ms; Sarama's records, an hour
    inside retention.ms, stay after their segment is sealed (with the header's maxTimestamp
    -1 stored as is, the segment looked older than any retention and was deleted)."""
    g = gateway_factory(settings={"log.roll.ms": 300, "log.retention.check.interval.ms": 200})
    topic = f"go-ret-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": g.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "3600000"})])[topic].result(15)
    run(gokafka, g.bootstrap, "-topic", topic, "-count", "5", "-codec", "gzip", "produce")
    deadline = time.monotonic() + 20
    while not list((g.data_dir / "objects").rglob("*.log")):
        assert time.monotonic() < deadline, "no segment was sealed"
        time.sleep(0.1)
    time.sleep(1)  # five retention checks
    offset = of(run(gokafka, g.bootstrap, "-topic", topic, "-at", "-2", "offset-at"), "offset-at")[0]["o"]
    assert offset == 0
    got = of(run(gokafka, g.bootstrap, "-topic", topic, "-count", "5", "consume"), "record")
    assert [r["key"] for r in got] == [f"key-{i}" for i in range(5)]


def test_read_committed_skips_aborted_transactions(gw, gokafka):
    """confluent-kafka writes commit(4), abort(3), commit(2) on one partition; Sarama with
    ReadCommitted gets the 6 committed records (the aborted ones dropped through Fetch's
    aborted_transactions, the markers skipped), ReadUncommitted all 9."""
    from confluent_kafka import Producer
    topic = new_topic(gw.bootstrap, partitions=1)
    p = Producer({"bootstrap.servers": gw.bootstrap, "transactional.id": f"tx-{topic}"})
    p.init_transactions(15)
    for outcome, keys in (("commit", ["c0", "c1", "c2", "c3"]), ("abort", ["a0", "a1", "a2"]),
                          ("commit", ["c4", "c5"])):
        p.begin_transaction()
        for k in keys:
            p.produce(topic, key=k.encode(), value=b"v-" + k.encode(), partition=0)
        p.flush(15)
        (p.commit_transaction if outcome == "commit" else p.abort_transaction)(15)
    committed = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "6", "-read-committed", "consume"),
                   "record")
    assert [r["key"] for r in committed] == ["c0", "c1", "c2", "c3", "c4", "c5"]
    # Offsets: 4 records and a marker, 3 and a marker, then 2 (the markers take offsets).
    assert [r["o"] for r in committed] == [0, 1, 2, 3, 9, 10]
    everything = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "9", "consume"), "record")
    assert [r["key"] for r in everything] == ["c0", "c1", "c2", "c3", "a0", "a1", "a2", "c4", "c5"]


def test_offsets_by_timestamp(gw, gokafka):
    """Client.GetOffset (ListOffsets v1+): the first offset at or after a time; -1 past the
    last record's time; Sarama's OffsetOldest and OffsetNewest (-2, -1)."""
    topic = new_topic(gw.bootstrap, partitions=1)
    run(gokafka, gw.bootstrap, "-topic", topic, "-count", "5", "produce")
    time.sleep(0.05)  # the second run's records get later timestamps
    run(gokafka, gw.bootstrap, "-topic", topic, "-count", "5", "-start", "5", "produce")
    records = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "10", "consume"), "record")
    first_late = records[5]["ts"]
    assert first_late > records[4]["ts"]

    def offset_at(at: int) -> int:
        return of(run(gokafka, gw.bootstrap, "-topic", topic, "-at", str(at), "offset-at"), "offset-at")[0]["o"]

    assert offset_at(records[0]["ts"]) == 0
    assert offset_at(first_late) == 5
    assert offset_at(records[-1]["ts"] + 1) == -1
    assert (offset_at(-2), offset_at(-1)) == (0, 10)


def test_delete_records_moves_where_the_oldest_offset_starts(gw, gokafka):
    topic = new_topic(gw.bootstrap, partitions=1)
    run(gokafka, gw.bootstrap, "-topic", topic, "-count", "30", "produce")
    assert of(run(gokafka, gw.bootstrap, "-topic", topic, "-offset", "10", "delete-records"),
              "records-deleted") == [{"ev": "records-deleted", "p": 0, "before": 10}]
    oldest = of(run(gokafka, gw.bootstrap, "-topic", topic, "-offset", "-2", "-count", "3", "consume"), "record")
    assert [r["o"] for r in oldest] == [10, 11, 12] and oldest[0]["key"] == "key-10"
    refused = run(gokafka, gw.bootstrap, "-topic", topic, "-offset", "5", "-count", "1", "consume")
    assert "outside the range of offsets" in of(refused, "consume-refused")[0]["error"]


def test_records_larger_than_the_fetch_size_still_arrive(gw, gokafka):
    """Sarama asks for Consumer.Fetch.Default bytes (1 KiB here) and doubles it when a
    response holds only part of a batch: the gateway must send the first batch whole."""
    topic = new_topic(gw.bootstrap, partitions=1)
    produced = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "6", "-value-bytes", "200000",
                      "-codec", "none", "produce"), "produced")
    got = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "6", "-fetch-bytes", "1024", "consume"),
             "record")
    assert [r["o"] for r in got] == [p["o"] for p in produced] == list(range(6))
    assert all(len(r["value"]) == 200000 and r["value"].startswith(f"value-{r['o']}-none-") for r in got)


# --- consumer group --------------------------------------------------------------------

@pytest.mark.parametrize("strategy, idempotent", [("range", False), ("roundrobin", True)])
def test_consumer_group_members_join_and_leave(gw, gokafka, strategy, idempotent):
    """The three phases are produced by one producer (idempotent: its sequences go on)."""
    topic = new_topic(gw.bootstrap)
    group = f"go-group-{uuid.uuid4().hex[:6]}"
    events = run(gokafka, gw.bootstrap, "-topic", topic, "-group", group, "-strategy", strategy,
                 "-count", "20", *(["-idempotent"] if idempotent else []), "group")
    produced, consumed = of(events, "produced"), of(events, "record")
    assert len(produced) == 60
    assert_records_match(produced, consumed, "none")

    # a alone holds everything; then a and b split the partitions; then b alone.
    assigned = [(e["member"], tuple(e["partitions"])) for e in of(events, "assigned")]
    everything = tuple(range(PARTITIONS))
    assert assigned[0] == ("a", everything) and assigned[-1] == ("b", everything)
    split = {tuple(p) for m, p in assigned[1:-1]}
    assert {m for m, _ in assigned[1:-1]} == {"a", "b"} and len(split) == 2
    if strategy == "range":
        assert split == {(0, 1), (2, 3)}
    else:
        assert split == {(0, 2), (1, 3)}
    # Records of phase 1 went to a, phase 3 to b; phase 2 to whoever held the partition.
    by_index = {(p["p"], p["o"]): p["index"] for p in produced}
    members = {by_index[(r["p"], r["o"])]: r["member"] for r in consumed}
    assert {members[i] for i in range(20)} == {"a"} and {members[i] for i in range(40, 60)} == {"b"}
    assert {members[i] for i in range(20, 40)} == {"a", "b"}

    # Committed offsets (OffsetFetch through the ClusterAdmin) are the partitions' ends.
    offsets = of(events, "offsets")
    assert len(offsets) == PARTITIONS and all(o["committed"] == o["end"] > 0 for o in offsets)
    assert sum(o["end"] for o in offsets) == 60
    # Both members left: ListConsumerGroups / DescribeConsumerGroups see an empty group.
    assert of(events, "group") == [{"ev": "group", "listed_type": "consumer", "state": "Empty",
                                    "protocol_type": "consumer", "members": 0, "error": 0}]


def wait_until_committed(binary: Path, bootstrap: str, topic: str, group: str, timeout: float = 30) -> None:
    """Until the group's committed offsets are the partitions' ends (Sarama commits marks
    every 100 ms here)."""
    deadline = time.monotonic() + timeout
    while True:
        offsets = of(run(binary, bootstrap, "-topic", topic, "-group", group, "committed"), "offsets")
        if all(o["committed"] == o["end"] for o in offsets):
            return
        assert time.monotonic() < deadline, f"commits did not reach the ends: {offsets}"
        time.sleep(0.1)


class Member:
    """One `member` scenario process: a group member whose JSON lines a thread collects."""

    def __init__(self, binary: Path, bootstrap: str, *args: str):
        self.events: list[dict] = []
        self.proc = subprocess.Popen([str(binary), "-brokers", bootstrap, *args, "member"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            if line.startswith("{"):
                self.events.append(json.loads(line))

    def wait_for(self, what: str, done, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.events):
            assert time.monotonic() < deadline and self.proc.poll() is None, \
                f"waited {timeout}s for {what}: {self.events[-5:]}"
            time.sleep(0.05)

    def claims(self) -> list[int] | None:
        assigned = of(self.events, "assigned")
        return assigned[-1]["partitions"] if assigned else None

    def leave(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(30) == 0, self.events[-3:]


def test_a_killed_member_is_dropped_after_its_session_timeout(gw, gokafka):
    """No LeaveGroup from a SIGKILLed member: the gateway expires it after its session
    timeout (2 s) and gives its partitions to the other member, which then reads them."""
    topic = new_topic(gw.bootstrap, partitions=2)
    group = f"go-kill-{uuid.uuid4().hex[:6]}"
    flags = ["-topic", topic, "-group", group, "-session-ms", "2000"]
    doomed = Member(gokafka, gw.bootstrap, *flags, "-member", "doomed")
    try:
        doomed.wait_for("doomed holds both partitions", lambda ev: doomed.claims() == [0, 1])
        survivor = Member(gokafka, gw.bootstrap, *flags, "-member", "survivor")
        try:
            survivor.wait_for("a split", lambda ev: survivor.claims() in ([0], [1]))
            doomed.proc.kill()
            killed_at = time.monotonic()
            survivor.wait_for("survivor holds both partitions", lambda ev: survivor.claims() == [0, 1])
            assert time.monotonic() - killed_at < 15
            produced = of(run(gokafka, gw.bootstrap, "-topic", topic, "-count", "10", "produce"), "produced")
            assert {p["p"] for p in produced} == {0, 1}
            survivor.wait_for("10 records", lambda ev: len(of(ev, "record")) >= 10)
            assert_records_match(produced, of(survivor.events, "record"), "none")
            survivor.leave()
        finally:
            survivor.proc.kill()
    finally:
        doomed.proc.kill()


def test_a_member_rides_through_a_gateway_restart(gateway_factory, gokafka):
    """The gateway stops (its connections close) and starts again on the same port and data:
    Sarama's member reconnects, rejoins, resumes from its commits and reads the new records;
    no record is lost, and the new ones get the offsets after the old."""
    g = gateway_factory()
    topic = new_topic(g.bootstrap, partitions=2)
    member = Member(gokafka, g.bootstrap, "-topic", topic, "-group", f"g-{topic}", "-member", "m")
    try:
        member.wait_for("both partitions", lambda ev: member.claims() == [0, 1])
        before = of(run(gokafka, g.bootstrap, "-topic", topic, "-count", "10", "produce"), "produced")
        member.wait_for("10 records", lambda ev: len(of(ev, "record")) >= 10)
        wait_until_committed(gokafka, g.bootstrap, topic, f"g-{topic}")
        g.stop()
        g.start()
        after = of(run(gokafka, g.bootstrap, "-topic", topic, "-count", "10", "-start", "10", "produce"),
                   "produced")
        ends = {p: sum(1 for b in before if b["p"] == p) for p in (0, 1)}
        assert all(a["o"] >= ends[a["p"]] for a in after)
        member.wait_for("the 10 new records", lambda ev: {(r["p"], r["o"]) for r in of(ev, "record")}
                        >= {(a["p"], a["o"]) for a in after})
        got = of(member.events, "record")
        assert {(r["p"], r["o"]) for r in got} == {(p["p"], p["o"]) for p in before + after}
        assert len(got) == 20, "records read again after the restart: their commits were lost"
        member.leave()
    finally:
        member.proc.kill()


# --- two gateways -----------------------------------------------------------------------

def test_two_gateways_share_the_partitions_and_the_group(gateway_factory, etcd, tmp_path, gokafka):
    """Sarama bootstrapped with one gateway finds the other in Metadata, sends each
    partition's records to its leader and the group's requests to its coordinator."""
    from cluster_fixtures import create_topic, leaders, start_cluster
    gws = start_cluster(gateway_factory, etcd, tmp_path, 2)
    topic = f"go-two-{uuid.uuid4().hex[:6]}"
    create_topic(gws[0].bootstrap, topic, PARTITIONS)
    assert set(leaders(gws[0].bootstrap, topic).values()) == {1, 2}
    produced = of(run(gokafka, gws[0].bootstrap, "-topic", topic, "-count", "40", "-idempotent",
                      "-codec", "snappy", "produce"), "produced")
    assert len({p["p"] for p in produced}) == PARTITIONS
    consumed = []
    for partition in range(PARTITIONS):
        n = sum(1 for p in produced if p["p"] == partition)
        consumed += of(run(gokafka, gws[1].bootstrap, "-topic", topic, "-partition", str(partition),
                           "-count", str(n), "consume"), "record")
    assert_records_match(produced, consumed, "snappy")

    fresh = f"go-two-{uuid.uuid4().hex[:6]}"
    create_topic(gws[0].bootstrap, fresh, PARTITIONS)
    events = run(gokafka, gws[1].bootstrap, "-topic", fresh, "-group", f"g-{fresh}", "-count", "10", "group")
    assert_records_match(of(events, "produced"), of(events, "record"), "none")
    assert all(o["committed"] == o["end"] for o in of(events, "offsets"))


# --- ClusterAdmin ----------------------------------------------------------------------

def test_cluster_admin_topic_life(gw, gokafka):
    topic = f"go-admin-{uuid.uuid4().hex[:6]}"
    events = run(gokafka, gw.bootstrap, "-topic", topic, "admin")
    assert of(events, "created") == [{"ev": "created", "topic": topic}]
    assert "already exists" in of(events, "created-again")[0]["error"]
    listed_before, listed_after = of(events, "topics")
    assert listed_before["topics"][topic] == {"partitions": 3, "replication": 1}  # before CreatePartitions
    assert topic not in listed_after["topics"]
    configs = of(events, "configs")[0]["configs"]
    assert configs["retention.ms"] == {"value": "3600000", "default": False, "read_only": False,
                                       "sensitive": False}
    assert configs["cleanup.policy"]["value"] == "delete" and not configs["cleanup.policy"]["default"]
    assert configs["segment.bytes"]["default"] is True
    assert of(events, "configs-named")[0]["names"] == ["retention.ms"]
    # AlterConfig (AlterConfigs) replaces the topic's configs: cleanup.policy is back to default.
    assert of(events, "altered")[0]["configs"] == {"retention.ms": {"value": "86400000", "default": False},
                                                   "cleanup.policy": {"value": "delete", "default": True}}
    assert of(events, "described") == [{"ev": "described", "partitions": 5, "error": 0}]  # CreatePartitions
    cluster = of(events, "cluster")[0]
    assert cluster["brokers"] == [gw.bootstrap]
    assert cluster["controller"] == -1  # Sarama 1.22 asks with Metadata v0: no controller id
    # Sarama 1.22's BrokerResource is 5, a type DescribeConfigs does not have (INVALID_REQUEST
    # with the reason); its ClusterResource is 4, Kafka's BROKER, and describes this gateway.
    assert of(events, "broker-resource-5")[0]["error"] == "resource type 5 is not supported"
    assert of(events, "broker-configs")[0]["configs"]["num.partitions"] == "1"
    assert set(of(events, "broker-configs")[0]["configs"]) == {"num.partitions", "log.retention.ms"}
    assert of(events, "deleted") == [{"ev": "deleted", "topic": topic}]
    assert "does not exist" in of(events, "deleted-again")[0]["error"]


# --- SASL over TLS ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    """A gateway with a SASL_SSL listener beside PLAINTEXT, users added with `stratalog users`."""
    pytest.importorskip("cryptography", reason="cryptography (certificates for the test) is not installed")
    from stratalog.infra import devcerts
    tmp = tmp_path_factory.mktemp("go-secure")
    certs = devcerts.make(tmp / "certs")
    data = tmp / "data"
    added = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "users", "add", USER, "--password",
                            PASSWORD, "--mechanism", "SCRAM-SHA-512", "--data-dir", str(data)],
                           capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    g = GatewayProcess(data)
    sasl_port = free_port()
    g.settings.update({"listeners": f"PLAINTEXT://{g.bootstrap},SASL_SSL://127.0.0.1:{sasl_port}",
                       "sasl.enabled.mechanisms": "SCRAM-SHA-512,PLAIN",
                       "ssl.keystore.location": str(certs.server), "ssl.truststore.location": str(certs.ca)})
    g.start()
    yield g, f"127.0.0.1:{sasl_port}", certs.ca
    g.stop()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_sasl_ssl_produce_consume_and_group(secure, gokafka, mechanism):
    g, address, ca = secure
    sasl = ["-tls-ca", str(ca), "-sasl", mechanism, "-user", USER, "-password", PASSWORD]
    topic = new_topic(g.bootstrap, partitions=2)
    events = run(gokafka, address, *sasl, "-topic", topic, "-codec", "zstd", "-count", "10", "-idempotent",
                 "produce")
    produced = of(events, "produced")
    n0 = sum(1 for p in produced if p["p"] == 0)
    read = run(gokafka, address, *sasl, "-topic", topic, "-count", str(n0), "consume")
    assert_records_match([p for p in produced if p["p"] == 0], of(read, "record"), "zstd")
    fresh = new_topic(g.bootstrap, partitions=2)  # the group scenario counts what it produces
    grouped = run(gokafka, address, *sasl, "-topic", fresh, "-group", f"g-{fresh}", "-count", "4", "group")
    assert_records_match(of(grouped, "produced"), of(grouped, "record"), "none")
    offsets = of(grouped, "offsets")
    assert len(offsets) == 2 and all(o["committed"] == o["end"] for o in offsets), offsets


def test_a_wrong_password_fails_and_writes_nothing(secure, gokafka):
    g, address, ca = secure
    topic = new_topic(g.bootstrap, partitions=1)
    for mechanism in ("SCRAM-SHA-512", "PLAIN"):
        events = run(gokafka, address, "-tls-ca", str(ca), "-sasl", mechanism, "-user", USER,
                     "-password", "wrong", "-topic", topic, "-count", "3", "produce", ok=False)
        assert events[-1]["ev"] == "error" and not of(events, "produced")
        assert "SASL" in events[-1]["error"] or "authenticat" in events[-1]["error"].lower(), events[-1]
    assert stored_codecs(g.bootstrap, topic, 0) == []  # nothing was written
