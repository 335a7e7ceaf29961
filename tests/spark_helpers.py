"""Shared pieces of the Spark tests: one local SparkSession for the whole test run, a moto
S3 server, topic setup, producing, consuming the truth with confluent-kafka, waiting for
segments to seal, and counting object reads.

Every Spark test file declares a session-scoped `spark` fixture calling `spark_session()`,
which returns the same SparkSession each time (getOrCreate), so the JVM starts once.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from stratalog.infra.processes import free_port
from stratalog.spark.objects import TRACE_ENV, StoreSpec

TRACE_FILE = Path(tempfile.mkdtemp(prefix="stratalog-spark-trace-")) / "reads.log"
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1",
          "AWS_DEFAULT_REGION": "us-east-1"}


# Why the session has no JVM reader (`format("stratalog-jvm")`), if it has none.
JVM_READER_MISSING: str | None = None
READERS = ["stratalog", "stratalog-jvm"]


def reader_format(name: str) -> str:
    """`name`, a data source format; skips the test if it is the JVM reader and the test
    session could not build its jar."""
    if name == "stratalog-jvm" and JVM_READER_MISSING:
        pytest.skip(f"no JVM reader: {JVM_READER_MISSING}")
    return name


@pytest.fixture(params=READERS)
def fmt(request, spark):
    """Both readers of a batch read: the Python data source and the JVM one (the module
    using it defines `spark`)."""
    return reader_format(request.param)


def spark_session():
    """The one local SparkSession of the test run (Python workers trace their reads)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    if not any(os.access(os.path.join(d, "java"), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep)) and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    os.environ[TRACE_ENV] = str(TRACE_FILE)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Credentials for the moto server; workers inherit them from the JVM's environment.
    for key, value in S3_ENV.items():
        os.environ.setdefault(key, value)
    from stratalog.spark.jvm import JarBuildError, jar_path
    from stratalog.spark.session import get_session

    global JVM_READER_MISSING
    try:
        jar_path()
    except JarBuildError as exc:
        JVM_READER_MISSING = str(exc).splitlines()[0]
    return get_session("local[2]", app_name="stratalog-tests", jvm=JVM_READER_MISSING is None,
                       conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false",
                             "spark.default.parallelism": "2",
                             "spark.sql.session.timeZone": "UTC",
                             "spark.driver.memory": "1g"})



@contextlib.contextmanager
def moto_s3():
    """A moto S3 server on loopback (in its own process, see moto_fixture); yields its URL."""
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from moto_fixture import MotoServer

    server = MotoServer("127.0.0.1", free_port()).start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def gateway_on_store(kind: str, data: Path, settings: dict, bucket: str, prefix: str = "c"):
    """A gateway with its data directory at `data` and its objects on a file:// store
    under it (`kind` "file") or in `bucket`/`prefix` of a moto S3 server of its own ("s3");
    yields (the gateway, the StoreSpec Spark reads it by, the S3 endpoint or None)."""
    from conftest import GatewayProcess

    if kind == "file":
        gw = GatewayProcess(data, settings).start()
        try:
            yield gw, StoreSpec((data / "objects").as_uri()), None
        finally:
            gw.stop()
        return
    with moto_s3() as endpoint:
        for key, value in S3_ENV.items():
            os.environ.setdefault(key, value)
        make_bucket(endpoint, bucket)
        url = f"s3://{bucket}/{prefix}"
        gw = GatewayProcess(data, settings, extra_args=[
            "--object-store", url, "--s3-endpoint", endpoint, "--s3-path-style"]).start()
        try:
            yield gw, StoreSpec(url, endpoint=endpoint, path_style=True), endpoint
        finally:
            gw.stop()


def make_bucket(endpoint: str, bucket: str) -> None:
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="testing", aws_secret_access_key="testing").create_bucket(Bucket=bucket)


@contextlib.contextmanager
def reads_traced():
    """Collects the object reads Spark's workers make inside the block: list of (key, start, end)."""
    TRACE_FILE.write_text("")
    seen: list[tuple[str, int, int]] = []
    yield seen
    for line in TRACE_FILE.read_text().splitlines():
        _, key, start, end = line.split()
        seen.append((key, int(start), int(end)))


# ---- Kafka side ----------------------------------------------------------------------


def create_topic(bootstrap: str, name: str, partitions: int = 1, configs: dict | None = None) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(name, partitions, 1, config={k: str(v) for k, v in (configs or {}).items()})])
    for f in futures.values():
        f.result(30)


