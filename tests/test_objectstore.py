"""Object-store scenarios, written once and run against every backend.

The S3 backend talks HTTP to a real moto server on loopback; the retry tests put a small
fault-injecting HTTP proxy between the store and moto.
"""

from __future__ import annotations

import asyncio
import ctypes
import mmap
import os
import uuid

import pytest

from stratalog.infra.processes import free_port
from stratalog.tiering import layout
from moto_fixture import MotoServer, dummy_aws_env
from stratalog.tiering.objectstore import ObjectNotFound, ObjectStoreError, open_store
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.objectstore.base import ObjectInfo, check_crc32c, crc32c_checksum
from stratalog.tiering.objectstore.file import FileObjectStore
from stratalog.tiering.objectstore.s3 import S3ObjectStore

MiB = 1024 * 1024
S3_SMALL_MULTIPART = {"multipart_threshold": 6 * MiB, "part_size": 5 * MiB}  # moto enforces 5 MiB parts



@pytest.fixture(scope="module")
def moto_endpoint():
    pytest.importorskip("moto.server", reason="moto[server] is not installed")

    server = MotoServer(port=free_port()).start()
    yield server.url
    server.stop()


@pytest.fixture
def aws_env(monkeypatch, tmp_path, moto_endpoint):
    """Dummy credentials and a loopback endpoint, through the standard AWS variables only."""
    dummy_aws_env(monkeypatch, tmp_path)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    return moto_endpoint


def make_bucket(endpoint: str) -> str:
    import boto3

    name = f"strata-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["file", "s3"])
def backend(request, tmp_path):
    """(kind, make) where make(**s3_options) opens a fresh store on an empty root."""
    if request.param == "file":
        root = tmp_path / "store"
        return "file", lambda **_: open_store(root.as_uri())
    endpoint = request.getfixturevalue("aws_env")
    bucket = make_bucket(endpoint)
    return "s3", lambda **options: open_store(f"s3://{bucket}/cluster-a", **options)


def run_with(make, scenario, **options):
    async def main():
        store = make(**options)
        try:
            return await scenario(store)
        finally:
            await store.close()

    return asyncio.run(main())


# -- shared scenarios ------------------------------------------------------------------


def test_put_get_size_roundtrip(backend):
    kind, make = backend
    payload = bytes(range(256)) * 41

    async def scenario(store):
        await store.put("wal/1/00000000000000000001.wal", payload)
        assert await store.get("wal/1/00000000000000000001.wal") == payload
        assert await store.size("wal/1/00000000000000000001.wal") == len(payload)
        # bytearray and memoryview bodies are accepted and stored exactly
        await store.put("a/bytearray", bytearray(b"\x00\x01\x02"))
        await store.put("a/view", memoryview(b"xxhelloxx")[2:7])
        assert await store.get("a/bytearray") == b"\x00\x01\x02"
        assert await store.get("a/view") == b"hello"
        # overwrite replaces the whole object
        await store.put("a/view", b"z")
        assert await store.get("a/view") == b"z"
        assert store.stats["put"] >= 4 and store.stats["get"] >= 4
        assert store.stats["bytes_out"] == len(payload) + 3 + 5 + 1
        assert store.stats["bytes_in"] == len(payload) + 3 + 5 + 1

    run_with(make, scenario)


def test_a_put_of_parts_stores_them_one_after_another(backend):
    kind, make = backend
    # More parts than one writev takes (IOV_MAX is 1024 on Linux), of every buffer type,
    # empty ones among them.
    parts = [bytes([i % 251]) * (i % 7) for i in range(3000)]
    parts += [bytearray(b"array"), memoryview(b"..view..")[2:6], b""]

    async def scenario(store):
        await store.put("wal/1/00000000000000000002.wal", parts)
        assert await store.get("wal/1/00000000000000000002.wal") == b"".join(parts)
        assert store.stats["bytes_out"] == len(b"".join(parts))
        await store.put("none", [])
        assert await store.get("none") == b""

    run_with(make, scenario)


