"""Topic administration: CreateTopics, DeleteTopics, CreatePartitions, DescribeConfigs,
AlterConfigs, IncrementalAlterConfigs and DeleteRecords.

The first three count the partitions they create or delete against the client's
controller_mutation_rate (KIP-599): from CreateTopics v6, CreatePartitions v3 and
DeleteTopics v5 on, a topic asked for while the client's budget is spent is refused with
THROTTLING_QUOTA_EXCEEDED (strict: the client knows to retry it); older versions get
everything done and are throttled afterwards (permissive). Either way the answer carries
the throttle time. Validate-only requests change nothing and count nothing."""

from __future__ import annotations

from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType, refusal
from stratalog.gateway import config_describe, topic_configs
from stratalog.gateway.errors import KafkaError, error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.topic_admin import PartitionBudget

from .metadata import may_create
from .registry import ApiKey, RequestContext, handles

TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


class _MutationQuota:
    """One request's view of the client's controller_mutation_rate."""

    def __init__(self, ctx: RequestContext, strict_from: int, counted: bool = True):
        self.ctx = ctx
        self.strict = ctx.version >= strict_from
        self.counted = counted

    def check(self) -> None:
        """Refuse the next topic while the budget is spent (strict versions only)."""
        if not (self.strict and self.counted):
            return
        ms = self.ctx.broker.quotas.mutation_throttle_ms(self.ctx.principal, self.ctx.client_id)
        if ms > 0:
            raise KafkaError(ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                             f"controller_mutation_rate exceeded: retry in {ms} ms")

    def took(self, partitions: int) -> None:
        if self.counted:
            self.ctx.broker.quotas.record_mutations(self.ctx.principal, self.ctx.client_id, partitions)

    def finish(self) -> int:
        """The throttle time the answer carries (0 while within the quota)."""
        quotas = self.ctx.broker.quotas
        ms = quotas.mutation_throttle_ms(self.ctx.principal, self.ctx.client_id) if self.counted else 0
        if ms > 0:
            self.ctx.throttle(quotas.mutation_throttled(ms))
        return ms


def _failure(e: Exception) -> dict:
    return {"error_code": error_code(e), "error_message": error_message(e)}


@handles(ApiKey.CREATE_TOPICS, 0, 7)
async def create_topics(ctx: RequestContext, req):
    broker = ctx.broker
    out = []
    budget = PartitionBudget()
    quota = _MutationQuota(ctx, strict_from=6, counted=not req.validate_only)
    for t in req.topics:
        row = {"name": t.name, "error_code": 0, "error_message": None}
        count = 0
        try:
            quota.check()
            if not may_create(ctx, t.name):
                raise refusal(Operation.CREATE, ResourceType.TOPIC, t.name)
            configs = {c.name: c.value for c in t.configs}
            if t.assignments:
                count = len(t.assignments)
            else:
                count = max(t.num_partitions if t.num_partitions != -1 else broker.config["num.partitions"], 0)
            budget.take(count, t.name)
            assignments = [(a.partition_index, list(a.broker_ids)) for a in t.assignments] or None
            try:
                info = await broker.admin.create_topic(t.name, t.num_partitions, t.replication_factor, configs,
                                                       validate_only=req.validate_only, assignments=assignments)
            except Exception:
                budget.give_back(count)
                raise
            rows = config_describe.topic(broker.config, info.configs, None, include_synonyms=False,
                                          include_documentation=False)
            quota.took(info.partitions)
            row.update(topic_id=info.topic_id, num_partitions=info.partitions,
                       replication_factor=info.replication_factor,
                       configs=[{k: c[k] for k in ("name", "value", "read_only", "config_source", "is_sensitive")}
                                for c in rows])
        except Exception as e:  # noqa: BLE001 - reported per topic
            row.update(_failure(e))
        out.append(row)
    return {"throttle_time_ms": quota.finish(), "topics": out}


@handles(ApiKey.DELETE_TOPICS, 0, 6)
async def delete_topics(ctx: RequestContext, req):
    broker = ctx.broker
    if ctx.version >= 6:
        targets = [(t.name, t.topic_id) for t in req.topics]
    else:
        targets = [(n, None) for n in req.topic_names]
    out = []
    quota = _MutationQuota(ctx, strict_from=5)
    for name, topic_id in targets:
        row = {"name": name, "topic_id": topic_id, "error_code": 0, "error_message": None}
        try:
            quota.check()
            if name is None:
                info = broker.topics_by_id.get(topic_id)
                if info is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_ID)
                name = row["name"] = info.name
            ctx.require(Operation.DELETE, ResourceType.TOPIC, name)
            info = broker.topics.get(name)
            if info is not None:
                row["topic_id"] = info.topic_id
            await broker.admin.delete_topic(name)
            quota.took(info.partitions if info is not None else 0)
        except Exception as e:  # noqa: BLE001
            row.update(_failure(e))
        out.append(row)
    return {"throttle_time_ms": quota.finish(), "responses": out}


