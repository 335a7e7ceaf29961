"""Gateway settings: Kafka's names wherever Kafka has the setting.

Sources, later wins: the defaults below, a TOML file, `STRATALOG_*` environment variables
(`STRATALOG_WAL_FLUSH_MS=50` sets `wal.flush.ms`), then command-line flags. Topic configs
are resolved per topic: the topic's override, else the broker default it inherits from.
"""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping


class ConfigError(ValueError):
    """A setting is unknown or its value does not parse."""


def _bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("true", "1", "yes", "on"):
        return True
    if s in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _int(v: Any) -> int:
    """A Kafka LONG: a 64-bit integer."""
    if isinstance(v, bool):
        raise ValueError(f"not an integer: {v!r}")
    value = int(str(v).strip())
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} is outside the range of a 64-bit integer")
    return value


def _int32(v: Any) -> int:
    """A Kafka INT: a 32-bit integer, as its ConfigDef types the setting."""
    value = _int(v)
    if not -(2**31) <= value < 2**31:
        raise ValueError(f"{value} is above the largest value of this setting, {2**31 - 1}")
    return value


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(v: Any) -> str:
        s = str(v).strip()
        if s not in allowed:
            raise ValueError(f"{s!r} is not one of {', '.join(allowed)}")
        return s
    return parse


def _str(v: Any) -> str:
    return str(v).strip()


def _assignors(v: Any) -> str:
    from stratalog.gateway.groups.assignors import assignor_names
    return ",".join(assignor_names(str(v)))


def _authorizer(v: Any) -> str:
    s = str(v).strip()
    known = ("org.apache.kafka.metadata.authorizer.StandardAuthorizer", "kafka.security.authorizer.AclAuthorizer")
    if s and s not in known:
        raise ValueError(f"{s!r}: use {known[0]} (ACLs on) or leave it empty (off)")
    return s


def _mechanisms(v: Any) -> str:
    names = [m.strip().upper() for m in str(v).split(",") if m.strip()]
    known = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
    if not names or any(m not in known for m in names):
        raise ValueError(f"{v!r}: mechanisms are one or more of {', '.join(known)}")
    return ",".join(names)


def _policy(v: Any) -> str:
    parts = sorted({p.strip() for p in str(v).split(",") if p.strip()})
    if not parts or any(p not in ("delete", "compact") for p in parts):
        raise ValueError(f"{v!r} is not delete, compact or both")
    return ",".join(parts)


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    parse: Callable[[Any], Any]
    doc: str
    minimum: int | None = None
    sensitive: bool = False  # a secret: DescribeConfigs answers no value, logs never show it


def setting_type(parse: Callable[[Any], Any]) -> str:
    """Kafka's ConfigDef type of a setting parsed by `parse`, as DescribeConfigs names it."""
    if parse is _bool:
        return "BOOLEAN"
    if parse is _int32:
        return "INT"
    if parse is _int:
        return "LONG"
    if parse is _policy:
        return "LIST"
    return "STRING"


def _s(name, default, parse, doc, minimum=None, sensitive=False) -> Setting:
    return Setting(name, default, parse, doc, minimum, sensitive)


MiB = 1024 * 1024
# wal.collection.interval.ms on the embedded coordinator. A pass's work on the event loop
# (the obsolete search, the deletions' transactions, the log index read again after them)
# grows with the WAL objects written since the last; at the 60 s retention check a pass
# over a minute of group-commit flushes held acks=all produce for a few hundred ms.
EMBEDDED_WAL_COLLECTION_MS = 5_000