def produce(bootstrap: str, topic: str, records, *, compression: str = "none", linger_ms: int = 5,
            batch_size: int = 16384) -> None:
    """Produce (partition, key, value, headers, timestamp_ms_or_None) tuples, all acknowledged."""
    from confluent_kafka import Producer

    failures = []
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": compression,
                         "linger.ms": linger_ms, "batch.size": batch_size, "acks": "all",
                         "enable.idempotence": False})
    for partition, key, value, headers, ts in records:
        kwargs = {"partition": partition, "key": key, "value": value,
                  "on_delivery": lambda err, msg: err and failures.append(err)}
        if headers:
            kwargs["headers"] = headers
        if ts is not None:
            kwargs["timestamp"] = ts
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(60) == 0, "producer did not deliver everything"
    assert not failures, failures[:3]


@dataclass(frozen=True)
class Consumed:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime (Spark's numbering)


def high_watermarks(bootstrap: str, topic: str, partitions: int) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "hw-probe", "enable.auto.commit": False})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
    finally:
        c.close()


def consume_all(bootstrap: str, topic: str, partitions: int, *, timeout_s: float = 60) -> list[Consumed]:
    """Every record of every partition up to the current high watermark, as a client sees it."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    ends = high_watermarks(bootstrap, topic, partitions)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"truth-{time.monotonic_ns()}",
                  "enable.auto.commit": False, "enable.partition.eof": False,
                  "fetch.wait.max.ms": 100})
    out: list[Consumed] = []
    try:
        todo = {p for p, end in ends.items() if end > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        deadline = time.monotonic() + timeout_s
        quiet_since = time.monotonic()
        while todo:
            assert time.monotonic() < deadline, f"consumer did not reach the end of {sorted(todo)}"
            msg = c.poll(0.5)
            if msg is None:
                # Compaction may leave the last offsets without records: after a quiet
                # spell, a partition whose fetch position passed its end is done.
                if time.monotonic() - quiet_since > 2:
                    positions = c.position([TopicPartition(topic, p) for p in todo])
                    todo -= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
                continue
            quiet_since = time.monotonic()
            assert msg.error() is None, msg.error()
            ts_type, ts = msg.timestamp()
            out.append(Consumed(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                tuple(msg.headers() or ()), ts, 1 if ts_type == 2 else 0))
            if msg.offset() + 1 >= ends[msg.partition()]:
                todo.discard(msg.partition())
    finally:
        c.close()
    return sorted(out, key=lambda r: (r.partition, r.offset))


def rows_of(df) -> list[Consumed]:
    """Spark rows in the same shape as `consume_all`."""
    rows = df.collect()
    out = []
    for r in rows:
        ts = r["timestamp"]
        out.append(Consumed(
            r["partition"], r["offset"],
            None if r["key"] is None else bytes(r["key"]),
            None if r["value"] is None else bytes(r["value"]),
            tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"] or ()),
            _millis(ts), r["timestampType"]))
    return sorted(out, key=lambda r: (r.partition, r.offset))


def _millis(ts) -> int:
    import datetime as dt

    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=dt.timezone.utc)
    delta = ts - dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def wait_sealed(spec: StoreSpec, topic: str, ends: dict[int, int], timeout_s: float = 30) -> None:
    """Wait until each partition's manifest covers its offsets below `ends`."""
    from stratalog.spark.metadata import ManifestMetadata, TopicNotFound

    meta = ManifestMetadata(spec.open(), topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            parts = meta.snapshot().partitions
            if all(end == 0 or (p in parts and parts[p].sealed_end >= end) for p, end in ends.items()):
                return
        except TopicNotFound:
            pass
        assert time.monotonic() < deadline, f"segments of {topic} did not seal in {timeout_s}s"
        time.sleep(0.2)



def install_as_users_do(site: Path) -> Path:
    """`pip install .` of the project into `site` (a non-editable install: Spark finds
    `pyspark_stratalog` by scanning the import path, which an editable install's import
    hook does not show it); put `site` on PYTHONPATH to use it."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    install = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                              str(root)], capture_output=True, text=True, timeout=300)
    if install.returncode != 0:
        if "No matching distribution" in install.stderr or "Could not fetch" in install.stderr:
            pytest.skip("pip cannot reach a package index here for the build backend")
        raise AssertionError(f"pip install --target failed: {install.stderr[-2000:]}")
    return site


def read_slices_on_the_jvm(slices: list[dict], options: dict) -> subprocess.CompletedProcess:
    """`io.stratalog.spark.ReadSlices` (the JVM reader without Spark) over slices as
    `stratalog.spark.jvm_plan` describes them; its stdout has a line per row."""
    import json

    from stratalog.spark.jvm import jar_path, spark_jars

    reader_format("stratalog-jvm")
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else "java"
    request = {"python": sys.executable, "options": options, "slices": slices}
    return subprocess.run([java, "-cp", f"{jar_path()}{os.pathsep}{spark_jars() / '*'}",
                           "io.stratalog.spark.ReadSlices"], input=json.dumps(request).encode(),
                          capture_output=True, timeout=120)
