"""Transaction APIs: InitProducerId (transactional and idempotent), AddPartitionsToTxn,
AddOffsetsToTxn, TxnOffsetCommit, EndTxn, DescribeTransactions and ListTransactions,
answered by `ctx.broker.transactions` (a `TransactionCoordinator`); and DescribeProducers,
answered by the partitions' leaders.

Version differences are settled here: PRODUCER_FENCED is known to clients from
InitProducerId v4, AddPartitionsToTxn/AddOffsetsToTxn/EndTxn v2 and TxnOffsetCommit v3;
older ones are told INVALID_PRODUCER_EPOCH, as Kafka tells them. AddPartitionsToTxn v4+ is
the brokers' batched form, allowed to principals with CLUSTER_ACTION.
"""

from __future__ import annotations

from typing import Any, Awaitable

from stratalog.coordinator.model import CommittedOffset
from stratalog.coordinator.transactions import TxnStatus
from stratalog.engine.errors import EngineError
from stratalog.gateway.auth.acls import CLUSTER_NAME, Operation, ResourceType
from stratalog.gateway.errors import error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode as E
from stratalog.gateway.transactions import ProducerIdAndEpoch, TxnError

from .groups import may_use, not_coordinator
from .registry import ApiKey, RequestContext, handles

# First version of each API whose clients know PRODUCER_FENCED.
_FENCED_SINCE = {ApiKey.INIT_PRODUCER_ID: 4, ApiKey.ADD_PARTITIONS_TO_TXN: 2,
                 ApiKey.ADD_OFFSETS_TO_TXN: 2, ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3}


def _code(ctx: RequestContext, e: TxnError) -> E:
    if e.code is E.PRODUCER_FENCED and ctx.version < _FENCED_SINCE.get(ctx.api_key, 0):
        return E.INVALID_PRODUCER_EPOCH
    return e.code


async def _outcome(ctx: RequestContext, operation: Awaitable[Any]) -> E:
    """NONE when the coordinator operation succeeds, else its error for this version."""
    try:
        await operation
        return E.NONE
    except TxnError as e:
        return _code(ctx, e)


def _txn_error(ctx: RequestContext, transactional_id: str) -> E | None:
    """The error of a request about a transactional id, before its state is read."""
    if not ctx.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, transactional_id):
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if not transactional_id:
        return E.INVALID_REQUEST
    if not ctx.broker.is_coordinator_for(transactional_id):
        return E.NOT_COORDINATOR
    return None


# --- InitProducerId -----------------------------------------------------------------------

@handles(ApiKey.INIT_PRODUCER_ID, 0, 5)
async def init_producer_id(ctx: RequestContext, req) -> dict[str, Any]:
    def answer(code: E, pid: int = -1, epoch: int = -1) -> dict[str, Any]:
        return {"throttle_time_ms": 0, "error_code": code, "producer_id": pid, "producer_epoch": epoch}

    tid = req.transactional_id
    if tid is None:
        return await _idempotent(ctx, req, answer)
    error = _txn_error(ctx, tid)
    if error is not None:
        return answer(error)
    expected = None
    if ctx.version >= 3 and req.producer_id >= 0:
        expected = ProducerIdAndEpoch(req.producer_id, req.producer_epoch)
    try:
        got = await ctx.broker.transactions.init_producer_id(tid, req.transaction_timeout_ms, expected)
    except TxnError as e:
        return answer(_code(ctx, e))
    return answer(E.NONE, got.producer_id, got.producer_epoch)


async def _idempotent(ctx: RequestContext, req, answer) -> dict[str, Any]:
    # IDEMPOTENT_WRITE on the cluster, or WRITE on some topic (KIP-679, as Kafka 3.0+).
    if not (ctx.allowed(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER, CLUSTER_NAME)
            or ctx.allowed_any(Operation.WRITE, ResourceType.TOPIC)):
        return answer(E.CLUSTER_AUTHORIZATION_FAILED)
    if ctx.version >= 3 and req.producer_id >= 0:
        # A producer bumping its own epoch after a sequence error (KIP-360).
        epoch = req.producer_epoch + 1
        if epoch <= 0x7FFF:
            return answer(E.NONE, req.producer_id, epoch)
    return answer(E.NONE, await ctx.broker.next_producer_id(), 0)


# --- AddPartitionsToTxn ---------------------------------------------------------------------

