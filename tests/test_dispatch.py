"""The handler registry and the server's dispatch, in process: handlers are registered by
`ApiKey` name, and a failing handler is answered with UNKNOWN_SERVER_ERROR (or its
connection closed) with the traceback logged."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest

from stratalog.gateway.auth.listeners import Listener
from stratalog.gateway.errors import error_code
from stratalog.gateway.handlers import load_handlers
from stratalog.gateway.handlers.registry import (
    HANDLERS,
    Handler,
    RequestContext,
    handles,
    supported_versions,
)
from stratalog.gateway.protocol.catalog import APIS, ApiKey
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.protocol.frames import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_response,
)
from stratalog.gateway.handlers.registry import Deferred
from stratalog.gateway.server import GatewayServer


def test_every_handler_is_registered_by_api_key_name():
    load_handlers()
    assert HANDLERS
    for key, handler in HANDLERS.items():
        assert type(key) is ApiKey and handler.api_key is key
        assert key in APIS


def test_handles_refuses_a_bare_number():
    with pytest.raises(TypeError, match="ApiKey"):
        handles(3, 0, 12)


# --- handlers' responses through the strict encoder --------------------------------------

class NoTopics:
    """The broker surface Metadata and FindCoordinator use, for a cluster without topics."""

    cluster_id = "c"
    topics: dict = {}
    topics_by_id: dict = {}

    def live_brokers(self) -> list:
        return []

    def controller_id(self) -> int:
        return 1

    async def look_up_topics(self, names, ids=()) -> None:
        pass  # nothing to reload: there are no topics

    async def see_leaders(self, infos) -> None:
        pass  # the live set is fixed here

    def coordinator_for(self, key: str, listener=None):
        return 1, "127.0.0.1", 9092


async def answer(broker, api_key: ApiKey, version: int, body: dict):
    """Run a handler on an encoded request and decode its encoded response, as a client would."""
    load_handlers()
    frame = encode_request(api_key, version, 5, body)
    req = decode_request(frame[4:], supported_versions())
    ctx = RequestContext(broker, req.api_key, version, req.client_id, "127.0.0.1:1")
    resp = await HANDLERS[api_key].fn(ctx, req.body)
    return decode_response(api_key, version, encode_response(api_key, version, 5, resp)[4:])[1]


@pytest.mark.parametrize("version", [10, 11, 12])
def test_metadata_unknown_topic_id_at_every_version_with_ids(version):
    # Topic names are nullable from v12 only: v10-11 answer an unknown id with "".
    tid = uuid.uuid4()
    body = {"topics": [{"name": None, "topic_id": tid}]}
    resp = asyncio.run(answer(NoTopics(), ApiKey.METADATA, version, body))
    (topic,) = resp.topics
    assert (topic.error_code, topic.topic_id) == (ErrorCode.UNKNOWN_TOPIC_ID, tid)
    assert topic.name == (None if version >= 12 else "")


def test_metadata_by_id_ignores_the_default_empty_name():
    # Kafka's Java consumer asks for its KIP-848 assignment by id with the name left at "":
    # the id names the topic (before, "" was looked up as a name: UNKNOWN_TOPIC_OR_PARTITION
    # under the name "", which the client retried in a tight loop).
    tid = uuid.uuid4()
    resp = asyncio.run(answer(NoTopics(), ApiKey.METADATA, 12, {"topics": [{"name": "", "topic_id": tid}]}))
    (topic,) = resp.topics
    assert (topic.error_code, topic.topic_id, topic.name) == (ErrorCode.UNKNOWN_TOPIC_ID, tid, None)


class LeaderNotListed(NoTopics):
    """Gateway 1 lists only itself, but partition 1's state names gateway 3 leader."""

    def __init__(self):
        from stratalog.coordinator.model import TopicInfo

        self.topics = {"t": TopicInfo("t", uuid.UUID(int=7), 2, 1, {})}

    def live_brokers(self) -> list:
        from stratalog.gateway.cluster import BrokerAddress

        return [BrokerAddress(1, "127.0.0.1", 9092)]

    async def partition_states(self, info):
        from stratalog.coordinator.model import PartitionState

        return {0: PartitionState(1, 2, (1,), (1,)), 1: PartitionState(3, 5, (3,), (3,))}


@pytest.mark.unit
def test_metadata_answers_a_leader_it_does_not_list_as_not_available():
    # A leader the answer gives no address for is no leader to a client; Kafka answers
    # LEADER_NOT_AVAILABLE with leader -1.
    resp = asyncio.run(answer(LeaderNotListed(), ApiKey.METADATA, 12, {"topics": [{"name": "t"}]}))
    assert [b.node_id for b in resp.brokers] == [1]
    (topic,) = resp.topics
    assert topic.error_code == 0
    assert [(p.partition_index, p.error_code, p.leader_id) for p in topic.partitions] == [
        (0, 0, 1), (1, ErrorCode.LEADER_NOT_AVAILABLE, -1)]


@pytest.mark.parametrize("version", [0, 1])
def test_describe_cluster_gives_authorized_operations_when_asked(version):
    # With ACLs off every cluster operation is allowed: CREATE (5), ALTER (7), DESCRIBE (8),
    # CLUSTER_ACTION (9), DESCRIBE_CONFIGS (10), ALTER_CONFIGS (11), IDEMPOTENT_WRITE (12).
    # Kafka's Java AdminClient showed null here before.
    every = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))
    asked = asyncio.run(answer(NoTopics(), ApiKey.DESCRIBE_CLUSTER, version, {"include_cluster_authorized_operations": True}))
    assert asked.cluster_authorized_operations == every
    unasked = asyncio.run(answer(NoTopics(), ApiKey.DESCRIBE_CLUSTER, version, {}))
    assert unasked.cluster_authorized_operations == -(2**31)


