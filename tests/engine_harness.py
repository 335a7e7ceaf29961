"""In-process `LogEngine` tests: a real coordinator and a real object store per backend
pair, a fake wall clock, topics led by node 1, and helpers to append and read back.

`Backends` says where one test's metadata and objects live and opens fresh clients to them
(a restarted gateway opens its own); `Harness` owns every client and engine it made and
closes them all, so `run` can check that nothing was left running.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from pathlib import Path
from typing import Any, Awaitable, Callable

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.model import PartitionState, TopicInfo
from stratalog.coordinator.store import KVClusterStore
from stratalog.engine import Assignment, EngineSettings, LogEngine
from stratalog.gateway.config import BrokerConfig
from stratalog.tiering.batch import BatchHeader, Record, build_batch, decode_records, scan_batches
from stratalog.tiering.objectstore import ObjectNotFound, ObjectStore, open_store

WALL_START_MS = 1_700_000_000_000
TIMEOUT_S = 30.0  # generous: only ever reached when something is broken


class FakeClock:
    """The engine's wall clock: timestamps, segment.ms, retention. Kept in whole
    milliseconds, so advancing it never accumulates float error."""

    def __init__(self, start_ms: int = WALL_START_MS):
        self.ms = start_ms

    def __call__(self) -> float:
        # Seconds at the middle of the millisecond: int(seconds * 1000) is exactly self.ms.
        return (self.ms + 0.5) / 1000

    def advance(self, ms: int) -> None:
        self.ms += ms


class Backends:
    """One coordinator and one object store location: embedded SQLite + file:// under
    tmp_path, or a namespaced cluster on a real etcd + a fresh bucket on moto's S3."""

    def __init__(self, kind: str, tmp_path: Path, *, etcd_endpoint=None, s3_endpoint: str | None = None,
                 bucket: str | None = None):
        self.kind = kind
        self.tmp_path = tmp_path
        self.etcd_endpoint = etcd_endpoint
        self.s3_endpoint = s3_endpoint
        self.bucket = bucket
        self.cluster = f"engine-{uuid.uuid4().hex[:12]}"

    def open_coordinator(self) -> KVClusterStore:
        if self.etcd_endpoint is None:
            return KVClusterStore(EmbeddedKV(self.tmp_path / "coordinator"), self.cluster)
        from stratalog.coordinator.etcd import EtcdKV
        return KVClusterStore(EtcdKV([self.etcd_endpoint]), self.cluster)

    def open_objects(self) -> ObjectStore:
        if self.s3_endpoint is None:
            return open_store((self.tmp_path / "objects").as_uri())
        return open_store(f"s3://{self.bucket}/{self.cluster}", endpoint_url=self.s3_endpoint,
                          region="us-east-1")


class Harness:
    """Topics, engines and the clients under them, for one test."""

    def __init__(self, backends: Backends, clock: FakeClock):
        self.backends = backends
        self.clock = clock
        self.store = backends.open_coordinator()
        self.objects = backends.open_objects()
        self.config = BrokerConfig()
        self.topics: dict[str, TopicInfo] = {}
        self.engines: list[LogEngine] = []
        self._data_dirs = 0

    # ---- topics and leadership ---------------------------------------------------------

    def topic_config(self, topic: str, name: str) -> Any:
        info = self.topics.get(topic)
        return self.config.topic_config(info.configs if info else {}, name)

    async def create_topic(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None,
                           *, leader: int = 1, epoch: int = 0) -> TopicInfo:
        """A topic whose every partition `leader` leads at `epoch` (as the controller would
        have placed it)."""
        states = {p: PartitionState(leader, epoch, (leader,), (leader,)) for p in range(partitions)}
        info = await self.store.create_topic(name, partitions, 1, dict(configs or {}), states)
        self.topics[name] = info
        return info

    async def move_leadership(self, topic: str, partition: int, *, leader: int) -> int:
        """What the controller does on reassignment: a new leader (or the same one again)
        at epoch + 1. Returns the new epoch."""
        tid = self.topics[topic].topic_id
        old = (await self.store.partition_states(tid))[partition]
        epoch = old.leader_epoch + 1
        await self.store.set_partition_state(tid, partition, PartitionState(leader, epoch, (leader,), (leader,)),
                                             expect_epoch=old.leader_epoch)
        return epoch

    async def assignments(self, node_id: int) -> list[Assignment]:
        """The partitions the coordinator says `node_id` leads."""
        out = []
        for info in self.topics.values():
            for p, st in sorted((await self.store.partition_states(info.topic_id)).items()):
                if st.leader == node_id:
                    out.append(Assignment(info.name, info.topic_id, p, st.leader_epoch))
        return out

    async def lead(self, engine: LogEngine) -> None:
        """Take every partition the coordinator gives this engine's node; wait for recovery."""
        tasks = engine.take_leadership(await self.assignments(engine.node_id))
        if tasks:
            await asyncio.wait_for(asyncio.gather(*tasks), TIMEOUT_S)

    # ---- engines -----------------------------------------------------------------------

    def settings(self, **overrides) -> EngineSettings:
        # By default every append flushes at once (the buffer is over 1 byte): tests that
        # want batching say so. wal_flush_ms is never what makes a flush happen here.
        values = {"wal_flush_ms": 60_000, "wal_flush_bytes": 1, "upload_slots": 2}
        values.update(overrides)
        return EngineSettings(**values)

    async def start_engine(self, node_id: int = 1, data_dir: Path | None = None, *,
                           objects: ObjectStore | None = None, store: KVClusterStore | None = None,
                           **settings) -> LogEngine:
        """A started engine over this harness's clients (or `objects` and `store`, wrappers
        of them)."""
        if data_dir is None:
            self._data_dirs += 1
            data_dir = self.backends.tmp_path / f"node{node_id}-{self._data_dirs}"
        engine = LogEngine(self.settings(**settings), node_id=node_id, data_dir=data_dir,
                           store=store or self.store, objects=objects or self.objects, topic_info=self.topics.get,
                           topic_config=self.topic_config, clock=self.clock)
        self.engines.append(engine)
        await engine.start()
        return engine

    async def stop_engine(self, engine: LogEngine) -> None:
        self.engines.remove(engine)
        await asyncio.wait_for(engine.stop(), TIMEOUT_S)

    async def reopen_clients(self) -> None:
        """Close the coordinator and object store clients and open new ones on the same
        data, as a restarted process would (no engine may be running)."""
        assert not self.engines, "stop the engines first"
        await self.store.close()
        await self.objects.close()
        self.store = self.backends.open_coordinator()
        self.objects = self.backends.open_objects()

    async def close(self) -> None:
        try:
            for engine in list(self.engines):
                await self.stop_engine(engine)
        finally:
            await self.store.close()
            await self.objects.close()

    # ---- store inspection --------------------------------------------------------------

    async def exists(self, key: str) -> bool:
        try:
            await self.objects.size(key)
            return True
        except ObjectNotFound:
            return False

    async def keys(self, prefix: str) -> list[str]:
        return sorted(o.key for o in await self.objects.list(prefix))


