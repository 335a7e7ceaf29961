"""Where a produce request spends its time, step by step, in process and without sockets:
decoding the frame, the append (validation, offsets, local segment, WAL buffer), the WAL
flush and commit that `acks=all` waits for, and encoding the answer; likewise for a fetch of
recent data. Then the whole gateway over a socket: server CPU per pipelined produce request
from a raw client, read from /proc, beside the sum of the steps.

    .venv/bin/python bench/request_cost.py [--requests 20000] [--records 1]

Prints microseconds per step; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path

from stratalog.coordinator.embedded import EmbeddedKV
from stratalog.coordinator.model import PartitionState
from stratalog.coordinator.store import KVClusterStore
from stratalog.engine import Assignment, EngineSettings, LogEngine
from stratalog.gateway.config import BrokerConfig
from stratalog.gateway.handlers import load_handlers
from stratalog.gateway.handlers.registry import ApiKey, supported_versions
from stratalog.gateway.protocol.frames import decode_request, encode_request, encode_response_parts
from stratalog.infra.processes import Child, accepting, free_port, serve_command
from stratalog.tiering.batch import build_batch
from stratalog.tiering.objectstore import open_store

RECORD = 1024
PARTITIONS = 8


def produce_body(batch: bytes, partition: int) -> dict:
    return {"transactional_id": None, "acks": -1, "timeout_ms": 30000,
            "topic_data": [{"name": "bench", "partition_data": [{"index": partition, "records": batch}]}]}


def timed(n: int, step) -> float:
    """Microseconds per call of step(i)."""
    start = time.perf_counter()
    for i in range(n):
        step(i)
    return (time.perf_counter() - start) / n * 1e6


async def in_process(n: int, records: int) -> list[tuple[str, float]]:
    load_handlers()
    work = Path(tempfile.mkdtemp(prefix="stratalog-cost-"))
    store = KVClusterStore(EmbeddedKV(work / "coordinator"), "bench")
    objects = open_store((work / "objects").as_uri())
    config = BrokerConfig()
    info = await store.create_topic("bench", PARTITIONS, 1, {},
                                    {p: PartitionState(1, 0, (1,), (1,)) for p in range(PARTITIONS)})
    engine = LogEngine(EngineSettings(wal_flush_ms=0, wal_flush_bytes=8 << 20, upload_slots=2),
                       node_id=1, data_dir=work / "data", store=store, objects=objects,
                       topic_info=lambda t: info if t == "bench" else None,
                       topic_config=lambda t, name: config.topic_config({}, name))
    await engine.start()
    try:
        tasks = engine.take_leadership([Assignment("bench", info.topic_id, p, 0) for p in range(PARTITIONS)])
        await asyncio.gather(*tasks)
        batch = build_batch([(None, os.urandom(RECORD), [])] * records)
        frames = [encode_request(ApiKey.PRODUCE, 9, i, produce_body(batch, i % PARTITIONS))[4:]
                  for i in range(PARTITIONS)]
        supported = supported_versions()
        rows = [("decode Produce request", timed(n, lambda i: decode_request(frames[i % PARTITIONS], supported)))]
        bodies = [decode_request(f, supported).body for f in frames]
        commits = []

        def append(i: int) -> None:
            records_ = bodies[i % PARTITIONS].topic_data[0].partition_data[0].records
            commits.append(engine.append("bench", i % PARTITIONS, records_, now_ms=int(time.time() * 1000)).commit)

        rows.append(("append (validate, offsets, segment, WAL buffer)", timed(n, append)))
        # The flushes these appends queued: back to back, as under load.
        flush_started = time.perf_counter()
        await asyncio.gather(*commits)
        rows.append(("wait for the WAL flushes of those appends, per request",
                     (time.perf_counter() - flush_started) / n * 1e6))
        # One flush of one request alone: the acks=all latency floor on this store.
        lone = []
        for i in range(50):
            started = time.perf_counter()
            await engine.append("bench", i % PARTITIONS, bodies[0].topic_data[0].partition_data[0].records,
                                now_ms=int(time.time() * 1000)).commit
            lone.append(time.perf_counter() - started)
        lone.sort()
        rows.append(("one lone append's WAL flush + commit (median)", lone[len(lone) // 2] * 1e6))
        answer = {"responses": [{"name": "bench", "partition_responses": [
            {"index": 0, "error_code": 0, "base_offset": 12345, "log_append_time_ms": -1,
             "log_start_offset": 0}]}], "throttle_time_ms": 0}
        rows.append(("encode Produce response", timed(n, lambda i: encode_response_parts(ApiKey.PRODUCE, 9, i, answer))))
        view = engine.leader("bench", 0)
        hw = view.high_watermark

        async def reads() -> float:
            started = time.perf_counter()
            for i in range(n):
                await engine.read(view, (i * 7) % hw, 1024 * 1024)
            return (time.perf_counter() - started) / n * 1e6

        rows.append(("read recent data (local segment, up to 1 MiB)", await reads()))
        return rows
    finally:
        await engine.stop()
        await store.close()
        await objects.close()
        shutil.rmtree(work, ignore_errors=True)


def server_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def pipelined(port: int, n: int, records: int, window: int = 64) -> float:
    """Send n acks=all produce requests on one connection, `window` in flight; seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    batch = build_batch([(None, os.urandom(RECORD), [])] * records)
    frames = [encode_request(ApiKey.PRODUCE, 9, i, produce_body(batch, i % PARTITIONS)) for i in range(n)]
    room = asyncio.Semaphore(window)

    async def answers() -> None:
        for _ in range(n):
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            await reader.readexactly(size)
            room.release()

    started = time.perf_counter()
    done = asyncio.create_task(answers())
    for f in frames:
        await room.acquire()
        writer.write(f)
    await done
    writer.close()
    return time.perf_counter() - started


