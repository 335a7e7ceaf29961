"""The Spark sink: `df.write.format("stratalog")` lands exactly the rows written (keys,
values, headers, partitions, topics from the option or a column), bad schemas are refused
before anything is written, and `writeStream` writes every source row exactly once for a
read_committed consumer, even when a micro-batch failed after some of its tasks committed
and the query restarted from its checkpoint."""

from __future__ import annotations

import time
import uuid

import pytest

from spark_helpers import consume_all, create_topic, rows_of, spark_session, wait_sealed
from stratalog.spark.objects import StoreSpec
from stratalog.spark.options import OptionError
from stratalog.spark.sink_options import parse_write_options

ck = pytest.importorskip("confluent_kafka", reason="confluent-kafka is not installed")
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition  # noqa: E402

SETTINGS = {"log.roll.ms": 500, "log.segment.bytes": 4000}
ROWS_SCHEMA = "key string, value binary, headers array<struct<key:string,value:binary>>, partition int"


@pytest.fixture(scope="session")
def spark():
    return spark_session()


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from conftest import GatewayProcess

    gateway = GatewayProcess(tmp_path_factory.mktemp("sink") / "data", SETTINGS).start()
    yield gateway
    gateway.stop()


def _topic(gw, partitions: int = 2) -> str:
    name = f"sink-{uuid.uuid4().hex[:8]}"
    create_topic(gw.bootstrap, name, partitions)
    return name


def _writer(df, gw, **options):
    w = df.write.format("stratalog").mode("append").option("kafka.bootstrap.servers", gw.bootstrap)
    for k, v in options.items():
        w = w.option(k, v)
    return w


def _landed(records):
    """(partition, key, value, headers) of consumed records, in order."""
    return sorted(((r.partition, r.key, r.value, r.headers) for r in records), key=repr)


def test_batch_write_lands_keys_values_headers_and_partitions(spark, gw):
    topic = _topic(gw)
    rows = [(f"k{i}", b"v%d" % i, [("n", str(i).encode()), ("empty", None)], i % 2) for i in range(40)]
    rows += [(None, b"keyless", [], 1), ("tomb", None, None, 0)]
    _writer(spark.createDataFrame(rows, ROWS_SCHEMA), gw, topic=topic).save()

    expected = sorted(((p, None if k is None else k.encode(), v, tuple(h or ())) for k, v, h, p in rows), key=repr)
    consumed = consume_all(gw.bootstrap, topic, 2)
    assert _landed(consumed) == expected
    # Spark reads the same records back from the sealed segments.
    spec = StoreSpec((gw.data_dir / "objects").as_uri())
    wait_sealed(spec, topic, {p: 1 + max(r.offset for r in consumed if r.partition == p) for p in (0, 1)})
    assert rows_of(spark.read.format("stratalog").option("topic", topic).load(spec.url)) == consumed


def test_keys_go_where_a_java_producer_puts_them_and_strings_are_utf8(spark, gw):
    topic = _topic(gw, 4)
    rows = [(f"key-{i}", f"välue-{i}") for i in range(30)]
    _writer(spark.createDataFrame(rows, "key string, value string"), gw, topic=topic).save()
    consumed = consume_all(gw.bootstrap, topic, 4)
    assert sorted((r.key, r.value) for r in consumed) == sorted((k.encode(), v.encode()) for k, v in rows)
    from kafka.partitioner import murmur2

    # Kafka's default partitioner: murmur2 of the key, positive, modulo the partition count.
    for r in consumed:
        assert r.partition == (murmur2(r.key) & 0x7FFFFFFF) % 4, r


def test_topic_comes_from_the_column_unless_the_option_names_one(spark, gw):
    first, second, third = _topic(gw, 1), _topic(gw, 1), _topic(gw, 1)
    df = spark.createDataFrame([(first, b"a1"), (second, b"b1"), (first, b"a2")], "topic string, value binary")
    _writer(df, gw).save()
    # Rows of different Spark partitions are written by different tasks: no order between them.
    assert sorted(r.value for r in consume_all(gw.bootstrap, first, 1)) == [b"a1", b"a2"]
    assert [r.value for r in consume_all(gw.bootstrap, second, 1)] == [b"b1"]

    _writer(df, gw, topic=third).save()  # the option wins over the column, as in Spark's Kafka sink
    assert sorted(r.value for r in consume_all(gw.bootstrap, third, 1)) == [b"a1", b"a2", b"b1"]
    assert len(consume_all(gw.bootstrap, first, 1)) == 2


