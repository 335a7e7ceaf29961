"""aiokafka against a real `stratalog serve`: the shared scenario, every codec."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

pytest.importorskip("aiokafka", reason="aiokafka is not installed")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402
from aiokafka import codec as acodec  # noqa: E402
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # noqa: E402


from .scenario import CODECS, records  # noqa: E402
from .stored_batches import CODEC_IDS, stored_codecs  # noqa: E402

# aiokafka compresses through optional packages; a codec whose package is absent is
# skipped with the package to install.
CODEC_PACKAGE = {"gzip": (acodec.has_gzip, "stdlib"), "snappy": (acodec.has_snappy, "cramjam"),
                 "lz4": (acodec.has_lz4, "cramjam"), "zstd": (acodec.has_zstd, "cramjam")}


async def create_topic(bootstrap: str, name: str, partitions: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=15000)
    await admin.start()
    try:
        resp = await admin.create_topics([NewTopic(name, num_partitions=partitions,
                                                   replication_factor=1)], timeout_ms=15000)
        errors = [t[1] for t in resp.topic_errors]
        assert errors == [0], resp
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, rows, codec: str, partition: int = 0,
                  timestamps: list[int] | None = None) -> list[int]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5,
                                compression_type=None if codec == "none" else codec)
    await producer.start()
    try:
        futures = [await producer.send(topic, value=value, key=key, headers=headers or None,
                                       partition=partition,
                                       timestamp_ms=timestamps[i] if timestamps else None)
                   for i, (key, value, headers) in enumerate(rows)]
        return [(await asyncio.wait_for(f, 30)).offset for f in futures]
    finally:
        await producer.stop()


async def consume(consumer: AIOKafkaConsumer, n: int, timeout: float = 30.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        for batch in (await consumer.getmany(timeout_ms=500)).values():
            out.extend(batch)
    return out


def as_rows(msgs):
    return [(m.key, m.value, list(m.headers or [])) for m in msgs]


@pytest.mark.parametrize("codec", CODECS)
def test_produce_and_consume_by_assignment(gateway, codec):
    if codec != "none":
        available, package = CODEC_PACKAGE[codec]
        if not available():
            pytest.skip(f"aiokafka needs the '{package}' package for {codec}")
    topic = f"aio-{codec}-{uuid.uuid4().hex[:6]}"
    rows = records(codec)

    async def scenario():
        await create_topic(gateway.bootstrap, topic)
        offsets = await produce(gateway.bootstrap, topic, rows, codec)
        assert offsets == list(range(len(rows)))
        consumer = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            consumer.assign([tp])
            consumer.seek(tp, 0)
            return await consume(consumer, len(rows))
        finally:
            await consumer.stop()

    msgs = asyncio.run(scenario())
    assert set(stored_codecs(gateway.bootstrap, topic)) == {CODEC_IDS[codec]}
    assert [m.offset for m in msgs] == list(range(len(rows)))
    assert as_rows(msgs) == rows


def test_group_commit_and_resume(gateway):
    topic = f"aio-group-{uuid.uuid4().hex[:6]}"
    rows = [(f"k{i}".encode(), f"v{i}".encode(), []) for i in range(30)]
    conf = dict(bootstrap_servers=gateway.bootstrap, group_id=f"g-{topic}",
                auto_offset_reset="earliest", enable_auto_commit=False, session_timeout_ms=6000,
                heartbeat_interval_ms=1000, max_poll_records=4)

    async def scenario():
        await create_topic(gateway.bootstrap, topic, partitions=3)
        for p in range(3):
            await produce(gateway.bootstrap, topic, rows[p::3], "none", partition=p)
        first_consumer = AIOKafkaConsumer(topic, **conf)
        await first_consumer.start()
        try:
            first = await consume(first_consumer, 12)
            await first_consumer.commit()
            committed = [await first_consumer.committed(tp) for tp in first_consumer.assignment()]
        finally:
            await first_consumer.stop()
        assert sum(c or 0 for c in committed) == len(first)

        second_consumer = AIOKafkaConsumer(topic, **conf)
        await second_consumer.start()
        try:
            rest = await consume(second_consumer, 30 - len(first))
            rest += await consume(second_consumer, 1, timeout=0.5)  # a re-read would show here
            await second_consumer.commit()
        finally:
            await second_consumer.stop()
        return first, rest

    first, rest = asyncio.run(scenario())
    assert len(first) >= 12
    seen = sorted(m.value for m in first + rest)
    assert seen == sorted(v for _, v, _ in rows)  # nothing lost, nothing twice


def test_seek_by_timestamp(gateway):
    topic = f"aio-ts-{uuid.uuid4().hex[:6]}"
    base = 1_700_000_000_000
    rows = [(None, f"v{i}".encode(), []) for i in range(10)]

    async def scenario():
        await create_topic(gateway.bootstrap, topic)
        await produce(gateway.bootstrap, topic, rows, "none",
                      timestamps=[base + i * 1000 for i in range(10)])
        consumer = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tp = TopicPartition(topic, 0)
            found = await consumer.offsets_for_times({tp: base + 4500})
            past_end = await consumer.offsets_for_times({tp: base + 99_000})
            bounds = ((await consumer.beginning_offsets([tp]))[tp],
                      (await consumer.end_offsets([tp]))[tp])
            consumer.assign([tp])
            consumer.seek(tp, found[tp].offset)
            return found[tp], past_end[tp], bounds, await consume(consumer, 5)
        finally:
            await consumer.stop()

    found, past_end, bounds, msgs = asyncio.run(scenario())
    assert (found.offset, found.timestamp) == (5, base + 5000)
    assert past_end is None
    assert bounds == (0, 10)
    assert [m.value for m in msgs] == [f"v{i}".encode() for i in range(5, 10)]
    assert [m.timestamp for m in msgs] == [base + i * 1000 for i in range(5, 10)]
