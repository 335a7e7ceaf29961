"""ApiVersions: advertised from the handler registry (see ADVERTISED_MIN for the one exception)."""

from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import HANDLERS, ApiKey, RequestContext, handles

# Advertised minimums below what a handler answers. librdkafka before 2.8 compresses with
# gzip, snappy or lz4 only when the broker lists Produce v0, and otherwise silently sends
# uncompressed batches; Apache Kafka 4.0 (KAFKA-18659) lists v0 for the same reason while
# still refusing v0-v2 requests, and so do we: the request decoder rejects them.
ADVERTISED_MIN = {ApiKey.PRODUCE: 0}


@handles(ApiKey.API_VERSIONS, 0, 4)
async def api_versions(ctx: RequestContext, req):
    keys = [{"api_key": h.api_key, "min_version": ADVERTISED_MIN.get(h.api_key, h.min_version),
             "max_version": h.max_version}
            for h in sorted(HANDLERS.values(), key=lambda h: h.api_key)]
    handler = HANDLERS[ApiKey.API_VERSIONS]
    if not handler.min_version <= ctx.version <= handler.max_version:
        # The client asked for a version we do not speak: Kafka answers in v0 with the
        # error and our ranges, and the codec encodes ApiVersions' header as v0 regardless.
        ctx.version = 0
        return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": keys}
    return {"error_code": 0, "api_keys": keys, "throttle_time_ms": 0}
