"""Shared fixtures: real gateways started as `stratalog serve` processes on loopback."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from stratalog.infra.processes import Child, ProcessFailed, accepting, free_port, serve_command

__all__ = ["ROOT", "GatewayProcess", "free_port", "with_ctrl_c"]

ROOT = Path(__file__).resolve().parent.parent


def with_ctrl_c() -> None:
    """A `preexec_fn` for a child a test sends SIGINT, as a terminal's Ctrl-C would: a test
    run started in the background of a non-interactive shell (`... &` in a script) inherits
    SIGINT ignored, and so would the child, which then never sees it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


TIERS = ("unit", "integration", "compat", "chaos")


def pytest_collection_modifyitems(items) -> None:
    """Every test gets one tier: its own mark, else `compat` under tests/compat, else
    `integration`. The fast tier is `pytest -m unit`."""
    for item in items:
        if any(item.get_closest_marker(t) for t in TIERS):
            continue
        item.add_marker(pytest.mark.compat if "compat" in item.path.parts else pytest.mark.integration)


class GatewayProcess:
    """One `stratalog serve` process; restartable on the same data directory and port.
    `release` is the import root of another Stratalog version to run instead of this
    checkout (tests/release_tree.py); setting it to None before a restart upgrades it."""

    def __init__(self, data_dir: Path, settings: dict[str, object] | None = None,
                 extra_args: list[str] | None = None, port: int | None = None,
                 release: Path | None = None):
        self.data_dir = data_dir
        self.release = release
        self.port = port or free_port()
        self.settings = {"wal.flush.ms": 20, "group.initial.rebalance.delay.ms": 0,
                         "group.min.session.timeout.ms": 1000, **(settings or {})}
        self.extra_args = extra_args or []
        self.child: Child | None = None
        self.log_path = data_dir.parent / f"gateway-{self.port}.log"
        self.http_url: str | None = None
        self.banner = ""

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def proc(self):
        return None if self.child is None else self.child.popen

    def command(self) -> list[str]:
        return serve_command(self.bootstrap, self.data_dir, "--log-level", "INFO", "--http", "127.0.0.1:0",
                             *self.extra_args, settings=self.settings)

    def start(self, timeout: float = 30) -> "GatewayProcess":
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        if self.release is not None:
            # First on the path, and the working directory (which `python -m` puts first).
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(self.release), env.get("PYTHONPATH")]))
        self.child = Child(f"gateway on {self.bootstrap}", self.command(), self.log_path,
                           cwd=self.release or ROOT, env=env, new_session=False, stdout_pipe=True)
        line = self.child.popen.stdout.readline().decode()
        if "serving Kafka" not in line:
            self.child.kill9()
            raise RuntimeError(f"gateway did not start: {line!r}\n{self.log_tail()[-3000:]}")
        self.banner = line
        if "http on " in line:
            self.http_url = "http://" + line.rsplit("http on ", 1)[1].strip()
        try:
            self.child.wait_until(lambda: accepting("127.0.0.1", self.port), timeout, "accepting connections")
        except ProcessFailed as e:
            raise RuntimeError(str(e)) from None
        return self

    def kill9(self) -> None:
        if self.child is not None:
            self.child.kill9()

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop(20)

    def log_tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:] if self.log_path.exists() else ""


@pytest.fixture
def gateway_factory(tmp_path):
    started: list[GatewayProcess] = []

    def make(settings=None, extra_args=None, data_dir=None, release=None) -> GatewayProcess:
        gw = GatewayProcess(data_dir or tmp_path / f"data{len(started)}", settings, extra_args,
                            release=release)
        started.append(gw)
        return gw.start()

    yield make
    for gw in started:
        gw.stop()


@pytest.fixture
def gateway(gateway_factory) -> GatewayProcess:
    return gateway_factory()