def over_socket(n: int, records: int) -> tuple[float, float]:
    """(server CPU microseconds per request, requests per second) for a real gateway."""
    from confluent_kafka.admin import AdminClient, NewTopic

    work = Path(tempfile.mkdtemp(prefix="stratalog-cost-"))
    port = free_port()
    child = Child("gateway", serve_command(f"127.0.0.1:{port}", work / "data", "--http", "off"),
                  work / "gateway.log")
    try:
        child.wait_until(lambda: accepting("127.0.0.1", port), 60, "accepting")
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0})
        admin.create_topics([NewTopic("bench", PARTITIONS, 1)])["bench"].result(30)
        del admin
        asyncio.run(pipelined(port, 2000, records))  # warm up
        before = server_cpu_seconds(child.pid)
        secs = asyncio.run(pipelined(port, n, records))
        return (server_cpu_seconds(child.pid) - before) / n * 1e6, n / secs
    finally:
        child.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--records", type=int, default=1, help=f"{RECORD}-byte records per produce request")
    args = ap.parse_args()
    rows = asyncio.run(in_process(args.requests, args.records))
    cpu_us, rate = over_socket(args.requests, args.records)
    steps = sum(v for k, v in rows if not k.startswith(("one lone", "read")))
    width = max(len(k) for k, _ in rows)
    print(f"\nProduce requests of {args.records} x {RECORD}-byte record(s), one partition each, "
          f"{PARTITIONS} partitions, embedded coordinator and file store\n")
    for k, v in rows:
        print(f"{k:<{width}}  {v:8.1f} µs")
    print(f"{'sum of the produce steps':<{width}}  {steps:8.1f} µs")
    print(f"{'gateway over a socket: server CPU per request':<{width}}  {cpu_us:8.1f} µs "
          f"({rate:.0f} requests/s, 64 in flight on one connection)")
    print(f"{'  of which sockets, asyncio and bookkeeping':<{width}}  {max(cpu_us - steps, 0):8.1f} µs")


if __name__ == "__main__":
    sys.exit(main())
