"""moto's S3 server in its own process, on a free loopback port.

In a subprocess rather than moto's `ThreadedMotoServer`: moto compiles templates while it
serves, and CPython 3.11 can fail compiling in two threads at once ("AST constructor
recursion depth mismatch"), which would take down the pytest process itself.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MotoServer:
    """Same start/stop shape as moto's ThreadedMotoServer."""

    def __init__(self, ip_address: str = "127.0.0.1", port: int | None = None, verbose: bool = False):
        self.host = ip_address
        self.port = port or _free_port()
        self.verbose = verbose
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def get_host_and_port(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self, timeout: float = 30) -> "MotoServer":
        out = None if self.verbose else subprocess.DEVNULL
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", self.host,
                                      "-p", str(self.port)], stdout=out, stderr=out)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto server exited with {self.proc.returncode}")
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("moto server did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
