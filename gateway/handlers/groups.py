"""Group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ListGroups,
DescribeGroups and DeleteGroups, answered by `ctx.broker.groups` (a `GroupCoordinator`).

Version differences are settled here and nowhere else: v0 JoinGroup has no rebalance
timeout (the session timeout serves), v4+ JoinGroup makes new members fetch a member id
first, v9+ may let a restarted static leader skip assigning, v5+ SyncGroup must name the
protocol, v3+ LeaveGroup removes a batch, v4+ FindCoordinator answers a batch of keys.
"""

from __future__ import annotations

from typing import Any

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.groups import JoinResult
from stratalog.gateway.handlers.registry import ApiKey, RequestContext, handles
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.gateway.protocol.schema import Message

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
OPERATIONS_NOT_REQUESTED = -(2**31)


def not_coordinator(ctx: RequestContext, group_id: str | None) -> bool:
    """Whether another gateway coordinates this group. Empty ids are left to the group
    coordinator, which rejects them where Kafka does."""
    return bool(group_id) and not ctx.broker.is_coordinator_for(group_id)


def may_use(ctx: RequestContext, group_id: str | None) -> bool:
    """READ on the group: what joining, syncing, heartbeats, leaving and commits need."""
    return ctx.allowed(Operation.READ, ResourceType.GROUP, group_id or "")


def client_host(ctx: RequestContext) -> str:
    """The client's address as Kafka reports it ("/127.0.0.1")."""
    host = ctx.peer.rsplit(":", 1)[0] if ctx.peer else ""
    return "/" + host.strip("[]")


# --- FindCoordinator ------------------------------------------------------------------

def _locate(ctx: RequestContext, key: str, key_type: int) -> dict[str, Any]:
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        return _no_coordinator(key, E.INVALID_REQUEST, f"unknown coordinator key type {key_type}")
    rtype = ResourceType.GROUP if key_type == GROUP_KEY_TYPE else ResourceType.TRANSACTIONAL_ID
    if not ctx.allowed(Operation.DESCRIBE, rtype, key):
        code = E.GROUP_AUTHORIZATION_FAILED if key_type == GROUP_KEY_TYPE else E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        return _no_coordinator(key, code, f"DESCRIBE on {rtype.name.lower()} {key!r} is not allowed")
    # Groups and transactions are coordinated by the same gateway for a key.
    where = ctx.broker.coordinator_for(key, ctx.session.listener.name if ctx.session else None)
    if where is None:
        return _no_coordinator(key, E.COORDINATOR_NOT_AVAILABLE, "no live gateway")
    node_id, host, port = where
    return {"key": key, "node_id": node_id, "host": host, "port": port,
            "error_code": E.NONE, "error_message": None}


def _no_coordinator(key: str, error: E, message: str) -> dict[str, Any]:
    return {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": error,
            "error_message": message}


@handles(ApiKey.FIND_COORDINATOR, 0, 6)
async def find_coordinator(ctx: RequestContext, req: Message) -> dict[str, Any]:
    if ctx.version >= 4:
        return {"coordinators": [_locate(ctx, key, req.key_type)
                                 for key in req.coordinator_keys or []]}
    found = _locate(ctx, req.key, req.key_type)
    del found["key"]  # v0-3 answer for their one key without naming it
    return found


# --- JoinGroup ------------------------------------------------------------------------

@handles(ApiKey.JOIN_GROUP, 0, 9)
async def join_group(ctx: RequestContext, req: Message) -> dict[str, Any]:
    v = ctx.version
    if not may_use(ctx, req.group_id):
        result = JoinResult(E.GROUP_AUTHORIZATION_FAILED, req.member_id)
    elif not_coordinator(ctx, req.group_id):
        result = JoinResult(E.NOT_COORDINATOR, req.member_id)
    else:
        result = await ctx.broker.groups.join_group(
            req.group_id, req.member_id or "",
            group_instance_id=req.group_instance_id,
            client_id=ctx.client_id or "",
            client_host=client_host(ctx),
            session_timeout_ms=req.session_timeout_ms,
            rebalance_timeout_ms=req.session_timeout_ms if v == 0 else req.rebalance_timeout_ms,
            protocol_type=req.protocol_type,
            protocols=[(p.name, p.metadata) for p in req.protocols or []],
            require_known_member_id=v >= 4,
            supports_skip_assignment=v >= 9,
            reason=req.reason)
    return {
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        # Nullable from v7; older versions spell "none" as an empty string.
        "protocol_name": result.protocol_name if v >= 7 else (result.protocol_name or ""),
        "leader": result.leader_id or "",
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [{"member_id": m, "group_instance_id": i, "metadata": meta}
                    for m, i, meta in result.members],
    }


# --- SyncGroup ------------------------------------------------------------------------

