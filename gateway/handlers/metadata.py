"""Metadata and DescribeCluster: brokers, topics, partition leaders, replicas and ISR."""

from __future__ import annotations

import uuid
from collections.abc import Collection

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.errors import KafkaError
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles

CLUSTER_ACTIONS_OMITTED = -2147483648
NO_TOPIC_ID = uuid.UUID(int=0)


def _brokers(ctx: RequestContext, id_field: str = "node_id"):
    """Every live gateway at its address on the listener this client connected to (a
    gateway without that listener is left out, as Kafka does)."""
    listener = ctx.session.listener.name if ctx.session else None
    out = []
    for a in ctx.broker.live_brokers():
        where = a.endpoint(listener)
        if where is not None:
            out.append({id_field: a.node_id, "host": where[0], "port": where[1], "rack": a.rack})
    return out


async def describe_topic(broker, name: str, info, error: int = 0, operations: int = CLUSTER_ACTIONS_OMITTED,
                         listed: Collection[int] | None = None) -> dict:
    """One topic's entry. `listed`: the brokers this answer lists (None: every leader is
    taken as listed). A leader missing from them (gone, or without the client's listener)
    is answered as Kafka answers it, LEADER_NOT_AVAILABLE and leader -1: a client can send
    nothing to a leader whose address it was not given."""
    partitions = []
    if info is not None:
        states = await broker.partition_states(info)
        for p in range(info.partitions):
            st = states.get(p)
            if st is None:
                partitions.append({"error_code": ErrorCode.LEADER_NOT_AVAILABLE, "partition_index": p,
                                   "leader_id": -1, "replica_nodes": [], "isr_nodes": []})
                continue
            # The partition's own error: the topic's (`error`) stays as given, or a client
            # (librdkafka) would take the whole topic for unavailable.
            if st.offline:  # its data could not be recovered: no leader, every replica offline
                p_error, offline = ErrorCode.KAFKA_STORAGE_ERROR, list(st.replicas)
            else:
                p_error, offline = (0 if st.leader >= 0 else ErrorCode.LEADER_NOT_AVAILABLE), []
            leader = st.leader
            if leader >= 0 and listed is not None and leader not in listed:
                p_error, leader = ErrorCode.LEADER_NOT_AVAILABLE, -1
            partitions.append({
                "error_code": p_error, "partition_index": p, "leader_id": leader,
                "leader_epoch": st.leader_epoch, "replica_nodes": list(st.replicas),
                "isr_nodes": list(st.isr), "offline_replicas": offline,
            })
    return {"error_code": error, "name": name, "topic_id": info.topic_id if info else None,
            "is_internal": False, "partitions": partitions, "topic_authorized_operations": operations}


def may_create(ctx: RequestContext, topic: str) -> bool:
    """CREATE on the cluster or on the topic, as Kafka checks CreateTopics and auto-creation."""
    return (ctx.allowed(Operation.CREATE, ResourceType.CLUSTER, CLUSTER_NAME)
            or ctx.allowed(Operation.CREATE, ResourceType.TOPIC, topic))


def by_id(topic) -> bool:
    """Whether a requested topic is named by its id. A non-zero id wins over the name, as in
    Kafka: Kafka's Java consumer asks for its KIP-848 assignment by id and leaves the name at
    its default, "" (not null)."""
    return getattr(topic, "topic_id", None) not in (None, NO_TOPIC_ID)


@handles(ApiKey.METADATA, 0, 12)
async def metadata(ctx: RequestContext, req):
    broker = ctx.broker
    topic_ops = ctx.version >= 8 and req.include_topic_authorized_operations

    def operations(name: str) -> int:
        return ctx.authorized_operations(ResourceType.TOPIC, name) if topic_ops else CLUSTER_ACTIONS_OMITTED
    # Each entry: a finished answer (dict), or (name, info, error) to describe below.
    entries: list = []
    if req.topics is None or (ctx.version == 0 and not req.topics):
        entries = [(name, broker.topics[name], 0) for name in sorted(broker.topics)
                   if ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, name)]  # only what it may see
    else:
        auto = req.allow_auto_topic_creation if ctx.version >= 4 else True
        await broker.look_up_topics([t.name for t in req.topics if not by_id(t)],
                                    [t.topic_id for t in req.topics if by_id(t)])
        for t in req.topics:
            entries.append(await _requested(ctx, t, auto))
    described = [e for e in entries if isinstance(e, tuple)]
    await broker.see_leaders([info for _, info, _ in described if info is not None])
    brokers = _brokers(ctx)
    listed = {b["node_id"] for b in brokers}
    topics = [e if isinstance(e, dict) else await describe_topic(broker, e[0], e[1], e[2], operations(e[0]), listed)
              for e in entries]
    cluster_ops = 8 <= ctx.version <= 10 and req.include_cluster_authorized_operations
    return {"throttle_time_ms": 0, "brokers": brokers, "cluster_id": broker.cluster_id,
            "controller_id": broker.controller_id(), "topics": topics,
            "cluster_authorized_operations": ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
            if cluster_ops else CLUSTER_ACTIONS_OMITTED}


async def _requested(ctx: RequestContext, t, auto: bool):
    """One requested topic: its answer when it has no partitions to describe (unknown id,
    not authorized), else (name, info or None, topic error), creating it if asked to."""
    broker = ctx.broker
    name = t.name
    if by_id(t):
        info = broker.topics_by_id.get(t.topic_id)
        if info is None:
            # The name is nullable from v12 only: v10-11 have no null for it.
            return {"error_code": ErrorCode.UNKNOWN_TOPIC_ID, "name": None if ctx.version >= 12 else "",
                    "topic_id": t.topic_id, "partitions": []}
        name = info.name
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, name):
        return {"error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED, "name": name,
                "topic_id": None, "is_internal": False, "partitions": []}
    info = broker.topics.get(name)
    error = 0
    if info is None and auto and may_create(ctx, name):
        try:
            info = await broker.admin.ensure_topic(name)
        except KafkaError as e:
            error = e.code
    if info is None and not error:
        error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    return name, info, error


@handles(ApiKey.DESCRIBE_CLUSTER, 0, 1)
async def describe_cluster(ctx: RequestContext, req):
    broker = ctx.broker
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "DESCRIBE on the cluster is not allowed", "endpoint_type": 1,
                "cluster_id": broker.cluster_id, "controller_id": -1, "brokers": [],
                "cluster_authorized_operations": CLUSTER_ACTIONS_OMITTED}
    return {"throttle_time_ms": 0, "error_code": 0, "endpoint_type": 1,
            "cluster_id": broker.cluster_id, "controller_id": broker.controller_id(),
            "brokers": _brokers(ctx, "broker_id"),
            "cluster_authorized_operations": ctx.authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
            if req.include_cluster_authorized_operations else CLUSTER_ACTIONS_OMITTED}
