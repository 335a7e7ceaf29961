"""Spark finds the data source by its short name alone (no `spark.dataSource.register`), in
a fresh Spark application whose working directory holds a folder named `spark`, as data
projects often do. PySpark's workers run with that directory first on their import path,
so a package of ours named `spark` would be shadowed there; ours is `stratalog.spark`.

The project is installed as users install it (`pip install .`, here into a target
directory): Spark discovers sources by scanning the import path for `pyspark_*` modules,
which an editable install's import hook does not show it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import GatewayProcess
from spark_helpers import consume_all, create_topic, install_as_users_do, produce, spark_session, wait_sealed
from stratalog.spark.objects import StoreSpec

READ = textwrap.dedent("""
    import sys
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("discovery")
             .config("spark.ui.enabled", "false").getOrCreate())
    rows = (spark.read.format("stratalog").option("topic", sys.argv[2]).load(sys.argv[1])
            .selectExpr("CAST(value AS STRING) AS v").collect())
    print("VALUES", ",".join(sorted(r.v for r in rows)))
    spark.stop()
""")


@pytest.mark.timeout(300)
def test_short_name_works_beside_a_users_spark_folder(tmp_path):
    spark_session()  # skips without pyspark or Java, like every Spark test
    data = tmp_path / "data"
    gw = GatewayProcess(data, {"log.roll.ms": 300}).start()
    try:
        create_topic(gw.bootstrap, "found", 1)
        produce(gw.bootstrap, "found", [(0, b"k", b"v%d" % i, [], None) for i in range(5)])
        truth = consume_all(gw.bootstrap, "found", 1)
        spec = StoreSpec((data / "objects").as_uri())
        wait_sealed(spec, "found", {0: 1 + max(r.offset for r in truth)})
    finally:
        gw.stop()

    site = install_as_users_do(tmp_path / "site")

    project = tmp_path / "project"
    (project / "spark").mkdir(parents=True)
    (project / "spark" / "__init__.py").write_text('raise ImportError("the user\'s own spark package")\n')
    (project / "job.py").write_text(READ)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
           "SPARK_LOCAL_IP": "127.0.0.1", "PYTHONPATH": str(site)}
    done = subprocess.run([sys.executable, "job.py", spec.url, "found"], cwd=project, env=env,
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    values = next(line for line in done.stdout.splitlines() if line.startswith("VALUES "))
    assert values == "VALUES " + ",".join(f"v{i}" for i in range(5))
