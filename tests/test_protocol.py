"""Byte-exact tests of the sans-IO Kafka codec (gateway/protocol).

Layouts written out by hand pin the wire format; generic round trips cover every version
of every schema in the catalog; frames captured from real clients (tools/capture_frames.py)
must decode and re-encode to the same bytes; truncated, padded and hostile input must give
`DecodeError` and nothing else.
"""

from __future__ import annotations

import itertools
import re
import time
import tracemalloc
import uuid
from pathlib import Path

import pytest

from stratalog.gateway.protocol import catalog
from stratalog.gateway.protocol.catalog import APIS, REQUEST_HEADER, RESPONSE_HEADER, ApiKey
from stratalog.gateway.protocol.frames import (
    UnknownApi,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from stratalog.gateway.protocol.encoding import Unusual
from stratalog.gateway.protocol.schema import (EncodeError, Field, Message, Schema, _fast_struct_encoder,
                                              _struct_encoder)
from stratalog.gateway.protocol.wire import DecodeError, Reader, Writer, encode_uvarint, encode_varint

pytestmark = pytest.mark.unit

FIXTURES = Path(__file__).parent / "fixtures" / "frames"
ALL_VERSIONS = {key: (req.vmin, req.vmax) for key, (_, req, _resp) in APIS.items()}
ZERO_UUID = uuid.UUID(int=0)

SCHEMAS: list[tuple[str, Schema]] = [
    ("RequestHeader", REQUEST_HEADER),
    ("ResponseHeader", RESPONSE_HEADER),
    ("ConsumerProtocolSubscription", catalog.CONSUMER_PROTOCOL_SUBSCRIPTION),
    ("ConsumerProtocolAssignment", catalog.CONSUMER_PROTOCOL_ASSIGNMENT),
] + [
    (f"{name}{kind}", schema)
    for name, req, resp in APIS.values()
    for kind, schema in (("Request", req), ("Response", resp))
]


def h(text: str) -> bytes:
    """Hex with spaces and '|' separators for readability."""
    return bytes.fromhex(text.replace("|", ""))


def write(method: str, *args) -> bytes:
    w = Writer()
    getattr(w, method)(*args)
    return w.getvalue()


def read_all(data: bytes, method: str, *args):
    r = Reader(data)
    value = getattr(r, method)(*args)
    assert r.remaining() == 0, "reader left bytes behind"
    return value


# ---- primitives -------------------------------------------------------------------------

UVARINTS = [
    (0, "00"), (1, "01"), (127, "7f"), (128, "80 01"), (300, "ac 02"), (16383, "ff 7f"),
    (16384, "80 80 01"), (2**31 - 1, "ff ff ff ff 07"), (2**32 - 1, "ff ff ff ff 0f"),
    (2**63 - 1, "ff ff ff ff ff ff ff ff 7f"), (2**64 - 1, "ff ff ff ff ff ff ff ff ff 01"),
]

VARINTS = [
    (0, "00"), (-1, "01"), (1, "02"), (-2, "03"), (63, "7e"), (-64, "7f"), (64, "80 01"),
    (-65, "81 01"), (2**31 - 1, "fe ff ff ff 0f"), (-(2**31), "ff ff ff ff 0f"),
    (2**63 - 1, "fe ff ff ff ff ff ff ff ff 01"), (-(2**63), "ff ff ff ff ff ff ff ff ff 01"),
]


@pytest.mark.parametrize("value,hexed", UVARINTS)
def test_uvarint(value, hexed):
    assert encode_uvarint(value) == h(hexed)
    assert write("uvarint", value) == h(hexed)
    assert read_all(h(hexed), "uvarint") == value


@pytest.mark.parametrize("value,hexed", VARINTS)
def test_varint_zigzag(value, hexed):
    assert encode_varint(value) == h(hexed)
    assert write("varint", value) == h(hexed)
    assert read_all(h(hexed), "varint") == value


def test_negative_uvarint_is_written_as_its_64_bit_pattern():
    assert encode_uvarint(-1) == h("ff ff ff ff ff ff ff ff ff 01")


def test_non_canonical_uvarint_is_accepted():
    # Kafka's readers accept redundant continuation bytes; so do we.
    assert read_all(h("80 80 00"), "uvarint") == 0


@pytest.mark.parametrize("hexed", [
    "ff ff ff ff ff ff ff ff ff 02",     # tenth byte carries bits beyond 64
    "ff ff ff ff ff ff ff ff ff 81 00",  # eleven bytes
    "80", "ff ff", "",                    # continuation promised, no byte follows
])
def test_bad_uvarint(hexed):
    with pytest.raises(DecodeError):
        Reader(h(hexed)).uvarint()
    with pytest.raises(DecodeError):
        Reader(h(hexed)).varint()


FIXED = [
    ("int8", -128, "80"), ("int8", 127, "7f"),
    ("int16", -2, "ff fe"), ("int16", 0x1234, "12 34"),
    ("uint16", 65535, "ff ff"),
    ("int32", -(2**31), "80 00 00 00"), ("int32", 2**31 - 1, "7f ff ff ff"),
    ("uint32", 2**32 - 1, "ff ff ff ff"),
    ("int64", -(2**63), "80 00 00 00 00 00 00 00"), ("int64", 1, "00 00 00 00 00 00 00 01"),
    ("float64", 1.5, "3f f8 00 00 00 00 00 00"),
    ("bool", True, "01"), ("bool", False, "00"),
]


@pytest.mark.parametrize("method,value,hexed", FIXED)
def test_fixed_width(method, value, hexed):
    assert write(method, value) == h(hexed)
    assert read_all(h(hexed), method) == value
    with pytest.raises(DecodeError):
        getattr(Reader(h(hexed)[:-1]), method)()


def test_bool_reads_any_nonzero_as_true():
    assert read_all(b"\x02", "bool") is True


def test_uuid():
    u = uuid.UUID("0123456789abcdef0123456789abcdef")
    assert write("uuid", u) == u.bytes
    assert write("uuid", None) == bytes(16)
    assert read_all(u.bytes, "uuid") == u
    with pytest.raises(DecodeError):
        Reader(u.bytes[:15]).uuid()
    with pytest.raises(ValueError):
        write("uuid", b"short")


def test_strings_classic_and_compact():
    assert write("string", "ab") == h("00 02 61 62")
    assert write("string", "") == h("00 00")
    assert write("string", None) == h("ff ff")
    assert write("string", "é") == h("00 02 c3 a9")  # length counts UTF-8 bytes
    assert write("compact_string", "ab") == h("03 61 62")
    assert write("compact_string", "") == h("01")
    assert write("compact_string", None) == h("00")
    assert read_all(h("00 02 61 62"), "string") == "ab"
    assert read_all(h("ff ff"), "string", True) is None
    assert read_all(h("03 61 62"), "compact_string") == "ab"
    assert read_all(h("00"), "compact_string", True) is None
    assert read_all(h("00 02 c3 a9"), "string") == "é"


def test_bytes_classic_and_compact():
    assert write("bytes", b"\x00\x01") == h("00 00 00 02 00 01")
    assert write("bytes", None) == h("ff ff ff ff")
    assert write("compact_bytes", b"\x00\x01") == h("03 00 01")
    assert write("compact_bytes", None) == h("00")
    assert read_all(h("00 00 00 02 00 01"), "bytes") == b"\x00\x01"
    assert read_all(h("ff ff ff ff"), "bytes", True) is None
    assert read_all(h("03 00 01"), "compact_bytes") == b"\x00\x01"
    assert read_all(h("00"), "compact_bytes", True) is None


def test_records_stay_a_view_of_the_buffer():
    data = h("00 00 00 03 61 62 63")
    view = read_all(data, "records", False)
    assert isinstance(view, memoryview) and view == b"abc"
    assert read_all(h("04 61 62 63"), "records", True) == b"abc"
    assert read_all(h("ff ff ff ff"), "records", False) is None
    assert read_all(h("00"), "records", True) is None


@pytest.mark.parametrize("method,hexed", [
    ("string", "ff ff"), ("compact_string", "00"),
    ("bytes", "ff ff ff ff"), ("compact_bytes", "00"),
])
def test_null_where_not_nullable(method, hexed):
    with pytest.raises(DecodeError, match="invalid length"):
        getattr(Reader(h(hexed)), method)(False)


@pytest.mark.parametrize("method,hexed", [
    ("string", "ff fe"), ("bytes", "ff ff ff fe"), ("records", "ff ff ff fe"),
])
def test_negative_lengths_other_than_null(method, hexed):
    args = (False,) if method == "records" else (True,)
    with pytest.raises(DecodeError):
        getattr(Reader(h(hexed)), method)(*args)


def test_invalid_utf8_is_a_decode_error():
    with pytest.raises(DecodeError, match="UTF-8"):
        Reader(h("00 02 c3 28")).string()
    with pytest.raises(DecodeError, match="UTF-8"):
        Reader(h("02 ff")).compact_string()


def test_array_lengths():
    assert write("array_length", 2, False) == h("00 00 00 02")
    assert write("array_length", None, False) == h("ff ff ff ff")
    assert write("array_length", 2, True) == h("03")
    assert write("array_length", None, True) == h("00")
    assert Reader(h("00 00 00 00")).array_length(False) == 0
    assert Reader(h("ff ff ff ff")).array_length(False, True) is None
    assert Reader(h("00")).array_length(True, True) is None
    with pytest.raises(DecodeError):
        Reader(h("ff ff ff ff")).array_length(False, False)
    with pytest.raises(DecodeError):
        Reader(h("00")).array_length(True, False)


def test_reader_respects_its_end():
    r = Reader(h("00 01 00 02"), 0, 2)
    assert r.int16() == 1
    with pytest.raises(DecodeError):
        r.int16()


# ---- hand-computed message layouts ---------------------------------------------------------

def test_api_versions_request_v0_frame():
    frame = encode_request(18, 0, 7, {}, client_id="cli")
    assert frame == h("00 00 00 0d | 00 12 | 00 00 | 00 00 00 07 | 00 03 63 6c 69")


def test_api_versions_request_v3_frame():
    body = {"client_software_name": "rdkafka", "client_software_version": "2.1"}
    frame = encode_request(18, 3, 7, body, client_id="cli")
    assert frame == h(
        "00 00 00 1b | 00 12 00 03 00 00 00 07 | 00 03 63 6c 69 | 00"  # header v2
        "| 08 72 64 6b 61 66 6b 61 | 04 32 2e 31 | 00")
    req = decode_request(frame[4:], ALL_VERSIONS)
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (18, 3, 7, "cli")
    assert req.api_name == "ApiVersions"
    assert req.body == Message(**body)


def test_metadata_request_v1_null_topics_vs_v0():
    md = catalog.METADATA_REQUEST
    assert md.to_bytes({"topics": None}, 1) == h("ff ff ff ff")
    assert md.from_bytes(h("ff ff ff ff"), 1).topics is None
    assert md.to_bytes({"topics": []}, 1) == h("00 00 00 00")
    # v0 has no null: its "all topics" is the empty array, and None is refused.
    assert md.to_bytes({"topics": []}, 0) == h("00 00 00 00")
    with pytest.raises(EncodeError, match=r"MetadataRequest v0 at topics: None"):
        md.to_bytes({"topics": None}, 0)
    with pytest.raises(DecodeError):
        md.from_bytes(h("ff ff ff ff"), 0)
    assert md.to_bytes({"topics": None, "allow_auto_topic_creation": False}, 4) == h(
        "ff ff ff ff | 00")


def test_metadata_request_v9_compact_with_tagged_buffers():
    md = catalog.METADATA_REQUEST
    one = {"topics": [{"name": "t"}]}
    # topics[1] | name "t" | element tags | allow_auto | include_cluster | include_topic | tags
    assert md.to_bytes(one, 9) == h("02 | 02 74 | 00 | 01 | 00 | 00 | 00")
    assert md.to_bytes({"topics": None}, 9) == h("00 | 01 | 00 | 00 | 00")
    assert md.from_bytes(h("00 01 00 00 00"), 9).topics is None
    # v10 adds a topic id before the (now nullable) name; v11 drops include_cluster.
    tid = uuid.UUID(int=1)
    assert md.to_bytes({"topics": [{"topic_id": tid, "name": None}]}, 11) == h(
        "02 |" + tid.bytes.hex() + "| 00 | 00 | 01 | 00 | 00")
    decoded = md.from_bytes(md.to_bytes(one, 9), 9)
    assert decoded.topics[0].topic_id is None  # absent before v10: the default
    assert decoded.include_topic_authorized_operations is False


def test_produce_request_records_classic_and_flexible():
    body = {"transactional_id": None, "acks": -1, "timeout_ms": 1000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": b"abc"}]}]}
    pr = catalog.PRODUCE_REQUEST
    assert pr.to_bytes(body, 3) == h(
        "ff ff | ff ff | 00 00 03 e8 | 00 00 00 01 | 00 01 74 | 00 00 00 01 | 00 00 00 00"
        "| 00 00 00 03 61 62 63")
    assert pr.to_bytes(body, 9) == h(
        "00 | ff ff | 00 00 03 e8 | 02 | 02 74 | 02 | 00 00 00 00 | 04 61 62 63 | 00 | 00 | 00")
    assert pr.to_bytes(body, 2) == pr.to_bytes(body, 3)[2:]  # v0-2: no transactional id
    assert pr.from_bytes(pr.to_bytes(body, 9), 9).topic_data[0].partition_data[0].records == b"abc"


PRODUCE_V10_PARTITION = (
    "00 00 00 00 | 00 06 | ff ff ff ff ff ff ff ff | ff ff ff ff ff ff ff ff"
    "| ff ff ff ff ff ff ff ff | 01 | 00")  # index, error, offsets, record_errors, error_message


def test_produce_response_v10_tagged_current_leader():
    body = {"responses": [{"name": "t", "partition_responses": [{
        "index": 0, "error_code": 6, "base_offset": -1,
        "current_leader": {"leader_id": 2, "leader_epoch": 5}}]}]}
    data = catalog.PRODUCE_RESPONSE.to_bytes(body, 10)
    assert data == h(
        "02 | 02 74 | 02 |" + PRODUCE_V10_PARTITION
        + "| 01 | 00 | 09 | 00 00 00 02 | 00 00 00 05 | 00"  # 1 tag: #0, 9 bytes, struct + tags
        "| 00 | 00 00 00 00 | 00")  # topic tags, throttle, top-level tags
    back = catalog.PRODUCE_RESPONSE.from_bytes(data, 10)
    leader = back.responses[0].partition_responses[0].current_leader
    assert (leader.leader_id, leader.leader_epoch) == (2, 5)


def test_produce_response_tagged_field_left_out_at_default_and_before_v10():
    body = {"responses": [{"name": "t", "partition_responses": [{
        "index": 0, "error_code": 6, "base_offset": -1}]}]}
    assert catalog.PRODUCE_RESPONSE.to_bytes(body, 10) == h(
        "02 | 02 74 | 02 |" + PRODUCE_V10_PARTITION + "| 00 | 00 | 00 00 00 00 | 00")
    body["responses"][0]["partition_responses"][0]["current_leader"] = {
        "leader_id": 2, "leader_epoch": 5}
    assert catalog.PRODUCE_RESPONSE.to_bytes(body, 9) == h(
        "02 | 02 74 | 02 |" + PRODUCE_V10_PARTITION + "| 00 | 00 | 00 00 00 00 | 00")
    back = catalog.PRODUCE_RESPONSE.from_bytes(catalog.PRODUCE_RESPONSE.to_bytes(body, 9), 9)
    assert back.responses[0].partition_responses[0].current_leader == Message(
        leader_id=-1, leader_epoch=-1)


def test_produce_response_v10_top_level_tagged_node_endpoints():
    body = {"responses": [], "throttle_time_ms": 1,
            "node_endpoints": [{"node_id": 3, "host": "h", "port": 9092, "rack": None}]}
    assert catalog.PRODUCE_RESPONSE.to_bytes(body, 10) == h(
        "01 | 00 00 00 01 | 01 | 00 | 0d | 02 | 00 00 00 03 | 02 68 | 00 00 23 84 | 00 | 00")


def test_fetch_response_v12_diverging_epoch():
    part = {"partition_index": 1, "high_watermark": 10, "records": None,
            "diverging_epoch": {"epoch": 4, "end_offset": 7}}
    body = {"responses": [{"topic": "t", "partitions": [part]}]}
    data = catalog.FETCH_RESPONSE.to_bytes(body, 12)
    assert data == h(
        "00 00 00 00 | 00 00 | 00 00 00 00"                  # throttle, error, session
        "| 02 | 02 74 | 02"                                   # responses[1] topic, partitions[1]
        "| 00 00 00 01 | 00 00 | 00 00 00 00 00 00 00 0a"    # index, error, high watermark
        "| ff ff ff ff ff ff ff ff | ff ff ff ff ff ff ff ff"  # last stable, log start
        "| 01 | ff ff ff ff | 00"                             # aborted [], preferred, records null
        "| 01 | 00 | 0d | 00 00 00 04 | 00 00 00 00 00 00 00 07 | 00"  # tag 0: diverging_epoch
        "| 00 | 00")                                          # topic tags, top-level tags
    back = catalog.FETCH_RESPONSE.from_bytes(data, 12)
    p = back.responses[0].partitions[0]
    assert (p.diverging_epoch.epoch, p.diverging_epoch.end_offset) == (4, 7)
    assert p.current_leader == Message(leader_id=-1, leader_epoch=-1)


# ---- headers ------------------------------------------------------------------------------

def test_request_header_v1_vs_v2():
    v8 = encode_request(3, 8, 1, {"topics": None}, client_id="c")
    v9 = encode_request(3, 9, 1, {"topics": None}, client_id="c")
    assert v8[4:15] == h("00 03 | 00 08 | 00 00 00 01 | 00 01 63")
    # v2 keeps client_id a classic string and appends an empty tagged-field buffer.
    assert v9[4:16] == h("00 03 | 00 09 | 00 00 00 01 | 00 01 63 | 00")
    assert encode_request(3, 8, 1, {}, client_id=None)[12:14] == h("ff ff")
    anonymous = encode_request(3, 9, 1, {}, client_id=None)[4:]
    assert decode_request(anonymous, ALL_VERSIONS).client_id is None


def test_response_header_v0_vs_v1():
    v8 = encode_response(3, 8, 42, {"brokers": [], "topics": []})
    v9 = encode_response(3, 9, 42, {"brokers": [], "topics": []})
    assert v8[4:8] == h("00 00 00 2a") and v8[8:12] == h("00 00 00 00")  # throttle follows
    assert v9[4:9] == h("00 00 00 2a | 00")
    assert int.from_bytes(v9[:4], "big") == len(v9) - 4
    assert decode_response(3, 9, v9[4:])[0] == 42


def test_api_versions_response_always_header_v0():
    body = {"api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]}
    frame = encode_response(18, 3, 42, body)
    assert frame == h(
        "00 00 00 13 | 00 00 00 2a | 00 00 | 02 | 00 12 00 00 00 04 | 00 | 00 00 00 00 | 00")
    cid, back = decode_response(18, 3, frame[4:])
    assert cid == 42 and back.api_keys[0] == Message(api_key=18, min_version=0, max_version=4)


def test_request_header_tagged_fields_are_skipped():
    frame = bytearray(encode_request(18, 3, 5, {"client_software_name": "x"}, client_id="c")[4:])
    assert frame[11] == 0  # header tag buffer after "c"
    frame[11:12] = h("01 | 07 | 02 | aa bb")
    req = decode_request(bytes(frame), ALL_VERSIONS)
    assert req.client_id == "c" and req.body.client_software_name == "x"


# ---- decode_request: what we speak and what we do not ----------------------------------------

def test_unknown_api_key():
    frame = h("00 63 | 00 00 | 00 00 00 09 | 00 00")
    with pytest.raises(UnknownApi) as e:
        decode_request(frame, ALL_VERSIONS)
    assert (e.value.api_key, e.value.api_version, e.value.correlation_id) == (99, 0, 9)
    assert isinstance(e.value, DecodeError)


def test_api_not_in_supported_set():
    frame = encode_request(0, 3, 1, {})[4:]
    with pytest.raises(UnknownApi):
        decode_request(frame, {18: (0, 3)})
    with pytest.raises(UnknownApi):  # supported but not in the catalog
        decode_request(h("00 63 00 00 00 00 00 01 00 00"), {99: (0, 0)})


def test_version_outside_supported_range():
    supported = {3: (1, 9)}
    for version in (0, 10, 12):
        with pytest.raises(UnknownApi) as e:
            decode_request(encode_request(3, version, 4, {})[4:], supported)
        assert e.value.api_version == version and e.value.correlation_id == 4


def test_version_beyond_schema_is_unknown_even_if_claimed():
    frame = h("00 03 | 00 63 | 00 00 00 02 | 00 00 | 00")
    with pytest.raises(UnknownApi):
        decode_request(frame, {3: (0, 200)})


def test_out_of_range_api_versions_decodes_with_empty_body():
    frame = h("00 12 | 00 63 | 00 00 00 0b | 00 03 63 6c 69 | 00 | 05 66 75 74 75 72 65 ff")
    req = decode_request(frame, {18: (0, 3)})
    assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (18, 99, 11, "cli")
    assert vars(req.body) == {}


def test_frame_shorter_than_header():
    for n in range(8):
        with pytest.raises(DecodeError) as e:
            decode_request(bytes(n), ALL_VERSIONS)
        assert not isinstance(e.value, UnknownApi)


def test_decode_request_tolerates_trailing_bytes():
    frame = encode_request(3, 12, 1, {"topics": [{"name": "t"}]})[4:]
    req = decode_request(frame + b"\xde\xad\xbe\xef", ALL_VERSIONS)
    assert req.body.topics[0].name == "t"


def test_schema_from_bytes_rejects_trailing_bytes():
    data = catalog.METADATA_REQUEST.to_bytes({"topics": None}, 1)
    with pytest.raises(DecodeError, match="trailing"):
        catalog.METADATA_REQUEST.from_bytes(data + b"\x00", 1)


# ---- tagged fields and hostile lengths ------------------------------------------------------

def test_unknown_tagged_fields_are_skipped_at_every_level():
    md = catalog.METADATA_REQUEST
    expected = md.from_bytes(h("02 | 02 74 | 00 | 01 | 00 | 00 | 00"), 9)
    with_unknown = h(
        "02 | 02 74 | 02 | 05 03 61 62 63 | 09 00"  # two unknown tags in the topic struct
        "| 01 | 00 | 00 | 01 | 7f 01 ff")           # one at the top level
    assert md.from_bytes(with_unknown, 9) == expected


def test_known_and_unknown_tags_mixed():
    pr = catalog.PRODUCE_RESPONSE
    data = h("01 | 00 00 00 00 | 02 | 00 | 0d | 02 | 00 00 00 03 | 02 68 | 00 00 23 84 | 00 | 00"
             "| 05 | 01 | 00")
    back = pr.from_bytes(data, 10)
    assert back.node_endpoints == [Message(node_id=3, host="h", port=9092, rack=None)]


def test_tagged_fields_go_out_in_tag_order():
    body = {"zk_migration_ready": True, "finalized_features_epoch": 7,
            "supported_features": [{"name": "f", "min_version": 1, "max_version": 2}]}
    assert catalog.API_VERSIONS_RESPONSE.to_bytes(body, 3) == h(
        "00 00 | 01 | 00 00 00 00 | 03"            # error, api_keys [], throttle, 3 tags
        "| 00 08 | 02 | 02 66 | 00 01 | 00 02 | 00"  # 0: supported_features
        "| 01 08 | 00 00 00 00 00 00 00 07"         # 1: finalized_features_epoch
        "| 03 01 | 01")                             # 3: zk_migration_ready


@pytest.mark.parametrize("tags", [
    "01 | 00 | 09 | 00 00 00 02",  # tag 0 claims 9 bytes, 4 remain
    "01 | 00 | 02 | 02 00 | 00",   # tag 0 holds 2 bytes, its endpoint needs 12
    "02 | 05 00",                  # promises two tags, carries one
])
def test_bad_tagged_fields(tags):
    # ProduceResponse v10 with no topics: responses [], throttle, then the tag buffer.
    with pytest.raises(DecodeError):
        catalog.PRODUCE_RESPONSE.from_bytes(h("01 | 00 00 00 00 |" + tags), 10)


def test_array_longer_than_its_buffer_is_refused_up_front():
    with pytest.raises(DecodeError, match="2147483647 elements in 16 bytes"):
        Reader(h("7f ff ff ff") + bytes(16)).array_length(False)
    with pytest.raises(DecodeError, match="2147483647 elements in 16 bytes"):
        Reader(h("80 80 80 80 08") + bytes(16)).array_length(True)


@pytest.mark.parametrize("schema,version,data", [
    (catalog.METADATA_REQUEST, 1, h("7f ff ff ff") + bytes(16)),
    (catalog.METADATA_REQUEST, 9, h("80 80 80 80 08") + bytes(15)),              # 2^31 - 1
    (catalog.METADATA_REQUEST, 9, h("ff ff ff ff ff ff ff ff ff 01") + bytes(10)),
    (catalog.CREATE_TOPICS_REQUEST, 4, h("00 00 00 01 | 00 01 74 | 00 00 00 01 | 00 01"
                                         "| 7f ff ff ff") + bytes(3)),         # nested array
    (catalog.SASL_AUTHENTICATE_REQUEST, 0, h("7f ff ff ff") + bytes(16)),     # bytes length
    (catalog.SASL_HANDSHAKE_REQUEST, 0, h("7f ff") + bytes(18)),             # string length
    (catalog.SASL_AUTHENTICATE_REQUEST, 2, h("ff ff ff ff 0f") + bytes(15)),  # compact bytes
    (catalog.API_VERSIONS_REQUEST, 3, h("01 01 | ff ff ff ff 0f") + bytes(13)),  # tag count
    (catalog.API_VERSIONS_REQUEST, 3, h("01 01 | 01 00 | ff ff ff ff 0f") + bytes(11)),
])
def test_hostile_lengths_fail_fast_without_allocating(schema, version, data):
    assert len(data) == 20
    with pytest.raises(DecodeError):  # compiles the version's decoder: once, not per request
        schema.from_bytes(data, version)
    tracemalloc.start()
    started = time.perf_counter()
    try:
        with pytest.raises(DecodeError):
            schema.from_bytes(data, version)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - started < 0.5
    assert peak < 64 * 1024


# ---- every version of every schema round-trips --------------------------------------------

def sample_value(t: str, default, n: int):
    """A value of type t unlike the default, distinct per n so swapped fields show."""
    sign = -1 if n % 2 else 1
    if t == "int8":
        v = sign * (10 + n % 100)
    elif t == "int16":
        v = sign * (1000 + n)
    elif t == "uint16":
        v = 40000 + n
    elif t == "int32":
        v = sign * (100_000 + n)
    elif t == "uint32":
        v = 3_000_000_000 + n
    elif t == "int64":
        v = sign * (2**40 + n)
    elif t == "float64":
        return n + 0.25
    elif t == "bool":
        return not default
    elif t == "string":
        return f"s{n}-é"
    elif t in ("bytes", "records"):
        return bytes([n % 256, 0, 255])
    elif t == "uuid":
        return uuid.UUID(int=(n << 64) | n)
    else:
        raise AssertionError(t)
    return v + 1 if v == default else v


def build_sample(fields: tuple[Field, ...], counter=None) -> Message:
    """Every field of every version set to a non-default value; arrays of one element."""
    counter = counter or itertools.count(1)
    msg = Message()
    for f in fields:
        if f.type == "struct":
            v = build_sample(f.fields, counter)
        elif f.type == "[]struct":
            v = [build_sample(f.fields, counter)]
        elif f.type.startswith("[]"):
            v = [sample_value(f.type[2:], None, next(counter))]
        else:
            v = sample_value(f.type, f.default, next(counter))
        setattr(msg, f.name, v)
    return msg


def nulled(fields: tuple[Field, ...], msg: Message, version: int) -> Message:
    """The sample with every field that is nullable at this version set to null."""
    out = Message()
    for f in fields:
        v = getattr(msg, f.name)
        if f.is_nullable(version):
            v = None
        elif f.type == "struct":
            v = nulled(f.fields, v, version)
        elif f.type == "[]struct":
            v = [nulled(f.fields, e, version) for e in v]
        setattr(out, f.name, v)
    return out


def plain(v):
    """Messages as dicts and views as bytes, so decoded and expected compare."""
    if isinstance(v, Message):
        return {k: plain(x) for k, x in vars(v).items()}
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, memoryview):
        return bytes(v)
    return v


def on_wire(f: Field, version: int, flexible: bool) -> bool:
    return (flexible and f.is_tagged(version)) or (f.present(version) and f.tag is None)


_MISSING = object()


def expected(fields: tuple[Field, ...], msg, version: int, flexible: bool) -> dict:
    """What decoding `msg` encoded at `version` must give: sent fields, defaults elsewhere."""
    out = {}
    for f in fields:
        v = msg.get(f.name, _MISSING) if isinstance(msg, dict) else getattr(msg, f.name, _MISSING)
        if v is _MISSING:
            v = f.default_value()
        if not on_wire(f, version, flexible) or (f.is_tagged(version) and v == f.default_value()):
            out[f.name] = plain(f.default_value())
        elif v is None and not f.is_nullable(version):
            out[f.name] = null_stand_in(f, version, flexible)
        elif v is None:
            out[f.name] = None
        elif f.type == "struct":
            out[f.name] = expected(f.fields, v, version, flexible)
        elif f.type == "[]struct":
            out[f.name] = [expected(f.fields, e, version, flexible) for e in v]
        else:
            out[f.name] = plain(v)
    return out


def null_stand_in(f: Field, version: int, flexible: bool):
    """What a None goes out as where the version has no null."""
    if f.type == "uuid":
        return ZERO_UUID
    if f.type == "struct":
        return expected(f.fields, {}, version, flexible)
    if f.type.startswith("[]"):
        return []
    if f.default is not None:
        return f.default
    return "" if f.type == "string" else b""


def check_prefixes(decode, data: bytes) -> None:
    for k in range(len(data)):
        try:
            got = decode(data[:k])
        except DecodeError:
            continue
        pytest.fail(f"prefix of {k}/{len(data)} bytes decoded to {got!r}")


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_every_version_round_trips(name, schema):
    full = build_sample(schema.fields)
    for version in range(schema.vmin, schema.vmax + 1):
        flexible = schema.flexible(version)
        for msg in (full, nulled(schema.fields, full, version), Message()):
            data = schema.to_bytes(msg, version)
            back = schema.from_bytes(data, version)
            assert plain(back) == expected(schema.fields, msg, version, flexible), (name, version)
            assert schema.to_bytes(back, version) == data, (name, version)
        # Fed one byte at a time: nothing short of the whole message decodes.
        check_prefixes(lambda b: schema.from_bytes(b, version), schema.to_bytes(full, version))
        with pytest.raises(DecodeError):
            schema.from_bytes(schema.to_bytes(full, version) + b"\x00", version)


def without_tagged(fields: tuple[Field, ...], obj: dict, version: int, flexible: bool) -> dict:
    """`obj` (dicts) without the fields tagged at this version, at every depth: what most
    answers look like."""
    out = {}
    for f in fields:
        if f.name not in obj or (flexible and f.tag is not None and f.is_tagged(version)):
            continue
        v = obj[f.name]
        if f.type == "struct" and isinstance(v, dict):
            v = without_tagged(f.fields, v, version, flexible)
        elif f.type == "[]struct" and isinstance(v, list):
            v = [without_tagged(f.fields, e, version, flexible) for e in v]
        out[f.name] = v
    return out


@pytest.mark.parametrize("name,schema", SCHEMAS, ids=[n for n, _ in SCHEMAS])
def test_compiled_encoders_write_what_the_checked_ones_do(name, schema):
    """Handlers answer with dicts, which the compiled encoders write themselves: the same
    bytes as the checked encoder at every version, or `Unusual` for what they leave to it
    (then Schema.encode writes it checked). An answer without tagged fields is always
    written by the compiled encoder."""
    full = build_sample(schema.fields)
    for version in range(schema.vmin, schema.vmax + 1):
        flexible = schema.flexible(version)
        untagged = without_tagged(schema.fields, plain(full), version, flexible)
        for as_dicts in (plain(full), plain(nulled(schema.fields, full, version)), {}, untagged):
            fast, checked = Writer(), Writer()
            try:
                _fast_struct_encoder(schema.fields, version, flexible)(fast, as_dicts)
            except Unusual:
                assert as_dicts is not untagged, (name, version)
                continue
            _struct_encoder(schema.fields, version, flexible)(checked, as_dicts)
            assert fast.getvalue() == checked.getvalue(), (name, version)
            encoded = Writer()
            schema.encode(encoded, as_dicts, version)
            assert encoded.getvalue() == checked.getvalue(), (name, version)


def test_a_rewound_writer_drops_spilled_parts():
    w = Writer()
    w.int32(7)
    mark = w.mark()
    w.bytes(b"x" * (Writer.SPILL_BYTES + 1))
    w.int8(1)
    w.rewind(mark)
    w.int8(2)
    assert w.getvalue() == bytes([0, 0, 0, 7, 2])


@pytest.mark.parametrize("api_key", sorted(APIS), ids=[APIS[k][0] for k in sorted(APIS)])
def test_every_version_frames_round_trip(api_key):
    name, req_schema, resp_schema = APIS[api_key]
    req_body = build_sample(req_schema.fields)
    resp_body = build_sample(resp_schema.fields)
    for version in range(req_schema.vmin, req_schema.vmax + 1):
        frame = encode_request(api_key, version, 77, req_body, client_id="c")
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        req = decode_request(frame[4:], ALL_VERSIONS)
        assert (req.api_key, req.api_version, req.correlation_id, req.client_id) == (
            api_key, version, 77, "c")
        assert encode_request(api_key, version, 77, req.body, client_id="c") == frame
        check_prefixes(lambda b: decode_request(b, ALL_VERSIONS), frame[4:])
        assert decode_request(frame[4:] + b"\x00garbage", ALL_VERSIONS).body == req.body

        out = encode_response(api_key, version, 78, resp_body)
        cid, body = decode_response(api_key, version, out[4:])
        assert cid == 78
        assert encode_response(api_key, version, 78, body) == out, (name, version)


def test_api_keys_are_named_as_kafka_names_them():
    assert list(ApiKey) == sorted(APIS)
    for key, (name, _req, _resp) in APIS.items():
        assert type(key) is ApiKey
        assert key.name == re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).upper()
    assert (ApiKey.PRODUCE, ApiKey.LIST_OFFSETS, ApiKey.API_VERSIONS) == (0, 2, 18)


def test_decoded_requests_carry_their_api_key_by_name():
    req = decode_request(encode_request(3, 1, 7, {})[4:], ALL_VERSIONS)
    assert req.api_key is ApiKey.METADATA and req.api_name == "Metadata"


def test_absent_fields_decode_to_fresh_defaults():
    a = catalog.METADATA_REQUEST.from_bytes(h("ff ff ff ff"), 1)
    b = catalog.METADATA_REQUEST.from_bytes(h("ff ff ff ff"), 1)
    assert a.allow_auto_topic_creation is True  # v4+ field: its default
    c = catalog.PRODUCE_RESPONSE.from_bytes(h("00 00 00 00"), 0)
    assert c.throttle_time_ms == 0 and c.node_endpoints == []
    c.node_endpoints.append(1)
    assert catalog.PRODUCE_RESPONSE.from_bytes(h("00 00 00 00"), 0).node_endpoints == []
    assert a == b and a.get("missing", 5) == 5


def test_encoding_reads_messages_dicts_and_objects_alike():
    class Obj:
        group_id = "g"
        generation_id = 3
        member_id = "m"
    via_obj = catalog.HEARTBEAT_REQUEST.to_bytes(Obj(), 0)
    via_dict = catalog.HEARTBEAT_REQUEST.to_bytes(
        {"group_id": "g", "generation_id": 3, "member_id": "m"}, 0)
    assert via_obj == via_dict == h("00 01 67 | 00 00 00 03 | 00 01 6d")


@pytest.mark.parametrize("schema,version,body,path", [
    (catalog.CREATE_TOPICS_RESPONSE, 0, {"topics": [{"name": None}]}, "topics[0].name"),
    (catalog.CREATE_TOPICS_RESPONSE, 0, {"topics": [{"name": "t", "error_code": None}]},
     "topics[0].error_code"),
    (catalog.OFFSET_DELETE_REQUEST, 0, {"group_id": "g", "topics": [{"name": "t", "partitions": None}]},
     "topics[0].partitions"),
    (catalog.DESCRIBE_GROUPS_REQUEST, 0, {"groups": ["g", None]}, "groups[1]"),
    (catalog.DESCRIBE_GROUPS_REQUEST, 3, {"groups": [], "include_authorized_operations": None},
     "include_authorized_operations"),
    (catalog.PRODUCE_RESPONSE, 3, {"responses": [None]}, "responses[0]"),
    (catalog.PRODUCE_RESPONSE, 10, {"responses": [{"partition_responses": [
        {"current_leader": None}]}]}, "responses[0].partition_responses[0].current_leader"),
    (catalog.HEARTBEAT_RESPONSE, 0, None, ""),
])
def test_none_where_the_version_has_no_null_is_refused(schema, version, body, path):
    # A null on the wire where the version has none would be undecodable by the peer, and
    # writing the default instead would hide the handler's bug.
    with pytest.raises(EncodeError, match="None") as e:
        schema.to_bytes(body, version)
    assert e.value.path == path and (e.value.schema, e.value.version) == (schema.name, version)


def test_none_is_written_as_null_where_the_version_has_one():
    assert catalog.METADATA_REQUEST.to_bytes({"topics": None}, 9)[:1] == h("00")
    assert catalog.CREATE_TOPICS_RESPONSE.to_bytes(
        {"topics": [{"name": "t", "error_message": None}]}, 1) == h(
        "00 00 00 01 | 00 01 74 | 00 00 | ff ff")


def test_none_uuid_is_the_zero_uuid():
    # A uuid's default is null and it is never nullable: None is Kafka's "no id".
    body = {"topics": [{"name": "t", "topic_id": None}]}
    topic = catalog.METADATA_RESPONSE.from_bytes(catalog.METADATA_RESPONSE.to_bytes(body, 10), 10).topics[0]
    assert topic.topic_id == ZERO_UUID


@pytest.mark.parametrize("schema,version,body,path,key", [
    (catalog.PRODUCE_RESPONSE, 9, {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "eror_code": 1}]}]}, "responses[0].partition_responses[0]", "eror_code"),
    (catalog.HEARTBEAT_RESPONSE, 0, {"error_code": 0, "throttle_ms": 0}, "", "throttle_ms"),
    (catalog.FIND_COORDINATOR_RESPONSE, 6, Message(coordinators=[Message(key="g", nodeid=1)]),
     "coordinators[0]", "nodeid"),
])
def test_a_key_the_message_has_at_no_version_is_refused(schema, version, body, path, key):
    with pytest.raises(EncodeError, match=f"unknown key '{key}'") as e:
        schema.to_bytes(body, version)
    assert e.value.path == path
    assert str(e.value).startswith(f"{schema.name} v{version}")


