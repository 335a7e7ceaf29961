"""The Avro partition manifest: exact encoding, round trips, corruption."""

from __future__ import annotations

import io
import json
import uuid

import crc32c
import fastavro
import pytest

from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.manifest import Manifest, SegmentRecord, read_manifest, write_manifest

pytestmark = pytest.mark.unit

TOPIC_ID = uuid.UUID("6f1c1c7e-2b7a-4c1e-9d3b-0a5e8c2f4b11")
SEGMENTS = [
    SegmentRecord(0, 99, "topics/orders-6f1c1c7e-2b7a-4c1e-9d3b-0a5e8c2f4b11/3/00000000000000000000-0-a1", 4096, 1000, 2000, 0),
    SegmentRecord(100, 250, "topics/orders-6f1c1c7e-2b7a-4c1e-9d3b-0a5e8c2f4b11/3/00000000000000000100-2-b2", 8192, -1, 2500, 2),
]


def zigzag(n: int) -> bytes:
    """Avro's variable-length zig-zag encoding of an int or long."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        byte = z & 0x7F
        z >>= 7
        if z:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def avro_string(s: str) -> bytes:
    raw = s.encode()
    return zigzag(len(raw)) + raw


def expected_record(topic, topic_id, partition, version, log_start, segments) -> bytes:
    out = avro_string(topic) + avro_string(str(topic_id)) + zigzag(partition) + zigzag(version) + zigzag(log_start)
    if segments:
        out += zigzag(len(segments))
        for s in segments:
            out += (zigzag(s.base_offset) + zigzag(s.last_offset) + avro_string(s.key_base) + zigzag(s.size)
                    + zigzag(s.min_timestamp) + zigzag(s.max_timestamp) + zigzag(s.leader_epoch))
    return out + b"\x00"  # end of the array


def test_round_trip():
    data = write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    assert read_manifest(data) == Manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    empty = write_manifest("orders", TOPIC_ID, 0, 0, 0, [])
    assert read_manifest(empty) == Manifest("orders", TOPIC_ID, 0, 0, 0, [])
    assert read_manifest(memoryview(data)) == read_manifest(bytearray(data))


def test_container_and_record_bytes_are_exact():
    data = write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    record = expected_record("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    assert data[:4] == b"Obj\x01"
    sync = data[-16:]
    # the file ends with one block: record count 1, byte length, the record, the sync marker
    assert data.endswith(zigzag(1) + zigzag(len(record)) + record + sync)
    assert data.count(sync) == 2  # once closing the header, once closing the block
    # equal input gives equal bytes, so snapshots can be compared and re-uploaded safely
    assert write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS) == data
    assert write_manifest("orders", TOPIC_ID, 3, 8, 50, SEGMENTS) != data


def test_readable_by_plain_avro_with_documented_schema():
    data = write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    reader = fastavro.reader(io.BytesIO(data))
    schema = json.loads(reader.metadata["avro.schema"])
    assert fastavro.parse_schema(schema)["name"] == "io.stratalog.manifest.PartitionManifest"
    assert [f["name"] for f in schema["fields"]] == ["topic", "topic_id", "partition", "version", "log_start_offset", "segments"]
    assert reader.metadata["avro.codec"] == "null"
    assert reader.metadata["stratalog.crc32c"] == str(crc32c.crc32c(expected_record("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)))
    (rec,) = list(reader)
    assert rec["topic"] == "orders" and str(rec["topic_id"]) == str(TOPIC_ID)
    assert [s["base_offset"] for s in rec["segments"]] == [0, 100]


def test_no_flipped_byte_yields_a_different_manifest():
    """Every single-byte flip is reported, or (doc text, unused padding) changes nothing."""
    data = write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    original = read_manifest(data)
    caught = 0
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x04
        try:
            assert read_manifest(bytes(bad)) == original
        except CorruptObject:
            caught += 1
    assert caught > len(data) * 0.8
    # every byte of the record itself is covered
    record = expected_record("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    start = len(data) - 16 - len(record)
    for i in range(start, start + len(record)):
        bad = bytearray(data)
        bad[i] ^= 0x04
        with pytest.raises(CorruptObject):
            read_manifest(bytes(bad))


def test_every_truncation_is_detected():
    data = write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS)
    for n in range(len(data)):
        with pytest.raises(CorruptObject):
            read_manifest(data[:n])


def test_foreign_avro_and_garbage_are_rejected():
    with pytest.raises(CorruptObject, match="not a readable Avro"):
        read_manifest(b"definitely not avro")
    with pytest.raises(CorruptObject):
        read_manifest(b"")
    other = io.BytesIO()
    fastavro.writer(other, {"type": "record", "name": "Other", "fields": [{"name": "x", "type": "int"}]}, [{"x": 1}])
    with pytest.raises(CorruptObject, match="Other"):
        read_manifest(other.getvalue())


def test_two_records_are_rejected():
    from stratalog.tiering.manifest import SCHEMA

    good = read_manifest(write_manifest("orders", TOPIC_ID, 3, 7, 50, SEGMENTS))
    rec = {
        "topic": good.topic, "topic_id": good.topic_id, "partition": 3, "version": 7,
        "log_start_offset": 50, "segments": [],
    }
    buf = io.BytesIO()
    fastavro.writer(buf, SCHEMA, [rec, rec], metadata={"stratalog.manifest.format": "1"})
    with pytest.raises(CorruptObject, match="2 records"):
        read_manifest(buf.getvalue())


def test_missing_crc_or_wrong_format_is_rejected():
    from stratalog.tiering.manifest import SCHEMA

    rec = {"topic": "t", "topic_id": TOPIC_ID, "partition": 0, "version": 1, "log_start_offset": 0, "segments": []}
    for metadata, message in (({}, "format"), ({"stratalog.manifest.format": "1"}, "CRC"),
                              ({"stratalog.manifest.format": "9"}, "format")):
        buf = io.BytesIO()
        fastavro.writer(buf, SCHEMA, [rec], metadata=metadata)
        with pytest.raises(CorruptObject, match=message):
            read_manifest(buf.getvalue())


@pytest.mark.parametrize(
    "segments",
    [
        [SEGMENTS[1], SEGMENTS[0]],  # unsorted
        [SEGMENTS[0], SegmentRecord(99, 120, "k", 1, 0, 0, 0)],  # overlaps
        [SegmentRecord(5, 4, "k", 1, 0, 0, 0)],  # last before base
        [SegmentRecord(-1, 4, "k", 1, 0, 0, 0)],
        [SegmentRecord(0, 4, "k", -1, 0, 0, 0)],
        [SegmentRecord(0, 4, "", 1, 0, 0, 0)],
        [SegmentRecord(0, 4, "k", 1, 0, 0, -1)],
    ],
)
def test_write_rejects_inconsistent_segments(segments):
    with pytest.raises(ValueError):
        write_manifest("orders", TOPIC_ID, 3, 7, 0, segments)


def test_write_rejects_bad_arguments():
    with pytest.raises(ValueError):
        write_manifest("orders", str(TOPIC_ID), 3, 7, 0, [])
    with pytest.raises(ValueError):
        write_manifest("", TOPIC_ID, 3, 7, 0, [])
    with pytest.raises(ValueError):
        write_manifest("orders", TOPIC_ID, -1, 7, 0, [])
    with pytest.raises(ValueError):
        write_manifest("orders", TOPIC_ID, 3, -7, 0, [])