async def _add_partitions(ctx: RequestContext, tid: str, pid: int, epoch: int, topics,
                          verify_only: bool = False) -> list[dict[str, Any]]:
    """One transaction's partitions added (or checked): its per-topic results."""
    errors: dict[tuple[str, int], E] = {}
    wanted = [(t.name, p) for t in topics or [] for p in t.partitions or []]
    error = _txn_error(ctx, tid)
    if error is None:
        for name, p in wanted:
            if not ctx.allowed(Operation.WRITE, ResourceType.TOPIC, name):
                errors[(name, p)] = E.TOPIC_AUTHORIZATION_FAILED
            elif not 0 <= p < (ctx.broker.partition_count(name) or 0):
                errors[(name, p)] = E.UNKNOWN_TOPIC_OR_PARTITION
        if errors:
            error = E.OPERATION_NOT_ATTEMPTED  # for the rest: all or none are added
        else:
            error = await _outcome(ctx, ctx.broker.transactions.add_partitions(
                tid, pid, epoch, wanted, verify_only=verify_only))
    return [{"name": t.name,
             "results_by_partition": [{"partition_index": p,
                                       "partition_error_code": errors.get((t.name, p), error)}
                                      for p in t.partitions or []]}
            for t in topics or []]


@handles(ApiKey.ADD_PARTITIONS_TO_TXN, 0, 4)
async def add_partitions_to_txn(ctx: RequestContext, req) -> dict[str, Any]:
    if ctx.version <= 3:
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": await _add_partitions(
            ctx, req.v3_and_below_transactional_id, req.v3_and_below_producer_id,
            req.v3_and_below_producer_epoch, req.v3_and_below_topics)}
    if not ctx.allowed(Operation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_NAME):
        return {"throttle_time_ms": 0, "error_code": E.CLUSTER_AUTHORIZATION_FAILED,
                "results_by_transaction": []}
    results = []
    for t in req.transactions or []:
        topics = await _add_partitions(ctx, t.transactional_id, t.producer_id, t.producer_epoch,
                                       t.topics, verify_only=t.verify_only)
        results.append({"transactional_id": t.transactional_id, "topic_results": topics})
    return {"throttle_time_ms": 0, "error_code": E.NONE, "results_by_transaction": results}


# --- AddOffsetsToTxn and TxnOffsetCommit ------------------------------------------------------

@handles(ApiKey.ADD_OFFSETS_TO_TXN, 0, 3)
async def add_offsets_to_txn(ctx: RequestContext, req) -> dict[str, Any]:
    error = _txn_error(ctx, req.transactional_id)
    if error is None and not may_use(ctx, req.group_id):
        error = E.GROUP_AUTHORIZATION_FAILED
    if error is None:
        error = await _outcome(ctx, ctx.broker.transactions.add_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id))
    return {"throttle_time_ms": 0, "error_code": error}


@handles(ApiKey.TXN_OFFSET_COMMIT, 0, 3)
async def txn_offset_commit(ctx: RequestContext, req) -> dict[str, Any]:
    error = await _offset_commit_error(ctx, req)
    offsets = {}
    topic_errors: dict[tuple[str, int], E] = {}
    if error is None:
        limit = ctx.broker.groups.config.max_metadata_bytes
        now_ms = ctx.broker.now_ms()
        for t in req.topics or []:
            for p in t.partitions or []:
                tp = (t.name, p.partition_index)
                if not ctx.allowed(Operation.READ, ResourceType.TOPIC, t.name):
                    topic_errors[tp] = E.TOPIC_AUTHORIZATION_FAILED
                elif len((p.committed_metadata or "").encode()) > limit:
                    topic_errors[tp] = E.OFFSET_METADATA_TOO_LARGE
                else:
                    epoch = p.committed_leader_epoch if ctx.version >= 2 else -1
                    offsets[tp] = CommittedOffset(p.committed_offset, epoch, p.committed_metadata or "", now_ms)
        error = await _outcome(ctx, ctx.broker.transactions.commit_offsets(
            req.transactional_id, req.producer_id, req.producer_epoch, req.group_id, offsets)) \
            if offsets else E.NONE
    return {"throttle_time_ms": 0, "topics": [
        {"name": t.name,
         "partitions": [{"partition_index": p.partition_index,
                         "error_code": topic_errors.get((t.name, p.partition_index), error)}
                        for p in t.partitions or []]}
        for t in req.topics or []]}


async def _offset_commit_error(ctx: RequestContext, req) -> E | None:
    if not ctx.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, req.transactional_id):
        return E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    if not may_use(ctx, req.group_id):
        return E.GROUP_AUTHORIZATION_FAILED
    if not_coordinator(ctx, req.group_id):
        return E.NOT_COORDINATOR
    if ctx.version >= 3 and (req.generation_id >= 0 or req.member_id or req.group_instance_id):
        # KIP-447: the producer speaks for a consumer that must still be a member of the
        # group's current generation (a zombie's offsets are refused).
        partitions = [(t.name, p.partition_index) for t in req.topics or [] for p in t.partitions or []]
        return await ctx.broker.groups.check_member(req.group_id, req.generation_id, req.member_id,
                                                    req.group_instance_id, partitions)
    return None


