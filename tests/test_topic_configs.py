"""Every Kafka topic config name is taken by CreateTopics, AlterConfigs and
IncrementalAlterConfigs (those that mean nothing here are stored, described and documented
as such), values are checked, and DescribeConfigs answers with sources, synonyms, types and
documentation as Kafka does."""

from __future__ import annotations

import socket
import struct
import uuid

import pytest

from stratalog.gateway import topic_configs
from stratalog.gateway.config import TOPIC_CONFIGS, ConfigError
from stratalog.gateway.protocol.frames import decode_response, encode_request

from conftest import ROOT, GatewayProcess

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import KafkaException  # noqa: E402
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,  # noqa: E402
                                   ConfigSource, NewTopic, ResourceType)

# Kafka 3.x/4.x topic configs Stratalog has nothing to apply to, with a value Kafka accepts.
INERT_VALUES = {
    "flush.messages": "1000", "flush.ms": "500", "preallocate": "true", "segment.jitter.ms": "10",
    "segment.index.bytes": "4096", "file.delete.delay.ms": "1000", "max.compaction.lag.ms": "60000",
    "min.cleanable.dirty.ratio": "0.25", "unclean.leader.election.enable": "true",
    "min.insync.replicas": "2", "message.format.version": "2.8", "message.downconversion.enable": "false",
    "leader.replication.throttled.replicas": "0:1,1:2", "follower.replication.throttled.replicas": "*",
    "remote.storage.enable": "false", "local.retention.ms": "3600000", "local.retention.bytes": "-2",
    "remote.log.copy.disable": "true", "remote.log.delete.on.disable": "false",
    "compression.gzip.level": "6", "compression.lz4.level": "10", "compression.zstd.level": "-5",
}
BAD_VALUES = [("flush.ms", "-1"), ("flush.messages", "0"), ("preallocate", "yes"),
              ("min.cleanable.dirty.ratio", "1.5"), ("min.insync.replicas", "0"),
              ("segment.index.bytes", str(2**31)), ("message.format.version", "latest"),
              ("leader.replication.throttled.replicas", "0-1"), ("local.retention.ms", "-3"),
              ("compression.gzip.level", "10"), ("compression.lz4.level", "0"),
              ("compression.zstd.level", "23"), ("unclean.leader.election.enable", "1")]


# ---- the catalogue, in process --------------------------------------------------------

@pytest.mark.unit
def test_the_catalogue_holds_every_name_the_tests_know_once():
    assert set(INERT_VALUES) == set(topic_configs.INERT)
    assert not set(TOPIC_CONFIGS) & set(topic_configs.INERT)
    for name, value in INERT_VALUES.items():
        topic_configs.check(name, value)
        assert "No effect here" in topic_configs.documentation(name), name


@pytest.mark.unit
@pytest.mark.parametrize("name, value", BAD_VALUES)
def test_a_config_without_effect_still_has_its_value_checked(name, value):
    with pytest.raises(ConfigError, match=name):
        topic_configs.check(name, value)


@pytest.mark.unit
def test_the_readme_lists_every_config_without_effect():
    readme = (ROOT / "README.md").read_text()
    for name in topic_configs.INERT:
        assert f"| `{name}` |" in readme, name


# ---- through a gateway, with real clients --------------------------------------------

@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    # log.retention.ms given by the operator: STATIC_BROKER_CONFIG in DescribeConfigs.
    g = GatewayProcess(tmp_path_factory.mktemp("configs") / "data", {"log.retention.ms": 3_600_000}).start()
    yield g
    g.stop()


def _admin(gw) -> AdminClient:
    return AdminClient({"bootstrap.servers": gw.bootstrap})


def _topic(admin: AdminClient, **configs) -> str:
    name = f"cfg-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, 1, 1, config=configs)])[name].result(15)
    return name


def _describe(admin: AdminClient, name: str) -> dict:
    """librdkafka asks DescribeConfigs v1 with include_synonyms always on."""
    resource = ConfigResource(ResourceType.TOPIC, name)
    return admin.describe_configs([resource], request_timeout=15)[resource].result(15)


def _refused(future) -> KafkaException:
    with pytest.raises(KafkaException) as refused:
        future.result(15)
    return refused.value


def test_create_topics_takes_every_kafka_topic_config_and_describes_it(gw):
    admin = _admin(gw)
    name = _topic(admin, **INERT_VALUES)
    described = _describe(admin, name)
    for key, value in INERT_VALUES.items():
        assert described[key].value == value, key
        assert described[key].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value, key
        assert not described[key].is_default
    # Every name, in effect here or not, is described, even when the topic does not set it.
    assert set(described) == set(topic_configs.names())
    assert described["segment.jitter.ms"].value == "10"
    assert described["retention.ms"].value == "3600000"