BROKER_SETTINGS: dict[str, Setting] = {s.name: s for s in [
    _s("broker.id", -1, _int32, "This gateway's node id; -1 picks one (embedded: 1)."),
    _s("broker.session.timeout.ms", 6000, _int32, "Lease of a gateway's registration: after this long without renewal its partitions move.", 1000),
    _s("replica.lag.time.max.ms", 30_000, _int, "A replica that has not caught up for this long leaves the ISR.", 1),
    _s("num.partitions", 1, _int32, "Partitions of an auto-created topic.", 1),
    _s("default.replication.factor", 1, _int32, "Replication factor of an auto-created topic.", 1),
    _s("auto.create.topics.enable", True, _bool, "Create a topic when a client asks for its metadata or produces to it."),
    _s("auto.leader.rebalance.enable", True, _bool, "The controller gives a partition with assigned replicas back to its preferred replica once that one is alive again; false: only ElectLeaders does."),
    _s("max.partitions", 2**31 - 1, _int32, "Partitions the whole cluster may hold (KIP-578's name); a creation past it is refused with POLICY_VIOLATION.", 1),
    _s("message.max.bytes", 1048588, _int32, "Largest record batch a topic accepts (topic: max.message.bytes).", 0),
    _s("socket.request.max.bytes", 100 * MiB, _int32, "Largest request frame; larger frames close the connection.", 1),
    _s("queued.max.request.bytes", 256 * MiB, _int, "Bytes of requests being read or handled across all connections; past it the gateway stops reading sockets until requests finish (-1: no bound; Kafka's default).", -1),
    _s("request.read.timeout.ms", 30_000, _int32, "A request frame must arrive whole within this long of its size; a stalled one closes its connection.", 1),
    _s("max.connections", 2**31 - 1, _int32, "Connections a gateway accepts over all its listeners; more are closed at once.", 0),
    _s("max.connections.per.ip", 2**31 - 1, _int32, "Connections a gateway accepts from one IP address.", 0),
    _s("max.connections.per.ip.overrides", "", _str, "host:count,... : max.connections.per.ip for these addresses."),
    _s("max.connection.creation.rate", 2**31 - 1, _int32, "New connections a gateway accepts per second.", 0),
    _s("connections.max.idle.ms", 600_000, _int, "Close a connection that sent nothing and awaits nothing for this long.", 1),
    _s("fetch.max.bytes", 55 * MiB, _int32, "Most bytes one Fetch response holds, whatever its max_bytes asks (at least one batch is always returned).", 1024),
    _s("log.segment.bytes", 64 * MiB, _int32, "Seal the active segment at this size (topic: segment.bytes).", 14),
    _s("log.roll.ms", 600_000, _int, "Seal the active segment this long after its first record (topic: segment.ms).", 1),
    _s("log.retention.ms", 604_800_000, _int, "Delete sealed segments older than this; -1 keeps forever (topic: retention.ms).", -1),
    _s("log.retention.bytes", -1, _int, "Delete the oldest segments past this size per partition; -1 no limit (topic: retention.bytes).", -1),
    _s("log.retention.check.interval.ms", 60_000, _int, "How often retention, segment and uncommitted WAL object collection run.", 1),
    _s("wal.collection.interval.ms", -1, _int, f"How often WAL objects whose data is all sealed, deleted or below the log start are deleted; -1: {EMBEDDED_WAL_COLLECTION_MS} with the embedded coordinator (a pass's work, on the gateway's event loop, grows with the objects since the last), log.retention.check.interval.ms with etcd (a pass that deletes makes every gateway read the log index again).", -1),
    _s("coordinator.snapshot.interval.ms", 300_000, _int, "The controller writes a snapshot of the coordinator (topics, configs, group offsets, ACLs, users, producer ids) to the object store this often, for `stratalog recover --from-bucket`; 0: never.", 0),
    _s("coordinator.snapshot.retain", 3, _int32, "Coordinator snapshots kept in the object store (the oldest past it are deleted).", 1),
    _s("log.index.interval.bytes", 4096, _int32, "Bytes between sparse index entries (topic: index.interval.bytes).", 0),
    _s("log.cleanup.policy", "delete", _policy, "delete, compact or both (topic: cleanup.policy)."),
    _s("log.message.timestamp.type", "CreateTime", _choice("CreateTime", "LogAppendTime"), "Topic: message.timestamp.type."),
    _s("log.cleaner.delete.retention.ms", 86_400_000, _int, "How long tombstones survive compaction (topic: delete.retention.ms).", 0),
    _s("log.cleaner.min.compaction.lag.ms", 0, _int, "Records younger than this are never compacted (topic: min.compaction.lag.ms).", 0),
    _s("log.message.timestamp.difference.max.ms", 2**63 - 1, _int, "Deprecated by Kafka 3.6 for the two below, which fall back to it while at their defaults (topic: message.timestamp.difference.max.ms).", 0),
    _s("log.message.timestamp.before.max.ms", 2**63 - 1, _int, "A CreateTime record older than this (against the gateway's clock) refuses its batch with INVALID_TIMESTAMP (topic: message.timestamp.before.max.ms).", 0),
    _s("log.message.timestamp.after.max.ms", 2**63 - 1, _int, "A CreateTime record further in the future than this refuses its batch with INVALID_TIMESTAMP (topic: message.timestamp.after.max.ms). Kafka 4.0 made it 3600000; unbounded here, as in Kafka 3.x, so producers whose clocks run ahead keep working.", 0),
    _s("compression.type", "producer", _choice("producer", "uncompressed", "gzip", "snappy", "lz4", "zstd"), "Topic: compression.type (stored as produced)."),
    _s("listeners", "", _str, "Listeners as NAME://HOST:PORT, comma-separated (empty: one PLAINTEXT listener on --listen)."),
    _s("advertised.listeners", "", _str, "Where clients reach each listener, NAME://HOST:PORT (empty: --advertised for the first, else the bound address)."),
    _s("listener.security.protocol.map", "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL", _str, "Security protocol of each listener name."),
    _s("sasl.enabled.mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512", _mechanisms, "SASL mechanisms offered on SASL listeners."),
    _s("authorizer.class.name", "", _authorizer, "Turns ACLs on: org.apache.kafka.metadata.authorizer.StandardAuthorizer (or kafka.security.authorizer.AclAuthorizer); empty: every client may do everything."),
    _s("super.users", "", _str, "Principals that pass every ACL check, separated by ';' (User:admin;User:ops)."),
    _s("allow.everyone.if.no.acl.found", False, _bool, "With ACLs on, allow what no ACL names a resource for."),
    _s("http.admin.token.file", "", _str, "File holding the bearer token the HTTP admin API requires; empty: the admin API answers loopback clients only."),
    _s("connections.max.reauth.ms", 0, _int, "SASL sessions last at most this long: clients re-authenticate (KIP-368) or are disconnected; 0: no limit (OAUTHBEARER sessions still end with their token).", 0),
    _s("sasl.oauthbearer.jwks.endpoint.url", "", _str, "JWKS (file:// or https://) whose keys sign OAUTHBEARER tokens; needed when OAUTHBEARER is enabled."),
    _s("sasl.oauthbearer.jwks.endpoint.refresh.ms", 3_600_000, _int, "How often the JWKS is read again.", 1000),
    _s("sasl.oauthbearer.expected.issuer", "", _str, "The iss every token must have (empty: not checked)."),
    _s("sasl.oauthbearer.expected.audience", "", _str, "Audiences, comma-separated, one of which every token's aud must name (empty: not checked)."),
    _s("sasl.oauthbearer.sub.claim.name", "sub", _str, "The claim that names the principal."),
    _s("sasl.oauthbearer.clock.skew.seconds", 30, _int32, "Clock skew allowed when checking exp and nbf.", 0),
    _s("etcd.ssl.ca.location", "", _str, "PEM CA bundle of an etcd served over TLS (etcd:// coordinators)."),
    _s("etcd.ssl.certificate.location", "", _str, "Client certificate for etcd's --client-cert-auth."),
    _s("etcd.ssl.key.location", "", _str, "Key of etcd.ssl.certificate.location."),
    _s("etcd.username", "", _str, "etcd user, when etcd has authentication on."),
    _s("etcd.password.file", "", _str, "File holding the etcd user's password."),
    _s("ssl.keystore.location", "", _str, "PEM file with the private key and certificate chain of TLS listeners."),
    _s("ssl.key.password", "", _str, "Password of the private key in ssl.keystore.location, if it is encrypted.", sensitive=True),
    _s("ssl.truststore.location", "", _str, "PEM bundle of the CAs client certificates must chain to."),
    _s("ssl.client.auth", "none", _choice("none", "requested", "required"), "Client certificates on TLS listeners (mTLS)."),
    _s("ssl.principal.mapping.rules", "DEFAULT", _str, "RULE:pattern/replacement/[LU],...,DEFAULT: a client certificate's subject to a user name."),
    _s("wal.flush.ms", -1, _int32, "Least time between the starts of two WAL flushes (a flush starts once the previous one is done and batches wait); -1: 200 for s3://, 0 for file:// (group commit, one fsync after another).", -1),
    _s("wal.flush.bytes", 8 * MiB, _int32, "Flush the WAL buffer once it holds this many bytes.", 1),
    _s("wal.fault.timeout.ms", 5_000, _int32, "A WAL flush failing this long (no space, no permission, the store or coordinator down) fails storage: produce is answered KAFKA_STORAGE_ERROR (producers waiting: REQUEST_TIMED_OUT) and /readyz says why, until a flush succeeds (or is fenced: the coordinator answered).", 1),
    _s("shutdown.timeout.ms", 30_000, _int32, "SIGTERM ends the gateway within this long: what is still running then (a WAL flush against a failing store, a recovery, a partition creation) is abandoned and logged.", 1),
    _s("s3.connect.timeout.ms", 10_000, _int32, "S3 connection timeout per attempt.", 1),
    _s("s3.read.timeout.ms", 60_000, _int32, "S3 response timeout per attempt; a stalled request is retried after it.", 1),
    _s("s3.max.attempts", 6, _int32, "Attempts per S3 request (jittered backoff between them) before an operation fails and is retried by its caller.", 1),
    _s("quota.window.num", 11, _int32, "Windows a client quota's rate is measured over (the newest one filling).", 1),
    _s("quota.window.size.seconds", 1, _int32, "Length of each client quota window.", 1),
    _s("controller.quota.window.num", 11, _int32, "Windows of controller_mutation_rate: a client may create or delete rate x windows x size partitions in one burst (KIP-599).", 1),
    _s("controller.quota.window.size.seconds", 1, _int32, "Length of each controller_mutation_rate window.", 1),
    _s("telemetry.max.bytes", MiB, _int32, "Largest PushTelemetry payload a client may send (KIP-714); larger pushes are refused TELEMETRY_TOO_LARGE.", 1),
    _s("client.metrics.metrics", "*", _str, "The client metrics subscription every client gets (KIP-714; Kafka's CLIENT_METRICS `metrics`): metric name prefixes, comma-separated; * all, empty none (clients then push nothing)."),
    _s("client.metrics.interval.ms", 300_000, _int32, "How often subscribed clients push their metrics (Kafka's CLIENT_METRICS `interval.ms`); a push sooner than 0.9 times this after the previous one is refused THROTTLING_QUOTA_EXCEEDED.", 100),
    _s("client.metrics.max.instances", 10_000, _int32, "Client instances whose telemetry a gateway keeps; past it the least recently heard from is forgotten.", 1),
    _s("client.metrics.max.series", 20_000, _int32, "Pushed metric series a gateway keeps over all clients (each is one /metrics line of at most about 3 KB in memory); new series past it are dropped and counted.", 1),
    _s("client.metrics.max.series.per.instance", 500, _int32, "Pushed metric series kept of one client instance.", 1),
    _s("client.metrics.instance.expiry.ms", 900_000, _int, "Forget a client instance, and its pushed metrics, after this long without a request from it.", 1),
    _s("group.initial.rebalance.delay.ms", 3000, _int32, "Wait for more members before the first rebalance of an empty group.", 0),
    _s("group.min.session.timeout.ms", 6000, _int32, "Smallest session timeout a consumer may ask for.", 1),
    _s("group.max.session.timeout.ms", 1_800_000, _int32, "Largest session timeout a consumer may ask for.", 1),
    _s("group.consumer.session.timeout.ms", 45_000, _int32, "Consumer-protocol groups (group.protocol=consumer): a member that sends no heartbeat for this long is removed and its partitions reassigned.", 1),
    _s("group.consumer.heartbeat.interval.ms", 5_000, _int32, "Consumer-protocol groups: how often members are told to heartbeat.", 1),
    _s("group.consumer.assignors", "uniform,range", _assignors, "Consumer-protocol groups: the server-side assignors members may name with group.remote.assignor (uniform, range, or Kafka's class names); the first is the default."),
    _s("group.consumer.max.size", 2**31 - 1, _int32, "Consumer-protocol groups: most members of one group.", 1),
    _s("remote.cache.bytes", -1, _int, "Disk cache for sealed-segment reads; 0 reads straight from the object store; -1: 1 GiB for s3://, none for file:// (already local disk).", -1),
    _s("remote.log.manager.copier.thread.pool.size", 4, _int32, "Sealed segments uploaded at once; each holds at most a multipart part or two in memory.", 1),
    _s("producer.id.expiration.ms", 86_400_000, _int, "Forget an idle idempotent producer after this long.", 1),
    _s("offsets.retention.minutes", 10_080, _int32, "Delete a group with no members and no offset committed for this long, with its offsets (Kafka's rule, KIP-211).", 1),
    _s("offsets.retention.check.interval.ms", 600_000, _int, "How often a coordinator looks for groups past offsets.retention.minutes.", 1),
    _s("transaction.max.timeout.ms", 900_000, _int32, "Largest transaction.timeout.ms a transactional producer may ask for.", 1),
    _s("transaction.abort.timed.out.transaction.cleanup.interval.ms", 10_000, _int32, "How often a coordinator looks for transactions open past their timeout, and aborts them.", 1),
    _s("transactional.id.expiration.ms", 604_800_000, _int32, "Forget a transactional id (its state, producer id and epoch) when no transaction of it was open and nothing changed it for this long; its next InitProducerId starts afresh.", 1),
    _s("transaction.remove.expired.transaction.cleanup.interval.ms", 3_600_000, _int32, "How often a coordinator looks for transactional ids past transactional.id.expiration.ms, and forgets them.", 1),
]}

