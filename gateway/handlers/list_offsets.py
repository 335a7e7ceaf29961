"""ListOffsets (earliest, latest, by timestamp, max timestamp) and OffsetForLeaderEpoch."""

from __future__ import annotations

from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles

LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


async def _one(broker, topic: str, p, version: int) -> dict:
    out = {"partition_index": p.partition_index, "error_code": 0, "timestamp": -1, "offset": -1,
           "leader_epoch": -1}
    plog = broker.partition_leader(topic, p.partition_index)
    if plog is None:
        count = broker.partition_count(topic)
        out["error_code"] = (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
                             if count is None or p.partition_index >= count
                             else ErrorCode.NOT_LEADER_OR_FOLLOWER)
        return out
    if version >= 4 and p.current_leader_epoch >= 0 and p.current_leader_epoch != plog.leader_epoch:
        out["error_code"] = (ErrorCode.FENCED_LEADER_EPOCH if p.current_leader_epoch < plog.leader_epoch
                             else ErrorCode.UNKNOWN_LEADER_EPOCH)
        return out
    out["leader_epoch"] = plog.leader_epoch
    ts = p.timestamp
    if ts == LATEST:
        out["offset"] = plog.high_watermark
    elif ts == EARLIEST:
        out["offset"] = plog.log_start_offset
    elif ts == MAX_TIMESTAMP:
        found = await plog.max_timestamp_offset(broker.cache)
        if found is not None:
            out["offset"], out["timestamp"] = found
    elif ts < 0:
        out["error_code"] = ErrorCode.INVALID_REQUEST
    else:
        found = await plog.offset_for_timestamp(ts, broker.cache)
        if found is not None:
            out["offset"], out["timestamp"] = found
    return out


@handles(ApiKey.LIST_OFFSETS, 1, 10)
async def list_offsets(ctx: RequestContext, req):
    topics = []
    for t in req.topics:
        parts = [await _one(ctx.broker, t.name, p, ctx.version) for p in t.partitions]
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}


@handles(ApiKey.OFFSET_FOR_LEADER_EPOCH, 0, 4)
async def offset_for_leader_epoch(ctx: RequestContext, req):
    broker = ctx.broker
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            out = {"partition": p.partition, "error_code": 0, "leader_epoch": -1, "end_offset": -1}
            plog = broker.partition_leader(t.topic, p.partition)
            if plog is None:
                out["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif ctx.version >= 2 and p.current_leader_epoch >= 0 and p.current_leader_epoch != plog.leader_epoch:
                out["error_code"] = (ErrorCode.FENCED_LEADER_EPOCH
                                     if p.current_leader_epoch < plog.leader_epoch
                                     else ErrorCode.UNKNOWN_LEADER_EPOCH)
            else:
                out["leader_epoch"], out["end_offset"] = plog.end_offset_for_epoch(p.leader_epoch)
            parts.append(out)
        topics.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