def test_a_key_of_another_version_is_ignored():
    # throttle_time_ms is v1+, log_append_time_ms v2+, current_leader v10+ (tagged): one
    # handler body serves every version.
    body = {"responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 0, "base_offset": 5, "log_append_time_ms": -1,
         "current_leader": {"leader_id": 1, "leader_epoch": 2}}]}], "throttle_time_ms": 0}
    assert catalog.PRODUCE_RESPONSE.to_bytes(body, 0) == h(
        "00 00 00 01 | 00 01 74 | 00 00 00 01 | 00 00 00 00 | 00 00 | 00 00 00 00 00 00 00 05")


def test_a_struct_or_array_of_the_wrong_shape_is_refused():
    with pytest.raises(EncodeError, match="a dict where an array is expected") as e:
        catalog.PRODUCE_RESPONSE.to_bytes({"responses": {"name": "t"}}, 3)
    assert e.value.path == "responses"
    with pytest.raises(EncodeError, match="a str where a struct is expected") as e:
        catalog.PRODUCE_RESPONSE.to_bytes({"responses": ["t"]}, 3)
    assert e.value.path == "responses[0]"


def test_a_value_of_the_wrong_type_names_its_field():
    with pytest.raises(EncodeError, match=r"'x' is not a valid int32") as e:
        catalog.PRODUCE_RESPONSE.to_bytes(
            {"responses": [{"name": "t", "partition_responses": [{"index": "x"}]}]}, 3)
    assert e.value.path == "responses[0].partition_responses[0].index"
    with pytest.raises(EncodeError, match="not a valid int32") as e:
        catalog.JOIN_GROUP_REQUEST.to_bytes({"session_timeout_ms": 2**31}, 0)
    assert e.value.path == "session_timeout_ms"


