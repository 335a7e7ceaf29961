"""ListOffsets (earliest, latest - the last stable offset for READ_COMMITTED -, by
timestamp, max timestamp, earliest local and latest tiered) and OffsetForLeaderEpoch."""

from __future__ import annotations

from stratalog.engine.engine import EARLIEST, EARLIEST_LOCAL, LATEST, LATEST_TIERED, MAX_TIMESTAMP
from stratalog.engine.errors import EngineError, NotLeader, UnknownTopicOrPartition
from stratalog.gateway.auth.acls import Operation, ResourceType
from stratalog.gateway.errors import error_code
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles


# The negative timestamps each version may carry: EARLIEST_LOCAL from v8, LATEST_TIERED
# from v9 (Kafka's Java AdminClient's OffsetSpec.earliestLocal() and latestTiered()).
_SPECS_SINCE = {v: (LATEST, EARLIEST, MAX_TIMESTAMP, *((EARLIEST_LOCAL,) if v >= 8 else ()),
                    *((LATEST_TIERED,) if v >= 9 else ())) for v in range(0, 11)}


async def _one(ctx: RequestContext, topic: str, p, version: int, read_committed: bool) -> dict:
    broker = ctx.broker
    out = {"partition_index": p.partition_index, "error_code": 0, "timestamp": -1, "offset": -1,
           "leader_epoch": -1}
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, topic):
        out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
        return out
    try:
        plog = broker.engine.leader(topic, p.partition_index, p.current_leader_epoch if version >= 4 else -1)
    except EngineError as e:
        out["error_code"] = error_code(e)
        return out
    out["leader_epoch"] = plog.leader_epoch
    if p.timestamp < 0 and p.timestamp not in _SPECS_SINCE[version]:
        out["error_code"] = ErrorCode.INVALID_REQUEST
        return out
    try:
        found = await broker.engine.list_offset(plog, p.timestamp, read_committed=read_committed)
    except EngineError as e:
        out["error_code"] = error_code(e)
        return out
    if found is not None:
        out["offset"], out["timestamp"] = found
    return out


@handles(ApiKey.LIST_OFFSETS, 1, 10)
async def list_offsets(ctx: RequestContext, req):
    topics = []
    for t in req.topics:
        parts = [await _one(ctx, t.name, p, ctx.version, ctx.version >= 2 and req.isolation_level == 1)
                 for p in t.partitions]
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
            if not ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t.topic):
                out["error_code"] = ErrorCode.TOPIC_AUTHORIZATION_FAILED
                parts.append(out)
                continue
            try:
                plog = broker.engine.leader(t.topic, p.partition, p.current_leader_epoch if ctx.version >= 2 else -1)
            except EngineError as e:
                # Not led here is answered as unknown, as it always has been for this API.
                out["error_code"] = error_code(UnknownTopicOrPartition() if isinstance(e, NotLeader) else e)
            else:
                out["leader_epoch"], out["end_offset"] = plog.end_offset_for_epoch(p.leader_epoch)
            parts.append(out)
        topics.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
