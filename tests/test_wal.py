"""The WAL object format: byte-exact layout, round trips, partial reads, corruption."""

from __future__ import annotations

import uuid

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stratalog.tiering.errors import CorruptObject
from stratalog.tiering.wal import (
    ENTRY_SIZE,
    HEADER_SIZE,
    TRAILER_SIZE,
    WalBuilder,
    WalRangeInfo,
    footer_size,
    object_size,
    range_bytes,
    read_footer,
    read_wal,
)

pytestmark = pytest.mark.unit

T1 = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
T2 = uuid.UUID("ffeeddcc-bbaa-9988-7766-554433221100")


def sample() -> tuple[bytes, list[WalRangeInfo]]:
    b = WalBuilder()
    b.add(T1, 2, 10, 11, 1000, b"AB")
    b.add(T2, 0, 0, 2, 2000, b"xyz")
    b.add(T1, 2, 12, 14, 999, b"C")  # joins T1/2's range, after "AB"
    return b.build()


def test_crc32c_is_castagnoli():
    assert crc32c.crc32c(b"123456789") == 0xE3069283


def test_layout_is_byte_exact():
    data, infos = sample()
    crc_abc, crc_xyz = crc32c.crc32c(b"ABC"), crc32c.crc32c(b"xyz")
    footer = bytes.fromhex(
        "00112233445566778899aabbccddeeff" "00000002" "000000000000000a" "000000000000000e"
        "00000000000003e8" "0000000000000008" "0000000000000003" f"{crc_abc:08x}"
        "ffeeddccbbaa99887766554433221100" "00000000" "0000000000000000" "0000000000000002"
        "00000000000007d0" "000000000000000b" "0000000000000003" f"{crc_xyz:08x}"
    )
    covered = bytes.fromhex("000000000000000e" "00000002")
    footer_crc = crc32c.crc32c(footer + covered)
    expected = (
        bytes.fromhex("534c574c" "0001" "0000")
        + b"ABCxyz"
        + footer
        + covered
        + bytes.fromhex(f"{footer_crc:08x}" "0001" "0000" "534c574c")
    )
    assert data == expected
    assert infos == [
        WalRangeInfo(T1, 2, 10, 14, 1000, 8, 3, crc_abc),
        WalRangeInfo(T2, 0, 0, 2, 2000, 11, 3, crc_xyz),
    ]
    assert (HEADER_SIZE, ENTRY_SIZE, TRAILER_SIZE) == (8, 64, 24)


def test_read_whole_object():
    data, infos = sample()
    ranges = read_wal(data)
    assert [info for info, _ in ranges] == infos
    assert [bytes(view) for _, view in ranges] == [b"ABC", b"xyz"]


def test_reader_fetches_tail_then_one_range():
    """What a recovering leader does: small tail GET, footer, then its own range only."""
    data, infos = sample()
    tail = data[-TRAILER_SIZE:]
    need = footer_size(tail)
    assert need == 2 * ENTRY_SIZE + TRAILER_SIZE
    assert object_size(tail) == len(data)
    assert read_footer(data[-need:]) == infos
    assert read_footer(data[-need - 5 :]) == infos  # a longer tail works too
    mine = infos[1]
    fetched = data[mine.position : mine.end]
    assert bytes(range_bytes(fetched, mine, base=mine.position)) == b"xyz"
    assert bytes(range_bytes(data, mine)) == b"xyz"


def test_builder_accounting_and_copies_mutable_input():
    b = WalBuilder()
    assert b.empty and len(b) == 0 and b.size == 0 and b.partitions == 0
    buf = bytearray(b"hello")
    b.add(T1, 0, 0, 0, 5, buf)
    b.add(T1, 1, 7, 9, 5, memoryview(b"world!"))
    buf[:] = b"XXXXX"  # the caller reuses its buffer before the flush
    assert not b.empty and len(b) == 11 and b.size == 11 and b.partitions == 2
    data, infos = b.build()
    assert [bytes(v) for _, v in read_wal(data)] == [b"hello", b"world!"]
    assert len(data) == HEADER_SIZE + 11 + 2 * ENTRY_SIZE + TRAILER_SIZE
    assert b.build() == (data, infos)  # build leaves the builder as it was


def test_empty_object_is_valid():
    data, infos = WalBuilder().build()
    assert infos == [] and read_wal(data) == [] and len(data) == HEADER_SIZE + TRAILER_SIZE