# ---- frames captured from real clients ----------------------------------------------------

CAPTURE_CLIENT_ID = "stratalog-capture"  # tools/capture_frames.py's client.id
SOFTWARE_NAMES = {"confluent_kafka": "confluent-kafka-python", "kafka_python": "kafka-python"}
API_BY_SNAKE = {re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", n).lower(): k
                for k, (n, _r, _s) in APIS.items()}
FIXTURE_FILES = sorted(FIXTURES.glob("*/*.bin"))


def test_fixtures_cover_every_client():
    clients = {p.parent.name for p in FIXTURE_FILES}
    assert clients == {"confluent_kafka", "kafka_python", "aiokafka"}
    for client in clients:
        apis = {p.name.split("_request_")[0] for p in FIXTURE_FILES if p.parent.name == client}
        assert {"api_versions", "metadata", "produce", "find_coordinator", "join_group"} <= apis


@pytest.mark.parametrize("path", FIXTURE_FILES,
                         ids=[f"{p.parent.name}/{p.stem}" for p in FIXTURE_FILES])
def test_captured_frame(path):
    m = re.fullmatch(r"(?P<api>[a-z_]+)_request_v(?P<v>\d+)\.bin", path.name)
    assert m, path.name
    api_key, version = API_BY_SNAKE[m["api"]], int(m["v"])
    frame = path.read_bytes()
    req = decode_request(frame, ALL_VERSIONS)
    assert (req.api_key, req.api_version) == (api_key, version)
    assert req.client_id == CAPTURE_CLIENT_ID
    # Re-encoding the decoded request gives the client's bytes back, header and body.
    assert encode_request(api_key, version, req.correlation_id, req.body,
                          client_id=req.client_id)[4:] == frame
    check_prefixes(lambda b: decode_request(b, ALL_VERSIONS), frame)
    check_known_fields(path.parent.name, req)


