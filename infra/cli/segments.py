"""`stratalog segments ls|dump|verify`: inspect the object store directly, without a broker.

`ls` lists WAL objects, segment files and manifests with their sizes; `verify` scrubs a
topic's sealed objects (`infra/cli/verify.py`); `dump` decodes
objects by what their key says they are (transaction markers as markers, `.txnindex`
sidecars as aborted transactions). Problems found while decoding (a CRC mismatch,
a torn tail, an index entry that misses the log) are printed where they occur and end
the command with one error line and a non-zero status.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from urllib.parse import unquote, urlsplit

from stratalog.infra.cli.coordinator_access import DEFAULT_DATA_DIR, readable_data_dir
from stratalog.infra.cli.common import CliError, add_s3_options, non_negative_int, print_table, s3_store_options, stderr_is_terminal


WAL, SEGMENT, MANIFEST, OTHER = "wal", "segment", "manifest", "other"


def add_parser(subparsers) -> None:
    segments = subparsers.add_parser("segments", help="list and decode objects in the object store",
                                     description="Read WAL objects, segments and manifests straight "
                                                 "from the object store (no broker needed).")
    actions = segments.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = actions.add_parser("ls", help="list WAL objects, segment files and manifests with sizes")
    p.add_argument("--topic", metavar="T", help="only segments and manifests of topic T (WAL objects mix topics)")
    _add_store_options(p)
    p.set_defaults(run=run_ls)

    p = actions.add_parser("dump", help="decode objects: WAL, .log, .index, .timeindex, .txnindex or manifest",
                           description="Decode each KEY; a KEY ending in '/' means every object under it. "
                                       "Control batches show as their COMMIT/ABORT marker; a .log "
                                       "with abort markers also lists its .txnindex's aborted transactions.")
    p.add_argument("keys", nargs="+", metavar="KEY")
    p.add_argument("--print-records", action="store_true", help="print every record of every batch")
    p.add_argument("--deep", action="store_true",
                   help="also decode every record (decompression, framing), check .index/.timeindex/"
                        ".txnindex entries against their .log, and check that a manifest's segments "
                        "(and their .txnindex) exist")
    _add_store_options(p)
    p.set_defaults(run=run_dump)

    p = actions.add_parser("verify", help="check every sealed object of a topic (CRC-32C, framing, sidecars)",
                           description="Scrub TOPIC's sealed segments: every batch of every .log has its "
                                       "CRC-32C and framing checked, and the .index/.timeindex/.txnindex "
                                       "sidecars are parsed against their .log. Prints each damaged object "
                                       "and exits non-zero if any is found.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--partition", type=non_negative_int, metavar="N", help="only partition N")
    _add_store_options(p)
    p.set_defaults(run=run_verify)


def _add_store_options(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("object store").add_mutually_exclusive_group()
    where.add_argument("--object-store", metavar="URL",
                       help=f"file:///PATH or s3://BUCKET/PREFIX (default file://./{DEFAULT_DATA_DIR}/objects)")
    where.add_argument("--data-dir", type=Path, metavar="DIR", help="a gateway's data directory: file://DIR/objects")
    add_s3_options(p)


def run(args: argparse.Namespace) -> int:  # every action binds its own run_*
    raise CliError("choose an action: ls, dump or verify")


def store_url(args: argparse.Namespace) -> str:
    """The store's URL, with relative file paths made absolute; a missing file store is an error."""
    if args.object_store is None:
        directory = readable_data_dir(args.data_dir if args.data_dir is not None else Path(DEFAULT_DATA_DIR)) / "objects"
        url = directory.resolve().as_uri()
    else:
        url = args.object_store
        parts = urlsplit(url)
        if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
            # file://./x parses "." as a host; it means a path relative to here.
            url = Path(parts.netloc + unquote(parts.path)).resolve().as_uri()
        elif parts.scheme == "file" and unquote(parts.path) and not parts.path.startswith("/"):
            url = Path(unquote(parts.path)).resolve().as_uri()
    parts = urlsplit(url)
    if parts.scheme == "file":
        # Opening a file store creates its root; an inspection tool must not.
        root = Path(unquote(parts.path))
        if not root.is_dir():
            raise CliError(f"no object store at {root} (give --data-dir or --object-store)")
    return url


def _open(args: argparse.Namespace):
    from stratalog.tiering.objectstore import open_store

    url = store_url(args)
    try:
        return open_store(url, **s3_store_options(args))
    except (ValueError, OSError) as exc:
        raise CliError(f"cannot open object store {url}: {exc}") from None


