"""Produce: validate batches, assign offsets, append, and answer per `acks`.

The synchronous part (validation and append) runs before any await so that requests on
one connection append in order; only the wait for the WAL commit (`acks=all`) is deferred.
"""

from __future__ import annotations

import asyncio

from stratalog.gateway.auth.acls import Operation, ResourceType
from stratalog.gateway.errors import error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import NO_RESPONSE, ApiKey, Deferred, RequestContext, handles


def _produce_partition(broker, topic: str, index: int, records, now_ms: int):
    """Append one partition's batches; returns (response dict, awaitable or None)."""
    resp = {"index": index, "error_code": 0, "base_offset": -1, "log_append_time_ms": -1,
            "log_start_offset": -1}
    try:
        appended = broker.engine.append(topic, index, records, now_ms=now_ms)
    except Exception as e:  # noqa: BLE001 - every failure becomes this partition's error code
        resp["error_code"] = error_code(e)
        resp["error_message"] = error_message(e)
        return resp, None
    if broker.metrics is not None:
        broker.metrics.produced(topic, appended.bytes, appended.records)
    resp["base_offset"] = appended.base_offset
    resp["log_start_offset"] = appended.log_start_offset
    if broker.topic_config(topic, "message.timestamp.type") == "LogAppendTime":
        resp["log_append_time_ms"] = now_ms
    return resp, appended.commit


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
            elif not ctx.allowed(Operation.WRITE, ResourceType.TOPIC, t.name):
                resp = {"index": pd.index, "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
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
    # One wait for all partitions: a WAL commit future is shared by every request whose
    # batches are in that flush, and asyncio.wait never cancels what it waits for.
    pending = [(resp, asyncio.ensure_future(w)) for resp, w in waits]
    _, late = await asyncio.wait({f for _, f in pending}, timeout=max(timeout_ms, 1) / 1000)
    for resp, f in pending:
        if f in late:
            if isinstance(f, asyncio.Task):
                f.cancel()  # a retried batch's wait for its original, ours alone
            resp["error_code"] = ErrorCode.REQUEST_TIMED_OUT
            resp["error_message"] = "the batch was not committed within the request timeout"
        elif f.exception() is not None:
            resp["error_code"] = error_code(f.exception())
            resp["error_message"] = error_message(f.exception())
    return body
