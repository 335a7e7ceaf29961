"""End-to-end checksums (issue 14 item 5): a bit flipped in a sealed segment, on the file
store and on S3 (moto), never reaches a consumer that does not check CRCs itself.

librdkafka's consumers default to `check.crcs=false`, so the gateway is the only check
between the object store and the application: the damaged batch's range answers
CORRUPT_MESSAGE (handed to the application as an error at that offset), the intact
batches around it are still served, the metric counts it and `stratalog segments verify`
reports it.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from cluster_fixtures import moto_s3  # noqa: F401  (fixture)
from conftest import ROOT
from stratalog.tiering.batch import scan_batches

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

BATCHES, PER_BATCH = 4, 10  # at least BATCHES batches: librdkafka may split a flush's records
TOTAL = BATCHES * PER_BATCH
DAMAGED = 1  # the second batch
CORRUPT_MESSAGE = 2


class FileObjects:
    def __init__(self, gw) -> None:
        self.root = Path(gw.data_dir) / "objects"
        self.store_args = ["--data-dir", str(gw.data_dir)]

    def logs(self, topic: str) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.glob(f"topics/{topic}-*/*/*.log"))

    def read(self, key: str) -> bytes:
        return (self.root / key).read_bytes()

    def write(self, key: str, data: bytes, _original: bytes) -> None:
        (self.root / key).write_bytes(data)


class S3Objects:
    def __init__(self, s3) -> None:
        self.s3 = s3
        self.store_args = ["--object-store", s3.url, "--s3-endpoint", s3.endpoint, "--s3-path-style"]

    def logs(self, topic: str) -> list[str]:
        return [k for k in self.s3.keys("topics/") if k.startswith(f"topics/{topic}-") and k.endswith(".log")]

    def read(self, key: str) -> bytes:
        return self.s3.client().get_object(Bucket=self.s3.bucket, Key=f"{self.s3.prefix}/{key}")["Body"].read()

    def write(self, key: str, data: bytes, original: bytes) -> None:
        from stratalog.tiering.objectstore.base import crc32c_checksum

        # Rot at rest: the bytes change under the checksum the store kept at upload
        # (moto takes a stated checksum without checking it, as S3 would not).
        self.s3.client().put_object(Bucket=self.s3.bucket, Key=f"{self.s3.prefix}/{key}", Body=data,
                                    ChecksumAlgorithm="CRC32C", ChecksumCRC32C=crc32c_checksum(original))


def _value(offset: int) -> bytes:
    return f"record-{offset:04d}-".encode() * 20


def _sealed_segment(objects, gw, topic: str) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        logs = objects.logs(topic)
        local = sum(f.stat().st_size for f in (Path(gw.data_dir) / "logs").glob(f"{topic}-*/*.log"))
        if len(logs) == 1 and local == 0:
            return logs[0]
        time.sleep(0.2)
    raise AssertionError(f"the partition never sealed: {objects.logs(topic)}")


def _consume(consumer, want, deadline_s: float = 60):
    """(records by offset, error offsets) polled until `want(records, errors)` holds."""
    records, errors = {}, []
    deadline = time.monotonic() + deadline_s
    while not want(records, errors):
        assert time.monotonic() < deadline, f"gave up: {sorted(records)}, errors {errors}"
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            errors.append((msg.error().code(), msg.offset()))
        else:
            records[msg.offset()] = msg.value()
    return records, errors


@pytest.mark.parametrize("where", ["file", "s3"])
def test_a_bit_flip_in_a_sealed_segment_never_reaches_a_consumer(where, gateway_factory, request):
    if where == "s3":
        s3 = request.getfixturevalue("moto_s3")
        gw = gateway_factory(settings={"log.roll.ms": 300},
                             extra_args=["--object-store", s3.url, "--s3-endpoint", s3.endpoint, "--s3-path-style"])
        objects = S3Objects(s3)
    else:
        gw = gateway_factory(settings={"log.roll.ms": 300})
        objects = FileObjects(gw)
    topic = f"crc-{uuid.uuid4().hex[:6]}"
    admin = AdminClient({"bootstrap.servers": gw.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    producer = Producer({"bootstrap.servers": gw.bootstrap, "acks": "all", "linger.ms": 0})
    for b in range(BATCHES):  # one flush per batch: PER_BATCH records in each
        for i in range(PER_BATCH):
            producer.produce(topic, value=_value(b * PER_BATCH + i), partition=0)
        assert producer.flush(15) == 0
    key = _sealed_segment(objects, gw, topic)
    original = objects.read(key)
    batches, _ = scan_batches(original)
    assert len(batches) >= BATCHES and batches[-1][1].last_offset == TOTAL - 1
    position, header = batches[DAMAGED]
    damaged = bytearray(original)
    damaged[position + header.size - 7] ^= 0x20  # one bit, inside the last record's value
    objects.write(key, bytes(damaged), original)

    consumer = Consumer({"bootstrap.servers": gw.bootstrap, "group.id": f"g-{topic}", "check.crcs": False,
                         "enable.auto.commit": False, "fetch.error.backoff.ms": 100})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        first = header.base_offset
        records, errors = _consume(consumer, lambda r, e: len(r) == first and e)
        # The intact batch before the damage is delivered; the damaged range is an error
        # at its first offset, and none of its records (nor anything after it) arrives.
        assert records == {o: _value(o) for o in range(first)}
        assert errors[0] == (CORRUPT_MESSAGE, first), errors
        # Past the damage the partition is readable again.
        after = header.next_offset
        consumer.seek(TopicPartition(topic, 0, after))
        records, _ = _consume(consumer, lambda r, e: len(r) == TOTAL - after)
        assert records == {o: _value(o) for o in range(after, TOTAL)}
    finally:
        consumer.close()

    metrics = urllib.request.urlopen(gw.http_url + "/metrics", timeout=10).read().decode()
    assert re.search(rf'^stratalog_corrupt_batches_total{{topic="{topic}"}} 1\.0$', metrics, re.M), \
        [line for line in metrics.splitlines() if "corrupt" in line]
    log = gw.log_tail()
    assert f"object {key}, byte {position}, offset {first}" in log, log[-2000:]

    verify = subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "segments", "verify", topic,
                             *objects.store_args], cwd=ROOT, capture_output=True, timeout=120)
    assert verify.returncode != 0, verify.stdout.decode()
    assert f"DAMAGED {key} batch at byte {position} (offset {first}): CRC mismatch" in verify.stdout.decode()