@pytest.mark.unit
def test_file_store_finishes_a_put_of_parts_after_short_writes(tmp_path, monkeypatch):
    # A regular file's writev writes everything short of a full disk or a signal; the
    # short writes are forced here, cutting off mid-part and at a part's end.
    import stratalog.tiering.objectstore.file as file_store

    real = os.writev
    limits = iter([5, 3, 1, 10])

    def short_writev(fd, buffers):
        views = [memoryview(b).cast("B") for b in buffers]
        limit = next(limits, None)
        if limit is None:
            return real(fd, views)
        taken, out = 0, []
        for v in views:
            out.append(v[:limit - taken])
            taken += out[-1].nbytes
            if taken == limit:
                break
        return real(fd, out)

    monkeypatch.setattr(file_store.os, "writev", short_writev)
    parts = [b"abcd", b"", bytearray(b"efgh"), memoryview(b"ijklmnop"), b"q"]
    store = FileObjectStore(tmp_path / "store")
    asyncio.run(store.put("obj", parts))
    assert (tmp_path / "store" / "obj").read_bytes() == b"abcdefghijklmnopq"


def test_ranged_reads(backend):
    kind, make = backend
    data = os.urandom(10_000)

    async def scenario(store):
        await store.put("obj", data)
        assert await store.get("obj", 0, 10_000) == data
        assert await store.get("obj", 1234, 5678) == data[1234:5678]
        assert await store.get("obj", 9_999) == data[9_999:]
        assert await store.get("obj", 5_000) == data[5_000:]
        assert await store.get("obj", 9_000, 20_000) == data[9_000:]  # end clamps to the size
        assert await store.get("obj", 10_000) == b""
        assert await store.get("obj", 12_000, 13_000) == b""
        assert await store.get("obj", 7, 7) == b""
        with pytest.raises(ValueError):
            await store.get("obj", -1, 5)
        with pytest.raises(ValueError):
            await store.get("obj", 10, 5)
        await store.put("empty", b"")
        assert await store.size("empty") == 0
        assert await store.get("empty") == b""
        assert await store.get("empty", 0, 100) == b""

    run_with(make, scenario)


def test_missing_keys(backend):
    kind, make = backend

    async def scenario(store):
        for call in (
            lambda: store.get("no/such/key"),
            lambda: store.get("no/such/key", 5, 10),
            lambda: store.get("no/such/key", 3, 3),
            lambda: store.size("no/such/key"),
        ):
            with pytest.raises(ObjectNotFound) as info:
                await call()
            assert isinstance(info.value, KeyError)
        await store.put("dir/file", b"x")
        with pytest.raises(ObjectNotFound):
            await store.get("dir")  # a key prefix is not an object
        with pytest.raises(ObjectNotFound):
            await store.size("dir")

    run_with(make, scenario)


@pytest.mark.parametrize("key", ["", "/abs", "a/../b", "..", "a//b", "./a", "a/", "a\\b"])
def test_bad_keys_rejected(backend, key):
    kind, make = backend

    async def scenario(store):
        with pytest.raises(ValueError):
            await store.put(key, b"x")
        with pytest.raises(ValueError):
            await store.get(key)
        with pytest.raises(ValueError):
            await store.delete([key])

    run_with(make, scenario)


def test_listing_prefixes_sorted_and_paginated(backend):
    kind, make = backend
    keys = [f"topics/orders-x/{p}/{i:020d}-0-u.log" for p in range(3) for i in range(13)]
    keys += ["topics/other/0/a", "wal/7/00000000000000000001.wal", "topicsx"]

    async def scenario(store):
        await asyncio.gather(*(store.put(k, k.encode()) for k in reversed(keys)))
        everything = await store.list("")
        assert everything == sorted((ObjectInfo(k, len(k)) for k in keys), key=lambda i: i.key)
        orders = await store.list("topics/orders-x/")
        assert [i.key for i in orders] == sorted(k for k in keys if k.startswith("topics/orders-x/"))
        assert len(orders) == 39
        # prefixes need not end at a path separator
        assert [i.key for i in await store.list("topics")] == sorted(k for k in keys if k.startswith("topics"))
        assert [i.key for i in await store.list("topics/orders-x/1/0000000000000000001")] == [
            f"topics/orders-x/1/{i:020d}-0-u.log" for i in range(10, 13)
        ]
        assert await store.list("nothing/here/") == []
        if kind == "s3":
            before = store.stats["list"]
            await store.list("topics/orders-x/")
            assert store.stats["list"] - before == 6  # 39 keys in pages of 7

    run_with(make, scenario, page_size=7)


