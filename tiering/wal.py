"""The WAL object: one per gateway flush, holding the new batches of many partitions."""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

import crc32c

from stratalog.tiering.errors import CorruptObject, UnsupportedFormat, unsupported_version

MAGIC = b"SLWL"
FORMAT_VERSION = 1  # written; readers take OLDEST_READABLE_VERSION..FORMAT_VERSION
OLDEST_READABLE_VERSION = 1

_HEADER = struct.Struct(">4sHH")  # magic, version, flags
_ENTRY = struct.Struct(">16siqqqQQI")  # topic id, partition, base, last, max ts, position, length, crc
_TRAILER = struct.Struct(">QIIHH4s")  # footer position, count, footer crc, version, flags, magic

HEADER_SIZE = _HEADER.size  # 8
ENTRY_SIZE = _ENTRY.size  # 64
TRAILER_SIZE = _TRAILER.size  # 24
# Bytes of the trailer covered by the footer CRC: footer position and count.
_TRAILER_CRC_COVERED = 12

_INT32_MAX = 2**31 - 1
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class WalRangeInfo:
    """Where one partition's batches sit in a WAL object, and what they cover."""

    topic_id: uuid.UUID
    partition: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    position: int
    length: int
    crc: int

    @property
    def end(self) -> int:
        """One past the range's last byte in the object."""
        return self.position + self.length


class WalBuilder:
    """Collects batches of many partitions and lays them out as one WAL object.

    Byte layout (integers big-endian, positions from the object's first byte):

        header   (8 bytes)
          0   magic          4 bytes  b"SLWL"
          4   version        uint16   FORMAT_VERSION
          6   flags          uint16   0 (reserved; readers reject anything else)
        body
          one range per (topic id, partition), back to back from byte 8, in the order
          the partitions were first added; a range is that partition's batches
          concatenated in offset order, stored as opaque bytes
        footer   (64 bytes per range, in body order)
          0   topic id       16 bytes (UUID, big-endian)
          16  partition      int32
          20  base offset    int64    first offset of the range's first batch
          28  last offset    int64    last offset of the range's last batch
          36  max timestamp  int64    largest batch max timestamp in the range
          44  position       uint64   the range's first byte
          52  length         uint64   the range's size in bytes (> 0)
          60  crc            uint32   CRC-32C of the range's bytes
        trailer  (24 bytes, the object's last bytes)
          0   footer position uint64  where the footer starts (= end of the body)
          8   range count    uint32
          12  footer crc     uint32   CRC-32C of the footer followed by trailer bytes 0..11
          16  version        uint16   FORMAT_VERSION
          18  flags          uint16   0 (reserved; readers reject anything else)
          20  magic          4 bytes  b"SLWL"

    Versions: header and trailer carry FORMAT_VERSION; a reader refuses a version outside
    OLDEST_READABLE_VERSION..FORMAT_VERSION with UnsupportedFormat before reading anything
    else. A leader reading one range never sees header or trailer, so the coordinator's
    entry for the object repeats the version (`WalObject.format_version`) and the reader
    passes it to `check_version` first.

    Invariants: each (topic id, partition) appears once; ranges tile the body exactly
    (the first starts at 8, each starts where the previous ended, the last ends at the
    footer position); base offset <= last offset; the object is footer position + 64 *
    count + 24 bytes long. A reader GETs the last TRAILER_SIZE bytes (or more), asks
    `footer_size` how many tail bytes hold the footer, and a recovering leader then
    fetches only its own range with one ranged GET and checks it with `range_bytes`.
    """

    def __init__(self) -> None:
        # (topic_id, partition) -> [batches, base, last, max_ts, size]; dicts keep insertion order.
        self._ranges: dict[tuple[uuid.UUID, int], list] = {}
        self._size = 0

    def add(
        self,
        topic_id: uuid.UUID,
        partition: int,
        base_offset: int,
        last_offset: int,
        max_timestamp: int,
        batch: bytes | bytearray | memoryview,
        *,
        copy: bool = True,
    ) -> None:
        """Append one batch of a partition; its offsets must follow the partition's last batch.

        A mutable batch is copied (its owner may reuse the buffer before the flush) unless
        `copy` is False: the caller hands it over and never changes it again."""
        if not isinstance(topic_id, uuid.UUID):
            raise ValueError(f"topic_id must be a uuid.UUID, got {type(topic_id).__name__}")
        if not 0 <= partition <= _INT32_MAX:
            raise ValueError(f"partition out of range: {partition}")
        if not 0 <= base_offset <= last_offset <= _INT64_MAX:
            raise ValueError(f"bad offsets: base {base_offset}, last {last_offset}")
        if not _INT64_MIN <= max_timestamp <= _INT64_MAX:
            raise ValueError(f"max_timestamp out of range: {max_timestamp}")
        data = batch if isinstance(batch, bytes) or not copy else bytes(batch)
        if not data:
            raise ValueError("empty batch")
        slot = self._ranges.get((topic_id, partition))
        if slot is None:
            self._ranges[(topic_id, partition)] = [[data], base_offset, last_offset, max_timestamp, len(data)]
        else:
            if base_offset <= slot[2]:
                raise ValueError(
                    f"batch at offset {base_offset} of {topic_id}/{partition} does not follow "
                    f"last offset {slot[2]}"
                )
            slot[0].append(data)
            slot[2] = last_offset
            slot[3] = max(slot[3], max_timestamp)
            slot[4] += len(data)
        self._size += len(data)

    def discard(self, topic_id: uuid.UUID, partition: int) -> bool:
        """Drop every pending batch of one partition (its leadership moved before the flush)."""
        slot = self._ranges.pop((topic_id, partition), None)
        if slot is None:
            return False
        self._size -= slot[4]
        return True

    @property
    def size(self) -> int:
        """Batch bytes pending (the object adds 8 + 64 per partition + 24)."""
        return self._size

    def __len__(self) -> int:
        return self._size

    @property
    def empty(self) -> bool:
        return not self._ranges

    @property
    def partitions(self) -> int:
        """How many (topic id, partition) ranges the object will hold."""
        return len(self._ranges)

    def build(self) -> tuple[bytes, list[WalRangeInfo]]:
        """The object's bytes and its ranges; the builder is left unchanged."""
        pieces, infos = self.build_parts()
        return b"".join(pieces), infos

    def build_parts(self) -> tuple[list[bytes | bytearray | memoryview], list[WalRangeInfo]]:
        """The object's bytes as the parts that follow one another in it (the batches are
        not copied into one buffer), and its ranges; the builder is left unchanged."""
        pieces: list[bytes | bytearray | memoryview] = [_HEADER.pack(MAGIC, FORMAT_VERSION, 0)]
        infos: list[WalRangeInfo] = []
        position = HEADER_SIZE
        for (topic_id, partition), (batches, base, last, max_ts, length) in self._ranges.items():
            crc = 0
            for data in batches:
                crc = crc32c.crc32c(data, crc)
            pieces.extend(batches)
            infos.append(WalRangeInfo(topic_id, partition, base, last, max_ts, position, length, crc))
            position += length
        footer = b"".join(
            _ENTRY.pack(i.topic_id.bytes, i.partition, i.base_offset, i.last_offset,
                        i.max_timestamp, i.position, i.length, i.crc)
            for i in infos
        )
        covered = struct.pack(">QI", position, len(infos))  # trailer bytes 0..11
        footer_crc = crc32c.crc32c(covered, crc32c.crc32c(footer))
        pieces.append(footer)
        pieces.append(_TRAILER.pack(position, len(infos), footer_crc, FORMAT_VERSION, 0, MAGIC))
        return pieces, infos


