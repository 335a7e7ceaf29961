"""Produce: validate batches, assign offsets, append, and answer per `acks`.

Requests on one connection append in order: the server reads the next request only after
this handler returns, and only the wait for the WAL commit (`acks=all`) is deferred.

A transactional producer's first batch on a partition is checked against its transaction
in the coordinator (KIP-890's defence): the partition must have been added to the
producer's ongoing transaction at this epoch, so a zombie or a producer that skipped
AddPartitionsToTxn can never leave a transaction open on a partition (which would hold
back the last stable offset for ever).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math

from stratalog.coordinator.transactions import TxnStatus
from stratalog.engine import Batches
from stratalog.engine.errors import EngineError, InvalidRecord
from stratalog.gateway.auth.acls import Operation, ResourceType
from stratalog.gateway.coarse_timers import TICK_S, coarse_timers
from stratalog.gateway.errors import error_code, error_message
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.quotas.rules import PRODUCER_BYTE_RATE
from stratalog.tiering.batch import BatchHeader

from .registry import NO_RESPONSE, ApiKey, Deferred, RequestContext, handles

log = logging.getLogger(__name__)


def _produce_partition(broker, topic: str, index: int, records: Batches, now_ms: int, version: int):
    """Append one partition's batches; returns (response dict, awaitable or None)."""
    resp = {"index": index, "error_code": 0, "base_offset": -1, "log_append_time_ms": -1,
            "log_start_offset": -1}
    try:
        appended = broker.engine.append(topic, index, records, now_ms=now_ms)
    except Exception as e:  # noqa: BLE001 - every failure becomes this partition's error code
        resp["error_code"] = error_code(e)
        resp["error_message"] = error_message(e)
        if version >= 8 and isinstance(e, InvalidRecord) and e.records:
            # KIP-467: the records to blame, so clients fail those with INVALID_RECORD and
            # the rest of the batch with an error of their own (librdkafka:
            # _INVALID_DIFFERENT_RECORD). Older versions have the partition's code only.
            resp["record_errors"] = [{"batch_index": i, "batch_index_error_message": m} for i, m in e.records]
        return resp, None
    if broker.metrics is not None:
        broker.metrics.produced(topic, appended.bytes, appended.records)
    resp["base_offset"] = appended.base_offset
    resp["log_start_offset"] = appended.log_start_offset
    if appended.log_append_time:
        resp["log_append_time_ms"] = now_ms
    return resp, appended.commit


@handles(ApiKey.PRODUCE, 3, 11)
async def produce(ctx: RequestContext, req):
    broker = ctx.broker
    now_ms = broker.now_ms()
    responses = []
    waits: list[tuple[dict, object]] = []
    txn_check = _TxnCheck(ctx, req.transactional_id) if req.transactional_id is not None else None
    for t in req.topic_data:
        parts = []
        for pd in t.partition_data:
            # Each batch header is parsed here, once: the checks below and the append read it.
            batches = Batches.split(pd.records)
            if req.acks not in (-1, 0, 1):
                resp = {"index": pd.index, "error_code": ErrorCode.INVALID_REQUIRED_ACKS,
                        "base_offset": -1}
                wait = None
            elif not ctx.allowed(Operation.WRITE, ResourceType.TOPIC, t.name):
                resp = {"index": pd.index, "error_code": ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                        "base_offset": -1}
                wait = None
            elif (refused := _non_transactional_refusal(batches.first) if txn_check is None
                  else await txn_check.refusal(t.name, pd.index, batches.first)) is not None:
                resp = {"index": pd.index, "error_code": refused[0], "base_offset": -1,
                        "error_message": refused[1]}
                wait = None
            else:
                resp, wait = _produce_partition(broker, t.name, pd.index, batches, now_ms, ctx.version)
            parts.append(resp)
            if wait is not None:
                waits.append((resp, wait))
        responses.append({"name": t.name, "partition_responses": parts})
    body = {"responses": responses, "throttle_time_ms": 0}
    # producer_byte_rate counts the whole request, as Kafka does; the batches are kept and
    # the answer (or, for acks=0, the connection) carries the throttle.
    if broker.quotas.any_set:
        ctx.throttle(broker.quotas.record(PRODUCER_BYTE_RATE, ctx.principal, ctx.client_id, ctx.request_bytes))
    if req.acks == 0:
        return NO_RESPONSE
    if req.acks == 1 or not waits:
        for _, w in waits:
            if asyncio.iscoroutine(w):
                w.close()
        return body
    return Deferred(_await_commit(body, waits, req.timeout_ms))


def _await_commit(body: dict, waits, timeout_ms: int) -> asyncio.Future:
    """The response, once every partition's batches are committed or the request timed out.

    Built from callbacks rather than a coroutine: the commit futures are shared by every
    request whose batches are in one WAL flush, so thousands of requests may complete at
    once, and the server can see which answers are ready without running anything.
    """
    loop = asyncio.get_running_loop()
    request = _CommitWait(body, loop.create_future(), loop.time() + max(timeout_ms, 1) / 1000,
                          [(resp, w if isinstance(w, asyncio.Future) else asyncio.ensure_future(w))
                           for resp, w in waits])
    for resp, f in request.waits:
        group = _WAITING.get(f)
        if group is None:
            group = _WAITING[f] = _Waiters()
            f.add_done_callback(_committed)
            group.arm(f, request.deadline)
        elif request.deadline < group.due:
            group.arm(f, request.deadline)
        group.entries.append((request, resp))
    return request.answer


