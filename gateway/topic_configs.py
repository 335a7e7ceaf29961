"""Every Kafka topic config name, and what DescribeConfigs says about each.

Kafka's brokers take every name their log config defines, deprecated ones included, and so
does a gateway. The names Stratalog applies are `config.TOPIC_CONFIGS`: each falls back to
the broker setting it names. The others (`INERT`) have nothing to act on here (there is no
local log to flush or preallocate, no follower fetching to throttle, every topic already
lives in object storage); a gateway checks their values with Kafka's types and ranges,
stores them with the topic and describes them, and their documentation says they have no
effect, so tools that set them (Terraform providers, scripts written for Kafka) keep working.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from .config import BROKER_SETTINGS, TOPIC_CONFIGS, BrokerConfig, ConfigError, parse_value, setting_type

LONG_MAX = 2**63 - 1



# ---- value checks, with the bounds Kafka's ConfigDef gives these names ----------------

def _integer(v: Any, low: int, high: int) -> int:
    if isinstance(v, bool):
        raise ValueError(f"not an integer: {v!r}")
    value = int(str(v).strip())
    if not low <= value <= high:
        raise ValueError(f"{value} is outside [{low}, {high}]")
    return value


def _long(low: int) -> Callable[[Any], int]:
    return lambda v: _integer(v, low, LONG_MAX)


def _int(low: int, high: int = 2**31 - 1) -> Callable[[Any], int]:
    return lambda v: _integer(v, low, high)


def _boolean(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s not in ("true", "false"):
        raise ValueError(f"{v!r} is not true or false")
    return s == "true"


def _ratio(v: Any) -> float:
    value = float(str(v).strip())
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{value} is outside [0, 1]")
    return value


def _gzip_level(v: Any) -> int:
    value = _integer(v, -1, 9)
    if value == 0:
        raise ValueError("0 is not -1 (the codec's default) nor in [1, 9]")
    return value


_REPLICA = re.compile(r"^\d+:\d+$")


def _throttled_replicas(v: Any) -> str:
    items = [x.strip() for x in str(v).split(",") if x.strip()]
    if items == ["*"] or all(_REPLICA.match(x) for x in items):
        return ",".join(items)
    raise ValueError(f"{v!r} is not '*' nor a list of PARTITION:BROKER")


_VERSION = re.compile(r"^\d+\.\d+(\.\d+)?(-IV\d+)?$")


def _format_version(v: Any) -> str:
    s = str(v).strip()
    if not _VERSION.match(s):
        raise ValueError(f"{s!r} is not a Kafka version such as 2.8 or 3.0-IV1")
    return s


@dataclass(frozen=True)
class Inert:
    """A topic config Kafka defines that has no effect on a gateway."""

    name: str
    kind: str              # Kafka's ConfigDef type
    default: Any           # Kafka's default
    parse: Callable[[Any], Any]
    synonym: str | None    # Kafka's broker setting it falls back to; None: there is none
    doc: str               # what it does in Kafka, then why it does nothing here


_NO_LOCAL_LOG = "No effect here: a gateway's local segment is only a cache; durability comes from the WAL commit (wal.flush.ms)."
_NO_FOLLOWERS = "No effect here: replicas read committed data from the object store, not from the leader."
_TIERED = "No effect here: every topic is in object storage already; local disk is a cache."
_NO_CLEANER = "No effect here: compaction runs when an operator starts it (stratalog compact), not by a background cleaner."
_STORED = "No effect here: batches are stored as the producer compressed them."

INERT: dict[str, Inert] = {c.name: c for c in [
    Inert("segment.jitter.ms", "LONG", 0, _long(0), "log.roll.jitter.ms",
          "Kafka: a random delay subtracted from segment.ms so segments do not all roll at once. "
          "No effect here: sealing is driven by segment.ms and segment.bytes alone."),
    Inert("segment.index.bytes", "INT", 10 * 1024 * 1024, _int(4), "log.index.size.max.bytes",
          "Kafka: the most bytes an offset index may take, preallocated. "
          "No effect here: a sealed segment's .index holds exactly its entries."),
    Inert("flush.messages", "LONG", LONG_MAX, _long(1), "log.flush.interval.messages",
          "Kafka: fsync the log after this many messages. " + _NO_LOCAL_LOG),
    Inert("flush.ms", "LONG", LONG_MAX, _long(0), "log.flush.interval.ms",
          "Kafka: fsync the log after this long. " + _NO_LOCAL_LOG),
    Inert("file.delete.delay.ms", "LONG", 60_000, _long(0), "log.segment.delete.delay.ms",
          "Kafka: how long a deleted segment's files stay on disk. "
          "No effect here: objects are deleted once the coordinator no longer references them."),
    Inert("max.compaction.lag.ms", "LONG", LONG_MAX, _long(1), "log.cleaner.max.compaction.lag.ms",
          "Kafka: the longest a record may stay uncompacted. " + _NO_CLEANER),
    Inert("min.cleanable.dirty.ratio", "DOUBLE", 0.5, _ratio, "log.cleaner.min.cleanable.ratio",
          "Kafka: the share of the log that must be dirty before the cleaner compacts it. " + _NO_CLEANER),
    Inert("unclean.leader.election.enable", "BOOLEAN", False, _boolean, "unclean.leader.election.enable",
          "Kafka: let an out-of-sync replica lead, losing data. "
          "No effect here: every gateway leads from the committed data in the object store, so every "
          "election is clean (a damaged partition is truncated only by stratalog partitions recover)."),
    Inert("min.insync.replicas", "INT", 1, _int(1), "min.insync.replicas",
          "Kafka: replicas that must hold a batch before acks=all is answered. "
          "No effect here: acks=all is answered once the batch is committed to the object store and "
          "the coordinator, whatever the replicas."),
    Inert("preallocate", "BOOLEAN", False, _boolean, "log.preallocate",
          "Kafka: create segment files at their full size. " + _NO_LOCAL_LOG),
    Inert("message.format.version", "STRING", "3.0-IV1", _format_version, "log.message.format.version",
          "Kafka (deprecated, removed in 4.0): the record format to store. "
          "No effect here: batches are always stored as produced, in record format v2."),
    Inert("message.downconversion.enable", "BOOLEAN", True, _boolean, "log.message.downconversion.enable",
          "Kafka (deprecated, removed in 4.0): convert batches for consumers of old Fetch versions. "
          "No effect here: batches are served in record format v2 only."),
    Inert("leader.replication.throttled.replicas", "LIST", "", _throttled_replicas, None,
          "Kafka: replicas whose replication the leader throttles. " + _NO_FOLLOWERS),
    Inert("follower.replication.throttled.replicas", "LIST", "", _throttled_replicas, None,
          "Kafka: replicas whose replication the follower throttles. " + _NO_FOLLOWERS),
    Inert("remote.storage.enable", "BOOLEAN", False, _boolean, None,
          "Kafka: tier this topic's segments to remote storage. " + _TIERED),
    Inert("local.retention.ms", "LONG", -2, _long(-2), "log.local.retention.ms",
          "Kafka: how long tiered segments stay on local disk (-2: retention.ms). " + _TIERED),
    Inert("local.retention.bytes", "LONG", -2, _long(-2), "log.local.retention.bytes",
          "Kafka: how many bytes of tiered segments stay on local disk (-2: retention.bytes). " + _TIERED),
    Inert("remote.log.copy.disable", "BOOLEAN", False, _boolean, None,
          "Kafka: stop copying this topic's segments to remote storage. " + _TIERED),
    Inert("remote.log.delete.on.disable", "BOOLEAN", False, _boolean, None,
          "Kafka: delete the remote copies when tiering is turned off. " + _TIERED),
    Inert("compression.gzip.level", "INT", -1, _gzip_level, "compression.gzip.level",
          "Kafka: the gzip level when the broker recompresses (compression.type=gzip). " + _STORED),
    Inert("compression.lz4.level", "INT", 9, _int(1, 17), "compression.lz4.level",
          "Kafka: the lz4 level when the broker recompresses (compression.type=lz4). " + _STORED),
    Inert("compression.zstd.level", "INT", 3, _int(-131072, 22), "compression.zstd.level",
          "Kafka: the zstd level when the broker recompresses (compression.type=zstd). " + _STORED),
]}


def is_topic_config(name: str) -> bool:
    return name in TOPIC_CONFIGS or name in INERT


def names() -> list[str]:
    return sorted([*TOPIC_CONFIGS, *INERT])


def check(name: str, raw: Any) -> Any:
    """A topic config's value parsed and range-checked; ConfigError names what is wrong."""
    inert = INERT.get(name)
    if inert is None:
        if name not in TOPIC_CONFIGS:
            raise ConfigError(f"unknown topic config {name!r}")
        return parse_value(name, raw)
    try:
        return inert.parse(raw)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"invalid value for {name}: {e}") from None


def values(config: BrokerConfig, overrides: Mapping[str, str]) -> dict[str, Any]:
    """Every topic config's value for a topic with these overrides."""
    out: dict[str, Any] = {}
    for name in names():
        inert = INERT.get(name)
        if inert is None:
            out[name] = config.topic_config(overrides, name)
        elif name in overrides:
            try:
                out[name] = inert.parse(overrides[name])
            except (ValueError, TypeError):
                out[name] = overrides[name]  # stored by a release with looser checks: shown as is
        else:
            out[name] = inert.default
    return out


def kind(name: str) -> str:
    inert = INERT.get(name)
    return inert.kind if inert is not None else setting_type(BROKER_SETTINGS[TOPIC_CONFIGS[name]].parse)


def documentation(name: str) -> str:
    inert = INERT.get(name)
    return inert.doc if inert is not None else BROKER_SETTINGS[TOPIC_CONFIGS[name]].doc
