"""CreateAcls, DescribeAcls and DeleteAcls: ALTER (create, delete) or DESCRIBE on the
cluster, as in Kafka; the ACLs themselves live in the coordinator."""

from __future__ import annotations

from itertools import groupby

from stratalog.coordinator.model import AclBinding
from stratalog.gateway.auth.acls import (AclFilter, InvalidAcl, Operation, PatternType, ResourceType,
                                         check_binding, CLUSTER_NAME)
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles

_NO_AUTHORIZER = "ACLs are off on this gateway (authorizer.class.name is not set)"


def _refusal(ctx: RequestContext, operation: Operation) -> tuple[int, str] | None:
    if ctx.broker.authorizer is None:
        return ErrorCode.SECURITY_DISABLED, _NO_AUTHORIZER
    if not ctx.allowed(operation, ResourceType.CLUSTER, CLUSTER_NAME):
        return ErrorCode.CLUSTER_AUTHORIZATION_FAILED, f"{operation.name} on the cluster is not allowed"
    return None


def _filter(f, version: int, prefix: str = "") -> AclFilter:
    pattern = getattr(f, f"{prefix}pattern_type_filter") if version >= 1 else PatternType.LITERAL
    return AclFilter(f.resource_type_filter, f.resource_name_filter, pattern, f.principal_filter,
                     f.host_filter, f.operation, f.permission_type)


@handles(ApiKey.CREATE_ACLS, 0, 3)
async def create_acls(ctx: RequestContext, req):
    refused = _refusal(ctx, Operation.ALTER)
    results, valid = [], []
    for c in req.creations:
        binding = AclBinding(c.resource_type, c.resource_name,
                             c.resource_pattern_type if ctx.version >= 1 else PatternType.LITERAL,
                             c.principal, c.host, c.operation, c.permission_type)
        code, message = refused or (0, None)
        if not refused:
            try:
                check_binding(binding)
                valid.append(binding)
            except InvalidAcl as e:
                code, message = ErrorCode.INVALID_REQUEST, str(e)
        results.append({"error_code": code, "error_message": message})
    if valid:
        await ctx.broker.store.put_acls(valid)
        await ctx.broker.authorizer.reload()  # in force here at once; elsewhere by the watch
    return {"throttle_time_ms": 0, "results": results}


@handles(ApiKey.DESCRIBE_ACLS, 0, 3)
async def describe_acls(ctx: RequestContext, req):
    refused = _refusal(ctx, Operation.DESCRIBE)
    if refused:
        return {"throttle_time_ms": 0, "error_code": refused[0], "error_message": refused[1], "resources": []}
    wanted = _filter(req, ctx.version)
    found = sorted((b for b in await ctx.broker.store.acls() if wanted.matches(b)),
                   key=lambda b: (b.resource_type, b.resource_name, b.pattern_type))
    resources = []
    for (rtype, name, pattern), group in groupby(found, key=lambda b: (b.resource_type, b.resource_name,
                                                                      b.pattern_type)):
        resources.append({"resource_type": rtype, "resource_name": name, "pattern_type": pattern,
                          "acls": [{"principal": b.principal, "host": b.host, "operation": b.operation,
                                    "permission_type": b.permission} for b in group]})
    return {"throttle_time_ms": 0, "error_code": 0, "error_message": None, "resources": resources}


@handles(ApiKey.DELETE_ACLS, 0, 3)
async def delete_acls(ctx: RequestContext, req):
    refused = _refusal(ctx, Operation.ALTER)
    if refused:
        return {"throttle_time_ms": 0, "filter_results": [
            {"error_code": refused[0], "error_message": refused[1], "matching_acls": []} for _ in req.filters]}
    existing = await ctx.broker.store.acls()
    results, doomed = [], {}
    for f in req.filters:
        matched = [b for b in existing if _filter(f, ctx.version).matches(b)]
        doomed.update(dict.fromkeys(matched))
        results.append({"error_code": 0, "error_message": None, "matching_acls": [
            {"error_code": 0, "error_message": None, "resource_type": b.resource_type,
             "resource_name": b.resource_name, "pattern_type": b.pattern_type, "principal": b.principal,
             "host": b.host, "operation": b.operation, "permission_type": b.permission} for b in matched]})
    if doomed:
        await ctx.broker.store.delete_acls(list(doomed))
        await ctx.broker.authorizer.reload()
    return {"throttle_time_ms": 0, "filter_results": results}
