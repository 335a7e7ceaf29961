"""DescribeClientQuotas and AlterClientQuotas (KIP-546): DESCRIBE_CONFIGS, resp.
ALTER_CONFIGS on the cluster, as in Kafka. The quotas live in the coordinator; every
gateway follows them through a watch (`gateway.quotas.manager`)."""

from __future__ import annotations

import logging

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.errors import error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.quotas.rules import ENTITY_TYPES, Entity, InvalidQuota, check_entity, check_value

from .registry import ApiKey, RequestContext, handles

log = logging.getLogger(__name__)

MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2
MAX_ALTER_ENTRIES = 1000  # entities one AlterClientQuotas may change (each is a coordinator write)


def _matches(ent: Entity, components, strict: bool) -> bool:
    """KIP-546's filter: every component must match the entity's name of its type; with
    `strict`, the entity may have no other types."""
    names = dict(ent)
    for c in components:
        if c.entity_type not in names:
            return False
        name = names[c.entity_type]
        if c.match_type == MATCH_EXACT and name != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and name is not None:
            return False
        if c.match_type == MATCH_SPECIFIED and name is None:
            return False
    return not strict or len(names) == len({c.entity_type for c in components})


def _check_filter(components) -> str | None:
    seen = set()
    for c in components:
        if c.entity_type not in ENTITY_TYPES:
            return f"unknown entity type {c.entity_type!r}"
        if c.entity_type in seen:
            return f"entity type {c.entity_type!r} is filtered twice"
        seen.add(c.entity_type)
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED):
            return f"unknown match type {c.match_type}"
        if c.match_type == MATCH_EXACT and c.match is None:
            return "an exact match needs a name"
    return None


@handles(ApiKey.DESCRIBE_CLIENT_QUOTAS, 0, 1)
async def describe_client_quotas(ctx: RequestContext, req):
    def refuse(code: int, message: str) -> dict:
        return {"throttle_time_ms": 0, "error_code": code, "error_message": message, "entries": None}

    if not ctx.allowed(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME):
        return refuse(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "DESCRIBE_CONFIGS on the cluster is not allowed")
    problem = _check_filter(req.components)
    if problem is not None:
        return refuse(ErrorCode.INVALID_REQUEST, problem)
    entries = []
    for q in await ctx.broker.store.client_quotas():
        if _matches(q.entity, req.components, req.strict):
            entries.append({"entity": [{"entity_type": t, "entity_name": n} for t, n in q.entity],
                            "values": [{"key": k, "value": v} for k, v in sorted(q.values.items())]})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "entries": entries}


def _entity(e) -> Entity:
    return tuple(sorted((c.entity_type, c.entity_name) for c in e.entity))


@handles(ApiKey.ALTER_CLIENT_QUOTAS, 0, 1)
async def alter_client_quotas(ctx: RequestContext, req):
    allowed = ctx.allowed(Operation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME)
    too_many = len(req.entries) > MAX_ALTER_ENTRIES
    results, valid = [], []
    for e in req.entries:
        code, message = 0, None
        ent = _entity(e)
        changes: dict[str, float | None] = {}
        if not allowed:
            code, message = ErrorCode.CLUSTER_AUTHORIZATION_FAILED, "ALTER_CONFIGS on the cluster is not allowed"
        elif too_many:
            code, message = ErrorCode.INVALID_REQUEST, f"at most {MAX_ALTER_ENTRIES} entities per request"
        else:
            try:
                check_entity(ent)
                for op in e.ops:
                    if op.key in changes:
                        raise InvalidQuota(f"quota {op.key!r} is changed twice")
                    check_value(op.key, 1.0 if op.remove else op.value)
                    changes[op.key] = None if op.remove else op.value
                if any(ent == x[0] for x in valid):
                    raise InvalidQuota("the entity appears more than once in the request")
            except InvalidQuota as err:
                code, message = ErrorCode.INVALID_REQUEST, str(err)
        row = {"error_code": code, "error_message": message,
               "entity": [{"entity_type": c.entity_type, "entity_name": c.entity_name} for c in e.entity]}
        if code == 0:
            valid.append((ent, changes, row))
        results.append(row)
    if not req.validate_only and valid:
        for ent, changes, row in valid:
            try:
                if changes:
                    await ctx.broker.store.alter_client_quota(ent, changes)
            except Exception as err:  # noqa: BLE001 - the coordinator's refusal, reported per entity
                row.update(error_code=error_code(err), error_message=error_message(err))
        try:
            await ctx.broker.quotas.reload()  # in force here at once; elsewhere by the watch
        except Exception as err:  # noqa: BLE001 - stored all the same: the watch brings them here too
            log.warning("%s: reloading client quotas failed: %s", ctx, err)
    return {"throttle_time_ms": 0, "entries": results}
