"""`stratalog migrate`: move an embedded installation (one data directory) to a cluster on
etcd and S3, keeping every record, offset and setting.

Steps, each safe to run again after an interruption:

1. The source is held: the embedded coordinator's lock is taken, so a gateway running on
   the data directory is refused and none can start until the migration ends. (With
   `--objects-only` nothing is held: only step 3 runs, beside a running gateway, so the
   copy that needs the gateway stopped later has only the difference to send.)
2. Both targets are claimed: the bucket prefix with the object MARKER_OBJECT, the etcd
   cluster with coordinator.migration's marker key, each naming the source's cluster id.
   A target holding anything else is refused; one claimed for this source is resumed.
3. Every object is copied under the same key (tiering.objectstore.copy: skipped when
   already there with the same CRC-32C, checked after the put otherwise; the source's
   checksums are remembered in JOURNAL_FILE across runs). The coordinator names objects
   by keys relative to the store (tiering.layout), never by a store's URL, so the copied
   keyspace refers to the copies as it referred to the originals.
4. The keyspace is written (coordinator.migration), the marker set complete last; until
   then a gateway started on the cluster refuses to start.

Leader epochs, the producer-id allocator and transactional ids are kept as they are.
A restore moves them forward because gateways may have run on past the backup; here the
source is held for the whole step 4 and never shares a store with the target, so no
writer exists that could hold a newer epoch or id. Keeping them keeps what clients
cached meaningful: committed offsets' leader epochs, an idempotent producer's id and
sequence, a transactional id's epoch. The cluster's controller then gives each partition
a leader among its gateways as after any leader change.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import time
from pathlib import Path

from stratalog.infra.cli.coordinator_access import DEFAULT_DATA_DIR, readable_data_dir
from stratalog.infra.cli.common import CliError, UsageError, add_s3_options, key_value, positive_int, s3_store_options

MARKER_OBJECT = "migration.json"
# In the data directory: the CRC-32C of every object checked, so a later run (the final
# one after --objects-only) reads from local disk only what it has not checked before.
JOURNAL_FILE = "migrate-crc32c.journal"
# In the data directory too: the copy's scratch files, emptied when a run starts (a run
# killed with -9 leaves its files there, on the disk the installation already has room on)
# and removed when it ends; its lock keeps two runs on one directory apart.
SCRATCH_DIR = "migrate-scratch"
MAX_PARALLEL = 64  # objects in flight: each holds a connection and a scratch file


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "migrate", help="move an embedded installation to etcd and S3",
        description="Move an embedded installation (--data-dir, its gateway stopped) to a cluster: "
                    "every object copied into --object-store and checked by its CRC-32C, then the "
                    "coordinator's keys (topics, configs, partitions, segments, WAL ranges, log start "
                    "offsets, group offsets, producer ids, transactions, ACLs, users, quotas) written "
                    "into --coordinator. Run it again after an interruption: it continues. "
                    "--objects-only copies the objects while the gateway still runs, so the final run "
                    "has only the difference to copy.")
    p.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR), metavar="DIR",
                   help=f"the embedded installation's data directory (default ./{DEFAULT_DATA_DIR})")
    p.add_argument("--from-object-store", metavar="URL",
                   help="the embedded gateway's object store, if it was not DATA_DIR/objects")
    p.add_argument("--coordinator", metavar="etcd://HOST:PORT", help="the target etcd (required "
                   "unless --objects-only)")
    p.add_argument("--object-store", metavar="s3://BUCKET/PREFIX", required=True,
                   help="the target object store, as the cluster's gateways will name it")
    p.add_argument("--cluster", default="default",
                   help="cluster name, in the data directory and in etcd (default: default)")
    p.add_argument("--objects-only", action="store_true",
                   help="copy the objects only, beside a running gateway (a first pass)")
    p.add_argument("--parallel", type=positive_int, default=4, metavar="N",
                   help=f"objects copied at once (default 4, at most {MAX_PARALLEL})")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the gateways' TOML settings file, for etcd.ssl.* and etcd.username/etcd.password.file")
    p.add_argument("--set", dest="settings", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="an etcd.* setting (repeatable)")
    add_s3_options(p)


def run(args: argparse.Namespace) -> int:
    from stratalog.coordinator.embedded import DB_FILE
    from stratalog.coordinator.kv import CoordinatorError, CoordinatorUnavailable
    from stratalog.tiering.objectstore import ObjectStoreError

    if args.parallel > MAX_PARALLEL:
        raise UsageError(f"--parallel is at most {MAX_PARALLEL}, got {args.parallel}")
    if not args.objects_only and not args.coordinator:
        raise UsageError("--coordinator etcd://HOST:PORT is required (or --objects-only for a first copy)")
    if args.coordinator and not args.coordinator.startswith("etcd://"):
        raise UsageError(f"--coordinator must name an etcd cluster (etcd://HOST:PORT), got {args.coordinator!r}")
    if not (args.data_dir / DB_FILE).is_file():
        raise CliError(f"no embedded installation in {args.data_dir} (no {DB_FILE}): give its --data-dir")
    readable_data_dir(args.data_dir)  # laid out by a newer Stratalog: not read, not moved
    source_url = _source_url(args)
    if source_url.rstrip("/") == args.object_store.rstrip("/"):
        raise UsageError(f"--object-store is the installation's own store ({source_url}): name the bucket "
                         "to move to")
    try:
        return asyncio.run(_migrate(args, source_url))
    except CoordinatorUnavailable as e:
        raise CliError(f"migrate: {e} (run it again to continue)") from None
    except CoordinatorError as e:
        raise CliError(f"migrate: {e}") from None
    except ObjectStoreError as e:
        raise CliError(f"migrate: {e} (run it again to continue)") from None


def _source_url(args: argparse.Namespace) -> str:
    if args.from_object_store is None:
        directory = (args.data_dir / "objects").resolve()
        if not directory.is_dir():
            raise CliError(f"{args.data_dir} has no objects/ directory: name the installation's store "
                           "with --from-object-store")
        return directory.as_uri()
    return args.from_object_store


def _open_store(url: str, options: dict):
    from stratalog.tiering.objectstore import open_store

    try:
        return open_store(url, **options)
    except (ValueError, OSError) as e:
        raise UsageError(f"cannot open object store {url}: {e}") from None


async def _migrate(args: argparse.Namespace, source_url: str) -> int:
    from stratalog.coordinator import DataDirInUse, open_coordinator
    from stratalog.coordinator.embedded import EmbeddedReader
    from stratalog.coordinator.store import KVClusterStore

    # Held for the whole run (step 1), unless only objects are copied.
    try:
        source = (KVClusterStore(EmbeddedReader(args.data_dir), args.cluster) if args.objects_only
                  else open_coordinator(None, args.data_dir, args.cluster))
    except DataDirInUse:
        raise CliError(f"a gateway is running on {args.data_dir}: stop it before migrating (copy the "
                       "objects beside it first with --objects-only)") from None
    except ValueError as e:  # a bad --cluster name
        raise UsageError(str(e)) from None
    try:
        await source.check_keyspace(mark=False)  # refuses a newer keyspace
        _, keys = await source.read_keyspace()
        cluster_id = next((json.loads(v) for k, v in keys if k == "cluster_id"), None)
        if not keys or not isinstance(cluster_id, str):
            raise CliError(f"{args.data_dir} holds no cluster {args.cluster!r} to migrate")
        described = f"{args.data_dir.resolve()} (cluster {args.cluster})"
        target_objects = _open_store(args.object_store, s3_store_options(args))
        source_objects = _open_store(source_url, {})
        try:
            if args.objects_only:
                await _claim_objects(target_objects, cluster_id, described)
                await _copy(source_objects, target_objects, args, prune=False)
                print(f"objects copied from {source_url} to {args.object_store}; stop the gateway and "
                      "run the same command without --objects-only to finish")
                return 0
            return await _finish(args, source, keys, cluster_id, described, source_objects, target_objects)
        finally:
            await source_objects.close()
            await target_objects.close()
    finally:
        await source.close()


async def _finish(args, source, keys, cluster_id: str, described: str, source_objects, target_objects) -> int:
    from stratalog.coordinator import migration
    from stratalog.infra.cli.coordinator_access import open_coordinator_store

    target = open_coordinator_store(args, create=False)
    try:
        # Both targets are checked before either is claimed, so a refusal leaves no marker.
        await _claim_objects(target_objects, cluster_id, described, write=False)
        state = await migration.claim(target, cluster_id, described)
        if state == migration.COMPLETE:
            print(f"cluster {args.cluster} in {args.coordinator} was already migrated from {described}: "
                  "nothing to do")
            return 0
        await _claim_objects(target_objects, cluster_id, described)
        await _copy(source_objects, target_objects, args, prune=True)
        missing = await _unreferenced(source, target_objects)
        put, deleted = await migration.write(target, keys)
    finally:
        await target.close()
    resumed = " (resumed)" if state == migration.RESUMING else ""
    print(f"coordinator keys written to {args.coordinator} cluster {args.cluster}{resumed}: {put} put, "
          f"{deleted} left over from an earlier run deleted, {len(keys)} in all")
    if missing:
        from stratalog.infra.cli.common import note

        note(f"{len(missing)} object(s) the installation's metadata names were not in its store (first: "
             f"{missing[0]}); their partitions are served as damaged there, and will be here")
    print(f"migrated {described} to {args.coordinator} and {args.object_store}: start the gateways "
          f"with --coordinator {args.coordinator} --object-store {args.object_store}")
    return 0


async def _claim_objects(target_objects, cluster_id: str, described: str, write: bool = True) -> None:
    """Put MARKER_OBJECT into an empty target prefix (with `write`), or find this source's
    there; CliError for a prefix holding anything else."""
    from stratalog.tiering.objectstore import ObjectNotFound

    listed = await target_objects.list("")
    try:
        marker = json.loads(await target_objects.get(MARKER_OBJECT))
    except ObjectNotFound:
        marker = None
    except ValueError:
        raise CliError(f"{target_objects.url}/{MARKER_OBJECT} is not a migration marker") from None
    if marker is None:
        if listed:
            raise CliError(f"{target_objects.url} holds {len(listed)} objects that no migration of this "
                           "installation copied: migrate into an empty bucket prefix")
        if not write:
            return
        body = {"cluster_id": cluster_id, "source": described, "time_ms": int(time.time() * 1000)}
        await target_objects.put(MARKER_OBJECT, json.dumps(body, sort_keys=True).encode())
    elif not isinstance(marker, dict) or marker.get("cluster_id") != cluster_id:
        source = marker.get("source") if isinstance(marker, dict) else None
        raise CliError(f"{target_objects.url} holds objects migrated from another installation "
                       f"({source or 'unknown'}), not from this one")


async def _copy(source_objects, target_objects, args, prune: bool) -> None:
    from stratalog.tiering.objectstore.copy import CrcJournal, copy_objects

    started = time.monotonic()
    with _scratch(args.data_dir) as scratch:
        journal = CrcJournal(args.data_dir / JOURNAL_FILE, source_objects.url)
        try:
            report = await copy_objects(source_objects, target_objects, scratch, parallel=args.parallel,
                                        exclude=frozenset({MARKER_OBJECT}), prune=prune, journal=journal)
        finally:
            journal.close()
    extra = f", {report.removed} left from an earlier pass removed" if report.removed else ""
    if report.vanished:  # only beside a running gateway (--objects-only): it collects objects
        extra += f", {report.vanished} deleted by the gateway before they were read"
    print(f"objects: {report.copied} copied ({report.bytes_copied} bytes), {report.skipped} already there "
          f"with the same CRC-32C{extra}, in {time.monotonic() - started:.1f} s")


@contextlib.contextmanager
def _scratch(data_dir: Path):
    """SCRATCH_DIR, empty, for this run alone."""
    from stratalog.infra.dirlock import DirectoryLock

    scratch = data_dir / SCRATCH_DIR
    with DirectoryLock(data_dir / (SCRATCH_DIR + ".lock"), error=CliError,
                       busy=f"another `stratalog migrate` is copying from {data_dir}; wait for it to end"):
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        try:
            yield scratch
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


async def _unreferenced(source, target_objects) -> list[str]:
    """Objects the installation's metadata names that the copy did not find: only a
    damaged installation has any."""
    from stratalog.tiering import layout

    present = {o.key for o in await target_objects.list("")}
    needed: list[str] = []
    for info in (await source.topics()).values():
        for p in range(info.partitions):
            start = (await source.log_state(info.topic_id, p)).log_start_offset
            needed += [key for key, _ in await source.wal_ranges(info.topic_id, p, start)]
            for s in await source.segments(info.topic_id, p):
                if s.last_offset >= start:
                    needed += [s.key_base + ext for ext in layout.SEGMENT_EXTENSIONS]
                    needed += [s.key_base + layout.TXNINDEX] if s.aborted_txns else []
    return sorted(k for k in needed if k not in present)
