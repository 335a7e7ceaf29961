"""The handler registry and the server's dispatch, in process: handlers are registered by
`ApiKey` name, and a failing handler is answered with UNKNOWN_SERVER_ERROR (or its
connection closed) with the traceback logged."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from stratalog.gateway.handlers import load_handlers
from stratalog.gateway.handlers.registry import HANDLERS, RequestContext, handles, supported_versions
from stratalog.gateway.protocol.catalog import APIS, ApiKey
from stratalog.gateway.protocol.error_codes import ErrorCode
from stratalog.gateway.protocol.frames import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)


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

    def coordinator_for(self, key: str):
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


@pytest.mark.parametrize("version", range(0, 7))
def test_find_coordinator_answers_only_fields_of_its_version(version):
    body = {"key": "g", "coordinator_keys": ["g"]}
    resp = asyncio.run(answer(NoTopics(), ApiKey.FIND_COORDINATOR, version, body))
    found = resp.coordinators[0] if version >= 4 else resp
    assert (found.error_code, found.node_id, found.port) == (0, 1, 9092)