@pytest.mark.parametrize("schema, rows, options, message", [
    ("key string", [("k",)], {"topic": "T"}, "needs a 'value' column"),
    ("value int", [(1,)], {"topic": "T"}, "column 'value' must be string or binary, not int"),
    ("key double, value string", [(1.0, "v")], {"topic": "T"}, "column 'key' must be string or binary"),
    ("value string", [("v",)], {}, "no topic"),
    ("topic int, value string", [(1, "v")], {}, "column 'topic' must be a string"),
    ("value string, partition long", [("v", 0)], {"topic": "T"}, "column 'partition' must be an int, not bigint"),
    ("value string, headers map<string,binary>", [("v", {})], {"topic": "T"}, "column 'headers' must be"),
    ("value string", [("v",)], {"topic": "T", "kafka.transactional.id": "x"}, "kafka.transactional.id is set"),
    ("value string", [("v",)], {"topic": "T", "kafka.sasl.jaas.config": "x"}, "Java JAAS configuration is not supported"),
    ("value string", [("v",)], {"topic": "T", "kafka.acks": "1"}, "acks"),
])
def test_a_bad_schema_or_option_is_refused_before_anything_is_written(spark, gw, schema, rows, options, message):
    topic = _topic(gw, 1)
    options = {k: topic if v == "T" else v for k, v in options.items()}
    with pytest.raises(Exception, match=message):
        _writer(spark.createDataFrame(rows, schema), gw, **options).save()
    assert consume_all(gw.bootstrap, topic, 1) == []


def test_missing_bootstrap_servers_and_overwrite_are_refused(spark, gw):
    df = spark.createDataFrame([("v",)], "value string")
    with pytest.raises(Exception, match="kafka.bootstrap.servers is required"):
        df.write.format("stratalog").mode("append").option("topic", "t").save()
    with pytest.raises(Exception, match="overwrite is not supported"):
        _writer(df, gw, topic="t").mode("overwrite").save()


def test_a_null_topic_fails_the_write_with_a_clear_message(spark, gw):
    df = spark.createDataFrame([(None, "v")], "topic string, value string")
    with pytest.raises(Exception, match="a row has a null topic"):
        _writer(df, gw).save()


# ---- streaming ------------------------------------------------------------------------

FILES, LINES = 3, 30
FAILING_BATCH = 1


def _marker(bootstrap: str, query_id: str, task: int, topic: str) -> int:
    """The batch id + 1 that task `task` of the query last committed (-1001: none)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"stratalog-sink-{query_id}-{task}",
                  "isolation.level": "read_committed"})
    try:
        return c.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
    finally:
        c.close()


def _read_committed(bootstrap: str, topic: str, partitions: int, timeout_s: float = 120) -> list[bytes]:
    """Every value a read_committed consumer sees up to the end of each partition."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"rc-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    values = []
    try:
        ends = {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(partitions)}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        deadline = time.monotonic() + timeout_s
        while True:
            positions = {tp.partition: tp.offset for tp in c.position(
                [TopicPartition(topic, p) for p in range(partitions)])}
            if all(ends[p] == 0 or positions[p] >= ends[p] for p in range(partitions)):
                return values
            assert time.monotonic() < deadline, f"read_committed consumer stopped at {positions} of {ends}"
            m = c.poll(0.3)
            if m is not None and m.error() is None:
                values.append(m.value())
    finally:
        c.close()


