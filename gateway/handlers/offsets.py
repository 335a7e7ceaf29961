"""Committed-offset APIs: OffsetCommit, OffsetFetch and OffsetDelete.

Partitions of topics that do not exist are answered UNKNOWN_TOPIC_OR_PARTITION here; the
rest goes to `ctx.broker.groups`. OffsetFetch v8+ asks for several groups at once, and a
group-level error is reported per partition before v2, at the top level for v2-7 and per
group from v8. Commits go to the group's coordinator; fetches are answered by any gateway.
"""

from __future__ import annotations

from typing import Any

from stratalog.coordinator.model import CommittedOffset
from stratalog.gateway.groups import OffsetEntry
from stratalog.gateway.groups.coordinator import StoreUnavailable
from stratalog.gateway.auth.acls import Operation, ResourceType
from stratalog.gateway.handlers.groups import may_use, not_coordinator
from stratalog.gateway.handlers.registry import ApiKey, RequestContext, handles
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.gateway.protocol.schema import Message

NO_OFFSET = CommittedOffset(offset=-1, leader_epoch=-1, metadata="", commit_timestamp=-1)


def _known(ctx: RequestContext, topic: str, partition: int) -> bool:
    count = ctx.broker.partition_count(topic)
    return count is not None and 0 <= partition < count


# --- OffsetCommit ---------------------------------------------------------------------

@handles(ApiKey.OFFSET_COMMIT, 2, 9)
async def offset_commit(ctx: RequestContext, req: Message) -> dict[str, Any]:
    mine = not not_coordinator(ctx, req.group_id)
    group_ok = may_use(ctx, req.group_id)
    errors: dict[tuple[str, int], E] = {}
    entries: dict[tuple[str, int], OffsetEntry] = {}
    for topic in req.topics or []:
        topic_ok = ctx.allowed(Operation.READ, ResourceType.TOPIC, topic.name)
        for p in topic.partitions or []:
            tp = (topic.name, p.partition_index)
            if not group_ok:
                errors[tp] = E.GROUP_AUTHORIZATION_FAILED
            elif not topic_ok:
                errors[tp] = E.TOPIC_AUTHORIZATION_FAILED
            elif not _known(ctx, *tp):
                errors[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
            elif not mine:
                errors[tp] = E.NOT_COORDINATOR
            else:
                entries[tp] = OffsetEntry(p.committed_offset, p.committed_leader_epoch,
                                          p.committed_metadata)
    if entries and ctx.version < 9 and req.member_id and \
            ctx.broker.groups.consumer.speaks_consumer_protocol(req.group_id, req.member_id):
        # Members of consumer-protocol groups commit with their member epoch (v9+).
        for tp in entries:
            errors[tp] = E.UNSUPPORTED_VERSION
        entries = {}
    if entries:
        committed = await ctx.broker.groups.commit_offsets(
            req.group_id, entries, generation_id=req.generation_id_or_member_epoch,
            member_id=req.member_id or "", group_instance_id=req.group_instance_id)
        for tp, error in committed.items():
            errors.setdefault(tp, error)
    return {"topics": [
        {"name": t.name,
         "partitions": [{"partition_index": p.partition_index,
                         "error_code": errors[(t.name, p.partition_index)]}
                        for p in t.partitions or []]}
        for t in req.topics or []]}


# --- OffsetFetch ----------------------------------------------------------------------

def _partition(index: int, offset: CommittedOffset, error: E = E.NONE) -> dict[str, Any]:
    return {"partition_index": index, "committed_offset": offset.offset,
            "committed_leader_epoch": offset.leader_epoch, "metadata": offset.metadata,
            "error_code": error}


async def _fetch_group(ctx: RequestContext, group_id: str, topics: list | None,
                       require_stable: bool, member: tuple[str | None, int] = (None, -1)
                       ) -> tuple[E, list[dict[str, Any]]]:
    """One group's offsets: (group error, topics). `topics` None asks for all of them (of
    the topics the principal may describe). `member` is v9's member id and epoch, which
    a consumer-protocol member sends and which must then be current."""
    if not ctx.allowed(Operation.DESCRIBE, ResourceType.GROUP, group_id):
        return E.GROUP_AUTHORIZATION_FAILED, []
    consumer = ctx.broker.groups.consumer
    try:
        if not_coordinator(ctx, group_id):
            # Offsets live in the coordinator store every gateway shares, so any gateway
            # answers a fetch. A client whose coordinator just moved may still ask the old
            # one, and librdkafka does not retry an OffsetFetch refused NOT_COORDINATOR: the
            # partitions it asked for were then never started (seen in the coordinator-move
            # tests).
            member_error = await consumer.check_fetch_stored(group_id, *member)
        else:
            await consumer.load(group_id)
            member_error = consumer.check_fetch(group_id, *member)
    except Exception:  # noqa: BLE001 - unreadable, or the coordinator is unreachable
        return E.COORDINATOR_NOT_AVAILABLE, []
    if member_error is not None:
        return member_error, []
    wanted = None if topics is None else \
        [(t.name, p) for t in topics for p in t.partition_indexes or []]
    error, found = await ctx.broker.groups.fetch_offsets(group_id, wanted,
                                                         require_stable=require_stable)
    if error:
        return error, []
    try:
        unstable = await ctx.broker.groups.unstable_partitions(group_id) if require_stable else set()
    except StoreUnavailable:
        return E.COORDINATOR_NOT_AVAILABLE, []
    if topics is None:
        by_topic: dict[str, list[dict[str, Any]]] = {}
        for (name, index), offset in sorted(found.items()):
            if ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, name):
                by_topic.setdefault(name, []).append(_partition(index, offset))
        return E.NONE, [{"name": n, "partitions": ps} for n, ps in by_topic.items()]
    return E.NONE, [
        {"name": t.name,
         "partitions": [_partition(p, NO_OFFSET, E.TOPIC_AUTHORIZATION_FAILED)
                        if not ctx.allowed(Operation.DESCRIBE, ResourceType.TOPIC, t.name)
                        else _partition(p, NO_OFFSET, E.UNSTABLE_OFFSET_COMMIT)
                        if (t.name, p) in unstable
                        else _partition(p, found.get((t.name, p), NO_OFFSET))
                        for p in t.partition_indexes or []]}
        for t in topics]


