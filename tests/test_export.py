"""Export on Spark: Parquet rows match what confluent-kafka consumes; JSON and Avro values
decode into columns; bad values stop the export with their offset."""

from __future__ import annotations

import io
import json

import fastavro
import pyarrow.parquet as pq
import pytest

from conftest import GatewayProcess
from stratalog.spark.export import ExportError, avro_to_spark, export
from stratalog.spark.objects import StoreSpec
from spark_helpers import consume_all, create_topic, produce, spark_session, wait_sealed

SETTINGS = {"log.roll.ms": 400, "log.segment.bytes": 5000}
AVRO_SCHEMA = {
    "type": "record", "name": "Order", "namespace": "test",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "customer", "type": "string"},
        {"name": "amount", "type": ["null", "double"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
    ],
}


@pytest.fixture(scope="session")
def spark():
    return spark_session()


def _avro(record: dict) -> bytes:
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(AVRO_SCHEMA), record)
    return buf.getvalue()


def _orders(n: int):
    return [{"id": i, "customer": f"c{i % 7}", "amount": None if i % 5 == 0 else i * 1.5,
             "tags": [f"t{j}" for j in range(i % 3)], "status": "PAID" if i % 2 else "NEW"} for i in range(n)]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    data = tmp_path_factory.mktemp("export-gw") / "data"
    gw = GatewayProcess(data, SETTINGS).start()
    spec = StoreSpec((data / "objects").as_uri())
    try:
        create_topic(gw.bootstrap, "raw", 2)
        create_topic(gw.bootstrap, "json", 1)
        create_topic(gw.bootstrap, "avro", 1)
        create_topic(gw.bootstrap, "bad-avro", 1)
        produce(gw.bootstrap, "raw", [(i % 2, b"k%d" % i, None if i % 9 == 0 else b"v" * (i % 50),
                                       [("h", b"%d" % i)] if i % 2 else [], None) for i in range(200)],
                compression="gzip", batch_size=1024)
        produce(gw.bootstrap, "json", [(0, b"%d" % o["id"], None if o["id"] == 13 else
                                        json.dumps({"id": o["id"], "customer": o["customer"],
                                                    "amount": o["amount"]}).encode(), [], None)
                                       for o in _orders(60)], compression="snappy")
        produce(gw.bootstrap, "avro", [(0, None, _avro(o), [], None) for o in _orders(60)], compression="zstd")
        produce(gw.bootstrap, "bad-avro", [(0, None, _avro(o), [], None) for o in _orders(5)]
                + [(0, None, b"\xff\xff\xff", [], None)])
        truth = {}
        for topic, parts in (("raw", 2), ("json", 1), ("avro", 1), ("bad-avro", 1)):
            truth[topic] = consume_all(gw.bootstrap, topic, parts)
            wait_sealed(spec, topic, {p: 1 + max(r.offset for r in truth[topic] if r.partition == p)
                                      for p in range(parts)})
        yield gw, spec, truth
    finally:
        gw.stop()


def test_parquet_rows_match_consumed_records(spark, cluster, tmp_path):
    gw, spec, truth = cluster
    out = tmp_path / "raw.parquet"
    assert export(spark, spec.url, "raw", str(out)) == 200
    table = pq.read_table(out)
    assert table.schema.names == ["key", "value", "topic", "partition", "offset", "timestamp",
                                  "timestampType", "headers"]
    rows = sorted(table.to_pylist(), key=lambda r: (r["partition"], r["offset"]))
    got = [(r["partition"], r["offset"], r["key"], r["value"],
            tuple((h["key"], h["value"]) for h in r["headers"]),
            int(r["timestamp"].timestamp() * 1000), r["topic"]) for r in rows]
    assert got == [(r.partition, r.offset, r.key, r.value, r.headers, r.timestamp, "raw")
                   for r in truth["raw"]]


def test_json_values_become_columns(spark, cluster, tmp_path):
    gw, spec, truth = cluster
    out = tmp_path / "json.parquet"
    assert export(spark, spec.url, "json", str(out), value_format="json") == 60
    rows = {r["offset"]: r for r in pq.read_table(out).to_pylist()}
    assert set(rows) == {r.offset for r in truth["json"]}
    for r in truth["json"]:
        row = rows[r.offset]
        assert row["key"] == r.key
        if r.value is None:
            assert (row["id"], row["customer"], row["amount"]) == (None, None, None)
        else:
            doc = json.loads(r.value)
            assert (row["id"], row["customer"], row["amount"]) == (doc["id"], doc["customer"], doc["amount"])


