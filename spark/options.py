"""Reader options, parsed once on the driver into plain values.

Names follow Spark's Kafka source where it has the option:

    topic               the topic (required unless `assign` names it)
    assign              JSON {"<topic>": [0, 1]}: read only these partitions
    path                the object store URL (``load(URL)``): file:///dir or s3://bucket/prefix
    endpoint, region    S3 endpoint URL and region (default: the AWS configuration)
    pathStyle           true: address S3 buckets by path (MinIO, moto)
    startingOffsets     "earliest" (batch default), "latest" (stream default) or JSON
                        {"<topic>": {"<partition>": offset}} with -2 = earliest, -1 = latest
    endingOffsets       "latest" (default) or JSON as above; exclusive; batch only
    startingTimestamp   ms since the epoch, or JSON {"<topic>": {"<partition>": ms}}: start at
                        the first record whose timestamp is >= it (Kafka's offsetsForTimes)
    endingTimestamp     same form: end before the first record whose timestamp is >= it
    coordinator         etcd://host:port, or a gateway's data directory (embedded
                        coordinator, read-only): plan segments and committed WAL ranges
                        from it, up to the high watermark. Default: the embedded
                        coordinator beside a `file://<data>/objects` store when there is
                        one; `none` plans sealed segments from the manifests only
    topicId             pick one topic id when old incarnations of the topic remain
    failOnDataLoss      true (default): fail when planned data is gone (retention ran)
    maxBytesPerPartition  split larger segments into byte ranges (default 128 MiB)
    readChunkBytes      size of each ranged GET (default 8 MiB)
    maxOffsetsPerTrigger  stream: cap on records per micro-batch, spread over partitions
    includeHeaders      true (default): the headers column; false leaves it out

With a coordinator, reads reach the high watermark (sealed segments, then the committed
WAL ranges after them); from manifests alone only sealed segments are visible. Filters in queries are evaluated by Spark, not pushed down
(see `spark.planning`): these options are how a read skips partitions, segments and bytes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Mapping

from stratalog.spark.objects import StoreSpec

EARLIEST = -2
LATEST = -1

_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class OptionError(ValueError):
    """An option is missing or does not parse; the message names it."""


@dataclass(frozen=True)
class OffsetSpec:
    """Per-partition offsets (or EARLIEST/LATEST), with a default for unlisted partitions."""

    default: int
    partitions: dict[int, int] = field(default_factory=dict)

    def for_partition(self, partition: int) -> int:
        return self.partitions.get(partition, self.default)


@dataclass(frozen=True)
class TimestampSpec:
    """One timestamp (ms) for every partition, or one per listed partition."""

    every: int | None = None
    partitions: dict[int, int] = field(default_factory=dict)

    def for_partition(self, partition: int) -> int | None:
        return self.partitions.get(partition, self.every)


@dataclass(frozen=True)
class ReadOptions:
    topic: str
    store: StoreSpec
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: TimestampSpec | None
    ending_timestamp: TimestampSpec | None
    coordinator: str | None
    topic_id: str | None
    fail_on_data_loss: bool
    max_bytes_per_partition: int
    read_chunk_bytes: int
    max_offsets_per_trigger: int | None
    partitions: frozenset[int] | None = None  # `assign`: only these; None: every partition
    read_committed: bool = False  # kafka.isolation.level=read_committed
    include_headers: bool = True  # includeHeaders=false leaves the headers column out


class _Lower(dict):
    """Option lookup by name regardless of case, as Spark's options behave."""

    def __init__(self, options: Mapping[str, str]) -> None:
        super().__init__((str(k).lower(), v) for k, v in options.items())

    def get(self, name, default=None):
        return super().get(name.lower(), default)


def _bool(options: Mapping[str, str], name: str, default: bool | None) -> bool | None:
    raw = options.get(name)
    if raw is None:
        return default
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise OptionError(f"option {name} must be true or false, got {raw!r}")


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise OptionError(f"option {name} must be a whole number, got {raw!r}") from None
    if value <= 0:
        raise OptionError(f"option {name} must be positive, got {value}")
    return value


def _per_partition_json(name: str, raw: str, topic: str) -> dict[int, int]:
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option {name} is neither a keyword nor JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {topic} or not isinstance(doc[topic], dict):
        raise OptionError(f'option {name} must look like {{"{topic}": {{"0": 42}}}}, got {raw!r}')
    out = {}
    for key, value in doc[topic].items():
        if not (isinstance(key, str) and key.isdigit()) or isinstance(value, bool) or not isinstance(value, int):
            raise OptionError(f"option {name}: partition {key!r} -> {value!r} is not a partition "
                              "number with an integer")
        out[int(key)] = value
    return out


def parse_offsets(name: str, raw: str | None, topic: str, default: int) -> OffsetSpec:
    """`earliest`, `latest` or per-partition JSON (-2 earliest, -1 latest)."""
    if raw is None:
        return OffsetSpec(default)
    text = str(raw).strip()
    if text.lower() == "earliest":
        return OffsetSpec(EARLIEST)
    if text.lower() == "latest":
        return OffsetSpec(LATEST)
    partitions = _per_partition_json(name, text, topic)
    for p, value in partitions.items():
        if value < EARLIEST:
            raise OptionError(f"option {name}: offset {value} of partition {p} is below -2")
    return OffsetSpec(default, partitions)