def test_stream_writes_every_row_exactly_once_across_a_failed_batch_and_a_restart(spark, gw, tmp_path):
    """Batch 1 fails in task 1 after task 0 committed its part; the restarted query replays
    batch 1, task 0 skips its committed part, and no row is lost or doubled."""
    from pyspark.sql.functions import col, udf

    topic = _topic(gw)
    source, checkpoint, fail_flag = tmp_path / "in", tmp_path / "checkpoint", tmp_path / "fail"
    source.mkdir()
    for f in range(FILES):
        (source / f"part-{f}.txt").write_text("".join(f"row-{f}-{i}\n" for i in range(LINES)))
    fail_flag.write_text("")
    bootstrap, flag, failing_batch = gw.bootstrap, str(fail_flag), FAILING_BATCH

    @udf("string")
    def fault(value):
        """Task 1 of batch 1 fails once task 0 committed its part of the batch, while the flag exists."""
        # Everything is imported here: the function is shipped to Spark's Python workers.
        import os
        import time

        from confluent_kafka import Consumer, TopicPartition
        from pyspark import TaskContext

        context = TaskContext.get()
        if not (os.path.exists(flag) and context.partitionId() == 1
                and context.getLocalProperty("streaming.sql.batchId") == str(failing_batch)):
            return value
        group = f"stratalog-sink-{context.getLocalProperty('sql.streaming.queryId')}-0"
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        try:
            deadline = time.monotonic() + 120
            while consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset != failing_batch + 1:
                if time.monotonic() > deadline:
                    raise TimeoutError("task 0 did not commit its part of the batch")
                time.sleep(0.2)
        finally:
            consumer.close()
        raise RuntimeError("injected failure after task 0 committed")

    def start():
        rows = (spark.readStream.format("text").option("maxFilesPerTrigger", 1).load(str(source))
                .repartition(2, "value")  # two tasks per batch, the same rows each time
                .select(col("value").alias("key"), fault(col("value")).alias("value")))
        return (rows.writeStream.format("stratalog").option("kafka.bootstrap.servers", gw.bootstrap)
                .option("topic", topic).option("checkpointLocation", str(checkpoint)).start())

    query = start()
    try:
        with pytest.raises(Exception, match="injected failure"):
            query.awaitTermination(240)
        query_id = str(query.id)
        # The failure struck mid-batch: task 0 committed batch 1, task 1 did not.
        assert _marker(gw.bootstrap, query_id, 0, topic) == FAILING_BATCH + 1
        assert _marker(gw.bootstrap, query_id, 1, topic) == FAILING_BATCH  # its batch 0 only
    finally:
        query.stop()

    fail_flag.unlink()
    query = start()
    try:
        query.processAllAvailable()
        assert str(query.id) == query_id
    finally:
        query.stop()
    values = _read_committed(gw.bootstrap, topic, 2)
    expected = [f"row-{f}-{i}".encode() for f in range(FILES) for i in range(LINES)]
    assert sorted(values) == sorted(expected)
    assert _marker(gw.bootstrap, query_id, 0, topic) == FILES and _marker(gw.bootstrap, query_id, 1, topic) == FILES


# ---- options, without Spark running -------------------------------------------------------


@pytest.mark.unit
def test_write_options_pass_kafka_settings_and_keep_connection_ones_for_the_marker_consumer():
    from pyspark.sql.types import BinaryType, StringType, StructField, StructType

    schema = StructType([StructField("Value", BinaryType()), StructField("TOPIC", StringType())])
    opts = parse_write_options({"kafka.bootstrap.servers": "h:1", "kafka.security.protocol": "SASL_SSL",
                                "kafka.sasl.mechanism": "PLAIN", "kafka.linger.ms": "50"}, schema)
    assert opts.producer == {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                             "sasl.mechanism": "PLAIN", "linger.ms": "50"}
    assert opts.connection() == {"bootstrap.servers": "h:1", "security.protocol": "SASL_SSL",
                                 "sasl.mechanism": "PLAIN"}
    assert (opts.columns.value, opts.columns.topic, opts.columns.key) == ("Value", "TOPIC", None)
    with pytest.raises(OptionError, match="kafka.enable.idempotence is set by the sink"):
        parse_write_options({"kafka.bootstrap.servers": "h:1", "kafka.enable.idempotence": "false",
                             "topic": "t"}, schema)



# ---- security ----------------------------------------------------------------------------


def test_kafka_security_options_reach_the_task_producers_and_marker_consumers(spark, tmp_path):
    """Over SASL_SSL with SCRAM (kafka.security.protocol, kafka.sasl.*, kafka.ssl.ca.location),
    a batch write and a streaming write both land, read back over the plaintext listener."""
    from test_security import SecureGateway

    with SecureGateway(tmp_path / "secure") as secure:
        plain = secure.address("PLAINTEXT")
        topic = f"sink-sec-{uuid.uuid4().hex[:8]}"
        create_topic(plain, topic, 1)
        options = {f"kafka.{k}": v for k, v in secure.librdkafka("SASL_SSL", "SCRAM-SHA-512").items()}
        writer = spark.createDataFrame([("batch-1",), ("batch-2",)], "value string").write.format("stratalog")
        writer.mode("append").options(**options).option("topic", topic).save()

        source = tmp_path / "in"
        source.mkdir()
        (source / "rows.txt").write_text("stream-1\nstream-2\n")
        query = (spark.readStream.format("text").load(str(source)).writeStream.format("stratalog")
                 .options(**options).option("topic", topic).option("checkpointLocation", str(tmp_path / "ck"))
                 .trigger(availableNow=True).start())
        try:
            assert query.awaitTermination(180), "the availableNow query did not finish"
            assert query.exception() is None, query.exception()
        finally:
            query.stop()
        assert sorted(_read_committed(plain, topic, 1)) == [b"batch-1", b"batch-2", b"stream-1", b"stream-2"]
