"""Replica placement for operators: AlterPartitionReassignments, ListPartitionReassignments
and ElectLeaders (the work is in `stratalog.gateway.reassignment`)."""

from __future__ import annotations

from collections import defaultdict

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.errors import error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.reassignment import PREFERRED, UNCLEAN
from stratalog.gateway.topic_admin import MAX_PARTITIONS_PER_REQUEST

from .registry import ApiKey, RequestContext, handles

_DENIED = "ALTER on the cluster is not allowed"
# Each partition named costs coordinator reads and maybe a write: a request names at most
# as many as a CreateTopics may create.
_TOO_MANY = f"a request may name at most {MAX_PARTITIONS_PER_REQUEST} partitions; send several"


def _result(e: Exception | None) -> tuple[int, str | None]:
    return (0, None) if e is None else (error_code(e), error_message(e))


@handles(ApiKey.ALTER_PARTITION_REASSIGNMENTS, 0, 0)
async def alter_partition_reassignments(ctx: RequestContext, req):
    broker = ctx.broker
    if not ctx.allowed(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": _DENIED, "responses": []}
    if sum(len(t.partitions) for t in req.topics) > MAX_PARTITIONS_PER_REQUEST:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST,
                "error_message": _TOO_MANY, "responses": []}
    known = await broker.replicas.states()
    live = await broker.replicas.live_now()
    out = []
    changed = False
    for t in req.topics:
        rows = []
        for p in t.partitions:
            failure: Exception | None = None
            try:
                await broker.replicas.reassign(t.name, p.partition_index,
                                               None if p.replicas is None else list(p.replicas), live,
                                               known.get((t.name, p.partition_index)))
                changed = True
            except Exception as e:  # noqa: BLE001 - reported per partition
                failure = e
            code, message = _result(failure)
            rows.append({"partition_index": p.partition_index, "error_code": code, "error_message": message})
        out.append({"name": t.name, "partitions": rows})
    if changed:
        await broker.replicas.settle()
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "responses": out}


@handles(ApiKey.LIST_PARTITION_REASSIGNMENTS, 0, 0)
async def list_partition_reassignments(ctx: RequestContext, req):
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "error_message": "DESCRIBE on the cluster is not allowed", "topics": []}
    wanted = None if req.topics is None else {t.name: list(t.partition_indexes) for t in req.topics}
    by_topic: dict[str, list[dict]] = defaultdict(list)
    for name, p, st in await ctx.broker.replicas.ongoing(wanted):
        by_topic[name].append({"partition_index": p, "replicas": list(st.replicas),
                               "adding_replicas": list(st.adding), "removing_replicas": list(st.removing)})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
            "topics": [{"name": n, "partitions": rows} for n, rows in by_topic.items()]}


@handles(ApiKey.ELECT_LEADERS, 0, 2)
async def elect_leaders(ctx: RequestContext, req):
    broker = ctx.broker
    election = req.election_type if ctx.version >= 1 else PREFERRED
    everything = req.topic_partitions is None
    allowed = ctx.allowed(Operation.ALTER, ResourceType.CLUSTER, CLUSTER_NAME)
    top = 0 if allowed else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    if everything:
        # Partitions are listed only to a requester allowed to elect them.
        targets = list(await broker.replicas.every_partition()) if allowed else []
    else:
        if sum(len(t.partitions) for t in req.topic_partitions) > MAX_PARTITIONS_PER_REQUEST:
            return {"throttle_time_ms": 0, "error_code": ErrorCode.INVALID_REQUEST, "replica_election_results": []}
        known = await broker.replicas.states() if allowed else {}
        targets = [(t.topic, p, known.get((t.topic, p))) for t in req.topic_partitions for p in t.partitions]
    if allowed and election not in (PREFERRED, UNCLEAN):
        top = ErrorCode.INVALID_REQUEST  # each partition says why below
    live = set(await broker.replicas.live_now()) if allowed and targets else set()
    results: dict[str, list[dict]] = {}
    changed = False
    for name, p, known in targets:
        rows = results.setdefault(name, [])
        if not allowed:
            rows.append({"partition_id": p, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                         "error_message": _DENIED})
            continue
        failure: Exception | None = None
        try:
            await broker.replicas.elect(name, p, election, live, known)
            changed = True
        except Exception as e:  # noqa: BLE001 - reported per partition
            failure = e
        code, message = _result(failure)
        # Electing every partition lists only those that needed it, as Kafka does.
        if not (everything and code == ErrorCode.ELECTION_NOT_NEEDED):
            rows.append({"partition_id": p, "error_code": code, "error_message": message})
    if changed:
        await broker.replicas.settle()
    return {"throttle_time_ms": 0, "error_code": top,
            "replica_election_results": [{"topic": n, "partition_result": rows} for n, rows in results.items()
                                         if rows or not everything]}
