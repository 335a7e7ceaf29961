"""`file:///abs/path`: an object store on a local (or mounted) file system.

A key `a/b/c` is the file `<root>/a/b/c`. Puts are atomic: the bytes go to a temporary
file in the target directory (its name starts with TMP_PREFIX, so listings skip it), are
fsynced, renamed over the target, and the directory is fsynced, so a crash leaves either
the old object or the whole new one. Deletes unlink the object's file and prune directories
they leave empty. A reader that opened an object before its delete keeps reading all of its
bytes: the file lives on until that reader closes it, and no put ever writes into it. The
JVM Spark reader keeps an object open across its reads, and `stratalog migrate` copies
beside a gateway that collects WAL objects meanwhile; both rely on that.

A put of bytes leaves the page cache once it is on disk. Most such bytes are WAL objects,
a gateway's every produced byte, which only a recovery reads back (the local segments
cache what readers want); the rest are small (sidecars, manifests, snapshots) and a
first read brings them back. Kept, a WAL's pages would stay until a collection pass
frees thousands of objects' pages at once, and every put would then fill pages that had
to be found anew; dropped at each put, they are reused by the next. A file put
(`put_file`, a sealed segment linked from its local file) keeps its pages: they are the
read cache.
"""

from __future__ import annotations

import builtins  # the stores have a method named list
import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

from stratalog.tiering.objectstore.base import (
    ObjectData,
    ObjectInfo,
    ObjectNotFound,
    ObjectStoreError,
    check_key,
    check_range,
    data_size,
    new_stats,
)

TMP_PREFIX = ".tmp-"
# Where versions of 2026-11-27 to 2026-12-02 kept deleted objects' files, emptied, for later
# puts to write into; a reader holding one open then read its bytes vanish, or another
# object's. The first delete removes what such a version left.
_LEFT_SPARES = TMP_PREFIX + "spare"


class FileObjectStore:
    def __init__(self, root: Path | str) -> None:
        root = Path(root)
        if not root.is_absolute():
            raise ValueError(f"file object store root must be absolute: {root}")
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ObjectStoreError(f"cannot create object store root {root}: {exc}") from exc
        self.root = root
        self.url = root.as_uri()
        self.stats = new_stats()
        self._spares_left = (root / _LEFT_SPARES).is_dir()

    def __repr__(self) -> str:
        return f"FileObjectStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        parts = check_key(key).split("/")
        if any(p.startswith(TMP_PREFIX) for p in parts):
            raise ValueError(f"object key segment may not start with {TMP_PREFIX!r}: {key!r}")
        return self.root.joinpath(*parts)

    async def _run(self, op: str, fn, *args):
        try:
            return await asyncio.to_thread(fn, *args)
        except (ObjectNotFound, ValueError):
            raise
        except OSError as exc:
            self.stats["errors"] += 1
            raise ObjectStoreError(f"{op} failed under {self.root}: {exc}") from exc

    async def put(self, key: str, data: ObjectData) -> None:
        """Write a whole object; visible to readers only once complete."""
        path = self._path(key)
        self.stats["put"] += 1
        await self._run(f"put {key}", _write_atomically, path, data)
        self.stats["bytes_out"] += data_size(data)

    async def put_file(self, key: str, path: Path) -> None:
        """Write a local file as a whole object: hard-linked when it is on the same file
        system (a sealed segment is then written to disk once, not twice), else copied
        through a small buffer."""
        target = self._path(key)
        self.stats["put"] += 1
        size = await self._run(f"put {key}", _write_atomically, target, Path(path))
        self.stats["bytes_out"] += size

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of an object (end None: to its end); ObjectNotFound if absent."""
        check_range(start, end)
        path = self._path(key)
        self.stats["get"] += 1
        data = await self._run(f"get {key}", _read_range, path, key, start, end)
        self.stats["bytes_in"] += len(data)
        return data

    async def size(self, key: str) -> int:
        """The object's size in bytes; ObjectNotFound if absent."""
        path = self._path(key)
        self.stats["head"] += 1
        return await self._run(f"size {key}", _file_size, path, key)

    async def list(self, prefix: str) -> list[ObjectInfo]:
        """Every object whose key starts with prefix, sorted by key."""
        directory = _check_prefix(prefix)
        self.stats["list"] += 1
        return await self._run(f"list {prefix}", _list_files, self.root, directory, prefix)

    async def delete(self, keys: builtins.list[str]) -> None:
        """Delete objects; keys that do not exist are ignored. A key that is not valid
        deletes nothing (ValueError)."""
        if not keys:
            return
        self.stats["delete"] += 1
        # The keys become paths on the worker thread too: a collection pass deletes
        # thousands, tens of microseconds each.
        await self._run("delete", self._delete_keys, keys)

    def _delete_keys(self, keys: builtins.list[str]) -> None:
        if self._spares_left:
            shutil.rmtree(self.root / _LEFT_SPARES, ignore_errors=True)  # deleted objects' files
            self._spares_left = False
        _delete_files(self.root, [self._path(k) for k in keys])

    async def close(self) -> None:
        """Nothing to release."""


