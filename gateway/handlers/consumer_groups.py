"""Consumer-protocol group APIs (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe,
answered by `ctx.broker.groups.consumer` (`ConsumerGroups`).

Owned and assigned partitions travel as topic ids; ConsumerGroupDescribe adds the names.
v0 of ConsumerGroupHeartbeat has the coordinator make member ids; v1 lets the client bring
its own (KIP-1082) and adds the topic regex. Both are taken as they come: an empty member
id when joining gets one made here.
"""

from __future__ import annotations

from typing import Any

from stratalog.gateway.auth.acls import Operation, ResourceType
from stratalog.gateway.groups.consumer_membership import Subscription
from stratalog.gateway.groups.consumer_group import Partitions
from stratalog.gateway.handlers.groups import (OPERATIONS_NOT_REQUESTED, client_host, may_use,
                                               not_coordinator)
from stratalog.gateway.handlers.registry import ApiKey, RequestContext, handles
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.gateway.protocol.schema import Message


def _owned(topic_partitions: list | None) -> Partitions | None:
    if topic_partitions is None:
        return None
    out: dict = {}
    for tp in topic_partitions:
        out[tp.topic_id] = out.get(tp.topic_id, frozenset()) | frozenset(tp.partitions or [])
    return out


def _assignment(partitions: Partitions) -> dict[str, Any]:
    return {"topic_partitions": [{"topic_id": t, "partitions": sorted(ps)}
                                 for t, ps in sorted(partitions.items()) if ps]}


def _refusal(error: E, message: str) -> dict[str, Any]:
    return {"error_code": error, "error_message": message, "member_id": None,
            "member_epoch": 0, "heartbeat_interval_ms": 0, "assignment": None}


@handles(ApiKey.CONSUMER_GROUP_HEARTBEAT, 0, 1)
async def consumer_group_heartbeat(ctx: RequestContext, req: Message) -> dict[str, Any]:
    group_id = req.group_id
    if not may_use(ctx, group_id):
        return _refusal(E.GROUP_AUTHORIZATION_FAILED, f"READ on group {group_id!r} is not allowed")
    names = req.subscribed_topic_names
    if names is not None and not all(ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, n)
                                     for n in names):
        return _refusal(E.TOPIC_AUTHORIZATION_FAILED, "DESCRIBE on a subscribed topic is not allowed")
    if not_coordinator(ctx, group_id):
        return _refusal(E.NOT_COORDINATOR, "this gateway does not coordinate the group")
    groups = ctx.broker.groups
    refused = await groups.make_way_for_consumer_protocol(group_id) if group_id else None
    if refused is not None:
        return _refusal(*refused)
    sub = Subscription(
        rebalance_timeout_ms=req.rebalance_timeout_ms,
        topic_names=None if names is None else tuple(names),
        topic_regex=req.subscribed_topic_regex if ctx.version >= 1 else None,
        server_assignor=req.server_assignor, owned=_owned(req.topic_partitions),
        instance_id=req.instance_id, rack_id=req.rack_id)
    result = await groups.consumer.handle_heartbeat(
        group_id, req.member_id or "", req.member_epoch, sub,
        client_id=ctx.client_id or "", client_host=client_host(ctx))
    return {"error_code": result.error, "error_message": result.message,
            "member_id": result.member_id, "member_epoch": result.member_epoch,
            "heartbeat_interval_ms": result.heartbeat_interval_ms,
            "assignment": None if result.assignment is None else _assignment(result.assignment)}


async def _load(ctx: RequestContext, group_id: str) -> str | None:
    """Bring a group this gateway coordinates in from the store; why not, if it failed."""
    if not group_id or not_coordinator(ctx, group_id):
        return None
    try:
        await ctx.broker.groups.consumer.load(group_id)
    except Exception as e:  # noqa: BLE001 - unreadable, or the coordinator is unreachable
        return f"loading the group failed: {e}"
    return None


def _described(ctx: RequestContext, partitions: Partitions) -> dict[str, Any]:
    by_id = ctx.broker.topics_by_id
    return {"topic_partitions": [
        {"topic_id": t, "topic_name": by_id[t].name if t in by_id else "",
         "partitions": sorted(ps)}
        for t, ps in sorted(partitions.items()) if ps]}


@handles(ApiKey.CONSUMER_GROUP_DESCRIBE, 0, 0)
async def consumer_group_describe(ctx: RequestContext, req: Message) -> dict[str, Any]:
    out = []
    for group_id in req.group_ids or []:
        operations = ctx.authorized_operations(ResourceType.GROUP, group_id) if req.include_authorized_operations \
            else OPERATIONS_NOT_REQUESTED
        entry: dict[str, Any] = {"group_id": group_id, "authorized_operations": operations,
                                 "members": []}
        loaded = await _load(ctx, group_id)
        group = ctx.broker.groups.consumer.group(group_id)
        if not ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, group_id):
            entry.update(error_code=E.GROUP_AUTHORIZATION_FAILED,
                         error_message=f"DESCRIBE on group {group_id!r} is not allowed")
        elif not_coordinator(ctx, group_id):
            entry.update(error_code=E.NOT_COORDINATOR, error_message=None)
        elif loaded is not None:
            entry.update(error_code=E.COORDINATOR_NOT_AVAILABLE, error_message=loaded)
        elif group is None:
            known = ctx.broker.groups.group(group_id) is not None
            entry.update(error_code=E.GROUP_ID_NOT_FOUND, error_message=(
                f"Group {group_id} is not a consumer group." if known
                else f"Group {group_id} not found."))
        else:
            target = group.target
            entry.update(
                error_code=E.NONE, error_message=None, group_state=group.state.value,
                group_epoch=group.group_epoch, assignment_epoch=group.assignment_epoch,
                assignor_name=group.assignor,
                members=[{"member_id": m.member_id, "instance_id": m.instance_id,
                          "rack_id": m.rack_id, "member_epoch": m.epoch,
                          "client_id": m.client_id, "client_host": m.client_host,
                          "subscribed_topic_names": list(m.subscribed_names),
                          "subscribed_topic_regex": m.subscribed_regex,
                          "assignment": _described(ctx, m.assigned),
                          "target_assignment": _described(ctx, target.get(m.member_id, {}))}
                         for m in group.members.values()])
        out.append(entry)
    return {"groups": out}