@pytest.mark.parametrize("name, value", BAD_VALUES[:5])
def test_create_topics_refuses_a_bad_value_of_a_config_without_effect(gw, name, value):
    admin = _admin(gw)
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    err = _refused(admin.create_topics([NewTopic(topic, 1, 1, config={name: value})])[topic]).args[0]
    assert err.code() == ck.KafkaError.INVALID_CONFIG
    assert name in err.str()
    assert topic not in admin.list_topics(timeout=10).topics


def test_an_unknown_config_name_is_still_refused(gw):
    admin = _admin(gw)
    topic = f"bad-{uuid.uuid4().hex[:8]}"
    err = _refused(admin.create_topics([NewTopic(topic, 1, 1, config={"flush.msgs": "1"})])[topic]).args[0]
    assert err.code() == ck.KafkaError.INVALID_CONFIG


def test_alter_configs_sets_configs_without_effect(gw):
    admin = _admin(gw)
    name = _topic(admin)
    resource = ConfigResource(ResourceType.TOPIC, name, set_config={"preallocate": "true", "flush.ms": "250",
                                                                     "retention.ms": "5000"})
    admin.alter_configs([resource], request_timeout=15)[resource].result(15)
    described = _describe(admin, name)
    assert (described["preallocate"].value, described["flush.ms"].value) == ("true", "250")
    assert described["retention.ms"].value == "5000"

    bad = ConfigResource(ResourceType.TOPIC, name, set_config={"preallocate": "maybe"})
    assert _refused(admin.alter_configs([bad], request_timeout=15)[bad]).args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert _describe(admin, name)["preallocate"].value == "true"  # nothing changed


def test_incremental_alter_configs_sets_deletes_and_appends_to_lists(gw):
    admin = _admin(gw)
    name = _topic(admin, **{"leader.replication.throttled.replicas": "0:1"})

    def alter(*entries):
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=list(entries))
        return admin.incremental_alter_configs([resource], request_timeout=15)[resource]

    alter(ConfigEntry("unclean.leader.election.enable", "true", incremental_operation=AlterConfigOpType.SET),
          ConfigEntry("leader.replication.throttled.replicas", "1:2",
                      incremental_operation=AlterConfigOpType.APPEND)).result(15)
    described = _describe(admin, name)
    assert described["unclean.leader.election.enable"].value == "true"
    assert described["leader.replication.throttled.replicas"].value == "0:1,1:2"

    # A list the topic does not set grows from the value it has (Kafka's Java AdminClient
    # relies on it: appending compact to the default cleanup.policy keeps delete; the
    # gateway writes the policy in its one sorted form).
    alter(ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND)).result(15)
    assert _describe(admin, name)["cleanup.policy"].value == "compact,delete"
    alter(ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)).result(15)
    assert _describe(admin, name)["cleanup.policy"].value == "compact"

    alter(ConfigEntry("unclean.leader.election.enable", None, incremental_operation=AlterConfigOpType.DELETE)).result(15)
    described = _describe(admin, name)
    assert described["unclean.leader.election.enable"].value == "false"
    assert described["unclean.leader.election.enable"].source == ConfigSource.DEFAULT_CONFIG.value

    err = _refused(alter(ConfigEntry("min.insync.replicas", "0", incremental_operation=AlterConfigOpType.SET))).args[0]
    assert err.code() == ck.KafkaError.INVALID_CONFIG and "min.insync.replicas" in err.str()