class OneLog:
    """The broker surface DescribeLogDirs uses: one led partition of 1234 bytes."""

    def __init__(self, data_dir):
        self.data_dir = data_dir
        self.engine = self
        self.log = type("Log", (), {"size_bytes": 1234})()

    def led(self) -> dict:
        return {("t", 0): self.log}


@pytest.mark.parametrize("version", range(0, 5))
def test_describe_log_dirs_lists_led_partitions_with_their_size(version, tmp_path):
    for topics, expected in ((None, [("t", [(0, 1234)])]),
                             ([{"topic": "t", "partitions": [1]}], []),
                             ([{"topic": "t", "partitions": [0]}], [("t", [(0, 1234)])])):
        resp = asyncio.run(answer(OneLog(tmp_path), ApiKey.DESCRIBE_LOG_DIRS, version, {"topics": topics}))
        (result,) = resp.results
        assert (result.error_code, result.log_dir) == (0, str(tmp_path))
        assert [(t.name, [(p.partition_index, p.partition_size) for p in t.partitions])
                for t in result.topics] == expected
        if version >= 4:
            assert result.total_bytes > 0 and result.usable_bytes >= 0


@pytest.mark.parametrize("version", range(0, 7))
def test_find_coordinator_answers_only_fields_of_its_version(version):
    body = {"key": "g", "coordinator_keys": ["g"]}
    resp = asyncio.run(answer(NoTopics(), ApiKey.FIND_COORDINATOR, version, body))
    found = resp.coordinators[0] if version >= 4 else resp
    assert (found.error_code, found.node_id, found.port) == (0, 1, 9092)


# --- failures in a real server on loopback ------------------------------------------------

async def boom(ctx, req):
    raise RuntimeError("handler bug on purpose")


async def typo(ctx, req):
    return {"eror_code": 0}


async def deferred_boom(ctx, req):
    async def later():
        raise RuntimeError("deferred bug on purpose")
    return Deferred(later())


async def mapped_in_handler(ctx, req):
    try:
        raise RuntimeError("storage bug on purpose")
    except RuntimeError as e:
        return {"error_code": error_code(e)}


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def call(self, api_key: ApiKey, version: int, correlation_id: int, body: dict):
        self.writer.write(encode_request(api_key, version, correlation_id, body))
        size = int.from_bytes(await self.reader.readexactly(4), "big")
        cid, resp = decode_response(api_key, version, await self.reader.readexactly(size))
        assert cid == correlation_id
        return resp

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 5) == b""


async def with_server(check, **handlers):
    """Run `check(server, connect)` against a GatewayServer whose handlers for the given
    API names are replaced."""
    server = GatewayServer(object(), Listener("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 0), max_request_bytes=1 << 20)
    saved = dict(HANDLERS)
    for name, fn in handlers.items():
        h = HANDLERS[ApiKey[name]]
        HANDLERS[h.api_key] = Handler(h.api_key, h.min_version, h.max_version, fn)
    await server.start()

    async def connect() -> Client:
        return Client(*await asyncio.open_connection("127.0.0.1", server.port))

    try:
        await check(server, connect)
    finally:
        HANDLERS.clear()
        HANDLERS.update(saved)
        await server.stop()


HEARTBEAT = {"group_id": "g", "generation_id": 1, "member_id": "m"}


def tracebacks(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and r.levelno >= logging.ERROR]


@pytest.mark.parametrize("handler,cause", [
    (boom, "handler bug on purpose"),
    (deferred_boom, "deferred bug on purpose"),
    (typo, "unknown key 'eror_code'"),
    (mapped_in_handler, "storage bug on purpose"),
])
def test_a_failing_handler_is_answered_unknown_server_error_and_logged(caplog, handler, cause):
    async def check(server, connect):
        c = await connect()
        resp = await c.call(ApiKey.HEARTBEAT, 4, 31, HEARTBEAT)
        assert resp.error_code == ErrorCode.UNKNOWN_SERVER_ERROR
        # The same connection keeps being served.
        versions = await c.call(ApiKey.API_VERSIONS, 3, 32, {})
        assert versions.error_code == 0 and versions.api_keys

    asyncio.run(with_server(check, HEARTBEAT=handler))
    (record,) = tracebacks(caplog)  # logged once
    text = caplog.text
    assert "Heartbeat v4 (correlation id 31) from 127.0.0.1:" in record.getMessage()
    assert "Traceback" in text and cause in text


def test_a_failing_handler_without_a_top_level_error_code_closes_only_its_connection(caplog):
    async def check(server, connect):
        c = await connect()
        with pytest.raises(asyncio.IncompleteReadError):
            await c.call(ApiKey.METADATA, 9, 7, {"topics": []})
        assert await c.closed()
        other = await connect()
        assert (await other.call(ApiKey.API_VERSIONS, 3, 8, {})).error_code == 0

    asyncio.run(with_server(check, METADATA=boom))
    (record,) = tracebacks(caplog)
    message = record.getMessage()
    assert "Metadata v9 (correlation id 7)" in message and "closing the connection" in message
    assert "handler bug on purpose" in caplog.text


def test_error_response_exists_where_the_version_has_a_top_level_error_code():
    assert error_response(ApiKey.HEARTBEAT, 0, -1) == {"error_code": -1}
    assert error_response(ApiKey.FETCH, 7, -1) == {"error_code": -1}
    assert error_response(ApiKey.FETCH, 6, -1) is None  # per partition only before v7
    assert error_response(ApiKey.PRODUCE, 9, -1) is None