@handles(ApiKey.SYNC_GROUP, 0, 5)
async def sync_group(ctx: RequestContext, req: Message) -> dict[str, Any]:
    if not may_use(ctx, req.group_id):
        return {"error_code": E.GROUP_AUTHORIZATION_FAILED}
    if not_coordinator(ctx, req.group_id):
        return {"error_code": E.NOT_COORDINATOR}
    if ctx.version >= 5 and (req.protocol_type is None or req.protocol_name is None):
        return {"error_code": E.INCONSISTENT_GROUP_PROTOCOL}
    result = await ctx.broker.groups.sync_group(
        req.group_id, req.generation_id, req.member_id,
        group_instance_id=req.group_instance_id,
        protocol_type=req.protocol_type, protocol_name=req.protocol_name,
        assignments={a.member_id: a.assignment for a in req.assignments or []})
    return {"error_code": result.error, "protocol_type": result.protocol_type,
            "protocol_name": result.protocol_name, "assignment": result.assignment}


# --- Heartbeat ------------------------------------------------------------------------

@handles(ApiKey.HEARTBEAT, 0, 4)
async def heartbeat(ctx: RequestContext, req: Message) -> dict[str, Any]:
    if not may_use(ctx, req.group_id):
        return {"error_code": E.GROUP_AUTHORIZATION_FAILED}
    if not_coordinator(ctx, req.group_id):
        return {"error_code": E.NOT_COORDINATOR}
    error = await ctx.broker.groups.heartbeat_any(req.group_id, req.generation_id, req.member_id,
                                                  req.group_instance_id)
    return {"error_code": error}


# --- LeaveGroup -----------------------------------------------------------------------

@handles(ApiKey.LEAVE_GROUP, 0, 5)
async def leave_group(ctx: RequestContext, req: Message) -> dict[str, Any]:
    if ctx.version <= 2:
        leaving = [(req.member_id, None)]
        reason = None
    else:
        leaving = [(m.member_id, m.group_instance_id) for m in req.members or []]
        reason = next((m.reason for m in req.members or [] if m.reason), None)
    if not may_use(ctx, req.group_id):
        error, errors = E.GROUP_AUTHORIZATION_FAILED, []
    elif not_coordinator(ctx, req.group_id):
        error, errors = E.NOT_COORDINATOR, []
    else:
        error, errors = await ctx.broker.groups.leave_any(req.group_id, leaving, reason)
    if ctx.version <= 2:
        # One member and no per-member errors: its error is the answer.
        return {"error_code": error or next((e for e in errors if e), E.NONE)}
    return {"error_code": error,
            "members": [{"member_id": m, "group_instance_id": i, "error_code": e}
                        for (m, i), e in zip(leaving, errors)]}


# --- ListGroups -----------------------------------------------------------------------

@handles(ApiKey.LIST_GROUPS, 0, 5)
async def list_groups(ctx: RequestContext, req: Message) -> dict[str, Any]:
    error, listings = await ctx.broker.groups.list_groups(
        states=req.states_filter if ctx.version >= 4 else None,
        types=req.types_filter if ctx.version >= 5 else None,
        owned=ctx.broker.is_coordinator_for)
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.CLUSTER, CLUSTER_NAME):
        listings = [g for g in listings if ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, g.group_id)]
    return {"error_code": error,
            "groups": [{"group_id": g.group_id, "protocol_type": g.protocol_type,
                        "group_state": g.state, "group_type": g.group_type} for g in listings]}


# --- DescribeGroups -------------------------------------------------------------------

@handles(ApiKey.DESCRIBE_GROUPS, 0, 5)
async def describe_groups(ctx: RequestContext, req: Message) -> dict[str, Any]:
    asked = ctx.version >= 3 and req.include_authorized_operations
    out = []
    for group_id in req.groups or []:
        operations = ctx.authorized_operations(ResourceType.GROUP, group_id) if asked else OPERATIONS_NOT_REQUESTED
        refused = not ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, group_id)
        if refused or not_coordinator(ctx, group_id):
            out.append({"error_code": E.GROUP_AUTHORIZATION_FAILED if refused else E.NOT_COORDINATOR,
                        "group_id": group_id, "authorized_operations": operations})
            continue
        d = await ctx.broker.groups.describe_group(group_id)
        out.append({
            "error_code": d.error, "group_id": d.group_id, "group_state": d.state,
            "protocol_type": d.protocol_type, "protocol_data": d.protocol,
            "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                         "client_id": m.client_id, "client_host": m.client_host,
                         "member_metadata": m.metadata, "member_assignment": m.assignment}
                        for m in d.members],
            "authorized_operations": operations,
        })
    return {"groups": out}


# --- DeleteGroups ---------------------------------------------------------------------

@handles(ApiKey.DELETE_GROUPS, 0, 2)
async def delete_groups(ctx: RequestContext, req: Message) -> dict[str, Any]:
    results = []
    for group_id in req.groups_names or []:
        if not ctx.allowed(Operation.DELETE, ResourceType.GROUP, group_id):
            error = E.GROUP_AUTHORIZATION_FAILED
        elif not_coordinator(ctx, group_id):
            error = E.NOT_COORDINATOR
        else:
            error = await ctx.broker.groups.delete_group(group_id)
        results.append({"group_id": group_id, "error_code": error})
    return {"results": results}
