"""`stratalog serve` on bad input: one clear line on stderr and a non-zero exit."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from conftest import ROOT, GatewayProcess


def serve(*args, timeout=30):
    return subprocess.run([sys.executable, "-m", "stratalog.infra.cli", "serve", "--http", "off", *args],
                          cwd=ROOT, capture_output=True, timeout=timeout)


def one_error(proc, *fragments):
    assert proc.returncode != 0
    lines = proc.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("stratalog: error:") or lines[0].startswith("usage:") or "error" in lines[0]
    for f in fragments:
        assert f in lines[0], lines[0]


@pytest.mark.parametrize("args, fragment", [
    (["--set", "wal.flush.ms=soon"], "wal.flush.ms"),
    (["--set", "no.such.setting=1"], "no.such.setting"),
    (["--set", "num.partitions=0"], "num.partitions"),
    (["--set", "novalue"], "KEY=VALUE"),
    (["--listen", "nonsense"], "--listen"),
    (["--coordinator", "zookeeper://x:1"], "coordinator"),
    (["--object-store", "ftp://x/y"], "object store"),
])
def test_bad_flags(tmp_path, args, fragment):
    proc = serve("--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0", *args)
    out = proc.stderr.decode().strip().splitlines()
    assert proc.returncode != 0
    assert fragment in out[-1], out
    assert "Traceback" not in proc.stderr.decode()


def test_bad_config_file(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("wal.flush.ms = [")
    proc = serve("--config", str(cfg), "--data-dir", str(tmp_path / "d"), "--listen", "127.0.0.1:0")
    one_error(proc, "TOML")
    proc = serve("--config", str(tmp_path / "missing.toml"), "--listen", "127.0.0.1:0")
    one_error(proc, "does not exist")


def test_config_file_and_env_are_applied(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text('"num.partitions" = 3\n[wal]\n"flush.ms" = 7\n')
    from stratalog.gateway.config import BrokerConfig, load_settings
    settings = load_settings(cfg, env={"STRATALOG_WAL_FLUSH_MS": "9"}, flags={"log.roll.ms": "5"})
    cfg_ = BrokerConfig(settings)
    assert cfg_["num.partitions"] == 3 and cfg_["wal.flush.ms"] == 9 and cfg_["log.roll.ms"] == 5


def test_port_in_use(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = serve("--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "d"))
    one_error(proc, "cannot listen")


def test_data_dir_in_use(tmp_path):
    gw = GatewayProcess(tmp_path / "d").start()
    try:
        proc = serve("--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "d"))
        one_error(proc, "in use")
    finally:
        gw.stop()
