"""DescribeLogDirs: the size of each partition this gateway leads, as Kafka's brokers
report their replicas' log directories (kafka-log-dirs.sh, and the topic sizes admin UIs
show).

A gateway has one "log directory": its object store, named by URL, since that is where a
partition's data lives; the local disk only caches it. Only led partitions are reported:
a partition's data is stored once whatever its replication factor, so the sizes that
tools add up over brokers come to what is stored. The volume's total and usable bytes
are those of the disk under a file:// store, and unknown (-1) for S3.
"""

from __future__ import annotations

import shutil
from typing import Any

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.tiering.objectstore.file import FileObjectStore

from .registry import ApiKey, RequestContext, handles

UNKNOWN_BYTES = -1


@handles(ApiKey.DESCRIBE_LOG_DIRS, 0, 4)
async def describe_log_dirs(ctx: RequestContext, req) -> dict[str, Any]:
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "results": []}
    wanted = None if req.topics is None else {t.topic: set(t.partitions) for t in req.topics}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, p), plog in sorted(ctx.broker.engine.led().items()):
        if wanted is not None and p not in wanted.get(topic, ()):
            continue
        by_topic.setdefault(topic, []).append({"partition_index": p, "partition_size": plog.size_bytes,
                                               "offset_lag": 0, "is_future_key": False})
    objects = ctx.broker.objects
    total, usable = UNKNOWN_BYTES, UNKNOWN_BYTES
    if isinstance(objects, FileObjectStore):
        usage = shutil.disk_usage(objects.root)
        total, usable = usage.total, usage.free
    return {"throttle_time_ms": 0, "error_code": ErrorCode.NONE, "results": [{
        "error_code": ErrorCode.NONE, "log_dir": objects.url,
        "topics": [{"name": name, "partitions": parts} for name, parts in by_topic.items()],
        "total_bytes": total, "usable_bytes": usable}]}
