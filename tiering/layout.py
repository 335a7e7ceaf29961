"""Object names: the one place that decides where each object lives in the store.

Keys are relative to the store's root or prefix:

    wal/<gateway-id>/<sequence:020>.wal
    topics/<topic>-<topic-id>/<partition>/<base-offset:020>-<leader-epoch>-<unique-id>.log
                                                                           .index
                                                                           .timeindex
    manifests/<topic>-<topic-id>/<partition>/<version:020>.avro
    coordinator/<time-ms:020>.backup          the controller's coordinator snapshots


Numbers that order objects are zero-padded to 20 digits so that a listing sorted by key
is sorted by number. A segment's three files share one key base; the unique id makes
every upload a fresh set of keys, so a retried or fenced upload never overwrites an
object someone may have committed.

Topic names follow Kafka's rule (1 to 249 of `[A-Za-z0-9._-]`, not `.` or `..`), so a
topic directory parses from the right: the last 36 characters are the topic id.
"""

from __future__ import annotations

import re
import uuid
from typing import NamedTuple

LOG = ".log"
INDEX = ".index"
TIMEINDEX = ".timeindex"
SEGMENT_EXTENSIONS = (LOG, INDEX, TIMEINDEX)
TXNINDEX = ".txnindex"  # only beside segments holding abort markers (tiering.txn)
WAL_EXTENSION = ".wal"
MANIFEST_EXTENSION = ".avro"

WAL_ROOT = "wal/"
TOPICS_ROOT = "topics/"
MANIFESTS_ROOT = "manifests/"
SNAPSHOTS_ROOT = "coordinator/"
SNAPSHOT_EXTENSION = ".backup"

_MAX_PADDED = 10**20 - 1
_TOPIC_RE = re.compile(r"[A-Za-z0-9._-]{1,249}")
_UNIQUE_ID_RE = re.compile(r"[A-Za-z0-9_]{1,64}")
_UUID_LEN = 36
_DIGITS20 = r"([0-9]{20})"
_WAL_RE = re.compile(r"wal/(0|[1-9][0-9]{0,9})/" + _DIGITS20 + re.escape(WAL_EXTENSION))
_SEGMENT_FILE_RE = re.compile(
    _DIGITS20 + r"-(0|[1-9][0-9]{0,9})-([A-Za-z0-9_]{1,64})(\.log|\.index|\.timeindex|\.txnindex)?"
)
_SNAPSHOT_RE = re.compile(re.escape(SNAPSHOTS_ROOT) + _DIGITS20 + re.escape(SNAPSHOT_EXTENSION))
_MANIFEST_FILE_RE = re.compile(_DIGITS20 + re.escape(MANIFEST_EXTENSION))
_PARTITION_RE = re.compile(r"0|[1-9][0-9]{0,9}")


class WalKey(NamedTuple):
    gateway_id: int
    sequence: int


class SegmentKey(NamedTuple):
    topic: str
    topic_id: uuid.UUID
    partition: int
    base_offset: int
    leader_epoch: int
    unique_id: str
    ext: str  # one of SEGMENT_EXTENSIONS or TXNINDEX, or "" for a bare key base


class ManifestKey(NamedTuple):
    topic: str
    topic_id: uuid.UUID
    partition: int
    version: int


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC_RE.fullmatch(topic) or topic in (".", ".."):
        raise ValueError(f"illegal topic name for an object key: {topic!r}")


def _check_uuid(topic_id: uuid.UUID) -> None:
    if not isinstance(topic_id, uuid.UUID):
        raise ValueError(f"topic_id must be a uuid.UUID, got {type(topic_id).__name__}")


def _check_int(name: str, value: int, limit: int = _MAX_PADDED) -> None:
    # bool is an int subclass; a True partition is always a caller bug.
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
        raise ValueError(f"{name} must be an integer in [0, {limit}], got {value!r}")


def _topic_dir(topic: str, topic_id: uuid.UUID) -> str:
    _check_topic(topic)
    _check_uuid(topic_id)
    return f"{topic}-{topic_id}"


def wal_key(gateway_id: int, sequence: int) -> str:
    """Key of the WAL object a gateway flushed as its `sequence`-th upload."""
    _check_int("gateway_id", gateway_id, 2**31 - 1)
    _check_int("sequence", sequence)
    return f"{WAL_ROOT}{gateway_id}/{sequence:020d}{WAL_EXTENSION}"


def wal_prefix(gateway_id: int | None = None) -> str:
    """Prefix of every WAL object, or of one gateway's WAL objects."""
    if gateway_id is None:
        return WAL_ROOT
    _check_int("gateway_id", gateway_id, 2**31 - 1)
    return f"{WAL_ROOT}{gateway_id}/"


def segment_key_base(
    topic: str,
    topic_id: uuid.UUID,
    partition: int,
    base_offset: int,
    leader_epoch: int,
    unique_id: str,
) -> str:
    """Key of a segment without extension; add LOG, INDEX or TIMEINDEX."""
    topic_dir = _topic_dir(topic, topic_id)
    _check_int("partition", partition, 2**31 - 1)
    _check_int("base_offset", base_offset)
    _check_int("leader_epoch", leader_epoch, 2**31 - 1)
    if not isinstance(unique_id, str) or not _UNIQUE_ID_RE.fullmatch(unique_id):
        raise ValueError(f"unique_id must be 1 to 64 of [A-Za-z0-9_], got {unique_id!r}")
    return f"{TOPICS_ROOT}{topic_dir}/{partition}/{base_offset:020d}-{leader_epoch}-{unique_id}"