class _CommitWait:
    """One acks=all request waiting for its partitions' commits: answered when the last one
    ends, or at its deadline with those still waiting timed out."""

    __slots__ = ("body", "answer", "deadline", "waits", "left")

    def __init__(self, body: dict, answer: asyncio.Future, deadline: float, waits: list):
        self.body, self.answer, self.deadline, self.waits = body, answer, deadline, waits
        self.left = len(waits)

    def time_out(self) -> None:
        for resp, f in self.waits:
            if f.done():
                _settle(resp, f)  # ended, though its callback has not run yet
                continue
            if isinstance(f, asyncio.Task):
                f.cancel()  # a retried batch's wait for its original, ours alone
            resp["error_code"] = ErrorCode.REQUEST_TIMED_OUT
            resp["error_message"] = "the batch was not committed within the request timeout"
        self.answer.set_result(self.body)


class _Waiters:
    """The requests waiting on one commit future (those with batches for its partition in
    one WAL flush): one done-callback and one deadline timer serve them all, where a timer
    of each request's own cost more than the rest of its wait."""

    __slots__ = ("entries", "due", "timer")

    def __init__(self) -> None:
        self.entries: list[tuple[_CommitWait, dict]] = []
        self.due = math.inf
        self.timer = None

    def arm(self, f: asyncio.Future, due: float) -> None:
        """Check the deadlines at `due` (the earliest of them)."""
        if self.timer is not None:
            self.timer.cancel()
        self.due = due
        self.timer = coarse_timers().call_at(due, functools.partial(_deadline_passed, f))


# The waiters of each commit future not yet ended. Every commit future ends (committed,
# failed, or told WalCommitDelayed), which removes its entry; only a stop that abandons its
# last flush leaves some, as the process ends.
_WAITING: dict[asyncio.Future, _Waiters] = {}


def _settle(resp: dict, f: asyncio.Future) -> None:
    """A partition's answer from how its commit ended."""
    if f.cancelled():
        resp["error_code"] = ErrorCode.REQUEST_TIMED_OUT
    elif (e := f.exception()) is not None:
        resp["error_code"] = error_code(e)
        resp["error_message"] = error_message(e)


def _committed(f: asyncio.Future) -> None:
    group = _WAITING.pop(f, None)
    if group is None:
        return
    if group.timer is not None:
        group.timer.cancel()
    for request, resp in group.entries:
        if request.answer.done():
            continue  # timed out already
        try:
            _settle(resp, f)
            request.left -= 1
            if not request.left:
                request.answer.set_result(request.body)
        except Exception:  # noqa: BLE001 - one request's bug must not keep the others waiting
            log.exception("settling a produce request's commit wait failed")


def _deadline_passed(f: asyncio.Future) -> None:
    group = _WAITING.get(f)
    if group is None:
        return
    now = asyncio.get_running_loop().time()
    waiting = []
    for request, resp in group.entries:
        if request.answer.done():
            continue
        if request.deadline <= now + TICK_S:  # due within this tick: the timers' grain
            request.time_out()
        else:
            waiting.append((request, resp))
    group.entries, group.timer, group.due = waiting, None, math.inf
    if waiting:
        group.arm(f, min(request.deadline for request, _ in waiting))


def _non_transactional_refusal(h: BatchHeader | None) -> tuple[ErrorCode, str] | None:
    """Why a request without a transactional id may not append batches whose first header
    is `h`, or None."""
    if h is None:
        return None  # the append refuses the batches
    if h.is_transactional and not h.is_control:
        return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "transactional batches need a transactional id"
    return None


class _TxnCheck:
    """Whether a partition's batches may be appended for the request's transactional id
    (requests without one: `_non_transactional_refusal`)."""

    def __init__(self, ctx: RequestContext, transactional_id: str):
        self.ctx = ctx
        self.transactional_id = transactional_id
        self._state = None
        self._read = False

    async def refusal(self, topic: str, partition: int, h: BatchHeader | None) -> tuple[ErrorCode, str] | None:
        """Why these batches (`h`: the first one's header) may not be appended, or None."""
        ctx, tid = self.ctx, self.transactional_id
        if h is None:
            return None  # the append refuses the batches
        if not ctx.allowed(Operation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            return ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, f"WRITE on transactional id {tid!r} is not allowed"
        if not h.is_transactional or h.is_control:
            return None
        try:
            plog = ctx.broker.engine.leader(topic, partition)
        except EngineError:
            return None  # the append answers it
        if h.producer_id in plog.txns.open:
            return None  # its transaction here was checked when it began
        if not self._read:
            got = await ctx.broker.store.transaction(tid)
            self._state, self._read = (got[0] if got else None), True
        state = self._state
        abortable = ErrorCode.TRANSACTION_ABORTABLE if ctx.version >= 11 else ErrorCode.INVALID_TXN_STATE
        if state is None or state.producer_id != h.producer_id:
            return abortable, f"producer {h.producer_id} does not hold transactional id {tid!r}"
        if h.producer_epoch < state.producer_epoch:
            return ErrorCode.INVALID_PRODUCER_EPOCH, f"epoch {h.producer_epoch} is fenced by {state.producer_epoch}"
        if state.status is not TxnStatus.ONGOING or state.producer_epoch != h.producer_epoch \
                or (topic, partition) not in state.partitions:
            return abortable, f"{topic}-{partition} is not in an ongoing transaction of {tid!r}"
        return None
