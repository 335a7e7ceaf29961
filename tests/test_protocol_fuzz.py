"""Property tests of the Kafka codec: generated messages round-trip byte for byte, and
random or mutated bytes give a `DecodeError` (or a message) and never another exception.

Strategies are built from the catalog's own field trees, so every API and version the
gateway speaks is covered without a hand-written generator per message.
"""

from __future__ import annotations

import pytest

import struct
import time
from functools import lru_cache

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stratalog.gateway.protocol import catalog
from stratalog.gateway.protocol.catalog import APIS, REQUEST_HEADER, RESPONSE_HEADER
from stratalog.gateway.protocol.frames import decode_request, encode_request
from stratalog.gateway.protocol.schema import Field, Message, Schema
from stratalog.gateway.protocol.wire import DecodeError, Reader

pytestmark = pytest.mark.unit

SCHEMAS: list[Schema] = [
    REQUEST_HEADER, RESPONSE_HEADER,
    catalog.CONSUMER_PROTOCOL_SUBSCRIPTION, catalog.CONSUMER_PROTOCOL_ASSIGNMENT,
] + [schema for _, req, resp in APIS.values() for schema in (req, resp)]
ALL_VERSIONS = {key: (req.vmin, req.vmax) for key, (_, req, _resp) in APIS.items()}
SLOW = 1.0  # seconds: no decode of a few hundred bytes comes near this

FUZZ = settings(deadline=None, max_examples=400,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

INT_RANGES = {
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1),
}


def primitive(t: str) -> st.SearchStrategy:
    if t in INT_RANGES:
        return st.integers(*INT_RANGES[t])
    if t == "float64":
        return st.floats(allow_nan=False)
    if t == "bool":
        return st.booleans()
    if t == "string":
        return st.text(st.characters(codec="utf-8"), max_size=12)
    if t in ("bytes", "records"):
        return st.binary(max_size=24)
    if t == "uuid":
        return st.uuids()
    raise AssertionError(t)


def on_wire(f: Field, version: int, flexible: bool) -> bool:
    return (flexible and f.is_tagged(version)) or (f.present(version) and f.tag is None)


def field_strategy(f: Field, version: int, flexible: bool) -> st.SearchStrategy:
    if f.type == "struct":
        s = message_strategy(f.fields, version, flexible)
    elif f.type == "[]struct":
        s = st.lists(message_strategy(f.fields, version, flexible), max_size=2)
    elif f.type.startswith("[]"):
        s = st.lists(primitive(f.type[2:]), max_size=3)
    else:
        s = primitive(f.type)
    return st.none() | s if f.is_nullable(version) else s


@lru_cache(maxsize=None)
def message_strategy(fields: tuple[Field, ...], version: int, flexible: bool) -> st.SearchStrategy:
    """Messages setting exactly the fields that are on the wire at this version."""
    parts = {f.name: field_strategy(f, version, flexible)
             for f in fields if on_wire(f, version, flexible)}
    return st.fixed_dictionaries(parts).map(lambda d: Message(**d))


@st.composite
def schema_version(draw, schemas=tuple(SCHEMAS)):
    schema = draw(st.sampled_from(schemas))
    return schema, draw(st.integers(schema.vmin, schema.vmax))


