"""`stratalog export`: write a topic's sealed records to Parquet (or JSON, ORC) on Spark.

Reads segments straight from the object store; with --value-format json or avro the
value is decoded into columns (see `spark.export`).
"""

from __future__ import annotations

import argparse

from stratalog.infra.cli.common import CliError, note
from stratalog.infra.cli.compact import add_store_options, resolved_store, spark_reason, spark_session


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("export", help="export a topic to Parquet files on Spark",
                              description="Write a topic's sealed records to files, with the Kafka "
                                          "columns or with the value decoded into columns.")
    p.add_argument("--topic", required=True, metavar="T")
    p.add_argument("--to", required=True, metavar="PATH", help="output directory (any path Spark writes)")
    p.add_argument("--format", dest="fmt", default="parquet", choices=["parquet", "json", "orc"],
                   help="output file format (default parquet)")
    p.add_argument("--value-format", default="raw", choices=["raw", "json", "avro"],
                   help="raw keeps value as bytes; json/avro decode it into columns (default raw)")
    p.add_argument("--schema", metavar="FILE",
                   help="value schema: Avro .avsc (required for avro), or for json Spark DDL / "
                        "Spark JSON schema / .avsc (default: inferred)")
    p.add_argument("--mode", default="errorifexists", choices=["errorifexists", "overwrite", "append", "ignore"],
                   help="what to do when PATH exists (default errorifexists)")
    p.add_argument("--starting-offsets", metavar="SPEC", help='earliest (default) or JSON {"T": {"0": 42}}')
    p.add_argument("--ending-offsets", metavar="SPEC", help='latest (default) or JSON {"T": {"0": 42}}')
    add_store_options(p)


def run(args: argparse.Namespace) -> int:
    url = resolved_store(args)
    if args.value_format == "avro" and not args.schema:
        raise CliError("--value-format avro needs --schema FILE.avsc")
    from stratalog.spark.export import ExportError, export
    from stratalog.spark.options import OptionError

    options = {"endpoint": args.s3_endpoint, "region": args.s3_region,
               "pathStyle": "true" if args.s3_path_style else None,
               "startingOffsets": args.starting_offsets, "endingOffsets": args.ending_offsets}
    spark = spark_session(args, "stratalog-export")
    try:
        count = export(spark, url, args.topic, args.to, fmt=args.fmt, value_format=args.value_format,
                       schema_path=args.schema, mode=args.mode, options=options)
    except (ExportError, OptionError, OSError) as exc:
        raise CliError(str(exc)) from None
    except Exception as exc:  # Spark wraps worker failures; keep the first line of the cause
        raise CliError(spark_reason(exc)) from None
    note(f"exported {count} record(s) of {args.topic} to {args.to} ({args.fmt})")
    return 0

