"""Export a topic's sealed records to files (Parquet by default) on Spark.

With ``value_format="raw"`` the files have the Kafka source's columns (`spark.schema`).
With ``json`` or ``avro`` each value is decoded into columns that replace ``value``; the
record's ``key``, ``topic``, ``partition``, ``offset``, ``timestamp``, ``timestampType``
and ``headers`` stay alongside. A tombstone gives nulls in every value column. A value
that does not decode stops the export with its partition and offset.

* json: the schema comes from `schema_path` (Spark DDL such as ``id INT, name STRING``,
  Spark's JSON form of a struct, or an Avro record schema ``.avsc``), else Spark infers it
  from the values.
* avro: every value is one record in Avro's binary encoding without a header (what
  fastavro's ``schemaless_writer`` writes); `schema_path` is the writer's ``.avsc``.

Examples
--------
>>> from stratalog.spark.export import export
>>> export(spark, "s3://bucket/prefix", "orders", "/data/orders.parquet",
...        value_format="json")  # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path

from stratalog.spark.schema import SPARK_SCHEMA

META_COLUMNS = ("key", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
FORMATS = ("parquet", "json", "orc")
VALUE_FORMATS = ("raw", "json", "avro")


class ExportError(RuntimeError):
    """Bad export arguments, or a value that does not decode as promised."""


# ---- schemas -------------------------------------------------------------------------


def avro_to_spark(schema):
    """The Spark type that holds values of an Avro schema (parsed JSON)."""
    from pyspark.sql import types as T

    if isinstance(schema, list):  # a union: nullable when it has null, one branch otherwise
        branches = [b for b in schema if b != "null"]
        if len(branches) != 1:
            raise ExportError(f"Avro union {schema} has more than one non-null branch")
        return avro_to_spark(branches[0])
    if isinstance(schema, str):
        schema = {"type": schema}
    kind, logical = schema.get("type"), schema.get("logicalType")
    if isinstance(kind, (dict, list)):
        return avro_to_spark(kind)
    if logical in ("timestamp-millis", "timestamp-micros", "local-timestamp-millis", "local-timestamp-micros"):
        return T.TimestampType()
    if logical == "date":
        return T.DateType()
    if logical == "decimal":
        return T.DecimalType(schema.get("precision", 38), schema.get("scale", 0))
    simple = {"boolean": T.BooleanType(), "int": T.IntegerType(), "long": T.LongType(),
              "float": T.FloatType(), "double": T.DoubleType(), "bytes": T.BinaryType(),
              "string": T.StringType(), "fixed": T.BinaryType(), "enum": T.StringType(),
              "null": T.NullType()}
    if kind in simple:
        return simple[kind]
    if kind == "array":
        return T.ArrayType(avro_to_spark(schema["items"]))
    if kind == "map":
        return T.MapType(T.StringType(), avro_to_spark(schema["values"]))
    if kind == "record":
        return T.StructType([T.StructField(f["name"], avro_to_spark(f["type"])) for f in schema["fields"]])
    raise ExportError(f"Avro type {kind!r} has no Spark counterpart here (named type references "
                      "are not supported; inline the definition)")


def load_schema(path: str | Path):
    """A struct schema from a file: Avro ``.avsc``, Spark's JSON form, or Spark DDL."""
    from pyspark.sql.types import StructType, _parse_datatype_json_string

    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and doc.get("type") == "record":
        return avro_to_spark(doc), doc
    if isinstance(doc, dict) and doc.get("type") == "struct":
        return _parse_datatype_json_string(text), None
    try:
        return StructType.fromDDL(text.strip()), None
    except Exception as exc:
        raise ExportError(f"{path}: not an Avro record schema, a Spark JSON schema or Spark DDL ({exc})") from None


# ---- value decoding ------------------------------------------------------------------


def _meta_columns(df) -> list[str]:
    """The Kafka columns `df` has: all of META_COLUMNS but `headers` when the reader was
    given includeHeaders=false."""
    return [c for c in META_COLUMNS if c in df.columns]


