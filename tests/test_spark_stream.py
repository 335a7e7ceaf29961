"""`spark.readStream.format("stratalog")`: micro-batches follow sealed segments, and a
checkpointed file sink holds every record exactly once across restarts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from stratalog.spark.objects import StoreSpec
from spark_helpers import consume_all, create_topic, produce, spark_session, wait_sealed

SETTINGS = {"log.roll.ms": 400, "log.segment.bytes": 4000}
PARTITIONS = 2


@pytest.fixture(scope="session")
def spark():
    return spark_session()


def _batch(start: int, count: int):
    return [(i % PARTITIONS, b"k%d" % i, b"value-%06d" % i, [("n", str(i).encode())], None)
            for i in range(start, start + count)]


def _sink_rows(spark, path: Path):
    """(partition, offset, value) of every row the file sink committed."""
    if not (path / "_spark_metadata").exists():
        return []
    rows = (spark.read.schema("partition int, offset long, value binary").parquet(str(path))
            .select("partition", "offset", "value").collect())
    return [(r.partition, r.offset, bytes(r.value)) for r in rows]


def _wait_rows(spark, path: Path, count: int, timeout_s: float = 90):
    deadline = time.monotonic() + timeout_s
    while True:
        rows = _sink_rows(spark, path)
        if len(rows) >= count:
            return rows
        assert time.monotonic() < deadline, f"sink holds {len(rows)} of {count} rows"
        time.sleep(0.5)


def _stream(spark, url: str, topic: str, **options):
    reader = spark.readStream.format("stratalog").option("topic", topic)
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load(url)


def _ends(truth):
    return {p: 1 + max(r.offset for r in truth if r.partition == p) for p in range(PARTITIONS)}


def test_stream_follows_sealed_segments_and_sink_is_exactly_once_across_restarts(spark, gateway_factory, tmp_path):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "events", PARTITIONS)
    produce(gw.bootstrap, "events", _batch(0, 200), compression="snappy", batch_size=1024)
    wait_sealed(spec, "events", _ends(consume_all(gw.bootstrap, "events", PARTITIONS)))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start():
        return (_stream(spark, spec.url, "events", startingOffsets="earliest")
                .select("partition", "offset", "value", "headers")
                .writeStream.format("parquet").option("checkpointLocation", str(checkpoint))
                .trigger(processingTime="500 milliseconds").start(str(out)))

    query = start()
    try:
        _wait_rows(spark, out, 200)
        # New records show up once their segment seals, without restarting anything.
        produce(gw.bootstrap, "events", _batch(200, 150), compression="snappy", batch_size=1024)
        _wait_rows(spark, out, 350)
    finally:
        query.stop()
    # Records produced while the query is down are read when it comes back; a batch the
    # sink wrote but the checkpoint never committed is replayed from the same offsets and
    # must not be written twice.
    produce(gw.bootstrap, "events", _batch(350, 120), compression="snappy", batch_size=1024)
    truth = consume_all(gw.bootstrap, "events", PARTITIONS)
    wait_sealed(spec, "events", _ends(truth))
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last_commit = [p for p in commits if p.name.isdigit()][-1]
    # As if the driver died after the sink committed the batch, before the checkpoint did.
    last_commit.unlink()
    (last_commit.parent / f".{last_commit.name}.crc").unlink(missing_ok=True)
    query = start()
    try:
        rows = _wait_rows(spark, out, len(truth))
        time.sleep(1.5)  # a duplicate would land in a later micro-batch
        rows = _sink_rows(spark, out)
    finally:
        query.stop()
    assert len(rows) == len(set(rows)) == len(truth) == 470
    assert sorted(rows) == sorted((r.partition, r.offset, r.value) for r in truth)


def test_trigger_available_now_with_a_row_limit_takes_several_batches(spark, gateway_factory, tmp_path):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "capped", PARTITIONS)
    produce(gw.bootstrap, "capped", _batch(0, 300), compression="zstd", batch_size=1024)
    truth = consume_all(gw.bootstrap, "capped", PARTITIONS)
    wait_sealed(spec, "capped", _ends(truth))
    out = tmp_path / "out"
    query = (_stream(spark, spec.url, "capped", startingOffsets="earliest", maxOffsetsPerTrigger=100)
             .writeStream.format("parquet").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start(str(out)))
    assert query.awaitTermination(120)
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    assert len(batches) >= 3
    assert all(p["numInputRows"] <= 100 + PARTITIONS for p in batches)
    rows = _sink_rows(spark, out)
    assert sorted(rows) == sorted((r.partition, r.offset, r.value) for r in truth)


def test_latest_start_skips_what_was_sealed_before(spark, gateway_factory, tmp_path):
    gw = gateway_factory(settings=SETTINGS)
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    create_topic(gw.bootstrap, "tail", 1)
    produce(gw.bootstrap, "tail", [(0, b"old", b"old", [], None)] * 30)
    wait_sealed(spec, "tail", {0: 30})
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    def run_once():
        query = (_stream(spark, spec.url, "tail").select("offset", "value")
                 .writeStream.format("json").option("checkpointLocation", str(ckpt))
                 .trigger(availableNow=True).start(str(out)))
        assert query.awaitTermination(120)

    run_once()  # fixes the starting offsets at the sealed end
    produce(gw.bootstrap, "tail", [(0, b"new", b"new", [], None)] * 20)
    wait_sealed(spec, "tail", {0: 50})
    run_once()
    rows = spark.read.json(str(out)).collect()
    assert sorted(r.offset for r in rows) == list(range(30, 50))


def test_checkpoint_of_another_topic_is_refused(spark, gateway_factory, tmp_path):
    from stratalog.spark.options import OptionError
    from stratalog.spark.streaming import StratalogStreamReader

    gw = gateway_factory(settings=SETTINGS)
    url = (gw.data_dir / "objects").as_uri()
    reader = StratalogStreamReader({"topic": "a", "path": url})
    with pytest.raises(OptionError, match="another topic"):
        reader.latestOffset({"b": {"0": 3}}, None)
    with pytest.raises(OptionError, match="batch reads only"):
        StratalogStreamReader({"topic": "a", "path": url, "endingOffsets": "latest"})
    assert json.loads(json.dumps(reader.initialOffset())) == {"a": {}}
