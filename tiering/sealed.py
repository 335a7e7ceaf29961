"""The one reader of sealed segment objects, for the gateway and for Spark.

A sealed segment is a `.log` object of record batches with `.index` and `.timeindex`
sidecars (see `layout`). Reading it well means the same few things wherever it happens:
start at the position the sidecars prove safe, walk the batch headers, refuse framing that
cannot be right (a header that does not parse, offsets that go backwards or leave the
segment, a batch that runs past the object's end, an object shorter than its manifest
entry) and fetch a batch's body only when the reader wants it. The gateway does this
asynchronously through its cache, Spark's executors synchronously with ranged GETs, so the
walk is written once, without I/O: `walk` is a generator that yields a `Get` when it needs
bytes and is sent them back, and yields a `Batch` for each batch it takes. `read_sync` and
`read_async` are the two drivers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, Callable, Generator, Iterator, Union

from . import layout
from .batch import HEADER_SIZE, BatchHeader, CorruptBatch, crc_matches
from .errors import CorruptObject
from .index import OffsetIndex, TimeIndex


class CorruptSegment(CorruptObject):
    """A sealed segment fails its checks (framing, offsets, size, CRC): its bytes are never
    served as records."""


@dataclass(frozen=True)
class SegmentObject:
    """What a manifest entry says of one sealed segment."""

    key_base: str
    base_offset: int
    last_offset: int
    size: int  # bytes of the .log object
    # The object holding the batches when it is not `<key_base>.log`: a WAL object, whose
    # range of one partition is walked from its position to its end like a segment's bytes.
    object_key: str = ""

    @property
    def log_key(self) -> str:
        return self.object_key or self.key_base + layout.LOG


@dataclass(frozen=True)
class Get:
    """Bytes [start, end) of an object; the whole object when start is None."""

    key: str
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True)
class Batch:
    position: int  # in the .log object
    header: BatchHeader
    data: memoryview  # the whole batch, a view of bytes that are never changed


class Take(enum.Enum):
    TAKE = "take"  # fetch the body and yield it
    SKIP = "skip"  # step over it unread
    STOP = "stop"  # end the walk before it


Step = Union[Get, Batch]
Walk = Generator[Step, bytes, None]


def walk(seg: SegmentObject, take: Callable[[BatchHeader], Take], *,
         seek_offset: int | None = None, seek_ts: int | None = None,
         position: int = 0, end: int | None = None, chunk_bytes: int = 1 << 20,
         check_crc: bool = False) -> Walk:
    """Batches of `seg` from `position` to `end` (the object's size when None).

    `seek_offset` starts at the batch the offset index gives for it, `seek_ts` past the
    batches the time index proves older; both only move the start forward. `take` decides
    from each header; batches the walk passes are still checked for framing.
    """
    end = seg.size if end is None else end
    index: OffsetIndex | None = None
    if seek_offset is not None and seek_offset > seg.base_offset:
        index = yield from _offset_index(seg)
        position = max(position, index.lookup(seek_offset)[1])
    if seek_ts is not None:
        data = yield Get(seg.key_base + layout.TIMEINDEX)
        at = _parsed(seg, layout.TIMEINDEX, lambda: TimeIndex.from_bytes(seg.base_offset, data).lookup(seek_ts))
        if at > seg.base_offset:
            # A time index entry (T, O) says every batch before the one holding O is older than T.
            if index is None:
                index = yield from _offset_index(seg)
            position = max(position, index.lookup(at)[1])
    key = seg.log_key
    buf = _Window(key, seg.size, end, position, chunk_bytes)
    previous_end = seg.base_offset
    while position < end:
        if position + HEADER_SIZE > end:
            raise CorruptSegment(f"{key}: {end - position} trailing bytes at {position} are not a batch",
                                 key=key, position=position)
        view = yield from buf.bytes(position, HEADER_SIZE)
        try:
            h = BatchHeader.parse(view)
        except CorruptBatch as exc:
            raise CorruptSegment(f"{key} at byte {position}: {exc}", key=key, position=position) from exc
        if h.base_offset < previous_end or h.last_offset > seg.last_offset or h.last_offset_delta < 0:
            raise CorruptSegment(f"{key} at byte {position}: batch offsets {h.base_offset}..{h.last_offset} "
                                 f"do not follow {previous_end - 1} within segment "
                                 f"{seg.base_offset}..{seg.last_offset}", key=key, position=position)
        if position + h.size > end:
            raise CorruptSegment(f"{key}: batch at byte {position} runs past the end ({end})",
                                 key=key, position=position, offset=h.base_offset)
        previous_end = h.last_offset + 1
        verdict = take(h)
        if verdict is Take.STOP:
            return
        if verdict is Take.TAKE:
            whole = yield from buf.bytes(position, h.size)
            if check_crc and not crc_matches(whole, h):
                raise CorruptSegment(f"{key} batch at byte {position} (offset {h.base_offset}): CRC mismatch",
                                     key=key, position=position, offset=h.base_offset)
            yield Batch(position, h, whole)
        position += h.size


def _offset_index(seg: SegmentObject) -> Generator[Step, bytes, OffsetIndex]:
    data = yield Get(seg.key_base + layout.INDEX)
    return _parsed(seg, layout.INDEX, lambda: OffsetIndex.from_bytes(seg.base_offset, data))


def _parsed(seg: SegmentObject, ext: str, parse):
    try:
        return parse()
    except ValueError as exc:
        raise CorruptSegment(f"{seg.key_base}{ext}: {exc}", key=seg.key_base + ext) from exc


class _Window:
    """The bytes of the `.log` object the walk is at, fetched `chunk` bytes at a time."""

    def __init__(self, key: str, size: int, end: int, start: int, chunk: int) -> None:
        self.key, self.size, self.end, self.chunk = key, size, end, chunk
        self.buf = b""
        self.start = start  # object position of buf[0]

    def bytes(self, position: int, length: int) -> Generator[Step, bytes, memoryview]:
        offset = position - self.start
        if offset < 0 or offset + length > len(self.buf):
            keep = self.buf[offset:] if 0 <= offset < len(self.buf) else b""
            fetch_from = position + len(keep)
            fetch_to = min(self.end, max(position + length, fetch_from + self.chunk))
            data = yield Get(self.key, fetch_from, fetch_to)
            if len(data) != fetch_to - fetch_from:
                raise CorruptSegment(f"{self.key}: object ends at {fetch_from + len(data)}, "
                                     f"the manifest says {self.size}", key=self.key,
                                     position=fetch_from + len(data))
            self.buf = keep + data if keep else data
            self.start, offset = position, 0
        return memoryview(self.buf)[offset:offset + length]


def read_sync(steps: Walk, get: Callable[[Get], bytes]) -> Iterator[Batch]:
    """Drive a walk with a blocking `get`."""
    reply: bytes | None = None
    while True:
        try:
            step = steps.send(reply)  # type: ignore[arg-type]  # the first send must be None
        except StopIteration:
            return
        if isinstance(step, Get):
            reply = get(step)
        else:
            reply = None
            yield step


async def read_async(steps: Walk, get: Callable[[Get], Awaitable[bytes]]) -> AsyncIterator[Batch]:
    """Drive a walk with an awaitable `get`."""
    reply: bytes | None = None
    while True:
        try:
            step = steps.send(reply)  # type: ignore[arg-type]
        except StopIteration:
            return
        if isinstance(step, Get):
            reply = await get(step)
        else:
            reply = None
            yield step
