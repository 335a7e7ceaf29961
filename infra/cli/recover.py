"""`stratalog recover --from-bucket`: rebuild a lost coordinator from the object store alone.

For when the coordinator is gone and no `stratalog coordinator backup` file is at hand:
engine.bucket_recovery rebuilds the cluster from the newest coordinator snapshot in the
bucket, the partition manifests and the WAL objects whose commit the bucket proves, into
an empty coordinator with no gateway running, then prints what became of each partition.
"""

from __future__ import annotations

import argparse
import asyncio
from datetime import datetime, timezone

from stratalog.infra.cli.common import CliError, add_s3_options, note, print_table
from stratalog.infra.cli.coordinator_access import (add_coordinator_options, into_coordinator_with_objects)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "recover", help="rebuild a lost coordinator from the object store",
        description="Rebuild an empty coordinator, with no gateway running, from the object store "
                    "alone: the newest coordinator snapshot there (topics, configs, group offsets, "
                    "ACLs, users, producer ids), every partition's sealed segments from its "
                    "manifests, and the WAL ranges whose commit the WAL objects prove.")
    p.add_argument("--from-bucket", action="store_true", required=True,
                   help="rebuild from the object store (the only source there is)")
    add_coordinator_options(p)
    p.add_argument("--object-store", metavar="URL",
                   help="the gateways' object store: s3://BUCKET/PREFIX or file:///PATH "
                        "(default: file://DATA_DIR/objects)")
    add_s3_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from stratalog.coordinator.kv import CoordinatorError, CoordinatorUnavailable
    from stratalog.engine.restore import OFFLINE
    from stratalog.infra.cli.segments import store_url

    url = store_url(args)
    try:
        report = asyncio.run(_recover(args, url))
    except CoordinatorUnavailable as e:
        raise CliError(f"recover failed: {e} (if it stopped while writing the target, the cluster "
                       "is partly rebuilt: delete its keys and run it again)") from None
    except CoordinatorError as e:
        raise CliError(f"recover refused: {e}") from None
    restored = {(o.topic, o.partition): o for o in report.restore.partitions}
    rows = []
    for r in report.partitions:
        outcome = restored.get((r.topic, r.partition))
        status = outcome.status.upper() if outcome else "-"
        detail = "; ".join(x for x in (r.lost, outcome.detail if outcome else "") if x)
        rows.append((r.topic, r.partition, r.sealed_end, r.log_end, status, detail or "-"))
    print_table(["TOPIC", "PARTITION", "SEALED-END", "LOG-END", "RESULT", "DETAIL"], rows)
    if report.snapshot:
        when = datetime.fromtimestamp(report.snapshot_time_ms / 1000, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        source = f"snapshot {report.snapshot} ({when})"
    else:
        source = "no snapshot (topics only from manifests; no group offsets, ACLs or users)"
    print(f"rebuilt cluster {args.cluster} from {url}: {source}; {report.proven} of "
          f"{report.wal_objects} WAL object(s) provably committed; topics from manifests: "
          f"{', '.join(report.topics_from_manifests) or 'none'}; next producer id "
          f"{report.restore.next_producer_id}, {report.restore.producers_fenced} transactional "
          f"producer(s) fenced")
    for skipped in report.skipped_snapshots:
        note(f"snapshot skipped: {skipped}")
    for bad in report.unreadable:
        note(f"unreadable WAL object: {bad}")
    if report.orphans:
        note(f"{report.orphans} committed WAL range(s) belong to topics neither the snapshot nor a "
             "manifest names (created after the snapshot, never sealed): not restored")
    offline = [o for o in report.restore.partitions if o.status == OFFLINE]
    if offline:
        note(f"{len(offline)} partition(s) rebuilt offline: `stratalog partitions offline` lists them")
    return 0


async def _recover(args: argparse.Namespace, url: str):
    from stratalog.engine.bucket_recovery import recover_from_bucket

    return await into_coordinator_with_objects(args, url, "stratalog-recover-", recover_from_bucket)
