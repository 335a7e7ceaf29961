"""Transaction markers and the aborted-transaction index, in Kafka's formats.

A marker is a control batch (attributes: transactional and control bits) of one record
whose key and value are::

    key    version int16 (0) | type int16 (0 = abort, 1 = commit)
    value  version int16 (0) | coordinatorEpoch int32

A sealed segment's `.txnindex` sidecar lists the transactions aborted by markers in that
segment, one 34-byte entry each, in marker order::

    version int16 (0) | producerId int64 | firstOffset int64 | lastOffset int64
    | lastStableOffset int64

firstOffset is the transaction's first offset in the partition (possibly in an earlier
segment), lastOffset the abort marker's offset.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from .batch import BatchHeader, CorruptBatch, build_batch, decode_records
from .errors import CorruptObject

ABORT, COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")
_ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = _ENTRY.size


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker
    last_stable_offset: int = -1


def marker_batch(producer_id: int, producer_epoch: int, *, commit: bool, coordinator_epoch: int,
                 timestamp_ms: int) -> bytes:
    """A commit or abort marker for one producer, offsets to be assigned on append."""
    key = _CONTROL_KEY.pack(0, COMMIT if commit else ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return build_batch([(key, value)], timestamp_ms=timestamp_ms, producer_id=producer_id,
                       producer_epoch=producer_epoch, is_transactional=True, is_control=True)


def marker_commits(batch: bytes | memoryview, header: BatchHeader) -> bool:
    """Whether a control batch is a commit marker (False: abort). Raises CorruptBatch for a
    control batch that is not a marker this format knows."""
    return decode_marker(batch, header)[0]


def decode_marker(batch: bytes | memoryview, header: BatchHeader, *,
                  validate_crc: bool = True) -> tuple[bool, int]:
    """(commits, coordinator epoch) of a control batch; CorruptBatch if it is no marker."""
    records = decode_records(batch, validate_crc=validate_crc)
    if len(records) != 1 or records[0].key is None or len(records[0].key) < _CONTROL_KEY.size:
        raise CorruptBatch(f"control batch at {header.base_offset} holds no marker")
    _version, kind = _CONTROL_KEY.unpack_from(records[0].key)
    if kind not in (ABORT, COMMIT):
        raise CorruptBatch(f"control batch at {header.base_offset} has unknown type {kind}")
    value = records[0].value or b""
    if len(value) < _CONTROL_VALUE.size:
        raise CorruptBatch(f"control batch at {header.base_offset} has a short marker value")
    return kind == COMMIT, _CONTROL_VALUE.unpack_from(value)[1]


def encode_txnindex(entries: list[AbortedTxn]) -> bytes:
    return b"".join(_ENTRY.pack(0, e.producer_id, e.first_offset, e.last_offset, e.last_stable_offset)
                    for e in entries)


def decode_txnindex(data: bytes, what: str = ".txnindex") -> list[AbortedTxn]:
    if len(data) % ENTRY_SIZE:
        raise CorruptObject(f"{what}: {len(data)} bytes is not a whole number of entries")
    out = []
    for pos in range(0, len(data), ENTRY_SIZE):
        version, pid, first, last, lso = _ENTRY.unpack_from(data, pos)
        if version != 0 or first > last:
            raise CorruptObject(f"{what}: bad entry at byte {pos}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out
