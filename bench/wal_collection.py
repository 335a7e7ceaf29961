"""What a WAL garbage-collection pass costs the WAL commits running beside it.

    .venv/bin/python bench/wal_collection.py [--objects 4000] [--segments 200] [--runs 3]
        [--commits-per-s 400] [--catch-up-ms 250]

A gateway collects the WAL objects that sealed segments made obsolete every
wal.collection.interval.ms: 5 s on the embedded coordinator, the retention check's 60 s on
etcd, where a minute of flushes is tens of thousands of objects at a few hundred a second.
In process, on the embedded coordinator and a file store: `--objects` committed WAL
objects of 8 ranges each (one per partition), every partition with `--segments` sealed
segments covering them. Then WAL commits run at `--commits-per-s` (a gateway's flush rate),
one at a time as the WAL writer's do, for 5 s alone (the reference) and then while one
collection pass (the cleaner's steps: find the
obsolete objects, delete their files, then their entries, then read the WAL entries and
objects again for orphans) runs; the commits made alone are still unsealed, news to the
pass as a minute of flushes is to a gateway's. Printed side by side: the commits' latency,
the longest the event loop went without running a ready task, and how long the pass took.
Never passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.model import PartitionState, SegmentEntry, WalObject, WalRange
from stratalog.coordinator.store import KVClusterStore
from stratalog.engine.cleanup import proof_carriers
from stratalog.gateway.gc_schedule import FullCollections
from stratalog.tiering.objectstore.file import FileObjectStore

PARTITIONS = 8
OBJECT_BYTES = 16 * 1024  # the count, not the size, is what a pass works through


class Committer:
    """WAL commits one after another, each a new object with a range of every partition."""

    def __init__(self, store: KVClusterStore, topic_id, sequence: int, offset: int) -> None:
        self.store, self.topic_id = store, topic_id
        self.sequence, self.offset = sequence, offset
        self.epochs = {(topic_id, p): 0 for p in range(PARTITIONS)}

    def next_object(self) -> WalObject:
        ranges = tuple(WalRange(self.topic_id, p, self.offset, self.offset + 9, p * 100, 100, 0)
                       for p in range(PARTITIONS))
        self.offset += 10
        self.sequence += 1
        return WalObject(1, self.sequence, f"wal/1/{self.sequence:020d}.wal", ranges)

    async def run(self, until: asyncio.Event, seconds: float, per_s: float) -> list[float]:
        """Commit `per_s` a second (each as soon as the one before is done, when behind)."""
        latencies = []
        began = time.perf_counter()
        deadline = began + seconds
        while not until.is_set() and time.perf_counter() < deadline:
            start = time.perf_counter()
            await self.store.commit_wal(self.next_object(), self.epochs)
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(max(0.0, began + len(latencies) / per_s - time.perf_counter()))
        return latencies


async def catch_up(store: KVClusterStore, every_s: float, until: asyncio.Event) -> None:
    """What a gateway's maintenance tick does for the log index (`ClusterStore.catch_up`)."""
    while not until.is_set():
        await asyncio.sleep(every_s)
        await store.catch_up()


async def longest_stall(until: asyncio.Event) -> float:
    """The longest gap between two turns of a task that only sleeps a millisecond."""
    worst, last = 0.0, time.perf_counter()
    while not until.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        worst, last = max(worst, now - last - 0.001), now
    return worst


async def collect(store: KVClusterStore, objects: FileObjectStore) -> int:
    """One pass of the cleaner's WAL collection (engine.cleanup.Cleaner): the obsolete
    objects' files and entries, then the orphan sweep's reads (the first read after a
    deletion reloads the coordinator index)."""
    obsolete = await store.obsolete_wal_objects()
    carriers = proof_carriers(await store.wal_objects(), obsolete)
    obsolete = [o for o in obsolete if (o.gateway_id, o.sequence) not in carriers]
    await objects.delete([o.key for o in obsolete])
    await store.delete_wal_objects([(o.gateway_id, o.sequence) for o in obsolete])
    await store.wal_objects()
    await objects.list("wal/1/")
    return len(obsolete)


