"""Blocking object-store access for Spark: ranged reads, listings, whole-object writes.

Spark runs `read()` in short-lived Python workers, where an event loop per call would only
cost time, so this module talks to the store synchronously: `os.pread` for `file://`,
boto3 for `s3://` (imported on first use, so planning a `file://` read never loads it).
Keys are the ones `tiering.layout` builds, relative to the store's root or prefix.

Every ranged read is appended to the file named by the environment variable
`STRATALOG_READ_TRACE`, when it is set, as one line ``GET <key> <start> <end>``: operators
use it to see what a query fetched, and the tests use it to check that the options skip
segments and byte ranges.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from stratalog.tiering.objectstore.base import (ObjectInfo, ObjectNotFound, ObjectStoreError, check_key,
                                                crc32c_checksum_of)
from stratalog.tiering.objectstore.file import TMP_PREFIX, list_files

TRACE_ENV = "STRATALOG_READ_TRACE"

__all__ = ["StoreSpec", "ObjectNotFound", "ObjectStoreError", "ObjectInfo", "TRACE_ENV"]


def _trace(key: str, start: int, end: int) -> None:
    path = os.environ.get(TRACE_ENV)
    if not path:
        return
    # One write(2) with O_APPEND per line, so concurrent workers never interleave.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"GET {key} {start} {end}\n".encode())
    finally:
        os.close(fd)


@dataclass(frozen=True)
class StoreSpec:
    """Where the objects are: a picklable description that executors reopen.

    Parameters
    ----------
    url : str
        ``file:///absolute/dir`` or ``s3://bucket[/prefix]``.
    endpoint, region : str, optional
        S3 endpoint URL and region; the standard AWS configuration otherwise.
    path_style : bool, optional
        Address S3 buckets by path (MinIO, moto) rather than by host name.

    Examples
    --------
    >>> spec = StoreSpec("file:///tmp/objects")
    >>> spec.open().list("manifests/")  # doctest: +SKIP
    """

    url: str
    endpoint: str | None = None
    region: str | None = None
    path_style: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.url, str) or "://" not in self.url:
            raise ValueError(f"object store URL must be file:///path or s3://bucket/prefix, got {self.url!r}")
        parts = urlsplit(self.url)
        if parts.scheme == "file":
            if parts.netloc not in ("", "localhost") or not unquote(parts.path).startswith("/"):
                raise ValueError(f"file URL must be file:///absolute/path, got {self.url!r}")
        elif parts.scheme == "s3":
            if not parts.netloc or "@" in parts.netloc or ":" in parts.netloc:
                raise ValueError(f"s3 URL must be s3://bucket/prefix, got {self.url!r}")
        else:
            raise ValueError(f"unknown object store scheme {parts.scheme!r} in {self.url!r}; "
                             "expected file or s3")
        if parts.query or parts.fragment:
            raise ValueError(f"object store URL takes no query or fragment: {self.url!r}")

    def open(self) -> "FileStore | S3Store":
        """A blocking client for this store (S3 clients are kept per process: Spark reuses
        Python workers, and building a boto3 client costs more than a small GET)."""
        parts = urlsplit(self.url)
        if parts.scheme == "file":
            return FileStore(Path(unquote(parts.path)))
        client = _S3_CLIENTS.get(self)
        if client is None:
            client = _S3_CLIENTS[self] = S3Store(parts.netloc, unquote(parts.path).strip("/"), self)
        return client


_S3_CLIENTS: dict[StoreSpec, "S3Store"] = {}


class FileStore:
    """`file://` objects: the key ``a/b`` is the file ``<root>/a/b``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object, clamped to its size; ObjectNotFound if absent."""
        try:
            fd = os.open(self._path(key), os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None
        try:
            size = os.fstat(fd).st_size
            stop = size if end is None else min(end, size)
            if start >= stop:
                return b""
            _trace(key, start, stop)
            data = os.pread(fd, stop - start, start)
        except OSError as exc:
            raise ObjectStoreError(f"reading {key} under {self.root}: {exc}") from exc
        finally:
            os.close(fd)
        if len(data) != stop - start:
            raise ObjectStoreError(f"short read of {key}: {len(data)} of {stop - start} bytes")
        return data

    def locate(self, key: str, seconds: int) -> str:
        """Where a reader outside Python finds the object: its file URL."""
        return self._path(key).as_uri()

    def size(self, key: str) -> int:
        """Size of an object in bytes; ObjectNotFound if absent."""
        try:
            return os.stat(self._path(key)).st_size
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(key) from None

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key."""
        return list_files(self.root, prefix)

    def put_file(self, key: str, source: Path) -> None:
        """Copy a local file in as an object, atomically (temp file, fsync, rename)."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as out, open(source, "rb") as src:
                while chunk := src.read(8 << 20):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, 0o644)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def delete(self, keys: list[str]) -> None:
        """Remove objects; absent keys are ignored."""
        for key in keys:
            self._path(key).unlink(missing_ok=True)


# Compaction writes segments of segment.bytes (1 GiB by default) at most; botocore would
# need awscrt to put a CRC-32C on each part of a multipart upload, so up to this size an
# object goes up whole with the checksum computed here.
SINGLE_PUT_BYTES = 2 * 1024**3


def _file_crc32c(f) -> str:
    import crc32c

    value = 0
    while chunk := f.read(8 * 1024 * 1024):
        value = crc32c.crc32c(chunk, value)
    return crc32c_checksum_of(value)


class S3Store:
    """`s3://bucket/prefix` objects through boto3 (standard retry mode)."""

    def __init__(self, bucket: str, prefix: str, spec: StoreSpec) -> None:
        import boto3
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = f"{prefix}/" if prefix else ""
        s3 = {"addressing_style": "path" if spec.path_style else "virtual"} if spec.path_style is not None else None
        config = Config(retries={"mode": "standard", "max_attempts": 6}, s3=s3,
                        max_pool_connections=32)
        region = spec.region or os.environ.get("AWS_REGION") or None
        self._client = boto3.session.Session().client(
            "s3", endpoint_url=spec.endpoint, region_name=region, config=config)

    def _errors(self):
        import botocore.exceptions

        return botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError

    def _not_found(self, exc) -> bool:
        code = getattr(exc, "response", {}).get("Error", {}).get("Code", "")
        return code in ("NoSuchKey", "404", "NotFound")

    def locate(self, key: str, seconds: int) -> str:
        """Where a reader outside Python finds the object: a GET presigned for `seconds`,
        so it needs no credentials of its own (and may ask for any byte range)."""
        return self._client.generate_presigned_url(
            "get_object", Params={"Bucket": self.bucket, "Key": self.prefix + check_key(key)},
            ExpiresIn=seconds)

    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object, clamped to its size; ObjectNotFound if absent."""
        if end is not None and end <= start:
            return b""
        check_key(key)
        wanted = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        client_error, core_error = self._errors()
        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self.prefix + key, Range=wanted)
            data = response["Body"].read()
        except client_error as exc:
            if self._not_found(exc):
                raise ObjectNotFound(key) from None
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""  # start at or past the end of the object
            raise ObjectStoreError(f"GET s3://{self.bucket}/{self.prefix}{key}: {exc}") from exc
        except core_error as exc:
            raise ObjectStoreError(f"GET s3://{self.bucket}/{self.prefix}{key}: {exc}") from exc
        _trace(key, start, start + len(data))
        if end is not None and len(data) > end - start:
            raise ObjectStoreError(f"GET {key} returned {len(data)} bytes for a range of {end - start}")
        return data

    def size(self, key: str) -> int:
        """Size of an object in bytes; ObjectNotFound if absent."""
        client_error, core_error = self._errors()
        try:
            return self._client.head_object(Bucket=self.bucket, Key=self.prefix + check_key(key))["ContentLength"]
        except client_error as exc:
            if self._not_found(exc):
                raise ObjectNotFound(key) from None
            raise ObjectStoreError(f"HEAD {key}: {exc}") from exc
        except core_error as exc:
            raise ObjectStoreError(f"HEAD {key}: {exc}") from exc

    def list(self, prefix: str) -> list[ObjectInfo]:
        """Objects whose key starts with `prefix`, sorted by key."""
        client_error, core_error = self._errors()
        found = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix + prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    found.append(ObjectInfo(item["Key"][len(self.prefix):], item["Size"]))
        except (client_error, core_error) as exc:
            raise ObjectStoreError(f"LIST s3://{self.bucket}/{self.prefix}{prefix}: {exc}") from exc
        found.sort(key=lambda info: info.key)
        return found

    def put_file(self, key: str, source: Path) -> None:
        """Upload a local file as an object: one PUT carrying its CRC-32C up to
        SINGLE_PUT_BYTES, multipart (with botocore's default CRC32 per part) above."""
        client_error, core_error = self._errors()
        full = self.prefix + check_key(key)
        try:
            if source.stat().st_size <= SINGLE_PUT_BYTES:
                with open(source, "rb") as f:
                    checksum = _file_crc32c(f)
                    f.seek(0)
                    self._client.put_object(Bucket=self.bucket, Key=full, Body=f, ChecksumAlgorithm="CRC32C",
                                            ChecksumCRC32C=checksum)
                return
            self._client.upload_file(str(source), self.bucket, full)
        except (client_error, core_error) as exc:
            raise ObjectStoreError(f"PUT {key}: {exc}") from exc
        except Exception as exc:  # boto3's transfer manager wraps failures in its own types
            raise ObjectStoreError(f"PUT {key}: {exc}") from exc

    def delete(self, keys: list[str]) -> None:
        """Remove objects; absent keys are ignored."""
        client_error, core_error = self._errors()
        for start in range(0, len(keys), 1000):
            batch = [{"Key": self.prefix + check_key(k)} for k in keys[start:start + 1000]]
            try:
                response = self._client.delete_objects(Bucket=self.bucket,
                                                       Delete={"Objects": batch, "Quiet": True})
            except (client_error, core_error) as exc:
                raise ObjectStoreError(f"DELETE under s3://{self.bucket}/{self.prefix}: {exc}") from exc
            if response.get("Errors"):
                first = response["Errors"][0]
                raise ObjectStoreError(f"DELETE {first.get('Key')}: {first.get('Message')}")
