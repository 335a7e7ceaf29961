"""`df.write.format("stratalog")` and `writeStream.format("stratalog")`: produce rows with
the Kafka sink's columns through the gateways.

Options and columns are checked here, on the driver, so a missing topic or a wrong column
type fails before any task runs; the tasks write (`spark.writing`).

Examples
--------
>>> (df.selectExpr("CAST(id AS STRING) AS key", "to_json(struct(*)) AS value")
...    .write.format("stratalog").option("kafka.bootstrap.servers", "127.0.0.1:9092")
...    .option("topic", "orders").save())  # doctest: +SKIP
>>> q = (stream.selectExpr("CAST(value AS STRING) AS value")
...      .writeStream.format("stratalog").option("kafka.bootstrap.servers", "127.0.0.1:9092")
...      .option("topic", "orders").option("checkpointLocation", "/ckpt").start())  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql.datasource import WriterCommitMessage

from stratalog.spark.options import OptionError
from stratalog.spark.sink_options import WriteOptions, parse_write_options
from stratalog.spark.writing import (SinkError, TaskResult, check_producer_settings, write_micro_batch_task,
                                     write_task)

# Tasks take Arrow batches where this Spark hands them over (`spark.writing.records` takes
# rows too), so the sink works on every Spark 4 release.
try:
    from pyspark.sql.datasource import DataSourceArrowWriter as _WriterBase
except ImportError:  # pragma: no cover - older Spark
    from pyspark.sql.datasource import DataSourceWriter as _WriterBase
try:
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase
except ImportError:  # pragma: no cover - older Spark
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase

# Spark sets these local properties on every task of a micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # the query's id, kept in its checkpoint
BATCH_ID_PROPERTY = "streaming.sql.batchId"


@dataclass
class SinkCommit(WriterCommitMessage):
    """What a task wrote, as Spark hands it to the driver's commit."""

    partition: int
    records: int
    skipped: bool  # a micro-batch part this task's transactional id had committed before

    @classmethod
    def of(cls, result: TaskResult) -> "SinkCommit":
        return cls(result.partition, result.records, result.skipped)


def _check(options: WriteOptions) -> None:
    try:
        check_producer_settings(options)
    except SinkError as exc:
        raise OptionError(str(exc)) from None


def _task():
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None:
        raise RuntimeError("the stratalog sink writes inside Spark tasks only")
    return context


class StratalogWriter(_WriterBase):
    """Batch writes: each task produces its rows with an idempotent producer.

    A task Spark retries writes its rows again (at least once); the driver's commit has
    nothing left to do, and an abort cannot take back what tasks already wrote.
    """

    def __init__(self, options: dict, schema, overwrite: bool) -> None:
        if overwrite:
            raise OptionError("the stratalog sink appends records; save mode overwrite is not supported "
                              "(use append or the default errorifexists)")
        self.options: WriteOptions = parse_write_options(options, schema)
        _check(self.options)

    def write(self, iterator):
        result = write_task(iterator, self.options, _task().partitionId())
        return SinkCommit.of(result)

    def commit(self, messages) -> None:
        pass

    def abort(self, messages) -> None:
        pass


class StratalogStreamWriter(_StreamWriterBase):
    """Streaming writes: each task writes its part of a micro-batch in one Kafka transaction
    and skips a part it committed before (exactly once; see `spark.writing`)."""

    def __init__(self, options: dict, schema) -> None:
        self.options: WriteOptions = parse_write_options(options, schema)
        _check(self.options)

    def write(self, iterator):
        context = _task()
        query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if not query_id or batch_id is None:
            raise RuntimeError("no streaming query id or batch id on this task; is this a micro-batch query?")
        result = write_micro_batch_task(iterator, self.options, query_id, int(batch_id), context.partitionId())
        return SinkCommit.of(result)

    def commit(self, messages, batchId: int) -> None:
        pass  # every task committed its own transaction

    def abort(self, messages, batchId: int) -> None:
        pass  # committed tasks stay committed; the batch's replay skips them