def check_version(version: int, key: str | None = None) -> None:
    """UnsupportedFormat unless this code reads WAL objects of `version`."""
    if not OLDEST_READABLE_VERSION <= version <= FORMAT_VERSION:
        raise UnsupportedFormat(unsupported_version(
            f"WAL object {key}" if key else "WAL object", version, OLDEST_READABLE_VERSION,
            FORMAT_VERSION))


def _unpack_trailer(tail: bytes | bytearray | memoryview, key: str | None) -> tuple[int, int, int]:
    if len(tail) < TRAILER_SIZE:
        raise CorruptObject(f"WAL tail of {len(tail)} bytes is shorter than the {TRAILER_SIZE}-byte trailer")
    footer_position, count, footer_crc, version, flags, magic = _TRAILER.unpack_from(tail, len(tail) - TRAILER_SIZE)
    if magic != MAGIC:
        raise CorruptObject(f"not a WAL object: trailer magic {bytes(magic)!r}")
    check_version(version, key)
    if flags != 0:
        raise CorruptObject(f"WAL trailer has flags {flags:#x}; version {version} defines none")
    return footer_position, count, footer_crc


def footer_size(tail: bytes | bytearray | memoryview, key: str | None = None) -> int:
    """How many bytes at the end of the object hold footer and trailer.

    `tail` is at least the object's last TRAILER_SIZE bytes; `key` only names the object
    in errors."""
    _, count, _ = _unpack_trailer(tail, key)
    return count * ENTRY_SIZE + TRAILER_SIZE


