"""The coordinator backup file: one cluster's keyspace as read at one revision.

Layout (UTF-8 text, one item per line, `\\n` line ends):

    STRATALOG-COORDINATOR-BACKUP <format version>
    {"cluster": ..., "cluster_id": ..., "keyspace_version": ..., "revision": ..., "time_ms": ...}
    {"k": "<key relative to /stratalog/<cluster>/>", "v": "<value, base64>"}     one per key
    ...
    {"end": true, "keys": <count>, "sha256": "<hex>"}

The first line carries the format version alone, so a reader refuses a newer file before
parsing anything else. The header line says where and when the keys were read: the
cluster's name and id, its keyspace version (`coordinator.store.KEYSPACE_VERSION` of the
writer), the revision all keys were read at and the wall-clock time of the read. Keys are
sorted, relative to the cluster prefix (so a backup can be restored under another cluster
name), and never leased ones (a live gateway's registration and the controller key mean
nothing once it is gone). The last line closes the file: the number of keys and the
SHA-256 of every byte before it, so a truncated or altered file is refused as a whole
rather than half restored.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass, field

from stratalog.coordinator.kv import CoordinatorError, UnsupportedFormat, unsupported_version

FORMAT_VERSION = 1  # written; readers take OLDEST_READABLE_VERSION..FORMAT_VERSION
OLDEST_READABLE_VERSION = 1
MAGIC = "STRATALOG-COORDINATOR-BACKUP"


class CorruptBackup(CoordinatorError):
    """A backup file that is not whole: truncated, altered or not a backup at all."""


@dataclass(frozen=True)
class Backup:
    """A cluster's non-leased keys at one revision, and where and when they were read."""

    cluster: str
    cluster_id: str
    keyspace_version: int
    revision: int
    time_ms: int
    keys: list[tuple[str, bytes]] = field(default_factory=list)  # (relative key, value), sorted


def encode(backup: Backup) -> bytes:
    """The file's bytes (layout: module docstring)."""
    head = {"cluster": backup.cluster, "cluster_id": backup.cluster_id,
            "keyspace_version": backup.keyspace_version, "revision": backup.revision,
            "time_ms": backup.time_ms}
    lines = [f"{MAGIC} {FORMAT_VERSION}".encode(), _line(head)]
    lines += [_line({"k": k, "v": base64.b64encode(v).decode()}) for k, v in sorted(backup.keys)]
    body = b"\n".join(lines) + b"\n"
    end = _line({"end": True, "keys": len(backup.keys), "sha256": hashlib.sha256(body).hexdigest()})
    return body + end + b"\n"


def decode(data: bytes, name: str = "backup") -> Backup:
    """The backup in `data`: UnsupportedFormat for another format version, CorruptBackup for
    anything that is not a whole, unaltered backup file."""
    first, sep, _ = data.partition(b"\n")
    magic, _, version_text = first.decode("utf-8", "replace").partition(" ")
    if magic != MAGIC or not sep:
        raise CorruptBackup(f"{name} is not a Stratalog coordinator backup (it does not start "
                            f"with {MAGIC})")
    try:
        version = int(version_text)
    except ValueError:
        raise CorruptBackup(f"{name}: unreadable format version {version_text!r}") from None
    if not OLDEST_READABLE_VERSION <= version <= FORMAT_VERSION:
        raise UnsupportedFormat(unsupported_version(f"coordinator backup {name}", version,
                                                    OLDEST_READABLE_VERSION, FORMAT_VERSION))
    # The closing line is the last one; everything before it is what it checksums.
    if not data.endswith(b"\n"):
        raise CorruptBackup(f"{name} is truncated (no closing line)")
    cut = data.rfind(b"\n", 0, len(data) - 1) + 1
    body, end = data[:cut], _parse(data[cut:-1], name)
    if not isinstance(end, dict) or end.get("end") is not True:
        raise CorruptBackup(f"{name} is truncated (no closing line)")
    if end.get("sha256") != hashlib.sha256(body).hexdigest():
        raise CorruptBackup(f"{name} is damaged: its SHA-256 does not match its content")
    lines = body.split(b"\n")[1:-1]  # without the magic line and the empty tail
    if not lines:
        raise CorruptBackup(f"{name} has no header")
    head = _parse(lines[0], name)
    keys: list[tuple[str, bytes]] = []
    try:
        for raw in lines[1:]:
            item = _parse(raw, name)
            keys.append((str(item["k"]), base64.b64decode(item["v"], validate=True)))
        backup = Backup(str(head["cluster"]), str(head["cluster_id"]), int(head["keyspace_version"]),
                        int(head["revision"]), int(head["time_ms"]), keys)
    except (KeyError, TypeError, ValueError, binascii.Error) as e:
        raise CorruptBackup(f"{name}: malformed entry ({e!r})") from None
    if end.get("keys") != len(keys):
        raise CorruptBackup(f"{name} closes with {end.get('keys')} keys but holds {len(keys)}")
    return backup


def _line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def _parse(raw: bytes, name: str):
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptBackup(f"{name}: malformed line ({e})") from None
