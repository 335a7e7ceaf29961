"""Kafka's primitive wire types: fixed-width big-endian integers, zig-zag varints and
length-prefixed strings and byte strings, each in its classic and compact (flexible) form.

Everything here works on in-memory buffers; nothing reads a socket.
"""

from __future__ import annotations

import builtins  # Reader and Writer have methods named bool and bytes
import struct
import uuid

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")


class DecodeError(ValueError):
    """The peer sent bytes that do not decode as the expected message."""


class Reader:
    """A cursor over a byte buffer; every read checks that the bytes are there."""

    __slots__ = ("buf", "pos", "end")

    def __init__(self, buf: bytes | bytearray | memoryview, pos: int = 0, end: int | None = None):
        self.buf = memoryview(buf) if not isinstance(buf, memoryview) else buf
        self.pos = pos
        self.end = len(self.buf) if end is None else end

    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, n: int) -> int:
        start = self.pos
        if n < 0 or start + n > self.end:
            raise DecodeError(f"need {n} bytes at offset {start}, have {self.end - start}")
        self.pos = start + n
        return start

    def _unpack(self, s: struct.Struct):
        start = self.pos  # _take, inlined: every fixed-width field of every request comes here
        end = start + s.size
        if end > self.end:
            raise DecodeError(f"need {s.size} bytes at offset {start}, have {self.end - start}")
        self.pos = end
        return s.unpack_from(self.buf, start)[0]

    def int8(self) -> int:
        return self._unpack(_I8)

    def int16(self) -> int:
        return self._unpack(_I16)

    def uint16(self) -> int:
        return self._unpack(_U16)

    def int32(self) -> int:
        return self._unpack(_I32)

    def uint32(self) -> int:
        return self._unpack(_U32)

    def int64(self) -> int:
        return self._unpack(_I64)

    def float64(self) -> float:
        return self._unpack(_F64)

    def bool(self) -> bool:
        return self._unpack(_I8) != 0

    def uuid(self) -> uuid.UUID:
        start = self._take(16)
        return uuid.UUID(bytes=bytes(self.buf[start:start + 16]))

    def uvarint(self) -> int:
        pos = self.pos
        if pos < self.end:  # one byte: lengths, counts and tag sections mostly are
            b = self.buf[pos]
            if b < 0x80:
                self.pos = pos + 1
                return b
        shift = 0
        value = 0
        while True:
            b = self.buf[self._take(1)]
            if shift == 63 and b > 1:
                # The tenth byte may only carry bit 63; anything more is not a 64-bit value.
                raise DecodeError("varint overflows 64 bits")
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7

    def varint(self) -> int:
        v = self.uvarint()
        return (v >> 1) ^ -(v & 1)

    def raw(self, n: int) -> memoryview:
        start = self._take(n)
        return self.buf[start:start + n]

    def _sized(self, n: int, nullable: builtins.bool) -> memoryview | None:
        if n < 0:
            if n == -1 and nullable:
                return None
            raise DecodeError(f"invalid length {n}")
        return self.raw(n)

    def bytes(self, nullable: builtins.bool = False) -> builtins.bytes | None:
        v = self._sized(self.int32(), nullable)
        return None if v is None else bytes(v)

    def compact_bytes(self, nullable: builtins.bool = False) -> builtins.bytes | None:
        v = self._sized(self.uvarint() - 1, nullable)
        return None if v is None else bytes(v)

    def records(self, compact: builtins.bool) -> memoryview | None:
        """A record set stays a view of the request buffer: it is passed through, never copied."""
        n = self.uvarint() - 1 if compact else self.int32()
        return self._sized(n, True)

    def _text(self, v: memoryview | None) -> str | None:
        if v is None:
            return None
        try:
            return str(v, "utf-8")
        except UnicodeDecodeError as e:
            raise DecodeError(f"string is not UTF-8: {e}") from None

    def string(self, nullable: builtins.bool = False) -> str | None:
        return self._text(self._sized(self.int16(), nullable))

    def compact_string(self, nullable: builtins.bool = False) -> str | None:
        return self._text(self._sized(self.uvarint() - 1, nullable))

    def array_length(self, compact: builtins.bool, nullable: builtins.bool = False) -> int | None:
        n = self.uvarint() - 1 if compact else self.int32()
        if n < 0:
            if n == -1 and nullable:
                return None
            raise DecodeError(f"invalid array length {n}")
        # Each element takes at least one byte: a length beyond the buffer is garbage,
        # and rejecting it here keeps a hostile length from allocating a huge list.
        if n > self.remaining():
            raise DecodeError(f"array of {n} elements in {self.remaining()} bytes")
        return n


