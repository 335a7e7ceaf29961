"""Run mypy on the packages that must type-check: `python tools/typecheck.py [mypy args]`.

Installed import names are `stratalog.*`, mapped onto the repository's top-level folders
by pyproject.toml; mypy cannot follow setuptools' editable import hook, so this lays the
namespace out as a tree of links in a temporary directory and points mypy at it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ["stratalog.engine", "stratalog.tiering", "stratalog.coordinator", "stratalog.gateway.protocol",
           "stratalog.gateway.auth", "stratalog.gateway.telemetry"]


def main(argv: list[str]) -> int:
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    with tempfile.TemporaryDirectory(prefix="stratalog-typecheck-") as tmp:
        for name, folder in folders.items():
            parts = name.split(".")
            if len(parts) > 2:
                continue  # nested packages come with their parent's folder
            link = Path(tmp, *parts)
            if name == "stratalog":
                link.mkdir()
                (link / "__init__.py").symlink_to(ROOT / folder / "__init__.py")
            else:
                link.symlink_to(ROOT / folder, target_is_directory=True)
        packages = [arg for name in CHECKED for arg in ("-p", name)]
        env = {**os.environ, "MYPYPATH": tmp}
        return subprocess.call([sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"),
                                *packages, *argv], cwd=tmp, env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
