"""A SparkSession ready for Stratalog jobs, with the data source registered.

Examples
--------
>>> from stratalog.spark.session import get_session
>>> spark = get_session()  # local[*], or get_session("spark://host:7077")  # doctest: +SKIP
>>> spark.read.format("stratalog").option("topic", "t").load("file:///data/objects")  # doctest: +SKIP
"""

from __future__ import annotations

import os
import sys


def get_session(master: str | None = None, *, app_name: str = "stratalog", conf: dict | None = None,
                jvm: bool = False):
    """The active session (or a new one on `master`, default ``local[*]``), with the
    `stratalog` data source registered (also found by its short name without it, when
    the package is installed).

    Python workers run this interpreter unless PYSPARK_PYTHON says otherwise, so they see
    the same installed packages as the driver. `jvm` adds the JVM reader's jar
    (`spark.jvm`, built on first use; needs a JDK) so ``format("stratalog-jvm")`` works.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from stratalog.spark.datasource import StratalogDataSource

    builder = SparkSession.builder.appName(app_name).master(master or "local[*]")
    settings = dict(conf or {})
    if (master or "local").startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        settings.setdefault("spark.ui.enabled", "false")
        settings.setdefault("spark.sql.shuffle.partitions", "8")
    if jvm:
        from stratalog.spark.jvm import jar_path

        settings["spark.jars"] = ",".join(filter(None, [settings.get("spark.jars"), str(jar_path())]))
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.dataSource.register(StratalogDataSource)
    if jvm:
        from stratalog.spark.jvm_plan import register

        register(spark)  # the JVM reader plans in this process, not in one per query
    return spark
