"""Offset/time indexes and the local active segment: appends, reads, recovery, sealing."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from stratalog.tiering.batch import (
    BatchHeader,
    CorruptBatch,
    build_batch,
    patch_batch,
    set_log_append_time,
    split_batches,
)
from stratalog.tiering.index import OffsetIndex, TimeIndex
from stratalog.tiering.segment import ActiveSegment, SealedSegment

pytestmark = pytest.mark.unit

# -- OffsetIndex -----------------------------------------------------------------------------


def test_offset_index_bytes_are_kafka_entries():
    index = OffsetIndex(1000)
    index.append(1005, 190)
    index.append(1300, 70_000)
    assert index.to_bytes() == bytes.fromhex("00000005000000be" "0000012c00011170")
    assert len(index) == 2
    loaded = OffsetIndex.from_bytes(1000, index.to_bytes())
    assert loaded.entries() == [(1005, 190), (1300, 70_000)]


def test_offset_index_lookup_edges():
    index = OffsetIndex(50)
    assert index.lookup(10**9) == (50, 0)
    for offset, position in [(60, 100), (70, 200), (80, 300)]:
        index.append(offset, position)
    assert index.lookup(0) == (50, 0)      # below the base
    assert index.lookup(59) == (50, 0)     # before the first entry
    assert index.lookup(60) == (60, 100)   # exact hit
    assert index.lookup(69) == (60, 100)   # between entries
    assert index.lookup(80) == (80, 300)
    assert index.lookup(10**12) == (80, 300)


@pytest.mark.parametrize("offset,position", [(60, 150), (55, 150), (65, 100), (65, 50)])
def test_offset_index_entries_must_increase(offset, position):
    index = OffsetIndex(50)
    index.append(60, 100)
    with pytest.raises(ValueError):
        index.append(offset, position)


def test_offset_index_rejects_values_beyond_32_bits():
    index = OffsetIndex(10)
    with pytest.raises(ValueError):
        index.append(9, 0)
    with pytest.raises(ValueError):
        index.append(10 + 2**31, 0)
    with pytest.raises(ValueError):
        index.append(11, 2**31)


@pytest.mark.parametrize("data", [b"\x00" * 7, b"\x00" * 12, b"\x00" * 9])
def test_offset_index_from_bytes_rejects_partial_entries(data):
    with pytest.raises(ValueError, match="multiple of 8"):
        OffsetIndex.from_bytes(0, data)


def test_offset_index_from_bytes_rejects_unordered_entries():
    data = struct.pack(">iiii", 5, 100, 4, 200)
    with pytest.raises(ValueError):
        OffsetIndex.from_bytes(0, data)
    with pytest.raises(ValueError):
        OffsetIndex.from_bytes(0, struct.pack(">ii", -1, 0))


# -- TimeIndex -------------------------------------------------------------------------------


def test_time_index_bytes_are_kafka_entries():
    index = TimeIndex(1000)
    assert index.last_entry == (-1, 1000)
    assert index.append(300, 1003)
    assert index.append(1_700_000_000_000, 1009)
    assert index.to_bytes() == bytes.fromhex(
        "000000000000012c" "00000003" "0000018bcfe56800" "00000009")
    assert index.last_entry == (1_700_000_000_000, 1009)
    loaded = TimeIndex.from_bytes(1000, index.to_bytes())
    assert loaded.entries() == index.entries() and len(loaded) == 2


def test_time_index_only_appends_greater_timestamps():
    index = TimeIndex(0)
    assert not index.append(-1, 0)       # equal to the empty index's implicit entry
    assert index.append(100, 5)
    assert not index.append(100, 6)
    assert not index.append(90, 7)
    assert index.entries() == [(100, 5)]
    with pytest.raises(ValueError):
        index.append(200, 4)             # offsets never go back


def test_time_index_lookup_edges():
    index = TimeIndex(10)
    assert index.lookup(5) == 10
    index.append(100, 12)
    index.append(200, 15)
    assert index.lookup(99) == 10
    assert index.lookup(100) == 12
    assert index.lookup(199) == 12
    assert index.lookup(200) == 15
    assert index.lookup(10**15) == 15


@pytest.mark.parametrize("data", [b"\x00" * 8, b"\x00" * 13])
def test_time_index_from_bytes_rejects_bad_size(data):
    with pytest.raises(ValueError, match="multiple of 12"):
        TimeIndex.from_bytes(0, data)


def test_time_index_from_bytes_rejects_non_increasing_timestamps():
    with pytest.raises(ValueError):
        TimeIndex.from_bytes(0, struct.pack(">qiqi", 100, 1, 100, 2))


# -- ActiveSegment ---------------------------------------------------------------------------

BASE = 1000
# Timestamps of the eight two-record batches used below; not in order on purpose.
STAMPS = [100, 300, 200, 250, 400, 350, 360, 500]


def patched(base_offset: int, timestamp: int, n: int = 2, value_size: int = 10,
            timestamps: list[int] | None = None) -> bytes:
    batch = bytearray(build_batch([(None, bytes(value_size), [])] * n,
                                  timestamp_ms=timestamp, timestamps=timestamps))
    patch_batch(batch, 0, base_offset, 3)
    return bytes(batch)


def fill(segment: ActiveSegment, stamps=STAMPS) -> list[bytes]:
    batches = []
    offset = segment.next_offset
    for stamp in stamps:
        batch = patched(offset, stamp)
        [(header, _)] = split_batches(batch)
        assert segment.append(batch, header) == segment.size - len(batch)
        batches.append(batch)
        offset += 2
    return batches


@pytest.fixture
def segment(tmp_path):
    seg = ActiveSegment.create(tmp_path / "topic-0", BASE, index_interval_bytes=95, now_ms=42)
    yield seg
    seg.close()


def test_batch_size_assumed_by_these_tests():
    # 61-byte header + two 17-byte records; the byte-exact sidecars below depend on it.
    assert len(patched(0, 0)) == 95


def test_create_names_files_by_base_offset(segment, tmp_path):
    assert segment.log_path == tmp_path / "topic-0" / "00000000000000001000.log"
    assert segment.log_path.exists() and segment.directory == tmp_path / "topic-0"
    assert (segment.size, segment.next_offset, segment.created_ms) == (0, BASE, 42)
    assert (segment.min_timestamp, segment.max_timestamp) == (-1, -1)
    with pytest.raises(FileExistsError):
        ActiveSegment.create(tmp_path / "topic-0", BASE, now_ms=0)
    with pytest.raises(FileNotFoundError):
        ActiveSegment.open(tmp_path / "topic-0", 5, now_ms=0)


def test_append_writes_batches_back_to_back(segment):
    batches = fill(segment)
    segment.write_unwritten()
    assert segment.log_path.read_bytes() == b"".join(batches)
    assert (segment.next_offset, segment.size) == (BASE + 16, 95 * 8)
    assert (segment.min_timestamp, segment.max_timestamp) == (100, 500)


def test_indexes_follow_kafkas_interval_rule(segment):
    fill(segment)
    # An entry is added before a batch once more than 95 bytes were appended since the
    # last one: before batches 2, 4 and 6, each naming that batch's last offset.
    assert segment.offset_index.entries() == [(1005, 190), (1009, 380), (1013, 570)]
    # The time entry carries the greatest timestamp so far and its batch's last offset;
    # before batch 6 the maximum is still 400, so no new time entry is added.
    assert segment.time_index.entries() == [(300, 1003), (400, 1009)]


def test_seal_gives_byte_exact_sidecars_and_writes_none(segment):
    fill(segment)
    sealed = segment.seal()
    expected_index = bytes.fromhex("00000005000000be" "000000090000017c" "0000000d0000023a")
    expected_timeindex = bytes.fromhex(
        "000000000000012c00000003" "000000000000019000000009" "00000000000001f40000000f")
    assert sealed == SealedSegment(
        base_offset=BASE, last_offset=BASE + 15, size=760, min_timestamp=100,
        max_timestamp=500, log_path=segment.log_path, index_bytes=expected_index,
        timeindex_bytes=expected_timeindex)
    # The sidecars go to the bucket only: no file is created on the event loop at a seal.
    assert sorted(p.name for p in segment.directory.iterdir()) == ["00000000000000001000.log"]
    assert segment.seal() is sealed
    with pytest.raises(ValueError, match="sealed"):
        segment.append(patched(BASE + 16, 600))
    with pytest.raises(ValueError, match="sealed"):
        segment.truncate_to(BASE)
    assert len(segment.read(BASE, 10**6)) == 760  # the cache still serves reads


def test_seal_of_empty_segment_has_empty_sidecars(segment):
    sealed = segment.seal()
    assert (sealed.size, sealed.last_offset, sealed.index_bytes, sealed.timeindex_bytes) == (
        0, BASE - 1, b"", b"")
    assert (sealed.min_timestamp, sealed.max_timestamp) == (-1, -1)


def test_read_returns_whole_batches_within_max_bytes(segment):
    batches = fill(segment)
    assert segment.read(BASE, 0) == batches[0]                # at least one batch
    assert segment.read(BASE + 3, 95) == batches[1]           # the batch holding offset 1003
    assert segment.read(BASE + 3, 200) == batches[1] + batches[2]
    assert segment.read(BASE + 3, 285) == b"".join(batches[1:4])
    assert segment.read(BASE + 14, 10**6) == batches[7]
    assert segment.read(0, 96) == batches[0]                  # below the base: first batch
    assert segment.read(BASE + 16, 10**6) == b""


def test_read_returns_an_oversized_batch_whole(segment):
    big = patched(BASE, 1, n=3, value_size=5000)
    segment.append(big)
    segment.append(patched(BASE + 3, 2))
    assert segment.read(BASE + 1, 100) == big


@pytest.mark.parametrize("interval", [0, 1, 95, 300, 1 << 20])
def test_read_agrees_with_a_linear_scan_for_every_offset(tmp_path, interval):
    seg = ActiveSegment.create(tmp_path, 0, index_interval_bytes=interval, now_ms=0)
    batches, firsts, offset = [], [], 0
    for i in range(30):
        n = 1 + i % 4
        batch = patched(offset, i, n=n, value_size=3 * i)
        seg.append(batch)
        batches.append(batch)
        firsts.append(offset)
        offset += n + (i % 3)      # gaps, as compaction and transaction markers leave
    for target in range(offset + 2):
        for max_bytes in (1, 150, 600):
            holding = [i for i, first in enumerate(firsts)
                       if target <= first + BatchHeader.parse(batches[i]).last_offset_delta]
            expected = b""
            if holding:
                start = holding[0]
                expected = batches[start]
                for batch in batches[start + 1:]:
                    if len(expected) + len(batch) > max_bytes:
                        break
                    expected += batch
            assert seg.read(target, max_bytes) == expected, (target, max_bytes)
    seg.close()


def test_offset_for_timestamp(segment):
    fill(segment)
    assert segment.offset_for_timestamp(0) == BASE
    assert segment.offset_for_timestamp(100) == BASE
    assert segment.offset_for_timestamp(101) == BASE + 2      # batch 1 (300) is first >= 101
    assert segment.offset_for_timestamp(301) == BASE + 8      # batch 4 (400)
    assert segment.offset_for_timestamp(450) == BASE + 14     # found via the time index
    assert segment.offset_for_timestamp(500) == BASE + 14
    assert segment.offset_for_timestamp(501) is None
    assert segment.find_timestamp(450) == (500, BASE + 14)
    assert segment.find_timestamp(100, starting_offset=BASE + 5) == (200, BASE + 5)
    assert segment.find_timestamp(260, starting_offset=BASE + 5) == (400, BASE + 8)


def test_offset_for_timestamp_looks_inside_the_batch(segment):
    segment.append(patched(BASE, 0, n=4, timestamps=[10, 50, 30, 60]))
    assert segment.offset_for_timestamp(40) == BASE + 1
    assert segment.offset_for_timestamp(55) == BASE + 3
    assert segment.offset_for_timestamp(61) is None
    assert segment.min_timestamp == 10


def test_log_append_time_batches_use_the_append_time(segment):
    batch = bytearray(patched(BASE, 5, n=3))
    set_log_append_time(batch, 0, 9_000)
    segment.append(batch)
    assert (segment.min_timestamp, segment.max_timestamp) == (9_000, 9_000)
    assert segment.offset_for_timestamp(8_000) == BASE


def test_append_rejects_bad_batches(segment):
    segment.append(patched(BASE, 1))
    with pytest.raises(ValueError, match="below"):
        segment.append(patched(BASE + 1, 1))
    unpatched = bytearray(build_batch([(None, b"x", [])], timestamp_ms=1))
    [(stale_header, _)] = split_batches(unpatched)
    patch_batch(unpatched, 0, BASE + 2, 0)
    with pytest.raises(ValueError, match="patch_batch"):
        segment.append(unpatched, stale_header)
    with pytest.raises(CorruptBatch):
        segment.append(patched(BASE + 2, 1) + b"\x00")
    with pytest.raises(CorruptBatch):
        segment.append(b"\x00" * 10)
    with pytest.raises(ValueError, match="roll"):
        segment.append(patched(BASE + 2**31, 1))
    assert segment.size == 95 and segment.next_offset == BASE + 2
    segment.append(patched(BASE + 10, 1))          # gaps are fine
    assert segment.next_offset == BASE + 12


def write_and_close(tmp_path: Path) -> tuple[ActiveSegment, list[bytes]]:
    seg = ActiveSegment.create(tmp_path, BASE, index_interval_bytes=95, now_ms=1)
    batches = fill(seg)
    seg.close()
    return seg, batches


@pytest.mark.parametrize("tail", [b"\x00", b"\x00" * 61, os.urandom(500)])
def test_recovery_cuts_a_torn_or_garbage_tail(tmp_path, tail):
    original, batches = write_and_close(tmp_path)
    with open(original.log_path, "ab") as f:
        f.write(tail)
    seg = ActiveSegment.open(tmp_path, BASE, index_interval_bytes=95, now_ms=7)
    assert (seg.size, seg.next_offset, seg.created_ms) == (760, BASE + 16, 7)
    assert seg.log_path.stat().st_size == 760
    assert seg.offset_index.entries() == original.offset_index.entries()
    assert seg.time_index.entries() == original.time_index.entries()
    assert (seg.min_timestamp, seg.max_timestamp) == (100, 500)
    assert seg.append(patched(BASE + 16, 700)) == 760
    assert seg.read(BASE + 16, 0) == patched(BASE + 16, 700)
    seg.close()


def test_recovery_cuts_a_partial_last_batch(tmp_path):
    original, batches = write_and_close(tmp_path)
    with open(original.log_path, "r+b") as f:
        f.truncate(760 - 30)
    seg = ActiveSegment.open(tmp_path, BASE, index_interval_bytes=95, now_ms=0)
    assert (seg.size, seg.next_offset, seg.max_timestamp) == (665, BASE + 14, 400)
    assert seg.read(BASE, 10**6) == b"".join(batches[:7])
    seg.close()


def test_recovery_stops_at_a_batch_with_a_bad_crc(tmp_path):
    original, batches = write_and_close(tmp_path)
    with open(original.log_path, "r+b") as f:
        f.seek(95 * 5 + 70)
        f.write(b"\xff")
    seg = ActiveSegment.open(tmp_path, BASE, index_interval_bytes=95, now_ms=0)
    assert (seg.size, seg.next_offset) == (475, BASE + 10)
    assert seg.offset_index.entries() == [(1005, 190), (1009, 380)]
    seg.close()


def test_recovery_stops_where_offsets_go_backwards(tmp_path):
    original, batches = write_and_close(tmp_path)
    with open(original.log_path, "ab") as f:
        f.write(patched(BASE + 3, 1))
    seg = ActiveSegment.open(tmp_path, BASE, now_ms=0)
    assert (seg.size, seg.next_offset) == (760, BASE + 16)
    seg.close()


def test_recovery_of_an_empty_file(tmp_path):
    ActiveSegment.create(tmp_path, 0, now_ms=0).close()
    seg = ActiveSegment.open(tmp_path, 0, now_ms=5)
    assert (seg.size, seg.next_offset, seg.max_timestamp) == (0, 0, -1)
    assert seg.read(0, 100) == b""
    seg.close()


def test_open_drops_stale_sidecars(tmp_path):
    seg = ActiveSegment.create(tmp_path, 0, now_ms=0)
    fill(seg)
    sealed = seg.seal()
    seg.close()
    # As versions before 2026-11-28 left them: written locally at the seal.
    seg.index_path.write_bytes(sealed.index_bytes)
    seg.timeindex_path.write_bytes(sealed.timeindex_bytes)
    reopened = ActiveSegment.open(tmp_path, 0, now_ms=0)
    assert not reopened.index_path.exists() and not reopened.timeindex_path.exists()
    reopened.close()


def test_appended_batches_are_written_in_runs_and_read_before_they_are(segment, monkeypatch):
    monkeypatch.setattr(ActiveSegment, "UNWRITTEN_LIMIT", 95 * 3)
    batches = fill(segment)
    # Written three at a time: the last two wait in memory, yet every read sees them.
    assert segment.log_path.read_bytes() == b"".join(batches[:6])
    assert segment.read(BASE + 14, 10**6) == batches[7]
    assert segment.log_path.read_bytes() == b"".join(batches)


def test_more_held_batches_than_one_system_call_takes_are_all_written(segment):
    # pwritev refuses more than IOV_MAX (1024 on Linux) buffers; 3,000 batches of 95 bytes
    # stay under UNWRITTEN_LIMIT, so all of them are held until the write.
    batches = fill(segment, stamps=[100] * 3000)
    segment.write_unwritten()
    assert segment.log_path.read_bytes() == b"".join(batches)
    assert segment.read(BASE + 2 * 2999, 10**6) == batches[-1]


@pytest.mark.parametrize("target", [BASE + 4, BASE + 5])
def test_truncate_to_drops_the_batch_holding_the_offset_and_later(segment, target):
    batches = fill(segment)
    segment.truncate_to(target)
    assert (segment.size, segment.next_offset, segment.max_timestamp) == (190, BASE + 4, 300)
    assert segment.log_path.read_bytes() == b"".join(batches[:2])
    assert segment.offset_index.entries() == []
    assert segment.time_index.entries() == []
    assert segment.read(BASE + 4, 10**6) == b""
    assert segment.append(patched(BASE + 4, 1)) == 190


def test_truncate_to_base_or_beyond_the_end(segment):
    fill(segment)
    segment.truncate_to(BASE + 16)
    assert segment.size == 760
    segment.truncate_to(BASE)
    assert (segment.size, segment.next_offset, segment.max_timestamp) == (0, BASE, -1)
    assert segment.log_path.stat().st_size == 0


def test_close_and_delete(segment):
    fill(segment)
    segment.seal()
    assert segment.log_path.exists()
    segment.close()
    segment.close()
    with pytest.raises(ValueError, match="closed"):
        segment.read(BASE, 100)
    segment.delete()
    assert list(segment.directory.iterdir()) == []
