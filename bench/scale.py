"""How one gateway's cost grows with partitions and with client connections.

For each partition count: a fresh `stratalog serve` (embedded coordinator, file store), one
topic of that many partitions, then the gateway's RSS, the time to create the topic,
produce throughput spread over every partition (confluent-kafka, acks=all), the latency of a
Metadata request for the topic and of a ListOffsets request for all its partitions, the
coordinator's keys and write transactions per second while producing, and the time from a
restart to every partition being led again. For each connection count: that many client
connections producing small acks=all requests at one fixed total rate, the gateway's RSS and
the p50/p99 latency.

    .venv/bin/python bench/scale.py [--partitions 1,100,1000,10000] [--connections 10,100,1000]

Prints figures; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from common import Proc, http_get
from stratalog.gateway.handlers.registry import ApiKey
from stratalog.gateway.protocol.frames import decode_response, encode_request
from stratalog.infra.processes import accepting, free_port, serve_command
from stratalog.tiering.batch import build_batch

RECORD = 1024
LOOPBACK = "127.0.0.1"
TOPIC = "scale"


class Server:
    """One `stratalog serve` on a data directory that outlives its restarts."""

    def __init__(self, work: Path):
        self.work = work
        self.port = free_port()
        self.http_port = free_port()
        self.proc: Proc | None = None
        self.starts = 0

    def start(self, timeout_s: float = 600) -> float:
        """Start and wait for /readyz; seconds it took."""
        self.starts += 1
        started = time.monotonic()
        self.proc = Proc("gateway", serve_command(f"{LOOPBACK}:{self.port}", self.work / "data",
                                                  "--http", f"{LOOPBACK}:{self.http_port}"),
                         self.work / f"gateway.{self.starts}.log")

        def ready() -> bool:
            got = http_get(f"http://{LOOPBACK}:{self.http_port}/readyz", 0.5)
            return accepting(LOOPBACK, self.port) and got is not None and got[0] == 200

        self.proc.wait_until(ready, timeout_s, "ready")
        return time.monotonic() - started

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop(60)

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def coordinator(self) -> sqlite3.Connection:
        return sqlite3.connect(f"file:{self.work / 'data' / 'coordinator.sqlite3'}?mode=ro",
                               uri=True)

    def keys_and_revision(self) -> tuple[int, int]:
        with self.coordinator() as db:
            keys = db.execute("SELECT count(*) FROM kv").fetchone()[0]
            revision = db.execute("SELECT value FROM meta WHERE name='revision'").fetchone()[0]
        return keys, revision


class Wire:
    """One client connection speaking raw requests, for exact timings."""

    def __init__(self, port: int):
        self.port = port
        self.correlation = 0

    async def __aenter__(self) -> "Wire":
        self.reader, self.writer = await asyncio.open_connection(LOOPBACK, self.port)
        return self

    async def __aexit__(self, *exc) -> None:
        self.writer.close()

    async def call(self, api: ApiKey, version: int, body: dict, *, decode: bool = True):
        """The decoded answer (or its bytes: decoding thousands of partitions in Python here
        would be timed as the gateway's)."""
        self.correlation += 1
        self.writer.write(encode_request(api, version, self.correlation, body))
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        frame = await self.reader.readexactly(size)
        return decode_response(api, version, frame)[1] if decode else frame


async def timed_calls(port: int, api: ApiKey, version: int, body: dict, n: int = 5) -> tuple[float, object]:
    """Median milliseconds of n calls on one connection, and the last answer."""
    async with Wire(port) as wire:
        await wire.call(api, version, body)  # warm up
        times = []
        for _ in range(n):
            started = time.perf_counter()
            await wire.call(api, version, body, decode=False)
            times.append((time.perf_counter() - started) * 1000)
        answer = await wire.call(api, version, body)
    return statistics.median(times), answer


def metadata_body() -> dict:
    return {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False}


def list_offsets_body(partitions: int) -> dict:
    return {"replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [
        {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1} for p in range(partitions)]}]}


async def all_led(port: int, partitions: int) -> bool:
    """Whether ListOffsets answers every partition without an error (every one is led)."""
    try:
        async with Wire(port) as wire:
            answer = await wire.call(ApiKey.LIST_OFFSETS, 5, list_offsets_body(partitions))
    except (OSError, asyncio.IncompleteReadError):
        return False
    return all(p.error_code == 0 for t in answer.topics for p in t.partitions)


def create_topic(port: int, partitions: int) -> float:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": f"{LOOPBACK}:{port}", "log_level": 0})
    started = time.monotonic()
    admin.create_topics([NewTopic(TOPIC, partitions, 1)], request_timeout=600)[TOPIC].result(600)
    while not asyncio.run(all_led(port, partitions)):
        time.sleep(0.1)
    return time.monotonic() - started


