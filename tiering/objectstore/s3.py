"""`s3://bucket/prefix`: Amazon S3 or any S3-compatible store, through aiobotocore.

Endpoint, region and credentials come from the standard AWS configuration
(AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL, AWS_REGION / AWS_DEFAULT_REGION, AWS_PROFILE and
config files, environment keys, instance roles); `endpoint_url=`, `region=`, `profile=`
and `path_style=` override it.

botocore's own retries are switched off: every request goes through one retry loop with
full-jitter exponential backoff (bounded attempts, then ObjectStoreError), retrying 5xx,
throttling, timeouts and dropped connections, including a body that breaks mid-read.
Objects above `multipart_threshold` go up as a multipart upload whose parts are retried
one by one; a failed upload is aborted so no parts are left billed.

Every PUT (and every part) carries its CRC-32C, computed here with the `crc32c` package
(botocore would need awscrt for it), so the store refuses bytes damaged on the way and
keeps the checksum; a whole-object GET asks for it back and checks it (`check_crc32c`).
"""

from __future__ import annotations

import builtins  # the stores have a method named list
import asyncio
import logging
import math
import os
import random
from pathlib import Path
from typing import Any, Awaitable, Callable

import aiohttp
import botocore.exceptions
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession

from stratalog.tiering.objectstore.base import (
    ObjectData,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    check_crc32c,
    check_key,
    check_range,
    crc32c_checksum,
    joined,
    new_stats,
)

log = logging.getLogger(__name__)

MiB = 1024 * 1024
MAX_PARTS = 10_000
MAX_DELETE_BATCH = 1000

_RETRYABLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "ProvisionedThroughputExceededException", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "PriorRequestNotComplete",
})
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_RETRYABLE_EXCEPTIONS = (
    botocore.exceptions.ConnectionError,  # endpoint unreachable, connect timeout
    botocore.exceptions.HTTPClientError,  # connection closed, read timeout, body cut short
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.ChecksumError,
    botocore.exceptions.FlexibleChecksumError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    ConnectionError,
)


def _drop_expect_header(params: dict, **_: Any) -> None:
    params.get("headers", {}).pop("Expect", None)


