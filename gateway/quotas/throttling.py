"""How a throttled client is told (KIP-219): the answer goes out at once with
throttle_time_ms and the gateway reads nothing more from the connection for that long
(muted); clients of the versions below back off on their own. Older versions expect the
broker to hold the answer back instead, so theirs waits for the throttle time."""

from __future__ import annotations

from stratalog.gateway.protocol.catalog import ApiKey

# First version of each API whose clients back off by themselves; an API absent from
# the table came after KIP-219 and its clients always do.
CLIENT_BACKS_OFF_FROM: dict[int, int] = {
    ApiKey.PRODUCE: 6, ApiKey.FETCH: 8, ApiKey.LIST_OFFSETS: 3, ApiKey.METADATA: 6,
    ApiKey.OFFSET_COMMIT: 4, ApiKey.OFFSET_FETCH: 4, ApiKey.FIND_COORDINATOR: 2,
    ApiKey.JOIN_GROUP: 3, ApiKey.HEARTBEAT: 2, ApiKey.LEAVE_GROUP: 2, ApiKey.SYNC_GROUP: 2,
    ApiKey.DESCRIBE_GROUPS: 2, ApiKey.LIST_GROUPS: 2, ApiKey.API_VERSIONS: 2,
    ApiKey.CREATE_TOPICS: 3, ApiKey.DELETE_TOPICS: 2, ApiKey.DELETE_RECORDS: 1,
    ApiKey.INIT_PRODUCER_ID: 1, ApiKey.OFFSET_FOR_LEADER_EPOCH: 3,
    ApiKey.ADD_PARTITIONS_TO_TXN: 1, ApiKey.ADD_OFFSETS_TO_TXN: 1, ApiKey.END_TXN: 1,
    ApiKey.TXN_OFFSET_COMMIT: 1, ApiKey.DESCRIBE_ACLS: 1, ApiKey.CREATE_ACLS: 1,
    ApiKey.DELETE_ACLS: 1, ApiKey.DESCRIBE_CONFIGS: 2, ApiKey.ALTER_CONFIGS: 1,
    ApiKey.SASL_AUTHENTICATE: 1, ApiKey.CREATE_PARTITIONS: 1, ApiKey.DELETE_GROUPS: 1,
}


def client_backs_off(api_key: int, version: int) -> bool:
    """Whether the client of this request honours throttle_time_ms itself."""
    return version >= CLIENT_BACKS_OFF_FROM.get(api_key, 0)


def with_throttle(result, throttle_ms: int):
    """The response with throttle_time_ms raised to `throttle_ms` (a response without the
    field is left as it is)."""
    if isinstance(result, dict):
        if "throttle_time_ms" in result:
            result["throttle_time_ms"] = max(result["throttle_time_ms"] or 0, throttle_ms)
    elif hasattr(result, "throttle_time_ms"):
        result.throttle_time_ms = max(result.throttle_time_ms or 0, throttle_ms)
    return result
