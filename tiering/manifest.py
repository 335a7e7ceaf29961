"""The partition manifest: an Avro snapshot of one partition's committed segments.

Spark and disaster recovery read it to plan without the coordinator, which stays the
source of truth. Each snapshot is an Avro object container file (null codec) holding
exactly one record of this schema:

    record io.stratalog.manifest.PartitionManifest
      topic             string
      topic_id          string (logicalType uuid)
      partition         int
      version           long     snapshots of a partition are numbered upwards
      log_start_offset  long     first offset still readable (may lie inside segments[0])
      segments          array of record io.stratalog.manifest.Segment
        base_offset     long
        last_offset     long
        key_base        string   object key without extension (see tiering.layout)
        size            long     bytes of the .log object
        min_timestamp   long
        max_timestamp   long
        leader_epoch    int
        aborted_txns    int      format 2: transactions aborted by markers in the
                                 segment, listed in its .txnindex (format 1: none)
        open_txn_offset long     format 2: first offset of the oldest transaction still
                                 open where the segment ends, -1 if none (format 1: -1)

Segments are sorted by base offset and do not overlap. The file's metadata carries
`stratalog.manifest.format` (the format in decimal: "2" when some segment has
transaction fields to record, else "1", so readers of format 1 keep reading topics
without transactions) and `stratalog.crc32c`: the CRC-32C (decimal) of the
record's Avro binary encoding, so a flipped bit that still decodes is caught too. The
sync marker is derived from the partition and version, so equal input gives equal bytes.
A reader checks the format first and refuses one outside OLDEST_READABLE_VERSION..
FORMAT_VERSION with UnsupportedFormat (a file without it is not a manifest).
"""

from __future__ import annotations

import hashlib
import io
import uuid
from dataclasses import dataclass, field
from typing import Any

import crc32c
import fastavro

from stratalog.tiering.errors import CorruptObject, UnsupportedFormat, unsupported_version

FORMAT_VERSION = 2  # the newest written; readers take OLDEST_READABLE_VERSION..FORMAT_VERSION
OLDEST_READABLE_VERSION = 1
_META_FORMAT = "stratalog.manifest.format"
_META_CRC = "stratalog.crc32c"
NAMESPACE = "io.stratalog.manifest"

_SEGMENT_FIELDS_V1: list[dict[str, Any]] = [
    {"name": "base_offset", "type": "long"},
    {"name": "last_offset", "type": "long"},
    {"name": "key_base", "type": "string"},
    {"name": "size", "type": "long"},
    {"name": "min_timestamp", "type": "long"},
    {"name": "max_timestamp", "type": "long"},
    {"name": "leader_epoch", "type": "int"},
]
_TXN_FIELDS: list[dict[str, Any]] = [{"name": "aborted_txns", "type": "int", "default": 0},
                                     {"name": "open_txn_offset", "type": "long", "default": -1}]


def _manifest_schema(segment_fields: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "type": "record",
        "name": "PartitionManifest",
        "namespace": NAMESPACE,
        "doc": "Committed segments of one partition, as of one snapshot version.",
        "fields": [
            {"name": "topic", "type": "string"},
            {"name": "topic_id", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "partition", "type": "int"},
            {"name": "version", "type": "long"},
            {"name": "log_start_offset", "type": "long"},
            {"name": "segments",
             "type": {"type": "array", "items": {"type": "record", "name": "Segment", "fields": segment_fields}}},
        ],
    }


SCHEMA = _manifest_schema(_SEGMENT_FIELDS_V1 + _TXN_FIELDS)
_PARSED = fastavro.parse_schema(SCHEMA)
_PARSED_V1 = fastavro.parse_schema(_manifest_schema(_SEGMENT_FIELDS_V1))  # format 1: no transaction fields
_FULL_NAME = f"{NAMESPACE}.PartitionManifest"

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class SegmentRecord:
    base_offset: int
    last_offset: int
    key_base: str
    size: int
    min_timestamp: int
    max_timestamp: int
    leader_epoch: int
    aborted_txns: int = 0
    open_txn_offset: int = -1

    @property
    def has_txn_fields(self) -> bool:
        return self.aborted_txns != 0 or self.open_txn_offset != -1


@dataclass(frozen=True)
class Manifest:
    topic: str
    topic_id: uuid.UUID
    partition: int
    version: int
    log_start_offset: int
    segments: list[SegmentRecord] = field(default_factory=list)


def _segments_problem(segments: list[SegmentRecord]) -> str | None:
    previous: SegmentRecord | None = None
    for s in segments:
        if not 0 <= s.base_offset <= s.last_offset <= _INT64_MAX:
            return f"segment {s.key_base!r} has offsets {s.base_offset}..{s.last_offset}"
        if not 0 <= s.size <= _INT64_MAX or not 0 <= s.leader_epoch <= 2**31 - 1:
            return f"segment {s.key_base!r} has size {s.size}, leader epoch {s.leader_epoch}"
        if not (_INT64_MIN <= s.min_timestamp <= _INT64_MAX and _INT64_MIN <= s.max_timestamp <= _INT64_MAX):
            return f"segment {s.key_base!r} has timestamps out of range"
        if not s.key_base:
            return "segment with an empty key base"
        if previous is not None and s.base_offset <= previous.last_offset:
            return (f"segment at {s.base_offset} overlaps or precedes the one ending at "
                    f"{previous.last_offset}")
        previous = s
    return None