def test_deletes(backend):
    kind, make = backend
    keys = [f"manifests/t-x/0/{i:020d}.avro" for i in range(25)]

    async def scenario(store):
        await asyncio.gather(*(store.put(k, b"m") for k in keys))
        await store.put("keep/me", b"k")
        await store.delete(keys[:20] + ["manifests/t-x/0/missing.avro", "never/existed"])
        assert [i.key for i in await store.list("")] == sorted(keys[20:] + ["keep/me"])
        await store.delete([])
        await store.delete(keys)  # the first 20 are gone already: ignored
        assert [i.key for i in await store.list("")] == ["keep/me"]
        with pytest.raises(ObjectNotFound):
            await store.get(keys[0])
        if kind == "s3":
            assert store.stats["delete"] == 3 + 3  # 22 keys, then 25 keys, in batches of 10

    run_with(make, scenario, delete_batch=10)


def test_large_object_multipart(backend):
    kind, make = backend
    data = os.urandom(12 * MiB + 123)

    async def scenario(store):
        await store.put("big/segment.log", data)
        assert await store.size("big/segment.log") == len(data)
        assert await store.get("big/segment.log") == data
        # a range straddling the boundary between parts 1 and 2
        assert await store.get("big/segment.log", 5 * MiB - 10, 5 * MiB + 10) == data[5 * MiB - 10 : 5 * MiB + 10]
        if kind == "s3":
            assert store.stats["put"] == 5  # create + 3 parts + complete
            assert store.stats["bytes_out"] == len(data)

    run_with(make, scenario, **S3_SMALL_MULTIPART)


@pytest.mark.unit
def test_file_store_links_a_put_file_on_the_same_file_system(tmp_path):
    # A sealed segment becomes an object without being written to disk a second time, and
    # the object outlives the local file (the sealer deletes it after the upload).
    source = tmp_path / "sealed.log"
    source.write_bytes(b"batches" * 1000)
    store = FileObjectStore(tmp_path / "objects")
    asyncio.run(store.put_file("topics/t/0/segment.log", source))
    target = tmp_path / "objects" / "topics" / "t" / "0" / "segment.log"
    assert target.stat().st_ino == source.stat().st_ino
    source.unlink()
    assert asyncio.run(store.get("topics/t/0/segment.log")) == b"batches" * 1000
    assert [o.key for o in asyncio.run(store.list("topics/t/0/"))] == ["topics/t/0/segment.log"]


