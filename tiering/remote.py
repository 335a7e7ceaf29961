"""Remote reads through a local disk cache of fixed-size chunks, with read-ahead."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections import OrderedDict
from pathlib import Path
from typing import Awaitable, Callable

from stratalog.tiering.objectstore.base import ObjectStore, ObjectStoreError

log = logging.getLogger(__name__)

_WHOLE = -1  # chunk index of an object cached whole by get_small
_SUFFIX = ".chunk"
_TMP_SUFFIX = ".partial"
_MAX_TRACKED_KEYS = 65536


class RemoteCache:
    """Serves byte ranges of immutable objects from chunk-aligned files on local disk.

    Chunk i of a key covers bytes [i * chunk_bytes, (i + 1) * chunk_bytes) clamped to the
    object's size, which is asked of the store once per key. A missing chunk costs one GET
    however many readers want it at once. The files together stay under `max_bytes`
    (least recently used go first); with `max_bytes` 0 nothing is kept and every read is a
    ranged GET. After two sequential chunk reads of one key the next chunk is fetched in
    the background. Objects never change once written, so nothing is
    revalidated; `invalidate` drops a prefix after deletion. The directory belongs to the
    cache: leftover chunk files from an earlier process are removed at start.
    """

    def __init__(
        self,
        store: ObjectStore,
        directory: Path,
        *,
        max_bytes: int,
        chunk_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        if max_bytes < 0 or chunk_bytes <= 0:
            raise ValueError(f"max_bytes must be >= 0 and chunk_bytes positive, got {max_bytes}, {chunk_bytes}")
        self.store = store
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.chunk_bytes = chunk_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        for entry in os.scandir(self.directory):
            if entry.is_file() and entry.name.endswith((_SUFFIX, _TMP_SUFFIX)):
                os.unlink(entry.path)
        self._lru: OrderedDict[tuple[str, int], int] = OrderedDict()  # (key, chunk) -> bytes on disk
        self._cached_bytes = 0
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._inflight: dict[tuple[str, int] | str, asyncio.Future] = {}
        self._streams: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> (last chunk, run)
        self._prefetches: set[asyncio.Task] = set()
        # Bumped by invalidate, so a fetch that started before it does not repopulate.
        self._generation = 0
        self.stats = dict.fromkeys(("hits", "misses", "gets", "bytes", "prefetches", "evictions", "sizes"), 0)

    @property
    def cached_bytes(self) -> int:
        return self._cached_bytes

    async def read(self, key: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of an object, clamped to its size."""
        if start < 0 or end < start:
            raise ValueError(f"bad byte range [{start}, {end})")
        if start == end:
            return b""
        if not self.max_bytes:
            self.stats["gets"] += 1
            data = await self.store.get(key, start, end)
            self.stats["bytes"] += len(data)
            return data
        size = await self._object_size(key)
        end = min(end, size)
        if start >= end:
            return b""
        first, last = start // self.chunk_bytes, (end - 1) // self.chunk_bytes
        chunks = await asyncio.gather(*(self._chunk(key, i, size) for i in range(first, last + 1)))
        self._note_read(key, first, last, size)
        base = first * self.chunk_bytes
        if len(chunks) == 1:
            return chunks[0][start - base : end - base]
        return b"".join(chunks)[start - base : end - base]

    async def get_small(self, key: str) -> bytes:
        """A whole (small) object, such as an index sidecar, cached as one entry."""

        async def fetch() -> bytes:
            data = await self.store.get(key)
            self._remember_size(key, len(data))
            return data

        if not self.max_bytes:
            return await fetch()
        return await self._cached((key, _WHOLE), fetch)

    def invalidate(self, prefix: str) -> None:
        """Forget every cached chunk, size and stream of keys starting with prefix."""
        self._generation += 1
        for entry in [e for e in self._lru if e[0].startswith(prefix)]:
            self._drop(entry)
        for key in [k for k in self._sizes if k.startswith(prefix)]:
            del self._sizes[key]
        for key in [k for k in self._streams if k.startswith(prefix)]:
            del self._streams[key]

    async def wait_prefetches(self) -> None:
        """Wait until the read-ahead started so far has landed (or failed)."""
        while self._prefetches:
            await asyncio.gather(*list(self._prefetches), return_exceptions=True)

    async def close(self) -> None:
        """Stop background read-ahead (the store is the caller's to close)."""
        tasks = list(self._prefetches)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- sizes -------------------------------------------------------------------------

    def _remember_size(self, key: str, size: int) -> None:
        self._sizes[key] = size
        self._sizes.move_to_end(key)
        while len(self._sizes) > _MAX_TRACKED_KEYS:
            self._sizes.popitem(last=False)

    async def _object_size(self, key: str) -> int:
        size = self._sizes.get(key)
        if size is not None:
            return size
        pending = self._inflight.get(key)
        if pending is None:

            async def ask() -> int:
                self.stats["sizes"] += 1
                n = await self.store.size(key)
                self._remember_size(key, n)
                return n

            pending = self._start(key, ask)
        return await asyncio.shield(pending)

    # -- chunks ------------------------------------------------------------------------

    async def _chunk(self, key: str, index: int, size: int, *, ahead: bool = False) -> bytes:
        start = index * self.chunk_bytes
        end = min(start + self.chunk_bytes, size)

        async def fetch() -> bytes:
            return await self.store.get(key, start, end)

        data = await self._cached((key, index), fetch, ahead=ahead)
        if len(data) != end - start:
            raise ObjectStoreError(f"{key}: chunk {index} is {len(data)} bytes, expected {end - start}")
        return data

    async def _cached(
        self, entry: tuple[str, int], fetch: Callable[[], Awaitable[bytes]], *, ahead: bool = False
    ) -> bytes:
        """The entry's bytes, from disk or one shared fetch; read-ahead (`ahead`) is not
        counted as a hit or miss."""
        counted = 0 if ahead else 1
        if entry in self._lru:
            self._lru.move_to_end(entry)
            data = await asyncio.to_thread(self._read_file, entry, self._lru[entry])
            if data is not None:
                self.stats["hits"] += counted
                return data
            self._drop(entry)  # evicted or damaged while we read it: fetch again
        pending = self._inflight.get(entry)
        if pending is not None:
            self.stats["hits"] += counted  # someone (maybe read-ahead) is already fetching it
        else:
            self.stats["misses"] += counted
            pending = self._start(entry, lambda: self._fetch(entry, fetch))
        return await asyncio.shield(pending)

    def _start(self, name: tuple[str, int] | str, work: Callable[[], Awaitable]) -> asyncio.Future:
        task = asyncio.ensure_future(work())
        self._inflight[name] = task

        def done(t: asyncio.Future) -> None:
            if self._inflight.get(name) is t:
                del self._inflight[name]
            if not t.cancelled():
                t.exception()  # retrieved here; the readers awaiting it re-raise it

        task.add_done_callback(done)
        return task

    async def _fetch(self, entry: tuple[str, int], fetch: Callable[[], Awaitable[bytes]]) -> bytes:
        generation = self._generation
        data = await fetch()
        self.stats["gets"] += 1
        self.stats["bytes"] += len(data)
        if generation == self._generation:
            try:
                await asyncio.to_thread(self._write_file, entry, data)
            except OSError as exc:  # a full or broken cache disk costs speed, not reads
                log.warning("cache write for %s failed: %s", entry[0], exc)
                return data
            if generation == self._generation and entry not in self._lru:
                self._lru[entry] = len(data)
                self._cached_bytes += len(data)
                self._evict()
            elif entry not in self._lru:
                self._unlink(entry)
        return data

    def _note_read(self, key: str, first: int, last: int, size: int) -> None:
        previous = self._streams.pop(key, None)
        if previous is not None and previous[0] <= first <= previous[0] + 1:
            run = previous[1] + (last - previous[0])
        else:
            run = last - first + 1
        self._streams[key] = (last, run)
        while len(self._streams) > _MAX_TRACKED_KEYS:
            self._streams.popitem(last=False)
        if run >= 2:
            self._prefetch(key, last + 1, size)

    def _prefetch(self, key: str, index: int, size: int) -> None:
        entry = (key, index)
        if index * self.chunk_bytes >= size or entry in self._lru or entry in self._inflight:
            return
        self.stats["prefetches"] += 1

        async def ahead() -> None:
            try:
                await self._chunk(key, index, size, ahead=True)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a later read will fetch it and report the failure
                log.debug("read-ahead of %s chunk %d failed: %s", key, index, exc)

        task = asyncio.ensure_future(ahead())
        self._prefetches.add(task)
        task.add_done_callback(self._prefetches.discard)

    # -- files -------------------------------------------------------------------------

    def _path(self, entry: tuple[str, int]) -> Path:
        digest = hashlib.sha256(entry[0].encode()).hexdigest()[:40]
        part = "w" if entry[1] == _WHOLE else str(entry[1])
        return self.directory / f"{digest}-{part}{_SUFFIX}"

    def _read_file(self, entry: tuple[str, int], expected: int) -> bytes | None:
        try:
            data = self._path(entry).read_bytes()
        except FileNotFoundError:
            return None
        return data if len(data) == expected else None

    def _write_file(self, entry: tuple[str, int], data: bytes) -> None:
        path = self._path(entry)
        tmp = path.with_name(path.name + _TMP_SUFFIX)
        # No fsync: the cache is rebuilt from the store after a crash.
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def _unlink(self, entry: tuple[str, int]) -> None:
        try:
            os.unlink(self._path(entry))
        except FileNotFoundError:
            pass

    def _drop(self, entry: tuple[str, int]) -> None:
        size = self._lru.pop(entry, None)
        if size is not None:
            self._cached_bytes -= size
            self._unlink(entry)

    def _evict(self) -> None:
        while self._cached_bytes > self.max_bytes and self._lru:
            entry = next(iter(self._lru))
            self._drop(entry)
            self.stats["evictions"] += 1
