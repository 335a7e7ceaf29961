"""Lets Spark find the `stratalog` data source without `spark.dataSource.register`.

Spark 4 imports every top-level module whose name starts with ``pyspark_`` and registers
its ``DefaultSource`` under the source's name.
"""

from stratalog.spark.datasource import StratalogDataSource as DefaultSource

__all__ = ["DefaultSource"]
