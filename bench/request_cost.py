"""Where a produce request spends its time, step by step, in process and without sockets:
decoding the frame, the append (validation, offsets, local segment, WAL buffer), the WAL
flush and commit that `acks=all` waits for, and encoding the answer; likewise for a fetch of
recent data. Then the whole gateway over a socket: server CPU per pipelined produce request
from a raw client, read from /proc, beside the sum of the steps. Last, a flood: small acks=all
produce requests offered at a fixed rate (`--rate` a second over `--connections`, open loop:
a late answer does not hold the next request back), with the answers a second, their
latency and the server's CPU per request; `--profile FILE` samples the gateway with py-spy
meanwhile and splits its event loop's time by step.

    .venv/bin/python bench/request_cost.py [--requests 20000] [--records 1] [--rate 10000]
        [--profile flood.txt] [--timeline]

Prints microseconds per step (CPU time for the in-process steps); never passes or fails on
time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from common import cpu_seconds
from profile_steps import NO_PY_SPY, Steps, breakdown, py_spy, py_spy_binary
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
PRODUCE_VERSION = 10  # what librdkafka 2.16 sends (flexible, with tagged fields)


def produce_body(batch: bytes, partition: int) -> dict:
    return {"transactional_id": None, "acks": -1, "timeout_ms": 30000,
            "topic_data": [{"name": "bench", "partition_data": [{"index": partition, "records": batch}]}]}


def timed(n: int, step) -> float:
    """CPU microseconds per call of step(i) (CPU time: on a shared machine, wall-clock time
    counts the other processes' turns too)."""
    start = time.process_time()
    for i in range(n):
        step(i)
    return (time.process_time() - start) / n * 1e6


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
        frames = [encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, i, produce_body(batch, i % PARTITIONS))[4:]
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
        rows.append(("encode Produce response", timed(n, lambda i: encode_response_parts(ApiKey.PRODUCE, PRODUCE_VERSION, i, answer))))
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


async def pipelined(port: int, n: int, records: int, window: int = 64) -> float:
    """Send n acks=all produce requests on one connection, `window` in flight; seconds."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    batch = build_batch([(None, os.urandom(RECORD), [])] * records)
    frames = [encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, i, produce_body(batch, i % PARTITIONS)) for i in range(n)]
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


@dataclass
class Flood:
    """What a flood of small requests got: every answer after the warm-up as (second it was
    sent in, latency in seconds), and the gateway's CPU seconds over the whole flood."""

    seconds: float
    answers: list[tuple[float, float]]
    requests: int = 0  # answered, warm-up included
    in_window: int = 0  # answers that arrived during the measured seconds
    server_cpu: float = 0.0
    loop_cpu: float = 0.0  # of it, the event loop's (the main thread's)

    def rate(self) -> float:
        """Answers a second that arrived while the flood was measured."""
        return self.in_window / self.seconds

    def percentile_ms(self, q: float) -> float:
        lat = sorted(latency for _, latency in self.answers)
        return lat[min(int(len(lat) * q), len(lat) - 1)] * 1e3 if lat else float("nan")

    def per_second(self) -> list[tuple[int, float, float]]:
        """(second, p99 ms, max ms) of the answers to the requests sent in each second."""
        by: dict[int, list[float]] = {}
        for at, latency in self.answers:
            by.setdefault(int(at), []).append(latency)
        return [(second, sorted(lat)[int(len(lat) * 0.99)] * 1e3, max(lat) * 1e3) for second, lat in sorted(by.items())]


async def flood(port: int, rate: float, seconds: float, connections: int, records: int,
                warmup: float = 2.0) -> Flood:
    """Offer `rate` acks=all produce requests a second over `connections` for `warmup` +
    `seconds`, open loop (a late answer does not hold the next request back). A request's
    latency runs from its write to its answer's arrival."""
    batch = build_batch([(None, os.urandom(RECORD), [])] * records)
    frames = [encode_request(ApiKey.PRODUCE, PRODUCE_VERSION, 0, produce_body(batch, p)) for p in range(PARTITIONS)]
    result = Flood(seconds, [])
    start = time.perf_counter()
    end = start + warmup + seconds

    async def one(index: int) -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sent_at: dict[int, float] = {}
        share = rate / connections
        done = asyncio.Event()

        async def answers() -> None:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                (correlation,) = struct.unpack(">i", (await reader.readexactly(size))[:4])
                now = time.perf_counter()
                sent = sent_at.pop(correlation)
                result.requests += 1
                if warmup <= now - start < warmup + seconds:
                    result.in_window += 1
                if sent - start >= warmup:
                    result.answers.append((sent - start - warmup, now - sent))
                if done.is_set() and not sent_at:
                    return

        reading = asyncio.create_task(answers())
        sent = 0
        while (now := time.perf_counter()) < end:
            for _ in range(int((now - start) * share) - sent):
                f = bytearray(frames[(sent * connections + index) % PARTITIONS])
                struct.pack_into(">i", f, 8, sent)  # the correlation id, after size, key and version
                sent_at[sent] = now
                writer.write(f)
                sent += 1
            await asyncio.sleep(0.001)
        done.set()
        if sent_at:
            await asyncio.wait_for(reading, 120)
        else:
            reading.cancel()
        writer.close()

    await asyncio.gather(*(one(i) for i in range(connections)))
    return result


# A produced request's steps in the gateway (how samples are given to them: profile_steps).
STEPS: Steps = (
    ("read the frame (socket to bytes)", ("FrameReader.", "RequestMemory.acquire")),
    ("decode the request", ("decode_request", "decode_struct_", "Schema.decode")),
    ("auth, ACL, quota and transaction checks", ("ClientQuotas.", "RequestContext.allowed", "Session.",
                                                  "_TxnCheck.", "_non_transactional_refusal", "LoopTime.")),
    ("partition lookup", ("LogEngine.partition", "LogEngine.leader")),
    ("validate the batch (sizes, CRC-32C, timestamps)", ("LogEngine._validate", "validate_batches", "Batches.",
                                                         "split_batches", "_crc_matches", "require_crc",
                                                         "BatchHeader.parse", "TopicSettings.", "AppendSettings.")),
    ("idempotent sequence checks", ("PartitionLog.check_duplicate", "ProducerTable.")),
    ("assign offsets, write the local segment", ("PartitionLog.append", "ActiveSegment.", "patch_batch", "BatchHeader.with_offsets",
                                                  "_local_write", "Sealer.maybe_roll")),
    ("put it in the WAL buffer", ("WalWriter.add", "WalBuilder.add")),
    ("count it (metrics)", ("GatewayMetrics.",)),
    ("wait for the commit (futures, timeouts, wake-ups)", ("_await_commit", "_when_done", "_settle_waiting",
                                                           "CoarseTimers.", "Deferred.")),
    ("encode the response", ("encode_response_parts", "encode_struct_", "Schema.encode", "_struct_encoder")),
    ("write the answers to the socket", ("StreamWriter.writelines", "StreamWriter.drain", "GatewayServer._send")),
    ("drive WAL flushes (build, upload, commit)", ("WalWriter._run", "WalWriter._flush", "WalBuilder.build_parts")),
    ("handler and server glue", ("produce", "_produce_partition", "LogEngine.append", "GatewayServer.",
                                 "RequestContext", "Queue.")),
)


def over_socket(n: int, records: int, rate: float, seconds: float, connections: int,
                profile: Path | None = None) -> tuple[float, float, Flood]:
    """For a real gateway: server CPU microseconds per request and requests per second of
    pipelined requests, then the `flood` at `rate` (sampled by py-spy into `profile` when
    given)."""
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
        before = cpu_seconds(child.pid)
        secs = asyncio.run(pipelined(port, n, records))
        cpu_us = (cpu_seconds(child.pid) - before) / n * 1e6
        spy = py_spy(child.pid, profile) if profile is not None else None
        try:
            before, loop_before = cpu_seconds(child.pid), cpu_seconds(child.pid, True)
            flooded = asyncio.run(flood(port, rate, seconds, connections, records))
            flooded.server_cpu = cpu_seconds(child.pid) - before
            flooded.loop_cpu = cpu_seconds(child.pid, True) - loop_before
        finally:
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait(60)
        return cpu_us, n / secs, flooded
    finally:
        child.stop()
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--records", type=int, default=1, help=f"{RECORD}-byte records per produce request")
    ap.add_argument("--rate", type=float, default=10000, help="produce requests a second the flood offers")
    ap.add_argument("--seconds", type=float, default=10, help="how long the flood is measured, after 2 s of warm-up")
    ap.add_argument("--connections", type=int, default=8, help="connections the flood is spread over")
    ap.add_argument("--profile", type=Path, help="py-spy's collapsed stacks of the gateway during the flood")
    ap.add_argument("--timeline", action="store_true", help="the flood's p99 and max for each second")
    args = ap.parse_args()
    if args.profile is not None and py_spy_binary() is None:
        ap.error(NO_PY_SPY)
    rows = asyncio.run(in_process(args.requests, args.records))
    cpu_us, rate, flooded = over_socket(args.requests, args.records, args.rate, args.seconds,
                                        args.connections, args.profile)
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
    print(f"\nA flood of {args.rate:.0f} requests/s offered over {args.connections} connections for "
          f"{args.seconds:.0f} s: {flooded.rate():.0f} answered a second, p50 {flooded.percentile_ms(0.5):.1f} ms, "
          f"p99 {flooded.percentile_ms(0.99):.1f} ms, max {flooded.percentile_ms(1):.1f} ms; server CPU "
          f"{flooded.server_cpu / max(flooded.requests, 1) * 1e6:.0f} µs per request")
    if args.profile is not None:
        steps, others = breakdown(args.profile, STEPS)
        loop_us = flooded.loop_cpu / max(flooded.requests, 1) * 1e6
        print(f"\nWhere the event loop's {loop_us:.0f} µs per request went (py-spy samples of the main thread):")
        for step, share in steps:
            print(f"  {step:<52} {share * 100:5.1f}%  {share * loop_us:6.1f} µs")
        print(f"  other threads (WAL file writes and fsyncs, coordinator commits): {others * 100:.0f}% as many "
              f"samples as the event loop")
    if args.timeline:
        for second, p99_ms, worst_ms in flooded.per_second():
            print(f"  second {second:3d}: p99 {p99_ms:7.1f} ms, max {worst_ms:7.1f} ms")


if __name__ == "__main__":
    sys.exit(main())