def _record(m: Manifest) -> dict:
    return {
        "topic": m.topic,
        "topic_id": m.topic_id,
        "partition": m.partition,
        "version": m.version,
        "log_start_offset": m.log_start_offset,
        "segments": [
            {
                "base_offset": s.base_offset,
                "last_offset": s.last_offset,
                "key_base": s.key_base,
                "size": s.size,
                "min_timestamp": s.min_timestamp,
                "max_timestamp": s.max_timestamp,
                "leader_epoch": s.leader_epoch,
                **({"aborted_txns": s.aborted_txns, "open_txn_offset": s.open_txn_offset}
                   if _format_of(m) >= 2 else {}),
            }
            for s in m.segments
        ],
    }


def _format_of(m: Manifest) -> int:
    return 2 if any(s.has_txn_fields for s in m.segments) else 1


def _schema(version: int):
    return _PARSED if version >= 2 else _PARSED_V1


def encode_record(manifest: Manifest) -> bytes:
    """The Avro binary encoding of the manifest's record (what the CRC covers)."""
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, _schema(_format_of(manifest)), _record(manifest))
    return buf.getvalue()


def write_manifest(
    topic: str,
    topic_id: uuid.UUID,
    partition: int,
    version: int,
    log_start_offset: int,
    segments: list[SegmentRecord],
) -> bytes:
    """One manifest snapshot as an Avro object container file."""
    if not isinstance(topic_id, uuid.UUID):
        raise ValueError(f"topic_id must be a uuid.UUID, got {type(topic_id).__name__}")
    if not topic:
        raise ValueError("empty topic name")
    if not 0 <= partition <= 2**31 - 1:
        raise ValueError(f"partition out of range: {partition}")
    if not 0 <= version <= _INT64_MAX or not 0 <= log_start_offset <= _INT64_MAX:
        raise ValueError(f"bad version {version} or log start offset {log_start_offset}")
    problem = _segments_problem(segments)
    if problem:
        raise ValueError(problem)
    manifest = Manifest(topic, topic_id, partition, version, log_start_offset, list(segments))
    crc = crc32c.crc32c(encode_record(manifest))
    sync = hashlib.blake2b(f"{topic_id}/{partition}/{version}".encode(), digest_size=16).digest()
    buf = io.BytesIO()
    fastavro.writer(
        buf,
        _schema(_format_of(manifest)),
        [_record(manifest)],
        codec="null",
        sync_marker=sync,
        metadata={_META_FORMAT: str(_format_of(manifest)), _META_CRC: str(crc)},
    )
    return buf.getvalue()


def read_manifest(data: bytes | bytearray | memoryview, key: str | None = None) -> Manifest:
    """Parse and check one manifest snapshot; CorruptObject if it is not a valid one,
    UnsupportedFormat if it is one of a format this code does not read. `key` only names
    the object in errors."""
    try:
        reader = fastavro.reader(io.BytesIO(bytes(data)))
        records: list[Any] = list(reader)  # each a dict shaped by the schema
        schema_name = reader.writer_schema.get("name") if isinstance(reader.writer_schema, dict) else None
        metadata = reader.metadata
    except Exception as exc:  # fastavro raises many types on garbage; all mean the same here
        raise CorruptObject(f"manifest is not a readable Avro file: {exc}") from exc
    if schema_name != _FULL_NAME:
        raise CorruptObject(f"Avro file holds {schema_name!r}, not {_FULL_NAME}")
    written = metadata.get(_META_FORMAT)
    if not isinstance(written, str) or not written.isdigit():
        raise CorruptObject(f"manifest has no readable {_META_FORMAT} ({written!r})")
    if not OLDEST_READABLE_VERSION <= int(written) <= FORMAT_VERSION:
        raise UnsupportedFormat(unsupported_version(
            f"manifest {key}" if key else "manifest", int(written), OLDEST_READABLE_VERSION,
            FORMAT_VERSION))
    if len(records) != 1:
        raise CorruptObject(f"manifest holds {len(records)} records, expected 1")
    r = records[0]
    try:
        manifest = Manifest(
            topic=r["topic"],
            topic_id=r["topic_id"] if isinstance(r["topic_id"], uuid.UUID) else uuid.UUID(r["topic_id"]),
            partition=r["partition"],
            version=r["version"],
            log_start_offset=r["log_start_offset"],
            segments=[SegmentRecord(**s) for s in r["segments"]],
        )
        crc = crc32c.crc32c(encode_record(manifest))
    except Exception as exc:
        raise CorruptObject(f"manifest record is malformed: {exc}") from exc
    if str(crc) != metadata.get(_META_CRC):
        raise CorruptObject("manifest CRC mismatch")
    problem = _segments_problem(manifest.segments)
    if problem:
        raise CorruptObject(f"manifest is inconsistent: {problem}")
    return manifest
