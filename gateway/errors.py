"""The one place that turns internal failures into Kafka error codes.

A failure that maps to no specific code is a bug or an outage the client can only see as
UNKNOWN_SERVER_ERROR; each one is logged here with its traceback and the request it
failed (`serving`, set by the server around each handler).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from typing import Any

from stratalog.coordinator.model import Fenced, TopicExists, UnknownTopic
from stratalog.tiering.batch import CorruptBatch, UnsupportedMagic

from stratalog.engine import errors as engine
from stratalog.engine.producers import InvalidProducerEpoch, OutOfOrderSequence
from stratalog.engine.wal_writer import WalCommitDelayed, WalCommitFailed

from .config import ConfigError
from .protocol.error_codes import ErrorCode

log = logging.getLogger(__name__)

# The request whose handler is running (a RequestContext), for the log line of a failure.
serving: ContextVar[Any] = ContextVar("serving", default=None)


class KafkaError(Exception):
    """A failure that the protocol answers with a specific error code."""

    def __init__(self, code: ErrorCode, message: str = ""):
        super().__init__(message or code.name)
        self.code = code
        self.message = message


_BY_TYPE: list[tuple[type, ErrorCode]] = [
    (UnsupportedMagic, ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT),
    (CorruptBatch, ErrorCode.CORRUPT_MESSAGE),
    (OutOfOrderSequence, ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
    (InvalidProducerEpoch, ErrorCode.INVALID_PRODUCER_EPOCH),
    (Fenced, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (WalCommitFailed, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    # May still be committed: only a timeout tells the producer its retry could duplicate
    # (an idempotent producer's sequence check makes that retry safe).
    (WalCommitDelayed, ErrorCode.REQUEST_TIMED_OUT),
    (engine.StorageUnavailable, ErrorCode.KAFKA_STORAGE_ERROR),
    (TopicExists, ErrorCode.TOPIC_ALREADY_EXISTS),
    (UnknownTopic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (ConfigError, ErrorCode.INVALID_CONFIG),
    (engine.UnknownTopicOrPartition, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
    (engine.NotLeader, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    (engine.FencedLeaderEpoch, ErrorCode.FENCED_LEADER_EPOCH),
    (engine.UnknownLeaderEpoch, ErrorCode.UNKNOWN_LEADER_EPOCH),
    (engine.OffsetOutOfRange, ErrorCode.OFFSET_OUT_OF_RANGE),
    (engine.RecordTooLarge, ErrorCode.MESSAGE_TOO_LARGE),
    (engine.InvalidTimestamp, ErrorCode.INVALID_TIMESTAMP),  # before InvalidRecord, its base
    (engine.InvalidRecord, ErrorCode.INVALID_RECORD),
    (engine.SwapRefused, ErrorCode.INVALID_REQUEST),
    # Before CorruptLog, its base: a damaged range is CORRUPT_MESSAGE, which librdkafka and
    # the Java consumer hand to the application (KAFKA_STORAGE_ERROR they retry silently).
    (engine.CorruptRead, ErrorCode.CORRUPT_MESSAGE),
    (engine.CorruptLog, ErrorCode.KAFKA_STORAGE_ERROR),
    (engine.PartitionOffline, ErrorCode.KAFKA_STORAGE_ERROR),
]


def error_code(exc: BaseException) -> ErrorCode:
    """The code that answers `exc`; UNKNOWN_SERVER_ERROR, logged with the traceback, for
    anything not known to mean a specific one."""
    if isinstance(exc, KafkaError):
        return exc.code
    for kind, code in _BY_TYPE:
        if isinstance(exc, kind):
            return code
    log.error("%s: answered UNKNOWN_SERVER_ERROR for an unexpected %s",
              serving.get() or "outside any request", type(exc).__name__, exc_info=exc)
    return ErrorCode.UNKNOWN_SERVER_ERROR


def error_message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
