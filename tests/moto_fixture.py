"""moto's S3 server in its own process, on a free loopback port.

In a subprocess rather than moto's `ThreadedMotoServer`: moto compiles templates while it
serves, and CPython 3.11 can fail compiling in two threads at once ("AST constructor
recursion depth mismatch"), which would take down the pytest process itself.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from stratalog.infra.processes import LOOPBACK, Child, ProcessFailed, free_port, http_get, moto_command


class MotoServer:
    """Same start/stop shape as moto's ThreadedMotoServer."""

    def __init__(self, ip_address: str = LOOPBACK, port: int | None = None, verbose: bool = False):
        if ip_address != LOOPBACK:
            raise ValueError("the test S3 server listens on loopback only")
        self.host = ip_address
        self.port = port or free_port()
        self.verbose = verbose
        self.child: Child | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def proc(self):
        return None if self.child is None else self.child.popen

    def get_host_and_port(self) -> tuple[str, int]:
        return self.host, self.port

    def start(self, timeout: float = 30) -> "MotoServer":
        log = Path(tempfile.mkdtemp(prefix="moto-")) / "moto.log"
        self.child = Child("moto's S3 server", moto_command(self.port), log, new_session=False)
        try:
            self.child.wait_until(lambda: http_get(self.url + "/moto-api/") is not None, timeout,
                                  "answering")
        except ProcessFailed as e:
            self.stop()
            raise RuntimeError(str(e)) from None
        return self

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(10)


def dummy_aws_env(monkeypatch, tmp_path: Path) -> None:
    """Dummy credentials through the standard AWS variables, and nothing of the machine's
    own AWS setup (profiles, endpoints, instance metadata)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3",
                 "AWS_REGION", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