# --- EndTxn ---------------------------------------------------------------------------------

@handles(ApiKey.END_TXN, 0, 4)
async def end_txn(ctx: RequestContext, req) -> dict[str, Any]:
    error = _txn_error(ctx, req.transactional_id)
    if error is None:
        error = await _outcome(ctx, ctx.broker.transactions.end_txn(
            req.transactional_id, req.producer_id, req.producer_epoch, req.committed))
    return {"throttle_time_ms": 0, "error_code": error}


# --- DescribeTransactions and ListTransactions ----------------------------------------------

@handles(ApiKey.DESCRIBE_TRANSACTIONS, 0, 0)
async def describe_transactions(ctx: RequestContext, req) -> dict[str, Any]:
    out = []
    for tid in req.transactional_ids or []:
        entry: dict[str, Any] = {"error_code": E.NONE, "transactional_id": tid, "transaction_state": "",
                                 "transaction_timeout_ms": 0, "transaction_start_time_ms": -1,
                                 "producer_id": -1, "producer_epoch": -1, "topics": []}
        out.append(entry)
        if not ctx.allowed(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            entry["error_code"] = E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            continue
        if not ctx.broker.is_coordinator_for(tid):
            entry["error_code"] = E.NOT_COORDINATOR
            continue
        got = await ctx.broker.store.transaction(tid)
        if got is None:
            entry["error_code"] = E.TRANSACTIONAL_ID_NOT_FOUND
            continue
        state = got[0]
        by_topic: dict[str, list[int]] = {}
        for topic, p in state.partitions:
            by_topic.setdefault(topic, []).append(p)
        entry.update(transaction_state=state.status.value, transaction_timeout_ms=state.timeout_ms,
                     transaction_start_time_ms=state.start_ms, producer_id=state.producer_id,
                     producer_epoch=state.producer_epoch,
                     topics=[{"topic": t, "partitions": ps} for t, ps in sorted(by_topic.items())])
    return {"throttle_time_ms": 0, "transaction_states": out}


@handles(ApiKey.LIST_TRANSACTIONS, 0, 1)
async def list_transactions(ctx: RequestContext, req) -> dict[str, Any]:
    """The transactions this gateway coordinates (Kafka's admin client asks every broker)."""
    states = {s.lower() for s in req.state_filters or []}
    known = {s.value.lower() for s in TxnStatus}
    pids = set(req.producer_id_filters or [])
    min_age = req.duration_filter if ctx.version >= 1 else -1
    now = ctx.broker.now_ms()
    out = []
    for state, _ in await ctx.broker.store.transactions():
        tid = state.transactional_id
        if not ctx.broker.is_coordinator_for(tid) \
                or not ctx.allowed(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, tid):
            continue
        if (states and state.status.value.lower() not in states) or (pids and state.producer_id not in pids):
            continue
        if min_age >= 0 and (state.start_ms < 0 or now - state.start_ms < min_age):
            continue
        out.append({"transactional_id": tid, "producer_id": state.producer_id,
                    "transaction_state": state.status.value})
    return {"throttle_time_ms": 0, "error_code": E.NONE,
            "unknown_state_filters": sorted(s for s in req.state_filters or [] if s.lower() not in known),
            "transaction_states": out}


# --- DescribeProducers ----------------------------------------------------------------------

@handles(ApiKey.DESCRIBE_PRODUCERS, 0, 0)
async def describe_producers(ctx: RequestContext, req) -> dict[str, Any]:
    topics = []
    for t in req.topics or []:
        parts = []
        for p in t.partition_indexes or []:
            entry: dict[str, Any] = {"partition_index": p, "error_code": E.NONE, "error_message": None,
                                     "active_producers": []}
            parts.append(entry)
            if not ctx.allowed(Operation.READ, ResourceType.TOPIC, t.name):
                entry["error_code"] = E.TOPIC_AUTHORIZATION_FAILED
                continue
            try:
                plog = ctx.broker.engine.leader(t.name, p)
            except EngineError as e:
                entry["error_code"], entry["error_message"] = error_code(e), error_message(e)
                continue
            entry["active_producers"] = [
                {"producer_id": pid, "producer_epoch": producer.epoch, "last_sequence": producer.last_seq(),
                 "last_timestamp": producer.last_timestamp, "coordinator_epoch": 0,
                 "current_txn_start_offset": plog.txns.open.get(pid, -1)}
                for pid, producer in sorted(plog.producers.producers.items())]
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time_ms": 0, "topics": topics}