def read_footer(data_tail: bytes | bytearray | memoryview, key: str | None = None) -> list[WalRangeInfo]:
    """Parse and check the footer from the object's last bytes (at least `footer_size`)."""
    tail = memoryview(data_tail)
    footer_position, count, footer_crc = _unpack_trailer(tail, key)
    need = count * ENTRY_SIZE + TRAILER_SIZE
    if len(tail) < need:
        raise CorruptObject(f"WAL footer needs the last {need} bytes, got {len(tail)}")
    start = len(tail) - need
    footer = tail[start : start + count * ENTRY_SIZE]
    trailer = tail[len(tail) - TRAILER_SIZE :]
    if crc32c.crc32c(trailer[:_TRAILER_CRC_COVERED], crc32c.crc32c(footer)) != footer_crc:
        raise CorruptObject("WAL footer CRC mismatch")
    infos: list[WalRangeInfo] = []
    seen: set[tuple[uuid.UUID, int]] = set()
    position = HEADER_SIZE
    for i in range(count):
        raw_id, partition, base, last, max_ts, pos, length, crc = _ENTRY.unpack_from(footer, i * ENTRY_SIZE)
        info = WalRangeInfo(uuid.UUID(bytes=raw_id), partition, base, last, max_ts, pos, length, crc)
        # A CRC-valid footer that breaks the layout was written wrong; refuse it all the same.
        if pos != position or length <= 0:
            raise CorruptObject(f"WAL range {i} at {pos}+{length} does not follow the previous range at {position}")
        if partition < 0 or not 0 <= base <= last:
            raise CorruptObject(f"WAL range {i} has bad partition or offsets: {info}")
        if (info.topic_id, partition) in seen:
            raise CorruptObject(f"WAL footer lists {info.topic_id}/{partition} twice")
        seen.add((info.topic_id, partition))
        infos.append(info)
        position += length
    if position != footer_position:
        raise CorruptObject(f"WAL ranges end at {position}, footer starts at {footer_position}")
    return infos


def object_size(data_tail: bytes | bytearray | memoryview, key: str | None = None) -> int:
    """The whole object's size, as the trailer states it."""
    footer_position, count, _ = _unpack_trailer(data_tail, key)
    return footer_position + count * ENTRY_SIZE + TRAILER_SIZE


def range_bytes(
    data: bytes | bytearray | memoryview,
    info: WalRangeInfo,
    verify: bool = True,
    base: int = 0,
) -> memoryview:
    """The bytes of one range, CRC-checked.

    `data` holds the object's bytes from position `base` on: the whole object (base 0), or
    only what a ranged GET returned (base = info.position)."""
    view = memoryview(data)
    start = info.position - base
    if start < 0 or start + info.length > len(view):
        raise CorruptObject(
            f"WAL range {info.position}+{info.length} is outside the {len(view)} bytes given from {base}"
        )
    out = view[start : start + info.length]
    if verify and crc32c.crc32c(out) != info.crc:
        raise CorruptObject(f"WAL range of {info.topic_id}/{info.partition} at {info.position}: CRC mismatch")
    return out


def read_wal(data: bytes | bytearray | memoryview,
             key: str | None = None) -> list[tuple[WalRangeInfo, memoryview]]:
    """Check a whole WAL object and return each range with its bytes (`key` only names
    the object in errors)."""
    view = memoryview(data)
    if len(view) < HEADER_SIZE + TRAILER_SIZE:
        raise CorruptObject(f"WAL object of {len(view)} bytes is too short")
    magic, version, flags = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise CorruptObject(f"not a WAL object: header magic {bytes(magic)!r}")
    check_version(version, key)
    if flags != 0:
        raise CorruptObject(f"WAL header has flags {flags:#x}; version {version} defines none")
    expected = object_size(view, key)
    if expected != len(view):
        raise CorruptObject(f"WAL object is {len(view)} bytes, its trailer says {expected}")
    return [(info, range_bytes(view, info)) for info in read_footer(view, key)]