def check_known_fields(client: str, req) -> None:
    body = req.body
    if req.api_key == 18 and req.api_version >= 3:
        assert body.client_software_name == SOFTWARE_NAMES[client]
        assert body.client_software_version
    elif req.api_key == 3:
        assert all(t.name == "capture" for t in body.topics or [])
    elif req.api_key == 0:
        assert [t.name for t in body.topic_data] == ["capture"]
        records = bytes(body.topic_data[0].partition_data[0].records)
        assert records[16] == 2  # record batch magic
        assert int.from_bytes(records[8:12], "big") == len(records) - 12  # batch length
        assert b"value" in records
    elif req.api_key == 10:
        assert "capture-group" in ([body.key] + body.coordinator_keys)
    elif req.api_key == 71:
        assert body.client_instance_id == uuid.UUID(int=0)  # a new client asks for an id
    elif req.api_key == 72:
        # librdkafka's own OTLP payload, zstd-compressed, decodes with the gateway's decoder.
        from stratalog.gateway.telemetry.payload import decode
        points = decode(body.compression_type, bytes(body.metrics), limit=1024 * 1024)
        assert body.compression_type == 4 and body.subscription_id == 1
        assert "org.apache.kafka.consumer.node.request.latency.avg" in {p.name for p in points}
    elif req.api_key == 11:
        assert (body.group_id, body.protocol_type) == ("capture-group", "consumer")
        for proto in body.protocols:
            r = Reader(proto.metadata)
            sub_version = r.int16()
            sub = catalog.CONSUMER_PROTOCOL_SUBSCRIPTION.decode(r, sub_version)
            assert r.remaining() == 0
            assert sub.topics == ["capture"]
            again = Writer()
            again.int16(sub_version)
            catalog.CONSUMER_PROTOCOL_SUBSCRIPTION.encode(again, sub, sub_version)
            assert again.getvalue() == proto.metadata
