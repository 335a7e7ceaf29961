"""GetTelemetrySubscriptions and PushTelemetry (KIP-714): clients learn what to push and
how often, then push their metrics, which /metrics shows (`gateway.telemetry`). Like
Kafka, these need no ACL: a client reports only about itself."""

from __future__ import annotations

import logging

from .registry import ApiKey, RequestContext, handles

log = logging.getLogger(__name__)


@handles(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, 0)
async def get_telemetry_subscriptions(ctx: RequestContext, req):
    return ctx.broker.telemetry.get_subscriptions(req.client_instance_id, ctx.client_id)


@handles(ApiKey.PUSH_TELEMETRY, 0, 0)
async def push_telemetry(ctx: RequestContext, req):
    code, why = ctx.broker.telemetry.push(req.client_instance_id, req.subscription_id, req.terminating,
                                          req.compression_type, req.metrics or b"", ctx.client_id)
    if code:
        log.debug("%s: push refused (%d): %s", ctx, code, why)
    return {"throttle_time_ms": 0, "error_code": code}
