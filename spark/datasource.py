"""`spark.read.format("stratalog")`: Spark reads a topic straight from the bucket, sealed
segments then committed WAL ranges (`spark.walread`), up to the high watermark.

Examples
--------
>>> from stratalog.spark.datasource import StratalogDataSource
>>> spark.dataSource.register(StratalogDataSource)  # doctest: +SKIP
>>> df = (spark.read.format("stratalog")
...       .option("topic", "orders")
...       .load("s3://bucket/prefix"))  # doctest: +SKIP
>>> df.where("partition = 0 AND offset >= 1000").count()  # doctest: +SKIP

Options are described in `spark.options`; rows have the Kafka source's columns
(`spark.schema`). Query filters are evaluated by Spark (see `spark.planning` for why none
are pushed down); the offset, timestamp and `assign` options prune what is read.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource, DataSourceReader

from stratalog.spark.options import include_headers, parse_options
from stratalog.spark.planning import plan_read
from stratalog.spark.reading import read_rows
from stratalog.spark.schema import spark_schema

NAME = "stratalog"


class StratalogDataSource(DataSource):
    """Batch and streaming reads of a Stratalog topic, up to its high watermark; writes
    through gateways (`spark.sink`)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return spark_schema(include_headers(self.options))

    def reader(self, schema) -> "StratalogReader":
        return StratalogReader(dict(self.options))

    def streamReader(self, schema):
        from stratalog.spark.streaming import StratalogStreamReader

        return StratalogStreamReader(dict(self.options))

    def writer(self, schema, overwrite: bool):
        from stratalog.spark.sink import StratalogWriter

        return StratalogWriter(dict(self.options), schema, overwrite)

    def streamWriter(self, schema, overwrite: bool):
        from stratalog.spark.sink import StratalogStreamWriter

        return StratalogStreamWriter(dict(self.options), schema)


class StratalogReader(DataSourceReader):
    """Plans one slice per sealed segment (or byte range of a large one) and per committed
    WAL range, and reads it.

    Parameters
    ----------
    options : dict
        The read's options; checked here so a bad one fails before any work starts.
    """

    def __init__(self, options: dict) -> None:
        self.options = parse_options(options)

    def partitions(self):
        return plan_read(self.options)

    def read(self, partition):
        return read_rows(partition, self.options)
