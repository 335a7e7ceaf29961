"""GetTelemetrySubscriptions and PushTelemetry (KIP-714): clients learn what to push and
how often, then push their metrics, which /metrics shows (`gateway.telemetry`). Like
Kafka, these need no ACL: a client reports only about itself."""

from __future__ import annotations

import asyncio
import logging

from .registry import ApiKey, RequestContext, handles

log = logging.getLogger(__name__)

INLINE_BYTES = 16 * 1024  # payloads up to this size are decoded on the event loop


@handles(ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, 0, 0)
async def get_telemetry_subscriptions(ctx: RequestContext, req):
    return ctx.broker.telemetry.get_subscriptions(req.client_instance_id, ctx.client_id)


@handles(ApiKey.PUSH_TELEMETRY, 0, 0)
async def push_telemetry(ctx: RequestContext, req):
    telemetry = ctx.broker.telemetry
    metrics = req.metrics or b""
    code, why, inst = telemetry.admit_push(req.client_instance_id, req.subscription_id, req.terminating,
                                           req.compression_type, metrics, ctx.client_id)
    if inst is not None:
        # Inflating and parsing up to ten times telemetry.max.bytes takes tens of milliseconds:
        # a big payload is read on a worker thread so other clients' requests go on.
        if len(metrics) > INLINE_BYTES:
            points = await asyncio.to_thread(telemetry.decode, req.compression_type, metrics)
        else:
            points = telemetry.decode(req.compression_type, metrics)
        code, why = telemetry.finish_push(inst, points)
    if code:
        log.debug("%s: push refused (%d): %s", ctx, code, why)
    return {"throttle_time_ms": 0, "error_code": code}