@handles(ApiKey.CREATE_PARTITIONS, 0, 3)
async def create_partitions(ctx: RequestContext, req):
    out = []
    budget = PartitionBudget()
    quota = _MutationQuota(ctx, strict_from=3, counted=not req.validate_only)
    await ctx.broker.look_up_topics([t.name for t in req.topics])
    for t in req.topics:
        row = {"name": t.name, "error_code": 0, "error_message": None}
        try:
            quota.check()
            ctx.require(Operation.ALTER, ResourceType.TOPIC, t.name)
            added = max(t.count - (ctx.broker.partition_count(t.name) or 0), 0)
            budget.take(added, t.name)
            assignments = None if t.assignments is None else [list(a.broker_ids) for a in t.assignments]
            await ctx.broker.admin.add_partitions(t.name, t.count, validate_only=req.validate_only,
                                                  assignments=assignments)
            quota.took(added)
        except Exception as e:  # noqa: BLE001
            row.update(_failure(e))
        out.append(row)
    return {"throttle_time_ms": quota.finish(), "results": out}


@handles(ApiKey.DESCRIBE_CONFIGS, 0, 4)
async def describe_configs(ctx: RequestContext, req):
    broker = ctx.broker
    out = []
    for r in req.resources:
        row = {"error_code": 0, "error_message": None, "resource_type": r.resource_type,
               "resource_name": r.resource_name, "configs": []}
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        asked = {"include_synonyms": req.include_synonyms, "include_documentation": req.include_documentation}
        try:
            if r.resource_type == TOPIC:
                ctx.require(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, r.resource_name)
                info = broker.topics.get(r.resource_name)
                if info is None:
                    raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {r.resource_name!r} does not exist")
                row["configs"] = config_describe.topic(broker.config, info.configs, keys, **asked)
            elif r.resource_type == BROKER:
                ctx.require(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME)
                if r.resource_name not in ("", str(broker.node_id)):
                    raise KafkaError(ErrorCode.INVALID_REQUEST, f"no broker {r.resource_name!r} here")
                row["configs"] = config_describe.broker(broker.config, keys, **asked)
            else:
                raise KafkaError(ErrorCode.INVALID_REQUEST, f"resource type {r.resource_type} is not supported")
        except Exception as e:  # noqa: BLE001
            row.update(_failure(e))
        out.append(row)
    return {"throttle_time_ms": 0, "results": out}


async def _alter(ctx: RequestContext, r, build, validate_only: bool) -> dict:
    broker = ctx.broker
    row = {"error_code": 0, "error_message": None, "resource_type": r.resource_type,
           "resource_name": r.resource_name}
    try:
        if r.resource_type == BROKER:
            ctx.require(Operation.ALTER_CONFIGS, ResourceType.CLUSTER, CLUSTER_NAME)
        elif r.resource_type == TOPIC:
            ctx.require(Operation.ALTER_CONFIGS, ResourceType.TOPIC, r.resource_name)
        if r.resource_type != TOPIC:
            raise KafkaError(ErrorCode.INVALID_REQUEST,
                             "only topic configs can be altered; broker settings are static")
        info = broker.topics.get(r.resource_name)
        if info is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"topic {r.resource_name!r} does not exist")
        configs = build(dict(info.configs), r.configs,
                        lambda name: config_describe.render(topic_configs.values(broker.config, info.configs)[name]))
        checked = broker.admin.check_topic_configs(configs)
        if not validate_only:
            await broker.admin.set_topic_configs(r.resource_name, checked)
    except Exception as e:  # noqa: BLE001
        row.update(_failure(e))
    return row


def _replace(_current: dict, changes, _effective) -> dict:
    return {c.name: c.value for c in changes}


def _incremental(current: dict, changes, effective) -> dict:
    """Apply the operations in order. APPEND and SUBTRACT on a list the topic does not set
    start from the value the topic has now (the broker's or the built-in default), as
    Kafka's do: appending compact to an unset cleanup.policy gives compact,delete."""
    for c in changes:
        if c.config_operation == SET:
            current[c.name] = c.value
        elif c.config_operation == DELETE:
            current.pop(c.name, None)
        elif c.config_operation in (APPEND, SUBTRACT):
            if not topic_configs.is_topic_config(c.name) or topic_configs.kind(c.name) != "LIST":
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"{c.name} is not a list config")
            start = current[c.name] if c.name in current else effective(c.name)
            items = [x for x in start.split(",") if x]
            value = [x for x in (c.value or "").split(",") if x]
            if c.config_operation == APPEND:
                items += [x for x in value if x not in items]
            else:
                items = [x for x in items if x not in value]
            current[c.name] = ",".join(items) or ("delete" if c.name == "cleanup.policy" else "")
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST, f"unknown config operation {c.config_operation}")
    return current


@handles(ApiKey.ALTER_CONFIGS, 0, 2)
async def alter_configs(ctx: RequestContext, req):
    rows = [await _alter(ctx, r, _replace, req.validate_only) for r in req.resources]
    return {"throttle_time_ms": 0, "responses": rows}


@handles(ApiKey.INCREMENTAL_ALTER_CONFIGS, 0, 1)
async def incremental_alter_configs(ctx: RequestContext, req):
    rows = [await _alter(ctx, r, _incremental, req.validate_only) for r in req.resources]
    return {"throttle_time_ms": 0, "responses": rows}


@handles(ApiKey.DELETE_RECORDS, 0, 2)
async def delete_records(ctx: RequestContext, req):
    topics = []
    for t in req.topics:
        parts = []
        for p in t.partitions:
            row = {"partition_index": p.partition_index, "low_watermark": -1, "error_code": 0}
            try:
                ctx.require(Operation.DELETE, ResourceType.TOPIC, t.name)
                row["low_watermark"] = await ctx.broker.engine.delete_records(t.name, p.partition_index, p.offset)
            except Exception as e:  # noqa: BLE001
                row["error_code"] = error_code(e)
            parts.append(row)
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
