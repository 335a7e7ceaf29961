"""RemoteCache over a real file object store: chunking, GET counts, LRU, read-ahead."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest

from stratalog.tiering.objectstore import ObjectNotFound, open_store
from stratalog.tiering.remote import RemoteCache

pytestmark = pytest.mark.unit

CHUNK = 1000


def chunk_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.name.endswith(".chunk"))


def run(tmp_path: Path, scenario, *, max_bytes: int = 100 * CHUNK, objects: dict[str, bytes] | None = None):
    async def main():
        store = open_store((tmp_path / "store").as_uri())
        for key, data in (objects or {}).items():
            await store.put(key, data)
        base = dict(store.stats)
        cache = RemoteCache(store, tmp_path / "cache", max_bytes=max_bytes, chunk_bytes=CHUNK)
        try:
            return await scenario(cache, store, lambda op: store.stats[op] - base[op])
        finally:
            await cache.close()
            await store.close()

    return asyncio.run(main())


def test_reads_are_byte_exact_and_one_get_per_missing_chunk(tmp_path):
    data = os.urandom(10 * CHUNK + 321)
    rng = random.Random(7)

    async def scenario(cache, store, count):
        assert await cache.read("seg.log", 1500, 3700) == data[1500:3700]  # chunks 1, 2, 3
        await cache.wait_prefetches()
        # a read spanning chunks is sequential, so chunk 4 was fetched ahead
        assert count("get") == 4 and count("head") == 1
        assert cache.stats["misses"] == 3 and cache.stats["prefetches"] == 1
        assert cache.stats["gets"] == 4 and cache.stats["bytes"] == 4 * CHUNK
        assert await cache.read("seg.log", 2000, 2999) == data[2000:2999]  # cached
        assert await cache.read("seg.log", 4000, 4999) == data[4000:4999]  # read ahead
        assert count("get") == 4 and cache.stats["hits"] == 2
        for _ in range(200):
            a = rng.randrange(len(data))
            b = rng.randrange(a, len(data) + 1)
            assert await cache.read("seg.log", a, b) == data[a:b]
        await cache.wait_prefetches()
        assert count("get") == 11  # every chunk fetched exactly once (last one is short)
        assert count("head") == 1  # the size is asked once per key
        assert cache.stats["bytes"] == len(data)

    run(tmp_path, scenario, objects={"seg.log": data})


def test_clamping_and_bad_ranges(tmp_path):
    data = os.urandom(2 * CHUNK + 10)

    async def scenario(cache, store, count):
        assert await cache.read("o", 2 * CHUNK, 10**9) == data[2 * CHUNK :]
        assert await cache.read("o", len(data), len(data) + 5) == b""
        assert await cache.read("o", 10**9, 10**9 + 1) == b""
        assert await cache.read("o", 5, 5) == b""
        with pytest.raises(ValueError):
            await cache.read("o", -1, 3)
        with pytest.raises(ValueError):
            await cache.read("o", 9, 3)
        with pytest.raises(ObjectNotFound):
            await cache.read("missing", 0, 10)
        await store.put("empty", b"")
        assert await cache.read("empty", 0, 100) == b""

    run(tmp_path, scenario, objects={"o": data})


def test_concurrent_readers_share_one_get(tmp_path):
    data = os.urandom(4 * CHUNK)

    async def scenario(cache, store, count):
        results = await asyncio.gather(*(cache.read("o", 100 + i, 900 + i) for i in range(20)))
        assert results == [data[100 + i : 900 + i] for i in range(20)]
        assert count("get") == 1 and count("head") == 1

    run(tmp_path, scenario, objects={"o": data})


def test_lru_eviction_keeps_disk_under_budget(tmp_path):
    data = os.urandom(8 * CHUNK)

    async def scenario(cache, store, count):
        for i in (0, 2, 4):  # one chunk at a time; non-sequential, so no read-ahead
            await cache.read("o", i * CHUNK, i * CHUNK + 10)
        await cache.read("o", 0, 10)  # chunk 0 becomes the most recent
        await cache.read("o", 6 * CHUNK, 6 * CHUNK + 10)  # evicts chunk 2, the least recent
        assert cache.stats["evictions"] == 1
        assert cache.cached_bytes == 3 * CHUNK
        assert sum(p.stat().st_size for p in chunk_files(tmp_path / "cache")) == 3 * CHUNK
        gets = count("get")
        await cache.read("o", 0, 10)
        await cache.read("o", 4 * CHUNK, 4 * CHUNK + 10)
        assert count("get") == gets  # still cached
        assert await cache.read("o", 2 * CHUNK, 2 * CHUNK + 10) == data[2 * CHUNK : 2 * CHUNK + 10]
        assert count("get") == gets + 1  # evicted, fetched again
        assert cache.cached_bytes <= 3 * CHUNK

    run(tmp_path, scenario, max_bytes=3 * CHUNK, objects={"o": data})


def test_read_ahead_after_two_sequential_chunks(tmp_path):
    data = os.urandom(4 * CHUNK + 1)

    async def scenario(cache, store, count):
        await cache.read("o", 0, 500)
        await cache.read("o", 500, CHUNK)  # same chunk: not a new sequential chunk
        await cache.wait_prefetches()
        assert cache.stats["prefetches"] == 0
        await cache.read("o", CHUNK, CHUNK + 500)  # second chunk in a row
        await cache.wait_prefetches()
        assert cache.stats["prefetches"] == 1 and count("get") == 3
        assert await cache.read("o", 2 * CHUNK, 3 * CHUNK) == data[2 * CHUNK : 3 * CHUNK]
        await cache.wait_prefetches()
        assert count("get") == 4 and cache.stats["prefetches"] == 2  # chunk 3 fetched ahead
        assert await cache.read("o", 3 * CHUNK, 4 * CHUNK + 1) == data[3 * CHUNK :]  # 3 and the 1-byte chunk 4
        await cache.wait_prefetches()
        assert count("get") == 5 and cache.stats["prefetches"] == 2  # nothing past the end
        assert cache.stats["misses"] == 3

    run(tmp_path, scenario, objects={"o": data})


def test_no_read_ahead_for_random_access(tmp_path):
    data = os.urandom(10 * CHUNK)

    async def scenario(cache, store, count):
        for i in (5, 1, 8, 3, 9, 0):
            await cache.read("o", i * CHUNK + 1, i * CHUNK + 2)
        await cache.wait_prefetches()
        assert cache.stats["prefetches"] == 0 and count("get") == 6

    run(tmp_path, scenario, objects={"o": data})


def test_reader_joins_a_prefetch_in_flight(tmp_path):
    data = os.urandom(3 * CHUNK)

    async def scenario(cache, store, count):
        await cache.read("o", 0, 2 * CHUNK)  # two chunks at once: read-ahead of chunk 2 starts
        assert cache.stats["prefetches"] == 1
        assert await cache.read("o", 2 * CHUNK, 3 * CHUNK) == data[2 * CHUNK :]
        assert count("get") == 3  # the reader waited for the prefetch instead of a second GET

    run(tmp_path, scenario, objects={"o": data})


def test_get_small_caches_whole_objects_and_invalidate(tmp_path):
    index = os.urandom(1234)

    async def scenario(cache, store, count):
        key = "topics/t-x/0/00000000000000000000-0-a.index"
        assert await cache.get_small(key) == index
        assert await cache.get_small(key) == index
        assert count("get") == 1 and cache.stats["hits"] == 1
        # the size learned from the whole object spares a size request on ranged reads
        assert await cache.read(key, 10, 20) == index[10:20]
        assert count("head") == 0
        await cache.read("topics/t-x/0/seg.log", 0, 10)
        await cache.read("keep/o", 0, 10)
        assert len(chunk_files(tmp_path / "cache")) == 4
        cache.invalidate("topics/t-x/")
        assert len(chunk_files(tmp_path / "cache")) == 1
        assert cache.cached_bytes == 10  # keep/o's one short chunk
        await store.delete([key])
        with pytest.raises(ObjectNotFound):
            await cache.get_small(key)
        with pytest.raises(ObjectNotFound):
            await cache.read(key, 0, 10)

    run(tmp_path, scenario, objects={
        "topics/t-x/0/00000000000000000000-0-a.index": index,
        "topics/t-x/0/seg.log": os.urandom(100),
        "keep/o": os.urandom(10),
    })


def test_damaged_cache_file_is_refetched(tmp_path):
    data = os.urandom(2 * CHUNK)

    async def scenario(cache, store, count):
        await cache.read("o", 0, 10)
        (path,) = chunk_files(tmp_path / "cache")
        path.write_bytes(b"short")  # truncated behind the cache's back
        assert await cache.read("o", 0, CHUNK) == data[:CHUNK]
        assert count("get") == 2
        path.unlink()
        assert await cache.read("o", 0, CHUNK) == data[:CHUNK]
        assert count("get") == 3

    run(tmp_path, scenario, objects={"o": data})


def test_leftover_files_are_cleared_at_start(tmp_path):
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    (cache_dir / "stale-0.chunk").write_bytes(b"old")
    (cache_dir / "stale-1.chunk.partial").write_bytes(b"old")
    (cache_dir / "unrelated.txt").write_bytes(b"keep")

    async def scenario(cache, store, count):
        assert sorted(p.name for p in cache_dir.iterdir()) == ["unrelated.txt"]
        assert cache.cached_bytes == 0

    run(tmp_path, scenario)


def test_bad_configuration(tmp_path):
    store = open_store((tmp_path / "s").as_uri())
    with pytest.raises(ValueError):
        RemoteCache(store, tmp_path / "c", max_bytes=-1)
    with pytest.raises(ValueError):
        RemoteCache(store, tmp_path / "c", max_bytes=10, chunk_bytes=0)


def test_size_zero_reads_straight_from_the_store(tmp_path):
    data = os.urandom(5 * CHUNK + 17)

    async def scenario(cache, store, count):
        assert await cache.read("seg.log", 1500, 3700) == data[1500:3700]
        assert await cache.read("seg.log", 5000, 9000) == data[5000:]
        assert await cache.get_small("seg.log") == data
        await cache.wait_prefetches()
        assert count("get") == 3 and cache.stats["prefetches"] == 0
        assert chunk_files(tmp_path / "cache") == []
        with pytest.raises(ObjectNotFound):
            await cache.read("missing.log", 0, 10)

    run(tmp_path, scenario, max_bytes=0, objects={"seg.log": data})
