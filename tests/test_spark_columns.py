"""spark.columns, the scan's column-wise record decoder, against the reference decoder
(tiering.batch.decode_records): the same rows for every batch it reads, the same error for
every batch the reference refuses, and the slice's offset and timestamp bounds applied as
records_of always applied them."""

from __future__ import annotations

import os
import random
import struct

import crc32c
import pytest

pa = pytest.importorskip("pyarrow")

from stratalog.spark.columns import BatchColumns, NotVectorisable, batch_offsets  # noqa: E402
from stratalog.spark.planning import SegmentSlice  # noqa: E402
from stratalog.spark.reading import Seek, batch_filter, records_of  # noqa: E402
from stratalog.spark.schema import ARROW_SCHEMA  # noqa: E402
from stratalog.tiering.batch import (LOG_APPEND_TIME, BatchHeader, CorruptBatch, build_batch,  # noqa: E402
                                     decode_records, set_log_append_time)
from stratalog.tiering.sealed import Batch, CorruptSegment, Take  # noqa: E402

pytestmark = pytest.mark.unit

KEY = "topic/0/segment.log"


def field(rng: random.Random):
    return None if rng.random() < 0.1 else os.urandom(rng.choice([0, 1, 5, 63, 64, 200, 1000]))


def random_batches(rng: random.Random) -> list[Batch]:
    """Batches as a read hands them over: views of one buffer (sometimes with bytes after
    the last, as when more of the object was read)."""
    parts = _random_batches(rng)
    buffer = b"".join(bytes(b.data) for b in parts) + os.urandom(rng.choice([0, 5, 100]))
    return [Batch(b.position, b.header, memoryview(buffer)[b.position:b.position + b.header.size])
            for b in parts]


def _random_batches(rng: random.Random) -> list[Batch]:
    out, offset, position = [], rng.randint(0, 10**12), 0
    for _ in range(rng.randint(1, 6)):
        n = rng.randint(0, 30)
        records = [(field(rng), field(rng), [(rng.choice(["a", "é", "", "hdr"]), field(rng))
                                             for _ in range(rng.choice([0, 0, 1, 3]))]) for _ in range(n)]
        deltas = sorted(rng.sample(range(100), n))
        data = build_batch(records, base_offset=offset, compression=rng.choice([0, 1, 2, 3, 4]),
                           timestamps=[rng.randint(-5, 10**13) for _ in range(n)] if n else None,
                           timestamp_ms=None if n else 5, offset_deltas=deltas or None,
                           last_offset_delta=(deltas[-1] if n else 0) + rng.randint(0, 3))
        if rng.random() < 0.2:
            data = bytearray(data)
            set_log_append_time(data, 0, 12_345)
            data = bytes(data)
        header = BatchHeader.parse(data)
        out.append(Batch(position, header, memoryview(data)))
        position += len(data)
        offset = header.last_offset + 1
    return out


def reference_rows(s: SegmentSlice, batches: list[Batch]) -> list[dict]:
    """What records_of returned when every record was a Python object (its filter loop)."""
    rows, seek_ts = [], s.seek_ts
    for batch in batches:
        kind = 1 if batch.header.timestamp_type == LOG_APPEND_TIME else 0
        for r in decode_records(batch.data):
            wanted = s.start_offset <= r.offset < s.end_offset
            if seek_ts is not None:
                if not wanted or r.timestamp < seek_ts:
                    continue
                seek_ts = None
            if s.stop_ts is not None and r.timestamp >= s.stop_ts:
                return rows
            if wanted:
                rows.append((r.key, r.value, r.offset, r.timestamp, kind,
                             [(k, v) for k, v in r.headers]))
    return rows


def read_rows(s: SegmentSlice, batches: list[Batch]) -> list[tuple]:
    """The slice's rows as a read returns them: the batch filter first decides on every
    batch (the walk runs ahead of decoding), then the taken ones are decoded."""
    seek = Seek(s.seek_ts)
    take, taken = batch_filter(s, seek), []
    for b in batches:
        verdict = take(b.header)
        if verdict is Take.STOP:
            break
        if verdict is Take.TAKE:
            taken.append(b)
    table = pa.Table.from_batches(list(records_of(s, iter(taken), KEY, seek)), schema=ARROW_SCHEMA)
    micros = table.column("timestamp").cast(pa.int64()).to_pylist()
    return [(row["key"], row["value"], row["offset"], us // 1000, row["timestampType"],
             [(h["key"], h["value"]) for h in row["headers"] or ()])
            for row, us in zip(table.to_pylist(), micros)]