def _store_errors():
    from stratalog.tiering.objectstore import ObjectNotFound, ObjectStoreError

    return ObjectNotFound, ObjectStoreError


def kind_of(key: str) -> tuple[str, object]:
    """What a key names, and its parsed form (None for OTHER)."""
    from stratalog.tiering import layout

    for kind, parse in ((WAL, layout.parse_wal_key), (SEGMENT, layout.parse_segment_key),
                        (MANIFEST, layout.parse_manifest_key)):
        try:
            return kind, parse(key)
        except ValueError:
            continue
    return OTHER, None


def run_ls(args: argparse.Namespace) -> int:
    return asyncio.run(_ls(args))


async def _ls(args: argparse.Namespace) -> int:
    from stratalog.tiering import layout

    store = _open(args)
    _, store_error = _store_errors()
    try:
        prefixes = [layout.TOPICS_ROOT, layout.MANIFESTS_ROOT] if args.topic else [""]
        objects = []
        for prefix in prefixes:
            objects += await store.list(prefix)
    except store_error as exc:
        raise CliError(f"cannot list {store.url}: {exc}") from None
    finally:
        await store.close()
    rows = []
    total = 0
    for info in objects:
        kind, parsed = kind_of(info.key)
        if args.topic is not None and getattr(parsed, "topic", None) != args.topic:
            continue
        label = kind
        if kind == SEGMENT:
            label = parsed.ext.lstrip(".") or "segment"
        rows.append([label, info.size, info.key])
        total += info.size
    print_table(["TYPE", "SIZE", "KEY"], rows)
    print()
    print(f"{len(rows)} objects, {total} bytes")
    return 0


def run_dump(args: argparse.Namespace) -> int:
    return asyncio.run(_dump(args))


async def _dump(args: argparse.Namespace) -> int:
    from stratalog.infra.cli.dump import Dumper

    store = _open(args)
    not_found, store_error = _store_errors()
    try:
        keys: list[str] = []
        for key in args.keys:
            if key.endswith("/"):
                try:
                    listed = await store.list(key)
                except (ValueError, store_error) as exc:
                    raise CliError(f"cannot list {key!r}: {exc}") from None
                if not listed:
                    raise CliError(f"no objects under {key!r} in {store.url}")
                keys += [info.key for info in listed]
            else:
                keys.append(key)
        bar = None
        if len(keys) > 1 and stderr_is_terminal():
            from tqdm import tqdm

            bar = tqdm(total=len(keys), unit="obj", file=sys.stderr, leave=False)
        dumper = Dumper(store, args, emit=(lambda text: bar.write(text, file=sys.stdout)) if bar else print)
        try:
            for key in keys:
                try:
                    await dumper.dump(key)
                except not_found:
                    raise CliError(f"no object {key!r} in {store.url}") from None
                except store_error as exc:
                    raise CliError(f"cannot read {key!r}: {exc}") from None
                except ValueError as exc:  # the store refuses the key itself
                    raise CliError(f"bad object key {key!r}: {exc}") from None
                if bar is not None:
                    bar.update(1)
        finally:
            if bar is not None:
                bar.close()
    finally:
        await store.close()
    if dumper.problems:
        first = dumper.problems[0]
        more = f" (and {len(dumper.problems) - 1} more)" if len(dumper.problems) > 1 else ""
        raise CliError(f"{first}{more}")
    return 0


def run_verify(args: argparse.Namespace) -> int:
    return asyncio.run(_verify(args))


async def _verify(args: argparse.Namespace) -> int:
    from stratalog.infra.cli.verify import verify_topic

    store = _open(args)
    _, store_error = _store_errors()
    try:
        report = await verify_topic(store, args.topic, args.partition)
    except store_error as exc:
        raise CliError(f"cannot read {store.url}: {exc}") from None
    finally:
        await store.close()
    which = args.topic if args.partition is None else f"{args.topic} partition {args.partition}"
    if not report.objects and not report.damage:
        raise CliError(f"no sealed segments of {which} in {store.url}")
    for line in report.damage:
        print(f"DAMAGED {line}")
    print(f"{which}: {report.objects} objects, {report.batches} batches checked, "
          f"{len(report.damage)} damaged")
    if report.damage:
        raise CliError(f"{len(report.damage)} damaged objects in {which}")
    return 0
