"""The file store's spare files: deleted objects' files, emptied and kept to become later
puts' temporary files, so that a put (a WAL flush, above all) does not create a file.

Creating a file allocates an inode and deleting one frees it, and a WAL does both hundreds
of times a second. On ext4 without a journal (the build machine's file system), allocating
an inode walks past every inode its block group freed recently, which are not reused so
soon: under that churn one create cost about a millisecond of CPU, a third of a WAL flush,
and making files ahead of need on another thread only moved that CPU. So a delete moves the
object's file into SPARE_DIR and empties it (unless another name links the file, as a
sealed segment's local file does), and a put renames one out of there: a rename each way,
and no inode allocated or freed.

The directory and its files are named with TMP_PREFIX, so listings skip them. A process
claims a file by renaming it away, so processes sharing a root never write into one file;
the names a process remembers are only hints, read once from the directory.
"""

from __future__ import annotations

import os
import stat
import threading
import uuid
from pathlib import Path

TMP_PREFIX = ".tmp-"
SPARE_DIR = TMP_PREFIX + "spare"
# The WAL objects a collection pass deletes at once, at a few hundred flushes a second.
# Each kept file is an empty inode.
KEPT_FILES = 16384


class SpareFiles:
    def __init__(self, root: Path, kept: int = KEPT_FILES) -> None:
        self.directory = root / SPARE_DIR
        self.kept = kept
        self._lock = threading.Lock()
        self._names: list[str] | None = None  # read from the directory at first use

    def _known(self) -> list[str]:
        if self._names is None:
            try:
                found = [n for n in os.listdir(self.directory) if n.startswith(TMP_PREFIX)]
            except FileNotFoundError:
                found = []
            self._names = found[: self.kept]
        return self._names

    def claim(self, directory: Path) -> str | None:
        """The path of a spare file moved into `directory` under a temporary name, or None
        when there is none. The file may still hold a deleted object's bytes."""
        while True:
            with self._lock:
                names = self._known()
                if not names:
                    return None
                name = names.pop()
            source = self.directory / name
            tmp = os.path.join(directory, TMP_PREFIX + uuid.uuid4().hex)
            try:
                os.rename(source, tmp)
                return tmp
            except FileNotFoundError:
                if not source.exists():
                    continue  # another process took it
                with self._lock:  # `directory` is gone (a concurrent delete pruned it)
                    names.append(name)
                raise

    def keep(self, path: Path) -> bool:
        """Move the file of a deleted object here, emptied. False when the caller should
        unlink it instead: enough are kept, or another name links the file."""
        with self._lock:
            if len(self._known()) >= self.kept:
                return False
        found = os.stat(path)  # FileNotFoundError: nothing to delete
        if found.st_nlink != 1 or not stat.S_ISREG(found.st_mode):
            return False
        spare = self.directory / (TMP_PREFIX + uuid.uuid4().hex)
        try:
            self.directory.mkdir(exist_ok=True)
            os.rename(path, spare)
        except FileNotFoundError:
            raise
        except OSError:  # another file system under the root
            return False
        os.truncate(spare, 0)
        with self._lock:
            self._known().append(spare.name)
        return True
