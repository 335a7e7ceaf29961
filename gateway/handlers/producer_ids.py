"""InitProducerId for idempotent producers (transactions are not supported)."""

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.protocol.error_codes import ErrorCode

from .registry import ApiKey, RequestContext, handles


@handles(ApiKey.INIT_PRODUCER_ID, 0, 5)
async def init_producer_id(ctx: RequestContext, req):
    if req.transactional_id is not None:
        return {"throttle_time_ms": 0, "error_code": ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if not _may_write_idempotently(ctx):
        return {"throttle_time_ms": 0, "error_code": ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                "producer_id": -1, "producer_epoch": -1}
    if ctx.version >= 3 and req.producer_id >= 0:
        # A producer bumping its own epoch after a sequence error (KIP-360).
        epoch = req.producer_epoch + 1
        if epoch <= 0x7FFF:
            return {"throttle_time_ms": 0, "error_code": 0, "producer_id": req.producer_id,
                    "producer_epoch": epoch}
    pid = await ctx.broker.next_producer_id()
    return {"throttle_time_ms": 0, "error_code": 0, "producer_id": pid, "producer_epoch": 0}


def _may_write_idempotently(ctx: RequestContext) -> bool:
    """IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (KIP-679, as Kafka 3.0+)."""
    return (ctx.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)
            or ctx.allowed_any(Operation.WRITE, ResourceType.TOPIC))
