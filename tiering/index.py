"""Kafka's sparse segment indexes: the offset index (``.index``) and time index (``.timeindex``)."""

from __future__ import annotations

import struct
from bisect import bisect_right

_INT32_MAX = (1 << 31) - 1
_NO_TIMESTAMP = -1


class OffsetIndex:
    """Maps offsets to byte positions in a segment's ``.log``; Kafka's ``.index`` format.

    The file is a run of 8-byte entries, both fields big-endian int32::

        relativeOffset (offset - base_offset) | position (byte position of a batch in .log)

    Entries are sparse (one per ``index.interval.bytes`` of log) and strictly increasing in
    both fields. The broker writes the last offset of a batch with that batch's start
    position, so looking up offset O gives the greatest entry <= O and a position at or
    before the batch holding O; readers scan forward from there. An empty index means
    "start at position 0".
    """

    ENTRY = struct.Struct(">ii")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._offsets: list[int] = []
        self._positions: list[int] = []

    def __len__(self) -> int:
        return len(self._offsets)

    def append(self, offset: int, position: int) -> None:
        """Add an entry; offsets and positions must grow and fit Kafka's 32-bit fields."""
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise ValueError(f"offset {offset} is not within 2^31 above base {self.base_offset}")
        if not 0 <= position <= _INT32_MAX:
            raise ValueError(f"position {position} does not fit in 32 bits")
        if self._offsets and (offset <= self._offsets[-1] or position <= self._positions[-1]):
            raise ValueError(
                f"index entry ({offset}, {position}) does not follow "
                f"({self._offsets[-1]}, {self._positions[-1]})"
            )
        self._offsets.append(offset)
        self._positions.append(position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """The greatest entry with offset <= ``offset``, or ``(base_offset, 0)``."""
        slot = bisect_right(self._offsets, offset) - 1
        if slot < 0:
            return self.base_offset, 0
        return self._offsets[slot], self._positions[slot]

    def position_at_or_before(self, position: int) -> int:
        """The greatest indexed batch position at or before `position` (0 if none): a
        batch boundary to scan from."""
        slot = bisect_right(self._positions, position) - 1
        return self._positions[slot] if slot >= 0 else 0

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._offsets, self._positions))

    def to_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(
            self.ENTRY.pack(offset - base, position)
            for offset, position in zip(self._offsets, self._positions)
        )

    @classmethod
    def from_bytes(cls, base_offset: int, data: bytes | bytearray | memoryview) -> OffsetIndex:
        """Load an index file; partial or unordered entries raise ValueError."""
        if len(data) % cls.ENTRY.size:
            raise ValueError(f"offset index of {len(data)} bytes is not a multiple of 8")
        index = cls(base_offset)
        for relative, position in cls.ENTRY.iter_unpack(data):
            index.append(base_offset + relative, position)
        return index


class TimeIndex:
    """Maps timestamps to offsets in a segment; Kafka's ``.timeindex`` format.

    The file is a run of 12-byte big-endian entries::

        timestamp int64 | relativeOffset int32 (offset - base_offset)

    An entry (T, O) says the greatest timestamp seen so far is T and its batch holds offset
    O, so every batch before that one has a timestamp below T. Entries are sparse;
    timestamps strictly increase (an entry whose timestamp does not beat the last one is
    skipped) and offsets never decrease. An empty index behaves as the entry
    (-1, base_offset).
    """

    ENTRY = struct.Struct(">qi")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self._timestamps: list[int] = []
        self._offsets: list[int] = []

    def __len__(self) -> int:
        return len(self._timestamps)

    @property
    def last_entry(self) -> tuple[int, int]:
        """The newest ``(timestamp, offset)``, or ``(-1, base_offset)`` when empty."""
        if not self._timestamps:
            return _NO_TIMESTAMP, self.base_offset
        return self._timestamps[-1], self._offsets[-1]

    def append(self, timestamp: int, offset: int) -> bool:
        """Add an entry if ``timestamp`` beats the last one; returns whether it was added."""
        last_timestamp, last_offset = self.last_entry
        if self._offsets and offset < last_offset:
            raise ValueError(f"time index offset {offset} is below the last entry's {last_offset}")
        if timestamp <= last_timestamp:
            return False
        relative = offset - self.base_offset
        if not 0 <= relative <= _INT32_MAX:
            raise ValueError(f"offset {offset} is not within 2^31 above base {self.base_offset}")
        self._timestamps.append(timestamp)
        self._offsets.append(offset)
        return True

    def lookup(self, timestamp: int) -> int:
        """Offset of the greatest entry with timestamp <= ``timestamp``, or ``base_offset``."""
        slot = bisect_right(self._timestamps, timestamp) - 1
        return self.base_offset if slot < 0 else self._offsets[slot]

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._timestamps, self._offsets))

    def to_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(
            self.ENTRY.pack(timestamp, offset - base)
            for timestamp, offset in zip(self._timestamps, self._offsets)
        )

    @classmethod
    def from_bytes(cls, base_offset: int, data: bytes | bytearray | memoryview) -> TimeIndex:
        """Load a time index file; a bad size or unordered entries is ValueError."""
        if len(data) % cls.ENTRY.size:
            raise ValueError(f"time index of {len(data)} bytes is not a multiple of 12")
        index = cls(base_offset)
        for timestamp, relative in cls.ENTRY.iter_unpack(data):
            offset = base_offset + relative
            if not index.append(timestamp, offset):
                raise ValueError(f"time index entry ({timestamp}, {offset}) does not increase")
        return index
