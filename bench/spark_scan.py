"""Spark scan of sealed segments, by the Python reader (`format("stratalog")`) and the JVM
reader (`format("stratalog-jvm")`), side by side in one run with a Kafka consumer reading
the same topic through a gateway and with Spark reading the same records from Parquet;
plus compaction throughput.

    .venv/bin/python bench/spark_scan.py [--gib 1.0] [--record-bytes 1024] [--partitions 4]
                                         [--codec none] [--compact-gib 0.25] [--master local[*]]

One gateway (embedded coordinator, file store) is started on loopback; the topic is
produced with confluent-kafka and the benchmark waits until every record is in a sealed
segment. Figures count segment bytes (the `.log` objects) and records; each scan computes
the same aggregate (count, total key and value bytes, max offset) so every row is decoded.
Prints a table; never passes or fails on time.

`--breakdown` also times, on the driver and in one process, each step an executor takes
for the same slices (object reads, CRC, decompression, the record walk, column decoding,
Arrow batches), and times Spark over a stand-in source that hands the JVM the same Arrow
batches from memory: what is left of the scan is the hand-over and Spark's own work.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from produce_fetch import CONSUME_WAIT_S, free_port, wait_port  # noqa: E402

MiB = 1024 * 1024


def start_gateway(data_dir: Path, segment_bytes: int) -> tuple[subprocess.Popen, str, str]:
    port = free_port()
    cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--listen", f"127.0.0.1:{port}",
           "--data-dir", str(data_dir), "--http", "127.0.0.1:0",
           "--set", f"log.segment.bytes={segment_bytes}", "--set", "log.roll.ms=2000"]
    log = open(data_dir.parent / "gateway.log", "ab")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=log)
    banner = proc.stdout.readline().decode()
    if "serving Kafka" not in banner:
        proc.kill()
        raise SystemExit(f"gateway did not start: {banner!r} (see {data_dir.parent / 'gateway.log'})")
    wait_port(port)
    http = "http://" + banner.rsplit("http on ", 1)[1].strip() if "http on " in banner else ""
    return proc, f"127.0.0.1:{port}", http


def produce(bootstrap: str, topic: str, partitions: int, total_bytes: int, record_bytes: int,
            codec: str, keys: int | None = None, configs: dict | None = None) -> int:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, partitions, 1, config=configs or {})]).values():
        f.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 20,
                         "batch.size": 1 << 20, "acks": "1", "queue.buffering.max.kbytes": 512 * 1024})
    count = max(1, total_bytes // record_bytes)
    # Distinct values (slices of random hex), so Parquet's dictionaries cannot fold them.
    pool = os.urandom(4 * MiB).hex().encode()
    span = len(pool) - record_bytes
    for i in range(count):
        key = b"key-%d" % (i % keys if keys else i)
        start = (i * 4099) % span
        while True:
            try:
                producer.produce(topic, key=key, value=pool[start:start + record_bytes],
                                 partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(600):
        raise SystemExit("producer could not deliver everything")
    return count


def sealed(spec, topic: str, ends: dict[int, int], timeout_s: float = 600) -> int:
    """Wait until every record is sealed; returns the total size of the `.log` objects."""
    from stratalog.spark.metadata import ManifestMetadata

    meta = ManifestMetadata(spec.open(), topic)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            parts = meta.snapshot().partitions
            if all(p in parts and parts[p].sealed_end >= end for p, end in ends.items() if end):
                return sum(s.size for p in parts.values() for s in p.segments)
        except LookupError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"{topic} did not seal within {timeout_s}s")


def produced_ends(count: int, partitions: int) -> dict[int, int]:
    """End offset of each partition after `produce` sent record i to partition i % partitions."""
    return {p: count // partitions + (1 if p < count % partitions else 0) for p in range(partitions)}


def kafka_scan(bootstrap: str, topic: str, ends: dict[int, int]) -> tuple[float, int, int]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{time.time()}",
                  "enable.auto.commit": False, "fetch.max.bytes": 64 * MiB,
                  "max.partition.fetch.bytes": 16 * MiB, "queued.max.messages.kbytes": 256 * 1024})
    started = time.perf_counter()
    records = payload = 0
    todo = {p for p, e in ends.items() if e}
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
    try:
        while todo:
            for msg in c.consume(10_000, CONSUME_WAIT_S):
                if msg.error():
                    raise SystemExit(f"consumer error: {msg.error()}")
                records += 1
                payload += len(msg.value() or b"") + len(msg.key() or b"")
                if msg.offset() + 1 >= ends[msg.partition()]:
                    todo.discard(msg.partition())
    finally:
        c.close()
    return time.perf_counter() - started, records, payload


def spark_aggregate(df):
    from pyspark.sql import functions as F

    started = time.perf_counter()
    row = df.agg(F.count(F.lit(1)).alias("n"),
                 F.sum(F.length("value") + F.coalesce(F.length("key"), F.lit(0))).alias("bytes"),
                 F.max("offset").alias("last")).collect()[0]
    return time.perf_counter() - started, row["n"], row["bytes"]


def _nth(run_no: int, args) -> str:
    return f", run {run_no + 1}" if args.repeat > 1 else ""


def print_table(rows, args) -> None:
    print(f"{'scan':48} {'seconds':>9} {'records':>11} {'MB/s':>9} {'records/s':>12}")
    for name, secs, n, nbytes in rows:
        print(f"{name:48} {secs:9.2f} {n:11d} {nbytes / 1e6 / secs:9.1f} {n / secs:12.0f}")
    print(f"(MB/s counts segment bytes read or rewritten; master {args.master}, codec {args.codec}, "
          f"{args.record_bytes}-byte records, {args.partitions} partitions)")


def breakdown(spark, spec, seg_bytes: int) -> list[tuple[str, float, int, int]]:
    """Each step of the executors' read, timed in this process over the scan's slices, and
    Spark over the same Arrow batches from memory (one run each; the steps are run one
    after another, so each includes the work of none of the others)."""
    from stratalog.spark import columns, reading
    from stratalog.spark.datasource import StratalogReader
    from stratalog.tiering import compression as codecs
    from stratalog.tiering.batch import HEADER_SIZE, crc_matches
    from stratalog.tiering.sealed import read_sync

    slices = StratalogReader({"topic": "scan", "path": spec.url}).partitions()
    store = spec.open()
    steps: dict[str, float] = {}

    def timed(name, fn):
        started = time.perf_counter()
        value = fn()
        steps[name] = steps.get(name, 0.0) + time.perf_counter() - started
        return value

    records = 0
    arrow = []
    for s in slices:
        batches = timed("object reads and batch headers",
                        lambda: list(read_sync(reading._walk(s), reading.getter(store))))
        timed("CRC-32C", lambda: [crc_matches(b.data, b.header) for b in batches])
        plain = timed("decompression", lambda: [
            b.data[HEADER_SIZE:] if not b.header.compression  # read in place, as the reader does
            else codecs.decompress(b.header.compression, b.data[HEADER_SIZE:]) for b in batches])
        timed("record walk (length varints, Python)",
              lambda: [columns._record_starts(p, b.header.records_count) for p, b in zip(plain, batches)])
        out = timed("whole read (all of the above + columns + Arrow)",
                    lambda: list(reading.records_of(s, iter(batches), "scan")))
        records += sum(b.num_rows for b in out)
        arrow.append(out)
    rows = [(f"  in process: {name}", secs, records, seg_bytes) for name, secs in steps.items()]
    rows.append(("  spark over the same Arrow batches", _replay(spark, arrow), records, seg_bytes))
    return rows


def _replay(spark, arrow: list[list]) -> float:
    """Spark's time for the scan's aggregate over a source whose partitions yield the given
    Arrow batches from memory: the JVM hand-over and Spark's own work, no reading."""
    import pickle

    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from stratalog.spark.schema import SPARK_SCHEMA

    held = Path(tempfile.mkdtemp(prefix="stratalog-replay-"))
    for i, batches in enumerate(arrow):
        (held / f"{i}.pickle").write_bytes(pickle.dumps(batches))
    count = len(arrow)  # the reader is pickled to every task: it must not hold the batches

    class Replay(DataSource):
        @classmethod
        def name(cls):
            return "stratalog_replay"

        def schema(self):
            return SPARK_SCHEMA

        def reader(self, schema):
            return ReplayReader()

    class ReplayReader(DataSourceReader):
        def partitions(self):
            return [InputPartition(i) for i in range(count)]

        def read(self, partition):
            yield from pickle.loads((held / f"{partition.value}.pickle").read_bytes())

    spark.dataSource.register(Replay)
    try:
        spark_aggregate(spark.read.format("stratalog_replay").load())  # the workers import pyarrow once
        return spark_aggregate(spark.read.format("stratalog_replay").load())[0]
    finally:
        shutil.rmtree(held, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="GiB of records to scan (default 1)")
    ap.add_argument("--record-bytes", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--compact-gib", type=float, default=None,
                    help="GiB for the compaction run (default a quarter of --gib)")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    ap.add_argument("--breakdown", action="store_true", help="time each step of the scan (see above)")
    ap.add_argument("--no-kafka", action="store_true", help="skip the consumer and Parquet scans")
    ap.add_argument("--no-compact", action="store_true", help="skip the compaction run")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each Spark scan this many times, one row each (the JVM's JIT "
                         "compiles the readers during the first)")
    ap.add_argument("--no-jvm", action="store_true",
                    help='skip the JVM reader (format("stratalog-jvm"), whose jar needs a JDK)')
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the benchmark's session (repeatable)")
    args = ap.parse_args()
    extra_conf = dict(c.split("=", 1) for c in args.conf if "=" in c)
    if len(extra_conf) != len(args.conf):
        ap.error("--conf takes KEY=VALUE")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from stratalog.spark.compaction import compact
    from stratalog.spark.objects import StoreSpec
    from stratalog.spark.session import get_session

    run = Path(tempfile.mkdtemp(prefix="stratalog-spark-bench-"))
    data = run / "data"
    data.mkdir()
    proc, bootstrap, http = start_gateway(data, 64 * MiB)
    rows = []
    try:
        spec = StoreSpec((data / "objects").as_uri())
        total = int(args.gib * 1024 * MiB)
        t0 = time.perf_counter()
        count = produce(bootstrap, "scan", args.partitions, total, args.record_bytes, args.codec)
        ends = produced_ends(count, args.partitions)  # acks=1: the watermark may still trail
        seg_bytes = sealed(spec, "scan", ends)
        print(f"produced {count} records ({seg_bytes / MiB:.0f} MiB of segments) in "
              f"{time.perf_counter() - t0:.1f}s", file=sys.stderr)

        spark = get_session(args.master, app_name="stratalog-bench", jvm=not args.no_jvm,
                            conf={"spark.driver.memory": "4g", "spark.sql.shuffle.partitions": "8",
                                  "spark.ui.showConsoleProgress": "false", **extra_conf})
        reader = spark.read.format("stratalog").option("topic", "scan")
        # Warm up the JVM and the Python workers on a sliver, so the timed scans compare
        # reading, not start-up.
        sliver = json.dumps({"scan": {str(p): min(e, 2000) for p, e in ends.items()}})
        spark_aggregate(reader.option("endingOffsets", sliver).load(spec.url))
        reader = spark.read.format("stratalog").option("topic", "scan")
        for run_no in range(args.repeat):
            secs, n, payload = spark_aggregate(reader.load(spec.url))
            rows.append((f"spark: stratalog segments{_nth(run_no, args)}", secs, n, seg_bytes))
        if not args.no_jvm:
            jvm = spark.read.format("stratalog-jvm").option("topic", "scan")
            spark_aggregate(jvm.option("endingOffsets", sliver).load(spec.url))
            jvm = spark.read.format("stratalog-jvm").option("topic", "scan")
            for run_no in range(args.repeat):
                secs, n4, _ = spark_aggregate(jvm.load(spec.url))
                rows.append((f"spark: JVM reader{_nth(run_no, args)}", secs, n4, seg_bytes))
                if n4 != n:
                    print(f"warning: the JVM reader counted {n4} records, the Python one {n}", file=sys.stderr)

        if args.breakdown:
            rows += breakdown(spark, spec, seg_bytes)
        if not args.no_kafka:
            secs, n2, _ = kafka_scan(bootstrap, "scan", ends)
            rows.append(("kafka consumer via gateway", secs, n2, seg_bytes))

            parquet = run / "scan.parquet"
            reader.load(spec.url).write.parquet(str(parquet))
            parquet_bytes = sum(f.stat().st_size for f in parquet.rglob("*.parquet"))
            spark_aggregate(spark.read.parquet(str(parquet)).limit(1000))
            for run_no in range(args.repeat):
                secs, n3, _ = spark_aggregate(spark.read.parquet(str(parquet)))
                rows.append((f"spark: parquet ({parquet_bytes / MiB:.0f} MiB){_nth(run_no, args)}",
                             secs, n3, seg_bytes))
            if not n == n2 == n3 == count:
                print(f"warning: record counts differ: {n}, {n2}, {n3}, produced {count}", file=sys.stderr)
        if args.no_compact:
            return

        compact_total = int((args.compact_gib if args.compact_gib is not None else args.gib / 4) * 1024 * MiB)
        keys = max(1, compact_total // args.record_bytes // 10)  # ten versions of every key
        configs = {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"}
        ccount = produce(bootstrap, "compacted", args.partitions, compact_total, args.record_bytes,
                         args.codec, keys=keys, configs=configs)
        cbytes = sealed(spec, "compacted", produced_ends(ccount, args.partitions))
        t0 = time.perf_counter()
        report = compact(spark, spec.url, "compacted", http, bootstrap=bootstrap)
        secs = time.perf_counter() - t0
        kept = sum(r.records_out for r in report.results)
        rows.append((f"compaction ({ccount}->{kept} records)", secs, ccount, cbytes))
        if not report.ok:
            print(f"warning: compaction did not finish everywhere: {report.results}", file=sys.stderr)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        if not args.keep:
            shutil.rmtree(run, ignore_errors=True)
        print_table(rows, args)  # what was measured, also when a later step failed

if __name__ == "__main__":
    main()
