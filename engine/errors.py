"""What the log engine refuses, as types; `stratalog.gateway.errors` maps each to its Kafka
error code, so the engine knows nothing of the protocol."""

from __future__ import annotations


class EngineError(Exception):
    """A request the engine refuses; the message says why."""


class UnknownTopicOrPartition(EngineError):
    """No such topic, or the topic has fewer partitions."""


class NotLeader(EngineError):
    """This gateway does not lead the partition now (retriable: the client refreshes metadata)."""


class FencedLeaderEpoch(EngineError):
    """The client's leader epoch is older than the partition's."""


class UnknownLeaderEpoch(EngineError):
    """The client's leader epoch is newer than the one this gateway knows."""


class OffsetOutOfRange(EngineError):
    """The offset is outside [log start, high watermark]."""


class RecordTooLarge(EngineError):
    """A batch is larger than the topic's max.message.bytes."""


class InvalidRecord(EngineError):
    """A batch the topic cannot take (a control batch, a keyless record on a compacted topic).

    `records`: when particular records are to blame, (index among the partition's records
    in the request, message or None) of each, for the Produce response's record_errors."""

    def __init__(self, message: str, records: list[tuple[int, str | None]] | None = None):
        super().__init__(message)
        self.records = records or []


class InvalidTimestamp(InvalidRecord):
    """Records whose CreateTime is outside the topic's message.timestamp.before/after.max.ms."""


class SwapRefused(EngineError):
    """A compaction swap that does not fit the log as it is now (segments rewritten since,
    objects missing, offsets outside the replaced range)."""


class CorruptLog(EngineError):
    """Committed data could not be read back intact; the partition is not served."""


class PartitionOffline(EngineError):
    """The partition's committed data could not be recovered: it is offline until an
    operator recovers it (`stratalog partitions recover`); the message says why."""


class RepairRefused(EngineError):
    """An operator's recovery of an offline partition that cannot be done as asked (the
    partition is not offline, or its data is still damaged and truncation was not asked)."""


class CorruptRead(CorruptLog):
    """A range read from the object store failed its CRC-32C or framing checks: that read is
    refused (answered CORRUPT_MESSAGE, which clients hand to the application) and nothing
    of it is served or kept in the cache; the rest of the partition stays readable."""


class StorageUnavailable(EngineError):
    """The WAL cannot be written (no space, no permission, the store down) and has not for
    longer than the fault bound: new batches are refused, never appended."""