# topic config -> the broker setting that gives its default
TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "log.cleanup.policy",
    "compression.type": "compression.type",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "index.interval.bytes": "log.index.interval.bytes",
    "max.message.bytes": "message.max.bytes",
    "message.timestamp.after.max.ms": "log.message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms": "log.message.timestamp.before.max.ms",
    "message.timestamp.difference.max.ms": "log.message.timestamp.difference.max.ms",
    "message.timestamp.type": "log.message.timestamp.type",
    "min.compaction.lag.ms": "log.cleaner.min.compaction.lag.ms",
    "retention.bytes": "log.retention.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
}

ENV_PREFIX = "STRATALOG_"


def parse_value(name: str, raw: Any, *, stored: bool = False) -> Any:
    """Parse one broker setting or topic config; ConfigError with a clear reason.

    `stored`: a topic config already in the coordinator. It was accepted when it was set,
    by this release or an older one with looser bounds (before 32-bit settings were
    bounded, segment.bytes=99999999999999 was taken), so only its type is checked: a topic
    keeps working through an upgrade.
    """
    key = TOPIC_CONFIGS.get(name, name)
    setting = BROKER_SETTINGS.get(key)
    if setting is None:
        raise ConfigError(f"unknown setting {name!r}")
    parse = _int if stored and setting.parse is _int32 else setting.parse
    try:
        value = parse(raw)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid value for {name}: {e}") from None
    if setting.minimum is not None and isinstance(value, int) and value < setting.minimum:
        raise ConfigError(f"invalid value for {name}: {value} is below {setting.minimum}")
    return value


