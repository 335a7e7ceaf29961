"""The README's first quickstart command on a fresh environment: `pip install .` with no
extras into a new virtualenv, then `stratalog serve`, produce and consume with the
installed CLI, run from outside the source tree so nothing is imported from it."""

from __future__ import annotations

import subprocess
import venv
from pathlib import Path

import pytest

from stratalog.infra.processes import free_port

ROOT = Path(__file__).resolve().parent.parent



def _top_level_names(python: Path) -> set[str]:
    """The import names the installed `stratalog` distribution puts at the top level."""
    code = ("import importlib.metadata as m\n"
            "files = m.distribution('stratalog').files\n"
            "print('\\n'.join(sorted({f.parts[0] for f in files if f.suffix == '.py'})))")
    # Isolated, from the venv's folder: an egg-info in the source tree must not stand in.
    out = subprocess.run([str(python), "-I", "-c", code], capture_output=True, text=True, check=True,
                         timeout=60, cwd=python.parent)
    return set(out.stdout.split())


@pytest.mark.timeout(600)
def test_pip_install_dot_then_serve_produce_consume(tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    install = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(ROOT)],
                             capture_output=True, text=True, cwd=tmp_path, timeout=540)
    if install.returncode != 0:
        last = (install.stderr.strip().splitlines() or ["?"])[-1]
        if "No matching distribution" in install.stderr or "Could not fetch" in install.stderr:
            pytest.skip(f"pip cannot reach a package index here: {last}")
        raise AssertionError(f"pip install . failed: {install.stderr[-2000:]}")
    assert _top_level_names(bin_dir / "python") == {"stratalog", "pyspark_stratalog"}

    port = free_port()
    stratalog = str(bin_dir / "stratalog")
    serve = subprocess.Popen([stratalog, "serve", "--listen", f"127.0.0.1:{port}",
                              "--data-dir", str(tmp_path / "data")],
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        banner = serve.stdout.readline()
        assert f"127.0.0.1:{port}" in banner, f"no listener line: {banner!r} {serve.poll()}"
        # The README's next steps, as written there.
        bootstrap = ["--bootstrap", f"127.0.0.1:{port}"]

        def cli(*args: str, stdin: str | None = None) -> str:
            done = subprocess.run([stratalog, *args, *bootstrap], input=stdin, capture_output=True,
                                  text=True, cwd=tmp_path, timeout=60)
            assert done.returncode == 0, f"stratalog {' '.join(args)}: {done.stderr}"
            return done.stdout

        cli("topics", "create", "orders", "--partitions", "3")
        cli("produce", "orders", "--key-separator", ":", stdin="k1:hello\nk2:world\n")
        out = cli("consume", "orders", "--from-beginning", "--print-key", "--max-messages", "2")
        assert sorted(out.splitlines()) == ["k1\thello", "k2\tworld"]
    finally:
        serve.terminate()
        try:
            serve.wait(30)
        except subprocess.TimeoutExpired:
            serve.kill()
            serve.wait()
        serve.stdout.close()
        serve.stderr.close()