def produce(port: int, partitions: int, mib: int) -> float:
    """MiB/s of one producer spreading records over every partition."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": f"{LOOPBACK}:{port}", "linger.ms": 5, "batch.size": 1024 * 1024,
                  "acks": "all", "queue.buffering.max.kbytes": 262144, "log_level": 0})
    payload = os.urandom(RECORD)
    n = mib * 1024 * 1024 // RECORD
    failed = []
    started = time.perf_counter()
    for i in range(n):
        while True:
            try:
                p.produce(TOPIC, payload, partition=i % partitions, on_delivery=lambda e, m: e and failed.append(e))
                break
            except BufferError:
                p.poll(0.01)
    p.flush(600)
    secs = time.perf_counter() - started
    if failed:
        print(f"  ({len(failed)} deliveries failed: {failed[0]})")
    return mib / secs


def partitions_row(partitions: int, mib: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="stratalog-scale-"))
    server = Server(work)
    try:
        server.start()
        row: dict = {"partitions": partitions, "idle RSS MB": server.rss_mb()}
        row["create s"] = create_topic(server.port, partitions)
        keys0, rev0 = server.keys_and_revision()
        started = time.monotonic()
        row["produce MiB/s"] = produce(server.port, partitions, mib)
        keys1, rev1 = server.keys_and_revision()
        row["coordinator txn/s"] = (rev1 - rev0) / (time.monotonic() - started)
        row["coordinator keys"] = keys1
        row["RSS MB"] = server.rss_mb()
        row["Metadata ms"], _ = asyncio.run(timed_calls(server.port, ApiKey.METADATA, 9, metadata_body()))
        row["ListOffsets ms"], _ = asyncio.run(timed_calls(server.port, ApiKey.LIST_OFFSETS, 5,
                                                           list_offsets_body(partitions)))
        server.stop()
        restart = time.monotonic()
        server.start()
        while not asyncio.run(all_led(server.port, partitions)):
            time.sleep(0.1)
        row["restart s"] = time.monotonic() - restart
        row["RSS after restart MB"] = server.rss_mb()
        return row
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


async def connection_load(port: int, connections: int, rate: float, seconds: float) -> list[float]:
    """`connections` connections sending one-record acks=all produce requests, `rate` a
    second in total, spread evenly; latencies in ms."""
    batch = build_batch([(None, os.urandom(RECORD), [])])
    latencies: list[float] = []
    per_conn = rate / connections

    async def one(i: int) -> None:
        async with Wire(port) as wire:
            await asyncio.sleep(i / rate)  # spread the connections' phases
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                started = time.perf_counter()
                await wire.call(ApiKey.PRODUCE, 9, {
                    "transactional_id": None, "acks": -1, "timeout_ms": 30000,
                    "topic_data": [{"name": TOPIC, "partition_data": [{"index": i % 8, "records": batch}]}]})
                took = time.perf_counter() - started
                latencies.append(took * 1000)
                await asyncio.sleep(max(0.0, 1 / per_conn - took))

    await asyncio.gather(*(one(i) for i in range(connections)))
    return latencies


def connections_row(connections: int, rate: float, seconds: float) -> dict:
    work = Path(tempfile.mkdtemp(prefix="stratalog-scale-"))
    server = Server(work)
    try:
        server.start()
        create_topic(server.port, 8)
        idle = server.rss_mb()
        latencies = sorted(asyncio.run(connection_load(server.port, connections, rate, seconds)))
        return {"connections": connections, "idle RSS MB": idle, "RSS MB": server.rss_mb(),
                "requests/s": len(latencies) / seconds,
                "p50 ms": latencies[len(latencies) // 2], "p99 ms": latencies[int(len(latencies) * 0.99)]}
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


def table(rows: list[dict]) -> None:
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("| " + " | ".join("---" for _ in keys) + " |")
    for r in rows:
        print("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    print(flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", default="1,100,1000,10000")
    ap.add_argument("--connections", default="10,100,1000")
    ap.add_argument("--mib", type=int, default=128, help="MiB produced in each partition run")
    ap.add_argument("--rate", type=float, default=1000, help="produce requests a second in the connection runs")
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    rows = []
    for n in [int(x) for x in args.partitions.split(",") if x]:
        rows.append(partitions_row(n, args.mib))
        print(f"partitions {n}: {rows[-1]}", file=sys.stderr, flush=True)
    if rows:
        print(f"\nOne gateway, embedded coordinator, file store; {args.mib} MiB of {RECORD}-byte records "
              "spread over all partitions (confluent-kafka, acks=all, linger.ms=5)\n")
        table(rows)
    rows = []
    for n in [int(x) for x in args.connections.split(",") if x]:
        rows.append(connections_row(n, args.rate, args.seconds))
        print(f"connections {n}: {rows[-1]}", file=sys.stderr, flush=True)
    if rows:
        print(f"\nOne gateway; {args.rate:.0f} one-record acks=all produce requests a second in total, "
              f"spread over the connections, for {args.seconds:.0f} s\n")
        table(rows)


if __name__ == "__main__":
    main()