class BrokerConfig:
    """Resolved broker settings; `cfg["wal.flush.ms"]`."""

    def __init__(self, values: Mapping[str, Any] | None = None):
        self._values = {k: s.default for k, s in BROKER_SETTINGS.items()}
        # Set by the operator (file, environment or flag), even to its default value:
        # DescribeConfigs reports these as STATIC_BROKER_CONFIG, as Kafka does.
        self.given = frozenset(values or ())
        for k, v in (values or {}).items():
            self._values[k] = parse_value(k, v)

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def items(self):
        return self._values.items()

    def topic_config(self, overrides: Mapping[str, str], name: str) -> Any:
        """A topic config's effective value: the topic's override, else the broker default."""
        if name in overrides:
            return parse_value(name, overrides[name], stored=True)
        return self._values[TOPIC_CONFIGS[name]]

    def topic_defaults(self) -> dict[str, Any]:
        return {t: self._values[b] for t, b in TOPIC_CONFIGS.items()}


def load_settings(config_file: Path | None = None, env: Mapping[str, str] | None = None,
                  flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Merge the TOML file, the environment and flags into raw settings (later wins)."""
    merged: dict[str, Any] = {}
    if config_file is not None:
        try:
            data = tomllib.loads(Path(config_file).read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {config_file} does not exist") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"config file {config_file} is not valid TOML: {e}") from None
        merged.update(_flatten(data))
    env = os.environ if env is None else env
    names = {k.upper().replace(".", "_"): k for k in BROKER_SETTINGS}
    for var, raw in env.items():
        if var.startswith(ENV_PREFIX):
            key = names.get(var[len(ENV_PREFIX):])
            if key is not None:
                merged[key] = raw
    merged.update(flags or {})
    for k in list(merged):
        if k not in BROKER_SETTINGS:
            raise ConfigError(f"unknown setting {k!r}")
    return merged


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """TOML may nest (`[wal] flush.ms = 5`) or quote dotted keys; both name `wal.flush.ms`."""
    out: dict[str, Any] = {}
    for k, v in data.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, name + "."))
        else:
            out[name] = v
    return out
