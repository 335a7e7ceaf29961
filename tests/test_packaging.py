"""The one import namespace: every package folder of the repository is installed under
`stratalog.` (pyproject.toml maps names to folders), and nothing imports the folders by
their bare names."""

from __future__ import annotations

import pytest

import re
import tomllib
from pathlib import Path

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
BARE = re.compile(r"^\s*(from|import)\s+(engine|gateway|tiering|coordinator|spark|infra)(\.|\s|$)", re.M)


def _declared_folder(package: str) -> Path:
    parts = package.split(".")
    for n in range(len(parts), 0, -1):
        head = ".".join(parts[:n])
        if head in SETUPTOOLS["package-dir"]:
            return ROOT / SETUPTOOLS["package-dir"][head] / Path(*parts[n:])
    raise AssertionError(f"{package}: no package-dir entry maps it to a folder")


def test_every_package_folder_is_installed():
    declared = {_declared_folder(p).resolve() for p in SETUPTOOLS["packages"]}
    on_disk = {init.parent.resolve() for folder in set(SETUPTOOLS["package-dir"].values())
               for init in (ROOT / folder).rglob("__init__.py")}
    assert on_disk == declared, (on_disk ^ declared)


def test_no_module_imports_a_bare_folder_name():
    offenders = []
    for folder in ["engine", "gateway", "tiering", "coordinator", "spark", "infra", "stratalog", "pyspark_stratalog",
                   "tests", "bench", "tools"]:
        for path in (ROOT / folder).rglob("*.py"):
            if "node_modules" in path.parts:
                continue
            for match in BARE.finditer(path.read_text()):
                offenders.append(f"{path.relative_to(ROOT)}: {match.group(0).strip()}")
    assert not offenders, offenders


def test_the_jvm_readers_sources_are_package_data():
    """A non-editable install carries every file the jar is built from."""
    folder = _declared_folder("stratalog.spark")
    patterns = SETUPTOOLS["package-data"]["stratalog.spark"]
    shipped = {p for pattern in patterns for p in folder.glob(pattern)}
    sources = {p for p in (folder / "jvm").rglob("*") if p.is_file()}
    assert sources and sources == shipped, sources ^ shipped