class HeldUploads:
    """An object store whose puts of keys matching `hold` store the object and then do not
    return until `release()`: an upload that is in the store but not yet committed."""

    def __init__(self, inner: ObjectStore, hold: Callable[[str], bool]):
        self.inner = inner
        self.hold = hold
        self.held: list[str] = []
        self._released = asyncio.Event()

    async def put(self, key: str, data) -> None:
        await self.inner.put(key, data)
        await self._wait(key)

    async def put_file(self, key: str, path: Path) -> None:
        await self.inner.put_file(key, path)
        await self._wait(key)

    async def _wait(self, key: str) -> None:
        if self.hold(key) and not self._released.is_set():
            self.held.append(key)
            await self._released.wait()

    def release(self) -> None:
        self._released.set()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def run(backends: Backends, body: Callable[[Harness], Awaitable[Any]]) -> Any:
    """Run `body(harness)` in a fresh event loop; afterwards every engine is stopped, every
    client closed, and no task of theirs is left running."""

    async def main():
        h = Harness(backends, FakeClock())
        try:
            return await body(h)
        finally:
            await h.close()
            await asyncio.sleep(0)  # let cancelled tasks finish unwinding
            leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task() and not t.done()]
            assert not leftover, f"tasks left running: {leftover}"

    return asyncio.run(main())


# ---- batches ---------------------------------------------------------------------------

def batch(n: int = 1, *, ts: int, tag: str = "r", value_size: int = 16, producer: tuple[int, int] | None = None,
          sequence: int = -1, headers: bool = True) -> bytes:
    """A batch of `n` records with keys, values and (optionally) headers, all timestamped
    `ts`; `producer` is (producer id, epoch) with `sequence` its base sequence."""
    records = [(f"{tag}-k{i}".encode(), f"{tag}-v{i}-".encode().ljust(value_size, b"."),
                [("h", f"{tag}{i}".encode()), ("null", None)] if headers else [])
               for i in range(n)]
    pid, epoch = producer if producer is not None else (-1, -1)
    return build_batch(records, timestamp_ms=ts, producer_id=pid, producer_epoch=epoch,
                       base_sequence=sequence)


def batches_of(data: bytes) -> list[tuple[BatchHeader, bytes]]:
    found, valid = scan_batches(data, validate_crc=True)
    assert valid == len(data), f"{len(data) - valid} trailing bytes are not whole batches"
    return [(h, bytes(data[pos:pos + h.size])) for pos, h in found]


def records_of(data: bytes) -> list[tuple]:
    """(offset, timestamp, key, value, headers) of every record in whole batches."""
    out = []
    for _, raw in batches_of(data):
        out.extend(_fields(r) for r in decode_records(memoryview(raw)))
    return out


def _fields(r: Record) -> tuple:
    return (r.offset, r.timestamp, r.key, r.value, tuple(r.headers))


def assert_stored(original: bytes, stored: bytes, base_offset: int, leader_epoch: int) -> None:
    """`stored` is `original` byte for byte, except the base offset and leader epoch the
    leader patched in (both lie outside the CRC)."""
    assert len(stored) == len(original)
    assert struct.unpack_from(">q", stored, 0)[0] == base_offset
    assert struct.unpack_from(">i", stored, 12)[0] == leader_epoch
    assert stored[8:12] == original[8:12] and stored[16:] == original[16:]


async def read_all(engine: LogEngine, topic: str, partition: int, start: int | None = None) -> bytes:
    """Every committed batch from `start` (default: the log start) up to the high watermark."""
    plog = engine.leader(topic, partition)
    offset = plog.log_start_offset if start is None else start
    out = bytearray()
    while offset < plog.high_watermark:
        data = await engine.read(plog, offset, 64 * 1024)
        assert data, f"nothing to read at {offset} below the high watermark {plog.high_watermark}"
        out += data
        offset = batches_of(data)[-1][0].last_offset + 1
    return bytes(out)


async def committed(result, timeout: float = TIMEOUT_S) -> None:
    """Wait for an append's WAL commit."""
    if result.commit is not None:
        await asyncio.wait_for(result.commit, timeout)


async def eventually(check: Callable[[], Any], what: str, timeout: float = TIMEOUT_S) -> Any:
    """Poll `check` (a function, or a coroutine function) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)