def a_slice(batches: list[Batch], **bounds) -> SegmentSlice:
    size = batches[-1].position + batches[-1].header.size
    return SegmentSlice("t", 3, "k", 0, 2**62, size, 0, bounds.pop("start_offset", 0),
                        bounds.pop("end_offset", 2**62), **bounds)


def test_every_field_matches_the_reference_decoder():
    rng = random.Random(1)
    for _ in range(40):
        batches = random_batches(rng)
        s = a_slice(batches)
        assert read_rows(s, batches) == reference_rows(s, batches)


def test_offset_and_timestamp_bounds_select_as_the_record_loop_did():
    rng = random.Random(2)
    for _ in range(60):
        batches = random_batches(rng)
        base = batches[0].header.base_offset
        s = a_slice(batches, start_offset=rng.choice([0, base + rng.randint(0, 60)]),
                    end_offset=rng.choice([2**62, base + rng.randint(0, 200)]),
                    seek_ts=rng.choice([None, rng.randint(0, 10**13)]),
                    stop_ts=rng.choice([None, rng.randint(0, 10**13)]))
        assert read_rows(s, batches) == reference_rows(s, batches)


def test_a_position_in_an_aborted_batch_lets_every_later_record_count():
    """read_committed with startingTimestamp: the first record at or after it is in an
    aborted transaction's batch, which is skipped whole; the committed records after it
    count whatever their time, as from Kafka's offsetsForTimes position."""
    parts, position = [], 0
    for base, ts, txn in ((0, 1_000, False), (2, 9_000, True), (4, 2_000, False), (6, 3_000, False)):
        data = build_batch([(None, b"v%d" % base, []), (None, b"w%d" % base, [])], base_offset=base,
                           timestamp_ms=ts, producer_id=7 if txn else -1, producer_epoch=0 if txn else -1,
                           is_transactional=txn)
        parts.append(Batch(position, BatchHeader.parse(data), memoryview(data)))
        position += len(data)
    s = a_slice(parts, seek_ts=5_000, aborted=((7, 2, 3),))
    assert [r[2] for r in read_rows(s, parts)] == [4, 5, 6, 7]


def test_damaged_records_get_the_reference_decoders_verdict():
    """Bytes changed inside the records with the CRC made to match again: either both
    decoders read the same rows, or the scan raises the reference's error for that batch."""
    rng = random.Random(3)
    refused = 0
    for _ in range(400):
        records = [(field(rng), field(rng), [(rng.choice(["a", "hdr"]), field(rng))
                                             for _ in range(rng.choice([0, 1, 2]))])
                   for _ in range(rng.randint(1, 8))]
        data = bytearray(build_batch(records, base_offset=100, timestamp_ms=1000))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(61, len(data))] = rng.randrange(256)
        struct.pack_into(">I", data, 17, crc32c.crc32c(bytes(data[21:])))
        batches = [Batch(0, BatchHeader.parse(data), memoryview(bytes(data)))]
        s = a_slice(batches, start_offset=100, end_offset=200)
        try:
            expected = reference_rows(s, batches)
        except CorruptBatch as exc:
            refused += 1
            with pytest.raises(CorruptSegment) as raised:
                read_rows(s, batches)
            assert str(raised.value) == f"{KEY} batch at byte 0 (offset 100): {exc}"
            continue
        assert read_rows(s, batches) == expected
    assert refused > 10  # some damage is caught (most lands inside keys and values)


def test_a_bad_crc_is_refused_before_decoding():
    data = bytearray(build_batch([(b"k", b"v")], base_offset=7, timestamp_ms=1))
    data[-1] ^= 1
    batch = Batch(0, BatchHeader.parse(data), memoryview(bytes(data)))
    with pytest.raises(CorruptSegment, match="offset 7.*CRC mismatch"):
        read_rows(a_slice([batch]), [batch])
    with pytest.raises(CorruptBatch, match="CRC mismatch"):
        BatchColumns().add(batch.header, batch.data)


def test_batch_offsets_are_the_records_offsets():
    rng = random.Random(4)
    for _ in range(30):
        for batch in random_batches(rng):
            try:
                got = batch_offsets(batch.header, batch.data).tolist()
            except NotVectorisable:
                continue
            assert got == [r.offset for r in decode_records(batch.data)]