class Writer:
    """Appends encoded primitives to a growing buffer.

    Values of `SPILL_BYTES` or more (record batches in a Fetch response) are kept by
    reference instead of copied: the encoding is then the list `parts()`, which a socket
    writes as it is, so a 32 MiB response costs no extra copies of its records.
    """

    __slots__ = ("buf", "_parts", "_spilled")

    SPILL_BYTES = 64 * 1024

    def __init__(self) -> None:
        self.buf = bytearray()
        self._parts: list = []
        self._spilled = 0

    def __len__(self) -> int:
        return self._spilled + len(self.buf)

    def parts(self) -> list:
        """The encoding as a list of buffers, in order."""
        return [*self._parts, self.buf] if self._parts else [self.buf]

    def getvalue(self) -> bytes:
        return b"".join(self.parts())

    def mark(self) -> tuple[int, int, int]:
        """Where the encoding is now, for `rewind`."""
        return len(self.buf), len(self._parts), self._spilled

    def rewind(self, mark: tuple[int, int, int]) -> None:
        """Drop what was written since `mark`."""
        size, parts, spilled = mark
        if len(self._parts) > parts:  # spilled since: the buffer of then is the first part after
            self.buf = self._parts[parts]
            del self._parts[parts:]
        del self.buf[size:]
        self._spilled = spilled

    def _put_large(self, v: bytes | bytearray | memoryview) -> None:
        if len(v) < self.SPILL_BYTES:
            self.buf += v
            return
        self._parts += (self.buf, v)
        self._spilled += len(self.buf) + len(v)
        self.buf = bytearray()

    def int8(self, v: int) -> None:
        self.buf += _I8.pack(v)

    def int16(self, v: int) -> None:
        self.buf += _I16.pack(v)

    def uint16(self, v: int) -> None:
        self.buf += _U16.pack(v)

    def int32(self, v: int) -> None:
        self.buf += _I32.pack(v)

    def uint32(self, v: int) -> None:
        self.buf += _U32.pack(v)

    def int64(self, v: int) -> None:
        self.buf += _I64.pack(v)

    def float64(self, v: float) -> None:
        self.buf += _F64.pack(v)

    def bool(self, v: bool) -> None:
        self.buf.append(1 if v else 0)

    def uuid(self, v: uuid.UUID | bytes | None) -> None:
        if v is None:
            self.buf += bytes(16)
            return
        b = v.bytes if isinstance(v, uuid.UUID) else bytes(v)
        if len(b) != 16:
            raise ValueError(f"a UUID is 16 bytes, not {len(b)}")
        self.buf += b

    def uvarint(self, v: int) -> None:
        self.buf += encode_uvarint(v)

    def varint(self, v: int) -> None:
        self.buf += encode_uvarint((v << 1) ^ (v >> 63))

    def raw(self, v: bytes | bytearray | memoryview) -> None:
        self._put_large(v)

    def bytes(self, v: bytes | None) -> None:
        if v is None:
            self.int32(-1)
        else:
            self.int32(len(v))
            self._put_large(v)

    def compact_bytes(self, v: builtins.bytes | None) -> None:
        if v is None:
            self.uvarint(0)
        else:
            self.uvarint(len(v) + 1)
            self._put_large(v)

    def string(self, v: str | None) -> None:
        self.bytes_as_string(None if v is None else v.encode(), compact=False)

    def compact_string(self, v: str | None) -> None:
        self.bytes_as_string(None if v is None else v.encode(), compact=True)

    def bytes_as_string(self, b: builtins.bytes | None, compact: builtins.bool) -> None:
        if compact:
            self.compact_bytes(b)
        elif b is None:
            self.int16(-1)
        else:
            self.int16(len(b))
            self.buf += b

    def array_length(self, n: int | None, compact: builtins.bool) -> None:
        if compact:
            self.uvarint(0 if n is None else n + 1)
        else:
            self.int32(-1 if n is None else n)


def encode_uvarint(v: int) -> bytes:
    if v < 0:
        v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def encode_varint(v: int) -> bytes:
    return encode_uvarint((v << 1) ^ (v >> 63))
