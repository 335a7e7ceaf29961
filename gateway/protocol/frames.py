"""Requests in, responses out: the header rules of the Kafka protocol, on bytes only.

A frame is a 4-byte big-endian size followed by that many bytes. A request frame holds a
request header (v1, or v2 with tagged fields once the API version is flexible) and the
body; a response holds a response header (v0, or v1 once flexible; ApiVersions always
answers with v0 so a client that does not yet know our versions can read it) and the body.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .catalog import APIS, REQUEST_HEADER, RESPONSE_HEADER, ApiKey
from .schema import Message, Schema
from .wire import DecodeError, Reader, Writer

SIZE = struct.Struct(">i")
_API_KEYS = {int(k): k for k in ApiKey}  # a dict lookup costs less than ApiKey(n)


class UnknownApi(DecodeError):
    """The request names an API key, or a version of one, that we do not speak."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int):
        super().__init__(f"unsupported API key {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(slots=True)
class Request:
    api_key: ApiKey
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Message

    @property
    def api_name(self) -> str:
        return APIS[self.api_key][0]


def request_schema(api_key: int) -> Schema:
    return APIS[api_key][1]


def response_schema(api_key: int) -> Schema:
    return APIS[api_key][2]


def peek_header(frame: bytes | memoryview) -> tuple[int, int, int]:
    """api key, api version and correlation id: the fixed start of every request header."""
    if len(frame) < 8:
        raise DecodeError(f"request of {len(frame)} bytes is shorter than a header")
    return struct.unpack_from(">hhi", frame, 0)


def decode_request(frame: bytes | memoryview, supported: dict[int, tuple[int, int]]) -> Request:
    """Decode one request frame (without its size prefix).

    `supported` maps api key to the (min, max) versions we answer; anything outside it
    raises `UnknownApi`, except ApiVersions, whose body is then left empty so the caller
    can answer with the v0 fallback the protocol prescribes.
    """
    api_key, api_version, correlation_id = peek_header(frame)
    span = supported.get(api_key)
    if span is None or api_key not in APIS:
        raise UnknownApi(api_key, api_version, correlation_id)
    api_key = _API_KEYS[api_key]
    schema = request_schema(api_key)
    # The schema bounds the range too: a version it does not describe has no layout.
    in_range = max(span[0], schema.vmin) <= api_version <= min(span[1], schema.vmax)
    if not in_range and api_key != ApiKey.API_VERSIONS:
        raise UnknownApi(api_key, api_version, correlation_id)
    flexible = schema.flexible(api_version) if in_range else False
    reader = Reader(frame)
    header = REQUEST_HEADER.decode(reader, 2 if flexible else 1)
    if not in_range:
        return Request(api_key, api_version, correlation_id, header.client_id, Message())
    body = schema.decode(reader, api_version)
    # Trailing bytes are tolerated, as Kafka does: newer clients may append fields that an
    # older version ignores.
    return Request(api_key, api_version, correlation_id, header.client_id, body)


def error_response(api_key: int, api_version: int, code: int) -> dict | None:
    """The response that answers a whole request with `code`, if this version has a
    top-level error code; None if its errors are only per topic, partition, group or
    resource (Kafka builds those by mirroring the request: we have no such builders)."""
    for f in response_schema(api_key).fields:
        if f.name == "error_code" and f.present(api_version) and f.tag is None:
            return {"error_code": code}
    return None


def _sized_parts(w: Writer) -> list:
    """The writer's buffers with the size prefix it began with filled in."""
    parts = w.parts()
    SIZE.pack_into(parts[0], 0, len(w) - 4)
    return parts


def encode_response_parts(api_key: int, api_version: int, correlation_id: int, body: Any) -> list:
    """A response with its header and size prefix, as buffers to write in order (record
    batches in it are not copied)."""
    schema = response_schema(api_key)
    flexible = schema.flexible(api_version) and api_key != ApiKey.API_VERSIONS
    w = Writer()
    w.int32(0)  # size, patched below
    # The response header, written directly: it is the correlation id, then (v1) an empty
    # tagged-field section, as RESPONSE_HEADER describes it.
    w.int32(correlation_id)
    if flexible:
        w.buf.append(0)
    schema.encode(w, body, api_version)
    return _sized_parts(w)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: Any) -> bytes:
    """Encode a response body with its header and size prefix."""
    return b"".join(encode_response_parts(api_key, api_version, correlation_id, body))


def encode_request(api_key: int, api_version: int, correlation_id: int, body: Any,
                   client_id: str | None = "stratalog") -> bytes:
    """Encode a request with header and size prefix (for tests and tools that act as clients)."""
    schema = request_schema(api_key)
    w = Writer()
    w.int32(0)
    header = Message(request_api_key=api_key, request_api_version=api_version,
                     correlation_id=correlation_id, client_id=client_id)
    REQUEST_HEADER.encode(w, header, 2 if schema.flexible(api_version) else 1)
    schema.encode(w, body, api_version)
    return b"".join(_sized_parts(w))


def decode_response(api_key: int, api_version: int, frame: bytes) -> tuple[int, Message]:
    """Decode a response frame (without size prefix): (correlation id, body)."""
    schema = response_schema(api_key)
    flexible = schema.flexible(api_version) and api_key != ApiKey.API_VERSIONS
    reader = Reader(frame)
    header = RESPONSE_HEADER.decode(reader, 1 if flexible else 0)
    return header.correlation_id, schema.decode(reader, api_version)