def test_json_with_a_ddl_schema_file(spark, cluster, tmp_path):
    gw, spec, truth = cluster
    schema = tmp_path / "order.ddl"
    schema.write_text("id BIGINT, customer STRING")
    out = tmp_path / "json-ddl"
    export(spark, spec.url, "json", str(out), fmt="json", value_format="json", schema_path=str(schema))
    rows = [json.loads(line) for f in sorted(out.glob("part-*.json")) for line in f.read_text().splitlines()]
    assert len(rows) == 60
    assert {tuple(sorted(r)) for r in rows if r.get("id") is not None} == {
        ("customer", "headers", "id", "key", "offset", "partition", "timestamp", "timestampType", "topic")}


def test_avro_values_decode_with_the_writer_schema(spark, cluster, tmp_path):
    gw, spec, truth = cluster
    avsc = tmp_path / "order.avsc"
    avsc.write_text(json.dumps(AVRO_SCHEMA))
    out = tmp_path / "avro.parquet"
    assert export(spark, spec.url, "avro", str(out), value_format="avro", schema_path=str(avsc)) == 60
    rows = sorted(pq.read_table(out).to_pylist(), key=lambda r: r["offset"])
    assert [r["offset"] for r in rows] == [r.offset for r in truth["avro"]]
    assert [{k: r[k] for k in ("id", "customer", "amount", "tags", "status")} for r in rows] == _orders(60)


def test_include_headers_false_exports_without_the_headers_column(spark, cluster, tmp_path):
    gw, spec, truth = cluster
    avsc = tmp_path / "order.avsc"
    avsc.write_text(json.dumps(AVRO_SCHEMA))
    no_headers = {"includeHeaders": "false"}
    for topic, kwargs, count in (("raw", {}, 200), ("json", {"value_format": "json"}, 60),
                                 ("avro", {"value_format": "avro", "schema_path": str(avsc)}, 60)):
        out = tmp_path / f"{topic}-no-headers.parquet"
        assert export(spark, spec.url, topic, str(out), options=no_headers, **kwargs) == count
        table = pq.read_table(out)
        assert "headers" not in table.schema.names and "offset" in table.schema.names, topic
        assert sorted(table.column("offset").to_pylist()) == sorted(r.offset for r in truth[topic])


def test_bad_avro_value_stops_the_export_with_its_offset(spark, cluster, tmp_path):
    gw, spec, truth = cluster
    avsc = tmp_path / "order.avsc"
    avsc.write_text(json.dumps(AVRO_SCHEMA))
    bad_offset = truth["bad-avro"][-1].offset
    with pytest.raises(Exception, match=f"offset {bad_offset}"):
        export(spark, spec.url, "bad-avro", str(tmp_path / "o"), value_format="avro", schema_path=str(avsc))


def test_avro_schema_conversion():
    from pyspark.sql import types as T

    struct = avro_to_spark(AVRO_SCHEMA)
    assert struct == T.StructType([
        T.StructField("id", T.LongType()), T.StructField("customer", T.StringType()),
        T.StructField("amount", T.DoubleType()), T.StructField("tags", T.ArrayType(T.StringType())),
        T.StructField("status", T.StringType())])
    with pytest.raises(ExportError, match="more than one non-null branch"):
        avro_to_spark(["null", "int", "string"])


def test_export_arguments_are_checked(spark, cluster, tmp_path):
    gw, spec, _ = cluster
    with pytest.raises(ExportError, match="output format"):
        export(spark, spec.url, "raw", str(tmp_path / "x"), fmt="xlsx")
    with pytest.raises(ExportError, match="needs the writer's schema"):
        export(spark, spec.url, "avro", str(tmp_path / "y"), value_format="avro")
    clash = tmp_path / "clash.ddl"
    clash.write_text("offset BIGINT, name STRING")
    with pytest.raises(ExportError, match="clash"):
        export(spark, spec.url, "json", str(tmp_path / "z"), value_format="json", schema_path=str(clash))


def test_cli_export(spark, cluster, tmp_path, capsys):
    from stratalog.infra.cli import main

    gw, spec, truth = cluster
    out = tmp_path / "cli.parquet"
    assert main(["export", "--topic", "raw", "--to", str(out), "--object-store", spec.url]) == 0
    assert "exported 200 record(s)" in capsys.readouterr().err
    assert pq.read_table(out).num_rows == 200
    assert main(["export", "--topic", "raw", "--to", str(out), "--object-store", spec.url]) == 1
    err = capsys.readouterr().err
    assert err.startswith("stratalog: error:") and err.count("\n") == 1
    assert main(["export", "--topic", "avro", "--to", str(tmp_path / "a"), "--object-store", spec.url,
                 "--value-format", "avro"]) == 1
    assert "--schema" in capsys.readouterr().err
