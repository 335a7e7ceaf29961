"""Disk faults on the object store, in process or in a real gateway process.

`FailingWrites` wraps any `ObjectStore`; while `fault()` names an errno and a key prefix,
writes under that prefix fail as the file store fails on a full or read-only disk:
`ObjectStoreError` caused by `OSError(errno)`. Reads, listings and deletes pass through.

Run as a script (`python tests/store_faults.py FAULT_FILE serve ...`), it is
`stratalog serve` whose object store is wrapped so: the fault is read from FAULT_FILE on
each write ("ENOSPC wal/" fails WAL uploads with errno 28, "HANG wal/" blocks them in a
thread as a hung disk does; no file, no fault), which lets a test fill, hang and empty the
"disk" of a gateway process from outside.
"""

from __future__ import annotations

import asyncio
import errno
import os
import sys
import time
from pathlib import Path
from typing import Callable

from stratalog.tiering.objectstore.base import ObjectStore, ObjectStoreError

Fault = tuple[int, str]  # (errno, key prefix)
HANG = -1  # not an errno: the write blocks its thread for an hour


class FailingWrites:
    """An object store whose puts fail while `fault()` returns (errno, prefix) for them."""

    def __init__(self, inner: ObjectStore, fault: Callable[[], Fault | None]):
        self.inner = inner
        self.fault = fault
        self.failed = 0

    async def _check(self, key: str) -> None:
        got = self.fault()
        if got is not None and key.startswith(got[1]):
            self.failed += 1
            if got[0] == HANG:
                # A hung disk: the writing thread is stuck in the kernel, uncancellable.
                await asyncio.to_thread(time.sleep, 3600)
            cause = OSError(got[0], os.strerror(got[0]))
            raise ObjectStoreError(f"put {key} failed: {cause}") from cause

    async def put(self, key: str, data) -> None:
        await self._check(key)
        await self.inner.put(key, data)

    async def put_file(self, key: str, path: Path) -> None:
        await self._check(key)
        await self.inner.put_file(key, path)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def fault_from_file(path: Path) -> Callable[[], Fault | None]:
    """The fault a file names ("ENOSPC wal/"); none while the file does not exist."""

    def read() -> Fault | None:
        try:
            name, _, prefix = path.read_text().strip().partition(" ")
        except FileNotFoundError:
            return None
        return (HANG if name == "HANG" else getattr(errno, name)), prefix

    return read


def _serve_with_faults(fault_file: Path, argv: list[str]) -> int:
    from stratalog.gateway import app
    from stratalog.infra.cli import main

    opened = app.open_store
    app.open_store = lambda url, **options: FailingWrites(opened(url, **options), fault_from_file(fault_file))
    return main(argv)


if __name__ == "__main__":
    sys.exit(_serve_with_faults(Path(sys.argv[1]), sys.argv[2:]))
