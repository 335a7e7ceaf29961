"""InitProducerId for idempotent producers (transactions are not supported)."""

from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles


@handles(ApiKey.INIT_PRODUCER_ID, 0, 5)
async def init_producer_id(ctx: RequestContext, req):
    if req.transactional_id is not None:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if ctx.version >= 3 and req.producer_id >= 0:
        # A producer bumping its own epoch after a sequence error (KIP-360).
        epoch = req.producer_epoch + 1
        if epoch <= 0x7FFF:
            return {"throttle_time_ms": 0, "error_code": 0, "producer_id": req.producer_id,
                    "producer_epoch": epoch}
    pid = await ctx.broker.next_producer_id()
    return {"throttle_time_ms": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0}
