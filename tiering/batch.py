"""Kafka record batches, message format v2 (magic 2): parse, validate, patch and build.

A batch is a 61-byte header followed by its records section. All integers are big-endian
and signed unless marked otherwise::

    offset  size  field
         0     8  baseOffset            first offset of the batch (set by the broker)
         8     4  batchLength           bytes after this field, so batch size = batchLength + 12
        12     4  partitionLeaderEpoch  set by the broker; -1 when unknown
        16     1  magic                 2 (byte 16 is the magic in every message format)
        17     4  crc                   unsigned CRC-32C of bytes 21 .. end of the batch
        21     2  attributes            bits 0-2 codec, bit 3 timestamp type (1 = LogAppendTime),
                                        bit 4 transactional, bit 5 control, bit 6 delete horizon
        23     4  lastOffsetDelta       last offset - baseOffset (kept by compaction even
                                        when the last record is removed)
        27     8  baseTimestamp         timestamp of the first record
        35     8  maxTimestamp          greatest record timestamp; the append time when
                                        the timestamp type is LogAppendTime
        43     8  producerId            -1 for a non-idempotent producer
        51     2  producerEpoch
        53     4  baseSequence
        57     4  recordsCount
        61     -  records               compressed as one block when the codec is not 0

Each record uses zigzag base-128 varints (protobuf's ``sint``; at most 5 bytes for a
varint and 10 for a varlong)::

    length varint | attributes int8 (unused, 0) | timestampDelta varlong | offsetDelta varint
    | keyLength varint (-1 = null) | key | valueLength varint (-1 = null) | value
    | headerCount varint | headers: (keyLength varint, UTF-8 key, valueLength varint
    (-1 = null), value) * headerCount

Invariants this module relies on: baseOffset and partitionLeaderEpoch lie before the CRC'd
range, so a broker assigns offsets without recomputing the CRC; a record's offset is
baseOffset + offsetDelta and its timestamp baseTimestamp + timestampDelta, except in
LogAppendTime batches where every record carries maxTimestamp.
"""

from __future__ import annotations

import struct
import time
from dataclasses import dataclass
from typing import Union

import crc32c
from aiokafka.record.default_records import DefaultRecordBatch as _CompiledBatch

from stratalog.tiering import compression as codecs
from stratalog.tiering.errors import CorruptObject

HEADER_SIZE = 61
MAGIC = 2
# batchLength counts everything after itself: the header minus baseOffset and batchLength.
LENGTH_OVERHEAD = 12
MIN_BATCH_LENGTH = HEADER_SIZE - LENGTH_OVERHEAD

_HEADER = struct.Struct(">qiibIhiqqqhii")
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21
_ATTRIBUTES = struct.Struct(">h")
_MAX_TIMESTAMP_OFFSET = 35
_LEADER_EPOCH_OFFSET = 12

_CODEC_MASK = 0x07
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

CREATE_TIME = 0
LOG_APPEND_TIME = 1

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class CorruptBatch(ValueError):
    """The bytes are not a well-formed v2 record batch (bad CRC, bad length, garbage)."""


class UnsupportedMagic(CorruptBatch):
    """The batch uses a message format other than v2 (magic 0 and 1 are not accepted)."""


