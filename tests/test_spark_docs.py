"""spark/README.md's quickstart runs as written: its shell blocks with the installed CLI,
its Python block in a fresh Spark application with Spark's default settings (the data
source found by its short name, the project installed as users install it).

Two changes only, both to stay on loopback at free ports: `stratalog serve` gets
`--listen` and `--http off`, and the other commands find it through STRATALOG_BOOTSTRAP.
The `pip install` line is left out: the test runs in the project's environment.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from spark_helpers import install_as_users_do, spark_session
from stratalog.infra.processes import Child, ProcessFailed, accepting, free_port

README = ROOT / "spark" / "README.md"


def _blocks(heading: str) -> list[tuple[str, str]]:
    section = README.read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(sh|python)\n(.*?)```", section, re.S)


def _quickstart_blocks() -> list[tuple[str, str]]:
    return _blocks("Quickstart")


def test_the_quickstart_has_a_serve_block_a_client_block_and_a_python_block():
    kinds = [kind for kind, _ in _quickstart_blocks()]
    assert kinds == ["sh", "sh", "python"]


@pytest.mark.timeout(600)
def test_the_spark_quickstart_runs_as_written(tmp_path):
    spark_session()  # skips without pyspark or Java, like every Spark test
    (serve_block, client_block, python_block) = [body for _, body in _quickstart_blocks()]
    site = install_as_users_do(tmp_path / "site")
    work = tmp_path / "work"
    work.mkdir()
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "STRATALOG_BOOTSTRAP": f"127.0.0.1:{port}", "PYSPARK_PYTHON": sys.executable,
           "PYSPARK_DRIVER_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}

    serve_lines = [line.split("#", 1)[0].strip() for line in serve_block.splitlines()
                   if line.startswith("stratalog serve")]
    assert len(serve_lines) == 1
    serve = Child("stratalog serve", ["bash", "-c", f"exec {serve_lines[0]} --listen 127.0.0.1:{port} --http off"],
                  tmp_path / "serve.log", env=env, cwd=work)
    try:
        try:
            serve.wait_until(lambda: accepting("127.0.0.1", port), 60, "accepting connections")
        except ProcessFailed as e:
            raise AssertionError(str(e)) from None
        clients = subprocess.run(["bash", "-euo", "pipefail", "-c", client_block], cwd=work, env=env,
                                 capture_output=True, text=True, timeout=300)
        assert clients.returncode == 0, clients.stderr[-3000:]
        assert list((work / "orders-parquet").glob("*.parquet")), "export wrote no Parquet file"

        job = subprocess.run([sys.executable, "-c", python_block], cwd=work,
                             env={**env, "PYTHONPATH": str(site)}, capture_output=True, text=True, timeout=300)
        assert job.returncode == 0, job.stderr[-3000:]
        # The JVM reader's block, its jar built afresh from the installed package's sources.
        [(_, jvm_block)] = _blocks("Faster batch reads: the JVM reader")
        jvm_job = subprocess.run([sys.executable, "-c", jvm_block], cwd=work,
                                 env={**env, "PYTHONPATH": str(site), "STRATALOG_CACHE": str(tmp_path / "jars")},
                                 capture_output=True, text=True, timeout=300)
    finally:
        serve.stop(30)
    out = job.stdout
    assert "k1" in out and '{"amount": 3}' in out and "k2" in out  # the show()
    assert out.strip().splitlines()[-2:] == ["1", "2"]  # the filtered count, then the stream's rows
    if shutil.which("javac") or os.environ.get("JAVA_HOME"):
        assert jvm_job.returncode == 0, jvm_job.stderr[-3000:]
        assert jvm_job.stdout.strip().splitlines()[-1] == "2"
        assert list((tmp_path / "jars").glob("stratalog-spark-*.jar"))
    else:
        assert "needs javac" in jvm_job.stderr