@handles(ApiKey.OFFSET_FETCH, 1, 9)
async def offset_fetch(ctx: RequestContext, req: Message) -> dict[str, Any]:
    v = ctx.version
    if v >= 8:
        groups = []
        for g in req.groups or []:
            member = (g.member_id, g.member_epoch) if v >= 9 else (None, -1)
            error, topics = await _fetch_group(ctx, g.group_id, g.topics, req.require_stable, member)
            groups.append({"group_id": g.group_id, "topics": topics, "error_code": error})
        return {"groups": groups}
    error, topics = await _fetch_group(ctx, req.group_id, req.topics,
                                       v >= 7 and req.require_stable)
    if error and v < 2:
        # No group-level error field yet: every asked-for partition carries it.
        topics = [{"name": t.name,
                   "partitions": [_partition(p, NO_OFFSET, error)
                                  for p in t.partition_indexes or []]}
                  for t in req.topics or []]
    return {"error_code": error, "topics": topics}


# --- OffsetDelete ---------------------------------------------------------------------

@handles(ApiKey.OFFSET_DELETE, 0, 0)
async def offset_delete(ctx: RequestContext, req: Message) -> dict[str, Any]:
    if not ctx.allowed(Operation.DELETE, ResourceType.GROUP, req.group_id):
        return {"error_code": E.GROUP_AUTHORIZATION_FAILED}
    if not_coordinator(ctx, req.group_id):
        return {"error_code": E.NOT_COORDINATOR}
    errors: dict[tuple[str, int], E] = {}
    wanted = []
    for topic in req.topics or []:
        for p in topic.partitions or []:
            tp = (topic.name, p.partition_index)
            if not ctx.allowed(Operation.READ, ResourceType.TOPIC, topic.name):
                errors[tp] = E.TOPIC_AUTHORIZATION_FAILED
            elif _known(ctx, *tp):
                wanted.append(tp)
            else:
                errors[tp] = E.UNKNOWN_TOPIC_OR_PARTITION
    error, deleted = await ctx.broker.groups.delete_offsets(req.group_id, wanted)
    if error:
        return {"error_code": error}
    for tp, e in deleted.items():
        errors.setdefault(tp, e)
    return {"error_code": E.NONE, "topics": [
        {"name": t.name,
         "partitions": [{"partition_index": p.partition_index,
                         "error_code": errors[(t.name, p.partition_index)]}
                        for p in t.partitions or []]}
        for t in req.topics or []]}