@dataclass(slots=True)
class BatchHeader:
    """The fixed 61-byte header of a v2 batch; see the module docstring for the layout."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def compression(self) -> int:
        return self.attributes & _CODEC_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & _TIMESTAMP_TYPE_BIT else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def size(self) -> int:
        return self.batch_length + LENGTH_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    def with_offsets(self, base_offset: int, leader_epoch: int) -> BatchHeader:
        """This header as `patch_batch(buf, pos, base_offset, leader_epoch)` leaves the
        batch (the fields it sets lie before the CRC'd range: nothing else changes)."""
        return BatchHeader(base_offset, self.batch_length, leader_epoch, self.magic, self.crc,
                           self.attributes, self.last_offset_delta, self.base_timestamp,
                           self.max_timestamp, self.producer_id, self.producer_epoch,
                           self.base_sequence, self.records_count)

    @classmethod
    def parse(cls, buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
        """Read the header at ``pos``; checks magic and that batchLength covers a header."""
        available = len(buf) - pos
        if available <= _MAGIC_OFFSET:
            raise CorruptBatch(
                f"truncated batch header at position {pos}: {max(available, 0)} of "
                f"{HEADER_SIZE} bytes"
            )
        magic = buf[pos + _MAGIC_OFFSET]
        if magic != MAGIC:
            raise UnsupportedMagic(f"batch at position {pos} has magic {magic}, expected {MAGIC}")
        if available < HEADER_SIZE:
            raise CorruptBatch(
                f"truncated batch header at position {pos}: {available} of {HEADER_SIZE} bytes"
            )
        header = cls(*_HEADER.unpack_from(buf, pos))
        if header.batch_length < MIN_BATCH_LENGTH:
            raise CorruptBatch(
                f"batch at position {pos} has batchLength {header.batch_length}, "
                f"below the minimum {MIN_BATCH_LENGTH}"
            )
        return header


def _crc_matches(view: memoryview, pos: int, header: BatchHeader) -> bool:
    return crc32c.crc32c(view[pos + _ATTRIBUTES_OFFSET:pos + header.size]) == header.crc


def _as_bytes_view(buf: bytes | bytearray | memoryview) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def split_batches(
    buf: bytes | bytearray | memoryview, *, validate_crc: bool = True
) -> list[tuple[BatchHeader, memoryview]]:
    """Split a produce request's records into whole batches, rejecting anything else.

    Each memoryview covers one whole batch. A partial trailing batch, a length that runs
    past the buffer, a bad CRC or garbage raises CorruptBatch; magic other than 2 raises
    UnsupportedMagic.
    """
    view = _as_bytes_view(buf)
    end = len(view)
    batches = []
    pos = 0
    while pos < end:
        header = BatchHeader.parse(view, pos)
        batch_end = pos + header.size
        if batch_end > end:
            raise CorruptBatch(
                f"batch at position {pos} claims {header.size} bytes but only "
                f"{end - pos} remain"
            )
        batch = view[pos:batch_end]
        if validate_crc:
            require_crc(batch, header, pos)
        batches.append((header, batch))
        pos = batch_end
    return batches


def scan_batches(
    buf: bytes | bytearray | memoryview, *, validate_crc: bool = False
) -> tuple[list[tuple[int, BatchHeader]], int]:
    """Walk batches leniently, as when reading a file whose tail may be torn.

    Returns ``(position, header)`` for each whole batch and the length of the valid prefix;
    stops without raising at the first partial, malformed or (if asked) CRC-failing batch.
    """
    view = _as_bytes_view(buf)
    end = len(view)
    found = []
    pos = 0
    while pos < end:
        try:
            header = BatchHeader.parse(view, pos)
        except CorruptBatch:
            break
        if pos + header.size > end:
            break
        if validate_crc and not _crc_matches(view, pos, header):
            break
        found.append((pos, header))
        pos += header.size
    return found, pos


def crc_matches(batch: memoryview, header: BatchHeader) -> bool:
    """Whether the CRC-32C of one whole batch, whose header is already parsed, matches."""
    return crc32c.crc32c(batch[_ATTRIBUTES_OFFSET:header.size]) == header.crc


def require_crc(batch: memoryview, header: BatchHeader, pos: int) -> None:
    """CorruptBatch unless the CRC-32C of one whole batch matches (`pos`: where it starts
    among the batches it came with, for the message)."""
    if not crc_matches(batch, header):
        raise CorruptBatch(f"CRC mismatch in batch at position {pos} (base offset {header.base_offset})")


def batch_crc_valid(buf: bytes | bytearray | memoryview, pos: int = 0) -> bool:
    """Whether the whole batch at ``pos`` is present and its CRC-32C matches."""
    view = _as_bytes_view(buf)
    try:
        header = BatchHeader.parse(view, pos)
    except CorruptBatch:
        return False
    return pos + header.size <= len(view) and _crc_matches(view, pos, header)


def check_range(buf: bytes | bytearray | memoryview, key: str, position: int = 0) -> int:
    """Check bytes read back from an object: whole batches, each with its CRC-32C matching.

    `buf` holds bytes [position, position + len(buf)) of object `key`. Returns how many
    batches it holds; raises CorruptObject naming the object, the byte and (once a header
    parses) the batch's first offset. Only headers are parsed in Python: the CRC runs
    over each batch's bytes in C, nothing is done per record.
    """
    view = _as_bytes_view(buf)
    end = len(view)
    pos = count = 0
    while pos < end:
        at = position + pos
        try:
            header = BatchHeader.parse(view, pos)
        except CorruptBatch as exc:
            raise CorruptObject(f"{key} at byte {at}: {exc}", key=key, position=at) from exc
        if pos + header.size > end:
            raise CorruptObject(f"{key} batch at byte {at} (offset {header.base_offset}) claims "
                                f"{header.size} bytes, {end - pos} remain", key=key, position=at,
                                offset=header.base_offset)
        if not _crc_matches(view, pos, header):
            raise CorruptObject(f"{key} batch at byte {at} (offset {header.base_offset}): CRC mismatch",
                                key=key, position=at, offset=header.base_offset)
        pos += header.size
        count += 1
    return count


def patch_batch(buf: bytearray | memoryview, pos: int, base_offset: int, leader_epoch: int) -> None:
    """Assign the batch at ``pos`` its offsets and leader epoch in place (CRC stays valid)."""
    struct.pack_into(">q", buf, pos, base_offset)
    struct.pack_into(">i", buf, pos + _LEADER_EPOCH_OFFSET, leader_epoch)


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Stamp the batch at ``pos`` with the broker's append time and recompute its CRC."""
    _rewrite_max_timestamp(buf, pos, timestamp_ms, _TIMESTAMP_TYPE_BIT)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Set the header's maxTimestamp of the CreateTime batch at ``pos`` (its records keep
    theirs) and recompute its CRC."""
    _rewrite_max_timestamp(buf, pos, timestamp_ms, 0)


def _rewrite_max_timestamp(buf: bytearray | memoryview, pos: int, timestamp_ms: int, add_attributes: int) -> None:
    view = _as_bytes_view(buf)
    header = BatchHeader.parse(view, pos)
    if pos + header.size > len(view):
        raise CorruptBatch(f"batch at position {pos} runs past the buffer")
    struct.pack_into(">h", view, pos + _ATTRIBUTES_OFFSET, header.attributes | add_attributes)
    struct.pack_into(">q", view, pos + _MAX_TIMESTAMP_OFFSET, timestamp_ms)
    crc = crc32c.crc32c(view[pos + _ATTRIBUTES_OFFSET:pos + header.size])
    struct.pack_into(">I", view, pos + _CRC_OFFSET, crc)


@dataclass(slots=True)
class Record:
    """One decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def _read_varint(data: bytes | memoryview, pos: int, end: int, max_bytes: int) -> tuple[int, int]:
    result = 0
    shift = 0
    limit = max_bytes * 7
    while True:
        if pos >= end:
            raise CorruptBatch("record is truncated inside a varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= limit:
            raise CorruptBatch(f"varint longer than {max_bytes} bytes")


def _read_int32_varint(data: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    value, pos = _read_varint(data, pos, end, 5)
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise CorruptBatch(f"varint {value} does not fit in 32 bits")
    return value, pos


def _read_bytes(data: bytes | memoryview, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    length, pos = _read_int32_varint(data, pos, end)
    if length == -1:
        return None, pos
    if length < 0:
        raise CorruptBatch(f"negative {what} length {length}")
    if pos + length > end:
        raise CorruptBatch(f"{what} of {length} bytes overruns its record")
    return bytes(data[pos:pos + length]), pos + length


def decode_records(
    batch: bytes | bytearray | memoryview, *, validate_crc: bool = True
) -> list[Record]:
    """Decode every record of one whole batch, decompressing as its attributes say.

    The records are read by aiokafka's compiled parser (ten times faster than Python on
    the scan and compaction paths); objects it returns have the fields of `Record`. When
    it refuses a batch, the Python parser below reads it again to say precisely what is
    wrong.
    """
    view = _as_bytes_view(batch)
    header = BatchHeader.parse(view)
    if header.size != len(view):
        raise CorruptBatch(
            f"batch length field gives {header.size} bytes but the buffer holds {len(view)}"
        )
    if validate_crc and not _crc_matches(view, 0, header):
        raise CorruptBatch(f"CRC mismatch in batch with base offset {header.base_offset}")
    if header.records_count < 0:
        raise CorruptBatch(f"negative records count {header.records_count}")
    section = view[HEADER_SIZE:]
    if header.records_count == 0 and not len(section):
        return []
    plain: bytes | memoryview
    if header.compression == codecs.NONE:
        plain = view
    else:
        # Decompression stays ours (every framing Kafka clients write); the parser gets
        # the same batch with its records in the clear.
        data = codecs.decompress(header.compression, section)
        plain = b"".join((view[:_ATTRIBUTES_OFFSET],
                          _ATTRIBUTES.pack(header.attributes & ~_CODEC_MASK),
                          view[_ATTRIBUTES_OFFSET + _ATTRIBUTES.size:HEADER_SIZE], data))
    try:
        return list(_CompiledBatch(plain))
    except Exception as exc:
        _parse_records(header, plain[HEADER_SIZE:])
        raise CorruptBatch(f"batch with base offset {header.base_offset}: {exc}") from exc


def _parse_records(header: BatchHeader, data: bytes | memoryview) -> list[Record]:
    """The records section of a batch, read in Python, every malformation named."""
    log_append = header.timestamp_type == LOG_APPEND_TIME
    count = header.records_count
    records = []
    pos = 0
    end = len(data)
    for index in range(count):
        length, pos = _read_int32_varint(data, pos, end)
        if length < 1 or pos + length > end:
            raise CorruptBatch(f"record {index} claims {length} bytes, {end - pos} remain")
        record_end = pos + length
        pos += 1  # record attributes: unused by format v2
        timestamp_delta, pos = _read_varint(data, pos, record_end, 10)
        offset_delta, pos = _read_int32_varint(data, pos, record_end)
        key, pos = _read_bytes(data, pos, record_end, "key")
        value, pos = _read_bytes(data, pos, record_end, "value")
        header_count, pos = _read_int32_varint(data, pos, record_end)
        if header_count < 0:
            raise CorruptBatch(f"record {index} has negative header count {header_count}")
        headers = []
        for _ in range(header_count):
            raw_key, pos = _read_bytes(data, pos, record_end, "header key")
            if raw_key is None:
                raise CorruptBatch(f"record {index} has a null header key")
            try:
                header_key = bytes(raw_key).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorruptBatch(f"record {index} has a header key that is not UTF-8") from exc
            header_value, pos = _read_bytes(data, pos, record_end, "header value")
            headers.append((header_key, header_value))
        if pos != record_end:
            raise CorruptBatch(f"record {index} has {record_end - pos} unread bytes")
        timestamp = header.max_timestamp if log_append else header.base_timestamp + timestamp_delta
        records.append(Record(header.base_offset + offset_delta, timestamp, key, value, headers))
    if pos != end:
        raise CorruptBatch(f"{end - pos} bytes follow the last of {count} records")
    return records


def _put_varint(out: bytearray, value: int) -> None:
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag > 0x7F:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _put_bytes(out: bytearray, data: bytes | bytearray | memoryview | None) -> None:
    if data is None:
        out.append(1)  # zigzag(-1)
        return
    _put_varint(out, len(data))
    out += data


# A decoded record is accepted as it is: anything with Record's fields.
RecordInput = Union[
    tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]],
    tuple[bytes | None, bytes | None],
    Record,
]


def build_batch(
    records: list[RecordInput],
    *,
    base_offset: int = 0,
    timestamp_ms: int | None = None,
    timestamps: list[int] | None = None,
    compression: int = 0,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    partition_leader_epoch: int = -1,
    is_transactional: bool = False,
    is_control: bool = False,
    offset_deltas: list[int] | None = None,
    last_offset_delta: int | None = None,
) -> bytes:
    """Encode records as one v2 batch, byte for byte as Kafka's clients write it.

    Records are ``(key, value, headers)`` tuples or ``Record`` objects. A record's
    timestamp comes from ``timestamps``, else from the Record, else ``timestamp_ms``, else
    the wall clock. Offset deltas come from ``offset_deltas``, else ``Record.offset -
    base_offset``, else the record's position. ``last_offset_delta`` lets compaction keep
    a batch's original last offset after dropping its last records.
    """
    count = len(records)
    if timestamps is not None and len(timestamps) != count:
        raise ValueError(f"{len(timestamps)} timestamps for {count} records")
    if offset_deltas is not None and len(offset_deltas) != count:
        raise ValueError(f"{len(offset_deltas)} offset deltas for {count} records")
    default_ts = timestamp_ms
    if default_ts is None and timestamps is None and count:
        default_ts = int(time.time() * 1000)

    stamps: list[int] = []
    deltas: list[int] = []
    fields: list[tuple[bytes | None, bytes | None, list]] = []
    for index, item in enumerate(records):
        if not isinstance(item, tuple):  # a Record, or a record decode_records returned
            key, value, headers = item.key, item.value, item.headers
            stamp, delta = item.timestamp, item.offset - base_offset
        else:
            key, value = item[0], item[1]
            headers = item[2] if len(item) > 2 else []
            # default_ts is None only when `timestamps` gives every record's time.
            stamp, delta = default_ts if default_ts is not None else 0, index
        if timestamps is not None:
            stamp = timestamps[index]
        if offset_deltas is not None:
            delta = offset_deltas[index]
        if deltas and delta <= deltas[-1]:
            raise ValueError(f"offset deltas must increase: {delta} after {deltas[-1]}")
        if not 0 <= delta <= _INT32_MAX:
            raise ValueError(f"offset delta {delta} is outside 0..{_INT32_MAX}")
        if not isinstance(stamp, int):
            raise TypeError(f"timestamp must be int, not {type(stamp).__name__}")
        stamps.append(stamp)
        deltas.append(delta)
        fields.append((key, value, headers or []))

    if count:
        base_ts, max_ts = stamps[0], max(stamps)
        if min(stamps) - base_ts < _INT64_MIN or max_ts - base_ts > _INT64_MAX:
            raise ValueError("timestamps too far apart for a varlong delta")
    else:
        base_ts = max_ts = -1 if timestamp_ms is None else timestamp_ms
    if last_offset_delta is None:
        last_offset_delta = deltas[-1] if deltas else 0
    elif deltas and last_offset_delta < deltas[-1]:
        raise ValueError(f"last offset delta {last_offset_delta} is below the last record's")

    body = bytearray()
    for (key, value, headers), stamp, delta in zip(fields, stamps, deltas):
        record = bytearray(b"\x00")
        _put_varint(record, stamp - base_ts)
        _put_varint(record, delta)
        _put_bytes(record, _bytes_or_none(key, "key"))
        _put_bytes(record, _bytes_or_none(value, "value"))
        _put_varint(record, len(headers))
        for header_key, header_value in headers:
            if not isinstance(header_key, str):
                raise TypeError(f"header key must be str, not {type(header_key).__name__}")
            _put_bytes(record, header_key.encode("utf-8"))
            _put_bytes(record, _bytes_or_none(header_value, "header value"))
        _put_varint(body, len(record))
        body += record

    if compression not in codecs.CODEC_NAMES:
        raise ValueError(f"unknown compression codec {compression}")
    section = codecs.compress(compression, bytes(body)) if compression else body
    attributes = compression
    if is_transactional:
        attributes |= _TRANSACTIONAL_BIT
    if is_control:
        attributes |= _CONTROL_BIT

    out = bytearray(HEADER_SIZE)
    out += section
    try:
        _HEADER.pack_into(
            out, 0, base_offset, len(out) - LENGTH_OVERHEAD, partition_leader_epoch, MAGIC, 0,
            attributes, last_offset_delta, base_ts, max_ts, producer_id, producer_epoch,
            base_sequence, count,
        )
    except struct.error as exc:
        raise ValueError(f"batch header field out of range: {exc}") from exc
    struct.pack_into(">I", out, _CRC_OFFSET, crc32c.crc32c(memoryview(out)[_ATTRIBUTES_OFFSET:]))
    return bytes(out)


def _bytes_or_none(data, what: str) -> bytes | bytearray | memoryview | None:
    if data is None or isinstance(data, (bytes, bytearray, memoryview)):
        return data
    raise TypeError(f"{what} must be bytes or None, not {type(data).__name__}")