def test_describe_configs_gives_the_synonyms_of_each_value(gw):
    admin = _admin(gw)
    name = _topic(admin, **{"retention.ms": "60000", "flush.ms": "100"})

    described = _describe(admin, name)
    # The topic's value first, then the broker setting it falls back to (confluent-kafka keys
    # synonyms by name, so the static value and the default of log.retention.ms are one entry
    # here; the raw test below checks the whole chain).
    assert described["retention.ms"].value == "60000"
    assert described["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert list(described["retention.ms"].synonyms) == ["retention.ms", "log.retention.ms"]
    assert described["retention.ms"].synonyms["retention.ms"].value == "60000"
    static = _describe(admin, _topic(admin))["retention.ms"]
    assert (static.value, static.source) == ("3600000", ConfigSource.STATIC_BROKER_CONFIG.value)

    segment_ms = described["segment.ms"]
    assert segment_ms.source == ConfigSource.DEFAULT_CONFIG.value and segment_ms.is_default
    assert [(s.name, s.source) for s in segment_ms.synonyms.values()] == [
        ("log.roll.ms", ConfigSource.DEFAULT_CONFIG.value)]

    flush = [(s.name, s.source) for s in described["flush.ms"].synonyms.values()]
    assert flush == [("flush.ms", ConfigSource.DYNAMIC_TOPIC_CONFIG.value),
                     ("log.flush.interval.ms", ConfigSource.DEFAULT_CONFIG.value)]


# ---- DescribeConfigs version by version, with the protocol codec as the client -------

def _describe_raw(gw, version: int, topic: str, **flags):
    body = {"resources": [{"resource_type": 2, "resource_name": topic, "configuration_keys": None}], **flags}
    with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
        s.sendall(encode_request(32, version, 1, body))
        size = struct.unpack(">i", _read(s, 4))[0]
        _, response = decode_response(32, version, _read(s, size))
    [result] = response.results
    assert result.error_code == 0
    return {c.name: c for c in result.configs}


def _read(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        assert chunk, "connection closed"
        out += chunk
    return out


def test_describe_configs_types_and_documentation_by_version(gw):
    name = _topic(_admin(gw), **{"cleanup.policy": "compact", "flush.ms": "100"})

    v0 = _describe_raw(gw, 0, name)
    assert v0["cleanup.policy"].is_default is False and v0["segment.ms"].is_default is True

    v1 = _describe_raw(gw, 1, name, include_synonyms=True)
    assert [s.name for s in v1["cleanup.policy"].synonyms] == ["cleanup.policy", "log.cleanup.policy"]
    # The topic's value, the operator's broker setting, then its default: most specific first.
    assert [(s.name, s.value, s.source) for s in v1["retention.ms"].synonyms] == [
        ("log.retention.ms", "3600000", 4), ("log.retention.ms", "604800000", 5)]
    assert (v1["retention.ms"].value, v1["retention.ms"].config_source) == ("3600000", 4)

    v4 = _describe_raw(gw, 4, name, include_synonyms=False, include_documentation=True)
    types = {k: v4[k].config_type for k in ("cleanup.policy", "segment.bytes", "segment.ms", "preallocate",
                                            "compression.type", "min.cleanable.dirty.ratio")}
    # Kafka's ConfigDef types: LIST 7, INT 3, LONG 5, BOOLEAN 1, STRING 2, DOUBLE 6.
    assert types == {"cleanup.policy": 7, "segment.bytes": 3, "segment.ms": 5, "preallocate": 1,
                     "compression.type": 2, "min.cleanable.dirty.ratio": 6}
    assert "No effect here" in v4["flush.ms"].documentation
    assert v4["segment.ms"].documentation and "No effect" not in v4["segment.ms"].documentation
    assert v4["cleanup.policy"].synonyms == []

    undocumented = _describe_raw(gw, 4, name, include_synonyms=True, include_documentation=False)
    assert undocumented["flush.ms"].documentation is None
    assert [s.source for s in undocumented["flush.ms"].synonyms] == [1, 5]


def test_kafka_python_sees_sources_synonyms_and_types(gw):
    kafka_admin = pytest.importorskip("kafka.admin", reason="kafka-python is not installed")
    name = _topic(_admin(gw), **{"retention.ms": "60000", "preallocate": "true"})
    admin = kafka_admin.KafkaAdminClient(bootstrap_servers=gw.bootstrap)
    try:
        resource = kafka_admin.ConfigResource(kafka_admin.ConfigResourceType.TOPIC, name)
        every = admin.describe_configs([resource], include_synonyms=True, config_filter="all")["topic"][name]
        modified = admin.describe_configs([resource])["topic"][name]
    finally:
        admin.close()
    assert every["retention.ms"]["synonyms"] == [
        {"name": "retention.ms", "value": "60000", "source": "DYNAMIC_TOPIC_CONFIG"},
        {"name": "log.retention.ms", "value": "3600000", "source": "STATIC_BROKER_CONFIG"},
        {"name": "log.retention.ms", "value": "604800000", "source": "DEFAULT_CONFIG"}]
    assert {k: every[k]["config_type"] for k in ("retention.ms", "preallocate", "cleanup.policy", "segment.bytes")} \
        == {"retention.ms": "LONG", "preallocate": "BOOLEAN", "cleanup.policy": "LIST", "segment.bytes": "INT"}
    # kafka-python's default filter keeps what is not a default: the topic's own values.
    assert sorted(modified) == ["preallocate", "retention.ms"]
    assert modified["preallocate"]["value"] == "true"


def test_describe_configs_of_the_broker_says_what_the_operator_set(gw):
    admin = _admin(gw)
    resource = ConfigResource(ResourceType.BROKER, "1")
    described = admin.describe_configs([resource], request_timeout=15)[resource].result(15)
    retention = described["log.retention.ms"]
    assert (retention.value, retention.source, retention.is_read_only) == (
        "3600000", ConfigSource.STATIC_BROKER_CONFIG.value, True)
    assert [(s.value, s.source) for s in retention.synonyms.values()][-1] == (
        "604800000", ConfigSource.DEFAULT_CONFIG.value)
    segment = described["log.segment.bytes"]
    assert segment.source == ConfigSource.DEFAULT_CONFIG.value and segment.is_default
    password = described["ssl.key.password"]
    assert password.is_sensitive and password.value is None