def parse_timestamp(name: str, raw: str | None, topic: str) -> TimestampSpec | None:
    """Milliseconds since the epoch, or per-partition JSON of them."""
    if raw is None:
        return None
    text = str(raw).strip()
    if text.lstrip("-").isdigit():
        value = int(text)
        if value < 0:
            raise OptionError(f"option {name} must not be negative, got {value}")
        return TimestampSpec(every=value)
    partitions = _per_partition_json(name, text, topic)
    if any(v < 0 for v in partitions.values()):
        raise OptionError(f"option {name}: timestamps must not be negative")
    return TimestampSpec(partitions=partitions)


def parse_assign(raw: str, topic: str | None) -> tuple[str, frozenset[int]]:
    """Kafka's `assign` for one topic: (topic, partitions)."""
    try:
        doc = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OptionError(f"option assign is not JSON: {exc}") from None
    if (not isinstance(doc, dict) or len(doc) != 1 or not isinstance(next(iter(doc.values())), list)
            or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0
                       for p in next(iter(doc.values())))):
        raise OptionError(f'option assign must look like {{"<topic>": [0, 1]}} for one topic, got {raw!r}')
    (name, partitions), = doc.items()
    if topic and name != topic:
        raise OptionError(f"option assign names topic {name!r} but option topic is {topic!r}")
    return name, frozenset(partitions)


def parse_options(options: Mapping[str, str], *, streaming: bool = False) -> ReadOptions:
    """Check and convert the options of one read; OptionError names the bad one.

    Examples
    --------
    >>> opts = parse_options({"topic": "t", "path": "file:///tmp/objects"})
    >>> opts.starting.default, opts.ending.default
    (-2, -1)
    """
    # Spark hands options in a case-insensitive dict whose keys come out lowercased.
    options = _Lower(options)
    topic = options.get("topic")
    partitions = None
    if options.get("assign") is not None:
        topic, partitions = parse_assign(str(options.get("assign")), topic)
    if not topic:
        raise OptionError('option topic is required: .option("topic", "<name>")')
    url = options.get("path")
    if not url:
        raise OptionError("no object store URL: .load(\"s3://bucket/prefix\") or .load(\"file:///dir\")")
    try:
        store = StoreSpec(url, endpoint=options.get("endpoint") or None,
                          region=options.get("region") or None,
                          path_style=_bool(options, "pathStyle", None))
    except ValueError as exc:
        raise OptionError(str(exc)) from None
    starting = parse_offsets("startingOffsets", options.get("startingOffsets"), topic,
                             LATEST if streaming else EARLIEST)
    ending = parse_offsets("endingOffsets", options.get("endingOffsets"), topic, LATEST)
    if streaming and options.get("endingOffsets") is not None:
        raise OptionError("option endingOffsets is for batch reads only")
    if not streaming and (starting.default == LATEST or LATEST in starting.partitions.values()):
        raise OptionError("startingOffsets latest is for streams; a batch read would be empty")
    if EARLIEST in ending.partitions.values() or ending.default == EARLIEST:
        raise OptionError("endingOffsets earliest would read nothing")
    return ReadOptions(
        topic=topic,
        store=store,
        starting=starting,
        ending=ending,
        starting_timestamp=parse_timestamp("startingTimestamp", options.get("startingTimestamp"), topic),
        ending_timestamp=parse_timestamp("endingTimestamp", options.get("endingTimestamp"), topic),
        coordinator=_coordinator(options.get("coordinator"), store),
        topic_id=options.get("topicId") or None,
        fail_on_data_loss=_bool(options, "failOnDataLoss", True),
        max_bytes_per_partition=_positive(options, "maxBytesPerPartition", 128 << 20),
        read_chunk_bytes=_positive(options, "readChunkBytes", 8 << 20),
        max_offsets_per_trigger=_positive(options, "maxOffsetsPerTrigger", None),
        partitions=partitions,
        read_committed=_isolation(options),
        include_headers=include_headers(options),
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """The includeHeaders option. Spark's Kafka source leaves headers out unless asked;
    this source has always had the column, so it stays unless turned off."""
    return bool(_bool(_Lower(options), "includeHeaders", True))


def _coordinator(value, store: StoreSpec) -> str | None:
    """Where committed WAL ranges and segments are planned from: the named coordinator,
    the embedded one beside a `stratalog serve` data directory's objects, or none (`none`:
    sealed segments from the manifests only)."""
    from stratalog.spark.metadata import check_coordinator, embedded_beside

    if value is None or value == "":
        return embedded_beside(store.url)
    if str(value).lower() == "none":
        return None
    try:
        return check_coordinator(str(value))
    except ValueError as exc:
        raise OptionError(f"option coordinator: {exc}") from None


ISOLATION_LEVELS = ("read_uncommitted", "read_committed")


def _isolation(options: Mapping[str, str]) -> bool:
    """kafka.isolation.level, named and defaulted as Spark's Kafka source does."""
    level = str(options.get("kafka.isolation.level") or "read_uncommitted").lower()
    if level not in ISOLATION_LEVELS:
        raise OptionError(f"option kafka.isolation.level must be one of {', '.join(ISOLATION_LEVELS)}, "
                          f"not {level!r}")
    return level == "read_committed"
