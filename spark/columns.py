"""Record batches decoded straight into Arrow columns, with no Python object per record.

The scan's hot path. `tiering.batch` owns the v2 format (its docstring has the layout);
this module reads the same bytes column-wise for Spark: each batch's records section is
decompressed (the codecs release the GIL), the only per-record Python work is following
the chain of record lengths, and every other field (attributes, timestamp and offset
deltas, key, value, headers) is read with NumPy over all records of many batches at once.
Keys, values and header values become Arrow binary arrays cut out of the decompressed
bytes by one `take` in C++, so payload bytes are copied once, never turned into Python
`bytes`.

Anything the vectorised reader does not accept as well-formed (a varint too long, a field
overrunning its record, a null or non-UTF-8 header key, timestamps that overflow) is read
again by `tiering.batch.decode_records`, the reference decoder: it raises the precise
`CorruptBatch`, or, for a batch it does accept, its records are used. So this module never
accepts a batch the reference refuses, and never refuses one it accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from stratalog.spark.schema import HEADER_TYPE, headers_column
from stratalog.tiering import compression as codecs
from stratalog.tiering.batch import HEADER_SIZE, LOG_APPEND_TIME, BatchHeader, CorruptBatch, crc_matches

__all__ = ["BatchColumns", "Decoded", "NotVectorisable", "batch_offsets"]

_PAD = 16  # zero bytes after the records, so a varint read past a record's end stays in bounds
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
# Records with more headers than this are left to the reference decoder: each header
# position is one NumPy pass over the records.
MAX_VECTOR_HEADERS = 64
_BINARY = pa.binary()


class NotVectorisable(Exception):
    """The records are not read here; `decode_records` decides (and names what is wrong)."""


@dataclass
class Decoded:
    """The columns of some records, in log order."""

    offsets: np.ndarray  # int64
    timestamps: np.ndarray  # int64, milliseconds
    timestamp_types: np.ndarray  # int32
    keys: pa.Array  # binary
    values: pa.Array  # binary
    headers: pa.Array  # list<struct<key: string, value: binary>>

    def __len__(self) -> int:
        return len(self.offsets)


@dataclass
class BatchColumns:
    """Accumulates whole batches (CRC-checked, decompressed, record starts found) and
    decodes them together into `Decoded` columns.

    `add` raises `CorruptBatch` for a bad CRC or codec stream, and `NotVectorisable` when
    the records section cannot be walked; `decode` raises `NotVectorisable` for a record
    it does not read. Either way the caller hands the same batches to the reference
    decoder.
    """

    sections: list = field(default_factory=list)
    starts: list = field(default_factory=list)  # per batch: int64 record starts in its section
    meta: list = field(default_factory=list)  # per batch: base offset, base and max timestamp, type
    rows: int = 0
    nbytes: int = 0

    def add(self, header: BatchHeader, batch: memoryview) -> None:
        if not crc_matches(batch, header):
            raise CorruptBatch(f"CRC mismatch in batch with base offset {header.base_offset}")
        count = header.records_count
        if count < 0:
            raise NotVectorisable()
        if count == 0 and len(batch) == HEADER_SIZE:
            return
        section = batch[HEADER_SIZE:]
        # Uncompressed records stay where they were read: `decode` cuts the fields out of
        # the read buffer itself when every batch it holds is a view of the same one.
        data = section if header.compression == codecs.NONE else codecs.decompress(header.compression, section)
        self.starts.append(np.array(_record_starts(data, count), dtype=np.int64))
        self.sections.append(data)
        self.meta.append((header.base_offset, header.base_timestamp, header.max_timestamp,
                          1 if header.timestamp_type == LOG_APPEND_TIME else 0, count))
        self.rows += count
        self.nbytes += len(data)

    def continues(self, batch: memoryview) -> bool:
        """Whether `batch` lies in the buffer of the uncompressed batches held (or none
        are held), so decoding them together copies no records."""
        views = [s for s in self.sections if isinstance(s, memoryview)]
        return not views or batch.obj is views[-1].obj

    def clear(self) -> None:
        self.sections, self.starts, self.meta = [], [], []
        self.rows = self.nbytes = 0

    def decode(self) -> Decoded:
        """The columns of every record added since the last `clear`."""
        joined, shifts = self._buffer()
        starts = np.concatenate([s + shift for s, shift in zip(self.starts, shifts)]) if self.starts \
            else np.zeros(0, np.int64)
        buf = np.frombuffer(joined, dtype=np.uint8)
        counts = np.array([m[4] for m in self.meta], dtype=np.int64)

        def per_record(column: int) -> np.ndarray:
            return np.repeat(np.array([m[column] for m in self.meta], dtype=np.int64), counts)

        if len(joined) >= _INT32_MAX:
            raise NotVectorisable()  # Arrow binary offsets are 32-bit
        length, pos = _varint(buf, starts, 5)
        end = pos + length  # the chain already checked these tile the sections exactly
        if (buf[pos] >= 0x80).any():
            # Record attributes (unused by format v2) are one byte; the reference decoder
            # reads them as a varint, so a high bit there is its to judge.
            raise NotVectorisable()
        pos += 1
        ts_delta, pos = _varint(buf, _within(pos, end), 10)
        offset_delta, pos = _varint(buf, _within(pos, end), 5)
        key_len, pos = _varint(buf, _within(pos, end), 5)
        key_pos, pos = pos, pos + np.maximum(key_len, 0)
        value_len, pos = _varint(buf, _within(pos, end), 5)
        value_pos, pos = pos, pos + np.maximum(value_len, 0)
        header_count, pos = _varint(buf, _within(pos, end), 5)
        if (key_len < -1).any() or (value_len < -1).any() or (header_count < 0).any():
            raise NotVectorisable()
        _within(pos, end)
        headers, pos = _headers(buf, joined, pos, end, header_count)
        if (pos != end).any() or (offset_delta < 0).any():
            raise NotVectorisable()

        offsets = per_record(0) + offset_delta
        log_append = per_record(3).astype(bool)
        base_ts = per_record(1)
        timestamps = base_ts + ts_delta
        # An int64 sum that wrapped: the reference decoder's unbounded ints decide.
        if ((ts_delta > 0) & (timestamps < base_ts)).any() or ((ts_delta < 0) & (timestamps > base_ts)).any():
            if not log_append.all():
                raise NotVectorisable()
        timestamps = np.where(log_append, per_record(2), timestamps)
        data = pa.py_buffer(joined)
        return Decoded(offsets, timestamps, log_append.astype(np.int32),
                       _binary(data, key_pos, key_len), _binary(data, value_pos, value_len), headers)


    def _buffer(self) -> tuple[bytes, list[int]]:
        """One buffer holding every section, with `_PAD` bytes after the last, and where
        each section starts in it: the read buffer the sections are views of, else a copy."""
        views = [s for s in self.sections if isinstance(s, memoryview)]
        base = views[0].obj if views else None
        if len(views) == len(self.sections) and isinstance(base, bytes) and all(v.obj is base for v in views):
            origin = np.frombuffer(base, dtype=np.uint8).ctypes.data
            shifts = [np.frombuffer(v, dtype=np.uint8).ctypes.data - origin for v in views]
            if shifts[-1] + len(views[-1]) + _PAD <= len(base):
                return base, shifts
        shifts = np.cumsum([0] + [len(s) for s in self.sections[:-1]], dtype=np.int64).tolist()
        return b"".join(self.sections) + bytes(_PAD), shifts


def batch_offsets(header: BatchHeader, batch: memoryview) -> np.ndarray:
    """The offsets of one whole batch's records (CRC checked, records walked), for jobs that
    need no other field; raises like `BatchColumns.add` and `BatchColumns.decode`."""
    if not crc_matches(batch, header):
        raise CorruptBatch(f"CRC mismatch in batch with base offset {header.base_offset}")
    if header.records_count < 0:
        raise NotVectorisable()
    if header.records_count == 0 and len(batch) == HEADER_SIZE:
        return np.zeros(0, np.int64)
    section = batch[HEADER_SIZE:]
    data = bytes(section) if header.compression == codecs.NONE else codecs.decompress(header.compression, section)
    buf = np.frombuffer(data + bytes(_PAD), dtype=np.uint8)
    starts = np.array(_record_starts(data, header.records_count), dtype=np.int64)
    length, pos = _varint(buf, starts, 5)
    end = pos + length
    if (buf[pos] >= 0x80).any():
        raise NotVectorisable()
    _, pos = _varint(buf, _within(pos + 1, end), 10)
    delta, _ = _varint(buf, _within(pos, end), 5)
    if (delta < 0).any():
        raise NotVectorisable()
    return header.base_offset + delta


def _record_starts(data: bytes, count: int) -> list[int]:
    """Where each of `count` records starts: the chain of length varints, which must end
    exactly at the end of `data`."""
    starts = [0] * count
    pos, end = 0, len(data)
    for i in range(count):
        if pos >= end:
            raise NotVectorisable()
        starts[i] = pos
        byte = data[pos]
        if byte < 0x80:  # records under 64 bytes
            raw, pos = byte, pos + 1
        elif pos + 1 < end and data[pos + 1] < 0x80:  # under 8 KiB
            raw, pos = (byte & 0x7F) | (data[pos + 1] << 7), pos + 2
        else:
            raw, shift = 0, 0
            while True:
                if pos >= end or shift > 28:
                    raise NotVectorisable()
                byte = data[pos]
                raw |= (byte & 0x7F) << shift
                pos += 1
                if byte < 0x80:
                    break
                shift += 7
        length = (raw >> 1) ^ -(raw & 1)
        if length < 1:
            raise NotVectorisable()
        pos += length
    if pos != end:
        raise NotVectorisable()
    return starts


def _within(pos: np.ndarray, end: np.ndarray) -> np.ndarray:
    """`pos`, once every position is at or before its record's end (so the next varint
    read, at most 10 bytes, stays inside the padded buffer)."""
    if (pos > end).any():
        raise NotVectorisable()
    return pos


def _varint(buf: np.ndarray, pos: np.ndarray, max_bytes: int) -> tuple[np.ndarray, np.ndarray]:
    """Zigzag varints at `pos` (NumPy, all at once): values and the positions after them.
    32-bit ones (5 bytes) must fit an int32; longer encodings are refused."""
    raw = np.zeros(len(pos), dtype=np.uint64)
    size = np.zeros(len(pos), dtype=np.int64)
    going = np.ones(len(pos), dtype=bool)
    for k in range(max_bytes):
        if not going.any():
            break
        byte = buf[pos + k]
        raw |= np.where(going, (byte & 0x7F).astype(np.uint64) << np.uint64(7 * k), np.uint64(0))
        size += going
        going &= byte >= 0x80
        if k == max_bytes - 1 and max_bytes == 10 and (np.where(size == 10, byte, 0) > 1).any():
            raise NotVectorisable()  # a 10th byte carrying bits past the 64th
    if going.any():
        raise NotVectorisable()
    value = (raw >> np.uint64(1)).astype(np.int64) ^ -(raw & np.uint64(1)).astype(np.int64)
    if max_bytes == 5 and ((value < _INT32_MIN) | (value > _INT32_MAX)).any():
        raise NotVectorisable()
    return value, pos + size


def _headers(buf: np.ndarray, joined: bytes, pos: np.ndarray, end: np.ndarray,
             count: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """The headers column, and each record's position after its headers."""
    n = len(pos)
    list_offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(count, out=list_offsets[1:])
    total = int(list_offsets[-1])
    key_pos = np.zeros(total, np.int64)
    key_len = np.zeros(total, np.int64)
    value_pos = np.zeros(total, np.int64)
    value_len = np.zeros(total, np.int64)
    widest = int(count.max()) if n else 0
    if widest > MAX_VECTOR_HEADERS:
        raise NotVectorisable()
    pos = pos.copy()
    for j in range(widest):
        rows = np.nonzero(count > j)[0]
        at = pos[rows]
        klen, at = _varint(buf, _within(at, end[rows]), 5)
        kpos, at = at, at + np.maximum(klen, 0)
        vlen, at = _varint(buf, _within(at, end[rows]), 5)
        vpos, at = at, at + np.maximum(vlen, 0)
        if (klen < 0).any() or (vlen < -1).any() or (at > end[rows]).any():
            raise NotVectorisable()  # a null header key, or a header overrunning its record
        flat = list_offsets[rows] + j
        key_pos[flat], key_len[flat], value_pos[flat], value_len[flat] = kpos, klen, vpos, vlen
        pos[rows] = at
    data = pa.py_buffer(joined)
    names = _binary(data, key_pos, key_len, pa.string())
    if total:
        try:
            names.validate(full=True)  # UTF-8
        except pa.ArrowInvalid:
            raise NotVectorisable() from None
    pairs = pa.StructArray.from_arrays([names, _binary(data, value_pos, value_len)], fields=list(HEADER_TYPE))
    return headers_column(list_offsets, pairs), pos


def _binary(data: pa.Buffer, starts: np.ndarray, lengths: np.ndarray, kind: pa.DataType = _BINARY) -> pa.Array:
    """Fields [start, start + length) of `data` as one compact Arrow array (length -1: null).

    The fields lie in increasing, non-overlapping order, so they and the gaps between them
    are the elements of one array over `data` as it is; taking every other element copies
    the fields out in one pass.
    """
    n = len(starts)
    if n == 0:
        return pa.array([], kind)
    ends = starts + np.maximum(lengths, 0)
    bounds = np.empty(2 * n + 1, dtype=np.int32)
    bounds[0:2 * n:2] = starts
    bounds[1:2 * n:2] = ends
    bounds[2 * n] = ends[-1]
    spread = pa.Array.from_buffers(kind, 2 * n, [None, pa.py_buffer(bounds), data])
    compact = spread.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))
    nulls = lengths < 0
    if not nulls.any():
        return compact
    validity = pa.py_buffer(np.packbits(~nulls, bitorder="little"))
    return pa.Array.from_buffers(kind, n, [validity, *compact.buffers()[1:]], null_count=int(nulls.sum()))
