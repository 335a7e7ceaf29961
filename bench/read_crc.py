"""What read-side CRC-32C checking costs the gateway's sealed-segment read path.

    .venv/bin/python bench/read_crc.py [--mib 256] [--batch-kib 64] [--fetch-kib 1024] [--runs 5]

One sealed segment of 1 KiB incompressible records is uploaded to a file store; the
gateway's sealed read path (`tiering.sealed.walk` through `RemoteCache`, as
`engine.partition.read_sealed` drives it) then reads all of it in fetches of `--fetch-kib`,
with the CRC check off and on, alternating, in process. Prints both throughputs side by
side and the cost of the check; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stratalog.tiering import layout
from stratalog.tiering.batch import HEADER_SIZE, build_batch
from stratalog.tiering.objectstore.file import FileObjectStore
from stratalog.tiering.remote import RemoteCache
from stratalog.tiering.sealed import SegmentObject, Take, read_async, walk
from stratalog.tiering.segment import ActiveSegment

RECORD = 1024
KEY_BASE = "topics/bench-00000000-0000-0000-0000-000000000000/0/00000000000000000000-0-bench"


def build_segment(work: Path, mib: int, batch_kib: int) -> tuple[Path, bytes, int, int]:
    """(the .log file, its .index, its size, its last offset)."""
    seg = ActiveSegment.create(work / "segment", 0, index_interval_bytes=4096, now_ms=0)
    per_batch = max(1, batch_kib * 1024 // RECORD)
    offset = 0
    while seg.size < mib * 1024 * 1024:
        records = [(None, os.urandom(RECORD), [])] * per_batch  # one random value, repeated
        seg.append(build_batch(records, base_offset=offset, timestamp_ms=offset))
        offset += per_batch
    sealed = seg.seal()
    return Path(sealed.log_path), sealed.index_bytes, sealed.size, offset - 1


async def read_all(cache: RemoteCache, seg: SegmentObject, fetch_bytes: int, check_crc: bool) -> int:
    """Read the whole segment fetch by fetch, as consumers at the head of it would."""
    offset = seg.base_offset
    total = 0
    while offset <= seg.last_offset:
        taken = 0

        def take(h, offset=offset):
            nonlocal taken
            if h.last_offset < offset:
                return Take.SKIP
            if taken and taken + h.size > fetch_bytes:
                return Take.STOP
            taken += h.size
            return Take.TAKE

        async def get(g):
            if g.start is None:
                return await cache.get_small(g.key)
            return await cache.read(g.key, g.start, g.end)

        steps = walk(seg, take, seek_offset=offset, chunk_bytes=max(fetch_bytes, HEADER_SIZE), check_crc=check_crc)
        batches = [b async for b in read_async(steps, get)]
        data = b"".join(b.data for b in batches)
        total += len(data)
        offset = batches[-1].header.last_offset + 1
    return total


async def main(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="read-crc-"))
    try:
        log_path, index, size, last = build_segment(work, args.mib, args.batch_kib)
        store = FileObjectStore(work / "objects")
        await store.put_file(KEY_BASE + layout.LOG, log_path)
        await store.put(KEY_BASE + layout.INDEX, index)
        # A file store is read directly, as a gateway on file:// does (no disk cache).
        cache = RemoteCache(store, work / "cache", max_bytes=0)
        seg = SegmentObject(KEY_BASE, 0, last, size)
        fetch = args.fetch_kib * 1024
        await read_all(cache, seg, fetch, True)  # warm the page cache
        # Wall-clock MB/s, and MB per CPU second of the process (steadier on a shared machine).
        rates: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for _ in range(args.runs):
            for check in (False, True):
                start, cpu = time.perf_counter(), time.process_time()
                read = await read_all(cache, seg, fetch, check)
                rates[check].append((read / (time.perf_counter() - start) / 1e6,
                                     read / (time.process_time() - cpu) / 1e6))
        print(f"sealed-segment reads: {size / 2**20:.0f} MiB segment, {args.batch_kib} KiB batches, "
              f"{args.fetch_kib} KiB fetches, {args.runs} runs alternating")
        print("| run | CRC off: MB/s, MB per CPU s | CRC on: MB/s, MB per CPU s | cost (wall, CPU) |")
        print("| --- | --- | --- | --- |")
        rows = list(zip(rates[False], rates[True]))
        medians = tuple(tuple(statistics.median(r[i] for r in rates[c]) for i in (0, 1)) for c in (False, True))
        for label, (off, on) in [*((str(i), row) for i, row in enumerate(rows, 1)), ("median", medians)]:
            print(f"| {label} | {off[0]:.0f}, {off[1]:.0f} | {on[0]:.0f}, {on[1]:.0f} | "
                  f"{100 * (1 - on[0] / off[0]):.1f}%, {100 * (1 - on[1] / off[1]):.1f}% |")
        await store.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="segment size (default 256)")
    parser.add_argument("--batch-kib", type=int, default=64, help="record batch size (default 64)")
    parser.add_argument("--fetch-kib", type=int, default=1024, help="bytes per fetch (default 1024)")
    parser.add_argument("--runs", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
