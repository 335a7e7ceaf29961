"""tiering.sealed, the one reader of sealed segments: where it starts, what it fetches,
what it refuses, and that its blocking and async drivers agree."""

from __future__ import annotations

import asyncio

import pytest

from stratalog.tiering import layout
from stratalog.tiering.batch import HEADER_SIZE, BatchHeader, build_batch
from stratalog.tiering.sealed import (CorruptSegment, Get, SegmentObject, Take, read_async, read_sync,
                                      walk)
from stratalog.tiering.segment import ActiveSegment

pytestmark = pytest.mark.unit

BATCHES = 40  # 5 records each, offsets 100..299, timestamps rising by 10 ms per record
KEY = "topic/0/segment"


class Store:
    """Objects in a dict, with every Get remembered."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.gets: list[Get] = []

    def get(self, g: Get) -> bytes:
        self.gets.append(g)
        data = self.objects[g.key]
        return data if g.start is None else data[g.start:g.end]

    async def aget(self, g: Get) -> bytes:
        await asyncio.sleep(0)
        return self.get(g)

    def log_bytes_fetched(self) -> int:
        return sum(g.end - g.start for g in self.gets if g.key.endswith(layout.LOG))


@pytest.fixture
def segment(tmp_path) -> tuple[SegmentObject, dict[str, bytes]]:
    seg = ActiveSegment.create(tmp_path, 100, index_interval_bytes=512, now_ms=0)
    for n in range(BATCHES):
        base = 100 + 5 * n
        seg.append(build_batch([(b"k", b"v" * 200, [])] * 5, base_offset=base,
                               timestamps=[1000 + 10 * (base - 100 + i) for i in range(5)]))
    sealed = seg.seal()
    objects = {KEY + layout.LOG: sealed.log_path.read_bytes(), KEY + layout.INDEX: sealed.index_bytes,
               KEY + layout.TIMEINDEX: sealed.timeindex_bytes}
    seg.close()
    return SegmentObject(KEY, sealed.base_offset, sealed.last_offset, sealed.size), objects


def _all(h: BatchHeader) -> Take:
    return Take.TAKE


def _from(offset: int):
    return lambda h: Take.SKIP if h.last_offset < offset else Take.TAKE


def test_walk_yields_every_batch_in_order(segment):
    seg, objects = segment
    got = list(read_sync(walk(seg, _all), Store(objects).get))
    assert [b.header.base_offset for b in got] == list(range(100, 300, 5))
    assert b"".join(b.data for b in got) == objects[KEY + layout.LOG]


def test_seek_offset_starts_at_the_indexed_batch_and_fetches_no_earlier_bytes(segment):
    seg, objects = segment
    store = Store(objects)
    got = list(read_sync(walk(seg, _from(253), seek_offset=253, chunk_bytes=4096), store.get))
    assert got[0].header.base_offset == 250 and got[-1].header.last_offset == 299
    first_log_get = next(g for g in store.gets if g.key.endswith(layout.LOG))
    assert store.gets[0] == Get(KEY + layout.INDEX)
    assert 0 < first_log_get.start <= got[0].position  # the sparse index skipped the front
    assert store.log_bytes_fetched() <= seg.size - first_log_get.start


def test_seek_ts_skips_batches_the_time_index_proves_older(segment):
    seg, objects = segment
    store = Store(objects)
    seek = 1000 + 10 * 150  # the record at offset 250
    got = list(read_sync(walk(seg, lambda h: Take.SKIP if h.max_timestamp < seek else Take.TAKE,
                              seek_ts=seek), store.get))
    assert got[0].header.base_offset == 250
    assert Get(KEY + layout.TIMEINDEX) in store.gets
    assert min(g.start for g in store.gets if g.key.endswith(layout.LOG)) > 0


def test_skipped_batches_are_not_fetched_and_stop_ends_the_walk(segment):
    seg, objects = segment
    store = Store(objects)
    verdicts = {100: Take.TAKE, 105: Take.SKIP, 110: Take.STOP}
    got = list(read_sync(walk(seg, lambda h: verdicts[h.base_offset], chunk_bytes=HEADER_SIZE), store.get))
    assert [b.header.base_offset for b in got] == [100]
    size = got[0].header.size
    # headers of 100, 105 and 110, and the body of 100 only
    assert store.log_bytes_fetched() <= 3 * HEADER_SIZE + size


def test_the_async_driver_reads_what_the_blocking_one_does(segment):
    seg, objects = segment

    async def collect():
        return [(b.position, bytes(b.data)) async for b in
                read_async(walk(seg, _from(180), seek_offset=180, chunk_bytes=1000), Store(objects).aget)]

    sync = [(b.position, bytes(b.data)) for b in
            read_sync(walk(seg, _from(180), seek_offset=180, chunk_bytes=1000), Store(objects).get)]
    assert asyncio.run(collect()) == sync and sync[0][0] > 0


def test_a_byte_range_is_read_without_sidecars(segment):
    seg, objects = segment
    whole = list(read_sync(walk(seg, _all), Store(objects).get))
    start, end = whole[10].position, whole[20].position
    store = Store(objects)
    got = list(read_sync(walk(seg, _all, position=start, end=end), store.get))
    assert [b.header.base_offset for b in got] == [b.header.base_offset for b in whole[10:20]]
    assert all(g.key.endswith(layout.LOG) and g.end <= end for g in store.gets)


def _damaged(objects, change) -> dict[str, bytes]:
    log = bytearray(objects[KEY + layout.LOG])
    change(log)
    return {**objects, KEY + layout.LOG: bytes(log)}


def test_a_truncated_object_is_refused(segment):
    seg, objects = segment
    store = Store(_damaged(objects, lambda log: log.__delitem__(slice(-7, None))))
    with pytest.raises(CorruptSegment, match="object ends at"):
        list(read_sync(walk(seg, _all), store.get))


def test_a_damaged_header_is_refused(segment):
    seg, objects = segment
    second = BatchHeader.parse(objects[KEY + layout.LOG]).size

    def scramble(log):
        log[second + 8:second + 12] = b"\xff\xff\xff\xff"  # the batch length

    with pytest.raises(CorruptSegment, match=f"at byte {second}"):
        list(read_sync(walk(seg, _all), Store(_damaged(objects, scramble)).get))


def test_offsets_outside_the_manifest_entry_are_refused(segment):
    seg, objects = segment
    short = SegmentObject(seg.key_base, seg.base_offset, 200, seg.size)
    with pytest.raises(CorruptSegment, match="do not follow"):
        list(read_sync(walk(short, _all), Store(objects).get))


def test_a_flipped_body_byte_is_refused_when_crcs_are_checked(segment):
    seg, objects = segment
    store = Store(_damaged(objects, lambda log: log.__setitem__(HEADER_SIZE + 30, log[HEADER_SIZE + 30] ^ 1)))
    with pytest.raises(CorruptSegment, match="CRC") as caught:
        list(read_sync(walk(seg, _all, check_crc=True), store.get))
    assert (caught.value.key, caught.value.position, caught.value.offset) == (KEY + layout.LOG, 0, 100)
    # Without the check the batch is handed on (Spark's decoder checks the CRC itself).
    assert len(list(read_sync(walk(seg, _all), store.get))) == BATCHES


def test_trailing_bytes_that_are_not_a_batch_are_refused(segment):
    seg, objects = segment
    store = Store(_damaged(objects, lambda log: log.extend(b"\0" * 10)))
    longer = SegmentObject(seg.key_base, seg.base_offset, seg.last_offset, seg.size + 10)
    with pytest.raises(CorruptSegment, match="trailing bytes"):
        list(read_sync(walk(longer, _all), store.get))


def test_a_damaged_index_is_refused(segment):
    seg, objects = segment
    store = Store({**objects, KEY + layout.INDEX: objects[KEY + layout.INDEX][:-3]})
    with pytest.raises(CorruptSegment, match=layout.INDEX):
        list(read_sync(walk(seg, _from(250), seek_offset=250), store.get))
