"""What a partition's leader checks in a producer's batches before it appends any of them.

Batch-level checks read only the 61-byte headers (size, control and transactional bits).
Record-level checks (a key on every record of a compacted topic, timestamps within
message.timestamp.before.max.ms / after.max.ms of the gateway's clock; a batch claiming
LogAppendTime, which only a broker may stamp, has every record refused) decode records,
so they run only when the topic needs them: a compacted topic, a lower timestamp bound
(a record may be older than its batch's first timestamp, so only the records tell), or a
batch whose header `maxTimestamp` is past the upper bound or was never filled in (below
the first timestamp: Sarama 1.22 sends -1). Everything else stays bytes.

A record that fails refuses every batch of the request for that partition (nothing is
appended), and the error names each such record by its index among the partition's
records in the request (KIP-467's `batch_index`: with one batch, as Kafka's clients send,
its index in the batch), so clients fail exactly those records and the others with an
error of their own. Like Kafka, one error per record, the key checked first; any bad
timestamp makes the partition's error INVALID_TIMESTAMP, otherwise INVALID_RECORD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from stratalog.tiering.batch import (LOG_APPEND_TIME, BatchHeader, CorruptBatch, decode_records, require_crc,
                                     split_batches)

from .errors import InvalidRecord, InvalidTimestamp, RecordTooLarge

NO_TIMESTAMP = -1
NO_BOUND = 2**63 - 1  # Kafka's default for the timestamp bounds: none
# Records whose error carries a message; the rest are listed by index with none, so a
# refused batch of many small records answers with a few bytes per record, not a sentence.
MESSAGES_KEPT = 100
# Records listed at most (a compressed batch may hold millions of empty records): about
# 600 KB of response. Clients fail the records past it as refused for another record.
RECORDS_LISTED = 100_000


@dataclass(frozen=True)
class TimestampBounds:
    """The CreateTime timestamps a topic accepts now: [low, high], either side open (None)."""

    low: int | None
    high: int | None

    @classmethod
    def of(cls, now_ms: int, before_ms: int, after_ms: int, difference_ms: int) -> TimestampBounds | None:
        """Bounds from the topic's configs; the deprecated difference.max.ms stands in for
        before/after while they are at their default, as in Kafka 3.6+. None: no bound."""
        before = before_ms if before_ms != NO_BOUND else difference_ms
        after = after_ms if after_ms != NO_BOUND else difference_ms
        if before == NO_BOUND and after == NO_BOUND:
            return None
        return cls(None if before == NO_BOUND else now_ms - before,
                   None if after == NO_BOUND else now_ms + after)

    def outside(self, timestamp: int) -> bool:
        if timestamp == NO_TIMESTAMP:
            return False  # a record without a timestamp is not checked, as in Kafka
        return (self.low is not None and timestamp < self.low) or (self.high is not None and timestamp > self.high)

    def scan_needed(self, h: BatchHeader) -> bool:
        # A maxTimestamp below the first timestamp was never filled in: only the records tell.
        return self.low is not None or (self.high is not None and (h.max_timestamp > self.high or
                                                                   h.max_timestamp < h.base_timestamp))


@dataclass(slots=True)
class Batches:
    """One partition's records from a produce request, split into batches whose headers
    are parsed once: the produce handler's transactional checks, validation, the sequence
    checks and the append all read these. Splitting never raises: records that are not
    whole v2 batches keep the reason in `error`, which validation raises, so checks made
    before the append see `first` (the first header, when it parses) as they would have
    seen it parsing their own."""

    batches: list[tuple[BatchHeader, memoryview]]
    error: CorruptBatch | None = None
    first: BatchHeader | None = None

    @classmethod
    def split(cls, records) -> Batches:
        if records is None or len(records) == 0:
            return cls([], CorruptBatch("no record batches"))
        try:
            batches = split_batches(records, validate_crc=False)  # checked by validate_batches
        except CorruptBatch as e:
            try:
                first: BatchHeader | None = BatchHeader.parse(records, 0)
            except CorruptBatch:
                first = None
            return cls([], e, first)
        return cls(batches, None, batches[0][0])


def validate_batches(records, *, max_bytes: int, compacted: bool,
                     timestamps: TimestampBounds | None) -> list[tuple[BatchHeader, memoryview]]:
    """The request's batches for one partition (`Batches`, or the records to split), each
    checked: whole v2 batches (CorruptBatch), CRC-32C (CorruptBatch), then RecordTooLarge,
    InvalidRecord or InvalidTimestamp (with `records`: (index, message) of each bad
    record)."""
    split = records if isinstance(records, Batches) else Batches.split(records)
    if split.error is not None:
        raise split.error
    batches = split.batches
    pos = 0
    for h, view in batches:  # every CRC before any other check, as when splitting checked them
        require_crc(view, h, pos)
        pos += len(view)
    refused = _Refused()
    first = 0  # index of the batch's first record among the partition's records
    for h, view in batches:
        size = len(view)
        if size > max_bytes:
            raise RecordTooLarge(f"batch of {size} bytes exceeds max.message.bytes {max_bytes}")
        if h.is_control:
            raise InvalidRecord("clients may not write control batches (transaction markers)")
        if h.is_transactional and h.producer_id < 0:
            raise InvalidRecord("a transactional batch needs a producer id")
        if h.timestamp_type == LOG_APPEND_TIME:
            # Only a broker stamps LogAppendTime; Kafka refuses a producer's batch claiming it,
            # every record of it, on any topic. The header says so: nothing to decode.
            refused.timestamps += h.records_count
            refused.add_all(first, h.records_count, "is in a batch whose attributes claim LogAppendTime, "
                                                   "which only the broker may set")
            first += h.records_count
            continue
        checked = timestamps if timestamps is not None and timestamps.scan_needed(h) else None
        if compacted or checked is not None:
            # The CRC is checked above.
            for i, rec in enumerate(decode_records(view, validate_crc=False), start=first):
                if compacted and rec.key is None:
                    refused.add(i, lambda: f"record {i} has no key, and the topic is compacted "
                                           "(cleanup.policy=compact): every record needs one")
                elif checked is not None and checked.outside(rec.timestamp):
                    refused.timestamps += 1
                    refused.add(i, lambda: f"record {i} has timestamp {rec.timestamp}, outside the accepted "
                                           f"[{_bound(checked.low)}, {_bound(checked.high)}] (message.timestamp."
                                           "before.max.ms / after.max.ms around the broker's clock)")
        first += h.records_count
    refused.raise_if_any()
    return batches


class _Refused:
    """The records to blame: every one counted, the first RECORDS_LISTED listed, the first
    MESSAGES_KEPT of those with their message."""

    def __init__(self) -> None:
        self.listed: list[tuple[int, str | None]] = []
        self.count = 0
        self.timestamps = 0  # of them, for their timestamp

    def add(self, index: int, message: Callable[[], str]) -> None:
        self.count += 1
        if len(self.listed) < RECORDS_LISTED:
            self.listed.append((index, message() if len(self.listed) < MESSAGES_KEPT else None))

    def add_all(self, first: int, count: int, why: str) -> None:
        """`count` records from index `first`, for one reason (a header's count: listed up
        to the bound, whatever it claims)."""
        self.count += count
        for i in range(first, first + min(count, RECORDS_LISTED - len(self.listed))):
            self.listed.append((i, f"record {i} {why}" if len(self.listed) < MESSAGES_KEPT else None))

    def raise_if_any(self) -> None:
        if not self.count:
            return
        summary = "; ".join(m for _, m in self.listed[:3] if m)
        if self.timestamps:
            raise InvalidTimestamp(f"{self.count} record(s) refused, {self.timestamps} for their timestamp; "
                                   f"nothing was appended: {summary}", self.listed)
        raise InvalidRecord(f"{self.count} record(s) refused; nothing was appended: {summary}", self.listed)


def _bound(value: int | None) -> str:
    return "any" if value is None else str(value)
