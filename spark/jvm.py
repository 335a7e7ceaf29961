"""The jar of the JVM reader (`format("stratalog-jvm")`), built from the Java sources
shipped in this package against the installed PySpark's own jars, once per source and
Spark version, into a cache directory.

Examples
--------
>>> from stratalog.spark.jvm import jar_path
>>> jar_path()  # doctest: +SKIP
PosixPath('/root/.cache/stratalog/stratalog-spark-3f2a....jar')

``python -m stratalog.spark.jvm`` prints the path, for ``spark-submit --jars``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "jvm"
CACHE_ENV = "STRATALOG_CACHE"
JAVA_RELEASE = "17"  # the oldest Java Spark 4 runs on


class JarBuildError(RuntimeError):
    """The jar cannot be built here (no JDK, or javac refused the sources)."""


def spark_jars() -> Path:
    """The directory of the jars PySpark runs with (SPARK_HOME's when set)."""
    home = os.environ.get("SPARK_HOME")
    if home and (Path(home) / "jars").is_dir():
        return Path(home) / "jars"
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def _files() -> list[Path]:
    return sorted(p for p in SOURCES.rglob("*") if p.is_file())


def _javac() -> str:
    home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(home) / "bin" / "javac")] if home else []
    candidates.append(shutil.which("javac") or "")
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    raise JarBuildError("building the stratalog-jvm reader needs javac from a JDK 17 or newer "
                        "(set JAVA_HOME or put javac on PATH)")


def jar_path(cache_dir: Path | None = None) -> Path:
    """The jar for these sources and this Spark, built if it is not in the cache yet."""
    jars = spark_jars()
    files = _files()
    digest = hashlib.sha256()
    for f in files:
        digest.update(str(f.relative_to(SOURCES)).encode() + b"\0" + f.read_bytes() + b"\0")
    digest.update(",".join(sorted(p.name for p in jars.glob("spark-sql*.jar"))).encode())
    cache = Path(cache_dir or os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "stratalog")
    jar = cache / f"stratalog-spark-{digest.hexdigest()[:16]}.jar"
    if jar.is_file():
        return jar
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stratalog-jar-") as tmp:
        classes = Path(tmp) / "classes"
        sources = [str(f) for f in files if f.suffix == ".java"]
        run = subprocess.run([_javac(), "--release", JAVA_RELEASE, "-nowarn", "-encoding", "UTF-8",
                              "-cp", str(jars / "*"), "-d", str(classes), *sources],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise JarBuildError(f"javac failed on the stratalog-jvm sources:\n{run.stderr[-4000:]}")
        building = Path(tmp) / "out.jar"
        with zipfile.ZipFile(building, "w", zipfile.ZIP_DEFLATED) as z:
            for f in sorted(classes.rglob("*.class")):
                z.write(f, str(f.relative_to(classes)))
            resources = SOURCES / "resources"
            for f in sorted(p for p in resources.rglob("*") if p.is_file()):
                z.write(f, str(f.relative_to(resources)))
        # Another process may build the same jar at once: each moves a whole file in.
        staged = cache / f".{jar.name}.{os.getpid()}"
        shutil.copyfile(building, staged)
        os.replace(staged, jar)
    return jar


if __name__ == "__main__":
    try:
        print(jar_path())
    except JarBuildError as exc:
        sys.exit(f"stratalog.spark.jvm: {exc}")
