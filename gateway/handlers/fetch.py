"""Fetch: committed batches as stored, with long poll and byte limits.

Batches go out exactly as they were appended (never re-encoded). The first partition
with data always gets at least one whole batch, even past `max_bytes`, so a consumer can
never stall on a large batch; after that, partitions are filled while they fit in
`max_bytes`, which the broker's `fetch.max.bytes` caps. A partition listed more than once
is answered once. A long poll ends early, with what it has, once another request arrives
behind it on the connection (answers go out in request order, so that one would wait).

Under a consumer_byte_rate quota a response holds at most what is left of the quota over
its measured span; one that would take the client over its quota (its first batch alone
may) is answered empty with the throttle time instead and its bytes are not counted, as
Kafka does.

READ_COMMITTED fetches stop at the last stable offset and list the aborted transactions
in the range, whose records the client drops (leaders and replicas alike).
"""

from __future__ import annotations

import asyncio
import time

from stratalog.engine.errors import EngineError
from stratalog.gateway.auth.acls import Operation, ResourceType
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.quotas.rules import CONSUMER_BYTE_RATE
from .registry import ApiKey, Deferred, RequestContext, handles


def _resolve_topic(broker, t, version: int):
    if version >= 13:
        info = broker.topics_by_id.get(t.topic_id)
        return (info.name if info else None), t.topic_id
    info = broker.topics.get(t.topic)
    return t.topic, (info.topic_id if info else None)


READ_COMMITTED = 1


async def _read_all(broker, req, version: int, readable, quota_bytes: int | None) -> tuple[list, int]:
    remaining = min(req.max_bytes if version >= 3 else 0x7FFFFFFF, broker.config["fetch.max.bytes"])
    if quota_bytes is not None:
        remaining = min(remaining, quota_bytes)
    committed_only = req.isolation_level == READ_COMMITTED
    seen: set[tuple[str, int]] = set()
    total = 0
    responses = []
    for t in req.topics:
        name, topic_id = _resolve_topic(broker, t, version)
        parts = []
        for p in t.partitions:
            key = (t.topic if version < 13 else str(t.topic_id), p.partition)
            if key in seen:
                continue  # a partition asked for twice is answered once, as Kafka keys a fetch
            seen.add(key)
            entry = {"partition_index": p.partition, "error_code": 0, "high_watermark": -1,
                     "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                     "preferred_read_replica": -1, "records": b""}
            parts.append(entry)
            if name is None:
                entry["error_code"] = (ErrorCode.UNKNOWN_TOPIC_ID if version >= 13
                                       else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if not readable(name):
                entry["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                # A follower serves consumers that the leader sent to it (KIP-392).
                source = broker.engine.partition(name, p.partition,
                                                 p.current_leader_epoch if version >= 9 else -1,
                                                 followers=True)
            except EngineError as e:
                entry["error_code"] = error_code(e)
                continue
            entry["high_watermark"] = source.high_watermark
            entry["last_stable_offset"] = source.last_stable_offset
            entry["log_start_offset"] = source.log_start_offset
            offset = p.fetch_offset
            if offset < source.log_start_offset or offset > source.high_watermark:
                entry["error_code"] = ErrorCode.OFFSET_OUT_OF_RANGE
                continue
            if version >= 11 and req.rack_id:
                preferred = broker.preferred_read_replica(name, p.partition, req.rack_id)
                if preferred >= 0:
                    entry["preferred_read_replica"] = preferred
                    continue
            limit = min(p.partition_max_bytes, remaining)
            if limit <= 0 and total > 0:
                continue
            try:
                data = await broker.engine.read(source, offset, max(limit, 1), read_committed=committed_only)
            except EngineError as e:
                entry["error_code"] = error_code(e)
                continue
            if total > 0 and len(data) > limit:
                data = b""  # only the first partition with data may go past the limit (one batch)
            if committed_only:
                entry["aborted_transactions"] = [
                    {"producer_id": a.producer_id, "first_offset": a.first_offset}
                    for a in broker.engine.aborted_transactions(source, offset)]
            if data:
                entry["records"] = data
                total += len(data)
                remaining -= len(data)
        responses.append({"topic": name if name is not None else t.get("topic", ""),
                          "topic_id": topic_id, "partitions": parts})
    return responses, total


@handles(ApiKey.FETCH, 4, 17)
async def fetch(ctx: RequestContext, req):
    broker = ctx.broker
    version = ctx.version
    def readable(topic: str) -> bool:
        return ctx.allowed(Operation.READ, ResourceType.TOPIC, topic)

    quota_bytes = broker.quotas.fetch_allowance(ctx.principal, ctx.client_id)
    responses, total = await _read_all(broker, req, version, readable, quota_bytes)
    if total >= max(req.min_bytes, 1) or req.max_wait_ms <= 0 or _has_errors(responses):
        return _answer(ctx, responses, total)
    return Deferred(_long_poll(ctx, req, version, responses, total, readable, quota_bytes))


def _has_errors(responses) -> bool:
    return any(p["error_code"] for t in responses for p in t["partitions"])


async def _long_poll(ctx, req, version, responses, total, readable, quota_bytes):
    """Wait for data up to max_wait_ms, but no longer than until another request arrives
    behind this one on the connection: its answer has to wait for this one's, and a
    FindCoordinator or Metadata held up that long starts client loops (librdkafka fails a
    queued OffsetCommit each time its coordinator is set again, then asks again: seen as a
    consumer that stopped heartbeating). An early, shorter answer is one a fetch may get."""
    broker = ctx.broker
    deadline = time.monotonic() + req.max_wait_ms / 1000
    behind = ctx.request_behind
    while total < max(req.min_bytes, 1):
        left = deadline - time.monotonic()
        if left <= 0 or (behind is not None and behind.is_set()):
            break
        await _data_or_request_behind(broker, behind, left)
        responses, total = await _read_all(broker, req, version, readable, quota_bytes)
        if _has_errors(responses):
            break
    return _answer(ctx, responses, total)


async def _data_or_request_behind(broker, behind: asyncio.Event | None, timeout_s: float) -> None:
    if behind is None:
        await broker.engine.wait_for_data(timeout_s)
        return
    waits = {asyncio.ensure_future(broker.engine.wait_for_data(timeout_s)),
             asyncio.ensure_future(behind.wait())}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _answer(ctx: RequestContext, responses, total: int) -> dict:
    """The response, or an empty one when its bytes would take the client over its
    consumer_byte_rate (those bytes are then not counted)."""
    broker = ctx.broker
    quotas = broker.quotas
    throttle_ms = quotas.record(CONSUMER_BYTE_RATE, ctx.principal, ctx.client_id, total)
    if throttle_ms <= 0:
        if broker.metrics is not None:
            for t in responses:
                for p in t["partitions"]:
                    if p["records"]:
                        broker.metrics.fetched(t["topic"], len(p["records"]))
        return _body(responses)
    quotas.unrecord(CONSUMER_BYTE_RATE, ctx.principal, ctx.client_id, total)
    ctx.throttle(throttle_ms)
    for t in responses:
        for p in t["partitions"]:
            p["records"] = b""
            p["aborted_transactions"] = None
    return _body(responses)


def _body(responses) -> dict:
    return {"throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": responses}
