"""Shared fixtures: real gateways started as `stratalog serve` processes on loopback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("unit", "integration", "compat", "chaos")


def pytest_collection_modifyitems(items) -> None:
    """Every test gets one tier: its own mark, else `compat` under tests/compat, else
    `integration`. The fast tier is `pytest -m unit`."""
    for item in items:
        if any(item.get_closest_marker(t) for t in TIERS):
            continue
        item.add_marker(pytest.mark.compat if "compat" in item.path.parts else pytest.mark.integration)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GatewayProcess:
    """One `stratalog serve` process; restartable on the same data directory and port."""

    def __init__(self, data_dir: Path, settings: dict[str, object] | None = None,
                 extra_args: list[str] | None = None, port: int | None = None):
        self.data_dir = data_dir
        self.port = port or free_port()
        self.settings = {"wal.flush.ms": 20, "group.initial.rebalance.delay.ms": 0,
                         "group.min.session.timeout.ms": 1000, **(settings or {})}
        self.extra_args = extra_args or []
        self.proc: subprocess.Popen | None = None
        self.log_path = data_dir.parent / f"gateway-{self.port}.log"
        self.http_url: str | None = None
        self.banner = ""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--listen", self.bootstrap,
               "--data-dir", str(self.data_dir), "--log-level", "INFO", "--http", "127.0.0.1:0"]
        for k, v in self.settings.items():
            cmd += ["--set", f"{k}={v}"]
        return cmd + self.extra_args

    def start(self, timeout: float = 30) -> "GatewayProcess":
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.command(), cwd=ROOT, stdout=subprocess.PIPE, stderr=log,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline().decode()
        if "serving Kafka" not in line:
            self.proc.kill()
            raise RuntimeError(f"gateway did not start: {line!r}\n{self.log_path.read_text()[-3000:]}")
        self.banner = line
        if "http on " in line:
            self.http_url = "http://" + line.rsplit("http on ", 1)[1].strip()
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("gateway did not accept connections")

    def kill9(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


@pytest.fixture
def gateway_factory(tmp_path):
    started: list[GatewayProcess] = []

    def make(settings=None, extra_args=None, data_dir=None) -> GatewayProcess:
        gw = GatewayProcess(data_dir or tmp_path / f"data{len(started)}", settings, extra_args)
        started.append(gw)
        return gw.start()

    yield make
    for gw in started:
        gw.stop()


@pytest.fixture
def gateway(gateway_factory) -> GatewayProcess:
    return gateway_factory()
