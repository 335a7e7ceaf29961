"""`stratalog coordinator backup|restore`: a consistent copy of the cluster's metadata, and
putting it back after the coordinator is lost.

`backup FILE` reads every key of the cluster that outlives a gateway at one revision
(coordinator.backup describes the file), at any time: etcd is shared, and the embedded
coordinator is read through a read-only SQLite connection beside a running gateway. `restore FILE` writes it into an
empty cluster after checking that the object store still holds what it references
(engine.restore: what it changes and why), then prints what became of each partition.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import datetime, timezone
from pathlib import Path

from stratalog.infra.cli.common import CliError, add_s3_options, note, print_table
from stratalog.infra.cli.coordinator_access import (add_coordinator_options, into_coordinator_with_objects,
                                                    open_coordinator_store)


def add_parser(subparsers) -> None:
    coordinator = subparsers.add_parser(
        "coordinator", help="back up and restore the coordinator's metadata",
        description="Back up the cluster's metadata (topics, partitions, segment and WAL entries, "
                    "group offsets, producer ids, transactions, ACLs, users) and restore it into an "
                    "empty coordinator.")
    actions = coordinator.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("backup", help="write the cluster's metadata to FILE, read at one revision",
                           description="Write every non-leased key of the cluster, read at one revision, "
                                       "to FILE (replaced atomically), while gateways run or not.")
    p.add_argument("file", type=Path, metavar="FILE")
    add_coordinator_options(p)
    p.set_defaults(run=run_backup)

    p = actions.add_parser("restore", help="restore a backup into an empty cluster",
                           description="Restore FILE into an empty cluster with no gateway running: "
                                       "leader epochs and the producer-id allocator move forward, "
                                       "transactional producers are fenced, and a partition whose "
                                       "objects are gone is rebuilt from its manifest or restored "
                                       "offline.")
    p.add_argument("file", type=Path, metavar="FILE")
    add_coordinator_options(p)
    p.add_argument("--object-store", metavar="URL",
                   help="the gateways' object store: s3://BUCKET/PREFIX or file:///PATH "
                        "(default: file://DATA_DIR/objects)")
    add_s3_options(p)
    p.set_defaults(run=run_restore)


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: backup or restore")


def run_backup(args: argparse.Namespace) -> int:
    from stratalog.coordinator.backup import encode
    from stratalog.coordinator.kv import CoordinatorError

    try:
        backup = asyncio.run(_read_backup(args))
    except CoordinatorError as e:
        raise CliError(f"backup failed: {e}") from None
    _write_atomically(args.file, encode(backup))
    when = datetime.fromtimestamp(backup.time_ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"backed up cluster {backup.cluster} ({backup.cluster_id}): {len(backup.keys)} keys at "
          f"revision {backup.revision}, {when}, to {args.file}")
    return 0


async def _read_backup(args: argparse.Namespace):
    import json

    from stratalog.coordinator.backup import Backup

    store = open_coordinator_store(args, create=False, read_only=True)
    try:
        version = await store.check_keyspace(mark=False)  # refuses a newer keyspace
        revision, keys = await store.read_keyspace()
    finally:
        await store.close()
    if not keys:
        raise CliError(f"cluster {args.cluster} has no metadata to back up")
    cluster_id = next((json.loads(v) for k, v in keys if k == "cluster_id"), "")
    return Backup(args.cluster, str(cluster_id), version, revision, int(time.time() * 1000), keys)


def _write_atomically(path: Path, data: bytes) -> None:
    """FILE is either the old one or the whole new one, even if the machine stops."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise CliError(f"cannot write {path}: {e.strerror or e}") from None


def run_restore(args: argparse.Namespace) -> int:
    from stratalog.coordinator.backup import decode
    from stratalog.coordinator.kv import CoordinatorError, CoordinatorUnavailable
    from stratalog.engine.restore import OFFLINE
    from stratalog.infra.cli.segments import store_url

    try:
        data = args.file.read_bytes()
    except OSError as e:
        raise CliError(f"cannot read {args.file}: {e.strerror or e}") from None
    try:
        backup = decode(data, str(args.file))  # all of it checked before anything is opened
    except CoordinatorError as e:
        raise CliError(str(e)) from None
    url = store_url(args)
    try:
        report = asyncio.run(_restore(args, backup, url))
    except CoordinatorUnavailable as e:
        raise CliError(f"restore failed: {e} (if it stopped while writing the target, the cluster "
                       "is partly restored: delete its keys and restore again)") from None
    except CoordinatorError as e:
        raise CliError(f"restore refused: {e}") from None
    print_table(["TOPIC", "PARTITION", "RESULT", "DETAIL"],
                [(o.topic, o.partition, o.status.upper(), o.detail or "-") for o in report.partitions])
    when = datetime.fromtimestamp(backup.time_ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    print(f"restored cluster {args.cluster} from {args.file} (cluster {backup.cluster_id}, revision "
          f"{backup.revision}, {when}): {len(backup.keys)} keys; leader epochs moved forward, "
          f"next producer id {report.next_producer_id}, {report.producers_fenced} transactional "
          f"producer(s) fenced, {report.transactions_aborted} open transaction(s) aborted")
    offline = [o for o in report.partitions if o.status == OFFLINE]
    if offline:
        note(f"{len(offline)} partition(s) restored offline: `stratalog partitions offline` lists them, "
             "`stratalog partitions recover` brings each back once its objects are restored, or "
             "truncated with --truncate --accept-data-loss")
    return 0


async def _restore(args: argparse.Namespace, backup, url: str):
    from stratalog.engine.restore import restore

    return await into_coordinator_with_objects(
        args, url, "stratalog-restore-", lambda store, objects, scratch: restore(backup, store, objects, scratch))