def _avro_decoder(avro_schema: dict, struct, meta: list[str]):
    """A mapInArrow function: Kafka-source batches in (with the columns `meta`),
    decoded-value batches out."""
    import io

    from pyspark.sql.types import StructField, StructType

    out_type = StructType([f for f in SPARK_SCHEMA.fields if f.name in meta]
                          + [StructField(f.name, f.dataType, True) for f in struct.fields])
    names = [f.name for f in struct.fields]

    def decode(batches):
        import fastavro
        import pyarrow as pa

        from stratalog.spark.export import _arrow_schema

        parsed = fastavro.parse_schema(avro_schema)
        target = _arrow_schema(out_type)
        for batch in batches:
            values = batch.column("value").to_pylist()
            offsets = batch.column("offset").to_pylist()
            partitions = batch.column("partition").to_pylist()
            rows = []
            for value, offset, partition in zip(values, offsets, partitions):
                if value is None:
                    rows.append(dict.fromkeys(names))
                    continue
                buf = io.BytesIO(value)
                try:
                    record = fastavro.schemaless_reader(buf, parsed, None)
                except Exception as exc:  # fastavro raises many types on bad input
                    raise ExportError(f"partition {partition} offset {offset}: value is not Avro of "
                                      f"the given schema: {exc}") from None
                if buf.tell() != len(value):
                    raise ExportError(f"partition {partition} offset {offset}: {len(value) - buf.tell()} "
                                      "bytes follow the Avro record")
                rows.append({n: record.get(n) for n in names})
            # Spark hands timestamps in the session's zone; the output is declared in UTC.
            columns = {c: batch.column(c).cast(target.field(c).type) for c in meta}
            decoded = pa.Table.from_pylist(rows, schema=pa.schema([target.field(n) for n in names]))
            arrays = [columns[f.name] if f.name in columns else decoded.column(f.name).combine_chunks()
                      for f in out_type.fields]
            yield pa.RecordBatch.from_arrays(arrays, schema=target)

    return decode, out_type


def _arrow_schema(struct):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone="UTC")


def _check_names(struct) -> None:
    clash = [f.name for f in struct.fields if f.name in META_COLUMNS]
    if clash:
        raise ExportError(f"value field(s) {', '.join(clash)} clash with Kafka columns of the same name")


def decoded(df, value_format: str, schema_path: str | None = None):
    """`df` (Kafka-source rows) with the value decoded into columns."""
    from pyspark.sql import functions as F

    if value_format == "raw":
        return df
    if value_format == "json":
        if schema_path:
            struct, _ = load_schema(schema_path)
        else:
            text = df.where(F.col("value").isNotNull()).select(F.col("value").cast("string").alias("v"))
            if text.limit(1).count() == 0:
                raise ExportError("no non-null values to infer a JSON schema from; give a schema file")
            struct = df.sparkSession.read.json(text.rdd.map(lambda row: row.v)).schema
            if "_corrupt_record" in struct.fieldNames():
                raise ExportError("some values are not JSON objects (Spark found corrupt records)")
        _check_names(struct)
        parsed = F.from_json(F.col("value").cast("string"), struct, {"mode": "FAILFAST"})
        meta = _meta_columns(df)
        return df.select(*meta, parsed.alias("__v")).select(*meta, "__v.*")
    if value_format == "avro":
        if not schema_path:
            raise ExportError("value format avro needs the writer's schema (--schema FILE.avsc)")
        struct, avro_schema = load_schema(schema_path)
        if avro_schema is None:
            raise ExportError(f"{schema_path}: value format avro needs an Avro record schema (.avsc)")
        _check_names(struct)
        decode, out_type = _avro_decoder(avro_schema, struct, _meta_columns(df))
        return df.mapInArrow(decode, out_type)
    raise ExportError(f"unknown value format {value_format!r}; expected one of {', '.join(VALUE_FORMATS)}")


def export(spark, object_store_url: str, topic: str, to: str, *, fmt: str = "parquet",
           value_format: str = "raw", schema_path: str | None = None, mode: str = "errorifexists",
           options: dict | None = None) -> int:
    """Write a topic's sealed records to `to` and return how many were written.

    Parameters
    ----------
    spark : SparkSession
    object_store_url : str
        ``file:///dir`` or ``s3://bucket/prefix``.
    topic, to : str
        What to export, and the output directory (any path Spark writes to).
    fmt : {"parquet", "json", "orc"}
    value_format : {"raw", "json", "avro"}
    schema_path : str, optional
        Schema of the values (see the module docstring).
    mode : str
        Spark's save mode: ``errorifexists`` (default), ``overwrite``, ``append``, ``ignore``.
    options : dict, optional
        More reader options (``endpoint``, ``region``, ``pathStyle``, offsets, ...).
    """
    from stratalog.spark.datasource import StratalogDataSource

    if fmt not in FORMATS:
        raise ExportError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
    spark.dataSource.register(StratalogDataSource)
    reader = spark.read.format("stratalog").option("topic", topic)
    for key, value in (options or {}).items():
        if value is not None:
            reader = reader.option(key, value)
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    rows = reader.load(object_store_url)
    # The source gives null headers for a record without any; exported files keep the
    # empty array they always had (a JSON line would otherwise lose the field).
    if "headers" in rows.columns:  # absent with includeHeaders=false
        rows = rows.withColumn("headers", F.coalesce("headers", F.array().cast(rows.schema["headers"].dataType)))
    df = decoded(rows, value_format, schema_path)
    observed = Observation("stratalog-export")
    df.observe(observed, F.count(F.lit(1)).alias("rows")).write.mode(mode).format(fmt).save(to)
    return int(observed.get["rows"])
