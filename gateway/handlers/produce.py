"""Produce: validate batches, assign offsets, append, and answer per `acks`.

The synchronous part (validation and append) runs before any await so that requests on
one connection append in order; only the wait for the WAL commit (`acks=all`) is deferred.
"""

from __future__ import annotations

import asyncio

from stratalog.gateway.errors import KafkaError, error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.server import NO_RESPONSE, Deferred
from stratalog.tiering.batch import CorruptBatch, decode_records, split_batches

from .registry import ApiKey, RequestContext, handles


def _validate(broker, topic: str, records) -> list:
    if records is None or len(records) == 0:
        raise KafkaError(ErrorCode.CORRUPT_MESSAGE, "no record batches")
    batches = split_batches(records)
    max_bytes = broker.topic_config(topic, "max.message.bytes")
    compacted = "compact" in broker.topic_config(topic, "cleanup.policy")
    for h, view in batches:
        if h.size > max_bytes:
            raise KafkaError(ErrorCode.MESSAGE_TOO_LARGE,
                             f"batch of {h.size} bytes exceeds max.message.bytes {max_bytes}")
        if h.is_transactional or h.is_control:
            raise KafkaError(ErrorCode.INVALID_RECORD, "transactional batches are not supported")
        if compacted:
            try:
                records_ = decode_records(view)
            except CorruptBatch as e:
                raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
            if any(r.key is None for r in records_):
                raise KafkaError(ErrorCode.INVALID_RECORD, "compacted topic requires a key on every record")
    return batches


def _produce_partition(broker, topic: str, index: int, records, now_ms: int):
    """Append one partition's batches; returns (response dict, awaitable or None)."""
    resp = {"index": index, "error_code": 0, "base_offset": -1, "log_append_time_ms": -1,
            "log_start_offset": -1}
    plog = broker.partition_leader(topic, index)
    try:
        if plog is None:
            if broker.partition_count(topic) is None or index >= broker.partition_count(topic):
                raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER)
        batches = _validate(broker, topic, records)
        log_append = broker.topic_config(topic, "message.timestamp.type") == "LogAppendTime"
        wait = None
        base = None
        for h, view in batches:
            original = plog.check_duplicate(h)
            if original is not None:
                if base is None:
                    base = original.base_offset
                wait = _committed_past(broker, plog, original.last_offset)
                continue
            data, stored = plog.append(view, h, now_ms=now_ms, log_append_time=log_append)
            if base is None:
                base = stored.base_offset
            wait = broker.wal.add(plog, stored.base_offset, stored.last_offset, stored.max_timestamp, data)
        broker.maybe_roll(plog)
        if broker.metrics is not None:
            broker.metrics.produced(topic, sum(h.size for h, _ in batches),
                                    sum(h.records_count for h, _ in batches))
        resp["base_offset"] = base
        resp["log_start_offset"] = plog.log_start_offset
        if log_append:
            resp["log_append_time_ms"] = now_ms
        return resp, wait
    except Exception as e:  # noqa: BLE001 - every failure becomes this partition's error code
        resp["error_code"] = error_code(e)
        resp["error_message"] = error_message(e)
        return resp, None


async def _committed_past(broker, plog, last_offset: int) -> None:
    while plog.high_watermark <= last_offset:
        await broker.wait_for_data(1.0)


@handles(ApiKey.PRODUCE, 3, 11)
async def produce(ctx: RequestContext, req):
    broker = ctx.broker
    now_ms = broker.now_ms()
    responses = []
    waits: list[tuple[dict, object]] = []
    for t in req.topic_data:
        parts = []
        for pd in t.partition_data:
            if req.acks not in (-1, 0, 1):
                resp = {"index": pd.index, "error_code": ErrorCode.INVALID_REQUIRED_ACKS,
                        "base_offset": -1}
                wait = None
            elif req.transactional_id is not None:
                resp = {"index": pd.index, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                        "base_offset": -1, "error_message": "transactions are not supported"}
                wait = None
            else:
                resp, wait = _produce_partition(broker, t.name, pd.index, pd.records, now_ms)
            parts.append(resp)
            if wait is not None:
                waits.append((resp, wait))
        responses.append({"name": t.name, "partition_responses": parts})
    body = {"responses": responses, "throttle_time_ms": 0}
    if req.acks == 0:
        return NO_RESPONSE
    if req.acks == 1 or not waits:
        for _, w in waits:
            if asyncio.iscoroutine(w):
                w.close()
        return body
    return Deferred(_await_commit(body, waits, req.timeout_ms))


async def _await_commit(body: dict, waits, timeout_ms: int) -> dict:
    async def one(resp, w):
        try:
            await asyncio.wait_for(asyncio.shield(w) if isinstance(w, asyncio.Future) else w,
                                   max(timeout_ms, 1) / 1000)
        except asyncio.TimeoutError:
            resp["error_code"] = ErrorCode.REQUEST_TIMED_OUT
            resp["error_message"] = "the batch was not committed within the request timeout"
        except Exception as e:  # noqa: BLE001
            resp["error_code"] = error_code(e)
            resp["error_message"] = error_message(e)

    await asyncio.gather(*(one(r, w) for r, w in waits))
    return body