_COPY_BUFFER = 1024 * 1024
_DROP_CACHED = getattr(os, "POSIX_FADV_DONTNEED", None) if sys.platform == "linux" else None
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def _write_atomically(path: Path, data: ObjectData | Path) -> int:
    """Write `data` (or copy the file at that Path) to `path`: durable, and visible only
    once complete. Returns the bytes written."""
    # A concurrent delete may prune the directory between mkdir and taking the temporary
    # file; try again.
    for attempt in range(5):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=TMP_PREFIX, dir=path.parent)
            break
        except FileNotFoundError:
            if attempt == 4:
                raise
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)
            if isinstance(data, Path) and _linked(data, tmp):
                size = _fsync_file(tmp)  # the local file was never synced
            else:
                if isinstance(data, Path):
                    with open(data, "rb") as source:
                        shutil.copyfileobj(source, f, _COPY_BUFFER)
                elif isinstance(data, list):
                    _write_parts(f.fileno(), data)
                else:
                    f.write(data)
                f.flush()
                size = f.tell()
                os.fsync(f.fileno())
                if _DROP_CACHED is not None and not isinstance(data, Path):
                    os.posix_fadvise(f.fileno(), 0, 0, _DROP_CACHED)  # module docstring
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_directory(path.parent)
    return size


def _write_parts(fd: int, parts: list) -> None:
    """Write buffers one after another at the file's position, with as few writev calls as
    the system's iovec limit allows."""
    views = [memoryview(p).cast("B") for p in parts]
    first = 0
    while first < len(views):
        done = os.writev(fd, views[first:first + _IOV_MAX])
        while first < len(views) and done >= views[first].nbytes:
            done -= views[first].nbytes
            first += 1
        if done:  # a short write: go on from the first byte not written
            views[first] = views[first][done:]


def _linked(source: Path, tmp: str) -> bool:
    """Put a hard link to `source` at `tmp` (replacing the empty temporary file); False when
    the file systems differ or do not link, and the caller copies instead."""
    try:
        os.link(source, tmp + ".link")
    except OSError:
        return False
    os.replace(tmp + ".link", tmp)
    return True


def _fsync_file(path: str) -> int:
    """fsync a file by name; its size."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_range(path: Path, key: str, start: int, end: int | None) -> bytes:
    try:
        f = open(path, "rb")
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise ObjectNotFound(key) from None
    with f:
        size = os.fstat(f.fileno()).st_size
        stop = size if end is None else min(end, size)
        if start >= stop:
            return b""
        f.seek(start)
        data = f.read(stop - start)
    if len(data) != stop - start:
        raise ObjectStoreError(f"short read of {key}: {len(data)} of {stop - start} bytes")
    return data


def _file_size(path: Path, key: str) -> int:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ObjectNotFound(key) from None
    if not path.is_file():
        raise ObjectNotFound(key)
    return st.st_size


def _check_prefix(prefix: str) -> str:
    """The directory part of a valid list prefix; ValueError for one that is not."""
    directory = prefix.rpartition("/")[0]
    if directory:
        check_key(directory)
    elif prefix.startswith("/"):
        raise ValueError(f"list prefix must be relative: {prefix!r}")
    return directory


def list_files(root: Path, prefix: str) -> list[ObjectInfo]:
    """The objects under `root` whose key starts with `prefix`, sorted by key (blocking;
    Spark's listing of a file store)."""
    return _list_files(root, _check_prefix(prefix), prefix)


def _list_files(root: Path, directory: str, prefix: str) -> list[ObjectInfo]:
    base = root.joinpath(*directory.split("/")) if directory else root
    found: list[ObjectInfo] = []
    for dirpath, dirnames, filenames in os.walk(base):
        rel = os.path.relpath(dirpath, root)
        rel = "" if rel == "." else rel.replace(os.sep, "/") + "/"
        # Prune subtrees that cannot hold a matching key.
        dirnames[:] = [d for d in dirnames if not d.startswith(TMP_PREFIX)
                       and ((rel + d + "/").startswith(prefix) or prefix.startswith(rel + d + "/"))]
        for name in filenames:
            key = rel + name
            if name.startswith(TMP_PREFIX) or not key.startswith(prefix):
                continue
            try:
                size = os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:  # deleted while listing
                continue
            found.append(ObjectInfo(key, size))
    found.sort(key=lambda info: info.key)
    return found


def _delete_files(root: Path, paths: list[Path]) -> None:
    parents: set[Path] = set()
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        except IsADirectoryError:  # a "directory" is not an object: nothing to delete
            continue
        parents.add(path.parent)
    # Deepest first, so a parent emptied by its child's removal goes too.
    for directory in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        while directory != root and root in directory.parents:
            try:
                directory.rmdir()
            except OSError:  # not empty, or already gone
                break
            directory = directory.parent