def resident_pages(path) -> tuple[int, int]:
    """(pages of the file in the page cache, pages of the file), from mincore(2)."""
    size = os.path.getsize(path)
    pages = -(-size // mmap.PAGESIZE)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p)
    vector = ctypes.create_string_buffer(pages)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mapped:
        start = ctypes.c_char.from_buffer(mapped)  # a private mapping: nothing is copied
        try:
            if libc.mincore(ctypes.addressof(start), size, vector) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed")
        finally:
            del start
    return sum(b & 1 for b in vector.raw), pages


@pytest.mark.unit
@pytest.mark.skipif(not hasattr(os, "POSIX_FADV_DONTNEED"), reason="no posix_fadvise on this system")
def test_file_store_puts_of_bytes_leave_the_page_cache_and_linked_files_stay(tmp_path):
    # A WAL object is read back only by a recovery: once it is on disk its pages go, for
    # the next put to reuse. A sealed segment linked in is the read cache: it stays.
    control = tmp_path / "control"
    control.write_bytes(os.urandom(MiB))
    with open(control, "rb+") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    if resident_pages(control)[0]:
        pytest.skip(f"the file system under {tmp_path} keeps clean pages it is advised to drop")
    store = FileObjectStore(tmp_path / "objects")
    source = tmp_path / "sealed.log"
    source.write_bytes(os.urandom(MiB))

    async def scenario():
        data = os.urandom(MiB + 123)
        await store.put("wal/1/1.wal", data)
        await store.put("wal/1/2.wal", [data[:1000], memoryview(data)[1000:]])
        await store.put_file("topics/t/0/segment.log", source)
        assert await store.get("wal/1/1.wal") == data  # read back from the disk
        assert await store.get("wal/1/2.wal") == data

        # Nothing read the third: none of its pages is cached.
        await store.put("wal/1/3.wal", [data[:1000], memoryview(data)[1000:]])

    asyncio.run(scenario())
    objects = tmp_path / "objects"
    assert resident_pages(objects / "wal" / "1" / "3.wal") == (0, -(-(MiB + 123) // mmap.PAGESIZE))
    cached, pages = resident_pages(objects / "topics" / "t" / "0" / "segment.log")
    assert cached == pages == MiB // mmap.PAGESIZE


@pytest.mark.unit
def test_file_store_never_reuses_a_file_another_name_links(tmp_path):
    # A sealed segment's object is a hard link to the local file: deleting the object must
    # not empty or take the local file.
    source = tmp_path / "sealed.log"
    source.write_bytes(b"segment" * 100)
    store = FileObjectStore(tmp_path / "objects")

    async def scenario():
        await store.put_file("topics/t/0/segment.log", source)
        await store.delete(["topics/t/0/segment.log"])
        await store.put("topics/t/0/next.log", b"x")
        assert (tmp_path / "objects" / "topics" / "t" / "0" / "next.log").stat().st_ino != source.stat().st_ino
        await store.delete(["topics"])  # a directory is not an object: nothing happens
        assert [o.key for o in await store.list("")] == ["topics/t/0/next.log"]

    asyncio.run(scenario())
    assert source.read_bytes() == b"segment" * 100


@pytest.mark.unit
def test_a_reader_of_a_deleted_object_still_reads_all_of_its_bytes(tmp_path):
    # The JVM Spark reader reads an object through one open file, a chunk at a time, and
    # migrate copies beside a gateway collecting WAL objects: a delete and the puts after it
    # must leave an open object's bytes as they were (CI once read 0 of a WAL object's 580
    # bytes when deleted files were emptied and written again by later puts).
    root = tmp_path / "objects"
    data = os.urandom(580)

    async def scenario():
        store = FileObjectStore(root)
        await store.put("wal/1/16.wal", data)
        with open(root / "wal" / "1" / "16.wal", "rb", buffering=0) as reader:  # reads what is there
            first = reader.read(100)
            await store.delete(["wal/1/16.wal"])
            await asyncio.gather(*(store.put(f"wal/1/{n}.wal", os.urandom(580)) for n in range(17, 40)))
            assert first + reader.read() == data
        with pytest.raises(ObjectNotFound):
            await store.get("wal/1/16.wal")

    asyncio.run(scenario())


@pytest.mark.unit
def test_file_store_removes_the_files_an_earlier_version_kept(tmp_path):
    # Versions of 2026-11-27 to 12-02 kept deleted objects' files under .tmp-spare (one may
    # still hold bytes, its process gone before emptying it): no put takes them, no listing
    # shows them, and the first delete removes them.
    root = tmp_path / "objects"
    left = root / ".tmp-spare"
    left.mkdir(parents=True)
    (left / ".tmp-stale").write_bytes(b"stale " * 1000)
    (left / ".tmp-empty").touch()
    kept = {f.stat().st_ino for f in left.iterdir()}

    async def scenario():
        store = FileObjectStore(root)
        await store.put("k", b"short")
        assert (root / "k").stat().st_ino not in kept
        assert await store.get("k") == b"short" and await store.size("k") == 5
        assert [o.key for o in await store.list("")] == ["k"]
        await store.delete(["absent"])
        assert not left.exists()
        assert await store.get("k") == b"short"

    asyncio.run(scenario())


@pytest.mark.parametrize("size", [0, 1 * MiB + 7, 12 * MiB + 123])
def test_put_file_streams_a_local_file(backend, tmp_path, size):
    kind, make = backend
    data = os.urandom(size)
    source = tmp_path / "sealed.log"
    source.write_bytes(data)

    async def scenario(store):
        await store.put_file("files/segment.log", source)
        assert await store.size("files/segment.log") == size
        assert await store.get("files/segment.log") == data
        assert store.stats["bytes_out"] == size
        if kind == "s3":
            # create + 3 parts + complete above the multipart threshold, else one PUT
            assert store.stats["put"] == (5 if size > 6 * MiB else 1)
        with pytest.raises(OSError):  # ObjectStoreError is one too
            await store.put_file("files/missing.log", tmp_path / "missing.log")
        with pytest.raises(ObjectNotFound):
            await store.size("files/missing.log")

    run_with(make, scenario, **S3_SMALL_MULTIPART)


def test_concurrent_puts_and_gets(backend):
    kind, make = backend

    async def scenario(store):
        blobs = {f"c/{i}": os.urandom(1000 + i) for i in range(40)}
        await asyncio.gather(*(store.put(k, v) for k, v in blobs.items()))
        got = await asyncio.gather(*(store.get(k) for k in blobs))
        assert dict(zip(blobs, got)) == blobs

    run_with(make, scenario)


# -- file backend specifics ------------------------------------------------------------


def test_file_store_atomic_layout_and_pruning(tmp_path):
    root = tmp_path / "root"

    async def scenario():
        store = open_store(root.as_uri())
        assert isinstance(store, FileObjectStore) and store.url == root.as_uri()
        await store.put("topics/t-x/0/seg.log", b"abc")
        assert (root / "topics" / "t-x" / "0" / "seg.log").read_bytes() == b"abc"
        # a half-written temporary file is never listed, and its name is not a valid key
        (root / "topics" / "t-x" / "0" / ".tmp-leftover").write_bytes(b"partial")
        assert [i.key for i in await store.list("")] == ["topics/t-x/0/seg.log"]
        with pytest.raises(ValueError):
            await store.put("topics/.tmp-x", b"")
        (root / "topics" / "t-x" / "0" / ".tmp-leftover").unlink()
        await store.delete(["topics/t-x/0/seg.log"])
        assert not (root / "topics").exists()  # emptied directories are pruned
        assert root.is_dir()
        assert store.stats["put"] == 1 and store.stats["delete"] == 1 and store.stats["list"] == 1

    asyncio.run(scenario())


def test_file_store_io_failure_is_object_store_error(tmp_path):
    root = tmp_path / "root"

    async def scenario():
        store = open_store(root.as_uri())
        await store.put("a", b"x")
        with pytest.raises(ObjectStoreError):
            await store.put("a/b", b"y")  # "a" is an object, so it cannot be a directory too
        assert store.stats["errors"] == 1

    asyncio.run(scenario())


# -- open_store ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "gcs://bucket/x",
        "nonsense",
        "/plain/path",
        "file://relative/path",
        "file:relative",
        "file:///",
        "s3://",
        "s3:///prefix",
        "s3://user@bucket/x",
        "s3://bucket/x?versioning=1",
    ],
)
def test_open_store_rejects_bad_urls(url):
    with pytest.raises(ValueError):
        open_store(url)


def test_open_store_picks_backend_and_prefix(tmp_path):
    assert isinstance(open_store((tmp_path / "d").as_uri()), FileObjectStore)
    store = open_store("s3://bucket/some/prefix/", endpoint_url="http://127.0.0.1:1", path_style=True)
    assert isinstance(store, S3ObjectStore)
    assert (store.bucket, store.prefix, store.url) == ("bucket", "some/prefix/", "s3://bucket/some/prefix")
    with pytest.raises(ValueError):
        open_store((tmp_path / "d").as_uri(), region="x")
    with pytest.raises(TypeError):
        open_store("s3://bucket", no_such_option=1)


def test_s3_region_and_endpoint_configuration(aws_env, monkeypatch):
    bucket = make_bucket(aws_env)

    async def scenario():
        # AWS_REGION wins over AWS_DEFAULT_REGION (botocore alone reads only the latter)
        monkeypatch.setenv("AWS_REGION", "eu-west-3")
        store = open_store(f"s3://{bucket}")
        try:
            client = await store._get_client()
            assert client.meta.region_name == "eu-west-3"
        finally:
            await store.close()
        # an explicit endpoint overrides a broken one from the environment
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")
        store = open_store(f"s3://{bucket}", endpoint_url=aws_env, region="us-east-1", path_style=True)
        try:
            await store.put("k", b"v")
            assert await store.get("k") == b"v"
        finally:
            await store.close()

    asyncio.run(scenario())


# -- retries through a fault-injecting proxy -------------------------------------------


class FaultProxy:
    """An HTTP/1.1 proxy on loopback that answers or breaks requests as `policy` says.

    policy(n, request_line) -> None (forward), 500, 503, "drop" (close without answer),
    "stall" (never answer) or "truncate" (forward, but cut the response body short).
    One request per connection keeps the proxy simple; it asks for `Connection: close`.
    """

    def __init__(self, upstream: str, policy) -> None:
        host, port = upstream.removeprefix("http://").split(":")
        self.upstream = (host, int(port))
        self.policy = policy
        self.requests: list[str] = []
        self._tasks: set[asyncio.Task] = set()
        self._closing = asyncio.Event()

    async def __aenter__(self) -> FaultProxy:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.endpoint = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc) -> None:
        self.server.close()
        self._closing.set()  # releases stalled requests
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._one_request(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _one_request(self, reader, writer) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")[:-2]
        request_line, header_lines = lines[0], lines[1:]
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        assert "chunked" not in headers.get("transfer-encoding", ""), "proxy handles Content-Length bodies only"
        self.requests.append(request_line)
        action = self.policy(len(self.requests), request_line)
        if action in (500, 503):
            code = "SlowDown" if action == 503 else "InternalError"
            body = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
            writer.write(
                f"HTTP/1.1 {action} Injected\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body
            )
            await writer.drain()
            return
        if action == "drop":
            return
        if action == "stall":
            await self._closing.wait()
            return
        if headers.get("expect", "").lower() == "100-continue":
            writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        kept = [line for line in header_lines if line.split(":")[0].strip().lower() not in ("connection", "expect")]
        upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
        upstream_writer.write(("\r\n".join([request_line, *kept, "Connection: close"]) + "\r\n\r\n").encode("latin-1") + body)
        await upstream_writer.drain()
        response = await upstream_reader.read()  # upstream closes after one response
        upstream_writer.close()
        head, _, body = response.partition(b"\r\n\r\n")
        # Tell the client not to reuse the connection, since the proxy closes it.
        head_lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"connection:")]
        if action == "truncate":
            body = body[: len(body) // 2]
        writer.write(b"\r\n".join([*head_lines, b"Connection: close"]) + b"\r\n\r\n" + body)
        await writer.drain()


def retrying_store(bucket: str, endpoint: str, **options) -> S3ObjectStore:
    options.setdefault("backoff_base", 0.001)
    options.setdefault("backoff_cap", 0.01)
    return open_store(f"s3://{bucket}/p", endpoint_url=endpoint, path_style=True, **options)


def test_s3_retries_throttling_server_errors_and_dropped_connections(aws_env):
    bucket = make_bucket(aws_env)
    # aiohttp itself resends an idempotent request once when the connection drops, so a
    # drop reaches the store only when two come in a row (6 and 7).
    faults = {1: 503, 2: 500, 3: 503, 5: 500, 6: "drop", 7: "drop", 9: "truncate"}
    payload = b"payload" * 1000

    async def scenario():
        async with FaultProxy(aws_env, lambda n, _: faults.get(n)) as proxy:
            store = retrying_store(bucket, proxy.endpoint)
            try:
                await store.put("k", payload)  # requests 1-3 fail, 4 succeeds
                assert (store.stats["put"], store.stats["retries"], store.stats["errors"]) == (4, 3, 3)
                assert await store.get("k", 7, 7000) == payload[7:7000]  # 5, 6+7 fail, 8 ok
                assert await store.get("k") == payload  # 9 is cut short, 10 ok
                assert (store.stats["get"], store.stats["errors"]) == (5, 6)
                assert len(proxy.requests) == 10
            finally:
                await store.close()

    asyncio.run(scenario())


def test_s3_retries_read_timeouts(aws_env):
    bucket = make_bucket(aws_env)

    async def scenario():
        async with FaultProxy(aws_env, lambda n, _: "stall" if n == 1 else None) as proxy:
            store = retrying_store(bucket, proxy.endpoint, read_timeout=0.3)
            try:
                await store.put("k", b"v")
                assert await store.get("k") == b"v"
                assert store.stats["retries"] == 1
            finally:
                await store.close()

    asyncio.run(scenario())


def test_s3_gives_up_after_bounded_attempts_with_jittered_backoff(aws_env):
    bucket = make_bucket(aws_env)
    delays: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        delays.append(seconds)

    async def scenario():
        async with FaultProxy(aws_env, lambda n, _: 503) as proxy:
            store = retrying_store(
                bucket, proxy.endpoint, max_attempts=5, backoff_base=0.1, backoff_cap=0.3,
                sleep=fake_sleep, rng=lambda: 0.5,
            )
            try:
                with pytest.raises(ObjectStoreError, match="after 5 attempts"):
                    await store.put("k", b"v")
                assert len(proxy.requests) == 5
                assert delays == pytest.approx([0.05, 0.1, 0.15, 0.15])  # half of min(cap, base * 2^n)
                with pytest.raises(ObjectStoreError):
                    await store.get("k")
                assert len(proxy.requests) == 10
            finally:
                await store.close()

    asyncio.run(scenario())


def test_s3_unreachable_endpoint_gives_object_store_error(aws_env):
    async def scenario():
        store = open_store(
            "s3://bucket-x", endpoint_url=f"http://127.0.0.1:{free_port()}", max_attempts=3,
            backoff_base=0.001, connect_timeout=1,
        )
        try:
            with pytest.raises(ObjectStoreError):
                await store.get("k")
            assert store.stats["get"] == 3
        finally:
            await store.close()

    asyncio.run(scenario())


def test_s3_non_retryable_error_is_immediate(aws_env):
    async def scenario():
        store = open_store("s3://no-such-bucket-here", max_attempts=5)
        try:
            with pytest.raises(ObjectStoreError, match="NoSuchBucket"):
                await store.put("k", b"v")
            assert store.stats["put"] == 1
        finally:
            await store.close()

    asyncio.run(scenario())


def test_s3_failed_multipart_upload_is_aborted(aws_env):
    import boto3

    bucket = make_bucket(aws_env)
    data = os.urandom(11 * MiB)

    def policy(n, request_line):
        return 500 if "partNumber=2" in request_line else None

    async def scenario():
        async with FaultProxy(aws_env, policy) as proxy:
            store = retrying_store(bucket, proxy.endpoint, max_attempts=2, **S3_SMALL_MULTIPART)
            try:
                with pytest.raises(ObjectStoreError):
                    await store.put("big", data)
                assert any("uploadId=" in r and r.startswith("DELETE") for r in proxy.requests)
                with pytest.raises(ObjectNotFound):
                    await store.size("big")
            finally:
                await store.close()

    asyncio.run(scenario())
    uploads = boto3.client("s3", endpoint_url=aws_env).list_multipart_uploads(Bucket=bucket)
    assert uploads.get("Uploads", []) == []


def test_s3_multipart_part_retry_succeeds(aws_env):
    bucket = make_bucket(aws_env)
    data = os.urandom(11 * MiB)
    seen: set[str] = set()

    def policy(n, request_line):
        # every part fails once, then goes through
        if "partNumber=" in request_line and request_line not in seen:
            seen.add(request_line)
            return 503
        return None

    async def scenario():
        async with FaultProxy(aws_env, policy) as proxy:
            store = retrying_store(bucket, proxy.endpoint, **S3_SMALL_MULTIPART)
            try:
                await store.put("big", data)
                assert store.stats["retries"] == 3
                assert await store.get("big") == data
            finally:
                await store.close()

    asyncio.run(scenario())


# -- object names (tiering.layout) -----------------------------------------------------


TID = uuid.UUID("0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a")


def test_layout_keys_are_exact():
    assert layout.wal_key(3, 42) == "wal/3/00000000000000000042.wal"
    assert layout.wal_prefix() == "wal/" and layout.wal_prefix(3) == "wal/3/"
    base = layout.segment_key_base("orders.v1-eu", TID, 7, 1234, 5, "a1b2c3")
    assert base == "topics/orders.v1-eu-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/00000000000000001234-5-a1b2c3"
    assert (layout.LOG, layout.INDEX, layout.TIMEINDEX) == (".log", ".index", ".timeindex")
    assert layout.manifest_key("orders.v1-eu", TID, 7, 9) == (
        "manifests/orders.v1-eu-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/00000000000000000009.avro"
    )
    assert layout.partition_manifest_prefix("orders.v1-eu", TID, 7) == (
        "manifests/orders.v1-eu-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/"
    )
    assert layout.partition_segment_prefix("orders.v1-eu", TID, 7) == (
        "topics/orders.v1-eu-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/"
    )
    assert layout.topic_prefixes("orders.v1-eu", TID) == [
        "topics/orders.v1-eu-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/",
        "manifests/orders.v1-eu-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/",
    ]
    for ext in ("", ".log", ".index", ".timeindex"):
        assert layout.parse_segment_key(base + ext) == ("orders.v1-eu", TID, 7, 1234, 5, "a1b2c3", ext)
    assert layout.parse_wal_key("wal/3/00000000000000000042.wal") == (3, 42)
    assert layout.parse_manifest_key(layout.manifest_key("t", TID, 0, 12)) == ("t", TID, 0, 12)
    # zero padding makes key order equal number order
    keys = [layout.segment_key_base("t", TID, 0, n, 0, "u") for n in (10, 9, 100, 0)]
    assert sorted(keys) == [layout.segment_key_base("t", TID, 0, n, 0, "u") for n in (0, 9, 10, 100)]
    assert layout.wal_key(0, 2**63 - 1).startswith("wal/0/09223372036854775807")


@pytest.mark.parametrize(
    "call",
    [
        lambda: layout.wal_key(-1, 0),
        lambda: layout.wal_key(0, -1),
        lambda: layout.wal_key(0, 10**20),
        lambda: layout.segment_key_base("bad/topic", TID, 0, 0, 0, "u"),
        lambda: layout.segment_key_base("..", TID, 0, 0, 0, "u"),
        lambda: layout.segment_key_base("", TID, 0, 0, 0, "u"),
        lambda: layout.segment_key_base("t" * 250, TID, 0, 0, 0, "u"),
        lambda: layout.segment_key_base("t", str(TID), 0, 0, 0, "u"),
        lambda: layout.segment_key_base("t", TID, -1, 0, 0, "u"),
        lambda: layout.segment_key_base("t", TID, 0, 0, -1, "u"),
        lambda: layout.segment_key_base("t", TID, 0, 0, 0, "a-b"),
        lambda: layout.segment_key_base("t", TID, 0, 0, 0, ""),
        lambda: layout.segment_key_base("t", TID, True, 0, 0, "u"),
        lambda: layout.manifest_key("t", TID, 0, -3),
    ],
)
def test_layout_rejects_bad_parts(call):
    with pytest.raises(ValueError):
        call()


@pytest.mark.parametrize(
    "key",
    [
        "",
        "topics/",
        "wal/3/00000000000000000042.wal",
        "topics/orders/7/00000000000000001234-5-u.log",  # no topic id
        "topics/orders-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/1234-5-u.log",  # not padded
        "topics/orders-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/07/00000000000000001234-5-u.log",
        "topics/orders-0B5F2A64-93C1-4D7E-8A55-1F2E3D4C5B6A/7/00000000000000001234-5-u.log",
        "topics/orders-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/00000000000000001234-5-u.txt",
        "topics/orders-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/00000000000000001234--5-u.log",
        "topics/orders-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/x/00000000000000001234-5-u.log",
        "topics/-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/7/00000000000000001234-5-u.log",
        "topics/orders-0b5f2a64-93c1-4d7e-8a55-1f2e3d4c5b6a/٣/00000000000000001234-5-u.log",
    ],
)
def test_parse_segment_key_rejects_malformed(key):
    with pytest.raises(ValueError):
        layout.parse_segment_key(key)


@pytest.mark.parametrize(
    "key", ["wal/3/42.wal", "wal/x/00000000000000000042.wal", "wal/3/00000000000000000042", "wal/03/00000000000000000042.wal", "wal//00000000000000000042.wal", None]
)
def test_parse_wal_key_rejects_malformed(key):
    with pytest.raises(ValueError):
        layout.parse_wal_key(key)


# -- checksums -------------------------------------------------------------------------


@pytest.mark.unit
def test_check_crc32c_refuses_bytes_that_differ_from_the_stored_checksum():
    data = b"batch bytes" * 100
    stored = crc32c_checksum(data)
    check_crc32c("k", data, stored)
    check_crc32c("k", data, None)  # no checksum stored (a range, an older object)
    check_crc32c("k", b"other", stored + "-3")  # a multipart object's checksum of checksums
    with pytest.raises(CorruptObject, match="does not match") as caught:
        check_crc32c("topics/x.index", data[:-1] + b"!", stored)
    assert caught.value.key == "topics/x.index"


def test_s3_uploads_carry_a_crc32c_and_whole_reads_check_it(aws_env):
    """Single and multipart uploads store a CRC32C (the store checks it on the way in);
    an object whose bytes no longer match it is refused on a whole-object GET."""
    import boto3

    bucket = make_bucket(aws_env)
    raw = boto3.client("s3", endpoint_url=aws_env, region_name="us-east-1")
    small, big = os.urandom(1000), os.urandom(12 * MiB + 5)

    async def scenario(store):
        await store.put("a/small.index", small)
        await store.put("a/big.log", big)
        head = raw.head_object(Bucket=bucket, Key="p/a/small.index", ChecksumMode="ENABLED")
        assert head["ChecksumCRC32C"] == crc32c_checksum(small)
        head = raw.head_object(Bucket=bucket, Key="p/a/big.log", ChecksumMode="ENABLED")
        assert head["ChecksumCRC32C"]  # of the parts' CRC32Cs
        assert await store.get("a/big.log") == big  # ... which says nothing of the bytes alone
        assert await store.get("a/small.index") == small
        # Bit rot at rest: the bytes change, the stored checksum stays.
        damaged = bytearray(small)
        damaged[500] ^= 0x04
        raw.put_object(Bucket=bucket, Key="p/a/small.index", Body=bytes(damaged),
                       ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc32c_checksum(small))
        with pytest.raises(CorruptObject, match="CRC32C"):
            await store.get("a/small.index")
        # A range has no checksum of its own: the format's CRCs check those.
        assert await store.get("a/small.index", 0, 10) == bytes(damaged[:10])

    run_with(lambda **o: open_store(f"s3://{bucket}/p", **o), scenario, **S3_SMALL_MULTIPART)
