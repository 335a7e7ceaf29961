"""`stratalog compact`: compact a cleanup.policy=compact topic's sealed segments on Spark.

The job reads and rewrites segments straight from the object store and asks the
partition's leader gateway (its HTTP admin address) to swap them in. Topic configs
(cleanup.policy, delete.retention.ms, min.compaction.lag.ms, segment.bytes) come from the
gateway at --bootstrap; the flags override them.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from stratalog.infra.cli.common import CliError, non_negative_int, print_table

DEFAULT_ADMIN = "http://127.0.0.1:9644"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


def add_store_options(p: argparse.ArgumentParser) -> None:
    """--object-store/--data-dir and the S3 flags, as `stratalog segments` spells them."""
    where = p.add_argument_group("object store").add_mutually_exclusive_group()
    where.add_argument("--object-store", metavar="URL",
                       help="file:///PATH or s3://BUCKET/PREFIX (default file://./stratalog-data/objects)")
    where.add_argument("--data-dir", type=Path, metavar="DIR", help="a gateway's data directory: file://DIR/objects")
    s3 = p.add_argument_group("S3")
    s3.add_argument("--s3-endpoint", metavar="URL", help="S3 endpoint (default: the AWS configuration)")
    s3.add_argument("--s3-region", metavar="REGION", help="S3 region (default: the AWS configuration)")
    s3.add_argument("--s3-path-style", action="store_true", help="address buckets by path, not by host")
    p.add_argument("--spark-master", metavar="URL", help="Spark master (default: local[*] in this process)")


def spark_session(args: argparse.Namespace, app_name: str):
    try:
        from stratalog.spark.session import get_session
    except ImportError as exc:
        raise CliError(f"this command needs pyspark and pyarrow (pip install 'stratalog[spark]'): {exc}") from None
    return get_session(args.spark_master, app_name=app_name)


def spark_reason(exc: Exception) -> str:
    """One line from a Spark failure: the message of the Python error behind it if any."""
    text = str(exc)
    for marker in ("ExportError: ", "OptionError: ", "CorruptSegment: ", "DataLoss: ",
                   "TopicNotFound: ", "CompactionError: ", "CorruptObject: "):
        if marker in text:
            return text.split(marker, 1)[1].splitlines()[0]
    return text.splitlines()[0] if text else type(exc).__name__


def resolved_store(args: argparse.Namespace) -> str:
    from stratalog.infra.cli.segments import store_url

    return store_url(args)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("compact", help="compact a cleanup.policy=compact topic on Spark",
                              description="Keep the newest record per key in sealed segments, drop "
                                          "tombstones older than delete.retention.ms, and swap the "
                                          "rewritten segments in through the leader gateway.")
    p.add_argument("--topic", required=True, metavar="T")
    p.add_argument("--admin", default=DEFAULT_ADMIN, metavar="URL",
                   help=f"the leader gateway's HTTP address (default {DEFAULT_ADMIN})")
    p.add_argument("--admin-token-file", type=Path, metavar="FILE",
                   help="file holding the gateway's admin bearer token (its http.admin.token.file)")
    p.add_argument("--bootstrap", metavar="HOST:PORT",
                   default=os.environ.get("STRATALOG_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
                   help=f"a gateway to read the topic's configs from (default {DEFAULT_BOOTSTRAP})")
    p.add_argument("--partition", type=non_negative_int, action="append", metavar="N",
                   help="only this partition (repeatable)")
    p.add_argument("--delete-retention-ms", type=non_negative_int, metavar="MS",
                   help="override the topic's delete.retention.ms")
    p.add_argument("--min-compaction-lag-ms", type=non_negative_int, metavar="MS",
                   help="override the topic's min.compaction.lag.ms")
    add_store_options(p)


def run(args: argparse.Namespace) -> int:
    url = resolved_store(args)
    from stratalog.spark.compaction import CompactionError, compact
    from stratalog.spark.metadata import TopicNotFound

    overrides = {}
    if args.delete_retention_ms is not None:
        overrides["delete.retention.ms"] = args.delete_retention_ms
    if args.min_compaction_lag_ms is not None:
        overrides["min.compaction.lag.ms"] = args.min_compaction_lag_ms
    spark = spark_session(args, "stratalog-compact")
    try:
        report = compact(spark, url, args.topic, args.admin, endpoint=args.s3_endpoint,
                         region=args.s3_region, path_style=True if args.s3_path_style else None,
                         bootstrap=args.bootstrap, configs=overrides, partitions=args.partition,
                         admin_token=_token(args.admin_token_file))
    except (CompactionError, TopicNotFound, ValueError) as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # Spark wraps worker failures; keep the first line of the cause
        raise CliError(spark_reason(exc)) from None
    print_table(["PARTITION", "STATUS", "SEGMENTS", "RECORDS", "BYTES", "NOTE"],
                [(r.partition, r.status, f"{r.segments_in}->{r.segments_out}",
                  f"{r.records_in}->{r.records_out}", f"{r.bytes_in}->{r.bytes_out}", r.message or "")
                 for r in report.results])
    if not report.ok:
        raise CliError(f"compaction of {args.topic} did not finish on every partition (see the table)")
    return 0


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text().strip()
    except OSError as e:
        raise CliError(f"cannot read {path}: {e.strerror or e}") from None
