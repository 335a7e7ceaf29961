"""DescribeLogDirs: where this gateway keeps the partitions it leads, and their sizes.

A gateway has one log directory, its data directory (the local active segments and the
read cache); a partition's size is its whole log, sealed segments in the object store
included, so tools that show topic sizes from DescribeLogDirs (kafka-log-dirs.sh, the
Java AdminClient's describeLogDirs, web consoles) show what the topic holds. Each gateway
reports the partitions it leads: asked of every gateway, as those tools do, each partition
appears once. Disk totals (v4) are those of the data directory's file system.
"""

from __future__ import annotations

import shutil

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles


@handles(ApiKey.DESCRIBE_LOG_DIRS, 0, 4)
async def describe_log_dirs(ctx: RequestContext, req):
    broker = ctx.broker
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        # Kafka answers an empty list (v3+ also says why in the top-level error code).
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "results": []}
    wanted = None if req.topics is None else {(t.topic, p) for t in req.topics for p in t.partitions}
    by_topic: dict[str, list[dict]] = {}
    for (topic, partition), plog in sorted(broker.engine.led().items()):
        if wanted is None or (topic, partition) in wanted:
            by_topic.setdefault(topic, []).append({"partition_index": partition, "partition_size": plog.size_bytes,
                                                   "offset_lag": 0, "is_future_key": False})
    try:
        disk = shutil.disk_usage(broker.data_dir)
        total, usable = disk.total, disk.free
    except OSError:
        total = usable = -1  # Kafka's "unknown"
    return {"throttle_time_ms": 0, "error_code": 0, "results": [{
        "error_code": 0, "log_dir": str(broker.data_dir), "total_bytes": total, "usable_bytes": usable,
        "topics": [{"name": name, "partitions": rows} for name, rows in by_topic.items()]}]}