@pytest.mark.parametrize(
    "args",
    [
        ("not-a-uuid", 0, 0, 0, 0, b"x"),
        (T1, -1, 0, 0, 0, b"x"),
        (T1, 2**31, 0, 0, 0, b"x"),
        (T1, 0, 5, 4, 0, b"x"),
        (T1, 0, -1, 0, 0, b"x"),
        (T1, 0, 0, 0, 2**63, b"x"),
        (T1, 0, 0, 0, 0, b""),
    ],
)
def test_builder_rejects_bad_batches(args):
    with pytest.raises(ValueError):
        WalBuilder().add(*args)


def test_builder_rejects_out_of_order_batches():
    b = WalBuilder()
    b.add(T1, 0, 10, 19, 0, b"a")
    b.add(T1, 1, 0, 5, 0, b"b")  # another partition may start anywhere
    with pytest.raises(ValueError, match="does not follow"):
        b.add(T1, 0, 19, 25, 0, b"c")
    with pytest.raises(ValueError):
        b.add(T1, 0, 3, 5, 0, b"c")
    b.add(T1, 0, 20, 25, 0, b"c")
    assert [(i.base_offset, i.last_offset) for i in b.build()[1]] == [(10, 25), (0, 5)]


def test_every_flipped_byte_is_detected():
    data, _ = sample()
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(CorruptObject):
            read_wal(bytes(bad))


def test_every_truncation_is_detected():
    data, _ = sample()
    for n in range(len(data)):
        with pytest.raises(CorruptObject):
            read_wal(data[:n])
    with pytest.raises(CorruptObject):
        read_wal(data + b"\x00")  # trailing bytes: the trailer no longer ends the object


def test_footer_problems_are_detected():
    data, infos = sample()
    need = footer_size(data[-TRAILER_SIZE:])
    with pytest.raises(CorruptObject, match="needs the last"):
        read_footer(data[-need + 1 :])
    with pytest.raises(CorruptObject, match="shorter than"):
        footer_size(data[-5:])
    with pytest.raises(CorruptObject, match="not a WAL object"):
        read_footer(b"\x00" * 100)
    for i in range(1, need + 1):
        bad = bytearray(data)
        bad[-i] ^= 0x80
        with pytest.raises(CorruptObject):
            read_footer(bytes(bad[-need:]))


def test_corrupt_range_is_detected_on_ranged_read():
    data, infos = sample()
    mine = infos[0]
    fetched = bytearray(data[mine.position : mine.end])
    fetched[1] ^= 0xFF
    with pytest.raises(CorruptObject, match="CRC mismatch"):
        range_bytes(fetched, mine, base=mine.position)
    assert bytes(range_bytes(fetched, mine, verify=False, base=mine.position)) == bytes(fetched)
    with pytest.raises(CorruptObject, match="outside"):
        range_bytes(fetched[:-1], mine, base=mine.position)
    with pytest.raises(CorruptObject, match="outside"):
        range_bytes(fetched, mine, base=mine.position + 1)


def test_valid_crc_but_broken_layout_is_rejected():
    """A footer whose CRC is right but whose ranges do not tile the body."""
    data, _ = sample()
    entries_start = len(data) - TRAILER_SIZE - 2 * ENTRY_SIZE
    entries = bytearray(data[entries_start : len(data) - TRAILER_SIZE])
    entries[44 + 7] = 9  # first range now claims position 9 instead of 8
    trailer = bytearray(data[-TRAILER_SIZE:])
    trailer[12:16] = crc32c.crc32c(bytes(entries) + bytes(trailer[:12])).to_bytes(4, "big")
    with pytest.raises(CorruptObject, match="does not follow"):
        read_footer(bytes(entries) + bytes(trailer))


batches = st.lists(
    st.tuples(st.sampled_from([T1, T2]), st.integers(0, 3), st.binary(min_size=1, max_size=40),
              st.integers(0, 5), st.integers(-1, 10**13)),
    max_size=30,
)


@settings(max_examples=150, deadline=None)
@given(batches)
def test_round_trip_property(items):
    b = WalBuilder()
    next_offset: dict = {}
    expected: dict = {}
    for topic_id, partition, payload, records, ts in items:
        base = next_offset.get((topic_id, partition), 0)
        b.add(topic_id, partition, base, base + records, ts, payload)
        next_offset[(topic_id, partition)] = base + records + 1
        expected.setdefault((topic_id, partition), []).append((base, base + records, ts, payload))
    data, infos = b.build()
    got = read_wal(data)
    assert [(i.topic_id, i.partition) for i, _ in got] == list(expected)
    for (info, view), parts in zip(got, expected.values()):
        assert bytes(view) == b"".join(p[3] for p in parts)
        assert (info.base_offset, info.last_offset) == (parts[0][0], parts[-1][1])
        assert info.max_timestamp == max(p[2] for p in parts)
    assert read_footer(data[-footer_size(data[-TRAILER_SIZE:]) :]) == infos
