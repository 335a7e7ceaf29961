"""The one launcher of child processes (`stratalog.infra.processes`) that `stratalog
cluster`, the benchmarks and these tests use: readiness, failure messages, stopping."""

from __future__ import annotations

import sys
import time

import pytest

from stratalog.infra.processes import Child, ProcessFailed, accepting, free_port, log_tail

pytestmark = pytest.mark.unit


def test_a_child_that_exits_is_named_with_its_status_and_log(tmp_path):
    child = Child("crasher", [sys.executable, "-c", "print('boom: bad config'); raise SystemExit(3)"],
                  tmp_path / "crasher.log")
    with pytest.raises(ProcessFailed, match=r"crasher exited before it was ready \(exit status 3\): boom: bad config"):
        child.wait_until(lambda: False, 10, "ready")


def test_a_child_not_ready_in_time_says_so(tmp_path):
    child = Child("sleeper", [sys.executable, "-c", "import time; print('waiting', flush=True); time.sleep(30)"],
                  tmp_path / "sleeper.log")
    try:
        with pytest.raises(ProcessFailed, match=r"sleeper was not listening within 0.3 s"):
            child.wait_until(lambda: False, 0.3, "listening")
    finally:
        child.stop(5)
    assert not child.alive


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(tmp_path):
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    child = Child("stubborn", [sys.executable, "-c", code], tmp_path / "stubborn.log")
    child.wait_until(lambda: "up" in log_tail(tmp_path / "stubborn.log"), 10, "up")
    started = time.monotonic()
    child.stop(0.5)
    assert not child.alive and child.popen.returncode == -9
    assert time.monotonic() - started < 10


def test_ready_when_the_probe_says_so(tmp_path):
    port = free_port()
    code = ("import socket, time; s = socket.socket(); s.bind(('127.0.0.1', %d)); s.listen(); "
            "time.sleep(30)" % port)
    child = Child("listener", [sys.executable, "-c", code], tmp_path / "listener.log")
    try:
        child.wait_until(lambda: accepting("127.0.0.1", port), 10, "accepting")
    finally:
        child.stop(5)


def test_free_ports_lie_below_the_range_outgoing_connections_take_theirs_from():
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0]) \
        if sys.platform == "linux" else 32768
    ports = {free_port() for _ in range(20)}
    assert all(1024 < p < low for p in ports), ports
    assert len(ports) > 1  # drawn, not one fixed port
