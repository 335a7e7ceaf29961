"""The object-store boundary: whole-object puts, ranged gets, listing and deletes.

Backends are chosen by URL scheme (`open_store`): `file:///path` and `s3://bucket/prefix`.
Keys are relative to the store's root or prefix and use `/` separators.
"""

from __future__ import annotations

import base64
import builtins  # the stores have a method named list

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import crc32c

from stratalog.tiering.errors import CorruptObject


Buffer = bytes | bytearray | memoryview
# What a put writes: one buffer, or a list of parts written one after another (a WAL
# object's header, batches and footer, which a file store writes with one writev and no
# copy into one buffer first).
ObjectData = Buffer | list[Buffer]


def data_size(data: ObjectData) -> int:
    """How many bytes a put of `data` writes."""
    if isinstance(data, list):
        return sum(map(_nbytes, data))
    return _nbytes(data)


def _nbytes(buffer: Buffer) -> int:
    return buffer.nbytes if isinstance(buffer, memoryview) else len(buffer)


def joined(data: ObjectData) -> Buffer:
    """`data` as one buffer (parts copied into one)."""
    return b"".join(data) if isinstance(data, list) else data


class ObjectNotFound(KeyError):
    """The key does not exist in the store."""


class ObjectStoreError(IOError):
    """The store failed (after retries, where the backend retries)."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


class ObjectStore(Protocol):
    url: str

    async def put(self, key: str, data: ObjectData) -> None:
        """Write a whole object; visible to readers only once complete."""

    async def put_file(self, key: str, path: Path) -> None:
        """Write a local file as a whole object without holding all of it in memory. The
        file must not change afterwards: a store on the same file system may link it
        rather than copy it."""

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object (end None: to its end); ObjectNotFound if absent."""

    async def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFound if absent."""

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with prefix, sorted by key."""

    async def delete(self, keys: builtins.list[str]) -> None:
        """Delete objects; keys that do not exist are ignored."""

    async def close(self) -> None:
        """Release connections."""


def crc32c_checksum(data: bytes | bytearray | memoryview) -> str:
    """S3's form of the CRC-32C of `data`: the big-endian 4 bytes, base64."""
    return crc32c_checksum_of(crc32c.crc32c(data))


def crc32c_checksum_of(value: int) -> str:
    """S3's form of a CRC-32C value."""
    return base64.b64encode(value.to_bytes(4, "big")).decode("ascii")


def check_crc32c(key: str, data: bytes, stored: str | None) -> None:
    """CorruptObject if the store returned a whole-object CRC-32C that the bytes do not match.

    S3 returns one only for a GET of the whole object (not a range), and a multipart
    object's is a checksum of its parts' checksums (`...-N`), which says nothing of the
    bytes alone: both are left to the checks of the format itself."""
    if stored and "-" not in stored and crc32c_checksum(data) != stored:
        raise CorruptObject(f"{key}: the store's CRC32C {stored} does not match the "
                            f"{len(data)} bytes read ({crc32c_checksum(data)})", key=key)


def check_key(key: str) -> str:
    """Reject keys that are not plain relative `/`-separated paths; return the key.

    Every backend applies the same rule so a key valid on one is valid on all."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, got {key!r}")
    if key.startswith("/") or "\\" in key or "\x00" in key:
        raise ValueError(f"object key must be relative, with / separators: {key!r}")
    for part in key.split("/"):
        if part in ("", ".", ".."):
            raise ValueError(f"object key has an empty, '.' or '..' segment: {key!r}")
    return key


def check_range(start: int, end: int | None) -> None:
    """Reject a byte range [start, end) that cannot be read."""
    if start < 0 or (end is not None and end < start):
        raise ValueError(f"bad byte range [{start}, {end})")


def new_stats() -> dict[str, int]:
    """Request counters every backend keeps in its `stats` attribute.

    put/get/head/list/delete count requests sent (retries included); bytes_out is what
    was uploaded, bytes_in what was downloaded; errors counts failed requests."""
    return dict.fromkeys(("put", "get", "head", "list", "delete", "bytes_in", "bytes_out", "errors", "retries"), 0)