async def one_run(work: Path, count: int, segments: int, catch_up_s: float, per_s: float
                  ) -> dict[str, float]:
    store = KVClusterStore(EmbeddedKV(work / "coordinator"), "bench")
    objects = FileObjectStore(work / "objects")
    try:
        info = await store.create_topic("wal-collection", PARTITIONS, 1, {},
                                        {p: PartitionState(1, 0, (1,), (1,)) for p in range(PARTITIONS)})
        committer = Committer(store, info.topic_id, 0, 0)
        payload = b"\0" * OBJECT_BYTES
        for _ in range(count):
            obj = committer.next_object()
            await objects.put(obj.key, payload)
            await store.commit_wal(obj, committer.epochs)
        sealed_end = committer.offset
        for p in range(PARTITIONS):
            step = max(1, sealed_end // segments)
            for base in range(0, sealed_end, step):
                last = min(base + step, sealed_end) - 1
                await store.commit_segment(info.topic_id, p, SegmentEntry(
                    base, last, f"segments/{p}/{base:020d}", 1000, 1, 2, 0, {}), 0)

        await store.wal_objects()  # known before the run: what follows is a minute's news

        async def measured(pass_too: bool) -> tuple[list[float], float, float]:
            done = asyncio.Event()
            stall = asyncio.create_task(longest_stall(done))
            ticks = asyncio.create_task(catch_up(store, catch_up_s, done)) if catch_up_s else None
            commits = asyncio.create_task(committer.run(done, 60.0 if pass_too else 5.0, per_s))
            took = 0.0
            await asyncio.sleep(0.05)  # both tasks under way before the pass starts
            if pass_too:
                start = time.perf_counter()
                await collect(store, objects)
                took = time.perf_counter() - start
                done.set()
            latencies = await commits
            done.set()
            if ticks is not None:
                await ticks
            return latencies, await stall, took

        alone, alone_stall, _ = await measured(False)
        during, during_stall, took = await measured(True)
        return {"alone p50": _ms(statistics.median(alone)), "alone p99": _ms(_p99(alone)),
                "alone max": _ms(max(alone)), "alone stall": _ms(alone_stall),
                "during p50": _ms(statistics.median(during)), "during p99": _ms(_p99(during)),
                "during max": _ms(max(during)), "during stall": _ms(during_stall),
                "pass s": took, "commits during": len(during)}
    finally:
        await store.close()
        await objects.close()


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def _ms(seconds: float) -> float:
    return seconds * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--objects", type=int, default=4000, help="WAL objects the pass collects")
    ap.add_argument("--segments", type=int, default=200, help="sealed segments per partition")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--commits-per-s", type=float, default=400.0,
                    help="WAL commits a second beside the pass (a gateway's flushes)")
    ap.add_argument("--catch-up-ms", type=float, default=250.0,
                    help="how often the log index reads what changed, as a gateway's maintenance "
                         "tick has it do (0: only when a call needs it)")
    args = ap.parse_args()
    if args.objects < 1 or args.segments < 1 or args.runs < 1 or args.catch_up_ms < 0 \
            or args.commits_per_s <= 0:
        ap.error("--objects, --segments and --runs must be at least 1, --catch-up-ms not "
                 "negative, --commits-per-s positive")
    print(f"{args.objects} WAL objects of {PARTITIONS} ranges, {args.segments} segments a partition, "
          f"{args.commits_per_s:g} commits a second, index caught up every {args.catch_up_ms:g} ms; "
          "WAL commit latency in ms, alone | while one collection pass runs")
    for run in range(1, args.runs + 1):
        work = Path(tempfile.mkdtemp(prefix="stratalog-wal-collection-"))
        try:
            # Full garbage collections as a gateway runs them (gateway.gc_schedule): none
            # of Python's own within a run, so the stalls measured are the pass's.
            with FullCollections({}):
                r = asyncio.run(one_run(work, args.objects, args.segments, args.catch_up_ms / 1000,
                                        args.commits_per_s))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        print(f"run {run}: alone p50 {r['alone p50']:.2f} p99 {r['alone p99']:.2f} max {r['alone max']:.1f}, "
              f"loop stall {r['alone stall']:.1f} | during p50 {r['during p50']:.2f} p99 {r['during p99']:.2f} "
              f"max {r['during max']:.1f}, loop stall {r['during stall']:.1f}; "
              f"pass {r['pass s']:.2f} s, {r['commits during']:.0f} commits beside it", flush=True)


if __name__ == "__main__":
    main()
