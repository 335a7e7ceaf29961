"""How commands that write or read the coordinator directly (`stratalog users`,
`stratalog coordinator`) find it: the embedded coordinator of a data directory, or an etcd
named by URL with the gateways' etcd.* settings for TLS and authentication."""

from __future__ import annotations

import argparse
from pathlib import Path

from stratalog.infra.cli.common import CliError, UsageError, key_value

DEFAULT_DATA_DIR = "stratalog-data"


def add_coordinator_options(p: argparse.ArgumentParser) -> None:
    where = p.add_argument_group("coordinator").add_mutually_exclusive_group()
    where.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR), metavar="DIR",
                       help=f"the embedded coordinator of this data directory (default ./{DEFAULT_DATA_DIR})")
    where.add_argument("--coordinator", metavar="etcd://HOST:PORT", help="an etcd coordinator")
    p.add_argument("--cluster", default="default", help="cluster name in the coordinator (default: default)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="the gateways' TOML settings file, for etcd.ssl.* and etcd.username/etcd.password.file")
    p.add_argument("--set", dest="settings", action="append", default=[], type=key_value, metavar="KEY=VALUE",
                   help="an etcd.* setting (repeatable)")


def readable_data_dir(data_dir: Path) -> Path:
    """`data_dir`, once its layout is one this Stratalog reads (gateway.datadir): a
    directory a newer release laid out is refused in one line, before anything in it is
    opened."""
    from stratalog.gateway import datadir

    try:
        datadir.check(data_dir)
    except datadir.UnsupportedDataDir as e:
        raise CliError(str(e)) from None
    return data_dir


def open_coordinator_store(args, create: bool = True, read_only: bool = False):
    """The `KVClusterStore` the options name. With `create`, a missing data directory is
    made (users may be added before the first start; a restore goes into a new one);
    without it, a data directory with no embedded coordinator is an error. `read_only`
    opens the embedded coordinator without its lock, so it reads beside a running gateway
    (coordinator.embedded.EmbeddedReader); etcd is shared anyway."""
    from stratalog.coordinator import open_coordinator
    from stratalog.coordinator.embedded import DB_FILE
    from stratalog.coordinator.kv import DataDirInUse
    from stratalog.gateway.app import StartupError, etcd_security
    from stratalog.gateway.config import BrokerConfig, ConfigError, load_settings

    try:
        config = BrokerConfig(load_settings(args.config, env={}, flags=dict(args.settings)))
        security = etcd_security(config)
    except (ConfigError, StartupError) as e:
        raise UsageError(str(e)) from None

    if args.coordinator is None:
        readable_data_dir(args.data_dir)
        if create:
            args.data_dir.mkdir(parents=True, exist_ok=True)
        elif not (args.data_dir / DB_FILE).is_file():
            raise CliError(f"no embedded coordinator in {args.data_dir} (give --data-dir or --coordinator)")
    if read_only and args.coordinator is None:
        from stratalog.coordinator import KVClusterStore
        from stratalog.coordinator.embedded import EmbeddedReader
        from stratalog.coordinator.kv import CoordinatorError

        try:
            return KVClusterStore(EmbeddedReader(args.data_dir), args.cluster)
        except CoordinatorError as e:
            raise CliError(str(e)) from None
    try:
        return open_coordinator(args.coordinator, args.data_dir, args.cluster, etcd_security=security)
    except DataDirInUse:
        raise CliError(f"a gateway is running on {args.data_dir}: stop it first (the embedded "
                       "coordinator has one user at a time), or use an etcd coordinator") from None
    except ValueError as e:
        raise UsageError(str(e)) from None


async def into_coordinator_with_objects(args, url: str, scratch_prefix: str, work):
    """`work(store, objects, scratch)` on the coordinator the options name (created if
    absent) and the object store at `url`, with a scratch folder: what `coordinator
    restore` and `recover --from-bucket` share. Store failures become one CliError line."""
    import tempfile
    from pathlib import Path

    from stratalog.infra.cli.common import CliError, s3_store_options
    from stratalog.tiering.objectstore import ObjectStoreError, open_store

    try:
        objects = open_store(url, **s3_store_options(args))
    except (ValueError, OSError) as e:
        raise CliError(f"cannot open object store {url}: {e}") from None
    try:
        store = open_coordinator_store(args, create=True)
        try:
            with tempfile.TemporaryDirectory(prefix=scratch_prefix) as scratch:
                return await work(store, objects, Path(scratch))
        finally:
            await store.close()
    except ObjectStoreError as e:
        raise CliError(f"object store {url}: {e}") from None
    finally:
        await objects.close()
