"""aiokafka transactions against a real `stratalog serve`: commit, abort, commit, then
read both partitions with read_committed and read_uncommitted; a consume-transform-produce
step with send_offsets_to_transaction."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest

pytest.importorskip("aiokafka", reason="aiokafka is not installed")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # noqa: E402

from .test_aiokafka import consume, create_topic  # noqa: E402

from .txn_scenario import TRANSACTIONS, sent  # noqa: E402


async def read(bootstrap: str, topic: str, isolation_level: str, n: int, partitions=(0, 1)) -> list:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                isolation_level=isolation_level)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        msgs = await consume(consumer, n)
        return msgs + await consume(consumer, 1, timeout=0.5)  # anything extra shows up here
    finally:
        await consumer.stop()


def by_partition(msgs) -> dict[int, list[bytes]]:
    return {p: [m.value for m in msgs if m.partition == p] for p in (0, 1)}


def test_commit_abort_commit(gateway):
    topic = f"aio-txn-{uuid.uuid4().hex[:6]}"

    async def send(producer, prefix: str, n: int) -> None:
        futures = [await producer.send(topic, f"{prefix}-{i}".encode(), partition=i % 2) for i in range(n)]
        await asyncio.wait_for(asyncio.gather(*futures), 30)  # aborted records too reach the log

    async def scenario():
        await create_topic(gateway.bootstrap, topic, partitions=2)
        producer = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap, transactional_id=f"t-{topic}")
        await producer.start()
        try:
            for prefix, n, commit in TRANSACTIONS:
                if commit:
                    async with producer.transaction():
                        await send(producer, prefix, n)
                else:
                    await producer.begin_transaction()
                    await send(producer, prefix, n)
                    await producer.abort_transaction()
        finally:
            await producer.stop()
        return [await read(gateway.bootstrap, topic, level, sum(map(len, sent(level == "read_committed").values())))
                for level in ("read_committed", "read_uncommitted")]

    committed, uncommitted = asyncio.run(scenario())
    assert by_partition(committed) == sent(committed_only=True)
    assert by_partition(uncommitted) == sent(committed_only=False)
    for msgs in (committed, uncommitted):
        for p in (0, 1):
            offsets = [m.offset for m in msgs if m.partition == p]
            assert offsets == sorted(set(offsets))


async def committed(consumer, want: dict, timeout: float = 30.0) -> dict:
    """The group's offsets, read until they are `want` or the deadline: EndTxn answers once
    the outcome is decided, and the offsets are applied with the markers (as in Kafka)."""
    deadline = time.monotonic() + timeout
    while True:
        got = {tp: await consumer.committed(tp) for tp in want}
        if got == want or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)


def test_consume_transform_produce(gateway):
    """Two runs of one transaction: read the input, write it upper-cased, add the input's
    offsets for the group; the first run aborts and must leave neither output nor offsets."""
    source, sink = (f"aio-ctp-{name}-{uuid.uuid4().hex[:6]}" for name in ("in", "out"))
    group = f"g-{source}"
    rows = [f"v{i}".encode() for i in range(8)]
    inputs = [TopicPartition(source, p) for p in (0, 1)]

    async def transform(producer, commit: bool):
        consumer = AIOKafkaConsumer(bootstrap_servers=gateway.bootstrap, group_id=group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    isolation_level="read_committed")
        await consumer.start()
        try:
            consumer.assign(inputs)
            await producer.begin_transaction()
            for m in await consume(consumer, len(rows)):
                await producer.send(sink, m.value.upper())
            positions = {tp: await consumer.position(tp) for tp in inputs}
            await producer.send_offsets_to_transaction(positions, group)
            await (producer.commit_transaction() if commit else producer.abort_transaction())
            return positions, await committed(consumer, positions if commit else {tp: None for tp in inputs})
        finally:
            await consumer.stop()

    async def scenario():
        await create_topic(gateway.bootstrap, source, partitions=2)
        await create_topic(gateway.bootstrap, sink)
        async with AIOKafkaProducer(bootstrap_servers=gateway.bootstrap) as plain:
            await asyncio.gather(*[await plain.send(source, v, partition=i % 2) for i, v in enumerate(rows)])
        producer = AIOKafkaProducer(bootstrap_servers=gateway.bootstrap, transactional_id=f"t-{source}")
        await producer.start()
        try:
            runs = [await transform(producer, commit) for commit in (False, True)]
        finally:
            await producer.stop()
        return runs, await read(gateway.bootstrap, sink, "read_committed", len(rows), partitions=(0,))

    [(aborted_at, after_abort), (positions, after_commit)], out = asyncio.run(scenario())
    assert aborted_at == positions == {tp: 4 for tp in inputs}
    assert after_abort == {tp: None for tp in inputs}
    assert after_commit == positions
    assert sorted(m.value for m in out) == sorted(v.upper() for v in rows)
