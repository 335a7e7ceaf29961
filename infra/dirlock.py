"""An exclusive flock on a file in a directory, held while one command works there: a second
command on the same directory is refused at once, in one line, instead of racing the first.
Closing the descriptor (or the process ending, however it ends) releases it."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class DirectoryLock:
    """`path` locked on entry; `busy` is the refusal when another process holds it, and
    every failure raises `error` (one line)."""

    def __init__(self, path: Path, *, busy: str, error: type[Exception]):
        self.path = Path(path)
        self.busy = busy
        self.error = error
        self._fd: int | None = None

    def __enter__(self) -> "DirectoryLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise self.error(f"cannot lock {self.path}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self.error(self.busy) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
