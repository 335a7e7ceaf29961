"""Copying every object of one store into another, each copy checked by its CRC-32C: how
`stratalog migrate` moves a data directory's file store into a bucket.

Rerunning a copy resumes it: an object the target already holds with the source's size
and CRC-32C is left alone, so after an interruption only what is missing or differs is
sent again (a half-sent object never exists: puts are whole). Each object goes through a
scratch file in READ_CHUNK reads, so memory stays bounded whatever the object's size.
After the put, the target's CRC-32C of the object is compared with the source's: the
one S3 keeps (`_holds`), else that of the bytes read back.

A `CrcJournal` remembers the source CRC-32C of every object checked, so a later pass
compares the target's checksum with it instead of reading the source again: objects
never change under their key (tiering.layout gives every upload a fresh one), so a
CRC-32C computed once stays the object's. The target is still checked every time.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
import crc32c

from stratalog.tiering.objectstore.base import (ObjectInfo, ObjectNotFound, ObjectStore, ObjectStoreError,
                                                crc32c_checksum_of)

READ_CHUNK = 8 * 1024 * 1024
JOURNAL_MAGIC = "STRATALOG-CRC32C-JOURNAL 1"


class CopyMismatch(ObjectStoreError):
    """The target's bytes of a copied object do not have the source's size and CRC-32C."""


@dataclass
class CopyReport:
    copied: int = 0  # objects sent
    skipped: int = 0  # objects the target already held, verified
    vanished: int = 0  # listed in the source but gone before they were read
    removed: int = 0  # target objects the source no longer has, deleted (`prune`)
    bytes_copied: int = 0


class CrcJournal:
    """The CRC-32C of objects of one source store already checked, by key and size, in a
    text file: a header line naming the store, then `<crc32c hex> <size> <key>` lines
    appended as objects are checked. A journal of another store is started over; a line
    cut short by a crash is ignored (that object is read again)."""

    def __init__(self, path: Path, source_url: str):
        self.path = path
        self._known: dict[tuple[str, int], int] = {}
        header = f"{JOURNAL_MAGIC} {source_url}"
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
        except FileNotFoundError:
            lines = []
        if not lines or lines[0] != header:
            lines = []
        for line in lines[1:-1]:  # the last piece is "" or a torn line
            crc, _, rest = line.partition(" ")
            size, _, key = rest.partition(" ")
            try:
                self._known[(key, int(size))] = int(crc, 16)
            except ValueError:
                continue
        if lines:
            self._out = open(path, "a", encoding="utf-8")
            if lines[-1]:
                self._out.write("\n")  # end the torn line so the next one stands alone
        else:
            self._out = open(path, "w", encoding="utf-8")
            self._out.write(header + "\n")
            self._out.flush()

    def get(self, key: str, size: int) -> int | None:
        return self._known.get((key, size))

    def add(self, key: str, size: int, crc: int) -> None:
        if self._known.get((key, size)) != crc:
            self._known[(key, size)] = crc
            self._out.write(f"{crc:08x} {size} {key}\n")
            self._out.flush()

    def close(self) -> None:
        self._out.close()


async def crc32c_of(store: ObjectStore, key: str, size: int, into: Path | None = None) -> int:
    """The CRC-32C of an object's `size` bytes, read in chunks; `into` receives the bytes.
    ObjectNotFound if absent, CopyMismatch if it is not `size` bytes long."""
    value, position = 0, 0
    out = open(into, "wb") if into is not None else None
    try:
        while position < size:
            chunk = await store.get(key, position, min(size, position + READ_CHUNK))
            if not chunk:
                break
            value = crc32c.crc32c(chunk, value)
            position += len(chunk)
            if out is not None:
                out.write(chunk)
        if position != size:
            raise CopyMismatch(f"{key} in {store.url} is not the {size} bytes it was listed with")
    finally:
        if out is not None:
            out.close()
    return value


async def copy_objects(source: ObjectStore, target: ObjectStore, scratch: Path, *,
                       parallel: int = 4, exclude: frozenset[str] = frozenset(), prune: bool = False,
                       journal: CrcJournal | None = None) -> CopyReport:
    """Copy every object of `source` (but `exclude`) into `target` under the same key,
    skipping those already there with a matching CRC-32C. With `prune`, target objects the
    source does not hold (but `exclude`) are deleted afterwards: only for a target that
    holds nothing but earlier passes of this copy. `scratch` is an empty directory;
    `journal` spares reading again the source objects an earlier pass checked."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    wanted = [o for o in await source.list("") if o.key not in exclude]
    present = {o.key: o.size for o in await target.list("")}
    report = CopyReport()
    queue = iter(wanted)  # shared by the lanes: each takes the next object when free

    async def lane(n: int) -> None:
        path = scratch / f"object-{n}"
        for obj in queue:
            try:
                sent = await _copy_one(source, target, obj, present.get(obj.key), path, journal)
            except ObjectNotFound:
                report.vanished += 1  # collected by the source's gateway meanwhile
                continue
            finally:
                path.unlink(missing_ok=True)
            if sent:
                report.copied += 1
                report.bytes_copied += obj.size
            else:
                report.skipped += 1

    await asyncio.gather(*(lane(n) for n in range(min(parallel, max(1, len(wanted))))))
    if prune:
        source_keys = {o.key for o in wanted}
        stale = sorted(k for k in present if k not in source_keys and k not in exclude)
        if stale:
            await target.delete(stale)
        report.removed = len(stale)
    return report


async def _copy_one(source: ObjectStore, target: ObjectStore, obj: ObjectInfo,
                    present_size: int | None, path: Path, journal: CrcJournal | None) -> bool:
    """Copy one object unless the target holds it already; whether it was sent."""
    if present_size == obj.size:
        known = journal.get(obj.key, obj.size) if journal is not None else None
        try:
            expected = known if known is not None else await crc32c_of(source, obj.key, obj.size)
            if await _holds(target, obj, expected):
                if journal is not None:
                    journal.add(obj.key, obj.size, expected)
                return False
        except (ObjectNotFound, CopyMismatch):
            pass  # gone or different in the target: sent below
    expected = await crc32c_of(source, obj.key, obj.size, into=path)
    await target.put_file(obj.key, path)
    try:
        if not await _holds(target, obj, expected):
            raise CopyMismatch(f"{obj.key} in {target.url} does not have the source's CRC-32C "
                               f"{expected:08x} after the copy")
    except ObjectNotFound:
        raise CopyMismatch(f"{obj.key} is not in {target.url} after it was written") from None
    if journal is not None:
        journal.add(obj.key, obj.size, expected)
    return True


async def _holds(target: ObjectStore, obj: ObjectInfo, expected: int) -> bool:
    """Whether the target's object has the CRC-32C `expected`. An S3 store is asked for
    the checksum it keeps: S3 computed it over the bytes it received and refused the put
    had it differed from the one sent, so a HEAD checks the stored bytes without
    downloading them. Otherwise (another store, or a multipart object, whose stored
    checksum covers its parts) the bytes are read back."""
    stored_crc32c = getattr(target, "stored_crc32c", None)
    if stored_crc32c is not None:
        stored = await stored_crc32c(obj.key)
        if stored is not None:
            return stored == crc32c_checksum_of(expected)
    return await crc32c_of(target, obj.key, obj.size) == expected
