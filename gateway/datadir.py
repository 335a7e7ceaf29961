"""The data directory (`serve --data-dir`): what a gateway keeps on local disk, and the
version of that layout.

    <data_dir>/
      FORMAT_VERSION         this layout's version, a decimal integer and a newline
      coordinator.sqlite3    the embedded coordinator (coordinator.embedded), with
      coordinator.lock       its lock; only without --coordinator
      objects/               the file object store; only without --object-store
      logs/<topic>-<p>/      active segments of led partitions: a cache, rebuilt from the
                             object store when a partition is taken
      cache/                 the remote read cache: emptied at start
      migrate-crc32c.journal `stratalog migrate`'s record of the objects it checked
                             (tiering.objectstore.copy.CrcJournal); the gateway ignores it
      migrate-scratch/       `stratalog migrate`'s scratch files while it copies, and
      migrate-scratch.lock   the lock that keeps two of its runs apart; ignored too
      broker.id              the broker id the cluster gave a gateway started without one,
                             and that cluster's id: `<id> <cluster id>` and a newline;
                             only on etcd

0.1.0 wrote no FORMAT_VERSION file: a directory without one is version 1. `check` runs
before anything in the directory is opened and refuses a version outside
OLDEST_READABLE_VERSION..FORMAT_VERSION; `mark` writes FORMAT_VERSION once the gateway has
started, a file that 0.1.0 ignores. The formats of what the directory holds are versioned
by their owners (the embedded database, the keyspace, WAL objects, manifests).
"""

from __future__ import annotations

import os
from pathlib import Path

from stratalog.tiering.errors import unsupported_version

FORMAT_VERSION = 1  # written; readers take OLDEST_READABLE_VERSION..FORMAT_VERSION
OLDEST_READABLE_VERSION = 1
MARKER = "FORMAT_VERSION"
BROKER_ID = "broker.id"


class UnsupportedDataDir(Exception):
    """The data directory was laid out by a Stratalog this one cannot read, or is damaged."""


def check(data_dir: Path) -> int:
    """The directory's layout version (1 without a marker); UnsupportedDataDir otherwise."""
    path = Path(data_dir) / MARKER
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return 1
    except (OSError, UnicodeDecodeError) as e:
        raise UnsupportedDataDir(f"cannot read {path}: {e}") from None
    if not text.strip().isdigit():
        raise UnsupportedDataDir(f"{path} does not hold a format version: {text[:40]!r}")
    version = int(text)
    if not OLDEST_READABLE_VERSION <= version <= FORMAT_VERSION:
        raise UnsupportedDataDir(unsupported_version(
            f"data directory {data_dir}", version, OLDEST_READABLE_VERSION, FORMAT_VERSION))
    return version


def mark(data_dir: Path) -> None:
    """Record FORMAT_VERSION in the directory (atomically; nothing if already there)."""
    _write(Path(data_dir) / MARKER, f"{FORMAT_VERSION}\n")


def remembered_broker_id(data_dir: Path, cluster_id: str) -> int | None:
    """The broker id this directory's gateway was given by cluster `cluster_id`, so that a
    restart keeps it (as Kafka keeps a generated broker.id in meta.properties); None if
    it was given none, or by another cluster."""
    try:
        text = (Path(data_dir) / BROKER_ID).read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise UnsupportedDataDir(f"cannot read {Path(data_dir) / BROKER_ID}: {e}") from None
    node_id, _, cluster = text.strip().partition(" ")
    if not node_id.isdigit() or not cluster:
        raise UnsupportedDataDir(f"{Path(data_dir) / BROKER_ID} does not hold `<broker id> <cluster id>`: "
                                 f"{text[:60]!r}")
    return int(node_id) if cluster == cluster_id else None


def remember_broker_id(data_dir: Path, cluster_id: str, node_id: int) -> None:
    _write(Path(data_dir) / BROKER_ID, f"{node_id} {cluster_id}\n")


def _write(path: Path, content: str) -> None:
    """Atomically, and durably: a crash leaves the old content or the new."""
    if path.exists() and path.read_text(encoding="ascii") == content:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(content)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
