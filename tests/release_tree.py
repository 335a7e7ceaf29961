"""An earlier Stratalog release, runnable beside today's build with the same venv.

`git archive` extracts the release's commit from this repository into a temp folder, and
`import_root` arranges it as its installed distribution would be: pyproject.toml maps
`stratalog.gateway` to the top-level `gateway/` folder and so on
(`[tool.setuptools.package-dir]`), so the root gets a `stratalog/` package whose
subpackages are links to those folders. A process started with the root as its working
directory and first on PYTHONPATH imports every `stratalog.*` module from the release:
the path finder answers before the editable install's finder, which is only consulted for
names the release does not have.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path


class NoRelease(Exception):
    """The commit is not in this clone (a shallow one, say)."""


def extract(repo: Path, commit: str, dest: Path) -> Path:
    """The release's files under dest/src (nothing else of the repository's state)."""
    try:
        found = subprocess.run(["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"],
                               capture_output=True).returncode == 0
    except FileNotFoundError:
        raise NoRelease("git is not installed") from None
    if not found:
        raise NoRelease(f"commit {commit} is not in {repo} (a shallow clone? `git fetch --unshallow`)")
    tar = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit],
                         capture_output=True, check=True).stdout
    src = dest / "src"
    src.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        if hasattr(tarfile, "data_filter"):  # Python 3.11.4+: refuse links out of src
            archive.extractall(src, filter="data")
        else:  # our own commit's archive
            archive.extractall(src)
    return src


def import_root(src: Path, dest: Path) -> Path:
    """dest/site laid out as `pip install` would lay out the release found in src."""
    package_dirs: dict[str, str] = tomllib.loads((src / "pyproject.toml").read_text()
                                                 )["tool"]["setuptools"]["package-dir"]
    site = dest / "site"
    site.mkdir(parents=True)
    # Parents before children, so `stratalog` exists before `stratalog/gateway` links in.
    for name, folder in sorted(package_dirs.items(), key=lambda item: item[0].count(".")):
        (site / name.replace(".", "/")).symlink_to(src / folder, target_is_directory=True)
    return site


def release(repo: Path, commit: str, dest: Path) -> Path:
    """The import root of `commit` of the repository at `repo`, built under dest."""
    return import_root(extract(repo, commit, dest), dest)


def module_file(root: Path, module: str) -> Path:
    """Where a process started as GatewayProcess starts a release imports `module` from."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    out = subprocess.run([sys.executable, "-c", f"import {module} as m; print(m.__file__)"], cwd=root, env=env,
                         capture_output=True, text=True, check=True).stdout
    return Path(out.strip())