def plain(v):
    if isinstance(v, Message):
        return {k: plain(x) for k, x in vars(v).items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def assert_decoded(fields, back: Message, sent: Message, version: int, flexible: bool) -> None:
    """Sent fields come back as sent; fields not on the wire come back as defaults."""
    for f in fields:
        got = getattr(back, f.name)
        if not on_wire(f, version, flexible):
            assert plain(got) == plain(f.default_value()), f.name
        elif f.type == "struct" and got is not None:
            assert_decoded(f.fields, got, getattr(sent, f.name), version, flexible)
        elif f.type == "[]struct" and got is not None:
            want = getattr(sent, f.name)
            assert len(got) == len(want), f.name
            for g, w in zip(got, want):
                assert_decoded(f.fields, g, w, version, flexible)
        else:
            assert plain(got) == plain(getattr(sent, f.name)), f.name


# Bytes a decoder meets at its edges: zero, small lengths, nulls, varint continuations.
EDGE_BYTES = st.lists(st.sampled_from([0, 1, 2, 3, 0x7F, 0x80, 0xFF]) | st.integers(0, 255),
                      max_size=300).map(bytes)


def decode_or_refuse(fn, *args):
    """Run a decoder: it may refuse with DecodeError, but anything else is a bug."""
    started = time.perf_counter()
    try:
        return fn(*args)
    except DecodeError:
        return None
    finally:
        assert time.perf_counter() - started < SLOW


# ---- (a) generated messages round-trip byte for byte ---------------------------------------

@FUZZ
@given(data=st.data())
def test_generated_messages_round_trip(data):
    schema, version = data.draw(schema_version())
    flexible = schema.flexible(version)
    msg = data.draw(message_strategy(schema.fields, version, flexible))
    encoded = schema.to_bytes(msg, version)
    back = schema.from_bytes(encoded, version)
    assert schema.to_bytes(back, version) == encoded
    assert_decoded(schema.fields, back, msg, version, flexible)


@FUZZ
@given(data=st.data())
def test_generated_requests_round_trip_as_frames(data):
    api_key = data.draw(st.sampled_from(sorted(APIS)))
    schema = APIS[api_key][1]
    version = data.draw(st.integers(schema.vmin, schema.vmax))
    body = data.draw(message_strategy(schema.fields, version, schema.flexible(version)))
    correlation_id = data.draw(st.integers(*INT_RANGES["int32"]))
    client_id = data.draw(st.none() | primitive("string"))
    frame = encode_request(api_key, version, correlation_id, body, client_id=client_id)
    req = decode_request(frame[4:], ALL_VERSIONS)
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (
        api_key, version, correlation_id, client_id)
    assert encode_request(api_key, version, correlation_id, req.body, client_id=client_id) == frame


# ---- (b) random bytes are refused cleanly ----------------------------------------------------

@FUZZ
@given(frame=st.binary(max_size=64))
def test_random_frames(frame):
    decode_or_refuse(decode_request, frame, ALL_VERSIONS)


@FUZZ
@given(api_key=st.sampled_from(sorted(APIS)), version=st.integers(-1, 20),
       correlation_id=st.integers(*INT_RANGES["int32"]), rest=EDGE_BYTES)
def test_random_bodies_behind_a_valid_header_start(api_key, version, correlation_id, rest):
    frame = struct.pack(">hhi", api_key, version, correlation_id) + rest
    decode_or_refuse(decode_request, frame, ALL_VERSIONS)


@FUZZ
@given(sv=schema_version(), data=EDGE_BYTES)
def test_random_bytes_to_each_schema(sv, data):
    schema, version = sv
    decode_or_refuse(schema.from_bytes, data, version)
    decode_or_refuse(schema.decode, Reader(data), version)


# ---- (c) mutated valid requests are refused or decode to a message -------------------------

def mutate(draw, data: bytes) -> bytes:
    """One to four flips, insertions, deletions or truncations."""
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(buf)))
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip" and i < len(buf):
            buf[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=6))
        elif op == "delete":
            del buf[i:i + draw(st.integers(1, 6))]
        else:
            del buf[i:]
    return bytes(buf)


@st.composite
def mutated_frame(draw):
    api_key = draw(st.sampled_from(sorted(APIS)))
    schema = APIS[api_key][1]
    version = draw(st.integers(schema.vmin, schema.vmax))
    body = draw(message_strategy(schema.fields, version, schema.flexible(version)))
    return mutate(draw, encode_request(api_key, version, 1, body)[4:])


@st.composite
def mutated_body(draw):
    # Responses are here too: they carry most of the tagged fields.
    schema, version = draw(schema_version())
    msg = draw(message_strategy(schema.fields, version, schema.flexible(version)))
    return schema, version, mutate(draw, schema.to_bytes(msg, version))


@FUZZ
@given(frame=mutated_frame())
def test_mutated_requests(frame):
    req = decode_or_refuse(decode_request, frame, ALL_VERSIONS)
    if req is None:
        return
    # Whatever decoded is a well-formed message: it encodes, and decodes to itself.
    again = encode_request(req.api_key, req.api_version, req.correlation_id, req.body,
                           client_id=req.client_id)
    assert decode_request(again[4:], ALL_VERSIONS).body == req.body


@FUZZ
@given(case=mutated_body())
def test_mutated_bodies(case):
    schema, version, data = case
    msg = decode_or_refuse(schema.from_bytes, data, version)
    if msg is None:
        return
    assert schema.from_bytes(schema.to_bytes(msg, version), version) == msg