# --- commit confirmations --------------------------------------------------------------
#
# A WAL object may hold one more range, under the reserved topic id CONFIRMATION_TOPIC_ID
# (the nil UUID, never a topic's), that no coordinator entry names: the sequences of the
# same gateway's earlier WAL objects whose commit the coordinator accepted, as the writer
# knew them when it built this object. It is what lets `stratalog recover --from-bucket`
# prove a commit from the bucket alone (engine.bucket_recovery). Its bytes:
#
#     0   magic          4 bytes  b"SLWC"
#     4   version        uint16   CONFIRMATION_VERSION
#     6   count          uint32   intervals that follow
#     10  intervals      count x (first uint64, last uint64): committed sequences
#                        first..last, sorted, disjoint
#
# The range's base and last offsets are the first and last sequence it confirms, its
# partition 0. Readers of WAL objects that predate it follow the coordinator's entries,
# which never list it, so they read such objects unchanged (the object format stays 1).

CONFIRMATION_TOPIC_ID = uuid.UUID(int=0)
CONFIRMATION_MAGIC = b"SLWC"
CONFIRMATION_VERSION = 1
_CONFIRM_HEAD = struct.Struct(">4sHI")
_INTERVAL = struct.Struct(">QQ")
MAX_CONFIRMED_INTERVALS = 4096  # past it the oldest are dropped (WalWriter prunes long before)


class SequenceSet:
    """Sequence numbers as sorted, disjoint, inclusive intervals (committed WAL objects of
    one gateway are consecutive but for the rare fenced one, so this stays a few intervals)."""

    def __init__(self, intervals: list[tuple[int, int]] | None = None):
        self.intervals: list[tuple[int, int]] = []
        for first, last in intervals or []:
            self._fill(first, last)

    def _fill(self, first: int, last: int) -> None:
        merged = [(a, b) for a, b in self.intervals if b < first - 1 or a > last + 1]
        inside = [(a, b) for a, b in self.intervals if not (b < first - 1 or a > last + 1)]
        lo = min([first] + [a for a, _ in inside])
        hi = max([last] + [b for _, b in inside])
        self.intervals = sorted(merged + [(lo, hi)])

    def add(self, seq: int) -> None:
        self._fill(seq, seq)
        if len(self.intervals) > MAX_CONFIRMED_INTERVALS:
            del self.intervals[0]

    def update(self, other: SequenceSet) -> None:
        for first, last in other.intervals:
            self._fill(first, last)

    def prune_below(self, floor: int) -> None:
        """Forget sequences below `floor` (their objects are collected)."""
        self.intervals = [(max(a, floor), b) for a, b in self.intervals if b >= floor]

    def __contains__(self, seq: int) -> bool:
        return any(a <= seq <= b for a, b in self.intervals)

    def __bool__(self) -> bool:
        return bool(self.intervals)


def encode_confirmations(confirmed: SequenceSet) -> bytes:
    """The confirmation range's bytes (layout above)."""
    return _CONFIRM_HEAD.pack(CONFIRMATION_MAGIC, CONFIRMATION_VERSION, len(confirmed.intervals)) \
        + b"".join(_INTERVAL.pack(a, b) for a, b in confirmed.intervals)


def add_confirmations(builder: WalBuilder, confirmed: SequenceSet) -> None:
    """Put the confirmation range into an object about to be built (nothing if empty)."""
    if confirmed:
        builder.add(CONFIRMATION_TOPIC_ID, 0, confirmed.intervals[0][0], confirmed.intervals[-1][1],
                    0, encode_confirmations(confirmed))


def decode_confirmations(data: bytes | bytearray | memoryview, key: str | None = None) -> SequenceSet:
    """The sequences a confirmation range lists; CorruptObject if it is not one,
    UnsupportedFormat for a newer version of it."""
    view = memoryview(data)
    if len(view) < _CONFIRM_HEAD.size:
        raise CorruptObject(f"WAL confirmation range of {len(view)} bytes is too short")
    magic, version, count = _CONFIRM_HEAD.unpack_from(view, 0)
    if magic != CONFIRMATION_MAGIC:
        raise CorruptObject(f"not a WAL confirmation range: magic {bytes(magic)!r}")
    if not 1 <= version <= CONFIRMATION_VERSION:
        raise UnsupportedFormat(unsupported_version(
            f"WAL confirmation range in {key}" if key else "WAL confirmation range", version, 1,
            CONFIRMATION_VERSION))
    if len(view) != _CONFIRM_HEAD.size + count * _INTERVAL.size:
        raise CorruptObject(f"WAL confirmation range of {len(view)} bytes does not hold {count} intervals")
    intervals = [_INTERVAL.unpack_from(view, _CONFIRM_HEAD.size + i * _INTERVAL.size) for i in range(count)]
    if any(a > b for a, b in intervals):
        raise CorruptObject("WAL confirmation range has an interval that ends before it starts")
    return SequenceSet(intervals)