class S3ObjectStore:
    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        profile: str | None = None,
        multipart_threshold: int = 16 * MiB,
        part_size: int = 8 * MiB,
        part_concurrency: int = 4,
        max_attempts: int = 6,
        backoff_base: float = 0.05,
        backoff_cap: float = 5.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        max_pool_connections: int = 64,
        min_upload_rate: float = 1 * MiB,
        page_size: int = 1000,
        delete_batch: int = MAX_DELETE_BATCH,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        rng: Callable[[], float] = random.random,
    ) -> None:
        if not bucket or "/" in bucket:
            raise ValueError(f"bad S3 bucket name: {bucket!r}")
        if part_size <= 0 or multipart_threshold < part_size:
            raise ValueError(f"need 0 < part_size <= multipart_threshold, got {part_size}, {multipart_threshold}")
        if max_attempts < 1 or part_concurrency < 1:
            raise ValueError("max_attempts and part_concurrency must be at least 1")
        if not 1 <= page_size <= 1000 or not 1 <= delete_batch <= MAX_DELETE_BATCH:
            raise ValueError("page_size and delete_batch must be in [1, 1000]")
        prefix = prefix.strip("/")
        if prefix:
            check_key(prefix)
        self.bucket = bucket
        self.prefix = prefix + "/" if prefix else ""
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self.stats = new_stats()
        self._endpoint_url = endpoint_url
        # botocore reads AWS_DEFAULT_REGION and profiles itself, but not AWS_REGION.
        self._region = region or os.environ.get("AWS_REGION") or None
        self._path_style = path_style
        self._profile = profile
        self._multipart_threshold = multipart_threshold
        self._part_size = part_size
        self._part_concurrency = part_concurrency
        self._max_attempts = max_attempts
        self._backoff_base = backoff_base
        self._backoff_cap = backoff_cap
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._max_pool_connections = max_pool_connections
        self._min_upload_rate = min_upload_rate
        self._page_size = page_size
        self._delete_batch = delete_batch
        self._sleep = sleep
        self._rng = rng
        self._client: Any = None
        self._client_cm: Any = None
        self._client_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"S3ObjectStore({self.url!r})"

    async def _get_client(self) -> Any:
        if self._client is None:
            async with self._client_lock:
                if self._client is None:
                    s3_options = {}
                    if self._path_style is not None:
                        s3_options["addressing_style"] = "path" if self._path_style else "virtual"
                    config = AioConfig(
                        connect_timeout=self._connect_timeout,
                        read_timeout=self._read_timeout,
                        max_pool_connections=self._max_pool_connections,
                        retries={"mode": "standard", "total_max_attempts": 1},
                        s3=s3_options or None,
                    )
                    session = AioSession(profile=self._profile)
                    cm = session.create_client(
                        "s3", region_name=self._region, endpoint_url=self._endpoint_url, config=config
                    )
                    try:
                        client = await cm.__aenter__()
                    except botocore.exceptions.BotoCoreError as exc:
                        raise ObjectStoreError(f"cannot configure S3 client for {self.url}: {exc}") from exc
                    # botocore asks for `Expect: 100-continue` on every upload; waiting for
                    # the 100 costs a round trip and no client timeout covers that wait.
                    client.meta.events.register_last("before-call.s3", _drop_expect_header)
                    self._client, self._client_cm = client, cm
        return self._client

    def _backoff(self, attempt: int) -> float:
        # Full jitter: a uniform draw below an exponentially growing cap.
        return self._rng() * min(self._backoff_cap, self._backoff_base * (2 ** (attempt - 1)))

    async def _call(
        self,
        stat: str,
        what: str,
        request: Callable[[Any], Awaitable[Any]],
        *,
        missing_key: str | None = None,
        allow: frozenset[str] = frozenset(),
        upload_bytes: int | None = None,
    ) -> Any:
        """Run one request with retries. Error codes in `allow` are returned, not raised.

        Uploads get an overall deadline per attempt: aiohttp has no timeout on writing a
        body to a server that stops reading."""
        client = await self._get_client()
        deadline = None
        if upload_bytes is not None:
            deadline = self._connect_timeout + self._read_timeout + upload_bytes / self._min_upload_rate
        attempt = 0
        while True:
            attempt += 1
            self.stats[stat] += 1
            try:
                async with asyncio.timeout(deadline):
                    return await request(client)
            except botocore.exceptions.ClientError as exc:
                error = exc.response.get("Error", {})
                code = str(error.get("Code", ""))
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0
                if code in allow:
                    return exc
                if missing_key is not None and (code in _NOT_FOUND_CODES or (status == 404 and code != "NoSuchBucket")):
                    raise ObjectNotFound(missing_key) from None
                self.stats["errors"] += 1
                if not (status >= 500 or status == 429 or code in _RETRYABLE_CODES):
                    raise ObjectStoreError(f"{what} on {self.url}: {code or status} {error.get('Message', '')}".rstrip()) from exc
                last: BaseException = exc
            except _RETRYABLE_EXCEPTIONS as exc:
                self.stats["errors"] += 1
                last = exc
            except botocore.exceptions.BotoCoreError as exc:
                self.stats["errors"] += 1
                raise ObjectStoreError(f"{what} on {self.url}: {exc}") from exc
            if attempt >= self._max_attempts:
                raise ObjectStoreError(
                    f"{what} on {self.url} failed after {attempt} attempts: {type(last).__name__}: {last}"
                ) from last
            delay = self._backoff(attempt)
            log.debug("%s on %s: %s; retry %d in %.3fs", what, self.url, last, attempt, delay)
            self.stats["retries"] += 1
            await self._sleep(delay)

    async def put(self, key: str, data: ObjectData) -> None:
        """Write a whole object; visible to readers only once complete."""
        view = memoryview(joined(data)).cast("B")

        async def read(start: int, length: int) -> bytes:
            return bytes(view[start:start + length])

        await self._put(key, view.nbytes, read)

    async def put_file(self, key: str, path: Path) -> None:
        """Write a local file as a whole object; at most `part_concurrency` parts of it are
        in memory at once."""

        def read_range(start: int, length: int) -> bytes:
            with open(path, "rb") as f:
                f.seek(start)
                data = f.read(length)
            if len(data) != length:
                raise ObjectStoreError(f"{path} changed while it was uploaded as {key}")
            return data

        async def read(start: int, length: int) -> bytes:
            return await asyncio.to_thread(read_range, start, length)

        size = (await asyncio.to_thread(os.stat, path)).st_size
        await self._put(key, size, read)

    async def _put(self, key: str, size: int, read: Callable[[int, int], Awaitable[bytes]]) -> None:
        full = self.prefix + check_key(key)
        if size > self._multipart_threshold:
            await self._put_multipart(key, full, size, read)
        else:
            body = await read(0, size)
            await self._call(
                "put", f"put {key}",
                lambda c: c.put_object(Bucket=self.bucket, Key=full, Body=body, ChecksumAlgorithm="CRC32C",
                                       ChecksumCRC32C=crc32c_checksum(body)),
                upload_bytes=len(body),
            )
        self.stats["bytes_out"] += size

    async def _put_multipart(self, key: str, full: str, size: int,
                             read: Callable[[int, int], Awaitable[bytes]]) -> None:
        part_size = max(self._part_size, math.ceil(size / MAX_PARTS))
        created = await self._call(
            "put", f"start multipart {key}",
            lambda c: c.create_multipart_upload(Bucket=self.bucket, Key=full, ChecksumAlgorithm="CRC32C"),
        )
        upload_id = created["UploadId"]
        limit = asyncio.Semaphore(self._part_concurrency)

        async def upload(number: int, start: int) -> dict:
            async with limit:
                body = await read(start, min(part_size, size - start))
                checksum = crc32c_checksum(body)
                resp = await self._call(
                    "put", f"put {key} part {number}",
                    lambda c: c.upload_part(
                        Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=body,
                        ChecksumAlgorithm="CRC32C", ChecksumCRC32C=checksum,
                    ),
                    upload_bytes=len(body),
                )
                return {"PartNumber": number, "ETag": resp["ETag"], "ChecksumCRC32C": checksum}

        tasks = [
            asyncio.create_task(upload(n, start))
            for n, start in enumerate(range(0, size, part_size), start=1)
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for t in tasks:
                failure = t.exception() if t.done() else None
                if failure is not None:
                    raise failure
            parts = [t.result() for t in tasks]
            await self._call(
                "put", f"complete multipart {key}",
                lambda c: c.complete_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}
                ),
            )
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await self._call(
                    "put", f"abort multipart {key}",
                    lambda c: c.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id),
                )
            except ObjectStoreError as exc:
                log.warning("could not abort multipart upload of %s: %s", key, exc)
            raise

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object (end None: to its end); ObjectNotFound if absent."""
        check_range(start, end)
        full = self.prefix + check_key(key)
        if end is not None and end == start:
            await self.size(key)  # still report a missing object
            return b""
        params: dict[str, Any] = {"Bucket": self.bucket, "Key": full}
        if start or end is not None:
            params["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        else:
            params["ChecksumMode"] = "ENABLED"  # the stored CRC32C comes back with the bytes

        async def fetch(client: Any) -> tuple[bytes, str | None]:
            resp = await client.get_object(**params)
            async with resp["Body"] as stream:
                data = await stream.read()
            if len(data) != resp["ContentLength"]:
                raise botocore.exceptions.IncompleteReadError(
                    actual_bytes=len(data), expected_bytes=resp["ContentLength"]
                )
            # botocore asks for checksums on its own; for a range S3 returns none, but
            # another store may return the whole object's, which says nothing of a range.
            return data, None if "Range" in params else resp.get("ChecksumCRC32C")

        result = await self._call("get", f"get {key}", fetch, missing_key=key, allow=frozenset({"InvalidRange"}))
        if isinstance(result, botocore.exceptions.ClientError):
            return b""  # the range starts at or past the end of an existing object
        data, stored = result
        self.stats["bytes_in"] += len(data)
        check_crc32c(key, data, stored)
        return data

    async def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFound if absent."""
        full = self.prefix + check_key(key)
        resp = await self._call(
            "head", f"size {key}", lambda c: c.head_object(Bucket=self.bucket, Key=full), missing_key=key
        )
        return int(resp["ContentLength"])

    async def stored_crc32c(self, key: str) -> str | None:
        """The whole object's CRC-32C as S3 keeps it (base64), from a HEAD: None when it
        keeps none, or only a checksum of a multipart upload's parts (`...-N`), which
        says nothing of the bytes alone; ObjectNotFound if absent."""
        full = self.prefix + check_key(key)
        resp = await self._call(
            "head", f"checksum {key}",
            lambda c: c.head_object(Bucket=self.bucket, Key=full, ChecksumMode="ENABLED"), missing_key=key
        )
        value = resp.get("ChecksumCRC32C")
        return value if value and "-" not in value else None

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with prefix, sorted by key."""
        if prefix.startswith("/"):
            raise ValueError(f"list prefix must be relative: {prefix!r}")
        found: list[ObjectInfo] = []
        params: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self.prefix + prefix, "MaxKeys": self._page_size}
        while True:
            page_params = dict(params)
            resp = await self._call("list", f"list {prefix}", lambda c: c.list_objects_v2(**page_params))
            for obj in resp.get("Contents", ()):
                found.append(ObjectInfo(obj["Key"][len(self.prefix) :], int(obj["Size"])))
            if not resp.get("IsTruncated"):
                break
            params["ContinuationToken"] = resp["NextContinuationToken"]
        found.sort(key=lambda info: info.key)
        return found

    async def delete(self, keys: builtins.list[str]) -> None:
        """Delete objects; keys that do not exist are ignored."""
        full = [self.prefix + check_key(k) for k in keys]
        for i in range(0, len(full), self._delete_batch):
            batch = {"Objects": [{"Key": k} for k in full[i : i + self._delete_batch]], "Quiet": True}
            resp = await self._call(
                "delete", "delete", lambda c: c.delete_objects(Bucket=self.bucket, Delete=batch)
            )
            errors = [e for e in resp.get("Errors", ()) if e.get("Code") not in _NOT_FOUND_CODES]
            if errors:
                self.stats["errors"] += 1
                first = errors[0]
                raise ObjectStoreError(
                    f"delete on {self.url}: {len(errors)} keys failed, first {first.get('Key')}: "
                    f"{first.get('Code')} {first.get('Message', '')}".rstrip()
                )

    async def close(self) -> None:
        """Release connections."""
        cm, self._client_cm, self._client = self._client_cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)