def partition_segment_prefix(topic: str, topic_id: uuid.UUID, partition: int) -> str:
    """Prefix of every segment file of one partition."""
    _check_int("partition", partition, 2**31 - 1)
    return f"{TOPICS_ROOT}{_topic_dir(topic, topic_id)}/{partition}/"


def manifest_key(topic: str, topic_id: uuid.UUID, partition: int, version: int) -> str:
    """Key of the `version`-th manifest snapshot of one partition."""
    _check_int("version", version)
    return f"{partition_manifest_prefix(topic, topic_id, partition)}{version:020d}{MANIFEST_EXTENSION}"


def partition_manifest_prefix(topic: str, topic_id: uuid.UUID, partition: int) -> str:
    """Prefix of every manifest snapshot of one partition (newest sorts last)."""
    _check_int("partition", partition, 2**31 - 1)
    return f"{MANIFESTS_ROOT}{_topic_dir(topic, topic_id)}/{partition}/"


def topic_prefixes(topic: str, topic_id: uuid.UUID) -> list[str]:
    """Prefixes covering every segment and manifest of a topic (for deleting it)."""
    topic_dir = _topic_dir(topic, topic_id)
    return [f"{TOPICS_ROOT}{topic_dir}/", f"{MANIFESTS_ROOT}{topic_dir}/"]


def _split_topic_dir(key: str, topic_dir: str) -> tuple[str, uuid.UUID]:
    if len(topic_dir) < _UUID_LEN + 2 or topic_dir[-_UUID_LEN - 1] != "-":
        raise ValueError(f"not a <topic>-<topic-id> directory in key {key!r}")
    topic, id_text = topic_dir[: -_UUID_LEN - 1], topic_dir[-_UUID_LEN:]
    try:
        topic_id = uuid.UUID(id_text)
    except ValueError:
        raise ValueError(f"bad topic id {id_text!r} in key {key!r}") from None
    if str(topic_id) != id_text:
        # Only the canonical lowercase form is ever written.
        raise ValueError(f"non-canonical topic id {id_text!r} in key {key!r}")
    try:
        _check_topic(topic)
    except ValueError:
        raise ValueError(f"bad topic name {topic!r} in key {key!r}") from None
    return topic, topic_id


def _split_partition_path(key: str, root: str) -> tuple[str, uuid.UUID, int, str]:
    if not isinstance(key, str) or not key.startswith(root):
        raise ValueError(f"key {key!r} does not start with {root!r}")
    parts = key[len(root) :].split("/")
    if len(parts) != 3:
        raise ValueError(f"key {key!r} is not {root}<topic>-<topic-id>/<partition>/<file>")
    topic, topic_id = _split_topic_dir(key, parts[0])
    if not _PARTITION_RE.fullmatch(parts[1]) or int(parts[1]) > 2**31 - 1:
        raise ValueError(f"bad partition {parts[1]!r} in key {key!r}")
    return topic, topic_id, int(parts[1]), parts[2]


def parse_segment_key(key: str) -> SegmentKey:
    """Split a segment key (with an extension, or a bare key base) into its parts."""
    topic, topic_id, partition, name = _split_partition_path(key, TOPICS_ROOT)
    m = _SEGMENT_FILE_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"bad segment file name {name!r} in key {key!r}")
    epoch = int(m.group(2))
    if epoch > 2**31 - 1:
        raise ValueError(f"leader epoch out of range in key {key!r}")
    return SegmentKey(topic, topic_id, partition, int(m.group(1)), epoch, m.group(3), m.group(4) or "")


def parse_manifest_key(key: str) -> ManifestKey:
    """Split a manifest key into its parts."""
    topic, topic_id, partition, name = _split_partition_path(key, MANIFESTS_ROOT)
    m = _MANIFEST_FILE_RE.fullmatch(name)
    if m is None:
        raise ValueError(f"bad manifest file name {name!r} in key {key!r}")
    return ManifestKey(topic, topic_id, partition, int(m.group(1)))


def parse_wal_key(key: str) -> WalKey:
    """Split a WAL object key into gateway id and sequence."""
    m = _WAL_RE.fullmatch(key) if isinstance(key, str) else None
    if m is None:
        raise ValueError(f"key {key!r} is not wal/<gateway-id>/<sequence:020>.wal")
    gateway_id = int(m.group(1))
    if gateway_id > 2**31 - 1:
        raise ValueError(f"gateway id out of range in key {key!r}")
    return WalKey(gateway_id, int(m.group(2)))


def snapshot_key(time_ms: int) -> str:
    """Key of the coordinator snapshot taken at `time_ms` (the backup file's format)."""
    _check_int("time_ms", time_ms)
    return f"{SNAPSHOTS_ROOT}{time_ms:020d}{SNAPSHOT_EXTENSION}"


def parse_snapshot_key(key: str) -> int:
    """The time (ms) a coordinator snapshot key names; ValueError for any other key."""
    m = _SNAPSHOT_RE.fullmatch(key) if isinstance(key, str) else None
    if m is None:
        raise ValueError(f"key {key!r} is not {SNAPSHOTS_ROOT}<time-ms:020>{SNAPSHOT_EXTENSION}")
    return int(m.group(1))
